// The registry suite: every registered variant runs through the same shape, mask, gradient and
// bad-input tests against its reference. The convention it follows: one suite over the whole
// registry rather than a test file per variant; outputs compared by NMSE with NaN/Inf checks;
// gradients against a closed-form reference or by directional finite differences in double;
// awkward sizes (1, 3, 63, 64, 65, 113); fixed seeds. Variants whose reference is not full
// attention add their entry (spec + reference) to kEntries.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "attention/clustered/clustered.h"
#include "attention/clustered/clustered_ref.h"
#include "attention/full/full.h"
#include "attention/linear/linear.h"
#include "attention/reformer/reformer.h"
#include "attention/routing/routing.h"
#include "attention/smyrf/smyrf.h"
#include "attention/topk/topk.h"
#include "clattn/attention.h"
#include "clattn/threads.h"
#include "clattn/rng.h"
#include "clattn/spec.h"
#include "core/isa.h"
#include "common/fd.h"
#include "common/test_util.h"

namespace clattn {
namespace {

using testing::Guarded;
using testing::make_problem;
using testing::nmse;
using testing::Problem;
using testing::ProblemData;

// A variant, its reference forward (given the context its forward filled, so discrete choices
// such as clusters are held fixed), and its reference backward when it has a closed-form one
// (others check gradients by finite differences in their own test file).
struct Entry {
  std::string spec;
  std::function<void(const AttentionInputs&, const Context&, View)> ref_fwd;
  std::function<void(const AttentionInputs&, ConstView, View, View, View)> ref_bwd;
  bool shared_qk = false;  // k must be q (reformer): problems get M = N, Hkv = H, k = q
  // The reference in double on a RefProblem, with the forward's discrete choices from the context:
  // what the directional finite differences differentiate.
  testing::RefFn dref = nullptr;
};

// Full (window 0) or local attention in double, straight from the definition.
void full_dref(const RefProblem& pr, int64_t window, std::vector<double>& out) {
  const AttentionDims& d = pr.d;
  out.assign(static_cast<size_t>(d.B * d.H * d.N * d.Dv), 0.0);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h)
      for (int64_t i = 0; i < pr.nq(b); ++i) {
        const int64_t p = i + d.M - d.N;
        std::vector<int64_t> keys;
        std::vector<double> s;
        for (int64_t j = 0; j < pr.nk(b); ++j) {
          if (pr.causal && j > p) continue;
          if (window > 0 && (pr.causal ? j <= p - window : std::abs(p - j) > window / 2)) continue;
          keys.push_back(j);
          s.push_back(pr.logit(b, h, i, j));
        }
        if (!keys.empty())
          pr.softmax_add(b, h, keys, std::move(s), 1.0, out.data() + ((b * d.H + h) * d.N + i) * d.Dv);
      }
}

ClusteredParams params_of(const std::string& spec) {
  ClusteredParams p;
  p.topk = spec.find("improved") != std::string::npos ? 4 : 0;
  return p;
}

std::vector<Entry> entries() {
  return {
      {"full", [](const AttentionInputs& in, const Context&, View o) { attn_full_ref_fwd(in, 0.f, o, nullptr); },
       [](const AttentionInputs& in, ConstView g, View dq, View dk, View dv) {
         attn_full_ref_bwd(in, 0.f, g, dq, dk, dv);
       }, false, [](const RefProblem& pr, const Context&, std::vector<double>& o) { full_dref(pr, 0, o); }},
      {"full:scale=0.3",
       [](const AttentionInputs& in, const Context&, View o) { attn_full_ref_fwd(in, 0.3f, o, nullptr); },
       [](const AttentionInputs& in, ConstView g, View dq, View dk, View dv) {
         attn_full_ref_bwd(in, 0.3f, g, dq, dk, dv);
       }, false, [](const RefProblem& pr, const Context&, std::vector<double>& o) { full_dref(pr, 0, o); }},
      {"local:window=16",
       [](const AttentionInputs& in, const Context&, View o) { attn_full_ref_fwd(in, 0.f, o, nullptr, 16); },
       [](const AttentionInputs& in, ConstView g, View dq, View dk, View dv) {
         attn_full_ref_bwd(in, 0.f, g, dq, dk, dv, 16);
       }, false, [](const RefProblem& pr, const Context&, std::vector<double>& o) { full_dref(pr, 16, o); }},
      {"local:window=129,scale=0.2",
       [](const AttentionInputs& in, const Context&, View o) { attn_full_ref_fwd(in, 0.2f, o, nullptr, 129); },
       [](const AttentionInputs& in, ConstView g, View dq, View dk, View dv) {
         attn_full_ref_bwd(in, 0.2f, g, dq, dk, dv, 129);
       }, false, [](const RefProblem& pr, const Context&, std::vector<double>& o) { full_dref(pr, 129, o); }},
      {"linear",
       [](const AttentionInputs& in, const Context&, View o) {
         std::vector<double> ref;
         attn_linear_ref(RefProblem::from(in, 0.f), ref);
         for (int64_t i = 0; i < o.numel(); ++i) o.data[i] = static_cast<float>(ref[static_cast<size_t>(i)]);
       },
       nullptr, false, [](const RefProblem& pr, const Context&, std::vector<double>& o) { attn_linear_ref(pr, o); }},
      {"topk:topk=7",
       [](const AttentionInputs& in, const Context& ctx, View o) {
         std::vector<double> ref;
         attn_topk_ref(RefProblem::from(in, 0.f), ctx.saved<TopkState>(), ref);
         for (int64_t i = 0; i < o.numel(); ++i) o.data[i] = static_cast<float>(ref[static_cast<size_t>(i)]);
       },
       nullptr, false, [](const RefProblem& pr, const Context& c, std::vector<double>& o) { attn_topk_ref(pr, c.saved<TopkState>(), o); }},
      {"smyrf:hashes=2,q_cluster=8,k_cluster=6",
       [](const AttentionInputs& in, const Context& ctx, View o) {
         std::vector<double> ref;
         attn_smyrf_ref(RefProblem::from(in, 0.f), ctx.saved<SmyrfState>(), ref);
         for (int64_t i = 0; i < o.numel(); ++i) o.data[i] = static_cast<float>(ref[static_cast<size_t>(i)]);
       },
       nullptr, false, [](const RefProblem& pr, const Context& c, std::vector<double>& o) { attn_smyrf_ref(pr, c.saved<SmyrfState>(), o); }},
      {"reformer:rounds=2,chunk=8",
       [](const AttentionInputs& in, const Context& ctx, View o) {
         std::vector<double> ref;
         attn_reformer_ref(RefProblem::from(in, 0.f), ctx.saved<ReformerState>(), ref);
         for (int64_t i = 0; i < o.numel(); ++i) o.data[i] = static_cast<float>(ref[static_cast<size_t>(i)]);
       },
       nullptr, true, [](const RefProblem& pr, const Context& c, std::vector<double>& o) { attn_reformer_ref(pr, c.saved<ReformerState>(), o); }},
      {"routing:clusters=3",
       [](const AttentionInputs& in, const Context& ctx, View o) {
         std::vector<double> ref;
         attn_routing_ref(RefProblem::from(in, 0.f), ctx.saved<RoutingState>(), ref);
         for (int64_t i = 0; i < o.numel(); ++i) o.data[i] = static_cast<float>(ref[static_cast<size_t>(i)]);
       },
       nullptr, false, [](const RefProblem& pr, const Context& c, std::vector<double>& o) { attn_routing_ref(pr, c.saved<RoutingState>(), o); }},
      {"clustered:clusters=5",
       [](const AttentionInputs& in, const Context& ctx, View o) {
         attn_clustered_ref_fwd(in, params_of("clustered"), ctx.saved<ClusteredState>(), o);
       },
       nullptr, false, [](const RefProblem& pr, const Context& c, std::vector<double>& o) { attn_clustered_ref(pr, c.saved<ClusteredState>(), o); }},
      {"improved-clustered:clusters=5,topk=4",
       [](const AttentionInputs& in, const Context& ctx, View o) {
         attn_clustered_ref_fwd(in, params_of("improved"), ctx.saved<ClusteredState>(), o);
       },
       nullptr, false, [](const RefProblem& pr, const Context& c, std::vector<double>& o) { attn_clustered_ref(pr, c.saved<ClusteredState>(), o); }},
      {"clustered:clusters=7,clustering=positional",
       [](const AttentionInputs& in, const Context& ctx, View o) {
         attn_clustered_ref_fwd(in, params_of("clustered"), ctx.saved<ClusteredState>(), o);
       },
       nullptr, false, [](const RefProblem& pr, const Context& c, std::vector<double>& o) { attn_clustered_ref(pr, c.saved<ClusteredState>(), o); }},
      // conditional-full: exact below the limit, the inner variant above it (both sides are run:
      // the suite's lengths straddle 64).
      {"conditional-full:length_limit=64,improved-clustered:clusters=5,topk=4",
       [](const AttentionInputs& in, const Context& ctx, View o) {
         if (in.q.dim(2) <= 64) attn_full_ref_fwd(in, 0.f, o, nullptr);
         else attn_clustered_ref_fwd(in, params_of("improved"), ctx.saved<ClusteredState>(), o);
       },
       nullptr, false, [](const RefProblem& pr, const Context& c, std::vector<double>& o) {
         if (pr.d.N <= 64) full_dref(pr, 0, o);
         else attn_clustered_ref(pr, c.saved<ClusteredState>(), o);
       }},
  };
}

// The problem's data as the entry's variant takes it: shared-QK variants get k = q (and the
// shapes that allows).
Problem adapt(const Entry& e, Problem p) {
  if (!e.shared_qk) return p;
  p.Hkv = p.H;
  p.M = p.N;
  for (auto& l : p.klen) l = std::min<int32_t>(l, static_cast<int32_t>(p.N));
  return p;
}
ProblemData data_for(const Entry& e, const Problem& p) {
  ProblemData pd = make_problem(adapt(e, p));
  if (e.shared_qk) {
    pd.k = Tensor::from(pd.q.view());  // shaped like k, for the gradient buffers
    pd.shared_qk = true;
  }
  return pd;
}

class RegistrySuite : public ::testing::TestWithParam<Entry> {
 protected:
  // Forward + backward of the variant and of its reference on one problem; compares both.
  void run(const Problem& p_in, double tol = 1e-9) {
    const Entry& e = GetParam();
    const Problem p = adapt(e, p_in);  // the shapes the variant is tested at
    SCOPED_TRACE(::testing::Message() << "B=" << p.B << " H=" << p.H << " Hkv=" << p.Hkv
                                      << " N=" << p.N << " M=" << p.M << " Dk=" << p.Dk
                                      << " Dv=" << p.Dv << " causal=" << p.causal
                                      << " bias=" << p.bias << " qlen=" << p.qlen.size()
                                      << " klen=" << p.klen.size());
    ProblemData pd = data_for(e, p);
    const AttentionInputs in = pd.inputs();
    auto att = make_attention(e.spec);
    Guarded out(Shape{p.B, p.H, p.N, p.Dv});
    Context ctx;
    const Capabilities& caps = att->capabilities();
    if ((p.causal && !caps.causal) || (p.bias && !caps.bias) || (p.N != p.M && !caps.cross) ||
        (p.H != p.Hkv && !caps.gqa)) {
      // A mask or shape the variant cannot honour is refused, never ignored.
      EXPECT_THROW(att->forward(in, out.view(), ctx), Error);
      return;
    }
    att->forward(in, out.view(), ctx);
    ASSERT_TRUE(out.intact()) << "forward wrote outside its output";
    ASSERT_TRUE(testing::all_finite(out.view()));
    Tensor ref(Shape{p.B, p.H, p.N, p.Dv});
    e.ref_fwd(in, ctx, ref.view());
    EXPECT_LE(nmse(ref.view(), out.view()), tol);
    // Padded query rows are exactly 0.
    for (int64_t b = 0; b < p.B && !p.qlen.empty(); ++b)
      for (int64_t h = 0; h < p.H; ++h)
        for (int64_t i = p.qlen[static_cast<size_t>(b)]; i < p.N; ++i)
          for (int64_t x = 0; x < p.Dv; ++x) ASSERT_EQ(out.view().ptr(b, h, i)[x], 0.f);

    if (!att->capabilities().trainable) return;
    // Backward stays inside its outputs and finite; its values are checked against a closed-form
    // reference here when the variant has one, else by finite differences in its own tests.
    Guarded dq(Shape{p.B, p.H, p.N, p.Dk}), dk(Shape{p.B, p.Hkv, p.M, p.Dk}),
        dv(Shape{p.B, p.Hkv, p.M, p.Dv});
    // Backward accumulates: start from 1 and subtract it afterwards.
    dq.fill_view(1.f);
    dk.fill_view(1.f);
    dv.fill_view(1.f);
    att->backward(in, out.view(), ctx, pd.dout.view(), dq.view(), dk.view(), dv.view());
    ASSERT_TRUE(dq.intact() && dk.intact() && dv.intact()) << "backward wrote outside its outputs";
    ASSERT_TRUE(testing::all_finite(dq.view()) && testing::all_finite(dk.view()) && testing::all_finite(dv.view()));
    if (!e.ref_bwd) return;
    Tensor rq(Shape{p.B, p.H, p.N, p.Dk}), rk(Shape{p.B, p.Hkv, p.M, p.Dk}),
        rv(Shape{p.B, p.Hkv, p.M, p.Dv});
    rq.fill(1.f);
    rk.fill(1.f);
    rv.fill(1.f);
    e.ref_bwd(in, pd.dout.view(), rq.view(), rk.view(), rv.view());
    auto minus_one = [](ConstView v) {
      Tensor t = Tensor::from(v);
      for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] -= 1.f;
      return t;
    };
    Tensor gq = minus_one(dq.view()), gk = minus_one(dk.view()), gv = minus_one(dv.view());
    Tensor sq = minus_one(rq.view()), sk = minus_one(rk.view()), sv = minus_one(rv.view());
    EXPECT_LE(nmse(sq.view(), gq.view()), tol * 10) << "dq";
    EXPECT_LE(nmse(sk.view(), gk.view()), tol * 10) << "dk";
    EXPECT_LE(nmse(sv.view(), gv.view()), tol * 10) << "dv";
  }
};

