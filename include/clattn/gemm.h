// The one GEMM wrapper: C = alpha * op(A) * op(B) + beta * C, row-major, over CBLAS sgemm.
#pragma once

#include <cstdint>

namespace clattn {

// op(A) is (m, k), op(B) is (k, n), C is (m, n); lda/ldb/ldc are row strides in elements.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc);

// Measures this machine's sgemm rate (GFLOP/s) on square n x n products with the current
// thread count: best of `repeat` after a warm-up.
double measure_sgemm_gflops(int64_t n = 2048, int repeat = 5);

// Measures this machine's memory read bandwidth (GB/s, 1e9 bytes) with the current thread count:
// every thread sums its share of a `bytes` buffer (far past the last-level cache), best of
// `repeat` passes after one that touches the pages. A decode step reads every weight and the
// KV cache once, so bytes read over this rate is its limit, as sgemm's rate is for products.
double measure_read_gbs(int64_t bytes = int64_t{256} << 20, int repeat = 5);

}  // namespace clattn
