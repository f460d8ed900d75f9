// SMYRF: one cluster covering everything is full attention; the forward equals its reference
// with the partition held fixed; gradients match central finite differences in double.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "attention/full/full.h"
#include "attention/smyrf/smyrf.h"
#include "attention/tile/bucket_window.h"
#include "clattn/rng.h"
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

// Causal SMYRF (smyrf.cpp, "Causal"): the buckets follow the definition, recomputed here in
// double — the transform with the maximum norms up to each row's position, the normalised
// projection, and the bucket from the projection's rank among the earlier rows of its side.
TEST(Smyrf, CausalBucketsFollowTheDefinition) {
  for (const Problem& p : {Problem{.B = 2, .H = 2, .Hkv = 1, .N = 70, .M = 90, .Dk = 8, .Dv = 4, .causal = true, .qlen = {70, 41}, .klen = {90, 60}},
                           Problem{.B = 1, .H = 2, .Hkv = 2, .N = 100, .M = 100, .Dk = 16, .Dv = 4, .causal = true}}) {
    ProblemData pd = make_problem(p);
    // Rows of growing norm, so the running maxima change along the sequence.
    for (Tensor* t : {&pd.q, &pd.k})
      for (int64_t r = 0; r < t->numel() / p.Dk; ++r)
        for (int64_t e = 0; e < p.Dk; ++e) t->data()[r * p.Dk + e] *= 0.5f + 0.02f * static_cast<float>(r % 97);
    const SmyrfParams sp{.hashes = 3, .q_cluster = 8, .k_cluster = 5, .seed = 4};
    BucketWindow bw;
    const AttentionInputs in = pd.inputs();
    AttentionDims d{p.B, p.H, p.Hkv, p.N, p.M, p.Dk, p.Dv};
    smyrf_causal_buckets(in, d, sp, 2, bw);
    ASSERT_EQ(bw.window, 5);
    const Rng rng(sp.seed);
    const int64_t off = p.M - p.N, D = p.Dk;
    int mismatches = 0, rows = 0;
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t h = 0; h < p.H; ++h) {
        const int64_t nv = p.qlen.empty() ? p.N : p.qlen[static_cast<size_t>(b)], mv = p.klen.empty() ? p.M : p.klen[static_cast<size_t>(b)];
        const int64_t hk = h / (p.H / p.Hkv), nb = (nv + 7) / 8;
        auto sq = [&](const float* x) { double s2 = 0; for (int64_t e = 0; e < D; ++e) s2 += static_cast<double>(x[e]) * x[e]; return s2; };
        auto r2 = [&](int64_t pos) {
          double mq = 0, mk = 0;
          for (int64_t i = 0; i < nv && i + off <= pos; ++i) mq = std::max(mq, sq(in.q.ptr(b, h, i)));
          for (int64_t j = 0; j < mv && j <= pos; ++j) mk = std::max(mk, sq(in.k.ptr(b, hk, j)));
          return mq + mk;
        };
        for (int64_t r = 0; r < 3; ++r) {
          auto proj = [&](const float* x, int64_t pos, int64_t extra) {
            double dot = 0;
            for (int64_t e = 0; e < D; ++e) dot += rng.normal(2, static_cast<uint64_t>(r * (D + 2) + e)) * x[e];
            const double rr = r2(pos), a = rng.normal(2, static_cast<uint64_t>(r * (D + 2) + extra));
            return rr > 0 ? (dot + a * std::sqrt(std::max(0.0, rr - sq(x)))) / std::sqrt(rr) : 0.0;
          };
          auto buckets = [&](const std::vector<double>& hv) {  // rank among earlier rows, ties to them
            std::vector<int64_t> out;
            for (size_t i = 0; i < hv.size(); ++i) {
              int64_t below = 0;
              for (size_t x = 0; x < i; ++x) below += hv[x] <= hv[i];
              const double u = (static_cast<double>(below) + 0.5) / static_cast<double>(i + 1);
              out.push_back(std::min<int64_t>(nb - 1, static_cast<int64_t>(u * static_cast<double>(nb))));
            }
            return out;
          };
          std::vector<double> hq, hk2;
          for (int64_t i = 0; i < nv; ++i) hq.push_back(proj(in.q.ptr(b, h, i), i + off, D + 1));
          for (int64_t j = 0; j < mv; ++j) hk2.push_back(proj(in.k.ptr(b, hk, j), j, D));
          const std::vector<int64_t> wq = buckets(hq), wk = buckets(hk2);
          const size_t at = static_cast<size_t>((b * p.H + h) * 3 + r);
          for (int64_t i = 0; i < nv; ++i, ++rows) mismatches += bw.qb[at * static_cast<size_t>(p.N) + static_cast<size_t>(i)] != wq[static_cast<size_t>(i)];
          for (int64_t j = 0; j < mv; ++j, ++rows) mismatches += bw.kb[at * static_cast<size_t>(p.M) + static_cast<size_t>(j)] != wk[static_cast<size_t>(j)];
        }
      }
    // Float against double may swap two projections within rounding: allow one in 200.
    EXPECT_LE(mismatches, rows / 200) << mismatches << " of " << rows;
  }
  // The spec's k_cluster is the window; a causal forward keeps the buckets.
  ProblemData pd = make_problem(Problem{.B = 1, .H = 1, .Hkv = 1, .N = 50, .M = 50, .Dk = 4, .Dv = 4, .causal = true});
  auto att = make_attention("smyrf:hashes=2,q_cluster=4,k_cluster=3");
  Tensor out(Shape{1, 1, 50, 4});
  Context ctx;
  att->forward(pd.inputs(), out.view(), ctx);
  EXPECT_TRUE(ctx.saved<SmyrfState>().causal);
  EXPECT_EQ(ctx.saved<SmyrfState>().bw.window, 3);
  EXPECT_EQ(ctx.saved<SmyrfState>().bw.rounds, 2);
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