TEST_P(RegistrySuite, AwkwardLengths) {
  for (int64_t n : {1, 3, 63, 64, 65, 113, 1000}) run(Problem{.B = 1, .H = 2, .Hkv = 2, .N = n, .M = n, .Dk = 16, .Dv = 16});
}

// Every ISA copy of the kernels this CPU runs (core/isa.h), in one process, against the same
// references: lengths around the 64-wide tiles, N != M, odd head sizes, GQA, padding, causal.
TEST_P(RegistrySuite, EveryIsaMatchesTheReference) {
  for (const Isa isa : runnable_isas()) {
    const ScopedIsa scoped(isa);
    SCOPED_TRACE(isa_name(isa));
    for (int64_t n : {1, 65, 1000}) run(Problem{.B = 1, .H = 2, .Hkv = 2, .N = n, .M = n, .Dk = 16, .Dv = 16});
    run(Problem{.B = 2, .H = 2, .Hkv = 2, .N = 63, .M = 1000, .Dk = 8, .Dv = 24});
    run(Problem{.B = 1, .H = 2, .Hkv = 1, .N = 70, .M = 90, .Dk = 17, .Dv = 33});
    run(Problem{.B = 2, .H = 8, .Hkv = 4, .N = 65, .M = 65, .Dk = 16, .Dv = 16});
    run(Problem{.B = 3, .H = 2, .Hkv = 2, .N = 65, .M = 65, .Dk = 8, .Dv = 8, .qlen = {65, 1, 30}, .klen = {65, 64, 2}});
    for (auto [n, m] : {std::pair<int64_t, int64_t>{65, 65}, {1000, 1000}, {10, 600}})
      run(Problem{.B = 1, .H = 2, .Hkv = 2, .N = n, .M = m, .Dk = 16, .Dv = 16, .causal = true});
  }
}

