// Reformer: one chunk holding everything is full shared-QK attention with the self rule; exact
// gradients (through both roles of q) against finite differences in double; the shared-QK
// contract; bucket counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attention/reformer/reformer.h"
#include "clattn/attention.h"
#include "common/fd.h"
#include "common/test_util.h"

namespace clattn {
namespace {

using testing::make_problem;
using testing::Problem;
using testing::ProblemData;

ProblemData shared(const Problem& p) {
  ProblemData pd = make_problem(p);
  pd.k = Tensor::from(pd.q.view());
  pd.shared_qk = true;
  return pd;
}

// softmax over j != i (j < valid keys, j <= i when causal) of q_i · q_j/|q_j|; self only when
// nothing else is visible.
std::vector<double> shared_qk_attention(const ProblemData& pd, const Problem& p) {
  std::vector<double> out(static_cast<size_t>(p.B * p.H * p.N * p.Dv), 0.0);
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H; ++h)
      for (int64_t i = 0; i < (p.qlen.empty() ? p.N : p.qlen[static_cast<size_t>(b)]); ++i) {
        const int64_t mv = p.klen.empty() ? p.N : p.klen[static_cast<size_t>(b)];
        std::vector<int64_t> keys;
        for (int64_t j = 0; j < mv; ++j)
          if (j != i && (!p.causal || j <= i)) keys.push_back(j);
        if (keys.empty() && i < mv) keys.push_back(i);
        if (keys.empty()) continue;
        std::vector<double> s;
        double mx = -INFINITY, z = 0;
        for (int64_t j : keys) {
          double dot = 0, nn = 0;
          for (int64_t e = 0; e < p.Dk; ++e) {
            dot += static_cast<double>(pd.q.view().ptr(b, h, i)[e]) * pd.q.view().ptr(b, h, j)[e];
            nn += static_cast<double>(pd.q.view().ptr(b, h, j)[e]) * pd.q.view().ptr(b, h, j)[e];
          }
          s.push_back(dot / std::sqrt(nn));
          mx = std::max(mx, s.back());
        }
        for (auto& x : s) z += (x = std::exp(x - mx));
        for (size_t x = 0; x < keys.size(); ++x)
          for (int64_t e = 0; e < p.Dv; ++e)
            out[static_cast<size_t>(((b * p.H + h) * p.N + i) * p.Dv + e)] += s[x] / z * pd.v.view().ptr(b, h, keys[x])[e];
      }
  return out;
}

// Without a causal mask, a sequence no longer than a chunk is one chunk: shared-QK full attention.
// (With one, each bucket is cut into chunks of its own: CausalChunksAreCutPerBucket.)
TEST(Reformer, OneChunkIsSharedQkFullAttention) {
  for (bool causal : {false})
    for (int32_t n : {1, 2, 17, 32}) {
      Problem p{.B = 2, .H = 2, .Hkv = 2, .N = n, .M = n, .Dk = 8, .Dv = 4, .causal = causal, .qlen = {n, (n + 1) / 2}, .klen = {n, (n + 2) / 3}};
      ProblemData pd = shared(p);
      auto att = make_attention("reformer:rounds=2,chunk=32");
      Tensor out(Shape{2, 2, n, 4});
      Context ctx;
      att->forward(pd.inputs(), out.view(), ctx);
      const std::vector<double> ref = shared_qk_attention(pd, p);
      double num = 0, den = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        num += (ref[i] - out.data()[i]) * (ref[i] - out.data()[i]);
        den += ref[i] * ref[i];
      }
      EXPECT_LE(num, 1e-10 * std::max(den, 1e-30)) << n << " causal " << causal;
    }
}

TEST(ReformerGradients, FiniteDifferencesInDouble) {
  for (const Problem& p : {Problem{.B = 1, .H = 2, .Hkv = 2, .N = 12, .M = 12, .Dk = 4, .Dv = 3},
                           Problem{.B = 2, .H = 1, .Hkv = 1, .N = 10, .M = 10, .Dk = 3, .Dv = 2, .causal = true, .qlen = {10, 7}, .klen = {8, 10}}}) {
    ProblemData pd = shared(p);
    {  // k is q: the backward leaves dk unchanged
      auto att = make_attention("reformer:rounds=3,chunk=3");
      Tensor out(Shape{p.B, p.H, p.N, p.Dv}), dq(pd.q.shape()), dk(pd.k.shape()), dv(pd.v.shape());
      Context ctx;
      att->forward(pd.inputs(), out.view(), ctx);
      att->backward(pd.inputs(), out.view(), ctx, pd.dout.view(), dq.view(), dk.view(), dv.view());
      for (int64_t i = 0; i < dk.numel(); ++i) ASSERT_EQ(dk.data()[i], 0.f);
    }
    // The reference reads q for both roles, so dq carries the key-role gradient too.
    testing::check_fd_gradients("reformer:rounds=3,chunk=3", pd,
                                [](const RefProblem& pr, const Context& ctx, std::vector<double>& o) {
                                  attn_reformer_ref(pr, ctx.saved<ReformerState>(), o);
                                },
                                /*check_dk=*/false);
  }
}

