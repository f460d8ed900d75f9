// Clustered and improved-clustered attention: the paper's properties and exact gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "attention/clustered/clustered.h"
#include "attention/clustered/clustered_ref.h"
#include "attention/full/full.h"
#include "clattn/attention.h"
#include "clattn/threads.h"
#include "common/fd.h"
#include "common/test_util.h"

namespace clattn {
namespace {

using testing::make_problem;
using testing::nmse;
using testing::Problem;
using testing::ProblemData;

Tensor run_forward(const std::string& spec, const AttentionInputs& in, Context& ctx) {
  auto att = make_attention(spec);
  Tensor out(Shape{in.q.dim(0), in.q.dim(1), in.q.dim(2), in.v.dim(3)});
  att->forward(in, out.view(), ctx);
  return out;
}

Tensor full_of(const AttentionInputs& in) {
  Tensor out(Shape{in.q.dim(0), in.q.dim(1), in.q.dim(2), in.v.dim(3)});
  attn_full_ref_fwd(in, 0.f, out.view(), nullptr);
  return out;
}

// Queries and keys scattered around a few centres, as in real attention (and the bench).
ProblemData clustered_data(const Problem& p, int centres, float noise) {
  ProblemData pd = make_problem(p);
  Tensor cq = testing::randn(Shape{centres, p.Dk}, p.seed + 100, 1);
  Rng rng(p.seed + 7);
  auto scatter = [&](Tensor& t, uint64_t stream) {
    const int64_t rows = t.numel() / p.Dk;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t c = static_cast<int64_t>(rng.below(static_cast<uint64_t>(centres), stream, static_cast<uint64_t>(r)));
      for (int64_t e = 0; e < p.Dk; ++e)
        t.data()[r * p.Dk + e] = 1.5f * cq.data()[c * p.Dk + e] + noise * t.data()[r * p.Dk + e];
    }
  };
  scatter(pd.q, 1);
  scatter(pd.k, 2);
  return pd;
}

// B·H below the thread count: each head's phases (hashing, k-means, centroid attention, top-k,
// member stage) are split over the team instead of running one head per thread. Every row is
// computed by the same operations in the same order, so outputs and gradients must equal the
// single-thread ones bit for bit: lengths 1, 3, 65, 1000 and 6000 (N·C large enough for k-means
// to split its rounds), padded queries and keys, N != M, 2 and 3 threads.
TEST(Clustered, HeadSplitOverThreadsEqualsOneThreadBitForBit) {
  const int saved = max_threads();
  for (const char* kind : {"clustered:clusters=", "improved-clustered:topk=8,clusters="})
    for (int64_t n : {1, 3, 65, 1000, 6000})
      for (bool padded : {false, true}) {
        Problem pr;
        pr.B = 1;
        pr.H = pr.Hkv = 1;
        pr.N = n;
        pr.M = n + 37;
        pr.Dk = 16;
        pr.Dv = 24;  // not a multiple of 16: the padded V rows path
        pr.seed = 5;
        if (padded) {
          pr.qlen = {static_cast<int32_t>(std::max<int64_t>(1, n - n / 3))};
          pr.klen = {static_cast<int32_t>(pr.M - pr.M / 4)};
        }
        ProblemData pd = clustered_data(pr, 40, 0.3f);
        const std::string spec = kind + std::to_string(std::min<int64_t>(n, 50) > 1 ? 50 : 1);
        SCOPED_TRACE(spec + " N=" + std::to_string(n) + (padded ? " padded" : ""));
        std::vector<Tensor> got;
        for (int threads : {1, 2, 3}) {
          set_threads(threads);
          auto att = make_attention(spec);
          Context ctx;
          Tensor out(Shape{1, 1, pr.N, pr.Dv}), dq(Shape{1, 1, pr.N, pr.Dk}), dk(Shape{1, 1, pr.M, pr.Dk}),
              dv(Shape{1, 1, pr.M, pr.Dv});
          att->forward(pd.inputs(), out.view(), ctx);
          att->backward(pd.inputs(), out.view(), ctx, pd.dout.view(), dq.view(), dk.view(), dv.view());
          got.push_back(std::move(out));
          got.push_back(std::move(dq));
          got.push_back(std::move(dk));
          got.push_back(std::move(dv));
        }
        set_threads(saved);
        for (size_t x = 4; x < got.size(); ++x)
          EXPECT_TRUE(testing::bitwise_equal(got[x], got[x % 4])) << "tensor " << x % 4 << " (o, dq, dk, dv) with "
                                                                  << (x / 4 + 1) << " threads";
      }
}

TEST(Clustered, EnoughClustersGiveFullAttention) {
  for (const char* spec : {"clustered:clusters=1000", "improved-clustered:clusters=65,topk=2"}) {
    for (const Problem& p : {Problem{.B = 2, .H = 2, .Hkv = 1, .N = 65, .M = 100, .Dk = 16, .Dv = 8, .qlen = {65, 30}, .klen = {100, 7}},
                             Problem{.B = 1, .H = 2, .Hkv = 2, .N = 1, .M = 3, .Dk = 4, .Dv = 4}}) {
      ProblemData pd = make_problem(p);
      Context ctx;
      Tensor out = run_forward(spec, pd.inputs(), ctx);
      EXPECT_LE(nmse(full_of(pd.inputs()).view(), out.view()), 1e-10) << spec;
    }
  }
}

TEST(Clustered, TopkCoveringAllKeysGivesFullAttention) {
  Problem p{.B = 2, .H = 2, .Hkv = 2, .N = 200, .M = 63, .Dk = 16, .Dv = 16, .klen = {63, 20}};
  ProblemData pd = make_problem(p);
  Context ctx;
  Tensor out = run_forward("improved-clustered:clusters=3,topk=63", pd.inputs(), ctx);
  EXPECT_LE(nmse(full_of(pd.inputs()).view(), out.view()), 1e-10);
}

// Proposition 2: with V = I the outputs are attention rows, and improved's per-row L1 distance to
// full attention never exceeds clustered's (same seed, hence same clusters).
TEST(Clustered, ImprovedNeverWorseThanClusteredInL1) {
  int rows_checked = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed)
    for (auto [n, m, c, k] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{64, 64, 4, 8},
                              {113, 90, 9, 3}, {200, 40, 20, 1}, {65, 130, 2, 32}}) {
      Problem p{.B = 1, .H = 2, .Hkv = 1, .N = n, .M = m, .Dk = 8, .Dv = m, .seed = seed};
      ProblemData pd = clustered_data(p, 6, 0.7f);
      pd.v = Tensor(Shape{1, 1, m, m});
      for (int64_t j = 0; j < m; ++j) pd.v.data()[j * m + j] = 1.f;
      const std::string opts = ",seed=" + std::to_string(seed);
      Context c1, c2;
      Tensor oc = run_forward("clustered:clusters=" + std::to_string(c) + opts, pd.inputs(), c1);
      Tensor oi = run_forward("improved-clustered:clusters=" + std::to_string(c) + ",topk=" + std::to_string(k) + opts, pd.inputs(), c2);
      ASSERT_EQ(c1.saved<ClusteredState>().order, c2.saved<ClusteredState>().order);
      Tensor of = full_of(pd.inputs());
      for (int64_t r = 0; r < 2 * n; ++r) {
        double lc = 0, li = 0;
        for (int64_t j = 0; j < m; ++j) {
          lc += std::abs(oc.data()[r * m + j] - of.data()[r * m + j]);
          li += std::abs(oi.data()[r * m + j] - of.data()[r * m + j]);
        }
        EXPECT_LE(li, lc + 1e-5) << "seed " << seed << " row " << r;
        ++rows_checked;
      }
    }
  EXPECT_GT(rows_checked, 5000);
}

