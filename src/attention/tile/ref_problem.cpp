#include "attention/tile/ref_problem.h"

#include <algorithm>
#include <cmath>

namespace clattn {

RefProblem RefProblem::from(const AttentionInputs& in, float scale) {
  RefProblem pr;
  pr.d = AttentionDims{in.q.dim(0), in.q.dim(1), in.k.dim(1), in.q.dim(2), in.k.dim(2), in.q.dim(3), in.v.dim(3)};
  pr.scale = scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(pr.d.Dk));
  auto take = [](ConstView t) {
    std::vector<double> x;
    x.reserve(static_cast<size_t>(t.numel()));
    for (int64_t a = 0; a < t.dim(0); ++a)
      for (int64_t b = 0; b < t.dim(1); ++b)
        for (int64_t i = 0; i < t.dim(2); ++i)
          for (int64_t e = 0; e < t.dim(3); ++e) x.push_back(t.ptr(a, b, i)[e]);
    return x;
  };
  pr.q = take(in.q);
  pr.k = take(in.k);
  pr.v = take(in.v);
  pr.causal = in.causal;
  pr.qlen.assign(in.query_lengths.begin(), in.query_lengths.end());
  pr.klen.assign(in.key_lengths.begin(), in.key_lengths.end());
  return pr;
}

double RefProblem::logit(int64_t b, int64_t h, int64_t i, int64_t j) const {
  double a = 0;
  for (int64_t e = 0; e < d.Dk; ++e) a += qe(b, h, i, e) * ke(b, h, j, e);
  return a * scale;
}

void RefProblem::softmax_add(int64_t b, int64_t h, const std::vector<int64_t>& keys,
                             std::vector<double> logits, double weight, double* o) const {
  if (keys.empty()) return;
  double mx = -INFINITY, z = 0;
  for (double s : logits) mx = std::max(mx, s);
  for (double& s : logits) z += (s = std::exp(s - mx));
  for (size_t x = 0; x < keys.size(); ++x)
    for (int64_t e = 0; e < d.Dv; ++e) o[e] += weight * logits[x] / z * ve(b, h, keys[x], e);
}

}  // namespace clattn
