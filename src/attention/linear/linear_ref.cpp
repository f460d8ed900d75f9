// Reference linear attention: for every query, the sums over visible keys written out directly.
#include <cmath>

#include "attention/linear/linear.h"

namespace clattn {

void attn_linear_ref(const RefProblem& pr, std::vector<double>& out) {
  const AttentionDims& d = pr.d;
  auto phi = [](double x) { return x > 0 ? x + 1 : std::exp(x); };
  out.assign(static_cast<size_t>(d.B * d.H * d.N * d.Dv), 0.0);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h)
      for (int64_t i = 0; i < pr.nq(b); ++i) {
        std::vector<double> num(static_cast<size_t>(d.Dv), 0.0);
        double den = kLinearEps;
        for (int64_t j = 0; j < pr.nk(b); ++j) {
          if (pr.causal && j > i + d.M - d.N) continue;
          double a = 0;
          for (int64_t e = 0; e < d.Dk; ++e) a += phi(pr.qe(b, h, i, e)) * phi(pr.ke(b, h, j, e));
          den += a;
          for (int64_t e = 0; e < d.Dv; ++e) num[static_cast<size_t>(e)] += a * pr.ve(b, h, j, e);
        }
        double* o = out.data() + ((b * d.H + h) * d.N + i) * d.Dv;
        for (int64_t e = 0; e < d.Dv; ++e) o[e] = num[static_cast<size_t>(e)] / den;
      }
}

}  // namespace clattn
