// SMYRF: one cluster covering everything is full attention; the forward equals its reference
// with the partition held fixed; gradients match central finite differences in double.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "attention/full/full.h"
#include "attention/smyrf/smyrf.h"
#include "clattn/attention.h"
#include "common/fd.h"
#include "common/test_util.h"

namespace clattn {
namespace {

using testing::make_problem;
using testing::nmse;
using testing::Problem;
using testing::ProblemData;

TEST(Smyrf, SingleClusterIsFullAttention) {
  // One round and one cluster of everything: exactly full attention (also causal: the self key is
  // always in the cluster then).
  for (bool causal : {false, true})
    for (auto [n, m] : {std::pair<int32_t, int32_t>{40, 40}, {64, 64}, {1, 1}, {30, 50}}) {
      if (causal && n != m) continue;
      Problem p{.B = 2, .H = 2, .Hkv = 1, .N = n, .M = m, .Dk = 16, .Dv = 8, .causal = causal, .qlen = {n, (n + 1) / 2}, .klen = {m, (m + 2) / 3}};
      ProblemData pd = make_problem(p);
      auto att = make_attention("smyrf:hashes=1,q_cluster=64,k_cluster=64");
      Tensor out(Shape{2, 2, n, 8}), ref(Shape{2, 2, n, 8});
      Context ctx;
      att->forward(pd.inputs(), out.view(), ctx);
      attn_full_ref_fwd(pd.inputs(), 0.f, ref.view(), nullptr);
      EXPECT_LE(nmse(ref.view(), out.view()), 1e-10) << n << " " << m << " causal " << causal;
    }
}

// The partition follows docs/design.md: per round, queries and keys each sorted by their own projection
// (F(q)·a, G(k)·a in double, up to float rounding), every valid one exactly once.
TEST(Smyrf, PartitionFollowsProjections) {
  Problem p{.B = 2, .H = 2, .Hkv = 1, .N = 300, .M = 200, .Dk = 24, .Dv = 8, .qlen = {300, 123}, .klen = {200, 77}};
  ProblemData pd = make_problem(p);
  SmyrfParams sp;
  sp.hashes = 3;
  sp.seed = 11;
  auto att = make_attention("smyrf:hashes=3,q_cluster=16,k_cluster=8,seed=11");
  Tensor out(Shape{2, 2, 300, 8});
  Context ctx;
  for (uint64_t call = 0; call < 2; ++call) {  // step 1 draws fresh directions
    AttentionInputs in = pd.inputs();
    in.step = call;
    att->forward(in, out.view(), ctx);
    const SmyrfState& st = ctx.saved<SmyrfState>();
    const RefProblem pr = RefProblem::from(pd.inputs(), 0.f);
    std::vector<double> qp, kp;
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t r = 0; r < 3; ++r) {
          smyrf_projections_ref(pr, sp, call, b, h, r, qp, kp);
          auto check_sorted = [&](const int32_t* perm, const std::vector<double>& proj, const char* what) {
            const int64_t n = static_cast<int64_t>(proj.size());
            std::vector<int> seen(static_cast<size_t>(n), 0);
            for (int64_t x = 0; x < n; ++x) {
              ASSERT_GE(perm[x], 0);
              ASSERT_LT(perm[x], n) << what;
              ++seen[static_cast<size_t>(perm[x])];
              if (x > 0) {
                EXPECT_LE(proj[static_cast<size_t>(perm[x - 1])], proj[static_cast<size_t>(perm[x])] + 1e-4)
                    << what << " b=" << b << " h=" << h << " round " << r << " at " << x;
              }
            }
            for (int64_t i = 0; i < n; ++i) EXPECT_EQ(seen[static_cast<size_t>(i)], 1) << what << " " << i;
          };
          check_sorted(st.qperm.data() + ((b * 2 + h) * 3 + r) * 300, qp, "queries");
          check_sorted(st.kperm.data() + ((b * 2 + h) * 3 + r) * 200, kp, "keys");
        }
  }
}

TEST(Smyrf, RoundsAreReproducibleAndFresh) {
  ProblemData pd = make_problem(Problem{.B = 1, .H = 2, .Hkv = 2, .N = 300, .M = 300, .Dk = 16, .Dv = 16});
  Tensor o1(Shape{1, 2, 300, 16}), o2(Shape{1, 2, 300, 16});
  Context c1, c2, c3;
  make_attention("smyrf:seed=3")->forward(pd.inputs(), o1.view(), c1);
  auto att = make_attention("smyrf:seed=3");
  att->forward(pd.inputs(), o2.view(), c2);
  for (int64_t i = 0; i < o1.numel(); ++i) ASSERT_EQ(o1.data()[i], o2.data()[i]);
  AttentionInputs in = pd.inputs();
  in.step = 1;
  att->forward(in, o2.view(), c3);  // another step draws new directions
  EXPECT_NE(c2.saved<SmyrfState>().qperm, c3.saved<SmyrfState>().qperm);
}

TEST(Smyrf, MoreRoundsApproximateBetter) {
  // Queries and keys around a few centres: more hashes cover more of each query's mass.
  Problem p{.B = 1, .H = 4, .Hkv = 4, .N = 512, .M = 512, .Dk = 16, .Dv = 16};
  ProblemData pd = make_problem(p);
  for (int64_t i = 0; i < pd.q.numel(); ++i) pd.q.data()[i] *= 2.f;
  Tensor ref(Shape{1, 4, 512, 16});
  attn_full_ref_fwd(pd.inputs(), 0.f, ref.view(), nullptr);
  double prev = 1e9;
  for (int hashes : {1, 4, 16}) {
    Tensor out(Shape{1, 4, 512, 16});
    Context ctx;
    make_attention("smyrf:hashes=" + std::to_string(hashes))->forward(pd.inputs(), out.view(), ctx);
    const double e = nmse(ref.view(), out.view());
    EXPECT_LT(e, prev) << hashes;
    prev = e;
  }
}

TEST(SmyrfGradients, FiniteDifferencesInDouble) {
  for (const Problem& p : {Problem{.B = 1, .H = 2, .Hkv = 2, .N = 10, .M = 10, .Dk = 4, .Dv = 3},
                           Problem{.B = 2, .H = 4, .Hkv = 2, .N = 9, .M = 9, .Dk = 3, .Dv = 4, .causal = true, .qlen = {9, 6}, .klen = {7, 9}},
                           Problem{.B = 1, .H = 2, .Hkv = 1, .N = 12, .M = 20, .Dk = 3, .Dv = 2}}) {
    testing::check_fd_gradients("smyrf:hashes=3,q_cluster=4,k_cluster=5", make_problem(p),
                                [](const RefProblem& pr, const Context& ctx, std::vector<double>& o) {
                                  attn_smyrf_ref(pr, ctx.saved<SmyrfState>(), o);
                                });
  }
}

TEST(Smyrf, SpecErrors) {
  EXPECT_THROW(make_attention("smyrf:hashes=0"), Error);
  EXPECT_THROW(make_attention("smyrf:q_cluster=65"), Error);
  EXPECT_THROW(make_attention("smyrf:clusters=3"), Error);
}

}  // namespace
}  // namespace clattn

