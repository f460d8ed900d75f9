// Shared helpers for the test suites: seeded inputs, error measures, guarded output buffers.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <string>
#include <vector>

#include "clattn/attention.h"
#include "clattn/threads.h"
#include "clattn/rng.h"
#include "clattn/tensor.h"
#include "core/isa.h"

namespace clattn::testing {

// Runs body once per ISA copy of the kernels this build has and this CPU runs (core/isa.h), each
// active in turn and named in the failures' trace.
template <class F>
void for_each_isa(F body) {
  for (const Isa isa : runnable_isas()) {
    const ScopedIsa scoped(isa);
    SCOPED_TRACE(isa_name(isa));
    body();
  }
}

// N(0, sigma^2) entries from a fixed (seed, stream).
inline Tensor randn(const Shape& s, uint64_t seed, uint64_t stream, float sigma = 1.f) {
  Tensor t = Tensor::empty_like_shape(s);
  Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = sigma * rng.normal(stream, static_cast<uint64_t>(i));
  return t;
}

// Σ(a−b)² / Σa² over two equally shaped views (0 when both are 0).
inline double nmse(ConstView a, ConstView b) {
  Tensor ca = Tensor::from(a), cb = Tensor::from(b);
  double num = 0, den = 0;
  for (int64_t i = 0; i < ca.numel(); ++i) {
    const double x = ca.data()[i], y = cb.data()[i];
    num += (x - y) * (x - y);
    den += x * x;
  }
  return den == 0 ? num : num / den;
}

// Rows (positions) [from, from + n) of a (B, H, M, D) tensor, as a view.
inline ConstView rows(const Tensor& t, int64_t from, int64_t n) {
  ConstView v = t.view();
  v.data += from * v.stride(2);
  v.shape = Shape{t.dim(0), t.dim(1), n, t.dim(3)};
  return v;
}

// Same shape and the same bits (both undefined counts as equal).
inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  return a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), sizeof(float) * static_cast<size_t>(a.numel())) == 0;
}

inline double max_abs_diff(ConstView a, ConstView b) {
  Tensor ca = Tensor::from(a), cb = Tensor::from(b);
  double m = 0;
  for (int64_t i = 0; i < ca.numel(); ++i)
    m = std::max(m, std::abs(static_cast<double>(ca.data()[i]) - cb.data()[i]));
  return m;
}

inline bool all_finite(ConstView a) {
  Tensor c = Tensor::from(a);
  for (int64_t i = 0; i < c.numel(); ++i)
    if (!std::isfinite(c.data()[i])) return false;
  return true;
}

// A (B, H, N, D) buffer whose rows are spaced `pad` floats apart and framed by guard floats:
// kernels writing outside their view trip `intact()`.
class Guarded {
 public:
  static constexpr float kSentinel = -12345.f;
  Guarded(const Shape& s, int64_t pad = 3, int64_t guard = 64) : shape_(s), guard_(guard) {
    row_ = s[3] + pad;
    buf_.assign(static_cast<size_t>(2 * guard + s[0] * s[1] * s[2] * row_), kSentinel);
  }
  View view() {
    View v{buf_.data() + guard_, shape_, {}};
    v.strides = {shape_[1] * shape_[2] * row_, shape_[2] * row_, row_, 1};
    return v;
  }
  // Every float outside the view still holds the sentinel.
  bool intact() const {
    for (int64_t i = 0; i < static_cast<int64_t>(buf_.size()); ++i) {
      const int64_t o = i - guard_;
      const bool inside = o >= 0 && o < static_cast<int64_t>(buf_.size()) - 2 * guard_ && o % row_ < shape_[3];
      if (!inside && buf_[static_cast<size_t>(i)] != kSentinel) return false;
    }
    return true;
  }
  void fill_view(float x) {
    View v = view();
    for (int64_t a = 0; a < shape_[0]; ++a)
      for (int64_t b = 0; b < shape_[1]; ++b)
        for (int64_t i = 0; i < shape_[2]; ++i)
          for (int64_t e = 0; e < shape_[3]; ++e) v.ptr(a, b, i)[e] = x;
  }

 private:
  Shape shape_;
  int64_t guard_, row_;
  std::vector<float> buf_;
};

// Problem description used across suites.
struct Problem {
  int64_t B = 1, H = 2, Hkv = 2, N = 16, M = 16, Dk = 8, Dv = 8;
  bool causal = false;
  std::vector<int32_t> qlen{}, klen{};  // empty = full
  bool bias = false;
  uint64_t seed = 1;
};

struct ProblemData {
  Tensor q, k, v, bias, dout;
  std::vector<int32_t> qlen, klen;
  bool causal = false;
  bool shared_qk = false;  // k is q itself (the same view), as shared-QK attention requires
  AttentionInputs inputs() const {
    AttentionInputs in;
    in.q = q.view();
    in.k = shared_qk ? q.view() : k.view();
    in.v = v.view();
    in.query_lengths = qlen;
    in.key_lengths = klen;
    in.causal = causal;
    if (bias.defined()) in.bias = bias.view();
    return in;
  }
  // The same with a layer state (a stateful variant's: routing's EMA centroids).
  AttentionInputs inputs(AttentionState* state) const {
    AttentionInputs in = inputs();
    in.state = state;
    return in;
  }
};

inline ProblemData make_problem(const Problem& p) {
  ProblemData d;
  d.q = randn(Shape{p.B, p.H, p.N, p.Dk}, p.seed, 1);
  d.k = randn(Shape{p.B, p.Hkv, p.M, p.Dk}, p.seed, 2);
  d.v = randn(Shape{p.B, p.Hkv, p.M, p.Dv}, p.seed, 3);
  d.dout = randn(Shape{p.B, p.H, p.N, p.Dv}, p.seed, 4);
  if (p.bias) {
    d.bias = randn(Shape{p.N, p.M}, p.seed, 5);
    // A few blocked entries, as an additive mask would have.
    for (int64_t i = 0; i < p.N; ++i)
      for (int64_t j = 0; j < p.M; ++j)
        if ((i * 7 + j * 3) % 11 == 0) d.bias.data()[i * p.M + j] = -INFINITY;
  }
  d.qlen = p.qlen;
  d.klen = p.klen;
  d.causal = p.causal;
  return d;
}

// Runs `spec` forward and backward on 1, 2 and 3 threads and expects outputs and gradients
// equal to the single-thread ones bit for bit: for kernels that split one head's work over the
// team (B·H below the thread count) in a partition that does not depend on the thread count.
inline void expect_same_bits_on_1_2_3_threads(const std::string& spec, const ProblemData& pd) {
  const int saved = max_threads();
  const AttentionInputs in = pd.inputs();
  std::vector<Tensor> got;
  for (int threads : {1, 2, 3}) {
    set_threads(threads);
    auto att = make_attention(spec);
    Context ctx;
    Tensor out(Shape{in.q.shape[0], in.q.shape[1], in.q.shape[2], in.v.shape[3]});
    Tensor dq(in.q.shape), dk(in.k.shape), dv(in.v.shape);
    att->forward(in, out.view(), ctx);
    att->backward(in, out.view(), ctx, pd.dout.view(), dq.view(), dk.view(), dv.view());
    for (Tensor* t : {&out, &dq, &dk, &dv}) got.push_back(std::move(*t));
  }
  set_threads(saved);
  for (size_t x = 4; x < got.size(); ++x)
    EXPECT_TRUE(bitwise_equal(got[x], got[x % 4]))
        << spec << ": tensor " << x % 4 << " (o, dq, dk, dv) differs on " << x / 4 + 1 << " threads";
}

}  // namespace clattn::testing
