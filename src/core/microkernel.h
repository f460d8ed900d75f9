// Register-blocked tile products for attention kernels, small enough to live in L1/L2 and called
// with operands packed once per head. Calling cblas_sgemm per tile repacks both operands on every
// call and costs ~15% of the peak on 64 x 512 tiles; these reach the sgemm rate instead.
//
// Two shapes cover every product of flash-style attention:
//   gemm_abt : C (m, 64·np)  = A (m, depth) · Bpanels      (S = Q·Kᵀ, dP = dO·Vᵀ)
//              Bpanels is Bᵀ packed in panels of 64 columns: panel p is (depth, 64) row-major.
//   gemm_ab  : C (m, n)      = diag(row_scale)·C + A·B     (O += P·V, dV += Pᵀ·dO, dQ += dS·K ...)
//              A is read through (row, col) strides, so Aᵀ costs nothing; B is (k, n) rows with
//              n a multiple of 16 (padded with zeros by the packers below).
#pragma once

#include <cstdint>

namespace clattn::mk {

inline constexpr int kPanel = 64;  // columns per packed panel of gemm_abt
inline constexpr int kLanes = 16;  // floats per vector; padded widths are multiples of this

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

void gemm_abt(int64_t m, int64_t npanels, int64_t depth, const float* a, int64_t lda,
              const float* bpanels, float* c, int64_t ldc);

// C (m, 64·np) = [C +] [bias +] A · Bpanels: gemm_abt for a linear layer's forward (Y = X·Wᵀ
// with W packed in panels), its bias (64·np floats, or nullptr) and a residual already in C (add)
// folded into the tiles' first step instead of a pass over C.
void gemm_abt_add(int64_t m, int64_t npanels, int64_t depth, const float* a, int64_t lda, const float* bpanels,
                  float* c, int64_t ldc, const float* bias, bool add);

// row_scale: nullptr = plain accumulate; otherwise C row r is multiplied by row_scale[r] first.
void gemm_ab(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs,
             const float* b, int64_t ldb, float* c, int64_t ldc, const float* row_scale);

// Packs rows (rows, cols) with row stride rs into panels for gemm_abt: npanels = ceil(rows/64),
// each (cols, 64); rows past `rows` are zero.
void pack_panels(const float* src, int64_t rows, int64_t cols, int64_t rs, float* dst);
// Writes the transpose of rows (rows, cols) with row stride rs as (cols, rows_pad), zero-filling
// columns past `rows`: Bᵀ for gemm_ab when the product needs a narrow (16-multiple) width.
void pack_transposed(const float* src, int64_t rows, int64_t cols, int64_t rs, float* dst,
                     int64_t rows_pad);
// Rows of a (rows, cols) operand as gemm_ab reads them: the caller's own memory when cols is a
// multiple of 16 (no copy), else a zero-padded copy in `scratch` (rows, round_up(cols, 16)).
struct RowsOperand {
  const float* data;
  int64_t ld;
};
RowsOperand rows_operand(const float* src, int64_t rows, int64_t cols, int64_t rs, float* scratch);
// Floats of scratch rows_operand may need.
inline int64_t rows_operand_size(int64_t rows, int64_t cols) {
  return cols % kLanes == 0 ? 0 : rows * round_up(cols, kLanes);
}

// Copies rows (rows, cols) into (rows_pad, cols_pad) row-major, zero-filling the padding.
void pack_rows(const float* src, int64_t rows, int64_t cols, int64_t rs, float* dst,
               int64_t rows_pad, int64_t cols_pad, float scale = 1.f);

// Y (m, n) = alpha·X (m, k)·Wᵀ + beta·Y with W (n, k) row-major (a linear layer's weight), for a
// few rows of X: each W row is read once per pair of X rows, straight from the caller's memory
// (no packing), so the product streams W at the memory's rate. Serial; the caller splits n.
void rows_dot(int64_t m, int64_t n, int64_t k, float alpha, const float* x, int64_t ldx, const float* w,
              int64_t ldw, float beta, float* y, int64_t ldy);

// gemm_abt and gemm_ab with B in 16-bit storage (a KV cache of f16 or bf16 floats, same
// layouts), widened to f32 in registers: A, C and the arithmetic stay f32.
enum class Half : uint8_t { f16, bf16 };
void gemm_abt16(Half f, int64_t m, int64_t npanels, int64_t depth, const float* a, int64_t lda,
                const uint16_t* bpanels, float* c, int64_t ldc);
void gemm_ab16(Half f, int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs,
               const uint16_t* b, int64_t ldb, float* c, int64_t ldc, const float* row_scale);
// dst (n) = src rounded to the nearest f16 or bf16 (ties to even).
void to_half(Half f, const float* src, int64_t n, uint16_t* dst);
// rows_dot with W (n, k) in 16-bit storage (a linear layer's f16 or bf16 weights), widened in
// registers: rows_dot's vector sums over the widened W; the k % lanes tail is fused multiply-adds,
// where GCC vectorises rows_dot's into a multiply then in-order adds (a last-bit difference).
void rows_dot16(Half f, int64_t m, int64_t n, int64_t k, float alpha, const float* x, int64_t ldx, const uint16_t* w,
                int64_t ldw, float beta, float* y, int64_t ldy);
// dst (rows, cols) with row stride ldd = src (rows, cols, row stride lds) widened to f32 (exact).
void widen_rows(Half f, const uint16_t* src, int64_t rows, int64_t cols, int64_t lds, float* dst, int64_t ldd);

// The row passes of the flash-style kernels over score rows in log2 units (rows_isa.cpp; widths
// are multiples of 16). Callers reach them through attention/tile/tile_ops.h.
float row_max(const float* row, int64_t width);
// row <- 2^(row - sub); returns the sum.
float exp2_row(float* row, int64_t width, float sub);
// Each of `rows` rows (stride ld) <- 2^((row - m[r]) - l2[r]): a softmax recomputed from its saved
// row max and log2 sum, in that order of operations.
void exp2_rows_shifted(float* s, int64_t rows, int64_t ld, int64_t width, const float* m, const float* l2);
// row <- 2^min(row - lse2, 0).
void prob_row(float* row, int64_t width, float lse2);
// ds <- p ∘ (ds - di[r]) · scale, row by row (stride ld): the scores' gradient of a softmax.
void grad_scores_rows(float* ds, const float* p, int64_t rows, int64_t ld, int64_t width, const float* di,
                      float scale);
float online_softmax_row(float* row, int64_t width, float& m, float& l);
void softmax_rows(float* s, int64_t rows, int64_t kw, int64_t k, float* lse2);
float softmax_row_extra(float* row, int64_t kw, float extra, float& p_extra);

// The entry points above as one ISA copy provides them (microkernel_isa.cpp and rows_isa.cpp,
// compiled once per ISA as clattn::mk::avx2::kTable and clattn::mk::avx512::kTable); the functions above forward to
// the copy of the active ISA.
struct Kernels {
  decltype(&mk::gemm_abt) gemm_abt;
  decltype(&mk::gemm_abt_add) gemm_abt_add;
  decltype(&mk::gemm_ab) gemm_ab;
  decltype(&mk::pack_panels) pack_panels;
  decltype(&mk::pack_transposed) pack_transposed;
  decltype(&mk::rows_operand) rows_operand;
  decltype(&mk::pack_rows) pack_rows;
  decltype(&mk::rows_dot) rows_dot;
  decltype(&mk::gemm_abt16) gemm_abt16;
  decltype(&mk::gemm_ab16) gemm_ab16;
  decltype(&mk::to_half) to_half;
  decltype(&mk::rows_dot16) rows_dot16;
  decltype(&mk::widen_rows) widen_rows;
  decltype(&mk::row_max) row_max;
  decltype(&mk::exp2_row) exp2_row;
  decltype(&mk::exp2_rows_shifted) exp2_rows_shifted;
  decltype(&mk::prob_row) prob_row;
  decltype(&mk::grad_scores_rows) grad_scores_rows;
  decltype(&mk::online_softmax_row) online_softmax_row;
  decltype(&mk::softmax_rows) softmax_rows;
  decltype(&mk::softmax_row_extra) softmax_row_extra;
};
// The table in use (for tests that compare the ISA copies).
const Kernels& kernels();
const Kernels* kernels_for(const char* isa);  // "avx2", "avx512"; nullptr if not in this build

}  // namespace clattn::mk
