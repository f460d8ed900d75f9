// Input validation shared by every variant: the attention contract of docs/design.md checked once, up
// front, with messages that name the rule, the variant and the values seen.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>

#include "attention/validate.h"
#include "clattn/attention.h"
#include "clattn/kv_cache.h"
#include "core/simd.h"

namespace clattn {
namespace {

// held_elsewhere: the view carries shape and strides only (a 16-bit KVCache's keys and values,
// which the kernels read from the cache itself).
void check_view(ConstView t, int rank, std::string_view what, std::string_view who, bool held_elsewhere = false) {
  check(held_elsewhere || !t.empty() || t.numel() == 0, who, ": ", what, " is missing");
  check(t.rank() == rank, who, ": ", what, " must have rank ", rank, ", got shape ", t.shape);
  for (int i = 0; i < rank; ++i)
    check(t.dim(i) >= 0, who, ": ", what, " has a negative dim: ", t.shape);
  check(t.numel() == 0 || t.stride(rank - 1) == 1, who, ": ", what,
        " must have unit stride in its last dim, got stride ", t.stride(rank - 1));
}

// NaN/Inf anywhere in a (., ., rows, cols) view is an error: it would poison every row it meets.
// x·0 is 0 for finite x and NaN for ±inf or NaN, so one vector multiply-add per vector finds
// any of them; the same pass keeps the largest |x| (the overflow rule's input, validate.h), so
// the data is read once for both. It must stay small beside the attention itself, so it runs at
// memory speed: four independent accumulators, one horizontal test per block of 32 rows, and a
// row-by-row rescan only of a block that fails.
// Written in the native vector width (one register per value): in 16-lane vectors the eight
// accumulators did not fit AVX2's 16 registers and lived on the stack, and the pass ran at a
// third of memory speed (9 % of improved-clustered's forward at N = 16384).
bool rows_finite(const float* base, int64_t sr, int64_t rows, int64_t cols, float& mx) {
  using simd::vn;
  constexpr int64_t W = simd::kNative;
  vn acc[4] = {}, m[4] = {};
  // |x| as max(x, -x): a NaN lane may be dropped here, but the sum above already caught it.
  auto absmax = [](vn cur, vn x) {
    const vn a = x > -x ? x : -x;
    return a > cur ? a : cur;
  };
  float tail_acc = 0.f, tail_max = 0.f;
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = base + i * sr;
    int64_t j = 0;
    for (; j + 4 * W <= cols; j += 4 * W)
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) {
        const vn x = simd::load_n(row + j + u * W);
        acc[u] += x * 0.f;
        m[u] = absmax(m[u], x);
      }
    for (; j + W <= cols; j += W) {
      const vn x = simd::load_n(row + j);
      acc[0] += x * 0.f;
      m[0] = absmax(m[0], x);
    }
    for (; j < cols; ++j) {
      tail_acc += row[j] * 0.f;
      tail_max = std::max(tail_max, std::fabs(row[j]));
    }
  }
  const vn mm = absmax(absmax(m[0], m[1]), absmax(m[2], m[3]));
  mx = std::max({mx, simd::hmax_n(mm), tail_max});
  return simd::hsum_n((acc[0] + acc[1]) + (acc[2] + acc[3])) + tail_acc == 0.f;
}

void check_lengths(std::span<const int32_t> len, int64_t B, int64_t limit, std::string_view what,
                   std::string_view who) {
  if (len.empty()) return;
  check(static_cast<int64_t>(len.size()) == B, who, ": ", what, " must have B = ", B,
        " entries, got ", len.size());
  for (size_t b = 0; b < len.size(); ++b)
    check(len[b] >= 0 && len[b] <= limit, who, ": ", what, "[", b, "] must be in [0, ", limit,
          "], got ", len[b]);
}