// Two rounds of reformer at seed 3 with chunks of `chunk`: the parameters, and a forward's state.
ReformerParams two_rounds(int64_t chunk) {
  ReformerParams rp;
  rp.rounds = 2;
  rp.chunk = chunk;
  rp.seed = 3;
  return rp;
}
const ReformerState& run_two_rounds(const ProblemData& pd, int64_t chunk, Context& ctx) {
  Tensor out(Shape{pd.q.dim(0), pd.q.dim(1), pd.q.dim(2), pd.v.dim(3)});
  make_attention("reformer:rounds=2,seed=3,chunk=" + std::to_string(chunk))->forward(pd.inputs(), out.view(), ctx);
  return ctx.saved<ReformerState>();
}

// The hash follows docs/design.md: per round the argmax over [x·R, −x·R] of the unit query (factorised above
// 128 buckets), and positions are sorted by (bucket, position).
// B·H below the thread count: hashing over row blocks and each round's chunks in spans over
// the team. The forward is bitwise the chain's; the backward adds a span's key-role gradients
// for the chunk before it in a second flush, so it may differ in float summation order only.
TEST(Reformer, HeadSplitOverThreadsMatchesOneThread) {
  struct Case { int64_t N; bool causal; std::vector<int32_t> qlen; const char* spec; };
  for (const Case& c : {Case{3000, false, {}, "reformer:rounds=2,chunk=32"},
                        Case{3000, true, {2900}, "reformer:rounds=2,chunk=32"},
                        Case{700, false, {650}, "reformer:rounds=1,chunk=64"},
                        Case{40, false, {}, "reformer:rounds=1,chunk=32"}, Case{1, false, {}, "reformer"}}) {
    SCOPED_TRACE(::testing::Message() << c.spec << " N=" << c.N << " causal=" << c.causal);
    Problem p{.B = 1, .H = 1, .Hkv = 1, .N = c.N, .M = c.N, .Dk = 16, .Dv = 24, .causal = c.causal,
              .qlen = c.qlen, .klen = c.qlen, .seed = 6};
    ProblemData pd = shared(p);
    const int saved = max_threads();
    std::vector<Tensor> got;
    for (int threads : {1, 2, 3}) {
      set_threads(threads);
      auto att = make_attention(c.spec);
      Context ctx;
      Tensor out(Shape{1, 1, c.N, 24}), dq(pd.q.shape()), dk(pd.q.shape()), dv(pd.v.shape());
      att->forward(pd.inputs(), out.view(), ctx);
      att->backward(pd.inputs(), out.view(), ctx, pd.dout.view(), dq.view(), dk.view(), dv.view());
      for (Tensor* t : {&out, &dq, &dv}) got.push_back(std::move(*t));
    }
    set_threads(saved);
    for (size_t x = 3; x < got.size(); ++x) {
      if (x % 3 == 0) {
        EXPECT_TRUE(testing::bitwise_equal(got[x], got[0])) << "forward differs on " << x / 3 + 1 << " threads";
      } else {
        EXPECT_LE(testing::nmse(got[x % 3].view(), got[x].view()), 1e-10)
            << (x % 3 == 1 ? "dq" : "dv") << " on " << x / 3 + 1 << " threads";
      }
    }
  }
}

TEST(Reformer, PermSortsByReferenceBuckets) {
  for (auto [n, chunk] : {std::pair<int32_t, int64_t>{200, 8}, {1000, 4}, {3, 32}, {65, 16}}) {
    Problem p{.B = 1, .H = 2, .Hkv = 2, .N = n, .M = n, .Dk = 16, .Dv = 4, .qlen = {n}, .klen = {(n + 1) / 2}};
    ProblemData pd = shared(p);
    const ReformerParams rp = two_rounds(chunk);
    Context ctx;
    const ReformerState& st = run_two_rounds(pd, chunk, ctx);
    ASSERT_EQ(st.buckets, reformer_buckets(rp, n));
    const RefProblem pr = RefProblem::from(pd.inputs(), 0.f);
    std::vector<int32_t> bucket;
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t r = 0; r < 2; ++r) {
        reformer_buckets_ref(pr, rp, 0, 0, h, r, bucket);
        const int32_t* perm = st.perm.data() + (h * 2 + r) * st.len;
        std::vector<std::pair<int32_t, int32_t>> want;
        for (int32_t i = 0; i < n; ++i) want.push_back({bucket[static_cast<size_t>(i)], i});
        std::sort(want.begin(), want.end());
        for (int32_t x = 0; x < n; ++x)
          ASSERT_EQ(perm[x], want[static_cast<size_t>(x)].second) << "n=" << n << " h=" << h << " round " << r << " at " << x;
      }
  }
}

