// Causal clustered and improved-clustered attention (src/attention/clustered/causal_clustered.cpp):
// the exact limits, the double reference, masks, GQA, the prefix-cache offset, decoding, the
// paper's L1 property where it applies, and gradients by finite differences in double.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "attention/clustered/clustered.h"
#include "attention/clustered/clustered_ref.h"
#include "attention/full/full.h"
#include "clattn/attention.h"
#include "clattn/kv_cache.h"
#include "common/fd.h"
#include "core/half.h"
#include "common/test_util.h"

namespace clattn {
namespace {

using testing::make_problem;
using testing::nmse;
using testing::Problem;
using testing::ProblemData;

Tensor run(const std::string& spec, const AttentionInputs& in, Context& ctx) {
  Tensor out(Shape{in.q.dim(0), in.q.dim(1), in.q.dim(2), in.v.dim(3)});
  make_attention(spec)->forward(in, out.view(), ctx);
  return out;
}

Tensor causal_full(const AttentionInputs& in) {
  Tensor out(Shape{in.q.dim(0), in.q.dim(1), in.q.dim(2), in.v.dim(3)});
  attn_full_ref_fwd(in, 0.f, out.view(), nullptr);
  return out;
}

// Appends rows [pos, pos + n) of pd's keys, values and queries to kc and attends those queries
// over the cache: one decode call, its output (B, H, n, Dv).
Tensor decode_rows(const Attention& att, const ProblemData& pd, KVCache& kc, Context& ctx, int64_t pos, int64_t n) {
  kc.append(testing::rows(pd.k, pos, n), testing::rows(pd.v, pos, n), testing::rows(pd.q, pos, n));
  AttentionInputs in;
  in.q = testing::rows(pd.q, pos, n);
  in.k = kc.keys();
  in.v = kc.values();
  in.cache = &kc;
  in.causal = true;
  Tensor o(Shape{pd.q.dim(0), pd.q.dim(1), n, pd.v.dim(3)});
  att.forward(in, o.view(), ctx);
  return o;
}

// Largest |a − b| relative to the largest |b|.
double max_rel(ConstView a, ConstView b) {
  double num = 0, den = 0;
  const Tensor x = Tensor::from(a), y = Tensor::from(b);
  for (int64_t i = 0; i < x.numel(); ++i) {
    num = std::max(num, static_cast<double>(std::abs(x.data()[i] - y.data()[i])));
    den = std::max(den, static_cast<double>(std::abs(y.data()[i])));
  }
  return num / std::max(den, 1e-30);
}

// Queries and keys near a few centres, as in trained models.
ProblemData structured(const Problem& p, int centres = 5) {
  ProblemData pd = make_problem(p);
  Tensor cq = testing::randn(Shape{centres, p.Dk}, p.seed + 50, 1);
  for (Tensor* t : {&pd.q, &pd.k}) {
    const int64_t rows = t->numel() / p.Dk;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t e = 0; e < p.Dk; ++e)
        t->data()[r * p.Dk + e] = 1.5f * cq.data()[(r * 7 % centres) * p.Dk + e] + 0.6f * t->data()[r * p.Dk + e];
  }
  pd.causal = true;
  return pd;
}

// The shapes every check below runs on: lengths, GQA, prefix-cache offsets (M > N), N > M.
std::vector<Problem> shapes() {
  return {Problem{.B = 1, .H = 2, .Hkv = 2, .N = 100, .M = 100, .Dk = 16, .Dv = 8, .causal = true},
          Problem{.B = 2, .H = 4, .Hkv = 2, .N = 90, .M = 130, .Dk = 8, .Dv = 12, .causal = true, .qlen = {90, 37}, .klen = {130, 101}},
          Problem{.B = 1, .H = 3, .Hkv = 1, .N = 130, .M = 70, .Dk = 5, .Dv = 3, .causal = true},
          Problem{.B = 2, .H = 2, .Hkv = 1, .N = 1, .M = 77, .Dk = 16, .Dv = 16, .causal = true, .klen = {77, 40}},
          Problem{.B = 1, .H = 2, .Hkv = 1, .N = 64, .M = 64, .Dk = 16, .Dv = 16, .causal = true, .klen = {31}}};
}

TEST(CausalClustered, AsManyClustersAsSegmentGiveCausalFull) {
  for (const char* spec : {"clustered:clusters=16,block=4,segment=16", "improved-clustered:clusters=16,topk=3,block=8,segment=16",
                           "clustered:clusters=100,block=7,segment=14", "clustered:clusters=9,block=9,segment=9"})
    for (const Problem& p : shapes()) {
      ProblemData pd = structured(p);
      Context ctx;
      Tensor out = run(spec, pd.inputs(), ctx);
      EXPECT_LE(max_rel(out.view(), causal_full(pd.inputs()).view()), 1e-5) << spec << " N=" << p.N << " M=" << p.M;
    }
}

TEST(CausalClustered, TopkCoveringThePrefixGivesCausalFull) {
  for (const Problem& p : shapes()) {
    ProblemData pd = structured(p);
    Context ctx;
    Tensor out = run("improved-clustered:clusters=2,topk=130,block=8,segment=16", pd.inputs(), ctx);
    EXPECT_LE(max_rel(out.view(), causal_full(pd.inputs()).view()), 1e-5) << "N=" << p.N << " M=" << p.M;
    EXPECT_GT(ctx.saved<ClusteredState>().cz.nb, 2);
  }
}

// The fast kernels against the definition in double, clusters held fixed; padded rows and rows
// that see no key are 0; with V = 1 every row that sees a key is 1 (no empty rows, weights sum to 1).
TEST(CausalClustered, MatchesTheDoubleReference) {
  for (const char* spec : {"clustered:clusters=3,block=8,segment=16", "improved-clustered:clusters=3,topk=5,block=8,segment=24",
                           "improved-clustered:clusters=2,topk=1,block=5,segment=5",
                           "improved-clustered:clusters=4,topk=3,block=3,segment=12",
                           "clustered:clusters=4,block=3,segment=9,clustering=positional"})
    for (const Problem& p : shapes()) {
      SCOPED_TRACE(std::string(spec) + " N=" + std::to_string(p.N) + " M=" + std::to_string(p.M));
      ProblemData pd = structured(p);
      Context ctx;
      Tensor out = run(spec, pd.inputs(), ctx);
      Tensor ref(out.shape());
      attn_clustered_ref_fwd(pd.inputs(), ClusteredParams{}, ctx.saved<ClusteredState>(), ref.view());
      EXPECT_LE(nmse(ref.view(), out.view()), 1e-10);
      if (p.N > 1) {  // one query has no previous block among the inputs: exact (decoding)
        EXPECT_GT(nmse(causal_full(pd.inputs()).view(), out.view()), 1e-8) << "the approximation was not exercised";
      }
      pd.v.fill(1.f);
      Context c2;
      Tensor ones = run(spec, pd.inputs(), c2);
      for (int64_t b = 0; b < p.B; ++b)
        for (int64_t h = 0; h < p.H; ++h)
          for (int64_t i = 0; i < p.N; ++i) {
            const int64_t nv = p.qlen.empty() ? p.N : p.qlen[static_cast<size_t>(b)];
            const int64_t mv = p.klen.empty() ? p.M : p.klen[static_cast<size_t>(b)];
            const bool sees = i < nv && i + p.M - p.N >= 0 && mv > 0;
            for (int64_t e = 0; e < p.Dv; ++e)
              ASSERT_NEAR(ones.view().ptr(b, h, i)[e], sees ? 1.f : 0.f, sees ? 1e-5 : 0.0) << "b=" << b << " h=" << h << " i=" << i;
          }
    }
}

// One query against earlier keys, with no cache that keeps queries, has no definer among its
// inputs: it attends its prefix exactly, i.e. it is causal full attention.
TEST(CausalClustered, DecodingStepIsCausalFull) {
  for (int64_t m : {1, 17, 200}) {
    ProblemData pd = structured(Problem{.B = 2, .H = 4, .Hkv = 2, .N = 1, .M = m, .Dk = 16, .Dv = 16, .causal = true});
    for (const char* spec : {"clustered:clusters=3,block=8,segment=16", "improved-clustered:clusters=3,topk=4,block=8,segment=16"}) {
      Context ctx = Context::for_inference();
      Tensor out = run(spec, pd.inputs(), ctx);
      EXPECT_LE(max_rel(out.view(), causal_full(pd.inputs()).view()), 1e-5) << spec << " M=" << m;
    }
  }
}

// Prefill, then the same positions one query at a time against the growing keys without a cache
// that keeps queries: equal to causal full, while the prefill approximates (it has every
// segment's predecessor).
TEST(CausalClustered, PrefillApproximatesAndLoneQueriesAreExact) {
  ProblemData pd = structured(Problem{.B = 1, .H = 2, .Hkv = 2, .N = 80, .M = 80, .Dk = 8, .Dv = 8, .causal = true});
  Context ctx;
  const std::string spec = "improved-clustered:clusters=2,topk=2,block=4,segment=8";
  Tensor pre = run(spec, pd.inputs(), ctx);
  const Tensor full = causal_full(pd.inputs());
  EXPECT_GT(nmse(full.view(), pre.view()), 1e-8);
  for (int64_t pos : {0, 9, 79}) {
    AttentionInputs in = pd.inputs();
    View q = pd.q.view();
    q.data += pos * q.strides[2];
    q.shape.dims[2] = 1;
    in.q = q;
    in.k.shape.dims[2] = pos + 1;
    in.v.shape.dims[2] = pos + 1;
    Context c;
    Tensor one = run(spec, in, c);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t e = 0; e < 8; ++e) EXPECT_NEAR(one.view().ptr(0, h, 0)[e], full.view().ptr(0, h, pos)[e], 1e-5);
  }
}