// Shared-QK attention: k is q itself, or a tensor of identical shape and values (checked row by
// row; the same view costs nothing).
void check_shared_qk(const AttentionInputs& in, std::string_view who) {
  const bool same_view = in.k.data == in.q.data && in.k.shape == in.q.shape && in.k.strides == in.q.strides;
  bool equal = same_view || in.k.shape == in.q.shape;
  for (int64_t b = 0; !same_view && equal && b < in.q.dim(0); ++b)
    for (int64_t h = 0; equal && h < in.q.dim(1); ++h)
      for (int64_t i = 0; equal && i < in.q.dim(2); ++i)
        equal = std::memcmp(in.q.ptr(b, h, i), in.k.ptr(b, h, i),
                            sizeof(float) * static_cast<size_t>(in.q.dim(3))) == 0;
  check(equal, who, " is shared-QK attention (keys are the queries): it needs k identical to q, ",
        "got q ", in.q.shape, " and k ", in.k.shape,
        in.k.shape == in.q.shape ? " with other values" : "");
}

// The message of a non-finite input element, whether found in the data or given as a fact.
[[noreturn]] void not_finite(std::string_view who, std::string_view what, double value, std::span<const int64_t> index) {
  std::string at;
  for (size_t i = 0; i < index.size(); ++i) at += (i ? ", " : "") + std::to_string(index[i]);
  throw NumericError(detail::concat(who, ": ", what, " must be finite, found ", static_cast<float>(value),
                                    " at index (", at, ")"));
}

[[noreturn]] void bias_not_finite(std::string_view who, double value, int64_t i, int64_t j) {
  fail(who, ": bias must not hold NaN or +inf, found ", static_cast<float>(value), " at (", i, ", ", j, ")");
}

}  // namespace

double finite_max_abs(ConstView t, std::string_view what, std::string_view who) {
  if (t.numel() == 0) return 0;
  const int r = t.rank();
  const int64_t d0 = r == 4 ? t.dim(0) : 1, d1 = r == 4 ? t.dim(1) : 1;
  const int64_t rows = t.dim(r - 2), cols = t.dim(r - 1);
  const int64_t s0 = r == 4 ? t.stride(0) : 0, s1 = r == 4 ? t.stride(1) : 0;
  const int64_t sr = t.stride(r - 2);
  const int64_t total = d0 * d1;
  constexpr int64_t kBlock = 32;
  int64_t first_bad = total * rows;
  float mx = 0.f;
  // Tasks are (matrix, block of rows): a single head of a long sequence is split over the team
  // too. min and max are exact whatever the order, so the result does not depend on the split.
  constexpr int64_t kChunk = 4096;  // rows per task
  const int64_t chunks = (rows + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) reduction(min : first_bad) reduction(max : mx) if (total * rows * cols > 65536)
  for (int64_t w = 0; w < total * chunks; ++w) {
    const int64_t e = w / chunks, c0 = (w % chunks) * kChunk, c1 = std::min(rows, c0 + kChunk);
    const float* base = t.data + (e / d1) * s0 + (e % d1) * s1;
    for (int64_t i0 = c0; i0 < c1; i0 += kBlock) {
      const int64_t n = std::min(kBlock, c1 - i0);
      if (rows_finite(base + i0 * sr, sr, n, cols, mx)) continue;
      int64_t i = i0;
      float ignored = 0.f;
      while (i + 1 < i0 + n && rows_finite(base + i * sr, sr, 1, cols, ignored)) ++i;
      first_bad = std::min(first_bad, e * rows + i);
      break;
    }
  }
  if (first_bad == total * rows) return mx;
  const int64_t a = first_bad / rows / d1, b = first_bad / rows % d1, i = first_bad % rows;
  const float* row = t.data + a * s0 + b * s1 + i * sr;
  for (int64_t j = 0; j < cols; ++j) {
    if (std::isfinite(row[j])) continue;
    if (r == 4) not_finite(who, what, row[j], std::array<int64_t, 4>{a, b, i, j});
    not_finite(who, what, row[j], std::array<int64_t, 2>{i, j});
  }
  return mx;
}

void check_finite(ConstView t, std::string_view what, std::string_view who) { (void)finite_max_abs(t, what, who); }