// Causal: per round, the positions of each bucket in order (the reference hash), padded with -1 to
// whole chunks, buckets in increasing order; each chunk records its bucket. A query then meets the
// earlier positions of its bucket from the start of the previous chunk of that bucket, which the
// double reference (test_registry_suite) and the causality test check.
TEST(Reformer, CausalChunksAreCutPerBucket) {
  for (auto [n, chunk] : {std::pair<int32_t, int64_t>{200, 8}, {1000, 4}, {3, 32}, {65, 16}}) {
    Problem p{.B = 1, .H = 2, .Hkv = 2, .N = n, .M = n, .Dk = 16, .Dv = 4, .causal = true};
    ProblemData pd = shared(p);
    const ReformerParams rp = two_rounds(chunk);
    Context ctx;
    const ReformerState& st = run_two_rounds(pd, chunk, ctx);
    ASSERT_TRUE(st.causal);
    const RefProblem pr = RefProblem::from(pd.inputs(), 0.f);
    std::vector<int32_t> bucket;
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t r = 0; r < 2; ++r) {
        reformer_buckets_ref(pr, rp, 0, 0, h, r, bucket);
        std::vector<int32_t> want, want_bucket;
        for (int32_t bk = 0; bk < st.buckets; ++bk) {
          const size_t start = want.size();
          for (int32_t i = 0; i < n; ++i)
            if (bucket[static_cast<size_t>(i)] == bk) want.push_back(i);
          if (want.size() == start) continue;
          while (want.size() % static_cast<size_t>(chunk) != 0) want.push_back(-1);
          want_bucket.resize(want.size() / static_cast<size_t>(chunk), bk);
        }
        const size_t at = static_cast<size_t>(h * 2 + r);
        ASSERT_EQ(st.nch[at] * chunk, static_cast<int64_t>(want.size())) << "n=" << n << " h=" << h << " round " << r;
        const std::vector<int32_t> got(st.perm.begin() + static_cast<int64_t>(at) * st.len,
                                       st.perm.begin() + static_cast<int64_t>(at) * st.len + static_cast<int64_t>(want.size()));
        EXPECT_EQ(got, want) << "n=" << n << " h=" << h << " round " << r;
        const int64_t per = st.len / chunk;
        const std::vector<int32_t> gotb(st.cbucket.begin() + static_cast<int64_t>(at) * per,
                                        st.cbucket.begin() + static_cast<int64_t>(at) * per + static_cast<int64_t>(want_bucket.size()));
        EXPECT_EQ(gotb, want_bucket);
      }
  }
}

TEST(Reformer, SharedQkContract) {
  Problem p{.B = 1, .H = 2, .Hkv = 2, .N = 40, .M = 40, .Dk = 8, .Dv = 8};
  ProblemData pd = make_problem(p);  // k independent of q
  auto att = make_attention("reformer");
  Tensor out(Shape{1, 2, 40, 8});
  Context ctx;
  try {
    att->forward(pd.inputs(), out.view(), ctx);
    ADD_FAILURE() << "k != q accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("k identical to q"), std::string::npos) << e.what();
  }
  // The same view for q and k is accepted (without comparing values), and so is a copy.
  AttentionInputs in = pd.inputs();
  in.k = in.q;
  EXPECT_NO_THROW(att->forward(in, out.view(), ctx));
  const Tensor copy = Tensor::from(pd.q.view());
  in.k = copy.view();
  EXPECT_NO_THROW(att->forward(in, out.view(), ctx));
}

TEST(Reformer, BucketsAndSpec) {
  ReformerParams p;
  EXPECT_EQ(reformer_buckets(p, 1000), 64);      // 2·ceil(1000/32)
  const int64_t nb = reformer_buckets(p, 16384);  // 1024 -> factorised 32·32
  EXPECT_EQ(nb, 1024);
  EXPECT_GE(reformer_buckets(p, 20000), 2 * ((20000 + 31) / 32));
  EXPECT_THROW(make_attention("reformer:buckets=7"), Error);
  EXPECT_THROW(make_attention("reformer:buckets=262"), Error);  // 2·131: not even·even
  EXPECT_NO_THROW(make_attention("reformer:buckets=256,rounds=4,chunk=64,seed=1"));
  EXPECT_THROW(make_attention("reformer:chunk=65"), Error);
  EXPECT_THROW(make_attention("reformer:scale=0.5"), Error);
}

}  // namespace
}  // namespace clattn
