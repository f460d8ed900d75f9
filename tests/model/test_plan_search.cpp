// The plan search (include/clattn/plan_search.h) driven by fake cost and metric functions: which
// plan it returns, in how many evaluations, for targets above and below, KL's direction, the
// slack rule, candidates no cheaper than full, and its refusals. No model and no timing: every
// case is deterministic.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "clattn/error.h"
#include "clattn/plan_search.h"

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

}  // namespace
}  // namespace clattn
