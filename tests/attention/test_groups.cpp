// Attention::query_groups: for every variant with groups, the groups of each (batch, head) against
// the state its forward left (the partition backward holds fixed) and against what a group is —
// clusters around their centroids, routing's members, SMYRF's runs of the projection order,
// Reformer's chunks of the bucket order — with padded queries, causal masks, conditional-full, and
// the refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "attention/clustered/clustered.h"
#include "attention/reformer/reformer.h"
#include "attention/routing/routing.h"
#include "attention/smyrf/smyrf.h"
#include "attention/tile/ref_problem.h"
#include "clattn/attention.h"
#include "common/test_util.h"

namespace clattn {
namespace {

using testing::make_problem;
using testing::Problem;
using testing::ProblemData;

// Two sequences, the second padded (61 of 90 queries and keys), grouped-query heads.
const Problem kPadded{.B = 2, .H = 4, .Hkv = 2, .N = 90, .M = 90, .Dk = 8, .Dv = 4, .qlen = {90, 61}, .klen = {90, 61}};

Problem causal(Problem p) {
  p.causal = true;
  return p;
}

// One training forward of `spec`, kept for query_groups.
class Grouped {
 public:
  Grouped(const std::string& spec, const Problem& p, bool shared_qk = false)
      : pd_(make_problem(p)), att_(make_attention(spec)), out_(Shape{p.B, p.H, p.N, p.Dv}) {
    pd_.shared_qk = shared_qk;
    att_->forward(in(), out_.view(), ctx_);
  }
  AttentionInputs in() { return pd_.inputs(&state_); }
  QueryGroups groups(int64_t b, int64_t h) { return att_->query_groups(in(), ctx_, b, h); }
  template <class T>
  const T& st() const {
    return ctx_.saved<T>();
  }
  const ProblemData& pd() const { return pd_; }
  const AttentionState& state() const { return state_; }
  const Tensor& out() const { return out_; }
  int64_t nv(int64_t b) const { return pd_.qlen.empty() ? pd_.q.dim(2) : pd_.qlen[static_cast<size_t>(b)]; }