TEST_P(RegistrySuite, CrossAttentionNotEqualM) {
  for (auto [n, m] : {std::pair<int64_t, int64_t>{1, 7}, {65, 3}, {63, 1000}, {1000, 65}, {7, 513}})
    run(Problem{.B = 2, .H = 2, .Hkv = 2, .N = n, .M = m, .Dk = 8, .Dv = 24});
}

TEST_P(RegistrySuite, OddHeadDims) {
  for (auto [dk, dv] : {std::pair<int64_t, int64_t>{1, 1}, {3, 5}, {17, 33}, {64, 64}, {80, 48}, {128, 128}})
    run(Problem{.B = 1, .H = 2, .Hkv = 1, .N = 70, .M = 90, .Dk = dk, .Dv = dv});
}

TEST_P(RegistrySuite, GroupedQueryAttention) {
  run(Problem{.B = 2, .H = 8, .Hkv = 4, .N = 65, .M = 65, .Dk = 16, .Dv = 16});
  run(Problem{.B = 1, .H = 8, .Hkv = 1, .N = 113, .M = 300, .Dk = 16, .Dv = 8});
}

TEST_P(RegistrySuite, Padding) {
  run(Problem{.B = 3, .H = 2, .Hkv = 2, .N = 65, .M = 65, .Dk = 8, .Dv = 8, .qlen = {65, 1, 30}, .klen = {65, 64, 2}});
  run(Problem{.B = 2, .H = 2, .Hkv = 1, .N = 600, .M = 700, .Dk = 8, .Dv = 8, .qlen = {599, 0}, .klen = {513, 700}});
}

