#include "attention/ref_problem.h"

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

}  // namespace clattn