// Decoding through a KVCache that keeps queries, token by token or in chunks, gives the rows of
// the prefill of the whole sequence (causal_decode.cpp: the same function, computed from the
// cache's derived state), also after truncate() rewinds the cache.
TEST(CausalClustered, DecodingWithQueriesInTheCacheEqualsThePrefill) {
  const Problem p{.B = 2, .H = 4, .Hkv = 2, .N = 100, .M = 100, .Dk = 16, .Dv = 8, .causal = true};
  const ProblemData pd = structured(p);
  for (const char* spec : {"improved-clustered:clusters=3,topk=4,block=4,segment=16", "clustered:clusters=3,block=8,segment=16",
                           "improved-clustered:clusters=2,topk=2,block=5,segment=10",
                           "improved-clustered:clusters=4,topk=3,block=4,segment=8,clustering=positional"}) {
    Context ctx;
    const Tensor pre = run(spec, pd.inputs(), ctx);
    EXPECT_GT(nmse(causal_full(pd.inputs()).view(), pre.view()), 1e-6) << spec << ": the approximation was not exercised";
    auto att = make_attention(spec);
    ASSERT_TRUE(att->capabilities().decode_queries);
    for (int64_t chunk : {1, 7, 33}) {
      SCOPED_TRACE(std::string(spec) + " chunk " + std::to_string(chunk));
      KVCache kc(p.B, p.Hkv, p.M, p.Dk, p.Dv, p.H);
      Context c = Context::for_inference();
      double worst = 0, scale = 0;
      auto step_rows = [&](int64_t pos, int64_t n) {
        const Tensor o = decode_rows(*att, pd, kc, c, pos, n);
        for (int64_t b = 0; b < p.B; ++b)
          for (int64_t h = 0; h < p.H; ++h)
            for (int64_t i = 0; i < n; ++i)
              for (int64_t e = 0; e < p.Dv; ++e) {
                const double want = pre.view().ptr(b, h, pos + i)[e];
                worst = std::max(worst, std::abs(o.view().ptr(b, h, i)[e] - want));
                scale = std::max(scale, std::abs(want));
              }
      };
      for (int64_t pos = 0; pos < p.N; pos += chunk) step_rows(pos, std::min(chunk, p.N - pos));
      kc.truncate(41);  // rewind into an earlier segment: the derived state is rebuilt
      for (int64_t pos = 41; pos < p.N; pos += chunk) step_rows(pos, std::min(chunk, p.N - pos));
      EXPECT_LE(worst, 1e-5 * scale);
    }
  }
}

