// The plan search (include/clattn/plan_search.h) driven by fake cost and metric functions: which
// plan it returns, in how many evaluations, for targets above and below, KL's direction, the
// slack rule, candidates no cheaper than full, and its refusals. No model and no timing: every
// case is deterministic. And the metrics it searches on (compare_logits) against hand-computed
// values, on strided rows, and on the inputs they refuse.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "clattn/error.h"
#include "clattn/plan_search.h"
#include "clattn/tensor.h"

namespace clattn {
namespace {

// Splits a ';'-joined plan into its layers.
std::vector<std::string> layers_of(const std::string& plan) {
  std::vector<std::string> out;
  size_t at = 0;
  for (size_t e; (e = plan.find(';', at)) != std::string::npos; at = e + 1) out.push_back(plan.substr(at, e - at));
  out.push_back(plan.substr(at));
  return out;
}

// Metric 1 minus the summed damage of each approximated layer: damage[layer][spec].
PlanSearch fake(int64_t L, std::map<std::string, double> cost, std::vector<std::map<std::string, double>> damage,
                double target) {
  PlanSearch s;
  s.layers = L;
  for (const auto& [spec, c] : cost)
    if (spec != "full") s.candidates.push_back(spec);
  s.cost = [cost](const std::string& spec) { return cost.at(spec); };
  s.evaluate = [damage](const std::string& plan) {
    double v = 1;
    const std::vector<std::string> l = layers_of(plan);
    for (size_t i = 0; i < l.size(); ++i)
      if (l[i] != "full") v -= damage[i].at(l[i]);
    return v;
  };
  s.target = target;
  s.unit = "GOP";
  return s;
}

TEST(PlanSearch, TakesTheCheapestCandidateEachLayerAffords) {
  // Layer 1 is the most sensitive: it keeps the dearer candidate; layer 0 and 2 take the cheap one.
  PlanSearch s = fake(3, {{"full", 10}, {"cheap", 2}, {"mid", 5}},
                      {{{"cheap", 0.01}, {"mid", 0.005}}, {{"cheap", 0.2}, {"mid", 0.02}}, {{"cheap", 0.02}, {"mid", 0.01}}},
                      0.94);
  std::vector<std::string> notes;
  int64_t steps = 0;
  s.on_note = [&](const std::string& n) { notes.push_back(n); };
  s.on_step = [&](int64_t, const std::string&) { ++steps; };
  const PlanFound f = search_plan(s);
  EXPECT_EQ(f.plan(), "cheap;mid;cheap");
  EXPECT_NEAR(f.value, 1 - 0.01 - 0.02 - 0.02, 1e-12);
  EXPECT_EQ(f.attention_cost, 9);
  EXPECT_EQ(f.full_cost, 30);
  EXPECT_EQ(f.costs.at("full"), 10);
  // full once, 3 sensitivities, then layer 0 (cheap), layer 2 (cheap), layer 1 (cheap fails, mid).
  EXPECT_EQ(f.evaluations, 1 + 3 + 1 + 1 + 2);
  EXPECT_EQ(static_cast<int64_t>(f.evaluated.size()), f.evaluations);
  EXPECT_EQ(f.evaluated.front().plan, "full;full;full");
  EXPECT_EQ(f.evaluated.front().cost, 30);
  EXPECT_EQ(steps, 3 + f.evaluations);  // each cost (2 candidates and full), then each evaluation
  ASSERT_FALSE(notes.empty());
  EXPECT_NE(notes.back().find("layer 1 -> mid"), std::string::npos) << notes.back();
}

TEST(PlanSearch, EveryLayerStaysFullWhenNothingKeepsTheTarget) {
  PlanSearch s = fake(2, {{"full", 4}, {"a", 1}}, {{{"a", 0.5}}, {{"a", 0.5}}}, 0.9);
  const PlanFound f = search_plan(s);
  EXPECT_EQ(f.plan(), "full;full");
  EXPECT_EQ(f.value, 1);
  EXPECT_EQ(f.attention_cost, f.full_cost);
}

TEST(PlanSearch, LowerIsBetterForKl) {
  // KL grows with damage: the target is an upper bound.
  PlanSearch s = fake(2, {{"full", 8}, {"a", 1}, {"b", 3}}, {{{"a", 0.3}, {"b", 0.05}}, {{"a", 0.02}, {"b", 0.01}}}, 0);
  const auto agreement = s.evaluate;
  s.evaluate = [agreement](const std::string& plan) { return 1 - agreement(plan); };  // 0 for full
  s.higher_better = false;
  s.target = 0.1;
  const PlanFound f = search_plan(s);
  EXPECT_EQ(f.plan(), "b;a");
  EXPECT_NEAR(f.value, 0.07, 1e-12);
}

TEST(PlanSearch, SlackTakesABetterCandidateOfNearlyTheSameCost) {
  // b costs 20 % more than a and keeps the metric better: taken at slack 0.25, not at 0.1.
  const std::map<std::string, double> cost = {{"full", 10}, {"a", 2}, {"b", 2.4}};
  const std::vector<std::map<std::string, double>> damage = {{{"a", 0.04}, {"b", 0.01}}};
  PlanSearch s = fake(1, cost, damage, 0.9);
  EXPECT_EQ(search_plan(s).plan(), "b");
  s.slack = 0.1;
  EXPECT_EQ(search_plan(s).plan(), "a");
}

TEST(PlanSearch, CandidatesNoCheaperThanFullAreNeverTried) {
  PlanSearch s = fake(2, {{"full", 5}, {"dear", 5}, {"dearer", 7}}, {{{"dear", 0}, {"dearer", 0}}, {{"dear", 0}, {"dearer", 0}}},
                      0.5);
  std::vector<std::string> notes;
  s.on_note = [&](const std::string& n) { notes.push_back(n); };
  const PlanFound f = search_plan(s);
  EXPECT_EQ(f.plan(), "full;full");
  EXPECT_EQ(f.evaluations, 1);
  EXPECT_NE(notes.back().find("no candidate is cheaper"), std::string::npos) << notes.back();
}

TEST(PlanSearch, RefusesWhatItCannotSearch) {
  PlanSearch s = fake(2, {{"full", 5}, {"a", 1}}, {{{"a", 0}}, {{"a", 0}}}, 0.5);
  PlanSearch no_layers = s;
  no_layers.layers = 0;
  EXPECT_THROW(search_plan(no_layers), Error);
  PlanSearch no_cands = s;
  no_cands.candidates.clear();
  EXPECT_THROW(search_plan(no_cands), Error);
  PlanSearch no_cost = s;
  no_cost.cost = nullptr;
  EXPECT_THROW(search_plan(no_cost), Error);
}

Tensor logits(int64_t rows, int64_t C, std::vector<float> v) {
  Tensor t({rows, C});
  std::copy(v.begin(), v.end(), t.data());
  return t;
}

// The message compare_logits refuses with, or "" when it accepts.
std::string refusal(const Tensor& a, const Tensor& b, std::vector<int32_t> labels = {}) {
  try {
    compare_logits(a.view(), b.view(), labels);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CompareLogits, HandComputedAgreementAccuracyAndKl) {
  // Row 0: p = (1/4, 3/4) against q = (1/2, 1/2), argmaxes 1 and 0 (the first of a tie);
  // row 1: the same distribution shifted by 100 on one side, argmax 0 on both.
  const Tensor ref = logits(2, 2, {0, std::log(3.0f), 5, 1});
  const Tensor apx = logits(2, 2, {0, 0, 105, 101});
  const LogitAgreement m = compare_logits(ref.view(), apx.view(), std::vector<int32_t>{1, -1});
  const double kl0 = 0.25 * std::log(0.25 / 0.5) + 0.75 * std::log(0.75 / 0.5);
  EXPECT_DOUBLE_EQ(m.agreement, 0.5);
  EXPECT_NEAR(m.kl, kl0 / 2, 1e-7);  // row 1's KL is 0 up to float rounding of the shift
  EXPECT_DOUBLE_EQ(m.accuracy, 0.0);  // the one labelled row says 1, the approximation 0
  EXPECT_DOUBLE_EQ(m.max_diff, 100.0);
  EXPECT_DOUBLE_EQ(compare_logits(ref.view(), ref.view(), std::vector<int32_t>{1, 0}).accuracy, 1.0);
}

TEST(CompareLogits, IdenticalLogitsAgreeExactly) {
  const Tensor a = logits(3, 4, {1, 2, 3, 4, -80, 80, 0, 0, 7, 7, 7, 7});
  const LogitAgreement m = compare_logits(a.view(), a.view());
  EXPECT_EQ(m.agreement, 1.0);
  EXPECT_EQ(m.kl, 0.0);
  EXPECT_EQ(m.max_diff, 0.0);
  EXPECT_EQ(m.accuracy, -1.0);  // no labels
  EXPECT_EQ(compare_logits(a.view(), a.view(), std::vector<int32_t>{-1, -1, -1}).accuracy, -1.0);
}

TEST(CompareLogits, LargeLogitsStayFinite) {
  // exp(±1e4) overflows in any precision: the log-sum-exp keeps KL at its exact value 0.
  const Tensor a = logits(1, 3, {1e4f, -1e4f, 0}), b = logits(1, 3, {1e4f, 0, -1e4f});
  const LogitAgreement m = compare_logits(a.view(), b.view());
  EXPECT_TRUE(std::isfinite(m.kl));
  EXPECT_NEAR(m.kl, 0.0, 1e-12);
  EXPECT_EQ(m.agreement, 1.0);
}

TEST(CompareLogits, StridedRowsEqualTheirContiguousCopy) {
  // Every other row of a (4, 3) buffer, and a column-major view, read where they lie.
  const Tensor buf = logits(4, 3, {0, 1, 2, 9, 9, 9, 2, 1, 0.5f, -9, -9, -9});
  ConstView even = buf.view();
  even.shape = Shape{2, 3};
  even.strides[0] = 6;
  const Tensor rows = logits(2, 3, {0, 1, 2, 2, 1, 0.5f});
  const Tensor other = logits(2, 3, {0, 2, 1, 2, 0, 1});
  const LogitAgreement a = compare_logits(even, other.view()), b = compare_logits(rows.view(), other.view());
  EXPECT_EQ(a.agreement, b.agreement);
  EXPECT_EQ(a.kl, b.kl);
  EXPECT_EQ(a.max_diff, b.max_diff);
  const Tensor colmajor_data = logits(3, 2, {0, 2, 1, 1, 2, 0.5f});  // rows' transpose
  ConstView cm = colmajor_data.view();
  cm.shape = Shape{2, 3};
  cm.strides = {1, 2};
  EXPECT_EQ(compare_logits(cm, other.view()).kl, b.kl);
}

TEST(CompareLogits, RefusesWhatItCannotCompare) {
  const Tensor a = logits(2, 3, {0, 1, 2, 3, 4, 5});
  EXPECT_NE(refusal(a, logits(3, 2, {0, 1, 2, 3, 4, 5})).find("of one shape; the reference is (2, 3), the approximation (3, 2)"),
            std::string::npos);
  EXPECT_NE(refusal(Tensor({6}), Tensor({6})).find("(rows, classes)"), std::string::npos);
  EXPECT_NE(refusal(Tensor({0, 3}), Tensor({0, 3})).find("nothing to compare"), std::string::npos);
  EXPECT_NE(refusal(a, a, {0}).find("1 labels for 2 rows"), std::string::npos);
  EXPECT_NE(refusal(a, a, {0, 3}).find("the label of row 1 is 3, outside [0, 3)"), std::string::npos);
  EXPECT_NE(refusal(a, a, {-2, 0}).find("the label of row 0 is -2"), std::string::npos);
  Tensor bad = Tensor::from(a.view());
  bad.data()[4] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(refusal(a, bad).find("the approximation's logit (1, 1) is nan"), std::string::npos) << refusal(a, bad);
  bad.data()[4] = std::numeric_limits<float>::infinity();
  EXPECT_NE(refusal(bad, a).find("the reference's logit (1, 1) is inf"), std::string::npos) << refusal(bad, a);
  EXPECT_EQ(refusal(a, a, {2, -1}), "");
}

}  // namespace
}  // namespace clattn
