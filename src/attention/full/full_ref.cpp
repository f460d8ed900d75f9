// Reference full attention: the definition, row by row in double. Slow on purpose; the tests hold
// the tiled kernels of full.cpp (and every approximation's limits) against it.
#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

#include "attention/validate.h"
#include "attention/full/full.h"

namespace clattn {
namespace {

struct RowCtx {
  const AttentionInputs& in;
  AttentionDims d;
  double scale;
  int64_t b, h, i;
  int64_t window;
  bool visible(int64_t j) const {
    const int64_t pos = i + (d.M - d.N);  // the query's key position
    if (j >= valid_keys(in, d, b)) return false;
    if (in.causal && j > pos) return false;
    if (window > 0 && in.causal && j <= pos - window) return false;
    if (window > 0 && !in.causal && std::abs(pos - j) > window / 2) return false;
    return !(in.bias.data && std::isinf(in.bias.data[i * in.bias.stride(0) + j]));
  }
  double logit(int64_t j) const {
    const float* q = in.q.ptr(b, h, i);
    const float* k = in.k.ptr(b, h / d.group(), j);
    double s = 0;
    for (int64_t e = 0; e < d.Dk; ++e) s += static_cast<double>(q[e]) * k[e];
    s *= scale;
    if (in.bias.data) s += in.bias.data[i * in.bias.stride(0) + j];
    return s;
  }
  // Softmax row p (M) and its log-sum-exp; returns false when no key is visible.
  bool probs(std::vector<double>& p, double& lse) const {
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < d.M; ++j) {
      p[static_cast<size_t>(j)] = visible(j) ? logit(j) : -std::numeric_limits<double>::infinity();
      mx = std::max(mx, p[static_cast<size_t>(j)]);
    }
    if (std::isinf(mx)) return false;
    double sum = 0;
    for (auto& x : p) sum += (x = std::exp(x - mx));
    for (auto& x : p) x /= sum;
    lse = mx + std::log(sum);
    return true;
  }
};

}  // namespace

void attn_full_ref_fwd(const AttentionInputs& in, float scale, View out, float* lse,
                       int64_t window) {
  const AttentionDims d = validate_inputs(in, Capabilities{true, true, true, true, true, true, true},
                                          "full (reference)");
  const double s = scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(d.Dk));
  std::vector<double> p(static_cast<size_t>(d.M));
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h)
      for (int64_t i = 0; i < d.N; ++i) {
        float* o = out.ptr(b, h, i);
        for (int64_t e = 0; e < d.Dv; ++e) o[e] = 0.f;
        float* l = lse ? lse + (b * d.H + h) * d.N + i : nullptr;
        if (l) *l = 0.f;
        if (i >= valid_queries(in, d, b)) continue;  // padded query: 0
        RowCtx rc{in, d, s, b, h, i, window};
        double row_lse = 0;
        if (!rc.probs(p, row_lse)) {
          if (l) *l = std::numeric_limits<float>::infinity();
          continue;
        }
        if (l) *l = static_cast<float>(row_lse);
        for (int64_t e = 0; e < d.Dv; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < d.M; ++j)
            acc += p[static_cast<size_t>(j)] * in.v.ptr(b, h / d.group(), j)[e];
          o[e] = static_cast<float>(acc);
        }
      }
}

void attn_full_ref_bwd(const AttentionInputs& in, float scale, ConstView dout, View dq, View dk,
                       View dv, int64_t window) {
  const AttentionDims d = validate_inputs(in, Capabilities{true, true, true, true, true, true, true},
                                          "full (reference)");
  const double s = scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(d.Dk));
  std::vector<double> p(static_cast<size_t>(d.M)), dp(static_cast<size_t>(d.M));
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h)
      for (int64_t i = 0; i < valid_queries(in, d, b); ++i) {
        RowCtx rc{in, d, s, b, h, i, window};
        double row_lse;
        if (!rc.probs(p, row_lse)) continue;
        const int64_t hk = h / d.group();
        const float* g = dout.ptr(b, h, i);
        // O_i = Σ_j p_ij v_j  ->  dv_j += p_ij dO_i ;  dp_ij = dO_i · v_j
        double di = 0;
        for (int64_t j = 0; j < d.M; ++j) {
          const float* v = in.v.ptr(b, hk, j);
          double x = 0;
          for (int64_t e = 0; e < d.Dv; ++e) x += static_cast<double>(g[e]) * v[e];
          dp[static_cast<size_t>(j)] = x;
          di += p[static_cast<size_t>(j)] * x;
          float* gv = dv.ptr(b, hk, j);
          for (int64_t e = 0; e < d.Dv; ++e)
            gv[e] += static_cast<float>(p[static_cast<size_t>(j)] * g[e]);
        }
        // p = softmax(s q·k): ds_ij = p_ij (dp_ij - Σ_l p_il dp_il);  dq_i += s Σ_j ds_ij k_j;
        // dk_j += s ds_ij q_i
        const float* q = in.q.ptr(b, h, i);
        float* gq = dq.ptr(b, h, i);
        std::vector<double> acc(static_cast<size_t>(d.Dk), 0.0);
        for (int64_t j = 0; j < d.M; ++j) {
          const double ds = p[static_cast<size_t>(j)] * (dp[static_cast<size_t>(j)] - di) * s;
          if (ds == 0) continue;
          const float* k = in.k.ptr(b, hk, j);
          float* gk = dk.ptr(b, hk, j);
          for (int64_t e = 0; e < d.Dk; ++e) {
            acc[static_cast<size_t>(e)] += ds * k[e];
            gk[e] += static_cast<float>(ds * q[e]);
          }
        }
        for (int64_t e = 0; e < d.Dk; ++e) gq[e] += static_cast<float>(acc[static_cast<size_t>(e)]);
      }
}

}  // namespace clattn
