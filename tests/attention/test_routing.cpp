// Routing attention: one cluster with a window of everything is full attention; gradients match
// central finite differences in double with the routing fixed; the EMA state of train mode;
// queries no cluster chose still get an output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attention/full/full.h"
#include "attention/routing/routing.h"
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
      // Causal routing needs fixed (EMA) centroids; with one cluster every row joins it.
      auto att = make_attention("routing:clusters=1,window=" + std::to_string(std::max(n, m)) +
                                (causal ? ",centroids=ema" : ""));
      Tensor out(Shape{2, 2, n, 8}), ref(Shape{2, 2, n, 8});
      Context ctx;
      AttentionState state;
      att->forward(pd.inputs(&state), out.view(), ctx);
      attn_full_ref_fwd(pd.inputs(), 0.f, ref.view(), nullptr);
      EXPECT_LE(nmse(ref.view(), out.view()), 1e-10) << n << " " << m << " causal " << causal;
    }
}

// The routing is DESIGN's, given the centroids it used: each cluster's key window holds the keys
// of highest cosine with its centroid and its chosen queries those of highest cosine (up to float
// rounding), queries no cluster chose join their nearest centroid, and a query chosen by c
// clusters has weight 1/c in each.
TEST(Routing, WindowsFollowCosines) {
  for (const char* mode : {"kmeans", "ema"}) {
    Problem p{.B = 2, .H = 2, .Hkv = 1, .N = 300, .M = 250, .Dk = 16, .Dv = 8, .qlen = {300, 140}, .klen = {250, 90}};
    ProblemData pd = make_problem(p);
    auto att = make_attention(std::string("routing:clusters=5,window=20,centroids=") + mode);
    Tensor out(Shape{2, 2, 300, 8});
    Context ctx;
    AttentionState state;
    AttentionInputs in = pd.inputs(&state);
    in.train = true;
    att->forward(in, out.view(), ctx);
    const RoutingState& st = ctx.saved<RoutingState>();
    const RefProblem pr = RefProblem::from(pd.inputs(), 0.f);
    const int64_t C = 5;
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < 2; ++h) {
        SCOPED_TRACE(::testing::Message() << mode << " b=" << b << " h=" << h);
        const int64_t t = b * 2 + h, nv = pr.nq(b), mv = pr.nk(b);
        const float* cent = st.centroids.data() + t * C * 16;
        auto cosine = [&](bool query, int64_t i, int64_t k) {
          double dot = 0, nn = 0, cc = 0;
          for (int64_t e = 0; e < 16; ++e) {
            const double x = query ? pr.qe(b, h, i, e) : pr.ke(b, h, i, e);
            dot += x * cent[k * 16 + e];
            nn += x * x;
            cc += static_cast<double>(cent[k * 16 + e]) * cent[k * 16 + e];
          }
          if (std::string(mode) == "eval") {
            EXPECT_NEAR(cc, 1.0, 1e-5) << "centroid " << k;
          }
          return nn > 0 ? dot / std::sqrt(nn) : 0.0;
        };
        // `chosen` (ascending, distinct) are the top of n rows by cosine with centroid k.
        auto expect_top = [&](const int32_t* chosen, int64_t w, int64_t n, bool query, int64_t k) {
          std::vector<char> in(static_cast<size_t>(n), 0);
          double lo = INFINITY, hi = -INFINITY;
          for (int64_t x = 0; x < w; ++x) {
            ASSERT_TRUE(chosen[x] >= 0 && chosen[x] < n);
            if (x > 0) {
              ASSERT_LT(chosen[x - 1], chosen[x]);
            }
            in[static_cast<size_t>(chosen[x])] = 1;
            lo = std::min(lo, cosine(query, chosen[x], k));
          }
          for (int64_t i = 0; i < n; ++i)
            if (!in[static_cast<size_t>(i)]) hi = std::max(hi, cosine(query, i, k));
          EXPECT_GE(lo, hi - 1e-5) << (query ? "queries" : "keys") << " of cluster " << k;
        };
        const int64_t wk = std::min<int64_t>(20, mv), wq = std::min<int64_t>(20, nv);
        std::vector<int> count(static_cast<size_t>(nv), 0);
        const int32_t* moff = st.mem_off.data() + t * (C + 1);
        const int32_t* mem = st.mem.data() + t * st.cap;
        const float* wgt = st.weight.data() + t * st.cap;
        for (int64_t k = 0; k < C; ++k) {
          ASSERT_EQ(st.nkeys[static_cast<size_t>(t * C + k)], wk);
          expect_top(st.keys.data() + (t * C + k) * st.wk, wk, mv, false, k);
          expect_top(mem + moff[k], wq, nv, true, k);
          for (int64_t x = 0; x < wq; ++x) ++count[static_cast<size_t>(mem[moff[k] + x])];
        }
        std::vector<int> fallback(static_cast<size_t>(nv), 0);
        for (int64_t k = 0; k < C; ++k) {
          for (int64_t x = 0; x < wq; ++x)
            EXPECT_FLOAT_EQ(wgt[moff[k] + x], 1.f / static_cast<float>(count[static_cast<size_t>(mem[moff[k] + x])]));
          for (int64_t m = moff[k] + wq; m < moff[k + 1]; ++m) {
            const int32_t i = mem[m];
            EXPECT_EQ(count[static_cast<size_t>(i)], 0) << "fallback " << i << " was chosen";
            ++fallback[static_cast<size_t>(i)];
            EXPECT_EQ(wgt[m], 1.f);
            double best = -INFINITY;
            for (int64_t k2 = 0; k2 < C; ++k2) best = std::max(best, cosine(true, i, k2));
            EXPECT_GE(cosine(true, i, k), best - 1e-5) << "fallback " << i << " is not nearest to " << k;
          }
        }
        for (int64_t i = 0; i < nv; ++i) EXPECT_EQ(count[static_cast<size_t>(i)] > 0 ? 0 : 1, fallback[static_cast<size_t>(i)]) << i;
      }
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

TEST(Routing, TrainingCallsUpdateEmaDeterministically) {
  Problem p{.B = 2, .H = 2, .Hkv = 2, .N = 64, .M = 64, .Dk = 8, .Dv = 8};
  ProblemData pd = make_problem(p);
  Tensor o1(Shape{2, 2, 64, 8}), o2(Shape{2, 2, 64, 8});
  auto a = make_attention("routing:clusters=4,centroids=ema,seed=5,decay=0.5");
  AttentionState s1, s2;
  AttentionInputs in1 = pd.inputs(), in2 = pd.inputs();
  in1.state = &s1;
  in2.state = &s2;
  in1.train = in2.train = true;
  Context c1, c2;
  a->forward(in1, o1.view(), c1);
  a->forward(in2, o2.view(), c2);
  for (int64_t i = 0; i < o1.numel(); ++i) ASSERT_EQ(o1.data()[i], o2.data()[i]);
  // The state moved: a second forward routes differently from the first on a fresh state.
  a->forward(in1, o1.view(), c1);
  AttentionState s3;
  AttentionInputs in3 = pd.inputs();
  in3.state = &s3;
  Context c3;
  a->forward(in3, o2.view(), c3);
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
                           Problem{.B = 2, .H = 4, .Hkv = 2, .N = 9, .M = 9, .Dk = 3, .Dv = 4, .causal = true, .qlen = {9, 6}, .klen = {7, 9}},
                           Problem{.B = 1, .H = 2, .Hkv = 1, .N = 14, .M = 17, .Dk = 3, .Dv = 2, .causal = true}}) {
    // Causal routing needs fixed centroids (centroids=ema; the helper passes a layer state).
    const std::string spec = p.causal ? "routing:clusters=3,window=4,centroids=ema" : "routing:clusters=3,window=4";
    testing::check_fd_gradients(spec, make_problem(p),
                                [](const RefProblem& pr, const Context& ctx, std::vector<double>& o) {
                                  attn_routing_ref(pr, ctx.saved<RoutingState>(), o);
                                });
  }
}