// Decoding with B·H below the thread count streams the centroids' attention over the prefix on the
// whole team, in the blocks of kCb centroids one thread uses: every step's output equals the
// single-thread one bit for bit. More than 64 clusters (two blocks), one token and 13 at a time,
// GQA, and a rewind into an earlier segment.
TEST(CausalClustered, DecodingSplitOverThreadsEqualsOneThreadBitForBit) {
  for (const Problem& p : {Problem{.B = 1, .H = 1, .Hkv = 1, .N = 700, .M = 700, .Dk = 16, .Dv = 24, .causal = true},
                           Problem{.B = 1, .H = 2, .Hkv = 1, .N = 500, .M = 500, .Dk = 8, .Dv = 8, .causal = true, .seed = 2}})
    for (const char* spec : {"improved-clustered:clusters=80,topk=5,block=32,segment=128", "clustered:clusters=70,block=16,segment=128"})
      for (int64_t chunk : {1, 13}) {
        SCOPED_TRACE(std::string(spec) + " H=" + std::to_string(p.H) + " chunk " + std::to_string(chunk));
        const ProblemData pd = structured(p, 90);
        const int saved = max_threads();
        std::vector<std::vector<float>> got;
        for (int threads : {1, 2, 3}) {
          set_threads(threads);
          auto att = make_attention(spec);
          KVCache kc(p.B, p.Hkv, p.M, p.Dk, p.Dv, p.H);
          Context c = Context::for_inference();
          std::vector<float> outs;
          auto step_rows = [&](int64_t pos, int64_t n) {
            const Tensor o = decode_rows(*att, pd, kc, c, pos, n);
            outs.insert(outs.end(), o.data(), o.data() + o.numel());
          };
          for (int64_t pos = 0; pos < p.N; pos += chunk) step_rows(pos, std::min(chunk, p.N - pos));
          kc.truncate(300);
          for (int64_t pos = 300; pos < p.N; pos += chunk) step_rows(pos, std::min(chunk, p.N - pos));
          got.push_back(std::move(outs));
        }
        set_threads(saved);
        for (size_t x = 1; x < got.size(); ++x) {
          ASSERT_EQ(got[x].size(), got[0].size());
          EXPECT_EQ(std::memcmp(got[x].data(), got[0].data(), sizeof(float) * got[0].size()), 0)
              << "decoded outputs differ on " << x + 1 << " threads";
        }
      }
}

