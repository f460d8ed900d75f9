// The tile kernels' entry points: each forwards to the active ISA's copy (core/isa.h). The
// copies are built from microkernel_isa.cpp.
#include "core/microkernel.h"

#include <cstring>

#include "clattn/cpu.h"
#include "core/isa.h"

namespace clattn::mk {

const Kernels* kernels_for(const char* isa) {
  for (Isa i : {Isa::avx2, Isa::avx512, Isa::generic})
    if (std::strcmp(isa, isa_name(i)) == 0) {
      const IsaKernels* k = isa_kernels_for(i);
      return k ? k->tiles : nullptr;
    }
  return nullptr;
}

const Kernels& kernels() { return *isa_kernels().tiles; }

void gemm_abt(int64_t m, int64_t npanels, int64_t depth, const float* a, int64_t lda,
              const float* bpanels, float* c, int64_t ldc) {
  kernels().gemm_abt(m, npanels, depth, a, lda, bpanels, c, ldc);
}

void gemm_abt_add(int64_t m, int64_t npanels, int64_t depth, const float* a, int64_t lda, const float* bpanels,
                  float* c, int64_t ldc, const float* bias, bool add) {
  kernels().gemm_abt_add(m, npanels, depth, a, lda, bpanels, c, ldc, bias, add);
}

void gemm_ab(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs,
             const float* b, int64_t ldb, float* c, int64_t ldc, const float* row_scale) {
  kernels().gemm_ab(m, n, k, a, a_rs, a_cs, b, ldb, c, ldc, row_scale);
}

void pack_panels(const float* src, int64_t rows, int64_t cols, int64_t rs, float* dst) {
  kernels().pack_panels(src, rows, cols, rs, dst);
}

void pack_transposed(const float* src, int64_t rows, int64_t cols, int64_t rs, float* dst,
                     int64_t rows_pad) {
  kernels().pack_transposed(src, rows, cols, rs, dst, rows_pad);
}

RowsOperand rows_operand(const float* src, int64_t rows, int64_t cols, int64_t rs, float* scratch) {
  return kernels().rows_operand(src, rows, cols, rs, scratch);
}

void pack_rows(const float* src, int64_t rows, int64_t cols, int64_t rs, float* dst,
               int64_t rows_pad, int64_t cols_pad, float scale) {
  kernels().pack_rows(src, rows, cols, rs, dst, rows_pad, cols_pad, scale);
}

void rows_dot(int64_t m, int64_t n, int64_t k, float alpha, const float* x, int64_t ldx, const float* w,
              int64_t ldw, float beta, float* y, int64_t ldy) {
  kernels().rows_dot(m, n, k, alpha, x, ldx, w, ldw, beta, y, ldy);
}

void gemm_abt16(Half f, int64_t m, int64_t npanels, int64_t depth, const float* a, int64_t lda,
                const uint16_t* bpanels, float* c, int64_t ldc) {
  kernels().gemm_abt16(f, m, npanels, depth, a, lda, bpanels, c, ldc);
}

void gemm_ab16(Half f, int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs,
               const uint16_t* b, int64_t ldb, float* c, int64_t ldc, const float* row_scale) {
  kernels().gemm_ab16(f, m, n, k, a, a_rs, a_cs, b, ldb, c, ldc, row_scale);
}

void to_half(Half f, const float* src, int64_t n, uint16_t* dst) { kernels().to_half(f, src, n, dst); }

void rows_dot16(Half f, int64_t m, int64_t n, int64_t k, float alpha, const float* x, int64_t ldx, const uint16_t* w,
                int64_t ldw, float beta, float* y, int64_t ldy) {
  kernels().rows_dot16(f, m, n, k, alpha, x, ldx, w, ldw, beta, y, ldy);
}

void widen_rows(Half f, const uint16_t* src, int64_t rows, int64_t cols, int64_t lds, float* dst, int64_t ldd) {
  kernels().widen_rows(f, src, rows, cols, lds, dst, ldd);
}

float row_max(const float* row, int64_t width) { return kernels().row_max(row, width); }
float exp2_row(float* row, int64_t width, float sub) { return kernels().exp2_row(row, width, sub); }
void exp2_rows_shifted(float* s, int64_t rows, int64_t ld, int64_t width, const float* m, const float* l2) {
  kernels().exp2_rows_shifted(s, rows, ld, width, m, l2);
}
void prob_row(float* row, int64_t width, float lse2) { kernels().prob_row(row, width, lse2); }
void grad_scores_rows(float* ds, const float* p, int64_t rows, int64_t ld, int64_t width, const float* di,
                      float scale) {
  kernels().grad_scores_rows(ds, p, rows, ld, width, di, scale);
}
float online_softmax_row(float* row, int64_t width, float& m, float& l) {
  return kernels().online_softmax_row(row, width, m, l);
}
void softmax_rows(float* s, int64_t rows, int64_t kw, int64_t k, float* lse2) {
  kernels().softmax_rows(s, rows, kw, k, lse2);
}
float softmax_row_extra(float* row, int64_t kw, float extra, float& p_extra) {
  return kernels().softmax_row_extra(row, kw, extra, p_extra);
}

}  // namespace clattn::mk