TEST_P(RegistrySuite, Causal) {
  for (auto [n, m] : {std::pair<int64_t, int64_t>{1, 1}, {64, 64}, {65, 65}, {1000, 1000}, {10, 600}, {600, 10}, {63, 200}})
    run(Problem{.B = 1, .H = 2, .Hkv = 2, .N = n, .M = m, .Dk = 16, .Dv = 16, .causal = true});
  run(Problem{.B = 2, .H = 4, .Hkv = 2, .N = 300, .M = 300, .Dk = 8, .Dv = 8, .causal = true, .qlen = {300, 100}, .klen = {250, 300}});
}

TEST_P(RegistrySuite, Bias) {
  if (!make_attention(GetParam().spec)->capabilities().bias) GTEST_SKIP() << "no bias support";
  run(Problem{.B = 1, .H = 2, .Hkv = 2, .N = 65, .M = 130, .Dk = 8, .Dv = 8, .bias = true});
  run(Problem{.B = 2, .H = 2, .Hkv = 1, .N = 100, .M = 100, .Dk = 8, .Dv = 8, .causal = true, .klen = {100, 50}, .bias = true});
}

TEST_P(RegistrySuite, FullyMaskedRowsAreZeroNotNaN) {
  auto att = make_attention(GetParam().spec);
  // Batch 1 has no valid key; with causal and M < N the first N - M queries see nothing either.
  const bool causal = att->capabilities().causal;
  Problem p{.B = 2, .H = 1, .Hkv = 1, .N = 20, .M = 5, .Dk = 4, .Dv = 4, .causal = causal, .klen = {5, 0}};
  if (!att->capabilities().cross) p.M = 20, p.klen = {20, 0};
  ProblemData pd = data_for(GetParam(), p);
  Tensor out(Shape{2, 1, 20, 4});
  Context ctx;
  att->forward(pd.inputs(), out.view(), ctx);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 20; ++i) {
      const bool sees = b == 0 && (!causal || i + p.M - p.N >= 0);
      for (int64_t e = 0; e < 4; ++e) {
        const float x = out.view().ptr(b, 0, i)[e];
        ASSERT_FALSE(std::isnan(x));
        if (!sees) {
          ASSERT_EQ(x, 0.f) << "b=" << b << " i=" << i;
        }
      }
    }
  if (!att->capabilities().trainable) return;
  Tensor dq(Shape{2, 1, 20, 4}), dk(Shape{2, 1, p.M, 4}), dv(Shape{2, 1, p.M, 4});
  att->backward(pd.inputs(), out.view(), ctx, pd.dout.view(), dq.view(), dk.view(), dv.view());
  EXPECT_TRUE(testing::all_finite(dq.view()) && testing::all_finite(dk.view()) &&
              testing::all_finite(dv.view()));
  for (int64_t i = 0; i < 20; ++i)
    for (int64_t e = 0; e < 4; ++e) EXPECT_EQ(dq.view().ptr(1, 0, i)[e], 0.f);
}

