// The tile kernels' entry points: each forwards to the ISA copy chosen once per process
// (include/clattn/cpu.h). The copies are built from microkernel_isa.cpp.
#include "core/microkernel.h"

#include <cstring>

#include "clattn/cpu.h"

namespace clattn::mk {
#if defined(CLATTN_HAVE_AVX512_KERNELS)
namespace avx2 {
extern const Kernels kTable;
}
namespace avx512 {
extern const Kernels kTable;
}
#else
namespace base {
extern const Kernels kTable;
}
#endif

const Kernels* kernels_for(const char* isa) {
#if defined(CLATTN_HAVE_AVX512_KERNELS)
  if (std::strcmp(isa, "avx2") == 0) return &avx2::kTable;
  if (std::strcmp(isa, "avx512") == 0) return &avx512::kTable;
  return nullptr;
#else
  return std::strcmp(isa, isa_name(active_isa())) == 0 ? &base::kTable : nullptr;
#endif
}

const Kernels& kernels() {
  static const Kernels* const k = [] {
#if defined(CLATTN_HAVE_AVX512_KERNELS)
    return active_isa() == Isa::avx512 ? &avx512::kTable : &avx2::kTable;
#else
    return &base::kTable;
#endif
  }();
  return *k;
}

void gemm_abt(int64_t m, int64_t npanels, int64_t depth, const float* a, int64_t lda,
              const float* bpanels, float* c, int64_t ldc) {
  kernels().gemm_abt(m, npanels, depth, a, lda, bpanels, c, ldc);
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

}  // namespace clattn::mk
