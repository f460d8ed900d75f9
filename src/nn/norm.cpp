// Row-wise layers of nn.h: LayerNorm, RMSNorm and the row softmax. Each row is read from cache
// two or three times (statistics, then the output), so a call costs one read and one write of the
// data; rows are spread over the OpenMP threads.
#include <cmath>
#include <limits>

#include "clattn/error.h"
#include "clattn/nn.h"
#include "core/simd.h"
#include "nn/nn_internal.h"

namespace clattn::nn {

namespace {

using namespace detail;  // nn_internal.h: SIMD names, kParallelMin


// v with lanes n.. set to `fill` (the tail of a row after load_partial, which fills with 0).
inline vf keep_first(vf v, int n, float fill) {
  const vi lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return lane < n ? v : splat(fill);
}

// Σ x[e] over n floats (two accumulators: one add chain per vector is latency bound).
inline float row_sum(const float* x, int64_t n) {
  vf a0{}, a1{};
  int64_t e = 0;
  for (; e + 2 * kLanes <= n; e += 2 * kLanes) {
    a0 += load(x + e);
    a1 += load(x + e + kLanes);
  }
  for (; e + kLanes <= n; e += kLanes) a0 += load(x + e);
  if (e < n) a1 += load_partial(x + e, static_cast<int>(n - e));
  return simd::hsum(a0 + a1);
}

// Σ (x[e] − m)² over n floats.
inline float row_sq_dev(const float* x, int64_t n, float m) {
  const vf mv = splat(m);
  vf a0{}, a1{};
  int64_t e = 0;
  for (; e + 2 * kLanes <= n; e += 2 * kLanes) {
    const vf d0 = load(x + e) - mv, d1 = load(x + e + kLanes) - mv;
    a0 += d0 * d0;
    a1 += d1 * d1;
  }
  for (; e + kLanes <= n; e += kLanes) {
    const vf d = load(x + e) - mv;
    a0 += d * d;
  }
  if (e < n) {
    const int r = static_cast<int>(n - e);
    const vf d = keep_first(load_partial(x + e, r) - mv, r, 0.f);
    a1 += d * d;
  }
  return simd::hsum(a0 + a1);
}

// Σ x[e]² over n floats.
inline float row_sq(const float* x, int64_t n) {
  vf a0{}, a1{};
  int64_t e = 0;
  for (; e + 2 * kLanes <= n; e += 2 * kLanes) {
    const vf v0 = load(x + e), v1 = load(x + e + kLanes);
    a0 += v0 * v0;
    a1 += v1 * v1;
  }
  for (; e + kLanes <= n; e += kLanes) {
    const vf v = load(x + e);
    a0 += v * v;
  }
  if (e < n) {
    const vf v = load_partial(x + e, static_cast<int>(n - e));
    a1 += v * v;
  }
  return simd::hsum(a0 + a1);
}

void check_norm(const char* name, const void* y, const void* x, const void* w, int64_t rows,
                int64_t dim, float eps) {
  check(rows >= 0 && dim >= 1, name, ": need rows >= 0 and dim >= 1, got rows=", rows, " dim=", dim);
  check(eps >= 0.f && std::isfinite(eps), name, ": eps must be finite and >= 0, got ", eps);
  check(rows == 0 || (y != nullptr && x != nullptr && w != nullptr), name,
        ": y, x and the weights must not be null");
}

}  // namespace

void layernorm_fwd(float* y, const float* x, const float* gamma, const float* beta, int64_t rows,
                   int64_t dim, float eps, float* mean, float* rstd) {
  check_norm("layernorm_fwd", y, x, gamma, rows, dim, eps);
  check(rows == 0 || beta != nullptr, "layernorm_fwd: beta must not be null");
  const float inv_dim = 1.f / static_cast<float>(dim);
#pragma omp parallel for schedule(static) if (rows * dim > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;  // (dim)
    float* yr = y + r * dim;        // (dim), may be xr
    const float m = row_sum(xr, dim) * inv_dim;
    const float s = 1.f / std::sqrt(row_sq_dev(xr, dim, m) * inv_dim + eps);
    if (mean) mean[r] = m;
    if (rstd) rstd[r] = s;
    const vf mv = splat(m), sv = splat(s);
    int64_t e = 0;
    for (; e + kLanes <= dim; e += kLanes)
      store(yr + e, (load(xr + e) - mv) * sv * load(gamma + e) + load(beta + e));
    if (e < dim) {
      const int n = static_cast<int>(dim - e);
      store_partial(yr + e, (load_partial(xr + e, n) - mv) * sv * load_partial(gamma + e, n) + load_partial(beta + e, n), n);
    }
  }
}

void rmsnorm_fwd(float* y, const float* x, const float* w, int64_t rows, int64_t dim, float eps,
                 float* rstd) {
  check_norm("rmsnorm_fwd", y, x, w, rows, dim, eps);
  const float inv_dim = 1.f / static_cast<float>(dim);
#pragma omp parallel for schedule(static) if (rows * dim > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;  // (dim)
    float* yr = y + r * dim;        // (dim), may be xr
    const float s = 1.f / std::sqrt(row_sq(xr, dim) * inv_dim + eps);
    if (rstd) rstd[r] = s;
    const vf sv = splat(s);
    int64_t e = 0;
    for (; e + kLanes <= dim; e += kLanes) store(yr + e, load(xr + e) * sv * load(w + e));
    if (e < dim) {
      const int n = static_cast<int>(dim - e);
      store_partial(yr + e, load_partial(xr + e, n) * sv * load_partial(w + e, n), n);
    }
  }
}

// A row whose entries are all −inf (a fully masked row) becomes all zeros rather than NaN.
void softmax_rows(float* x, int64_t rows, int64_t cols) {
  check(rows >= 0 && cols >= 0, "softmax_rows: sizes must be >= 0, got rows=", rows, " cols=", cols);
  if (rows == 0 || cols == 0) return;
  check(x != nullptr, "softmax_rows: x must not be null");
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * cols;  // (cols)
    vf mv = splat(kNegInf);
    int64_t e = 0;
    for (; e + kLanes <= cols; e += kLanes) mv = simd::vmax(mv, load(xr + e));
    const int tail = static_cast<int>(cols - e);
    if (tail > 0) mv = simd::vmax(mv, keep_first(load_partial(xr + e, tail), tail, kNegInf));
    const float m = simd::hmax(mv);
    if (m == kNegInf) {
      for (int64_t c = 0; c < cols; ++c) xr[c] = 0.f;
      continue;
    }
    mv = splat(m);
    vf sum{};
    for (e = 0; e + kLanes <= cols; e += kLanes) {
      const vf p = simd::exp(load(xr + e) - mv);
      store(xr + e, p);
      sum += p;
    }
    if (tail > 0) {
      const vf p = keep_first(simd::exp(load_partial(xr + e, tail) - mv), tail, 0.f);
      store_partial(xr + e, p, tail);
      sum += p;
    }
    const vf inv = splat(1.f / simd::hsum(sum));
    for (e = 0; e + kLanes <= cols; e += kLanes) store(xr + e, load(xr + e) * inv);
    if (tail > 0) store_partial(xr + e, load_partial(xr + e, tail) * inv, tail);
  }
}

}  // namespace clattn::nn