double max_abs(ConstView t) {
  const int r = t.rank();
  const int64_t d0 = r == 4 ? t.dim(0) : 1, d1 = r == 4 ? t.dim(1) : 1;
  const int64_t rows = t.dim(r - 2), cols = t.dim(r - 1);
  const int64_t s0 = r == 4 ? t.stride(0) : 0, s1 = r == 4 ? t.stride(1) : 0, sr = t.stride(r - 2);
  if (t.numel() == 0) return 0;
  float m = 0.f;
#pragma omp parallel for schedule(static) reduction(max : m) if (d0 * d1 * rows * cols > 65536)
  for (int64_t e = 0; e < d0 * d1; ++e) {
    const float* base = t.data + (e / d1) * s0 + (e % d1) * s1;
    float me = 0.f;
    for (int64_t i = 0; i < rows; ++i) {
      const float* row = base + i * sr;
      for (int64_t j = 0; j < cols; ++j) {
        const float a = std::fabs(row[j]);
        if (a > me && a != INFINITY) me = a;
      }
    }
    m = std::max(m, me);
  }
  return m;
}

namespace {

[[noreturn]] void range_fail(std::string_view who, const std::string& what, double got, double limit) {
  char g[32], l[32];
  std::snprintf(g, sizeof g, "%.3g", got);
  std::snprintf(l, sizeof l, "%.3g", limit);
  throw NumericError(detail::concat(who, ": inputs too large for float arithmetic: ", what, " = ", g, " exceeds ", l,
       " (results would overflow to inf or NaN); rescale the inputs (q, k, v, the bias or dout)"));
}

}  // namespace

void check_softmax_range(const AttentionDims& d, const Magnitudes& m, double scale, std::string_view who) {
  if (d.B * d.H * d.N == 0 || d.M == 0) return;
  const double logit = scale * static_cast<double>(d.Dk) * m.q * m.k + m.bias;
  if (!(logit <= kMaxLogit))
    range_fail(who, "the logit bound scale·Dk·max|q|·max|k| + max|bias|", logit, kMaxLogit);
  const double vsum = static_cast<double>(d.M) * m.v;
  if (!(vsum <= kMaxValueSum)) range_fail(who, "the value-sum bound M·max|v|", vsum, kMaxValueSum);
}

void check_member_range(const AttentionDims& d, const Magnitudes& m, bool norms, std::string_view who) {
  if (d.B * d.H * d.N == 0 || d.M == 0) return;
  const double mx = std::max(m.q, m.k);
  const double sum = static_cast<double>(std::max(d.N, d.M)) * mx;
  if (!(sum <= kMaxValueSum))
    range_fail(who, "the member-sum bound max(N, M)·max(max|q|, max|k|)", sum, kMaxValueSum);
  const double sq = 4 * static_cast<double>(d.Dk) * mx * mx;
  if (norms && !(sq <= kMaxValueSum))
    range_fail(who, "the squared-norm bound 4·Dk·max(max|q|, max|k|)²", sq, kMaxValueSum);
}

void check_results_finite(const AttentionDims& d, const Magnitudes& m, double scale,
                          std::initializer_list<ConstView> results, std::string_view who) {
  for (const ConstView& t : results) {
    try {
      (void)finite_max_abs(t, "a result", who);
    } catch (const NumericError&) {
      char g[32];
      std::snprintf(g, sizeof g, "%.3g", scale * static_cast<double>(d.Dk) * m.q * m.k + m.bias);
      throw NumericError(detail::concat(who, ": inputs too large for float arithmetic: the results overflowed ",
                                        "float at logits up to scale·Dk·max|q|·max|k| + max|bias| = ", g,
                                        "; rescale the inputs (q, k, v, the bias or dout)"));
    }
  }
}