// On clustered data the approximation improves as clusters are added.
TEST(Clustered, ErrorFallsAsClustersGrow) {
  for (const char* kind : {"clustered", "improved-clustered"}) {
    std::vector<double> err;
    for (int c : {2, 8, 32, 128}) {
      double e = 0;
      for (uint64_t seed = 1; seed <= 3; ++seed) {
        Problem p{.B = 1, .H = 4, .Hkv = 4, .N = 512, .M = 512, .Dk = 32, .Dv = 32, .seed = seed};
        ProblemData pd = clustered_data(p, 16, 0.5f);
        Context ctx;
        const std::string topk = std::string(kind) == "improved-clustered" ? ",topk=8" : "";
        Tensor out = run_forward(std::string(kind) + ":clusters=" + std::to_string(c) + topk, pd.inputs(), ctx);
        e += nmse(full_of(pd.inputs()).view(), out.view());
      }
      err.push_back(e);
    }
    for (size_t i = 1; i < err.size(); ++i) EXPECT_LT(err[i], err[i - 1]) << kind << " C index " << i;
  }
}

TEST(Clustered, SeedsAreReproducible) {
  Problem p{.B = 2, .H = 2, .Hkv = 2, .N = 300, .M = 300, .Dk = 16, .Dv = 16};
  ProblemData pd = clustered_data(p, 8, 1.f);
  Context a, b, c;
  Tensor o1 = run_forward("improved-clustered:clusters=10,seed=3", pd.inputs(), a);
  Tensor o2 = run_forward("improved-clustered:clusters=10,seed=3", pd.inputs(), b);
  Tensor o3 = run_forward("improved-clustered:clusters=10,seed=4", pd.inputs(), c);
  for (int64_t i = 0; i < o1.numel(); ++i) ASSERT_EQ(o1.data()[i], o2.data()[i]);
  EXPECT_NE(a.saved<ClusteredState>().order, c.saved<ClusteredState>().order);
  // Another step draws fresh planes (training sees new hashes each step); the same step repeats.
  auto att = make_attention("clustered:clusters=10,seed=3");
  Context x, y, z;
  Tensor out(Shape{2, 2, 300, 16});
  AttentionInputs in = pd.inputs();
  att->forward(in, out.view(), x);
  in.step = 1;
  att->forward(in, out.view(), y);
  EXPECT_NE(x.saved<ClusteredState>().order, y.saved<ClusteredState>().order);
  att->forward(in, out.view(), z);
  EXPECT_EQ(y.saved<ClusteredState>().order, z.saved<ClusteredState>().order);
}

