// The one overflow rule (attention/validate.h) over every registered variant, causal and not,
// forward and backward, and the decode step over a KVCache: finite inputs at the edge of float's
// range give a finite result with no all-zero row, or a refusal that names the bound they break —
// never NaN, inf or rows of 0 with no word. Inputs within the bounds (values near 1e34, dO near
// 1e30; logits near 1e35 and huge queries against tiny keys for full, local and topk) must be
// computed, not refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "clattn/attention.h"
#include "clattn/error.h"
#include "clattn/kv_cache.h"
#include "clattn/validate.h"
#include "common/test_util.h"

namespace clattn {
namespace {

using ::testing::HasSubstr;
using testing::randn;

struct Variant {
  std::string spec;
  bool causal = false;
  bool shared_qk = false;
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  for (const bool causal : {false, true}) {
    v.push_back({"full", causal});
    v.push_back({"local:window=6", causal});
    v.push_back({"topk:topk=5", causal});
    v.push_back({"linear", causal});
    // block=4: the causal forms cluster (their first block of 4 is exact).
    v.push_back({"clustered:clusters=3,block=4", causal});
    v.push_back({"clustered:clusters=3,clustering=positional,block=4", causal});
    v.push_back({"improved-clustered:clusters=3,topk=3,block=4", causal});
    v.push_back({"smyrf:hashes=2,q_cluster=4,k_cluster=4", causal});
    v.push_back({"reformer:rounds=2,chunk=4", causal, true});
    v.push_back({"routing:clusters=3,centroids=ema", causal});
    v.push_back({"conditional-full:length_limit=8,improved-clustered:clusters=3,topk=3,block=4", causal});
  }
  v.push_back({"routing:clusters=3", false});
  return v;
}

// An extreme case: magnitudes of q, k, v and dO, and whether the rule may refuse it (forward,
// backward). A case the rule must accept checks that the bound is not refusing too much. Skewed
// cases (huge q against tiny k) keep the logits small: full, local and topk must compute them;
// variants that sum or square queries and keys (the clustering bounds) and linear may refuse.
struct Case {
  std::string name;
  float q = 1, k = 1, v = 1, g = 1;
  bool fwd_may_refuse = false, bwd_may_refuse = false, skewed = false, huge_logits = false;
};

// Variants with the clustering bounds of attention/validate.h, or linear's own.
bool sums_or_squares(const std::string& spec) {
  for (const char* p : {"clustered", "improved-clustered", "smyrf", "reformer", "routing", "conditional-full", "linear"})
    if (spec.rfind(p, 0) == 0) return true;
  return false;
}

std::vector<Case> cases() {
  return {
      {"q, k ~ 1e19 (logits overflow)", 1e19f, 1e19f, 1, 1, true, true},
      {"v ~ 3e38", 1, 1, 3e38f, 1, true, true},
      {"dO ~ 3e38", 1, 1, 1, 3e38f, false, true},
      {"q ~ 1e30, k ~ 1e-30", 1e30f, 1e-30f, 1, 1, false, true, true},
      {"q ~ 1e-30, k ~ 1e30", 1e-30f, 1e30f, 1, 1, false, true, true},
      {"q ~ 3e38, k ~ 1e-38", 3e38f, 1e-38f, 1, 1, false, true, true},
      // The clustered family checks its results after the fact and may refuse these logits.
      {"q, k ~ 1e17 (logits ~ 1e35)", 1e17f, 1e17f, 1, 1, false, false, false, true},
      {"v ~ 1e34", 1, 1, 1e34f, 1, false, false},
      {"dO ~ 1e30", 1, 1, 1, 1e30f, false, false},
      {"q, k ~ 1e-30", 1e-30f, 1e-30f, 1, 1, false, false},
  };
}

// Values of magnitude s: s times a sign and a factor in [0.5, 1) (never beyond s, so 3e38 stays finite).
Tensor scaled(const Shape& shape, uint64_t stream, float s) {
  Tensor t = randn(shape, 17, stream);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float u = 0.5f + 0.49f * std::fabs(std::tanh(t.data()[i]));
    t.data()[i] = (t.data()[i] < 0 ? -u : u) * s;
  }
  return t;
}

bool refused_by_rule(const Error& e) { return std::string(e.what()).find("too large for float arithmetic") != std::string::npos; }

// No NaN or inf, and no all-zero row (every query here sees at least one key).
::testing::AssertionResult finite_rows(ConstView o) {
  if (!testing::all_finite(o)) return ::testing::AssertionFailure() << "NaN or inf";
  for (int64_t b = 0; b < o.dim(0); ++b)
    for (int64_t h = 0; h < o.dim(1); ++h)
      for (int64_t i = 0; i < o.dim(2); ++i) {
        bool zero = true;
        for (int64_t e = 0; e < o.dim(3); ++e) zero = zero && o.ptr(b, h, i)[e] == 0.f;
        if (zero) return ::testing::AssertionFailure() << "row (" << b << ", " << h << ", " << i << ") is all zeros";
      }
  return ::testing::AssertionSuccess();
}

class Overflow : public ::testing::TestWithParam<Variant> {};

TEST_P(Overflow, FiniteOrRefusedWithTheBound) {
  const Variant& var = GetParam();
  const int64_t N = 16, D = 8;
  const Shape s{1, 2, N, D};
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Tensor q = scaled(s, 1, c.q), k = scaled(s, 2, c.k), v = scaled(s, 3, c.v), g = scaled(s, 4, c.g);
    AttentionInputs in;
    in.q = q.view();
    in.k = var.shared_qk ? q.view() : k.view();
    in.v = v.view();
    in.causal = var.causal;
    AttentionState state;
    in.state = &state;
    const auto att = make_attention(var.spec);
    if (var.causal && !att->capabilities().causal) continue;
    Tensor out(s);
    Context ctx;
    try {
      att->forward(in, out.view(), ctx);
    } catch (const Error& e) {
      const bool may = c.fwd_may_refuse || ((c.skewed || c.huge_logits) && sums_or_squares(var.spec));
      EXPECT_TRUE(may && refused_by_rule(e)) << "forward refused: " << e.what();
      continue;
    }
    // A shared-QK variant with tiny q has keys as tiny: a case of small logits, not of the bound.
    EXPECT_TRUE(finite_rows(out.view())) << "forward";
    if (!att->capabilities().trainable) continue;
    Tensor dq(s), dk(s), dv(s);
    try {
      att->backward(in, out.view(), ctx, g.view(), dq.view(), dk.view(), dv.view());
    } catch (const Error& e) {
      // Their backward bounds are looser worst cases (linear's product bound, reformer's unit-key
      // scale, the clustered family's gradients checked after the fact): refusal allowed there.
      const bool may = c.bwd_may_refuse || sums_or_squares(var.spec);
      EXPECT_TRUE(may && refused_by_rule(e)) << "backward refused: " << e.what();
      continue;
    }
    EXPECT_TRUE(testing::all_finite(dq.view()) && testing::all_finite(dk.view()) && testing::all_finite(dv.view()))
        << "backward gave NaN or inf";
  }
}