void check_softmax_grad_range(const AttentionDims& d, const Magnitudes& m, double max_dout, double scale,
                              std::string_view who) {
  check_softmax_range(d, m, scale, who);
  if (d.B * d.H * d.N == 0 || d.M == 0) return;
  const double L = static_cast<double>(std::max(d.N, d.M));
  const double dsum = L * max_dout;
  if (!(dsum <= kMaxValueSum))
    range_fail(who, "the gradient-sum bound max(N, M)·max|dout|", dsum, kMaxValueSum);
  const double grad = 2 * L * static_cast<double>(d.Dv) * max_dout * m.v *
                      std::max(1.0, scale * static_cast<double>(d.Dk) * std::max(m.q, m.k));
  if (!(grad <= kMaxValueSum))
    range_fail(who, "the gradient bound 2·max(N, M)·Dv·max|dout|·max|v|·max(1, scale·Dk·max(max|q|, max|k|))",
               grad, kMaxValueSum);
}

void validate_softmax_backward(const AttentionInputs& in, const AttentionDims& d, const Magnitudes& m, double scale,
                               ConstView out, ConstView dout, ConstView dq, ConstView dk, ConstView dv,
                               std::string_view who) {
  check_softmax_grad_range(d, m, validate_backward_max(in, d, out, dout, dq, dk, dv, who), scale, who);
}

void check_linear_range(const AttentionDims& d, const Magnitudes& m, std::string_view who) {
  if (d.B * d.H * d.N == 0 || d.M == 0) return;
  const double bound = static_cast<double>(d.Dk) * static_cast<double>(d.M) * (m.q + 1) * (m.k + 1) * (m.v + 1);
  if (!(bound <= kMaxValueSum))
    range_fail(who, "the bound Dk·M·(max|q| + 1)·(max|k| + 1)·(max|v| + 1) of linear's sums", bound,
               kMaxValueSum);
}

void check_linear_grad_range(const AttentionDims& d, const Magnitudes& m, double max_dout, std::string_view who) {
  check_linear_range(d, m, who);
  if (d.B * d.H * d.N == 0 || d.M == 0) return;
  const double bound = static_cast<double>(d.Dk) * static_cast<double>(d.M) * (m.q + 1) * (m.k + 1) * (m.v + 1) *
                       (max_dout + 1) * static_cast<double>(std::max(d.N, d.M));
  if (!(bound <= kMaxValueSum))
    range_fail(who, "the gradient bound Dk·M·max(N, M)·(max|q| + 1)·(max|k| + 1)·(max|v| + 1)·(max|dout| + 1) of "
               "linear's sums", bound, kMaxValueSum);
}

AttentionDims validate_inputs(const AttentionInputs& in, const Capabilities& caps,
                              std::string_view who) {
  Magnitudes mag;
  return validate_inputs(in, caps, who, mag);
}

