// Input validation shared by every variant: the attention contract of docs/design.md checked once, up
// front, with messages that name the rule, the variant and the values seen.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "attention/validate.h"
#include "clattn/attention.h"
#include "clattn/kv_cache.h"
#include "core/simd.h"

namespace clattn {
namespace {

void check_view(ConstView t, int rank, std::string_view what, std::string_view who) {
  check(!t.empty() || t.numel() == 0, who, ": ", what, " is missing");
  check(t.rank() == rank, who, ": ", what, " must have rank ", rank, ", got shape ", t.shape);
  for (int i = 0; i < rank; ++i)
    check(t.dim(i) >= 0, who, ": ", what, " has a negative dim: ", t.shape);
  check(t.numel() == 0 || t.stride(rank - 1) == 1, who, ": ", what,
        " must have unit stride in its last dim, got stride ", t.stride(rank - 1));
}

// NaN/Inf anywhere in a (., ., rows, cols) view is an error: it would poison every row it meets.
// x·0 is 0 for finite x and NaN for ±inf or NaN, so one vector multiply-add per 16 floats finds
// any of them; rows run in parallel. It reads every input once, which must stay small beside
// the attention itself, so it runs at memory speed: four independent accumulators, one
// horizontal test per block of 32 rows, and a row-by-row rescan only of a block that fails.
bool rows_finite(const float* base, int64_t sr, int64_t rows, int64_t cols) {
  simd::vf acc[4] = {};
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = base + i * sr;
    int64_t j = 0;
    for (; j + 4 * simd::kLanes <= cols; j += 4 * simd::kLanes)
      for (int u = 0; u < 4; ++u) acc[u] += simd::load(row + j + u * simd::kLanes) * 0.f;
    for (; j + simd::kLanes <= cols; j += simd::kLanes) acc[0] += simd::load(row + j) * 0.f;
    if (j < cols) acc[1] += simd::load_partial(row + j, static_cast<int>(cols - j)) * 0.f;
  }
  return simd::hsum((acc[0] + acc[1]) + (acc[2] + acc[3])) == 0.f;
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

}  // namespace

void check_finite(ConstView t, std::string_view what, std::string_view who) {
  const int r = t.rank();
  const int64_t d0 = r == 4 ? t.dim(0) : 1, d1 = r == 4 ? t.dim(1) : 1;
  const int64_t rows = t.dim(r - 2), cols = t.dim(r - 1);
  const int64_t s0 = r == 4 ? t.stride(0) : 0, s1 = r == 4 ? t.stride(1) : 0;
  const int64_t sr = t.stride(r - 2);
  const int64_t total = d0 * d1;
  constexpr int64_t kBlock = 32;
  int64_t first_bad = total * rows;
#pragma omp parallel for schedule(static) reduction(min : first_bad) if (total * rows * cols > 65536)
  for (int64_t e = 0; e < total; ++e) {
    const float* base = t.data + (e / d1) * s0 + (e % d1) * s1;
    for (int64_t i0 = 0; i0 < rows; i0 += kBlock) {
      const int64_t n = std::min(kBlock, rows - i0);
      if (rows_finite(base + i0 * sr, sr, n, cols)) continue;
      int64_t i = i0;
      while (i + 1 < i0 + n && rows_finite(base + i * sr, sr, 1, cols)) ++i;
      first_bad = std::min(first_bad, e * rows + i);
      break;
    }
  }
  if (first_bad == total * rows) return;
  const int64_t a = first_bad / rows / d1, b = first_bad / rows % d1, i = first_bad % rows;
  const float* row = t.data + a * s0 + b * s1 + i * sr;
  for (int64_t j = 0; j < cols; ++j)
    check(std::isfinite(row[j]), who, ": ", what, " must be finite, found ", row[j], " at index (",
          r == 4 ? std::to_string(a) + ", " + std::to_string(b) + ", " : std::string(), i, ", ",
          j, ")");
}

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
  fail(who, ": inputs too large for float arithmetic: ", what, " = ", g, " exceeds ", l,
       " (results would overflow to inf or NaN); rescale q, k, v or the bias");
}

}  // namespace