// A 16-bit cache that keeps queries (f16 or bf16 K and V, f32 queries) decodes what an f32 cache
// holding the same rows rounded to 16 bits decodes: the stream, the in-block part and the member
// products widen the stored bits and run the f32 arithmetic. Clustered and improved, LSH and
// positional, GQA and odd head sizes, one head on the whole team (the split stream) and one head
// per thread, single steps and chunks, a rewind into an earlier segment.
TEST(CausalClustered, DecodingFromAHalfCacheEqualsAnF32CacheOfRoundedRows) {
  for (const Problem& p : {Problem{.B = 2, .H = 4, .Hkv = 2, .N = 300, .M = 300, .Dk = 20, .Dv = 12, .causal = true},
                           Problem{.B = 1, .H = 1, .Hkv = 1, .N = 200, .M = 200, .Dk = 16, .Dv = 16, .causal = true, .seed = 3}})
    for (const KVCacheType type : {KVCacheType::f16, KVCacheType::bf16}) {
      const ProblemData pd = structured(p, 7);
      ProblemData pr = structured(p, 7);  // K and V rounded to the cache's 16 bits; the queries as they are
      for (Tensor* t : {&pr.k, &pr.v})
        for (int64_t i = 0; i < t->numel(); ++i) {
          float& x = t->data()[i];
          x = type == KVCacheType::f16 ? half::f16_to_f32(half::f32_to_f16(x)) : half::bf16_to_f32(half::f32_to_bf16(x));
        }
      for (const char* spec : {"improved-clustered:clusters=5,topk=6,block=8,segment=32", "clustered:clusters=4,block=16,segment=32",
                               "improved-clustered:clusters=3,topk=4,block=8,segment=16,clustering=positional"})
        for (int64_t chunk : {1, 13}) {
          SCOPED_TRACE(::testing::Message() << spec << " " << kv_cache_type_name(type) << " H " << p.H << " chunk " << chunk);
          auto att = make_attention(spec);
          ASSERT_TRUE(att->capabilities().half_cache);
          KVCache c16(p.B, p.Hkv, p.M, p.Dk, p.Dv, p.H, type), c32(p.B, p.Hkv, p.M, p.Dk, p.Dv, p.H);
          EXPECT_LT(c16.bytes(), c32.bytes());
          Context x16 = Context::for_inference(), x32 = Context::for_inference(), xe = Context::for_inference();
          KVCache ce(p.B, p.Hkv, p.M, p.Dk, p.Dv, p.H);  // the unrounded rows
          double worst = 0, scale = 0, rounding = 0;
          auto step_rows = [&](int64_t pos, int64_t n) {
            const Tensor a = decode_rows(*att, pd, c16, x16, pos, n), w = decode_rows(*att, pr, c32, x32, pos, n);
            const Tensor e = decode_rows(*att, pd, ce, xe, pos, n);
            for (int64_t i = 0; i < a.numel(); ++i) {
              worst = std::max(worst, static_cast<double>(std::abs(a.data()[i] - w.data()[i])));
              scale = std::max(scale, static_cast<double>(std::abs(w.data()[i])));
              rounding = std::max(rounding, static_cast<double>(std::abs(a.data()[i] - e.data()[i])));
            }
          };
          for (int64_t pos = 0; pos < p.N; pos += chunk) step_rows(pos, std::min(chunk, p.N - pos));
          for (KVCache* c : {&c16, &c32, &ce}) c->truncate(77);
          for (int64_t pos = 77; pos < p.N; pos += chunk) step_rows(pos, std::min(chunk, p.N - pos));
          EXPECT_LE(worst, 1e-5 * scale);
          EXPECT_GT(rounding, 0.0) << "the cache did not round";
          // Against the unrounded rows: the rounding, and improved's T_j where a key's score moved
          // past a neighbour's (measured up to 3 % of the largest output with f16, 6 % with bf16).
          EXPECT_LE(rounding, (type == KVCacheType::f16 ? 0.05 : 0.1) * scale);
        }
    }
}