TEST_P(RegistrySuite, EmptySequences) {
  auto att = make_attention(GetParam().spec);
  for (auto [n, m] : {std::pair<int64_t, int64_t>{0, 0}, {0, 5}, {5, 0}}) {
    if (n != m && !att->capabilities().cross) continue;
    ProblemData pd = data_for(GetParam(), Problem{.B = 1, .H = 1, .Hkv = 1, .N = n, .M = m, .Dk = 4, .Dv = 4});
    Tensor out(Shape{1, 1, n, 4});
    out.fill(7.f);
    Context ctx;
    att->forward(pd.inputs(), out.view(), ctx);
    for (int64_t i = 0; i < out.numel(); ++i) EXPECT_EQ(out.data()[i], 0.f);
    Tensor dq(Shape{1, 1, n, 4}), dk(Shape{1, 1, m, 4}), dv(Shape{1, 1, m, 4});
    if (att->capabilities().trainable)
      att->backward(pd.inputs(), out.view(), ctx, pd.dout.view(), dq.view(), dk.view(), dv.view());
  }
}

TEST_P(RegistrySuite, Deterministic) {
  auto att = make_attention(GetParam().spec);
  ProblemData pd = data_for(GetParam(), Problem{.B = 1, .H = 4, .Hkv = 2, .N = 300, .M = 300, .Dk = 16, .Dv = 16});
  Tensor a(Shape{1, 4, 300, 16}), b(Shape{1, 4, 300, 16});
  Context c1, c2;
  att->forward(pd.inputs(), a.view(), c1);
  make_attention(GetParam().spec)->forward(pd.inputs(), b.view(), c2);
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.data()[i], b.data()[i]);
}

// An inference context gives the same output, and a backward on it is refused by name.
TEST_P(RegistrySuite, InferenceContext) {
  ProblemData pd = data_for(GetParam(), Problem{.B = 2, .H = 2, .Hkv = 2, .N = 65, .M = 65, .Dk = 8, .Dv = 8});
  Tensor a(Shape{2, 2, 65, 8}), b(Shape{2, 2, 65, 8});
  Context train, infer = Context::for_inference();
  make_attention(GetParam().spec)->forward(pd.inputs(), a.view(), train);
  auto att = make_attention(GetParam().spec);
  att->forward(pd.inputs(), b.view(), infer);
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.data()[i], b.data()[i]);
  if (!att->capabilities().trainable) return;
  Tensor dq(pd.q.shape()), dk(pd.k.shape()), dv(pd.v.shape());
  try {
    att->backward(pd.inputs(), b.view(), infer, pd.dout.view(), dq.view(), dk.view(), dv.view());
    ADD_FAILURE() << "backward accepted an inference context";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("for_inference"), std::string::npos) << e.what();
  }
}

