// Optimisation (nn.h): the AdamW step, the squared gradient norm for clipping, the scaling that
// clips, and the warm-up + cosine learning-rate schedule. Every pass is one vectorised sweep over
// chunks spread over the OpenMP threads, elementwise (so any thread count gives the same bits)
// except sum_squares, whose fixed block partition makes it so too.
#include <algorithm>
#include <cmath>

#include "clattn/error.h"
#include "clattn/nn.h"
#include "nn/nn_internal.h"

namespace clattn::nn {

using namespace detail;  // nn_internal.h: SIMD names, kParallelMin

namespace {

constexpr int64_t kChunk = 4096;  // floats per OpenMP work item

// Runs op(e, r) over [0, n) in vector steps (r = kLanes, or the 1..15 lanes of the last step).
template <class Op>
void for_vectors(int64_t n, Op op) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = std::min(n, (c + 1) * kChunk);
    int64_t e = c * kChunk;
    for (; e + kLanes <= end; e += kLanes) op(e, kLanes);
    if (e < end) op(e, static_cast<int>(end - e));
  }
}

inline vf ld(const float* p, int r) { return r == kLanes ? load(p) : load_partial(p, r); }
inline void st(float* p, vf v, int r) {
  if (r == kLanes) store(p, v);
  else store_partial(p, v, r);
}

inline vf vsqrt(vf x) {
#if defined(__AVX512F__)
  return _mm512_mask_sqrt_ps(x, simd::kAll, x);
#else
  for (int i = 0; i < kLanes; ++i) x[i] = std::sqrt(x[i]);
  return x;
#endif
}

// sum_squares splits n into at most this many contiguous blocks, a count fixed by n alone; each
// block sums in double vectors, then the blocks are added in order.
constexpr int64_t kMaxSqBlocks = 1024;
constexpr int64_t kMinSqBlock = 4096;

typedef double vd __attribute__((vector_size(64)));

double block_sum_squares(const float* g, int64_t n) {
  vd a0{}, a1{};
  int64_t e = 0;
  for (; e + kLanes <= n; e += kLanes) {
    const vf v = load(g + e);
    const vd lo = __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7), vd);
    const vd hi = __builtin_convertvector(__builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15), vd);
    a0 += lo * lo;
    a1 += hi * hi;
  }
  const vd a = a0 + a1;
  double s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
  for (; e < n; ++e) s += static_cast<double>(g[e]) * g[e];
  return s;
}

}  // namespace

// With bias corrections c1 = 1 − β1^t, c2 = 1 − β2^t (in double):
//   m = β1·m + (1 − β1)·g,  v = β2·v + (1 − β2)·g²,
//   param −= lr · ( (m / c1) / (sqrt(v / c2) + eps) + wd·param )   (the wd term only with decay),
// the decay using the parameter before this step, as PyTorch's AdamW does.
void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, int64_t t, float lr,
                const AdamWOptions& opt, bool decay) {
  check(n >= 0, "adamw_step: n must be >= 0, got ", n);
  check(t >= 1, "adamw_step: the step t must be >= 1 (bias correction), got ", t);
  check(std::isfinite(lr) && lr >= 0.f, "adamw_step: lr must be finite and >= 0, got ", lr);
  check(opt.beta1 >= 0.f && opt.beta1 < 1.f && opt.beta2 >= 0.f && opt.beta2 < 1.f,
        "adamw_step: beta1 and beta2 must lie in [0, 1), got ", opt.beta1, " and ", opt.beta2);
  check(std::isfinite(opt.eps) && opt.eps > 0.f, "adamw_step: eps must be finite and > 0, got ", opt.eps);
  check(std::isfinite(opt.weight_decay) && opt.weight_decay >= 0.f,
        "adamw_step: weight_decay must be finite and >= 0, got ", opt.weight_decay);
  if (n == 0) return;
  check(param != nullptr && grad != nullptr && m != nullptr && v != nullptr,
        "adamw_step: param, grad, m and v must not be null");
  const double td = static_cast<double>(t);
  const float inv_c1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(opt.beta1), td)));
  const float inv_c2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(opt.beta2), td)));
  const float b1 = opt.beta1, b2 = opt.beta2, a1 = 1.f - opt.beta1, a2 = 1.f - opt.beta2;
  const float eps = opt.eps, wd = decay ? opt.weight_decay : 0.f;
  for_vectors(n, [&](int64_t e, int r) {
    const vf g = ld(grad + e, r), p = ld(param + e, r);
    const vf mn = b1 * ld(m + e, r) + a1 * g;
    const vf vn = b2 * ld(v + e, r) + a2 * (g * g);
    const vf upd = (mn * inv_c1) / (vsqrt(vn * inv_c2) + eps);
    st(m + e, mn, r);
    st(v + e, vn, r);
    st(param + e, p - lr * (upd + wd * p), r);
  });
}

int64_t sum_squares_blocks(int64_t n) { return std::clamp<int64_t>(n / kMinSqBlock, 1, kMaxSqBlocks); }

double sum_squares_block(const float* g, int64_t n) { return n > 0 ? block_sum_squares(g, n) : 0.0; }

double sum_squares(const float* g, int64_t n) {
  check(n >= 0, "sum_squares: n must be >= 0, got ", n);
  if (n == 0) return 0.0;
  check(g != nullptr, "sum_squares: g must not be null");
  const int64_t blocks = sum_squares_blocks(n);
  double partial[kMaxSqBlocks];  // (blocks)
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t e0 = n * b / blocks, e1 = n * (b + 1) / blocks;
    partial[b] = block_sum_squares(g + e0, e1 - e0);
  }
  double s = 0;
  for (int64_t b = 0; b < blocks; ++b) s += partial[b];
  return s;
}

void scale_inplace(float* x, float a, int64_t n) {
  check(n >= 0, "scale_inplace: n must be >= 0, got ", n);
  if (n == 0) return;
  check(x != nullptr, "scale_inplace: x must not be null");
  for_vectors(n, [&](int64_t e, int r) { st(x + e, ld(x + e, r) * a, r); });
}

float lr_schedule(int64_t step, int64_t warmup, int64_t total, float base, float min_lr) {
  check(step >= 0 && warmup >= 0 && total >= 0, "lr_schedule: step, warmup and total must be >= 0, got step=",
        step, " warmup=", warmup, " total=", total);
  check(std::isfinite(base) && std::isfinite(min_lr), "lr_schedule: base and min_lr must be finite, got ", base,
        " and ", min_lr);
  if (step < warmup) return static_cast<float>(static_cast<double>(base) * static_cast<double>(step + 1) / static_cast<double>(warmup));
  if (total <= warmup) return base;
  if (step >= total) return min_lr;
  const double progress = static_cast<double>(step - warmup) / static_cast<double>(total - warmup);
  const double pi = 3.14159265358979323846;
  return static_cast<float>(min_lr + 0.5 * (static_cast<double>(base) - min_lr) * (1.0 + std::cos(pi * progress)));
}

}  // namespace clattn::nn
