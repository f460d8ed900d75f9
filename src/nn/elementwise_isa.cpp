// The nn layers' elementwise and row kernels (nn/nn_isa.h), compiled once per ISA. The
// activations are written in the native vector width: 16-lane vectors with a per-lane choice
// (x >= 0 ? a : b) are lowered lane by lane outside AVX-512, and built once at x86-64-v3 the
// exact GELU forward of every encoder layer ran at AVX2 width on AVX-512 CPUs too (19 % of KWT-1's
// forward on an AVX-512 Xeon, the largest piece after the products).
// Nothing here checks or allocates: the callers in activation.cpp and norm.cpp validate and split.
#include <cmath>
#include <cstring>
#include <limits>

#include "core/simd.h"
#include "nn/nn_isa.h"

#if !defined(CLATTN_ISA_NS)
#error "elementwise_isa.cpp is compiled once per ISA with CLATTN_ISA_NS set (CMakeLists.txt)"
#endif

namespace clattn::nn::CLATTN_ISA_NS {
namespace {

using simd::vn;
using simd::vni;
constexpr int W = simd::kNative;

inline vn splat(float x) { return simd::splat_n(x); }

inline vn vabs(vn x) {
  vni bits;
  std::memcpy(&bits, &x, sizeof bits);
  bits &= 0x7FFFFFFF;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// Results below ~1e−34 go on as float denormals, and every denormal operation is a microcode
// assist on x86 (~150 cycles): GELU over N(0, 8²) inputs ran 10× slower than over N(0, 2²) while
// their tails (x < −12.6) came out that small. So the exps here stay within e^±80 (1.8e−35 to
// 5.5e34): clamped alone where every term they feed is bounded (the erf form's x·t and x·φ: an
// absolute error below 2.5e−35 and 1.5e−34), and the lanes beyond set to 0 where an unbounded
// input multiplies them.
constexpr float kExpBound = 80.f;
inline vn exp_bounded(vn a) { return simd::exp_n(a, -kExpBound, kExpBound); }
inline vn zero_where(vn v, vni mask) {  // v, with 0 in the lanes of mask (all ones there)
  vni bits;
  std::memcpy(&bits, &v, sizeof bits);
  bits &= ~mask;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// erfc(z) for z >= 0 with relative error ~3e-7 in float (Numerical Recipes' erfcc, a Chebyshev
// fit of erfc(z)·exp(z²) in t = 1 / (1 + z/2), fractional error < 1.2e-7 in exact arithmetic).
// Relative, not absolute: 0.5·erfc(|x|/√2) is Φ(x) for x < 0, where GELU needs tiny values right.
inline vn erfc_nonneg(vn z) {
  const vn t = 1.f / (1.f + 0.5f * z);
  vn p = splat(0.17087277f);
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  return t * exp_bounded(p - z * z);  // at least t·e^−80: |x|·t <= 2√2, so GELU's error <= 2.5e−35
}

// 0.5·x·(1 + erf(x/√2)) = x·Φ(x), with Φ(x) = 1 − e/2 for x >= 0 and e/2 for x < 0, where
// e = erfc(|x|/√2): no cancellation on either side.
inline vn gelu_erf(vn x) {
  const vn e = erfc_nonneg(vabs(x) * 0.70710678118654752f);
  return x * (x >= 0.f ? 1.f - 0.5f * e : 0.5f * e);
}

// x / (1 + exp(a)), a logistic's share of x: x where exp(a) is below e^−80 (1 + e^a is 1 in
// float), 0 where it passes e^80 (the exact result is below |x|·1.8e−35, a denormal for any
// moderate x). A huge or infinite a gives one of the two, never NaN; a NaN x or a stays NaN.
inline vn logistic_share(vn x, vn a) { return zero_where(x / (1.f + exp_bounded(a)), a > kExpBound); }

// 0.5·x·(1 + tanh(u)) = x / (1 + exp(−2u)), u = √(2/π)·(x + 0.044715·x³): the logistic form
// keeps relative accuracy where 1 + tanh(u) is tiny, and saturates to x or −0.
inline vn gelu_tanh(vn x) {
  const vn u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return logistic_share(x, -2.f * u);
}

// gate / (1 + exp(−gate)) · up: gate = ±100 gives gate·up or 0, never NaN.
inline vn swiglu(vn gate, vn up) { return logistic_share(gate, -gate) * up; }

// σ(z) and 1 − σ(z) from t = exp(−|z|) <= 1, which never overflows: for z >= 0 they are
// 1/(1+t) and t/(1+t), swapped for z < 0 (each keeps its relative accuracy where it is tiny).
inline void sigmoid_pair(vn z, vn& s, vn& one_minus_s) {
  const vn t = zero_where(exp_bounded(-vabs(z)), vabs(z) > kExpBound);
  const vn inv = 1.f / (1.f + t);
  const vn small = t * inv;
  s = z >= 0.f ? inv : small;
  one_minus_s = z >= 0.f ? small : inv;
}

// d/dx x·Φ(x) = Φ(x) + x·φ(x), φ(x) = exp(−x²/2)/√(2π). Beyond |x| = 20 the derivative is 1 or 0
// in float (Φ(−20) ~ 3e−89), and clamping there keeps x² and x·φ finite for any finite input.
inline vn gelu_erf_grad(vn dy, vn x) {
  x = simd::vmin_n(simd::vmax_n(x, splat(-20.f)), splat(20.f));
  const vn e = erfc_nonneg(vabs(x) * 0.70710678118654752f);
  const vn cdf = x >= 0.f ? 1.f - 0.5f * e : 0.5f * e;
  return dy * (cdf + x * 0.3989422804014327f * exp_bounded(-0.5f * x * x));
}

// d/dx x·σ(2u) = σ(2u) + x·σ(2u)(1 − σ(2u))·2u', u = √(2/π)(x + 0.044715x³),
// u' = √(2/π)(1 + 3·0.044715x²). Clamped at |x| = 10, where σ(2u) is 0 or 1 in float and the
// second term below 1e−35 (so x³ cannot overflow).
inline vn gelu_tanh_grad(vn dy, vn x) {
  x = simd::vmin_n(simd::vmax_n(x, splat(-10.f)), splat(10.f));
  const vn x2 = x * x;
  const vn u = 0.7978845608028654f * (x + 0.044715f * x2 * x);
  const vn du = 0.7978845608028654f * (1.f + 0.134145f * x2);
  vn s, sc;
  sigmoid_pair(2.f * u, s, sc);
  return dy * (s + 2.f * x * s * sc * du);
}

// out[e] = op(a[e], b[e]) over n floats in native vectors, lane by lane (out may equal a or b);
// the tail through a zero-padded copy. b may be null when op ignores it.
template <class Op>
void map2(float* out, const float* a, const float* b, int64_t n, Op op) {
  int64_t e = 0;
  for (; e + W <= n; e += W) simd::store_n(out + e, op(simd::load_n(a + e), b ? simd::load_n(b + e) : vn{}));
  if (e < n) {
    const int r = static_cast<int>(n - e);
    float ta[W] = {}, tb[W] = {};
    std::memcpy(ta, a + e, sizeof(float) * static_cast<size_t>(r));
    if (b) std::memcpy(tb, b + e, sizeof(float) * static_cast<size_t>(r));
    simd::store_n(ta, op(simd::load_n(ta), simd::load_n(tb)));
    std::memcpy(out + e, ta, sizeof(float) * static_cast<size_t>(r));
  }
}

void gelu(float* y, const float* x, int64_t n, Gelu kind) {
  if (kind == Gelu::erf) map2(y, x, nullptr, n, [](vn a, vn) { return gelu_erf(a); });
  else map2(y, x, nullptr, n, [](vn a, vn) { return gelu_tanh(a); });
}

void gelu_grad(float* dx, const float* dy, const float* x, int64_t n, Gelu kind) {
  if (kind == Gelu::erf) map2(dx, dy, x, n, [](vn d, vn v) { return gelu_erf_grad(d, v); });
  else map2(dx, dy, x, n, [](vn d, vn v) { return gelu_tanh_grad(d, v); });
}

void swiglu_fwd(float* y, const float* gate, const float* up, int64_t n) {
  map2(y, gate, up, n, [](vn g, vn u) { return swiglu(g, u); });
}

// Every input lane is loaded before either output is stored, so dgate or dup may alias dy.
void swiglu_grad(float* dgate, float* dup, const float* dy, const float* gate, const float* up, int64_t n) {
  const auto step = [&](const float* d0, const float* g0, const float* u0, float* og, float* ou) {
    const vn d = simd::load_n(d0), g = simd::load_n(g0), u = dgate == nullptr ? vn{} : simd::load_n(u0);
    vn s, sc;
    sigmoid_pair(g, s, sc);
    if (dgate) simd::store_n(og, d * u * (s * (1.f + g * sc)));
    if (dup) simd::store_n(ou, d * (g * s));
  };
  int64_t e = 0;
  for (; e + W <= n; e += W) step(dy + e, gate + e, up ? up + e : nullptr, dgate ? dgate + e : nullptr, dup ? dup + e : nullptr);
  if (e < n) {
    const size_t r = static_cast<size_t>(n - e) * sizeof(float);
    float td[W] = {}, tg[W] = {}, tu[W] = {}, og[W], ou[W];
    std::memcpy(td, dy + e, r);
    std::memcpy(tg, gate + e, r);
    if (dgate) std::memcpy(tu, up + e, r);
    step(td, tg, tu, og, ou);
    if (dgate) std::memcpy(dgate + e, og, r);
    if (dup) std::memcpy(dup + e, ou, r);
  }
}

// ---- Norms: rows read from cache two or three times (statistics, then the output), in native
// vectors with a scalar tail. Written in simd.h's 16-lane vectors, the AVX2 copy kept its
// accumulators and partial loads on the stack: LayerNorm of KWT-1's 29700 x 64 activations ran
// at 0.56 G floats/s on one Zen 3 core, 8 % of the model's forward.

// Σ x[e] over n floats (two accumulators: one add chain per vector is latency bound).
inline float row_sum(const float* x, int64_t n) {
  vn a0{}, a1{};
  int64_t e = 0;
  for (; e + 2 * W <= n; e += 2 * W) {
    a0 += simd::load_n(x + e);
    a1 += simd::load_n(x + e + W);
  }
  for (; e + W <= n; e += W) a0 += simd::load_n(x + e);
  float t = simd::hsum_n(a0 + a1);
  for (; e < n; ++e) t += x[e];
  return t;
}

// Σ (x[e] − m)² over n floats.
inline float row_sq_dev(const float* x, int64_t n, float m) {
  const vn mv = splat(m);
  vn a0{}, a1{};
  int64_t e = 0;
  for (; e + 2 * W <= n; e += 2 * W) {
    const vn d0 = simd::load_n(x + e) - mv, d1 = simd::load_n(x + e + W) - mv;
    a0 += d0 * d0;
    a1 += d1 * d1;
  }
  for (; e + W <= n; e += W) {
    const vn d = simd::load_n(x + e) - mv;
    a0 += d * d;
  }
  float t = simd::hsum_n(a0 + a1);
  for (; e < n; ++e) t += (x[e] - m) * (x[e] - m);
  return t;
}

// Σ x[e]² over n floats.
inline float row_sq(const float* x, int64_t n) {
  vn a0{}, a1{};
  int64_t e = 0;
  for (; e + 2 * W <= n; e += 2 * W) {
    const vn v0 = simd::load_n(x + e), v1 = simd::load_n(x + e + W);
    a0 += v0 * v0;
    a1 += v1 * v1;
  }
  for (; e + W <= n; e += W) {
    const vn v = simd::load_n(x + e);
    a0 += v * v;
  }
  float t = simd::hsum_n(a0 + a1);
  for (; e < n; ++e) t += x[e] * x[e];
  return t;
}

// Rows whose float sums overflow (|x| beyond ~1e19: Σx² is inf) take the double path below; the
// common case pays one comparison per row. Norms are scale invariant, so such rows have finite,
// ordinary outputs: in float they came out as 0 (s = 1/inf) or NaN.
constexpr float kFloatMax = std::numeric_limits<float>::max();

// LayerNorm statistics of a row in double: mean and 1/sqrt(var + eps).
void row_stats_double(const float* x, int64_t n, float eps, bool centre, double& m, double& s) {
  double sum = 0;
  if (centre)
    for (int64_t e = 0; e < n; ++e) sum += x[e];
  m = centre ? sum / static_cast<double>(n) : 0.0;
  double sq = 0;
  for (int64_t e = 0; e < n; ++e) sq += (x[e] - m) * (x[e] - m);
  s = 1.0 / std::sqrt(sq / static_cast<double>(n) + eps);
}

void layernorm_rows(float* y, const float* x, const float* gamma, const float* beta, int64_t r0, int64_t r1,
                    int64_t dim, float eps, float* mean, float* rstd) {
  const float inv_dim = 1.f / static_cast<float>(dim);
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * dim;  // (dim)
    float* yr = y + r * dim;        // (dim), may be xr
    const float m = row_sum(xr, dim) * inv_dim;
    const float sq = row_sq_dev(xr, dim, m);
    if (!(std::fabs(m) <= kFloatMax && sq <= kFloatMax)) {  // overflowed (or NaN): in double
      double md = 0, sd = 0;
      row_stats_double(xr, dim, eps, true, md, sd);
      if (mean) mean[r] = static_cast<float>(md);
      if (rstd) rstd[r] = static_cast<float>(sd);
      for (int64_t e = 0; e < dim; ++e)
        yr[e] = static_cast<float>((xr[e] - md) * sd * gamma[e] + beta[e]);
      continue;
    }
    const float s = 1.f / std::sqrt(sq * inv_dim + eps);
    if (mean) mean[r] = m;
    if (rstd) rstd[r] = s;
    const vn mv = splat(m), sv = splat(s);
    int64_t e = 0;
    for (; e + W <= dim; e += W)
      simd::store_n(yr + e, (simd::load_n(xr + e) - mv) * sv * simd::load_n(gamma + e) + simd::load_n(beta + e));
    for (; e < dim; ++e) yr[e] = (xr[e] - m) * s * gamma[e] + beta[e];
  }
}

void rmsnorm_rows(float* y, const float* x, const float* w, int64_t r0, int64_t r1, int64_t dim, float eps,
                  float* rstd) {
  const float inv_dim = 1.f / static_cast<float>(dim);
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * dim;  // (dim)
    float* yr = y + r * dim;        // (dim), may be xr
    const float sq = row_sq(xr, dim);
    float s;
    if (sq <= kFloatMax) {
      s = 1.f / std::sqrt(sq * inv_dim + eps);
    } else {  // Σx² overflowed (or NaN): in double; x·s stays in range
      double md = 0, sd = 0;
      row_stats_double(xr, dim, eps, false, md, sd);
      s = static_cast<float>(sd);
    }
    if (rstd) rstd[r] = s;
    const vn sv = splat(s);
    int64_t e = 0;
    for (; e + W <= dim; e += W) simd::store_n(yr + e, simd::load_n(xr + e) * sv * simd::load_n(w + e));
    for (; e < dim; ++e) yr[e] = xr[e] * s * w[e];
  }
}

}  // namespace

extern const NnKernels kNnTable = {gelu, gelu_grad, swiglu_fwd, swiglu_grad, layernorm_rows, rmsnorm_rows};

}  // namespace clattn::nn::CLATTN_ISA_NS
