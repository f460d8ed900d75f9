// Row-wise layers of nn.h: LayerNorm, RMSNorm and the row softmax, and the norms' backward passes.
// The norms' forward rows are the active ISA's (nn/elementwise_isa.cpp, through nn_isa.h).
// Each row is read from cache two or three times (statistics, then the output), so a call costs
// one read and one write of the data; rows are spread over the OpenMP threads. The backward
// passes make two sweeps: the gain/bias gradients by column ranges (one thread per column, rows in
// order: the same bits for any thread count), then dx by rows. The column sweep comes first so dx
// may overwrite dy.
#include <cmath>
#include <limits>

#include "clattn/error.h"
#include "clattn/nn.h"
#include "core/simd.h"
#include "nn/nn_internal.h"
#include "nn/nn_isa.h"

namespace clattn::nn {

namespace {

using namespace detail;  // nn_internal.h: SIMD names, kParallelMin, for_column_ranges


// v with lanes n.. set to `fill` (the tail of a row after load_partial, which fills with 0).
inline vf keep_first(vf v, int n, float fill) {
  const vi lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return lane < n ? v : splat(fill);
}

// A row with rstd below this (standard deviation above 1e30) may have x − mean beyond float's
// range (values near ±FLT_MAX of both signs): its backward forms (x − m)·s in double.
constexpr float kTinyRstd = 1e-30f;

// Runs fn(r0, r1) over blocks of rows spread over the threads (one thread below kParallelMin floats).
template <class Fn>
void over_row_blocks(int64_t rows, int64_t dim, Fn fn) {
  constexpr int64_t kRows = 16;
  const int64_t blocks = (rows + kRows - 1) / kRows;
#pragma omp parallel for schedule(static) if (rows * dim > kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) fn(b * kRows, std::min(rows, (b + 1) * kRows));
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
  const NnKernels& k = isa_nn_kernels();
  over_row_blocks(rows, dim, [&](int64_t r0, int64_t r1) { k.layernorm_rows(y, x, gamma, beta, r0, r1, dim, eps, mean, rstd); });
}

void rmsnorm_fwd(float* y, const float* x, const float* w, int64_t rows, int64_t dim, float eps,
                 float* rstd) {
  check_norm("rmsnorm_fwd", y, x, w, rows, dim, eps);
  const NnKernels& k = isa_nn_kernels();
  over_row_blocks(rows, dim, [&](int64_t r0, int64_t r1) { k.rmsnorm_rows(y, x, w, r0, r1, dim, eps, rstd); });
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

namespace {

void check_norm_bwd(const char* name, const float* dx, const float* dy, const float* x, const float* w,
                    const float* stat, int64_t rows, int64_t dim, bool accumulate) {
  check(rows >= 0 && dim >= 1, name, ": need rows >= 0 and dim >= 1, got rows=", rows, " dim=", dim);
  check(rows == 0 || (dy != nullptr && x != nullptr && stat != nullptr), name,
        ": dy, x and the saved statistics must not be null");
  check(rows == 0 || dx == nullptr || w != nullptr, name, ": the gain must not be null when dx is wanted");
  check(!(accumulate && dx != nullptr && dx == dy), name, ": dx may alias dy only when writing (accumulate = false)");
}

// The dx sweep shared by both norms, per row r with xhat = (x − m)·s, g = dy ∘ w:
//   LayerNorm (centre): dx = s·(g − mean(g) − xhat·mean(g ∘ xhat))
//   RMSNorm (m = 0):    dx = s·(g − xhat·mean(g ∘ xhat))
template <bool kCentre>
void norm_dx(float* dx, const float* dy, const float* x, const float* w, const float* mean,
             const float* rstd, int64_t rows, int64_t dim, bool accumulate) {
  const float inv_dim = 1.f / static_cast<float>(dim);
  const int tail = static_cast<int>(dim % kLanes);
  const int64_t body = dim - tail;
#pragma omp parallel for schedule(static) if (rows * dim > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* dyr = dy + r * dim;  // (dim)
    const float* xr = x + r * dim;    // (dim)
    float* dxr = dx + r * dim;        // (dim), may be dyr
    if (kCentre && rstd[r] < kTinyRstd) {  // x − m may overflow float: this row in double
      double sg = 0, sgx = 0;
      const double m = mean[r], sr = rstd[r];
      for (int64_t e = 0; e < dim; ++e) {
        const double g = static_cast<double>(dyr[e]) * w[e];
        sg += g;
        sgx += g * ((xr[e] - m) * sr);
      }
      const double a = sg / static_cast<double>(dim), c = sgx / static_cast<double>(dim);
      for (int64_t e = 0; e < dim; ++e) {
        const float d = static_cast<float>(sr * (static_cast<double>(dyr[e]) * w[e] - a - (xr[e] - m) * sr * c));
        dxr[e] = accumulate ? dxr[e] + d : d;
      }
      continue;
    }
    const vf mv = splat(kCentre ? mean[r] : 0.f), sv = splat(rstd[r]);
    vf sg{}, sgx{};  // Σ g, Σ g·xhat
    for (int64_t e = 0; e < body; e += kLanes) {
      const vf g = load(dyr + e) * load(w + e);
      sg += g;
      sgx += g * ((load(xr + e) - mv) * sv);
    }
    if (tail) {  // lanes past the row load as 0, so g = 0 there
      const vf g = load_partial(dyr + body, tail) * load_partial(w + body, tail);
      sg += g;
      sgx += g * ((load_partial(xr + body, tail) - mv) * sv);
    }
    const vf a = splat(kCentre ? simd::hsum(sg) * inv_dim : 0.f), c = splat(simd::hsum(sgx) * inv_dim);
    for (int64_t e = 0; e < body; e += kLanes) {
      const vf d = sv * (load(dyr + e) * load(w + e) - a - (load(xr + e) - mv) * sv * c);
      store(dxr + e, accumulate ? load(dxr + e) + d : d);
    }
    if (tail) {
      const vf d = sv * (load_partial(dyr + body, tail) * load_partial(w + body, tail) - a -
                         (load_partial(xr + body, tail) - mv) * sv * c);
      store_partial(dxr + body, accumulate ? load_partial(dxr + body, tail) + d : d, tail);
    }
  }
}

// dgain += Σ_rows dy ∘ xhat and dbias += Σ_rows dy (either may be null), xhat = (x − m)·s.
template <bool kCentre>
void norm_dparams(float* dgain, float* dbias, const float* dy, const float* x, const float* mean,
                  const float* rstd, int64_t rows, int64_t dim) {
  for_column_ranges(dim, rows * dim > kParallelMin, [&](int64_t c0, int64_t c1) {
    for (int64_t p0 = c0; p0 < c1; p0 += kColPiece) {
      const int64_t n = std::min(kColPiece, c1 - p0);
      const int tail = static_cast<int>(n % kLanes);
      const int64_t body = n - tail;
      alignas(64) float ag[kColPiece] = {}, ab[kColPiece] = {};  // (n) sums over rows so far
      for (int64_t r = 0; r < rows; ++r) {
        const float* dyr = dy + r * dim + p0;  // (n)
        const float* xr = x + r * dim + p0;    // (n)
        if (kCentre && rstd[r] < kTinyRstd) {  // x − m may overflow float: this row in double
          for (int64_t e = 0; e < n; ++e) {
            ag[e] += static_cast<float>(dyr[e] * ((xr[e] - static_cast<double>(mean[r])) * rstd[r]));
            ab[e] += dyr[e];
          }
          continue;
        }
        const vf mv = splat(kCentre ? mean[r] : 0.f), sv = splat(rstd[r]);
        for (int64_t e = 0; e < body; e += kLanes) {
          const vf d = load(dyr + e);
          store(ag + e, load(ag + e) + d * ((load(xr + e) - mv) * sv));
          store(ab + e, load(ab + e) + d);
        }
        if (tail) {
          const vf d = load_partial(dyr + body, tail);
          store(ag + body, load(ag + body) + d * ((load_partial(xr + body, tail) - mv) * sv));
          store(ab + body, load(ab + body) + d);
        }
      }
      if (dgain) add_row(dgain + p0, ag, n);
      if (dbias) add_row(dbias + p0, ab, n);
    }
  });
}

}  // namespace

void layernorm_bwd(float* dx, float* dgamma, float* dbeta, const float* dy, const float* x,
                   const float* gamma, const float* mean, const float* rstd, int64_t rows,
                   int64_t dim, bool accumulate) {
  check_norm_bwd("layernorm_bwd", dx, dy, x, gamma, rstd, rows, dim, accumulate);
  check(rows == 0 || mean != nullptr, "layernorm_bwd: mean must not be null");
  if (rows == 0) return;
  if (dgamma || dbeta) norm_dparams<true>(dgamma, dbeta, dy, x, mean, rstd, rows, dim);
  if (dx) norm_dx<true>(dx, dy, x, gamma, mean, rstd, rows, dim, accumulate);
}

void rmsnorm_bwd(float* dx, float* dw, const float* dy, const float* x, const float* w,
                 const float* rstd, int64_t rows, int64_t dim, bool accumulate) {
  check_norm_bwd("rmsnorm_bwd", dx, dy, x, w, rstd, rows, dim, accumulate);
  if (rows == 0) return;
  if (dw) norm_dparams<false>(dw, nullptr, dy, x, nullptr, rstd, rows, dim);
  if (dx) norm_dx<false>(dx, dy, x, w, nullptr, rstd, rows, dim, accumulate);
}

}  // namespace clattn::nn