// A 16-bit cache holds K's rows only beside the queries: the plain (non-causal) pipeline and a
// cache without queries are refused by name, and a decode step that is refused leaves the cache as
// it was.
TEST(CausalClustered, HalfCacheRefusalsNameTheReason) {
  const Problem p{.B = 1, .H = 2, .Hkv = 2, .N = 40, .M = 40, .Dk = 8, .Dv = 8, .causal = true};
  const ProblemData pd = structured(p);
  auto att = make_attention("improved-clustered:clusters=3,topk=2,block=8,segment=16");
  for (const bool keep : {false, true}) {
    KVCache kc(p.B, p.Hkv, p.M, p.Dk, p.Dv, keep ? p.H : 0, KVCacheType::f16);
    kc.append(testing::rows(pd.k, 0, 10), testing::rows(pd.v, 0, 10), keep ? testing::rows(pd.q, 0, 10) : ConstView{});
    AttentionInputs in;
    in.q = testing::rows(pd.q, 9, 1);
    in.k = kc.keys();
    in.v = kc.values();
    in.cache = &kc;
    in.causal = !keep;  // without queries: causal; with them: the plain pipeline
    Tensor o(Shape{p.B, p.H, 1, p.Dv});
    Context c = Context::for_inference();
    try {
      att->forward(in, o.view(), c);
      ADD_FAILURE() << "took an f16 cache " << (keep ? "non-causally" : "without queries");
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("reads a f16 KV cache only causally and from a cache that keeps the queries"),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(kc.size(), 10);
  }
}

// A cache that keeps no queries has no definers for the cached positions: a step attends its
// prefix exactly (causal full attention), as docs/models.md says.
TEST(CausalClustered, DecodingWithoutQueriesInTheCacheIsExact) {
  const Problem p{.B = 1, .H = 2, .Hkv = 1, .N = 60, .M = 60, .Dk = 8, .Dv = 8, .causal = true};
  const ProblemData pd = structured(p);
  const Tensor full = causal_full(pd.inputs());
  KVCache kc(p.B, p.Hkv, p.M, p.Dk, p.Dv);
  auto att = make_attention("improved-clustered:clusters=2,topk=2,block=4,segment=8");
  Context c = Context::for_inference();
  for (int64_t pos = 0; pos < p.N; ++pos) {
    kc.append(testing::rows(pd.k, pos, 1), testing::rows(pd.v, pos, 1));
    AttentionInputs in;
    in.q = testing::rows(pd.q, pos, 1);
    in.k = kc.keys();
    in.v = kc.values();
    in.cache = &kc;
    in.causal = true;
    Tensor o(Shape{1, 2, 1, 8});
    att->forward(in, o.view(), c);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t e = 0; e < 8; ++e) ASSERT_NEAR(o.view().ptr(0, h, 0)[e], full.view().ptr(0, h, pos)[e], 1e-5);
  }
}

