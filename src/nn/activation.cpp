// Elementwise layers of nn.h: the residual add, GELU (exact and tanh forms) and SwiGLU and their
// backward passes, each one vectorised pass over the data in chunks spread over the OpenMP threads.
#include <algorithm>
#include <cstring>

#include "clattn/error.h"
#include "clattn/nn.h"
#include "core/simd.h"
#include "nn/nn_internal.h"

namespace clattn::nn {

namespace {

using namespace detail;  // nn_internal.h: SIMD names, kParallelMin

constexpr int64_t kChunk = 4096;          // floats per OpenMP work item (16 KB)

// y[e] = op(a[e], b[e]) for e in [e, end), lane by lane (so y may equal a or b). b may be null
// when op ignores it.
template <class Op>
void map2_range(float* y, const float* a, const float* b, int64_t e, int64_t end, Op op) {
  for (; e + kLanes <= end; e += kLanes) store(y + e, op(load(a + e), b ? load(b + e) : vf{}));
  if (e < end) {
    const int r = static_cast<int>(end - e);
    store_partial(y + e, op(load_partial(a + e, r), b ? load_partial(b + e, r) : vf{}), r);
  }
}

// The same over n floats, in chunks spread over the threads. Callers pass a lambda, whose own
// type makes op inline here (a function pointer made every 16 floats an indirect call).
template <class Op>
void map2(float* y, const float* a, const float* b, int64_t n, Op op) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) map2_range(y, a, b, c * kChunk, std::min(n, (c + 1) * kChunk), op);
}