// Bad inputs: every one is an Error naming the problem, never a crash.
TEST_P(RegistrySuite, BadInputsAreErrors) {
  auto att = make_attention(GetParam().spec);
  auto expect_error = [&](const ProblemData& pd, Shape out_shape, const std::string& needle) {
    Tensor out(out_shape);
    Context ctx;
    try {
      att->forward(pd.inputs(), out.view(), ctx);
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const Problem ok{.B = 2, .H = 4, .Hkv = GetParam().shared_qk ? 4 : 2, .N = 10, .M = 10, .Dk = 8, .Dv = 8};
  auto make_problem = [&](const Problem& p) { return data_for(GetParam(), p); };
  const Shape out_ok{2, 4, 10, 8};
  {
    ProblemData pd = make_problem(ok);
    pd.k = testing::randn(Shape{2, 2, 10, 7}, 1, 1);
    pd.shared_qk = false;
    expect_error(pd, out_ok, "Dk");
  }
  {
    ProblemData pd = make_problem(ok);
    pd.v = testing::randn(Shape{2, 2, 11, 8}, 1, 1);
    expect_error(pd, out_ok, "(Hkv, M)");
  }
  {
    ProblemData pd = make_problem(ok);
    pd.k = testing::randn(Shape{2, 3, 10, 8}, 1, 1);
    pd.shared_qk = false;
    pd.v = testing::randn(Shape{2, 3, 10, 8}, 1, 1);
    expect_error(pd, out_ok, "H % Hkv");
  }
  {
    ProblemData pd = make_problem(ok);
    pd.q = testing::randn(Shape{3, 4, 10, 8}, 1, 1);
    expect_error(pd, Shape{3, 4, 10, 8}, "batch");
  }
  {
    ProblemData pd = make_problem(ok);
    pd.q = testing::randn(Shape{4, 10, 8}, 1, 1);
    expect_error(pd, out_ok, "rank");
  }
  {
    ProblemData pd = make_problem(ok);
    pd.qlen = {10, -1};
    expect_error(pd, out_ok, "query_lengths[1]");
  }
  {
    ProblemData pd = make_problem(ok);
    pd.klen = {11, 3};
    expect_error(pd, out_ok, "key_lengths[0]");
  }
  {
    ProblemData pd = make_problem(ok);
    pd.klen = {10};
    expect_error(pd, out_ok, "key_lengths");
  }
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY}) {
    ProblemData pd = make_problem(ok);
    pd.v.data()[123] = bad;
    expect_error(pd, out_ok, "v must be finite");
    ProblemData pq = make_problem(ok);
    pq.q.data()[pq.q.numel() - 1] = bad;
    expect_error(pq, out_ok, "q must be finite");
  }
  {
    ProblemData pd = make_problem(ok);
    expect_error(pd, Shape{2, 4, 10, 9}, "out must have shape");
  }
  // Backward with a context from nothing, or with wrong gradient shapes.
  {
    ProblemData pd = make_problem(ok);
    if (att->capabilities().trainable) {
      Context empty;
      Tensor dq(Shape{2, 4, 10, 8}), dk(Shape{2, ok.Hkv, 10, 8}), dv(Shape{2, ok.Hkv, 10, 8});
      Tensor out(out_ok);
      EXPECT_THROW(att->backward(pd.inputs(), out.view(), empty, pd.dout.view(), dq.view(), dk.view(), dv.view()),
                   Error);
      Context ctx;
      att->forward(pd.inputs(), out.view(), ctx);
      Tensor dout_nan = Tensor::from(pd.dout.view());
      dout_nan.data()[17] = std::numeric_limits<float>::quiet_NaN();
      try {
        att->backward(pd.inputs(), out.view(), ctx, dout_nan.view(), dq.view(), dk.view(), dv.view());
        ADD_FAILURE() << "NaN in dout accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("dout must be finite"), std::string::npos) << e.what();
      }
      Tensor dk_bad(Shape{2, ok.Hkv, 10, 9});
      EXPECT_THROW(att->backward(pd.inputs(), out.view(), ctx, pd.dout.view(), dq.view(), dk_bad.view(), dv.view()),
                   Error);
    }
  }
}

// The suite covers the whole registry: a newly registered variant without an entry fails here.
TEST(RegistrySuiteCoverage, EveryRegisteredVariantHasAnEntry) {
  for (const VariantInfo& v : registered_attentions()) {
    bool found = false;
    for (const Entry& e : entries()) found |= parse_spec(e.spec).name == v.name;
    EXPECT_TRUE(found) << v.name << " is registered but not in the registry suite's entries()";
  }
}