TEST(Clustered, DegenerateQueriesNeverGiveNaN) {
  // All queries equal but a few: fewer distinct codes than clusters; and all-zero queries.
  Problem p{.B = 1, .H = 1, .Hkv = 1, .N = 100, .M = 50, .Dk = 8, .Dv = 8};
  for (int variant = 0; variant < 2; ++variant) {
    ProblemData pd = make_problem(p);
    for (int64_t i = 0; i < 100; ++i)
      for (int64_t e = 0; e < 8; ++e) pd.q.data()[i * 8 + e] = variant == 0 ? (i % 37 == 0 ? 1.f * e : 0.5f) : 0.f;
    for (const char* spec : {"clustered:clusters=20", "improved-clustered:clusters=20,topk=5"}) {
      Context ctx;
      Tensor out = run_forward(spec, pd.inputs(), ctx);
      EXPECT_TRUE(testing::all_finite(out.view())) << spec;
      EXPECT_LE(nmse(full_of(pd.inputs()).view(), out.view()), 1e-10) << "identical queries are exact";
      auto att = make_attention(spec);
      Tensor dq(pd.q.shape()), dk(pd.k.shape()), dv(pd.v.shape());
      att->forward(pd.inputs(), out.view(), ctx);
      att->backward(pd.inputs(), out.view(), ctx, pd.dout.view(), dq.view(), dk.view(), dv.view());
      EXPECT_TRUE(testing::all_finite(dq.view()) && testing::all_finite(dk.view()) && testing::all_finite(dv.view()));
    }
  }
}