inline vf vabs(vf x) {
  vi bits;
  std::memcpy(&bits, &x, sizeof bits);
  bits &= 0x7FFFFFFF;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// erfc(z) for z >= 0 with relative error ~3e-7 in float (Numerical Recipes' erfcc, a Chebyshev
// fit of erfc(z)·exp(z²) in t = 1 / (1 + z/2), fractional error < 1.2e-7 in exact arithmetic).
// Relative, not absolute: 0.5·erfc(|x|/√2) is Φ(x) for x < 0, where GELU needs tiny values right.
inline vf erfc_nonneg(vf z) {
  const vf t = 1.f / (1.f + 0.5f * z);
  vf p = splat(0.17087277f);
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  return t * simd::exp(p - z * z);
}

// 0.5·x·(1 + erf(x/√2)) = x·Φ(x), with Φ(x) = 1 − e/2 for x >= 0 and e/2 for x < 0, where
// e = erfc(|x|/√2): no cancellation on either side.
inline vf gelu_erf(vf x, vf) {
  const vf e = erfc_nonneg(vabs(x) * 0.70710678118654752f);
  return x * (x >= 0.f ? 1.f - 0.5f * e : 0.5f * e);
}

// 0.5·x·(1 + tanh(u)) = x / (1 + exp(−2u)), u = √(2/π)·(x + 0.044715·x³): the logistic form
// keeps relative accuracy where 1 + tanh(u) is tiny, and saturates to x or −0 (exp clamps its
// argument, so a huge |x| gives 0 or inf inside and never NaN).
inline vf gelu_tanh(vf x, vf) {
  const vf u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return x / (1.f + simd::exp(-2.f * u));
}

// gate / (1 + exp(−gate)) · up: exp(100) is inf in float and gate / inf = −0, so gate = ±100
// gives 0 or gate·up, never NaN.
inline vf swiglu(vf gate, vf up) { return gate / (1.f + simd::exp(-gate)) * up; }

// σ(z) and 1 − σ(z) from t = exp(−|z|) <= 1, which never overflows: for z >= 0 they are
// 1/(1+t) and t/(1+t), swapped for z < 0 (each keeps its relative accuracy where it is tiny).
inline void sigmoid_pair(vf z, vf& s, vf& one_minus_s) {
  const vf t = simd::exp(-vabs(z));
  const vf inv = 1.f / (1.f + t);
  const vf small = t * inv;
  s = z >= 0.f ? inv : small;
  one_minus_s = z >= 0.f ? small : inv;
}

// d/dx x·Φ(x) = Φ(x) + x·φ(x), φ(x) = exp(−x²/2)/√(2π). Beyond |x| = 20 the derivative is 1 or 0
// in float (Φ(−20) ~ 3e−89), and clamping there keeps x² and x·φ finite for any finite input.
inline vf gelu_erf_grad(vf dy, vf x) {
  x = simd::vmin(simd::vmax(x, splat(-20.f)), splat(20.f));
  const vf e = erfc_nonneg(vabs(x) * 0.70710678118654752f);
  const vf cdf = x >= 0.f ? 1.f - 0.5f * e : 0.5f * e;
  return dy * (cdf + x * 0.3989422804014327f * simd::exp(-0.5f * x * x));
}

// d/dx x·σ(2u) = σ(2u) + x·σ(2u)(1 − σ(2u))·2u', u = √(2/π)(x + 0.044715x³),
// u' = √(2/π)(1 + 3·0.044715x²). Clamped at |x| = 10, where σ(2u) is 0 or 1 in float and the
// second term below 1e−35 (so x³ cannot overflow).
inline vf gelu_tanh_grad(vf dy, vf x) {
  x = simd::vmin(simd::vmax(x, splat(-10.f)), splat(10.f));
  const vf x2 = x * x;
  const vf u = 0.7978845608028654f * (x + 0.044715f * x2 * x);
  const vf du = 0.7978845608028654f * (1.f + 0.134145f * x2);
  vf s, sc;
  sigmoid_pair(2.f * u, s, sc);
  return dy * (s + 2.f * x * s * sc * du);
}

// SwiGLU's backward for e in [e, end): every input lane is loaded before either output is stored,
// so dgate or dup may alias dy.
void swiglu_bwd_range(float* dgate, float* dup, const float* dy, const float* gate, const float* up, int64_t e,
                      int64_t end) {
  const auto step = [&](int64_t i, int r) {
    const bool full = r == kLanes;
    const vf d = full ? load(dy + i) : load_partial(dy + i, r);
    const vf g = full ? load(gate + i) : load_partial(gate + i, r);
    const vf u = dgate == nullptr ? vf{} : full ? load(up + i) : load_partial(up + i, r);
    vf s, sc;
    sigmoid_pair(g, s, sc);
    if (dgate) {
      const vf v = d * u * (s * (1.f + g * sc));
      if (full) store(dgate + i, v);
      else store_partial(dgate + i, v, r);
    }
    if (dup) {
      const vf v = d * (g * s);
      if (full) store(dup + i, v);
      else store_partial(dup + i, v, r);
    }
  };
  for (; e + kLanes <= end; e += kLanes) step(e, kLanes);
  if (e < end) step(e, static_cast<int>(end - e));
}

}  // namespace

void add_inplace(float* x, const float* r, int64_t n) {
  check(n >= 0, "add_inplace: n must be >= 0, got ", n);
  if (n == 0) return;
  check(x != nullptr && r != nullptr, "add_inplace: x and r must not be null");
  map2(x, x, r, n, [](vf a, vf b) { return a + b; });
}

void gelu_fwd(float* y, const float* x, int64_t n, Gelu kind) {
  check(n >= 0, "gelu_fwd: n must be >= 0, got ", n);
  if (n == 0) return;
  check(y != nullptr && x != nullptr, "gelu_fwd: y and x must not be null");
  if (kind == Gelu::erf) map2(y, x, nullptr, n, [](vf a, vf b) { return gelu_erf(a, b); });
  else map2(y, x, nullptr, n, [](vf a, vf b) { return gelu_tanh(a, b); });
}