// A (B, H, N, D) view over a token-major (B, N, H, D) buffer: what a model's fused QKV projection
// hands to attention without a transpose.
struct TokenMajor {
  Tensor buf;  // (B, N, H, D)
  explicit TokenMajor(ConstView head_major)
      : buf(Shape{head_major.dim(0), head_major.dim(2), head_major.dim(1), head_major.dim(3)}) {
    for (int64_t b = 0; b < head_major.dim(0); ++b)
      for (int64_t h = 0; h < head_major.dim(1); ++h)
        for (int64_t i = 0; i < head_major.dim(2); ++i)
          for (int64_t e = 0; e < head_major.dim(3); ++e)
            buf.data()[((b * head_major.dim(2) + i) * head_major.dim(1) + h) * head_major.dim(3) + e] =
                head_major.ptr(b, h, i)[e];
  }
  View view() {
    const int64_t B = buf.dim(0), N = buf.dim(1), H = buf.dim(2), D = buf.dim(3);
    View v{buf.data(), Shape{B, H, N, D}, {}};
    v.strides = {N * H * D, D, H * D, 1};
    return v;
  }
};

// Token-major strided inputs, outputs and gradients give what contiguous ones give.
TEST_P(RegistrySuite, TokenMajorStridedViews) {
  const Entry& e = GetParam();
  auto att = make_attention(e.spec);
  const bool causal = att->capabilities().causal;
  const Problem p = adapt(e, Problem{.B = 2, .H = 4, .Hkv = att->capabilities().gqa ? 2 : 4, .N = 130,
                                     .M = att->capabilities().cross ? 97 : 130, .Dk = 16, .Dv = 8,
                                     .causal = causal, .qlen = {130, 70}, .klen = {90, 97}});
  ProblemData pd = data_for(e, p);
  Tensor out(Shape{p.B, p.H, p.N, p.Dv});
  Context ctx;
  att->forward(pd.inputs(), out.view(), ctx);
  TokenMajor q(pd.q.view()), k(pd.k.view()), v(pd.v.view()), o(out.view()), dout(pd.dout.view());
  AttentionInputs in = pd.inputs();
  in.q = q.view();
  in.k = e.shared_qk ? in.q : ConstView(k.view());
  in.v = v.view();
  Context ctx2;
  att->forward(in, o.view(), ctx2);
  EXPECT_LE(nmse(out.view(), o.view()), 1e-12);
  if (!att->capabilities().trainable) return;
  Tensor dq(pd.q.shape()), dk(pd.k.shape()), dv(pd.v.shape());
  att->backward(pd.inputs(), out.view(), ctx, pd.dout.view(), dq.view(), dk.view(), dv.view());
  TokenMajor sq(dq.view()), sk(dk.view()), sv(dv.view());  // zero gradients, token-major
  for (TokenMajor* t : {&sq, &sk, &sv}) t->buf.fill(0.f);
  att->backward(in, o.view(), ctx2, dout.view(), sq.view(), sk.view(), sv.view());
  EXPECT_LE(nmse(dq.view(), sq.view()), 1e-10) << "dq";
  EXPECT_LE(nmse(dv.view(), sv.view()), 1e-10) << "dv";
  if (!e.shared_qk) {
    EXPECT_LE(nmse(dk.view(), sk.view()), 1e-10) << "dk";
  }
}

