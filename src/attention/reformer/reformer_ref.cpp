// Reformer attention's double reference (reformer.h): the buckets of every position straight
// from the rotations, and the output from the saved partition, key by key.
#include <cmath>
#include <vector>

#include "attention/reformer/reformer.h"
#include "attention/reformer/reformer_internal.h"

namespace clattn {

using reformer_parts::chunk_keys;
using reformer_parts::chunk_len;
using reformer_parts::factorise;
using reformer_parts::rotation;

void reformer_buckets_ref(const RefProblem& pr, const ReformerParams& p, uint64_t step, int64_t b,
                          int64_t h, int64_t round, std::vector<int32_t>& bucket) {
  const AttentionDims& d = pr.d;
  const int64_t nb = reformer_buckets(p, d.N);
  const int64_t f1 = factorise(nb).first, f2 = factorise(nb).second;  // lambdas capture them
  const int64_t nrot = f1 / 2 + (f2 > 1 ? f2 / 2 : 0);
  bucket.resize(static_cast<size_t>(d.N));
  for (int64_t i = 0; i < d.N; ++i) {
    double nn = 0;
    for (int64_t e = 0; e < d.Dk; ++e) nn += pr.qe(b, h, i, e) * pr.qe(b, h, i, e);
    const double inv = nn > 0 ? 1 / std::sqrt(nn) : 0;
    auto argmax = [&](int64_t u0, int64_t half) {  // over [x·R, −x·R], first maximum in that order
      int64_t best = 0;
      double bv = -INFINITY;
      for (int64_t u = 0; u < half; ++u) {
        double x = 0;
        for (int64_t e = 0; e < d.Dk; ++e) x += pr.qe(b, h, i, e) * inv * rotation(p, step, d.Dk, nrot, round, e, u0 + u);
        if (x > bv) bv = x, best = u;
        if (-x > bv) bv = -x, best = u + half;
      }
      return best;
    };
    int64_t bk = argmax(0, f1 / 2);
    if (f2 > 1) bk += f1 * argmax(f1 / 2, f2 / 2);
    bucket[static_cast<size_t>(i)] = static_cast<int32_t>(bk);
  }
}

void attn_reformer_ref(const RefProblem& pr, const ReformerState& st, std::vector<double>& out) {
  const AttentionDims& d = pr.d;
  out.assign(static_cast<size_t>(d.B * d.H * d.N * d.Dv), 0.0);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t t = b * d.H + h, nv = pr.nq(b), mv = pr.nk(b);
      auto logit = [&](int64_t i, int64_t j) {
        double nj = 0, s = 0;
        for (int64_t e = 0; e < d.Dk; ++e) nj += pr.qe(b, h, j, e) * pr.qe(b, h, j, e);
        for (int64_t e = 0; e < d.Dk; ++e) s += pr.qe(b, h, i, e) * pr.qe(b, h, j, e);
        return nj > 0 ? s / std::sqrt(nj) : 0.0;
      };
      std::vector<std::vector<int64_t>> seen(static_cast<size_t>(d.N));
      std::vector<int32_t> keys;
      for (int64_t r = 0; r < st.rounds; ++r) {
        const auto [perm, cbucket, nch, len] = st.round(t, r, d.N);
        for (int64_t c = 0; c < nch; ++c) {
          chunk_keys(perm, len, nch, st.chunk, c, cbucket, keys);
          for (int64_t x = c * st.chunk; x < c * st.chunk + chunk_len(perm, len, st.chunk, c); ++x) {
            const int64_t i = perm[x];
            bool any = false;
            for (int32_t j : keys)
              if (j < mv && j != i && (!pr.causal || j <= i)) {
                seen[static_cast<size_t>(i)].push_back(j);
                any = true;
              }
            if (!any && i < mv) seen[static_cast<size_t>(i)].push_back(i);
          }
        }
      }
      for (int64_t i = 0; i < nv; ++i) {
        const auto& ks = seen[static_cast<size_t>(i)];
        std::vector<double> s;
        for (int64_t j : ks) s.push_back(logit(i, j));
        pr.softmax_add(b, h, ks, std::move(s), 1.0, out.data() + (t * d.N + i) * d.Dv);
      }
    }
}

}  // namespace clattn