// Causal (routing.cpp, "Causal"): k-means over the sequence is refused; with EMA centroids each
// query and key joins its nearest centroid of the layer state, the window is window= (or
// ceil(M/C)), and training calls still move the centroids.
TEST(Routing, CausalUsesTheNearestEmaCentroids) {
  Problem p{.B = 2, .H = 2, .Hkv = 1, .N = 40, .M = 50, .Dk = 8, .Dv = 4, .causal = true, .qlen = {40, 33}};
  ProblemData pd = make_problem(p);
  Tensor out(Shape{2, 2, 40, 4});
  {
    Context ctx;
    try {
      make_attention("routing:clusters=4")->forward(pd.inputs(), out.view(), ctx);
      ADD_FAILURE() << "k-means routing accepted a causal mask";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("centroids=ema"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(make_attention("routing:clusters=4")->capabilities().causal);
    EXPECT_TRUE(make_attention("routing:clusters=4,centroids=ema")->capabilities().causal);
  }
  auto att = make_attention("routing:clusters=5,centroids=ema,seed=7,decay=0.5");
  AttentionState state;
  AttentionInputs in = pd.inputs(&state);
  Context ctx;
  att->forward(in, out.view(), ctx);
  const RoutingState& st = ctx.saved<RoutingState>();
  ASSERT_TRUE(st.causal);
  EXPECT_EQ(st.bw.window, 10);  // ceil(50 / 5)
  const Tensor& cent = *state.find("centroids");  // (H, C, Dk)
  auto nearest = [&](const float* x, int64_t h) {
    int64_t best = 0;
    double bv = -1e300;
    for (int64_t c = 0; c < 5; ++c) {
      double s2 = 0;
      for (int64_t e = 0; e < 8; ++e) s2 += static_cast<double>(x[e]) * cent.data()[(h * 5 + c) * 8 + e];
      if (s2 > bv + 1e-6) bv = s2, best = c;
    }
    return best;
  };
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t i = 0; i < p.qlen[static_cast<size_t>(b)]; ++i)
        EXPECT_EQ(st.bw.qb[static_cast<size_t>((b * 2 + h) * 40 + i)], nearest(pd.q.view().ptr(b, h, i), h));
      for (int64_t j = 0; j < 50; ++j) EXPECT_EQ(st.bw.kb[static_cast<size_t>((b * 2 + h) * 50 + j)], nearest(pd.k.view().ptr(b, 0, j), h));
    }
  // An evaluation call leaves the state alone; a training call moves it.
  const Tensor before = Tensor::from(cent.view());
  att->forward(in, out.view(), ctx);
  EXPECT_EQ(nmse(before.view(), state.find("centroids")->view()), 0.0);
  in.train = true;
  att->forward(in, out.view(), ctx);
  EXPECT_GT(nmse(before.view(), state.find("centroids")->view()), 0.0);
}