// Proposition 2 of the paper (improved's L1 distance to the true row never exceeds clustered's)
// applies to the prefix part; rows whose in-block part is empty — key padding at a block start —
// are exactly that part. V = I makes outputs attention rows.
TEST(CausalClustered, ImprovedNeverWorseThanClusteredInL1WhereItApplies) {
  int rows = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed)
    for (auto [c, k, lb, ls] : {std::tuple<int, int, int, int>{3, 4, 8, 16}, {2, 1, 4, 8}, {5, 8, 16, 32}, {3, 2, 16, 16}}) {
      const int64_t n = 96, mv = 2 * ls;  // keys end where segment 2 begins
      Problem p{.B = 1, .H = 2, .Hkv = 1, .N = n, .M = n, .Dk = 8, .Dv = n, .causal = true, .klen = {static_cast<int32_t>(mv)}, .seed = seed};
      ProblemData pd = structured(p, 6);
      pd.v = Tensor(Shape{1, 1, n, n});
      for (int64_t j = 0; j < n; ++j) pd.v.data()[j * n + j] = 1.f;
      const std::string opts = ",block=" + std::to_string(lb) + ",segment=" + std::to_string(ls) + ",seed=" + std::to_string(seed);
      Context c1, c2;
      Tensor oc = run("clustered:clusters=" + std::to_string(c) + opts, pd.inputs(), c1);
      Tensor oi = run("improved-clustered:clusters=" + std::to_string(c) + ",topk=" + std::to_string(k) + opts, pd.inputs(), c2);
      ASSERT_EQ(c1.saved<ClusteredState>().cz.member, c2.saved<ClusteredState>().cz.member);
      const Tensor of = causal_full(pd.inputs());
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t i = mv; i < n; ++i) {
          double lc = 0, li = 0;
          for (int64_t j = 0; j < n; ++j) {
            lc += std::abs(oc.view().ptr(0, h, i)[j] - of.view().ptr(0, h, i)[j]);
            li += std::abs(oi.view().ptr(0, h, i)[j] - of.view().ptr(0, h, i)[j]);
          }
          EXPECT_LE(li, lc + 1e-5) << "seed " << seed << " row " << i;
          ++rows;
        }
    }
  EXPECT_GT(rows, 1000);
}

TEST(CausalClustered, SpecAndBackwardMismatch) {
  EXPECT_THROW(make_attention("clustered:clusters=3,block=0"), Error);
  EXPECT_THROW(make_attention("clustered:clusters=3,block=8,segment=0"), Error);
  EXPECT_THROW(make_attention("clustered:clusters=3,block=8,segment=20"), Error);  // not a multiple
  EXPECT_NE(make_attention("clustered:clusters=3")->name().find("block=512,segment=4096"), std::string::npos);
  EXPECT_NE(make_attention("clustered:clusters=3,block=64")->name().find("block=64,segment=512"), std::string::npos);
  // Backward with the mask flipped since forward is refused.
  ProblemData pd = structured(Problem{.B = 1, .H = 1, .Hkv = 1, .N = 40, .M = 40, .Dk = 4, .Dv = 4, .causal = true});
  auto att = make_attention("clustered:clusters=2,block=8,segment=16");
  Tensor out(Shape{1, 1, 40, 4}), dq(pd.q.shape()), dk(pd.k.shape()), dv(pd.v.shape());
  Context ctx;
  att->forward(pd.inputs(), out.view(), ctx);
  AttentionInputs in = pd.inputs();
  in.causal = false;
  EXPECT_THROW(att->backward(in, out.view(), ctx, pd.dout.view(), dq.view(), dk.view(), dv.view()), Error);
}