// What validate_facts says of facts about the inputs (clattn.torch's tensor-op path): the forward's
// own refusal, word for word, whenever the forward refuses by a bound; and nothing the forward
// would compute is refused (its bounds come from the same magnitudes).
TensorFacts facts_of(const Tensor& t) {
  TensorFacts f;
  f.shape = t.shape();
  for (int64_t i = 0; i < t.numel(); ++i) f.max_abs = std::max(f.max_abs, static_cast<double>(std::fabs(t.data()[i])));
  return f;
}

TEST_P(Overflow, FactsGetTheForwardsRefusal) {
  const Variant& var = GetParam();
  const auto att = make_attention(var.spec);
  if (var.shared_qk || att->capabilities().stateful || (var.causal && !att->capabilities().causal)) return;
  const Shape s{1, 2, 16, 8};
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Tensor q = scaled(s, 1, c.q), k = scaled(s, 2, c.k), v = scaled(s, 3, c.v);
    InputFacts f;
    f.q = facts_of(q);
    f.k = facts_of(k);
    f.v = facts_of(v);
    f.causal = var.causal;
    std::string by_facts, by_forward;
    try {
      validate_facts(*att, f);
    } catch (const Error& e) {
      by_facts = e.what();
    }
    AttentionInputs in;
    in.q = q.view();
    in.k = k.view();
    in.v = v.view();
    in.causal = var.causal;
    Tensor out(s);
    Context ctx;
    try {
      att->forward(in, out.view(), ctx);
    } catch (const Error& e) {
      by_forward = e.what();
    }
    // The clustered family also checks its results after the fact: a refusal facts cannot foresee.
    if (by_facts.empty() && by_forward.find("the results overflowed") != std::string::npos) continue;
    EXPECT_EQ(by_facts, by_forward);
  }
}