void check_softmax_range(const AttentionInputs& in, const AttentionDims& d, float scale,
                         std::string_view who) {
  if (d.B * d.H * d.N == 0 || d.M == 0) return;
  const double mq = max_abs(in.q), mk = in.k.data == in.q.data ? mq : max_abs(in.k);
  const double mb = in.bias.empty() ? 0.0 : max_abs(in.bias);
  const double logit = static_cast<double>(scale) * static_cast<double>(d.Dk) * mq * mk + mb;
  if (!(logit <= kMaxLogit))
    range_fail(who, "the logit bound scale·Dk·max|q|·max|k| + max|bias|", logit, kMaxLogit);
  const double vsum = static_cast<double>(d.M) * max_abs(in.v);
  if (!(vsum <= kMaxValueSum)) range_fail(who, "the value-sum bound M·max|v|", vsum, kMaxValueSum);
}

void check_linear_range(const AttentionInputs& in, const AttentionDims& d, std::string_view who) {
  if (d.B * d.H * d.N == 0 || d.M == 0) return;
  const double mq = max_abs(in.q), mk = in.k.data == in.q.data ? mq : max_abs(in.k), mv = max_abs(in.v);
  const double bound = static_cast<double>(d.Dk) * static_cast<double>(d.M) * (mq + 1) * (mk + 1) * (mv + 1);
  if (!(bound <= kMaxValueSum))
    range_fail(who, "the bound Dk·M·(max|q| + 1)·(max|k| + 1)·(max|v| + 1) of linear's sums", bound,
               kMaxValueSum);
}

AttentionDims validate_inputs(const AttentionInputs& in, const Capabilities& caps,
                              std::string_view who) {
  check_view(in.q, 4, "q (B, H, N, Dk)", who);
  check_view(in.k, 4, "k (B, Hkv, M, Dk)", who);
  check_view(in.v, 4, "v (B, Hkv, M, Dv)", who);
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
  if (caps.shared_qk) check_shared_qk(in, who);
  check(!caps.stateful || in.state != nullptr, who,
        " is stateful: pass its layer state in AttentionInputs::state (see state_buffers())");
  if (in.cache) {
    const KVCache& c = *in.cache;
    const ConstView ck = c.keys(), cv = c.values();
    check(in.k.data == ck.data && in.k.shape == ck.shape && in.k.strides == ck.strides &&
              in.v.data == cv.data && in.v.shape == cv.shape && in.v.strides == cv.strides,
          who, ": with a cache, k and v must be cache->keys() and cache->values() (cache holds ",
          c.size(), " positions; k is ", in.k.shape, ")");
  }
  check_lengths(in.query_lengths, d.B, d.N, "query_lengths", who);
  check_lengths(in.key_lengths, d.B, d.M, "key_lengths", who);
  if (!in.bias.empty()) {
    check_view(in.bias, 2, "bias (N, M)", who);
    check(in.bias.dim(0) == d.N && in.bias.dim(1) == d.M, who, ": bias must be (N, M) = (", d.N,
          ", ", d.M, "), got ", in.bias.shape);
  }
  check_finite(in.q, "q", who);
  // A cache's rows were checked on append; shared-QK callers pass q as k: no second pass.
  if (!in.cache) {
    if (in.k.data != in.q.data || !(in.k.shape == in.q.shape) || in.k.strides != in.q.strides)
      check_finite(in.k, "k", who);
    check_finite(in.v, "v", who);
  }
  // The bias may hold -inf (a mask) but never NaN or +inf.
  if (!in.bias.empty())
    for (int64_t i = 0; i < d.N; ++i)
      for (int64_t j = 0; j < d.M; ++j) {
        const float x = in.bias.data[i * in.bias.stride(0) + j];
        check(!std::isnan(x) && x != INFINITY, who, ": bias must not hold NaN or +inf, found ", x,
              " at (", i, ", ", j, ")");
      }
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
  check(in.cache == nullptr, who, ": backward through a KVCache is not supported (a cache is for ",
        "decoding, which is inference)");
  validate_output(out, Shape{d.B, d.H, d.N, d.Dv}, "out (the forward's output)", who);
  validate_output(dout, Shape{d.B, d.H, d.N, d.Dv}, "dout", who);
  // NaN/Inf in the upstream gradient would come back as NaN gradients: refused like q, k, v.
  check_finite(dout, "dout", who);
  validate_output(dq, in.q.shape, "dq", who);
  validate_output(dk, in.k.shape, "dk", who);
  validate_output(dv, in.v.shape, "dv", who);
}

}  // namespace clattn
