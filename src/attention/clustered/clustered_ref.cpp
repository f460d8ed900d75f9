// Reference clustered / improved-clustered attention: the formulas of docs/design.md evaluated in
// double with the clusters and top-k sets of a forward held fixed. Slow on purpose.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/clustered/clustered.h"
#include "attention/clustered/clustered_ref.h"

namespace clattn {

namespace {

// Causal: the definition in causal_clustered.cpp's header, every part in double, row by row, with
// the definers, clusters and top-k sets of st.cz.
void causal_ref(const RefProblem& pr, const CausalClusters& cz, std::vector<double>& out) {
  const AttentionDims& d = pr.d;
  const int64_t off = d.M - d.N, Lb = cz.block, Ls = cz.segment;
  const bool improved = !cz.topk_idx.empty() && cz.kmax > 0;
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  out.assign(static_cast<size_t>(d.B * d.H * d.N * d.Dv), 0.0);
  // Softmax over keys `keys` of logits s: output (Dv) and log-sum-exp (−inf when empty).
  auto attend = [&](int64_t b, int64_t h, const std::vector<int64_t>& keys, const std::vector<double>& s,
                    std::vector<double>& o) {
    o.assign(static_cast<size_t>(d.Dv), 0.0);
    if (keys.empty()) return kNegInf;
    const double mx = *std::max_element(s.begin(), s.end());
    double z = 0;
    for (size_t x = 0; x < keys.size(); ++x) {
      const double w = std::exp(s[x] - mx);
      z += w;
      for (int64_t e = 0; e < d.Dv; ++e) o[static_cast<size_t>(e)] += w * pr.ve(b, h, keys[x], e);
    }
    for (double& v : o) v /= z;
    return mx + std::log(z);
  };
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t t = b * d.H + h, nv = pr.nq(b), mv = pr.nk(b);
      for (int64_t i = 0; i < nv; ++i) {
        const int64_t pi = i + off;
        if (pi < 0) continue;
        double* o = out.data() + (t * d.N + i) * d.Dv;
        const int64_t beta = pi / Lb;
        const bool exact = pi < cz.exact_before;
        // In-block part (the whole visible prefix for an exact row).
        std::vector<int64_t> keys;
        std::vector<double> s;
        for (int64_t j = exact ? 0 : beta * Lb; j <= std::min(pi, mv - 1); ++j) {
          keys.push_back(j);
          s.push_back(pr.logit(b, h, i, j));
        }
        std::vector<double> oin, opre(static_cast<size_t>(d.Dv), 0.0);
        const double lin = attend(b, h, keys, s, oin);
        double lz = kNegInf;
        const int64_t P = std::min(beta * Lb, mv);
        if (!exact && P > 0) {
          const int64_t sigma = causal_segment_of(cz.seg_start, pi);
          const size_t ts = static_cast<size_t>(t * cz.ns + sigma), tb = static_cast<size_t>(t * cz.nb + beta);
          const int64_t j = cz.member[static_cast<size_t>(t * d.N + i)];
          // Centroid: the mean of its definers; its attention over the prefix.
          const int32_t* dord = cz.def_order.data() + ts * static_cast<size_t>(Ls);
          const int32_t* doff = cz.def_off.data() + ts * static_cast<size_t>(cz.cmax + 1);
          std::vector<double> qc(static_cast<size_t>(d.Dk), 0.0), a(static_cast<size_t>(P));
          for (int64_t x = doff[j]; x < doff[j + 1]; ++x)
            for (int64_t e = 0; e < d.Dk; ++e)
              qc[static_cast<size_t>(e)] += pr.qe(b, h, dord[x], e) / static_cast<double>(doff[j + 1] - doff[j]);
          double mx = kNegInf, z = 0;
          for (int64_t l = 0; l < P; ++l) {
            double sc = 0;
            for (int64_t e = 0; e < d.Dk; ++e) sc += qc[static_cast<size_t>(e)] * pr.ke(b, h, l, e);
            mx = std::max(mx, a[static_cast<size_t>(l)] = sc * pr.scale);
          }
          for (auto& x : a) z += (x = std::exp(x - mx));
          const double lse_c = mx + std::log(z);
          for (auto& x : a) x /= z;
          const int64_t k = improved ? cz.ksel[tb] : 0;
          const int32_t* tk = improved ? cz.topk_idx.data() + (tb * static_cast<size_t>(cz.cmax) + static_cast<size_t>(j)) * static_cast<size_t>(cz.kmax) : nullptr;
          std::vector<char> in_t(static_cast<size_t>(P), 0);
          double m = 0;
          for (int64_t x = 0; x < k; ++x) {
            in_t[static_cast<size_t>(tk[x])] = 1;
            m += a[static_cast<size_t>(tk[x])];
          }
          for (int64_t l = 0; l < P; ++l)
            if (!in_t[static_cast<size_t>(l)])
              for (int64_t e = 0; e < d.Dv; ++e) opre[static_cast<size_t>(e)] += a[static_cast<size_t>(l)] * pr.ve(b, h, l, e);
          lz = lse_c;
          if (improved) {
            std::vector<int64_t> tkeys(tk, tk + k);
            std::vector<double> ts_(static_cast<size_t>(k));
            for (int64_t x = 0; x < k; ++x) ts_[static_cast<size_t>(x)] = pr.logit(b, h, i, tk[x]);
            std::vector<double> ot;
            lz = attend(b, h, tkeys, ts_, ot) - std::log(m);
            for (int64_t e = 0; e < d.Dv; ++e) opre[static_cast<size_t>(e)] += m * ot[static_cast<size_t>(e)];
          }
        }
        const double mx = std::max(lz, lin);
        if (mx == kNegInf) continue;
        const double wp = std::exp(lz - mx), wi = std::exp(lin - mx), z = wp + wi;
        for (int64_t e = 0; e < d.Dv; ++e)
          o[e] = (wp * opre[static_cast<size_t>(e)] + wi * oin[static_cast<size_t>(e)]) / z;
      }
    }
}

}  // namespace