void swiglu_fwd(float* y, const float* gate, const float* up, int64_t n) {
  check(n >= 0, "swiglu_fwd: n must be >= 0, got ", n);
  if (n == 0) return;
  check(y != nullptr && gate != nullptr && up != nullptr, "swiglu_fwd: y, gate and up must not be null");
  map2(y, gate, up, n, [](vf a, vf b) { return swiglu(a, b); });
}

void swiglu_rows_fwd(float* y, int64_t ldy, const float* gu, int64_t ldgu, int64_t rows, int64_t n) {
  check(rows >= 0 && n >= 0 && ldy >= n && ldgu >= 2 * n, "swiglu_rows_fwd: need rows, n >= 0, ldy >= n and ldgu >= 2n, got rows=",
        rows, " n=", n, " ldy=", ldy, " ldgu=", ldgu);
  if (rows == 0 || n == 0) return;
  check(y != nullptr && gu != nullptr, "swiglu_rows_fwd: y and gu must not be null");
#pragma omp parallel for schedule(static) if (rows * n > kParallelMin)
  for (int64_t r = 0; r < rows; ++r)
    map2_range(y + r * ldy, gu + r * ldgu, gu + r * ldgu + n, 0, n, [](vf a, vf b) { return swiglu(a, b); });
}

void gelu_bwd(float* dx, const float* dy, const float* x, int64_t n, Gelu kind) {
  check(n >= 0, "gelu_bwd: n must be >= 0, got ", n);
  if (n == 0) return;
  check(dx != nullptr && dy != nullptr && x != nullptr, "gelu_bwd: dx, dy and x must not be null");
  if (kind == Gelu::erf) map2(dx, dy, x, n, [](vf a, vf b) { return gelu_erf_grad(a, b); });
  else map2(dx, dy, x, n, [](vf a, vf b) { return gelu_tanh_grad(a, b); });
}

// y = silu(gate) ∘ up, silu(g) = g·σ(g), silu'(g) = σ(g)·(1 + g·(1 − σ(g))):
//   dgate = dy ∘ up ∘ silu'(gate),  dup = dy ∘ silu(gate).
// Lane by lane, every input is loaded before either output is stored, so dgate or dup may alias dy.
void swiglu_bwd(float* dgate, float* dup, const float* dy, const float* gate, const float* up,
                int64_t n) {
  check(n >= 0, "swiglu_bwd: n must be >= 0, got ", n);
  if (n == 0 || (dgate == nullptr && dup == nullptr)) return;
  check(dy != nullptr && gate != nullptr, "swiglu_bwd: dy and gate must not be null");
  check(dgate == nullptr || up != nullptr, "swiglu_bwd: up must not be null when dgate is wanted");
  check(dgate == nullptr || dgate != dup, "swiglu_bwd: dgate and dup must be different buffers");
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) swiglu_bwd_range(dgate, dup, dy, gate, up, c * kChunk, std::min(n, (c + 1) * kChunk));
}

void swiglu_rows_bwd(float* dgu, int64_t lddgu, const float* dy, int64_t lddy, const float* gu, int64_t ldgu, int64_t rows,
                     int64_t n) {
  check(rows >= 0 && n >= 0 && lddy >= n && ldgu >= 2 * n && lddgu >= 2 * n,
        "swiglu_rows_bwd: need rows, n >= 0, lddy >= n, ldgu and lddgu >= 2n, got rows=", rows, " n=", n);
  if (rows == 0 || n == 0) return;
  check(dgu != nullptr && dy != nullptr && gu != nullptr, "swiglu_rows_bwd: dgu, dy and gu must not be null");
#pragma omp parallel for schedule(static) if (rows * n > kParallelMin)
  for (int64_t r = 0; r < rows; ++r)
    swiglu_bwd_range(dgu + r * lddgu, dgu + r * lddgu + n, dy + r * lddy, gu + r * ldgu, gu + r * ldgu + n, 0, n);
}

}  // namespace clattn::nn
