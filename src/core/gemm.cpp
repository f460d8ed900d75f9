#include "clattn/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "clattn/error.h"
#include "clattn/rng.h"

namespace clattn {

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc) {
  check(m >= 0 && n >= 0 && k >= 0, "gemm: sizes must be >= 0, got m=", m, " n=", n, " k=", k);
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

double measure_sgemm_gflops(int64_t n, int repeat) {
  const size_t sz = static_cast<size_t>(n * n);
  std::vector<float> a(sz), b(sz), c(sz);
  Rng rng(12345);
  for (size_t i = 0; i < sz; ++i) {
    a[i] = rng.uniform(0, i) - 0.5f;
    b[i] = rng.uniform(1, i) - 0.5f;
  }
  gemm(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);  // warm-up
  double best = 1e30;
  for (int r = 0; r < repeat; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    gemm(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  return 2.0 * static_cast<double>(n) * n * n / best * 1e-9;
}

}  // namespace clattn