void attn_clustered_ref(const RefProblem& pr, const ClusteredState& st, std::vector<double>& out) {
  if (st.causal) {
    causal_ref(pr, st.cz, out);
    return;
  }
  const AttentionDims& d = pr.d;
  const int64_t G = d.group();
  out.assign(static_cast<size_t>(d.B * d.H * d.N * d.Dv), 0.0);
  auto q = [&](int64_t b, int64_t h, int64_t i, int64_t e) { return pr.q[static_cast<size_t>(((b * d.H + h) * d.N + i) * d.Dk + e)]; };
  auto k = [&](int64_t b, int64_t h, int64_t j, int64_t e) { return pr.k[static_cast<size_t>(((b * d.Hkv + h / G) * d.M + j) * d.Dk + e)]; };
  auto v = [&](int64_t b, int64_t h, int64_t j, int64_t e) { return pr.v[static_cast<size_t>(((b * d.Hkv + h / G) * d.M + j) * d.Dv + e)]; };
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t t = b * d.H + h, ce = st.nclusters[static_cast<size_t>(t)];
      const int64_t mv = pr.klen.empty() ? d.M : pr.klen[static_cast<size_t>(b)];
      const int64_t kk = st.ksel.empty() ? 0 : st.ksel[static_cast<size_t>(t)];
      const int32_t* order = st.order.data() + t * d.N;
      const int32_t* off = st.offsets.data() + t * (st.cmax + 1);
      for (int64_t j = 0; j < ce; ++j) {
        const int64_t n = off[j + 1] - off[j];
        if (n == 0) continue;
        std::vector<double> qc(static_cast<size_t>(d.Dk), 0.0), a(static_cast<size_t>(mv));
        for (int64_t x = off[j]; x < off[j + 1]; ++x)
          for (int64_t e = 0; e < d.Dk; ++e) qc[static_cast<size_t>(e)] += q(b, h, order[x], e) / static_cast<double>(n);
        double mx = -std::numeric_limits<double>::infinity(), z = 0;
        for (int64_t l = 0; l < mv; ++l) {
          double s = 0;
          for (int64_t e = 0; e < d.Dk; ++e) s += qc[static_cast<size_t>(e)] * k(b, h, l, e);
          a[static_cast<size_t>(l)] = s * pr.scale;
          mx = std::max(mx, a[static_cast<size_t>(l)]);
        }
        for (auto& x : a) z += (x = std::exp(x - mx));
        for (auto& x : a) x /= z;
        // R_j = Vc_j − Σ_T A v ; m_j = Σ_T A
        std::vector<double> r(static_cast<size_t>(d.Dv), 0.0);
        std::vector<char> in_t(static_cast<size_t>(mv), 0);
        const int32_t* tk = kk ? st.topk_idx.data() + (t * st.cmax + j) * st.kmax : nullptr;
        double mass = 0;
        for (int64_t x = 0; x < kk; ++x) {
          in_t[static_cast<size_t>(tk[x])] = 1;
          mass += a[static_cast<size_t>(tk[x])];
        }
        for (int64_t l = 0; l < mv; ++l)
          if (!in_t[static_cast<size_t>(l)])
            for (int64_t e = 0; e < d.Dv; ++e) r[static_cast<size_t>(e)] += a[static_cast<size_t>(l)] * v(b, h, l, e);
        for (int64_t x = off[j]; x < off[j + 1]; ++x) {
          const int64_t i = order[x];
          double* o = out.data() + ((b * d.H + h) * d.N + i) * d.Dv;
          for (int64_t e = 0; e < d.Dv; ++e) o[e] = r[static_cast<size_t>(e)];
          if (kk == 0) continue;
          std::vector<double> p(static_cast<size_t>(kk));
          double pm = -std::numeric_limits<double>::infinity(), pz = 0;
          for (int64_t y = 0; y < kk; ++y) {
            double s = 0;
            for (int64_t e = 0; e < d.Dk; ++e) s += q(b, h, i, e) * k(b, h, tk[y], e);
            p[static_cast<size_t>(y)] = s * pr.scale;
            pm = std::max(pm, p[static_cast<size_t>(y)]);
          }
          for (auto& y : p) pz += (y = std::exp(y - pm));
          for (int64_t y = 0; y < kk; ++y)
            for (int64_t e = 0; e < d.Dv; ++e) o[e] += mass * p[static_cast<size_t>(y)] / pz * v(b, h, tk[y], e);
        }
      }
    }
}

void attn_clustered_ref_fwd(const AttentionInputs& in, const ClusteredParams& p,
                            const ClusteredState& st, View out) {
  RefProblem pr = RefProblem::from(in, p.scale);
  std::vector<double> o;
  attn_clustered_ref(pr, st, o);
  const AttentionDims& d = pr.d;
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h)
      for (int64_t i = 0; i < d.N; ++i)
        for (int64_t e = 0; e < d.Dv; ++e)
          out.ptr(b, h, i)[e] = static_cast<float>(o[static_cast<size_t>(((b * d.H + h) * d.N + i) * d.Dv + e)]);
}

}  // namespace clattn