namespace {

// validate_inputs' rules on shapes, strides, lengths and masks: everything but the data.
AttentionDims validate_structure(const AttentionInputs& in, const Capabilities& caps, std::string_view who) {
  check_view(in.q, 4, "q (B, H, N, Dk)", who);
  const bool half_cache = in.cache && in.cache->type() != KVCacheType::f32;
  check_view(in.k, 4, "k (B, Hkv, M, Dk)", who, half_cache);
  check_view(in.v, 4, "v (B, Hkv, M, Dv)", who, half_cache);
  AttentionDims d;
  d.B = in.q.dim(0);
  d.H = in.q.dim(1);
  d.N = in.q.dim(2);
  d.Dk = in.q.dim(3);
  d.Hkv = in.k.dim(1);
  d.M = in.k.dim(2);
  d.Dv = in.v.dim(3);
  check(in.k.dim(0) == d.B && in.v.dim(0) == d.B, who, ": q, k and v must have the same batch B: q ",
        in.q.shape, ", k ", in.k.shape, ", v ", in.v.shape);
  check(in.k.dim(3) == d.Dk, who, ": q and k must have the same head dim Dk: q ", in.q.shape,
        ", k ", in.k.shape);
  check(in.v.dim(1) == d.Hkv && in.v.dim(2) == d.M, who,
        ": k and v must have the same (Hkv, M): k ", in.k.shape, ", v ", in.v.shape);
  check(d.Dk >= 1 && d.Dv >= 1, who, ": head dims must be >= 1: q ", in.q.shape, ", v ",
        in.v.shape);
  check(d.H >= 1 && d.Hkv >= 1, who, ": head counts must be >= 1: q ", in.q.shape, ", k ",
        in.k.shape);
  check(d.H % d.Hkv == 0, who, ": H % Hkv must be 0 (grouped-query attention), got H = ", d.H,
        ", Hkv = ", d.Hkv);
  check(caps.gqa || d.H == d.Hkv, who, " does not support grouped-query attention (H = ", d.H,
        ", Hkv = ", d.Hkv, ")");
  check(caps.cross || d.N == d.M, who, " needs as many keys as queries (N = M), got N = ", d.N,
        ", M = ", d.M);
  check(caps.causal || !in.causal, "the causal mask is not supported by ", who);
  check(caps.query_lengths || in.query_lengths.empty(), "query_lengths are not supported by ", who);
  check(caps.key_lengths || in.key_lengths.empty(), "key_lengths are not supported by ", who);
  check(caps.bias || in.bias.empty(), "an additive bias is not supported by ", who);
  check(!caps.stateful || in.state != nullptr, who,
        " is stateful: pass its layer state in AttentionInputs::state (see state_buffers())");
  if (in.cache) {
    const KVCache& c = *in.cache;
    const ConstView ck = c.keys(), cv = c.values();
    check(in.k.data == ck.data && in.k.shape == ck.shape && in.k.strides == ck.strides &&
              in.v.data == cv.data && in.v.shape == cv.shape && in.v.strides == cv.strides,
          who, ": with a cache, k and v must be cache->keys() and cache->values() (cache holds ",
          c.size(), " positions; k is ", in.k.shape, ")");
    check(caps.half_cache || c.type() == KVCacheType::f32, who, " reads the cache's keys as f32 rows; a ",
          kv_cache_type_name(c.type()), " KV cache is read by full, local and causal clustered attention only (use an f32 cache)");
  }
  check_lengths(in.query_lengths, d.B, d.N, "query_lengths", who);
  check_lengths(in.key_lengths, d.B, d.M, "key_lengths", who);
  if (!in.bias.empty()) {
    check_view(in.bias, 2, "bias (N, M)", who);
    check(in.bias.dim(0) == d.N && in.bias.dim(1) == d.M, who, ": bias must be (N, M) = (", d.N,
          ", ", d.M, "), got ", in.bias.shape);
  }
  return d;
}

}  // namespace

AttentionDims validate_inputs(const AttentionInputs& in, const Capabilities& caps, std::string_view who,
                              Magnitudes& mag) {
  const AttentionDims d = validate_structure(in, caps, who);
  if (caps.shared_qk) check_shared_qk(in, who);
  mag = Magnitudes{};
  mag.q = finite_max_abs(in.q, "q", who);
  // A cache's rows were checked on append (which kept their magnitudes); shared-QK callers pass q
  // as k: no second pass.
  if (in.cache) {
    mag.k = in.cache->max_abs_key();
    mag.v = in.cache->max_abs_value();
    // Causal clustered decodes with centroids made of the cached queries.
    mag.q = std::max(mag.q, static_cast<double>(in.cache->max_abs_query()));
  } else {
    const bool k_is_q = in.k.data == in.q.data && in.k.shape == in.q.shape && in.k.strides == in.q.strides;
    mag.k = k_is_q ? mag.q : finite_max_abs(in.k, "k", who);
    mag.v = finite_max_abs(in.v, "v", who);
  }
  // The bias may hold -inf (a mask) but never NaN or +inf; its largest finite |x| is kept.
  if (!in.bias.empty()) {
    float mb = 0.f;
    for (int64_t i = 0; i < d.N; ++i)
      for (int64_t j = 0; j < d.M; ++j) {
        const float x = in.bias.data[i * in.bias.stride(0) + j];
        if (std::isnan(x) || x == INFINITY) bias_not_finite(who, x, i, j);
        if (x != -INFINITY) mb = std::max(mb, std::fabs(x));
      }
    mag.bias = mb;
  }
  return d;
}