// The decode step over a KVCache meets the same rule, from the magnitudes append kept (no second
// read of the cache): keys of 1e19 in the cache are refused by the step that reads them.
TEST_P(Overflow, DecodeStepOverTheCache) {
  const Variant& var = GetParam();
  const auto att = make_attention(var.spec);
  if (!var.causal || var.shared_qk || !att->capabilities().causal) return;
  const int64_t D = 8, T = 12;
  KVCache cache(1, 2, T + 1, D, D, att->capabilities().decode_queries ? 2 : 0);
  for (const float ks : {1.f, 1e19f}) {
    SCOPED_TRACE(ks);
    cache.clear();
    const Tensor k = scaled(Shape{1, 2, T, D}, 2, ks), v = scaled(Shape{1, 2, T, D}, 3, 1);
    const Tensor qp = scaled(Shape{1, 2, T, D}, 1, ks);
    cache.append(k.view(), v.view(), cache.keeps_queries() ? qp.view() : ConstView{});
    EXPECT_EQ(cache.max_abs_key(), static_cast<float>(testing::max_abs_diff(k.view(), Tensor(k.shape()).view())));
    const Tensor q = scaled(Shape{1, 2, 1, D}, 4, ks), k1 = scaled(Shape{1, 2, 1, D}, 5, ks), v1 = scaled(Shape{1, 2, 1, D}, 6, 1);
    cache.append(k1.view(), v1.view(), cache.keeps_queries() ? q.view() : ConstView{});
    AttentionInputs in;
    in.q = q.view();
    in.k = cache.keys();
    in.v = cache.values();
    in.cache = &cache;
    in.causal = true;
    AttentionState state;
    in.state = &state;
    Tensor out(Shape{1, 2, 1, D});
    Context ctx = Context::for_inference();
    try {
      att->forward(in, out.view(), ctx);
    } catch (const Error& e) {
      EXPECT_TRUE(ks > 1 && refused_by_rule(e)) << e.what();
      continue;
    }
    EXPECT_TRUE(finite_rows(out.view()));
  }
}

// truncate() rewinds the magnitudes with the positions: a huge key appended then dropped no
// longer counts.
TEST(OverflowRule, TruncateForgetsDroppedMagnitudes) {
  KVCache cache(1, 1, 8, 4, 4);
  const Tensor small = scaled(Shape{1, 1, 3, 4}, 1, 2.f), big = scaled(Shape{1, 1, 1, 4}, 2, 1e19f);
  cache.append(small.view(), small.view());
  const float before = cache.max_abs_key();
  EXPECT_GT(before, 0.f);
  EXPECT_LE(before, 2.f);
  cache.append(big.view(), big.view());
  EXPECT_GT(cache.max_abs_key(), 1e18f);
  cache.truncate(3);
  EXPECT_EQ(cache.max_abs_key(), before);
  EXPECT_EQ(cache.max_abs_value(), before);
}

