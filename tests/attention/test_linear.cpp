// Linear attention: equals the direct O(N·M) evaluation of the same kernelised attention (causal
// or not, padded, GQA, N != M), and its gradients match central finite differences in double.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attention/linear/linear.h"
#include "clattn/attention.h"
#include "common/fd.h"
#include "common/test_util.h"

namespace clattn {
namespace {

using testing::make_problem;
using testing::Problem;
using testing::ProblemData;

void check_forward(const Problem& p) {
  SCOPED_TRACE(::testing::Message() << "N=" << p.N << " M=" << p.M << " causal=" << p.causal);
  ProblemData pd = make_problem(p);
  auto att = make_attention("linear");
  Tensor out(Shape{p.B, p.H, p.N, p.Dv});
  Context ctx;
  att->forward(pd.inputs(), out.view(), ctx);
  std::vector<double> ref;
  attn_linear_ref(RefProblem::from(pd.inputs(), 0.f), ref);
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (ref[i] - out.data()[i]) * (ref[i] - out.data()[i]);
    den += ref[i] * ref[i];
  }
  EXPECT_LE(num, 1e-10 * std::max(den, 1e-30));
}

TEST(Linear, EqualsDirectEvaluation) {
  for (bool causal : {false, true}) {
    for (int32_t n : {1, 3, 63, 64, 65, 200})
      check_forward(Problem{.B = 1, .H = 2, .Hkv = 2, .N = n, .M = n, .Dk = 16, .Dv = 16, .causal = causal});
    check_forward(Problem{.B = 2, .H = 4, .Hkv = 2, .N = 130, .M = 70, .Dk = 8, .Dv = 24, .causal = causal, .qlen = {130, 77}, .klen = {70, 33}});
    check_forward(Problem{.B = 1, .H = 4, .Hkv = 1, .N = 70, .M = 300, .Dk = 17, .Dv = 5, .causal = causal});
    check_forward(Problem{.B = 1, .H = 1, .Hkv = 1, .N = 1000, .M = 1000, .Dk = 16, .Dv = 16, .causal = causal});
  }
}

void check_gradients(const Problem& p) {
  testing::check_fd_gradients("linear", make_problem(p),
                              [](const RefProblem& pr, const Context&, std::vector<double>& o) { attn_linear_ref(pr, o); });
}

TEST(LinearGradients, FiniteDifferencesInDouble) {
  for (bool causal : {false, true}) {
    check_gradients(Problem{.B = 1, .H = 2, .Hkv = 2, .N = 7, .M = 7, .Dk = 3, .Dv = 4, .causal = causal});
    check_gradients(Problem{.B = 2, .H = 4, .Hkv = 2, .N = 9, .M = 6, .Dk = 4, .Dv = 3, .causal = causal, .qlen = {9, 4}, .klen = {6, 5}});
    check_gradients(Problem{.B = 1, .H = 1, .Hkv = 1, .N = 70, .M = 150, .Dk = 2, .Dv = 2, .causal = causal});
    check_gradients(Problem{.B = 1, .H = 1, .Hkv = 1, .N = 150, .M = 70, .Dk = 2, .Dv = 2, .causal = causal});
  }
}

// B·H below the thread count: a head splits over the team as a prefix scan over groups of 1024
// queries. Lengths across several groups and key blocks (5000, 9000), causal and not, N != M
// (the causal offset moves where the groups' keys start), padding and GQA.
TEST(Linear, HeadSplitOverThreadsEqualsOneThreadBitForBit) {
  struct Case { int64_t H, Hkv, N, M; bool causal; std::vector<int32_t> qlen, klen; };
  for (const Case& c : {Case{1, 1, 5000, 5000, false, {}, {}}, Case{1, 1, 5000, 5000, true, {}, {}},
                        Case{2, 1, 3000, 9000, true, {2900}, {8000}}, Case{1, 1, 9000, 2000, true, {}, {}},
                        Case{1, 1, 1, 3, false, {}, {}}, Case{1, 1, 65, 63, true, {}, {}}}) {
    SCOPED_TRACE(::testing::Message() << "H=" << c.H << " N=" << c.N << " M=" << c.M << " causal=" << c.causal);
    const Problem p{.B = 1, .H = c.H, .Hkv = c.Hkv, .N = c.N, .M = c.M, .Dk = 16, .Dv = 24,
                    .causal = c.causal, .qlen = c.qlen, .klen = c.klen, .seed = 9};
    testing::expect_same_bits_on_1_2_3_threads("linear", make_problem(p));
  }
}

TEST(Linear, SpecTakesNoParameters) {
  EXPECT_THROW(make_attention("linear:scale=0.5"), Error);
  EXPECT_EQ(make_attention("linear")->name(), "linear");
}

}  // namespace
}  // namespace clattn