namespace {
// The name a variant's own checks give (its spec's name: "full", "improved-clustered").
std::string kind_of(const Attention& att) {
  const std::string name = att.name();
  return name.substr(0, name.find(':'));
}
}  // namespace

AttentionDims validate_forward_inputs(const Attention& att, const AttentionInputs& in) {
  Magnitudes mag;
  const AttentionDims d = validate_inputs(in, att.capabilities(), kind_of(att), mag);
  att.check_magnitudes(d, mag);
  return d;
}

AttentionDims validate_facts(const Attention& att, const InputFacts& in) {
  const std::string who = kind_of(att);
  const Capabilities& caps = att.capabilities();
  check(!caps.shared_qk, who, " is shared-QK attention: whether k is q needs the data, not facts about it");
  check(!caps.stateful, who, " is stateful: its layer state is not among facts about the inputs");
  // Views of the facts' shapes over one element: the structural rules read shapes and strides only.
  static const float none = 0.f;
  auto shaped = [](const TensorFacts& f) {
    if (f.shape.rank == 0) return ConstView{};
    return make_view(&none, f.shape);
  };
  AttentionInputs ai;
  ai.q = shaped(in.q);
  ai.k = shaped(in.k);
  ai.v = shaped(in.v);
  ai.bias = shaped(in.bias);
  ai.query_lengths = in.query_lengths;
  ai.key_lengths = in.key_lengths;
  ai.causal = in.causal;
  const AttentionDims d = validate_structure(ai, caps, who);
  // The data pass's order: q, k, v, then the bias.
  for (auto [f, what] : {std::pair{&in.q, "q"}, {&in.k, "k"}, {&in.v, "v"}})
    if (!f->first_bad.empty()) not_finite(who, what, f->bad_value, f->first_bad);
  if (!in.bias.first_bad.empty()) {
    check(in.bias.first_bad.size() == 2, who, ": a bias fact's index must be (i, j)");
    bias_not_finite(who, in.bias.bad_value, in.bias.first_bad[0], in.bias.first_bad[1]);
  }
  Magnitudes mag{.q = in.q.max_abs, .k = in.k.max_abs, .v = in.v.max_abs,
                 .bias = in.bias.shape.rank ? in.bias.max_abs : 0.0};
  att.check_magnitudes(d, mag);
  return d;
}

void validate_output(ConstView t, const Shape& expected, std::string_view what,
                     std::string_view who) {
  check(t.shape == expected, who, ": ", what, " must have shape ", expected, ", got ",
        t.shape);
  check(t.numel() == 0 || t.stride(t.rank() - 1) == 1, who, ": ", what,
        " must have unit stride in its last dim");
  check(t.numel() == 0 || t.data != nullptr, who, ": ", what, " is missing");
}

void validate_backward(const AttentionInputs& in, const AttentionDims& d, ConstView out,
                       ConstView dout, ConstView dq, ConstView dk, ConstView dv,
                       std::string_view who) {
  (void)validate_backward_max(in, d, out, dout, dq, dk, dv, who);
}

double validate_backward_max(const AttentionInputs& in, const AttentionDims& d, ConstView out, ConstView dout,
                             ConstView dq, ConstView dk, ConstView dv, std::string_view who) {
  check(in.cache == nullptr, who, ": backward through a KVCache is not supported (a cache is for ",
        "decoding, which is inference)");
  validate_output(out, Shape{d.B, d.H, d.N, d.Dv}, "out (the forward's output)", who);
  validate_output(dout, Shape{d.B, d.H, d.N, d.Dv}, "dout", who);
  // NaN/Inf in the upstream gradient would come back as NaN gradients: refused like q, k, v.
  const double mdo = finite_max_abs(dout, "dout", who);
  validate_output(dq, in.q.shape, "dq", who);
  validate_output(dk, in.k.shape, "dk", who);
  validate_output(dv, in.v.shape, "dv", who);
  return mdo;
}

}  // namespace clattn