// B·H below the thread count: the backward's dense pass over each segment's prefix runs on the
// whole team in spans of keys (causal_internal.h kSpan), and every key's dK, dV and every span's
// dQc are summed in the same order, so outputs and gradients equal the single-thread ones bit for
// bit. Prefixes long enough for several spans (M up to 5037), N != M, padding, GQA; and short
// lengths (1, 3, 65) where a head has one span or none.
TEST(CausalClustered, HeadSplitOverThreadsEqualsOneThreadBitForBit) {
  for (const char* spec : {"clustered:clusters=6,block=64,segment=256", "improved-clustered:clusters=5,topk=7,block=64,segment=512",
                           "improved-clustered:clusters=2,topk=3,block=4,segment=8"})
    for (const Problem& p :
         {Problem{.B = 1, .H = 1, .Hkv = 1, .N = 5000, .M = 5037, .Dk = 16, .Dv = 24, .causal = true, .seed = 3},
          Problem{.B = 1, .H = 2, .Hkv = 1, .N = 4500, .M = 4500, .Dk = 8, .Dv = 8, .causal = true,
                  .qlen = {3900}, .klen = {4333}, .seed = 4},
          Problem{.B = 1, .H = 1, .Hkv = 1, .N = 1000, .M = 1000, .Dk = 16, .Dv = 16, .causal = true},
          Problem{.B = 1, .H = 1, .Hkv = 1, .N = 65, .M = 65, .Dk = 8, .Dv = 8, .causal = true},
          Problem{.B = 1, .H = 1, .Hkv = 1, .N = 3, .M = 3, .Dk = 8, .Dv = 8, .causal = true},
          Problem{.B = 1, .H = 1, .Hkv = 1, .N = 1, .M = 70, .Dk = 8, .Dv = 8, .causal = true}}) {
      SCOPED_TRACE(std::string(spec) + " N=" + std::to_string(p.N) + " M=" + std::to_string(p.M));
      testing::expect_same_bits_on_1_2_3_threads(spec, structured(p));
    }
}

// Gradients against central finite differences of the double reference, clusters, definers and
// top-k sets held fixed (centroids still move with the earlier queries that define them).
TEST(CausalClusteredGradients, FiniteDifferencesInDouble) {
  for (const char* spec : {"clustered:clusters=2,block=2,segment=4", "improved-clustered:clusters=2,topk=3,block=2,segment=4",
                           "improved-clustered:clusters=3,topk=1,block=5,segment=5", "clustered:clusters=4,block=4,segment=4",
                           "improved-clustered:clusters=2,topk=2,block=2,segment=6"}) {
    for (const Problem& p : {Problem{.B = 1, .H = 2, .Hkv = 2, .N = 13, .M = 13, .Dk = 4, .Dv = 3, .causal = true},
                             Problem{.B = 2, .H = 4, .Hkv = 2, .N = 11, .M = 15, .Dk = 3, .Dv = 5, .causal = true, .qlen = {11, 6}, .klen = {13, 15}},
                             Problem{.B = 1, .H = 2, .Hkv = 1, .N = 16, .M = 9, .Dk = 2, .Dv = 2, .causal = true}}) {
      testing::check_fd_gradients(spec, structured(p, 3), [](const RefProblem& pr, const Context& ctx, std::vector<double>& o) {
        attn_clustered_ref(pr, ctx.saved<ClusteredState>(), o);
      });
    }
  }
}

}  // namespace
}  // namespace clattn
