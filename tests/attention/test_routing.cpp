// Routing attention: one cluster with a window of everything is full attention; gradients match
// central finite differences in double with the routing fixed; the EMA state of train mode;
// queries no cluster chose still get an output.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attention/full.h"
#include "attention/routing.h"
#include "clattn/attention.h"
#include "common/fd.h"
#include "common/test_util.h"

namespace clattn {
namespace {

using testing::make_problem;
using testing::nmse;
using testing::Problem;
using testing::ProblemData;

TEST(Routing, OneClusterWholeWindowIsFullAttention) {
  for (bool causal : {false, true})
    for (auto [n, m] : {std::pair<int32_t, int32_t>{50, 50}, {1, 1}, {64, 65}, {30, 90}}) {
      Problem p{.B = 2, .H = 2, .Hkv = 1, .N = n, .M = m, .Dk = 16, .Dv = 8, .causal = causal, .qlen = {n, (n + 1) / 2}, .klen = {m, (m + 2) / 3}};
      ProblemData pd = make_problem(p);
      auto att = make_attention("routing:clusters=1,window=" + std::to_string(std::max(n, m)));
      Tensor out(Shape{2, 2, n, 8}), ref(Shape{2, 2, n, 8});
      Context ctx;
      att->forward(pd.inputs(), out.view(), ctx);
      attn_full_ref_fwd(pd.inputs(), 0.f, ref.view(), nullptr);
      EXPECT_LE(nmse(ref.view(), out.view()), 1e-10) << n << " " << m << " causal " << causal;
    }
}

TEST(Routing, UnroutedQueriesGetAnOutput) {
  // 8 clusters of 4 queries cover at most 32 of 100 queries; every query still gets an output.
  Problem p{.B = 1, .H = 1, .Hkv = 1, .N = 100, .M = 100, .Dk = 8, .Dv = 8};
  ProblemData pd = make_problem(p);
  auto att = make_attention("routing:clusters=8,window=4");
  Tensor out(Shape{1, 1, 100, 8});
  Context ctx;
  att->forward(pd.inputs(), out.view(), ctx);
  for (int64_t i = 0; i < 100; ++i) {
    double nn = 0;
    for (int64_t e = 0; e < 8; ++e) nn += std::abs(out.data()[i * 8 + e]);
    EXPECT_GT(nn, 0.0) << i;
  }
}

TEST(Routing, TrainModeUpdatesEmaDeterministically) {
  Problem p{.B = 2, .H = 2, .Hkv = 2, .N = 64, .M = 64, .Dk = 8, .Dv = 8};
  ProblemData pd = make_problem(p);
  Tensor o1(Shape{2, 2, 64, 8}), o2(Shape{2, 2, 64, 8});
  auto a = make_attention("routing:clusters=4,mode=train,seed=5,decay=0.5");
  auto b = make_attention("routing:clusters=4,mode=train,seed=5,decay=0.5");
  Context c1, c2;
  a->forward(pd.inputs(), o1.view(), c1);
  b->forward(pd.inputs(), o2.view(), c2);
  for (int64_t i = 0; i < o1.numel(); ++i) ASSERT_EQ(o1.data()[i], o2.data()[i]);
  // The state moved: a second forward routes differently from a fresh object's first.
  a->forward(pd.inputs(), o1.view(), c1);
  auto fresh = make_attention("routing:clusters=4,mode=train,seed=5,decay=0.5");
  Context c3;
  fresh->forward(pd.inputs(), o2.view(), c3);
  EXPECT_GT(nmse(o2.view(), o1.view()), 0.0);
  // Eval mode keeps no state: two objects with one seed agree call for call.
  auto e1 = make_attention("routing:clusters=4,seed=5"), e2 = make_attention("routing:clusters=4,seed=5");
  Context c4, c5;
  e1->forward(pd.inputs(), o1.view(), c4);
  e2->forward(pd.inputs(), o2.view(), c5);
  EXPECT_EQ(nmse(o1.view(), o2.view()), 0.0);
}

TEST(RoutingGradients, FiniteDifferencesInDouble) {
  for (const Problem& p : {Problem{.B = 1, .H = 2, .Hkv = 2, .N = 12, .M = 10, .Dk = 4, .Dv = 3},
                           Problem{.B = 2, .H = 4, .Hkv = 2, .N = 9, .M = 9, .Dk = 3, .Dv = 4, .causal = true, .qlen = {9, 6}, .klen = {7, 9}}}) {
    testing::check_fd_gradients("routing:clusters=3,window=4", make_problem(p),
                                [](const RefProblem& pr, const Context& ctx, std::vector<double>& o) {
                                  attn_routing_ref(pr, ctx.state<RoutingState>(), o);
                                });
  }
}

TEST(Routing, SpecErrors) {
  EXPECT_THROW(make_attention("routing"), Error);
  EXPECT_THROW(make_attention("routing:clusters=0"), Error);
  EXPECT_THROW(make_attention("routing:clusters=4,mode=fit"), Error);
  EXPECT_NO_THROW(make_attention("routing:clusters=4,window=16,iterations=3,mode=train,decay=0.9,seed=2"));
}

}  // namespace
}  // namespace clattn