namespace clattn {
namespace {

// Different query and key cluster counts never leave a query without keys (the fixed-size cut
// left rows of exact zeros: q_cluster=64, k_cluster=99 on N = M = 99 zeroed 35 of them).
TEST(Smyrf, EveryQuerySeesKeysWhateverTheClusterSizes) {
  for (auto [qc, kc, n, m] : {std::tuple<int, int, int64_t, int64_t>{64, 99, 99, 99}, {32, 33, 99, 99}, {1, 64, 50, 3}, {64, 1, 5, 300}}) {
    SCOPED_TRACE(::testing::Message() << "q_cluster=" << qc << " k_cluster=" << kc << " N=" << n << " M=" << m);
    ProblemData pd = make_problem(Problem{.B = 1, .H = 1, .Hkv = 1, .N = n, .M = m, .Dk = 8, .Dv = 8});
    for (int64_t i = 0; i < pd.v.numel(); ++i) pd.v.data()[i] = 1.f + std::abs(pd.v.data()[i]);  // no output row can be 0 by chance
    auto att = make_attention("smyrf:hashes=1,q_cluster=" + std::to_string(qc) + ",k_cluster=" + std::to_string(kc));
    Tensor out(Shape{1, 1, n, 8});
    Context ctx;
    att->forward(pd.inputs(), out.view(), ctx);
    for (int64_t i = 0; i < n; ++i) EXPECT_NE(out.data()[i * 8], 0.f) << "row " << i;
  }
}

}  // namespace
}  // namespace clattn