// What the thread count may change (docs/design.md): nothing in the forward (every task owns
// its rows, so outputs are bitwise equal on 1, 2 and 3 threads); in the backward, only the order
// of float sums over key chunks and query heads (a stated tolerance, NMSE <= 1e-10). Twice: with
// B·H = 8 (one head per task) and with B·H = 1 at N = 1000, where the variants that split a head's
// work over the team (docs/performance.md) take that path.
TEST_P(RegistrySuite, ThreadCounts) {
  const Entry& e = GetParam();
  auto att = make_attention(e.spec);
  const Capabilities& caps = att->capabilities();
  const Problem many = adapt(e, Problem{.B = 2, .H = 4, .Hkv = caps.gqa ? 2 : 4, .N = 300, .M = 300, .Dk = 16,
                                        .Dv = 16, .causal = caps.causal, .qlen = {300, 211}});
  const Problem one = adapt(e, Problem{.B = 1, .H = 1, .Hkv = 1, .N = 1000, .M = caps.cross ? 1037 : 1000,
                                       .Dk = 16, .Dv = 16, .causal = caps.causal, .qlen = {990}, .klen = {}});
  for (const Problem& p : {many, one}) {
    SCOPED_TRACE("B " + std::to_string(p.B) + ", H " + std::to_string(p.H) + ", N " + std::to_string(p.N));
    ProblemData pd = data_for(e, p);
    const int saved = max_threads();
    std::vector<Tensor> outs, grads;
    for (int threads : {1, 2, 3}) {
      set_threads(threads);
      Tensor out(Shape{p.B, p.H, p.N, p.Dv});
      Context ctx;
      att->forward(pd.inputs(), out.view(), ctx);
      outs.push_back(std::move(out));
      if (caps.trainable) {
        Tensor dq(pd.q.shape()), dk(pd.k.shape()), dv(pd.v.shape());
        att->backward(pd.inputs(), outs.back().view(), ctx, pd.dout.view(), dq.view(), dk.view(), dv.view());
        grads.push_back(std::move(dq));
        grads.push_back(std::move(dk));
        grads.push_back(std::move(dv));
      }
    }
    set_threads(saved);
    for (size_t t = 1; t < outs.size(); ++t)
      for (int64_t i = 0; i < outs[0].numel(); ++i)
        ASSERT_EQ(outs[0].data()[i], outs[t].data()[i]) << "forward differs on " << t + 1 << " threads";
    for (size_t t = 3; t < grads.size(); ++t) EXPECT_LE(nmse(grads[t % 3].view(), grads[t].view()), 1e-10);
  }
}

// Gradients at N ~ 1000 (the lengths the variants exist for) against central finite differences
// of the double reference along random directions, discrete choices held fixed.
TEST_P(RegistrySuite, DirectionalGradientsAtLongN) {
  const Entry& e = GetParam();
  auto att = make_attention(e.spec);
  if (!att->capabilities().trainable || !e.dref) GTEST_SKIP();
  const Capabilities& caps = att->capabilities();
  const Problem p = adapt(e, Problem{.B = 1, .H = 2, .Hkv = caps.gqa ? 1 : 2, .N = 1000,
                                     .M = caps.cross ? 1003 : 1000, .Dk = 16, .Dv = 16,
                                     .causal = caps.causal, .qlen = {990}, .klen = {997}});
  ProblemData pd = data_for(e, p);
  Tensor out(Shape{p.B, p.H, p.N, p.Dv});
  Context ctx;
  att->forward(pd.inputs(), out.view(), ctx);
  Tensor dq(pd.q.shape()), dk(pd.k.shape()), dv(pd.v.shape());
  att->backward(pd.inputs(), out.view(), ctx, pd.dout.view(), dq.view(), dk.view(), dv.view());
  // The spec's own scale (full:scale=0.3 ...), else the default.
  float scale = 0.f;
  for (const auto& [key, value] : parse_spec(e.spec).params)
    if (key == "scale") scale = std::stof(value);
  RefProblem pr = RefProblem::from(pd.inputs(), scale);
  if (e.shared_qk) pr.k = pr.q;
  auto loss = [&] {
    if (e.shared_qk) pr.k = pr.q;
    std::vector<double> o;
    e.dref(pr, ctx, o);
    double l = 0;
    for (size_t i = 0; i < o.size(); ++i) l += o[i] * pd.dout.data()[i];
    return l;
  };
  const Rng rng(11);
  struct Arg { std::vector<double>* x; const Tensor* g; const char* name; };
  for (const Arg& a : {Arg{&pr.q, &dq, "dq"}, Arg{&pr.k, &dk, "dk"}, Arg{&pr.v, &dv, "dv"}}) {
    for (uint64_t dir = 0; dir < 2; ++dir) {
      std::vector<double>& x = *a.x;
      std::vector<double> u(x.size()), x0 = x;
      double an = 0, gg = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        u[i] = rng.normal(dir, i);
        an += u[i] * a.g->data()[i];
        gg += static_cast<double>(a.g->data()[i]) * a.g->data()[i];
      }
      constexpr double kEps = 1e-4;
      for (size_t i = 0; i < x.size(); ++i) x[i] = x0[i] + kEps * u[i];
      const double lp = loss();
      for (size_t i = 0; i < x.size(); ++i) x[i] = x0[i] - kEps * u[i];
      const double lm = loss();
      x = x0;
      const double fd = (lp - lm) / (2 * kEps);
      // u·g has spread |g|; float gradients and the O(eps^2) truncation stay far below 1e-4 of it.
      EXPECT_NEAR(an, fd, 1e-4 * (std::abs(fd) + std::sqrt(gg))) << a.name << " direction " << dir;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, RegistrySuite, ::testing::ValuesIn(entries()),
                         [](const ::testing::TestParamInfo<Entry>& info) {
                           std::string s;
                           for (char ch : info.param.spec) s += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return s;
                         });

}  // namespace
}  // namespace clattn