// Causal masks are accepted (the block design, test_causal_clustered.cpp); a bias is refused.
TEST(Clustered, BiasIsRefused) {
  ProblemData pd = make_problem(Problem{.B = 1, .H = 1, .Hkv = 1, .N = 10, .M = 10, .Dk = 4, .Dv = 4, .bias = true});
  for (const char* spec : {"clustered:clusters=2", "improved-clustered:clusters=2"}) {
    Context ctx;
    try {
      run_forward(spec, pd.inputs(), ctx);
      ADD_FAILURE() << "bias accepted by " << spec;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("bias"), std::string::npos) << e.what();
    }
  }
}

TEST(Clustered, SpecErrors) {
  EXPECT_THROW(make_attention("clustered"), Error);  // clusters required
  EXPECT_THROW(make_attention("clustered:clusters=0"), Error);
  EXPECT_THROW(make_attention("clustered:clusters=10,bits=65"), Error);
  EXPECT_THROW(make_attention("clustered:clusters=10,topk=3"), Error);  // topk is improved's
  EXPECT_THROW(make_attention("improved-clustered:clusters=10,topk=0"), Error);
  EXPECT_THROW(make_attention("clustered:clusters=10,clustering=kmeans"), Error);
  EXPECT_NO_THROW(make_attention("improved-clustered:clusters=10,topk=32,bits=32,iterations=3,hash_bias=false,seed=9"));
  EXPECT_NO_THROW(make_attention("conditional-full:length_limit=100,improved-clustered:clusters=10"));
  EXPECT_THROW(make_attention("conditional-full:length_limit=100"), Error);
}

TEST(Clustered, ConditionalFullSwitchesAtTheLimit) {
  for (int64_t n : {50, 51}) {
    ProblemData pd = clustered_data(Problem{.B = 1, .H = 2, .Hkv = 2, .N = n, .M = n, .Dk = 8, .Dv = 8}, 4, 1.f);
    Context c1, c2;
    Tensor a = run_forward("conditional-full:length_limit=50,clustered:clusters=2", pd.inputs(), c1);
    Tensor b = run_forward("clustered:clusters=2", pd.inputs(), c2);
    const double e = nmse(full_of(pd.inputs()).view(), a.view());
    if (n <= 50) {
      EXPECT_LE(e, 1e-10);
    } else {
      EXPECT_EQ(nmse(b.view(), a.view()), 0.0);
    }
  }
}

// Gradients against central finite differences of the double reference, clusters and top-k
// sets held fixed (the centroids still move with the queries).
void check_gradients(const std::string& spec, const Problem& p) {
  testing::check_fd_gradients(spec, clustered_data(p, 3, 0.8f),
                              [](const RefProblem& pr, const Context& ctx, std::vector<double>& o) {
                                attn_clustered_ref(pr, ctx.saved<ClusteredState>(), o);
                              });
}

TEST(ClusteredGradients, FiniteDifferencesInDouble) {
  for (const char* spec : {"clustered:clusters=3", "improved-clustered:clusters=3,topk=4",
                           "improved-clustered:clusters=2,topk=1", "clustered:clusters=4,clustering=positional"}) {
    check_gradients(spec, Problem{.B = 1, .H = 2, .Hkv = 2, .N = 12, .M = 10, .Dk = 4, .Dv = 3});
    check_gradients(spec, Problem{.B = 2, .H = 4, .Hkv = 2, .N = 9, .M = 14, .Dk = 3, .Dv = 5, .qlen = {9, 4}, .klen = {6, 14}});
    check_gradients(spec, Problem{.B = 1, .H = 2, .Hkv = 1, .N = 70, .M = 530, .Dk = 2, .Dv = 2});
  }
}

}  // namespace
}  // namespace clattn