INSTANTIATE_TEST_SUITE_P(Variants, Overflow, ::testing::ValuesIn(variants()),
                         [](const ::testing::TestParamInfo<Variant>& i) {
                           std::string n = i.param.spec.substr(0, i.param.spec.find(':'));
                           n += '_';
                           n += std::to_string(i.index);  // not "_" + ...: a GCC 12 -Wrestrict false positive
                           if (i.param.causal) n.append("_causal");
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// The contract's other rules on facts: the forward's message for each broken one.
TEST(OverflowRule, FactsBreakingTheContractGetTheForwardsMessage) {
  const Tensor q = scaled(Shape{2, 4, 10, 8}, 1, 1), k = scaled(Shape{2, 2, 12, 8}, 2, 1), v = scaled(Shape{2, 2, 12, 8}, 3, 1);
  const Tensor bias = scaled(Shape{10, 12}, 4, 1), bias_row = scaled(Shape{1, 12}, 5, 1);
  const Tensor k3 = scaled(Shape{2, 3, 12, 8}, 6, 1), v3 = scaled(Shape{2, 3, 12, 8}, 7, 1);
  struct Broken {
    std::string name, spec;
    std::function<void(Tensor& q, Tensor& k, Tensor& v, Tensor& bias, AttentionInputs& in)> make;
  };
  const std::vector<int32_t> too_long{12, 13}, three{1, 2, 3};
  const std::vector<Broken> broken = {
      {"nan q", "full", [](Tensor& q, Tensor&, Tensor&, Tensor&, AttentionInputs&) { q.data()[3 * 80 + 17] = NAN; }},
      {"inf k", "improved-clustered:clusters=3,topk=4",
       [](Tensor&, Tensor& k, Tensor&, Tensor&, AttentionInputs&) { k.data()[100] = INFINITY; }},
      {"-inf v", "clustered:clusters=3", [](Tensor&, Tensor&, Tensor& v, Tensor&, AttentionInputs&) { v.data()[7] = -INFINITY; }},
      {"+inf bias", "full", [](Tensor&, Tensor&, Tensor&, Tensor& b, AttentionInputs&) { b.data()[2 * 12 + 3] = INFINITY; }},
      {"nan bias", "full", [](Tensor&, Tensor&, Tensor&, Tensor& b, AttentionInputs&) { b.data()[5 * 12] = NAN; }},
      {"bias shape", "full", [&](Tensor&, Tensor&, Tensor&, Tensor&, AttentionInputs& in) { in.bias = bias_row.view(); }},
      {"bias refused", "clustered:clusters=3", [](Tensor&, Tensor&, Tensor&, Tensor&, AttentionInputs&) {}},
      {"key lengths", "full", [&](Tensor&, Tensor&, Tensor&, Tensor&, AttentionInputs& in) { in.key_lengths = too_long; }},
      {"query lengths", "full", [&](Tensor&, Tensor&, Tensor&, Tensor&, AttentionInputs& in) { in.query_lengths = three; }},
      {"H % Hkv", "full", [&](Tensor&, Tensor&, Tensor&, Tensor&, AttentionInputs& in) {
         in.k = k3.view();
         in.v = v3.view();
       }},
      {"causal bias", "full", [](Tensor&, Tensor&, Tensor&, Tensor& b, AttentionInputs& in) {
         in.causal = true;
         b.data()[0] = NAN;
       }},
  };
  for (const Broken& b : broken) {
    SCOPED_TRACE(b.name);
    Tensor qq = Tensor::from(q.view()), kk = Tensor::from(k.view()), vv = Tensor::from(v.view()), bb = Tensor::from(bias.view());
    AttentionInputs in;
    in.q = qq.view();
    in.k = kk.view();
    in.v = vv.view();
    if (b.name.find("bias") != std::string::npos) in.bias = bb.view();
    b.make(qq, kk, vv, bb, in);
    const auto att = make_attention(b.spec);
    std::string by_forward;
    Tensor out(Shape{2, 4, 10, 8});
    Context ctx;
    try {
      att->forward(in, out.view(), ctx);
    } catch (const Error& e) {
      by_forward = e.what();
    }
    ASSERT_FALSE(by_forward.empty()) << "the forward accepted it";
    // The facts a caller would state: shapes, the largest finite |x|, the first bad element.
    auto facts = [](ConstView t, bool is_bias) {
      TensorFacts f;
      if (t.empty()) return f;
      f.shape = t.shape;
      const Tensor c = Tensor::from(t);
      for (int64_t i = 0; i < c.numel(); ++i) {
        const float x = c.data()[i];
        const bool bad = is_bias ? std::isnan(x) || x == INFINITY : !std::isfinite(x);
        if (bad && f.first_bad.empty()) {
          int64_t rest = i;
          f.first_bad.assign(static_cast<size_t>(t.rank()), 0);
          for (int d = t.rank() - 1; d >= 0; --d) {
            f.first_bad[static_cast<size_t>(d)] = rest % t.dim(d);
            rest /= t.dim(d);
          }
          f.bad_value = x;
        }
        if (std::isfinite(x)) f.max_abs = std::max(f.max_abs, static_cast<double>(std::fabs(x)));
      }
      return f;
    };
    InputFacts f;
    f.q = facts(in.q, false);
    f.k = facts(in.k, false);
    f.v = facts(in.v, false);
    f.bias = facts(in.bias, true);
    f.query_lengths.assign(in.query_lengths.begin(), in.query_lengths.end());
    f.key_lengths.assign(in.key_lengths.begin(), in.key_lengths.end());
    f.causal = in.causal;
    try {
      validate_facts(*att, f);
      ADD_FAILURE() << "facts accepted what the forward refused: " << by_forward;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), by_forward);
    }
  }
}

// The bound is named in the refusal.
TEST(OverflowRule, RefusalNamesTheBound) {
  const Shape s{1, 1, 16, 8};
  const Tensor q = scaled(s, 1, 1e19f), k = scaled(s, 2, 1e19f), v = scaled(s, 3, 1);
  AttentionInputs in;
  in.q = q.view();
  in.k = k.view();
  in.v = v.view();
  for (const char* spec : {"clustered:clusters=3", "improved-clustered:clusters=3,topk=3", "smyrf", "routing:clusters=3"}) {
    Tensor out(s);
    Context ctx;
    try {
      make_attention(spec)->forward(in, out.view(), ctx);
      ADD_FAILURE() << spec << " accepted logits of 1e38";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("the logit bound")) << spec;
      EXPECT_THAT(e.what(), HasSubstr("exceeds 1e+37")) << spec;
    }
  }
  const Tensor g = scaled(s, 4, 3e38f), q1 = scaled(s, 1, 1), k1 = scaled(s, 2, 1);
  in.q = q1.view();
  in.k = k1.view();
  for (const char* spec : {"full", "linear", "clustered:clusters=3", "topk:topk=4"}) {
    const auto att = make_attention(spec);
    Tensor out(s), dq(s), dk(s), dv(s);
    Context ctx;
    att->forward(in, out.view(), ctx);
    try {
      att->backward(in, out.view(), ctx, g.view(), dq.view(), dk.view(), dv.view());
      ADD_FAILURE() << spec << " accepted dO of 3e38";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("dout")) << spec;
    }
  }
}

}  // namespace
}  // namespace clattn
