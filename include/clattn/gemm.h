// The one GEMM wrapper: C = alpha * op(A) * op(B) + beta * C, row-major, over CBLAS sgemm.
#pragma once

#include <cstdint>
#include <string_view>

namespace clattn {

// op(A) is (m, k), op(B) is (k, n), C is (m, n); lda/ldb/ldc are row strides in elements.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc);

// Y (m, n) = X (m, k)·Wᵀ + bias [+ Y]: a linear layer's forward, W (n, k) row-major with row
// stride ldw, bias (n) or nullptr, and with `accumulate` the residual already in Y added. Shapes
// of narrow layers (k <= 1024, n <= 4096, m > 4) run in clattn's register tiles over W packed
// once per call, the bias and residual folded into the tiles' first step; others fill Y with the
// bias and call sgemm with beta = 1. gemm(false, true, ...) and gemm(false, false, ...) with alpha
// 1 and beta 0 or 1 take the same tiles for the same shapes.
void linear_product(int64_t m, int64_t n, int64_t k, const float* x, int64_t ldx, const float* w, int64_t ldw,
                    const float* bias, bool accumulate, float* y, int64_t ldy);

// How a linear layer's weight matrix is stored: f32, or 16-bit floats for inference (f16: 11
// significant bits up to 65504; bf16: 8 bits over f32's range), rounded to nearest even. Products
// read the 16-bit values and compute in f32.
enum class WeightType : uint8_t { f32, f16, bf16 };
const char* weight_type_name(WeightType t);  // "f32", "f16", "bf16"
// "f32", "f16" or "bf16" (any case); an Error naming the choices otherwise.
WeightType parse_weight_type(std::string_view s);

// A weight matrix W (n, k) row-major with row stride ld (elements), of any WeightType: data is
// const float* for f32, const uint16_t* (the bits) for f16 and bf16.
struct WeightMatrix {
  const void* data = nullptr;
  int64_t ld = 0;
  WeightType type = WeightType::f32;
};

// Y (m, n) = alpha·X (m, k)·Wᵀ + beta·Y, the product of a linear layer. An f32 W is gemm(false,
// true, ...) exactly. A 16-bit W: up to 8 rows of X (a decode step, a short prompt) stream W,
// widened in registers; more rows widen blocks of W rows into `workspace`
// (linear_gemm_workspace floats) for one sgemm each. Accumulation is f32 either way.
void linear_gemm(int64_t m, int64_t n, int64_t k, float alpha, const float* x, int64_t ldx, const WeightMatrix& w,
                 float beta, float* y, int64_t ldy, float* workspace);
// Floats of workspace linear_gemm needs for W (n, k) (0 for f32).
int64_t linear_gemm_workspace(WeightType t, int64_t n, int64_t k);

// Measures this machine's sgemm rate (GFLOP/s) on square n x n products with the current
// thread count: best of `repeat` after a warm-up.
double measure_sgemm_gflops(int64_t n = 2048, int repeat = 5);

// Measures this machine's memory read bandwidth (GB/s, 1e9 bytes) with the current thread count:
// every thread sums its share of a `bytes` buffer (far past the last-level cache), best of
// `repeat` passes after one that touches the pages. A decode step reads every weight and the
// KV cache once, so bytes read over this rate is its limit, as sgemm's rate is for products.
double measure_read_gbs(int64_t bytes = int64_t{256} << 20, int repeat = 5);

}  // namespace clattn
