// Numerics under stress: every registered variant on inputs that break naive
// arithmetic — magnitudes 1e4 and 1e-30, all-equal keys, duplicated queries, all keys masked but
// one, N = 1, M = 1, D = 1, D not a multiple of 16. Outputs (and gradients) must be finite; where a
// variant's exact limit applies (full, local with a window covering every key, topk with k >= M,
// improved-clustered with topk >= M, conditional-full below its limit) they must equal a float64
// full-attention reference, and linear must equal its own float64 reference.
// Then the extreme-value regressions: wrong gradients of full at huge logits, and finite inputs
// whose float arithmetic would overflow, which must be refused with the reason, never answered
// with 0, NaN or inf.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "attention/linear/linear.h"
#include "attention/tile/ref_problem.h"
#include "clattn/attention.h"
#include "clattn/error.h"
#include "common/test_util.h"

namespace clattn {
namespace {

using ::testing::HasSubstr;
using testing::randn;

// One variant under test; `spec(N, M)` is the spec at those sizes, `exact` says it then equals full
// attention, `own_ref` that it has its own double reference (linear).
struct Variant {
  std::string name;
  std::function<std::string(int64_t, int64_t)> spec;
  bool exact = false;
  bool shared_qk = false;
  bool linear = false;
};

std::vector<Variant> variants() {
  auto fixed = [](std::string s) { return [s](int64_t, int64_t) { return s; }; };
  return {
      {"full", fixed("full"), true},
      {"local", [](int64_t n, int64_t m) { return "local:window=" + std::to_string(2 * std::max(n, m) + 2); }, true},
      {"linear", fixed("linear"), false, false, true},
      {"topk", [](int64_t, int64_t m) { return "topk:topk=" + std::to_string(m); }, true},
      {"topk-small", fixed("topk:topk=3"), false},
      {"clustered", fixed("clustered:clusters=5"), false},
      {"clustered-positional", fixed("clustered:clusters=4,clustering=positional"), false},
      {"improved-clustered",
       [](int64_t, int64_t m) { return "improved-clustered:clusters=4,topk=" + std::to_string(m); }, true},
      {"improved-clustered-small", fixed("improved-clustered:clusters=4,topk=2"), false},
      {"smyrf", fixed("smyrf:hashes=2,q_cluster=8,k_cluster=6"), false},
      {"reformer", fixed("reformer:rounds=2,chunk=8"), false, true},
      {"routing", fixed("routing:clusters=3"), false},
      {"conditional-full", fixed("conditional-full:length_limit=4096,improved-clustered:clusters=4,topk=2"), true},
  };
}

// Full attention in float64 straight from the definition (key_lengths honoured, no other mask).
Tensor full_ref(const AttentionInputs& in) {
  const RefProblem pr = RefProblem::from(in, 0.f);
  const AttentionDims& d = pr.d;
  Tensor o(Shape{d.B, d.H, d.N, d.Dv});
  std::vector<double> acc(static_cast<size_t>(d.Dv));
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h)
      for (int64_t i = 0; i < pr.nq(b); ++i) {
        std::vector<int64_t> keys;
        std::vector<double> s;
        for (int64_t j = 0; j < pr.nk(b); ++j) {
          keys.push_back(j);
          s.push_back(pr.logit(b, h, i, j));
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        if (!keys.empty()) pr.softmax_add(b, h, keys, std::move(s), 1.0, acc.data());
        for (int64_t e = 0; e < d.Dv; ++e) o.view().ptr(b, h, i)[e] = static_cast<float>(acc[static_cast<size_t>(e)]);
      }
  return o;
}

Tensor linear_ref(const AttentionInputs& in) {
  std::vector<double> ref;
  attn_linear_ref(RefProblem::from(in, 0.f), ref);
  Tensor o(Shape{in.q.dim(0), in.q.dim(1), in.q.dim(2), in.v.dim(3)});
  for (int64_t i = 0; i < o.numel(); ++i) o.data()[i] = static_cast<float>(ref[static_cast<size_t>(i)]);
  return o;
}

// A stress case: sizes and a way to bend the random inputs.
struct Case {
  std::string name;
  int64_t N, M, D;
  std::function<void(Tensor& q, Tensor& k, Tensor& v)> bend = nullptr;
  std::vector<int32_t> klen{};
  double tol = 1e-8;  // nmse against the reference (relative)
};

std::vector<Case> cases() {
  auto scale_all = [](float s) {
    return [s](Tensor& q, Tensor& k, Tensor& v) {
      for (Tensor* t : {&q, &k, &v})
        for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] *= s;
    };
  };
  auto same_rows = [](Tensor& t) {  // every row equal to row 0 of its head
    const int64_t rows = t.dim(2), D = t.dim(3);
    for (int64_t bh = 0; bh < t.dim(0) * t.dim(1); ++bh)
      for (int64_t r = 1; r < rows; ++r)
        for (int64_t e = 0; e < D; ++e) t.data()[(bh * rows + r) * D + e] = t.data()[bh * rows * D + e];
  };
  return {
      // 1e4: logits ~1e8, every softmax row one-hot; ties closer than float's rounding are unlikely.
      {"magnitude 1e4", 70, 70, 24, scale_all(1e4f), {}, 1e-6},
      // 1e-30: logits underflow to 0 (uniform weights), values stay normal floats.
      {"magnitude 1e-30", 70, 70, 24, scale_all(1e-30f)},
      {"all-equal keys", 70, 70, 24, [=](Tensor&, Tensor& k, Tensor&) { same_rows(k); }},
      {"duplicated queries", 70, 70, 24, [=](Tensor& q, Tensor&, Tensor&) { same_rows(q); }},
      {"all keys masked but one", 70, 70, 24, nullptr, {1}},
      {"N = 1", 1, 70, 24},
      {"M = 1", 70, 1, 24},
      {"N = M = 1", 1, 1, 24},
      {"D = 1", 70, 70, 1},
      {"D = 17", 70, 70, 17},
      {"D = 100", 40, 40, 100},
  };
}

class Stress : public ::testing::TestWithParam<Variant> {};

TEST_P(Stress, FiniteAndExactWhereExact) {
  const Variant& var = GetParam();
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const int64_t M = var.shared_qk ? c.N : c.M;
    Tensor q = randn(Shape{1, 2, c.N, c.D}, 7, 1), k = randn(Shape{1, 2, M, c.D}, 7, 2);
    Tensor v = randn(Shape{1, 2, M, c.D}, 7, 3), g = randn(Shape{1, 2, c.N, c.D}, 7, 4);
    if (c.bend) c.bend(q, k, v);
    AttentionInputs in;
    in.q = q.view();
    in.k = var.shared_qk ? q.view() : k.view();
    in.v = v.view();
    if (!c.klen.empty()) in.key_lengths = c.klen;
    auto att = make_attention(var.spec(c.N, M));
    SCOPED_TRACE(att->name());
    if (!c.klen.empty() && !att->capabilities().key_lengths) continue;
    Tensor out(Shape{1, 2, c.N, c.D});
    Context ctx;
    ASSERT_NO_THROW(att->forward(in, out.view(), ctx));
    ASSERT_TRUE(testing::all_finite(out.view()));
    if (var.exact || var.linear) {
      const Tensor ref = var.linear ? linear_ref(in) : full_ref(in);
      EXPECT_LE(testing::nmse(ref.view(), out.view()), c.tol);
    }
    // Every query sees key 0 only: o = v_0 — except in reformer, whose hashing may put a query in
    // another bucket than key 0 (it then sees no key: a row of 0, by its definition).
    if (!c.klen.empty() && !var.shared_qk) {
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t i = 0; i < c.N; ++i)
          for (int64_t e = 0; e < c.D; ++e)
            ASSERT_NEAR(out.view().ptr(0, h, i)[e], v.view().ptr(0, h, 0)[e], 1e-5) << "h " << h << " i " << i;
    }
    if (!att->capabilities().trainable) continue;
    Tensor dq(q.shape()), dk(k.shape()), dv(v.shape());
    ASSERT_NO_THROW(att->backward(in, out.view(), ctx, g.view(), dq.view(), dk.view(), dv.view()));
    EXPECT_TRUE(testing::all_finite(dq.view()) && testing::all_finite(dk.view()) &&
                testing::all_finite(dv.view()));
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, Stress, ::testing::ValuesIn(variants()),
                         [](const ::testing::TestParamInfo<Variant>& i) {
                           std::string n = i.param.name;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// dV of full attention against float64 when every softmax row is one-hot at logits ~1e7 (q, k ~
// 3000·N(0, 1)): the backward recomputed P from a single rounded log-sum-exp, whose error there
// is a whole unit of the exponent — max |dv| was 57.9 where the exact value is 8.49.
TEST(StressGradients, FullAtHugeLogitsMatchesDouble) {
  const int64_t N = 200, D = 32;
  Tensor q = randn(Shape{1, 1, N, D}, 11, 1, 3000.f), k = randn(Shape{1, 1, N, D}, 11, 2, 3000.f);
  Tensor v = randn(Shape{1, 1, N, D}, 11, 3), g = randn(Shape{1, 1, N, D}, 11, 4);
  AttentionInputs in;
  in.q = q.view();
  in.k = k.view();
  in.v = v.view();
  auto att = make_attention("full");
  Tensor out(Shape{1, 1, N, D}), dq(q.shape()), dk(k.shape()), dv(v.shape());
  Context ctx;
  att->forward(in, out.view(), ctx);
  att->backward(in, out.view(), ctx, g.view(), dq.view(), dk.view(), dv.view());
  // float64: P is one-hot at these logits (checked), so dV_j = Σ_{i: argmax_i = j} dO_i.
  const RefProblem pr = RefProblem::from(in, 0.f);
  std::vector<double> ref(static_cast<size_t>(N * D), 0.0);
  for (int64_t i = 0; i < N; ++i) {
    std::vector<double> s(static_cast<size_t>(N));
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < N; ++j) mx = std::max(mx, s[static_cast<size_t>(j)] = pr.logit(0, 0, i, j));
    for (int64_t j = 0; j < N; ++j) sum += s[static_cast<size_t>(j)] = std::exp(s[static_cast<size_t>(j)] - mx);
    for (int64_t j = 0; j < N; ++j)
      for (int64_t e = 0; e < D; ++e)
        ref[static_cast<size_t>(j * D + e)] += s[static_cast<size_t>(j)] / sum * g.data()[i * D + e];
  }
  double err = 0, mref = 0, mgot = 0;
  for (int64_t x = 0; x < N * D; ++x) {
    err = std::max(err, std::abs(ref[static_cast<size_t>(x)] - dv.data()[x]));
    mref = std::max(mref, std::abs(ref[static_cast<size_t>(x)]));
    mgot = std::max(mgot, std::abs(static_cast<double>(dv.data()[x])));
  }
  EXPECT_LE(err, 1e-3 * mref) << "max |dv| " << mgot << ", float64 " << mref;
  // Rows of P sum to 1, so Σ_j dV_j = Σ_i dO_i, whatever the argmaxes.
  for (int64_t e = 0; e < D; ++e) {
    double a = 0, b = 0;
    for (int64_t j = 0; j < N; ++j) a += dv.data()[j * D + e], b += g.data()[j * D + e];
    EXPECT_NEAR(a, b, 1e-3 * (1 + std::abs(b))) << "e " << e;
  }
  EXPECT_TRUE(testing::all_finite(dq.view()) && testing::all_finite(dk.view()));
}

std::string forward_error(const std::string& spec, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor* bias = nullptr) {
  AttentionInputs in;
  in.q = q.view();
  in.k = k.view();
  in.v = v.view();
  if (bias) in.bias = bias->view();
  Tensor out(Shape{q.dim(0), q.dim(1), q.dim(2), v.dim(3)});
  Context ctx;
  try {
    make_attention(spec)->forward(in, out.view(), ctx);
  } catch (const Error& e) {
    return e.what();
  }
  EXPECT_TRUE(testing::all_finite(out.view())) << spec << " answered with NaN or inf";
  return "";
}

// Finite inputs beyond what float arithmetic can carry are refused with the bound they break.
TEST(StressExtremes, OverflowingInputsRefusedWithReason) {
  const Shape s{1, 1, 16, 8};
  const Tensor q = randn(s, 3, 1), k = randn(s, 3, 2), v = randn(s, 3, 3);
  Tensor bias(Shape{16, 16});
  bias.fill(2.4e38f);  // beyond FLT_MAX / log2 e: the log2-unit logit was inf
  EXPECT_THAT(forward_error("full", q, k, v, &bias), HasSubstr("logit bound"));
  bias.fill(-3e38f);  // every key "masked" by a finite value: rows of 0
  EXPECT_THAT(forward_error("full", q, k, v, &bias), HasSubstr("logit bound"));
  Tensor qb = randn(s, 3, 1, 1e19f), kb = randn(s, 3, 2, 1e19f);  // q·k overflows float
  for (const char* spec : {"full", "topk:topk=4", "linear"})
    EXPECT_THAT(forward_error(spec, qb, kb, v), HasSubstr("too large for float")) << spec;
  Tensor vb = randn(s, 3, 3, 1e38f);
  for (const char* spec : {"full", "linear", "topk:topk=4", "local:window=4"})
    EXPECT_THAT(forward_error(spec, q, k, vb), HasSubstr("too large for float")) << spec;
  // Large but representable: computed, finite.
  bias.fill(-1e30f);
  EXPECT_EQ(forward_error("full", q, k, v, &bias), "");
  Tensor qm = randn(s, 3, 1, 1e4f), km = randn(s, 3, 2, 1e4f), vm = randn(s, 3, 3, 1e30f);
  for (const char* spec : {"full", "topk:topk=4"}) EXPECT_EQ(forward_error(spec, qm, km, vm), "") << spec;
}

// NaN or Inf in the upstream gradient is refused like NaN in q, k, v (never NaN gradients).
TEST(StressExtremes, NonFiniteDoutRefused) {
  const Shape s{1, 1, 8, 8};
  const Tensor q = randn(s, 5, 1), k = randn(s, 5, 2), v = randn(s, 5, 3);
  Tensor g = randn(s, 5, 4);
  g.data()[13] = NAN;
  AttentionInputs in;
  in.q = q.view();
  in.k = k.view();
  in.v = v.view();
  for (const char* spec : {"full", "linear", "topk:topk=4"}) {
    auto att = make_attention(spec);
    Tensor out(s), dq(s), dk(s), dv(s);
    Context ctx;
    att->forward(in, out.view(), ctx);
    try {
      att->backward(in, out.view(), ctx, g.view(), dq.view(), dk.view(), dv.view());
      ADD_FAILURE() << spec << " accepted NaN in dout";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("dout must be finite")) << spec;
    }
  }
}

}  // namespace
}  // namespace clattn