 private:
  ProblemData pd_;
  AttentionState state_;
  std::unique_ptr<Attention> att_;
  Context ctx_{Mode::training};
  Tensor out_;
};

const float* qrow(const ProblemData& pd, int64_t b, int64_t h, int64_t i) { return pd.q.view().ptr(b, h, i); }

double dist2(const float* a, const float* c, int64_t D) {
  double s = 0;
  for (int64_t e = 0; e < D; ++e) s += (static_cast<double>(a[e]) - c[e]) * (static_cast<double>(a[e]) - c[e]);
  return s;
}

// Padded queries (and the first `exact` rows) are in no group; the others in one of [0, count).
void expect_valid_ids(const QueryGroups& g, const char* kind, int64_t N, int64_t nv, int64_t count, int64_t exact = 0) {
  EXPECT_EQ(g.kind, kind);
  ASSERT_EQ(static_cast<int64_t>(g.ids.size()), N);
  for (int64_t i = 0; i < N; ++i) {
    const int32_t id = g.ids[static_cast<size_t>(i)];
    if (i >= nv || i < exact) {
      EXPECT_EQ(id, -1) << (i >= nv ? "padded query " : "row attended exactly ") << i;
    } else {
      EXPECT_GE(id, 0) << "query " << i;
      EXPECT_LT(id, count) << "query " << i;
    }
  }
}

TEST(QueryGroups, ClusteredAreTheClustersAroundTheirCentroids) {
  for (const char* spec : {"clustered:clusters=5", "improved-clustered:clusters=5,topk=8"}) {
    SCOPED_TRACE(spec);
    Grouped run(spec, kPadded);
    const ClusteredState& st = run.st<ClusteredState>();
    const int64_t H = kPadded.H, N = kPadded.N, D = kPadded.Dk;
    for (int64_t b = 0; b < kPadded.B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t t = b * H + h, C = st.nclusters[static_cast<size_t>(t)];
        const QueryGroups g = run.groups(b, h);
        expect_valid_ids(g, "cluster", N, run.nv(b), C);
        const int32_t* off = st.offsets.data() + t * (st.cmax + 1);
        const int32_t* order = st.order.data() + t * N;
        for (int32_t c = 0; c < C; ++c) {
          // The members of cluster c are its segment of the sorted order, and its centroid is their mean.
          std::vector<double> mean(static_cast<size_t>(D), 0.0);
          for (int32_t x = off[c]; x < off[c + 1]; ++x) {
            EXPECT_EQ(g.ids[static_cast<size_t>(order[x])], c) << "b=" << b << " h=" << h;
            for (int64_t e = 0; e < D; ++e) mean[static_cast<size_t>(e)] += qrow(run.pd(), b, h, order[x])[e];
          }
          EXPECT_EQ(std::count(g.ids.begin(), g.ids.end(), c), off[c + 1] - off[c]);
          if (off[c + 1] == off[c]) continue;
          for (int64_t e = 0; e < D; ++e)
            EXPECT_NEAR(mean[static_cast<size_t>(e)] / (off[c + 1] - off[c]), st.qc.data()[(t * st.cmax + c) * D + e], 1e-5);
        }
        // Plain clustered gives every member its cluster's output.
        if (std::string(spec).starts_with("clustered"))
          for (int64_t i = 0; i < run.nv(b); ++i)
            for (int64_t j = 0; j < i; ++j)
              if (g.ids[static_cast<size_t>(i)] == g.ids[static_cast<size_t>(j)]) {
                EXPECT_EQ(std::memcmp(run.out().view().ptr(b, h, i), run.out().view().ptr(b, h, j), sizeof(float) * 4), 0);
              }
      }
  }
}

// Causal: clusters belong to a segment of positions and are numbered segment after segment; the
// first block is exact (no group); a member query joins the centroid of its segment nearest to it.
TEST(QueryGroups, CausalClusteredNumbersClustersSegmentBySegment) {
  for (const char* spec : {"clustered:clusters=3,block=8,segment=16", "improved-clustered:clusters=3,topk=4,block=8,segment=16"}) {
    SCOPED_TRACE(spec);
    Grouped run(spec, causal(kPadded));
    const CausalClusters& cz = run.st<ClusteredState>().cz;
    const int64_t H = kPadded.H, N = kPadded.N, D = kPadded.Dk, C = 3;
    ASSERT_EQ(cz.cmax, C);
    ASSERT_EQ(cz.exact_before, 8);
    for (int64_t b = 0; b < kPadded.B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t t = b * H + h, ns = cz.ns;
        const QueryGroups g = run.groups(b, h);
        expect_valid_ids(g, "cluster", N, run.nv(b), ns * C, cz.exact_before);
        for (int64_t i = cz.exact_before; i < run.nv(b); ++i) {
          const int32_t id = g.ids[static_cast<size_t>(i)];
          ASSERT_GE(id, 0) << "row " << i;
          const int64_t sigma = id / C, j = id % C;
          EXPECT_LE(cz.seg_start[static_cast<size_t>(sigma)], i);
          EXPECT_LT(i, cz.seg_start[static_cast<size_t>(sigma + 1)]) << "row " << i << " outside segment " << sigma;
          EXPECT_EQ(j, cz.member[static_cast<size_t>(t * N + i)]);
          const int32_t ncl = cz.ncl[static_cast<size_t>(t * ns + sigma)];
          ASSERT_LT(j, ncl);
          const float* qc = cz.qc.data() + (t * ns + sigma) * C * D;  // (C, D) centroids of segment σ
          double best = std::numeric_limits<double>::infinity();
          for (int32_t c = 0; c < ncl; ++c) best = std::min(best, dist2(qrow(run.pd(), b, h, i), qc + c * D, D));
          EXPECT_LE(dist2(qrow(run.pd(), b, h, i), qc + j * D, D), best + 1e-4) << "row " << i << " not at its nearest centroid";
        }
      }
  }
  // clusters >= segment: every row is exact, so no query is in a group.
  Grouped exact("clustered:clusters=64,block=8,segment=16", causal(kPadded));
  const QueryGroups g = exact.groups(1, 2);
  EXPECT_EQ(g.kind, "cluster");
  EXPECT_EQ(g.ids, std::vector<int32_t>(90, -1));
}

// Non-causal: every valid query is a member of its cluster and of none before it. Causal: its
// bucket is the nearest (cosine) of the layer's EMA centroids.
TEST(QueryGroups, RoutingMembersAndCausalNearestCentroids) {
  const int64_t H = kPadded.H, N = kPadded.N, D = kPadded.Dk, C = 4;
  {
    Grouped run("routing:clusters=4,window=12", kPadded);
    const RoutingState& st = run.st<RoutingState>();
    for (int64_t b = 0; b < kPadded.B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t t = b * H + h;
        const QueryGroups g = run.groups(b, h);
        expect_valid_ids(g, "cluster", N, run.nv(b), C);
        const int32_t* off = st.mem_off.data() + t * (C + 1);
        const int32_t* mem = st.mem.data() + t * st.cap;
        for (int64_t i = 0; i < run.nv(b); ++i) {
          const int32_t id = g.ids[static_cast<size_t>(i)];
          auto in_cluster = [&](int64_t c) { return std::find(mem + off[c], mem + off[c + 1], i) != mem + off[c + 1]; };
          EXPECT_TRUE(in_cluster(id)) << "query " << i << " is not a member of cluster " << id;
          for (int64_t c = 0; c < id; ++c) EXPECT_FALSE(in_cluster(c)) << "query " << i << " is in an earlier cluster " << c;
        }
      }
  }
  Grouped run("routing:clusters=4,centroids=ema,seed=2", causal(kPadded));
  const Tensor& cent = *run.state().find("centroids");  // (H, C, Dk) unit rows
  const BucketWindow& bw = run.st<RoutingState>().bw;
  for (int64_t b = 0; b < kPadded.B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const QueryGroups g = run.groups(b, h);
      expect_valid_ids(g, "cluster", N, run.nv(b), C);
      for (int64_t i = 0; i < run.nv(b); ++i) {
        const int32_t id = g.ids[static_cast<size_t>(i)];
        EXPECT_EQ(id, bw.qb[static_cast<size_t>((b * H + h) * bw.rounds * N + i)]);
        const float* q = qrow(run.pd(), b, h, i);
        auto cosine = [&](int64_t c) {
          double dot = 0, nn = 0;
          for (int64_t e = 0; e < D; ++e) {
            dot += static_cast<double>(q[e]) * cent.data()[(h * C + c) * D + e];
            nn += static_cast<double>(q[e]) * q[e];
          }
          return dot / std::sqrt(nn);
        };
        for (int64_t c = 0; c < C; ++c) EXPECT_GE(cosine(id) + 1e-5, cosine(c)) << "query " << i;
      }
    }
}

// Non-causal: round 0's sorted queries cut into balanced runs, so the projections of a cluster all
// lie below those of the next. Causal: round 0's bucket of each query.
TEST(QueryGroups, SmyrfRunsOfTheProjectionOrderAndCausalBuckets) {
  const int64_t H = kPadded.H, N = kPadded.N;
  {
    Grouped run("smyrf:hashes=2,q_cluster=8,k_cluster=8,seed=3", kPadded);
    SmyrfParams sp;
    sp.hashes = 2;
    sp.q_cluster = sp.k_cluster = 8;
    sp.seed = 3;
    const RefProblem pr = RefProblem::from(run.in(), 0.f);
    std::vector<double> qp, kp;
    for (int64_t b = 0; b < kPadded.B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t nv = run.nv(b), nc = (nv + 7) / 8;  // as many keys as queries
        const QueryGroups g = run.groups(b, h);
        expect_valid_ids(g, "cluster", N, nv, nc);
        smyrf_projections_ref(pr, sp, 0, b, h, 0, qp, kp);
        std::vector<double> lo(static_cast<size_t>(nc), INFINITY), hi(static_cast<size_t>(nc), -INFINITY);
        std::vector<int64_t> size(static_cast<size_t>(nc), 0);
        for (int64_t i = 0; i < nv; ++i) {
          const size_t c = static_cast<size_t>(g.ids[static_cast<size_t>(i)]);
          lo[c] = std::min(lo[c], qp[static_cast<size_t>(i)]);
          hi[c] = std::max(hi[c], qp[static_cast<size_t>(i)]);
          ++size[c];
        }
        EXPECT_LE(*std::max_element(size.begin(), size.end()) - *std::min_element(size.begin(), size.end()), 1);
        for (int64_t c = 0; c + 1 < nc; ++c)
          EXPECT_LE(hi[static_cast<size_t>(c)], lo[static_cast<size_t>(c + 1)] + 1e-4) << "b=" << b << " h=" << h << " cluster " << c;
      }
  }
  Grouped run("smyrf:hashes=2,q_cluster=8,k_cluster=8,seed=3", causal(kPadded));
  const BucketWindow& bw = run.st<SmyrfState>().bw;
  for (int64_t b = 0; b < kPadded.B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const QueryGroups g = run.groups(b, h);
      expect_valid_ids(g, "cluster", N, run.nv(b), (run.nv(b) + 7) / 8);
      for (int64_t i = 0; i < run.nv(b); ++i)
        EXPECT_EQ(g.ids[static_cast<size_t>(i)], bw.qb[static_cast<size_t>((b * H + h) * bw.rounds * N + i)]);
    }
}

// Round 0's chunks: positions sorted by (bucket, position) and cut into chunks of `chunk`; with a
// causal mask each bucket is cut into its own chunks, so a chunk holds one bucket.
TEST(QueryGroups, ReformerChunksOfTheBucketOrder) {
  const Problem p{.B = 2, .H = 2, .Hkv = 2, .N = 90, .M = 90, .Dk = 8, .Dv = 4, .qlen = {90, 61}, .klen = {90, 61}};
  ReformerParams rp;
  rp.rounds = 2;
  rp.chunk = 8;
  rp.seed = 1;
  for (bool is_causal : {false, true}) {
    SCOPED_TRACE(is_causal ? "causal" : "not causal");
    Grouped run("reformer:rounds=2,chunk=8,seed=1", is_causal ? causal(p) : p, true);
    const RefProblem pr = RefProblem::from(run.in(), 0.f);
    std::vector<int32_t> bucket;
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t h = 0; h < p.H; ++h) {
        const QueryGroups g = run.groups(b, h);
        expect_valid_ids(g, "chunk", p.N, run.nv(b), std::numeric_limits<int32_t>::max());
        reformer_buckets_ref(pr, rp, 0, b, h, 0, bucket);
        for (int64_t i = 0; i < run.nv(b); ++i)
          for (int64_t j = 0; j < i; ++j) {  // j before i by position
            const int32_t ci = g.ids[static_cast<size_t>(i)], cj = g.ids[static_cast<size_t>(j)];
            const int32_t bi = bucket[static_cast<size_t>(i)], bj = bucket[static_cast<size_t>(j)];
            // (bucket, position) order: j sorts before i unless its bucket is larger.
            EXPECT_TRUE(bj <= bi ? cj <= ci : cj >= ci) << "positions " << j << ", " << i << " out of (bucket, position) order";
            EXPECT_TRUE(!is_causal || ci != cj || bi == bj) << "positions " << j << ", " << i << ": a causal chunk holds one bucket";
          }
        for (int32_t c = 0; c <= *std::max_element(g.ids.begin(), g.ids.end()); ++c)
          EXPECT_LE(std::count(g.ids.begin(), g.ids.end(), c), 8);
      }
  }
}

TEST(QueryGroups, ConditionalFullReportsTheVariantThatRan) {
  Grouped wrapped("conditional-full:length_limit=32,clustered:clusters=5", kPadded);
  Grouped plain("clustered:clusters=5", kPadded);
  for (int64_t b = 0; b < kPadded.B; ++b) EXPECT_EQ(wrapped.groups(b, 1).ids, plain.groups(b, 1).ids);
  Problem shorter = kPadded;
  shorter.N = shorter.M = 20;
  shorter.qlen = shorter.klen = {20, 11};
  Grouped full("conditional-full:length_limit=32,clustered:clusters=5", shorter);
  const QueryGroups g = full.groups(1, 1);
  EXPECT_TRUE(g.ids.empty());
  EXPECT_TRUE(g.kind.empty());
}

TEST(QueryGroups, VariantsWithoutGroupsHaveNone) {
  for (const char* spec : {"full", "local:window=8", "linear", "topk:topk=4"}) {
    Grouped run(spec, kPadded);
    const QueryGroups g = run.groups(1, 3);
    EXPECT_TRUE(g.ids.empty()) << spec;
    EXPECT_TRUE(g.kind.empty()) << spec;
  }
}

TEST(QueryGroups, RefusesWhatItCannotRead) {
  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  for (const char* spec : {"clustered:clusters=4", "routing:clusters=4", "smyrf", "reformer"}) {
    SCOPED_TRACE(spec);
    auto att = make_attention(spec);
    Problem p = kPadded;
    if (att->capabilities().shared_qk) p.Hkv = p.H;
    ProblemData pd = make_problem(p);
    pd.shared_qk = att->capabilities().shared_qk;
    const AttentionInputs in = pd.inputs();
    Tensor out(Shape{p.B, p.H, p.N, p.Dv});
    Context serve = Context::for_inference();
    att->forward(in, out.view(), serve);
    EXPECT_NE(message([&] { att->query_groups(in, serve, 0, 0); }).find("for_inference"), std::string::npos);
    Context other;
    make_attention("full")->forward(in, out.view(), other);
    EXPECT_NE(message([&] { att->query_groups(in, other, 0, 0); }).find("filled by a forward"), std::string::npos);
    Context ctx;
    att->forward(in, out.view(), ctx);
    EXPECT_NO_THROW(att->query_groups(in, ctx, p.B - 1, p.H - 1));
    EXPECT_NE(message([&] { att->query_groups(in, ctx, p.B, 0); }).find("out of range"), std::string::npos);
    EXPECT_NE(message([&] { att->query_groups(in, ctx, 0, -1); }).find("out of range"), std::string::npos);
    AttentionInputs fewer = in;  // the first 80 of the 90 positions
    fewer.q = testing::rows(pd.q, 0, 80);
    fewer.k = pd.shared_qk ? fewer.q : testing::rows(pd.k, 0, 80);
    fewer.v = testing::rows(pd.v, 0, 80);
    fewer.query_lengths = fewer.key_lengths = {};
    EXPECT_NE(message([&] { att->query_groups(fewer, ctx, 0, 0); }).find("other than the forward's"), std::string::npos);
  }
}

}  // namespace
}  // namespace clattn