// B·H below the thread count: a head's clusters split over the team, members' outputs and
// gradients and window keys' gradients added into their rows in the unsplit order afterwards.
// Windows overlap (a key in several windows, a query in several clusters), padding, GQA, N != M.
TEST(Routing, HeadSplitOverThreadsEqualsOneThreadBitForBit) {
  struct Case { int64_t H, Hkv, N, M; std::vector<int32_t> qlen, klen; const char* spec; };
  for (const Case& c : {Case{1, 1, 2000, 2000, {}, {}, "routing:clusters=8"},
                        Case{2, 1, 700, 1500, {650}, {1400}, "routing:clusters=5,window=300"},
                        Case{1, 1, 1, 3, {}, {}, "routing:clusters=2"},
                        Case{1, 1, 65, 63, {}, {40}, "routing:clusters=4,window=20"}}) {
    SCOPED_TRACE(::testing::Message() << c.spec << " H=" << c.H << " N=" << c.N << " M=" << c.M);
    const Problem p{.B = 1, .H = c.H, .Hkv = c.Hkv, .N = c.N, .M = c.M, .Dk = 16, .Dv = 24,
                    .qlen = c.qlen, .klen = c.klen, .seed = 4};
    testing::expect_same_bits_on_1_2_3_threads(c.spec, make_problem(p));
  }
}

// Repeated query and key rows tie their cosines exactly, in every thread's range of a split
// head: the merged top windows must keep the serial pass's tie rule (the lower row wins).
TEST(Routing, HeadSplitKeepsTiesAcrossThreadRanges) {
  const Problem p{.B = 1, .H = 1, .Hkv = 1, .N = 1500, .M = 1300, .Dk = 16, .Dv = 8, .seed = 6};
  ProblemData pd = make_problem(p);
  for (int64_t i = 0; i < p.N; ++i)
    std::copy_n(pd.q.data() + (i % 7) * p.Dk, p.Dk, pd.q.data() + i * p.Dk);
  for (int64_t j = 0; j < p.M; ++j)
    std::copy_n(pd.k.data() + (j % 5) * p.Dk, p.Dk, pd.k.data() + j * p.Dk);
  testing::expect_same_bits_on_1_2_3_threads("routing:clusters=6,window=20", pd);
}

TEST(Routing, SpecErrors) {
  EXPECT_THROW(make_attention("routing"), Error);
  EXPECT_THROW(make_attention("routing:clusters=0"), Error);
  EXPECT_THROW(make_attention("routing:clusters=4,centroids=fit"), Error);
  EXPECT_THROW(make_attention("routing:clusters=4,mode=train"), Error);
  EXPECT_NO_THROW(make_attention("routing:clusters=4,window=16,iterations=3,centroids=ema,decay=0.9,seed=2"));
}

}  // namespace
}  // namespace clattn
