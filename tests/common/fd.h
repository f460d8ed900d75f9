// Gradient checks by central finite differences in double: the variant's fast backward against
// the derivative of its double-precision reference, with the forward's discrete choices (clusters,
// hashes, top-k sets, routing) held fixed through the context.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "attention/tile/ref_problem.h"
#include "clattn/attention.h"
#include "common/test_util.h"

namespace clattn::testing {

// ref(pr, ctx, out): out (B, H, N, Dv) of the reference on pr's (perturbed) values.
using RefFn = std::function<void(const RefProblem&, const Context&, std::vector<double>&)>;

// Relative squared error of the analytic gradient g against finite differences of loss over x.
inline void expect_fd_match(std::vector<double>& x, const Tensor& g, const std::function<double()>& loss,
                            const char* what, double eps = 1e-6) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + eps;
    const double lp = loss();
    x[i] = x0 - eps;
    const double lm = loss();
    x[i] = x0;
    const double f = (lp - lm) / (2 * eps), a = g.data()[i];
    num += (f - a) * (f - a);
    den += f * f;
  }
  EXPECT_LE(num, 1e-8 * std::max(den, 1.0)) << what << " relative error " << std::sqrt(num / std::max(den, 1e-30));
}

// Forward + backward of spec on pd, then dq, dk (unless !check_dk), dv against L = Σ dO ∘ ref.
inline void check_fd_gradients(const std::string& spec, const ProblemData& pd, const RefFn& ref,
                               bool check_dk = true) {
  SCOPED_TRACE(spec + " q " + pd.q.shape().str() + " k " + pd.k.shape().str() +
               (pd.causal ? " causal" : ""));
  auto att = make_attention(spec);
  Tensor out(Shape{pd.q.dim(0), pd.q.dim(1), pd.q.dim(2), pd.v.dim(3)});
  Context ctx;
  AttentionState state;  // a stateful variant's layer state (made from its seed; evaluation calls)
  const AttentionInputs in = pd.inputs(&state);
  att->forward(in, out.view(), ctx);
  Tensor dq(pd.q.shape()), dk(pd.k.shape()), dv(pd.v.shape());
  att->backward(in, out.view(), ctx, pd.dout.view(), dq.view(), dk.view(), dv.view());
  RefProblem pr = RefProblem::from(pd.inputs(), 0.f);
  auto loss = [&]() {
    std::vector<double> o;
    ref(pr, ctx, o);
    double l = 0;
    for (size_t i = 0; i < o.size(); ++i) l += o[i] * pd.dout.data()[i];
    return l;
  };
  expect_fd_match(pr.q, dq, loss, "dq");
  if (check_dk) expect_fd_match(pr.k, dk, loss, "dk");
  expect_fd_match(pr.v, dv, loss, "dv");
}

}  // namespace clattn::testing
