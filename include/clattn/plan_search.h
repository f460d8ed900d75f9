// The plan search: the cheapest per-layer attention plan whose metric (agreement with full
// attention, KL, accuracy) reaches a target on calibration data, over callbacks that evaluate a
// plan and price a spec, so any caller — `clattn approx --target`, Python's clattn.search_plan, a
// test with fake costs — drives the same search. What the command line passes:
//
// Cost is what a plan's attention takes at the deployment length (--length), a plan costing the
// sum over its layers. `--cost timed` (the default) measures it on this machine: each candidate
// spec, and full, is timed on one layer's shape with the structured inputs of `clattn bench` (the
// least of 7 calls after a warm-up: another process on the cores only adds time, so the least is
// the figure that repeats). `--cost work` prices each by its work model instead (Attention::work:
// floating-point and integer operations of one layer's forward, in GOP), so the same inputs give
// the same plan on any machine, busy or not, at the price of ignoring how fast each variant's
// kernels run here. The costs are written into the plan file beside their unit, the machine and
// the clattn version. Calibration data may be much shorter
// than the deployment (KWT's 99 frames, a decoder's 512-token context): quality is measured at
// the data's length, time at the length the model will run at.
//
// Search, greedy by sensitivity (L layers, K candidates ordered by cost):
//   1. each layer alone gets the cheapest candidate, the rest full: how much that layer alone
//      moves the metric (L evaluations);
//   2. from the least sensitive layer to the most, each layer takes the cheapest candidate with
//      which the plan so far still reaches the target (or, among those costing at most 25 % more,
//      the one that keeps the metric best), or stays full (at most L·K evaluations).
// Every accepted plan meets the target on the calibration data, so the result does; whether it
// generalises is what the held-out report says.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <span>
#include <vector>

#include "clattn/tensor.h"

namespace clattn {

// How far a plan's logits are from full attention's, the metrics a plan search targets. Both are
// (rows, classes), one prediction per row: an encoder's item, or a decoder's position.
//   agreement  share of rows whose argmax equals the reference's (the first maximum on ties)
//   accuracy   share of labelled rows whose argmax is the label; labels are one per row, -1 for
//              none; -1 when no row is labelled or no labels are given
//   kl         mean over rows of KL(reference || approx) between the softmax distributions, in
//              nats, from log-sum-exps in double (logits of any magnitude)
//   max_diff   largest |reference - approx| over every logit
// Refused with a clattn::Error naming the problem: shapes that differ or are not 2-D, no rows or
// no classes, a non-finite logit, labels of another count, a label outside [-1, classes).
struct LogitAgreement {
  double agreement = 0, accuracy = -1, kl = 0, max_diff = 0;
};
LogitAgreement compare_logits(ConstView reference, ConstView approx, std::span<const int32_t> labels = {});

struct PlanSearch {
  int64_t layers = 0;
  std::vector<std::string> candidates;  // any order; searched cheapest first
  // The metric of a plan (';'-joined per-layer specs) on the calibration data, and the value it
  // must reach: at least `target` (agreement, accuracy) or, with higher_better false, at most (KL).
  std::function<double(const std::string& plan)> evaluate;
  double target = 0;
  bool higher_better = true;
  bool meets(double v) const { return higher_better ? v >= target : v <= target; }
  // A candidate costing at most (1 + slack)x the cheapest one that keeps the target is taken
  // instead when it keeps the metric better.
  double slack = 0.25;
  // The cost of one layer's attention with `spec` at the deployment length, in `unit`.
  std::function<double(const std::string& spec)> cost;
  std::string unit = "ms";
  // Optional: called before each cost and evaluation with the evaluations done so far and what
  // comes next ("layer 3: clustered:clusters=25"); and with each line of the search's report
  // ("search: layer 3 -> ..."), which the command line prints.
  std::function<void(int64_t evaluations, const std::string& what)> on_step;
  std::function<void(const std::string& line)> on_note;
};

struct PlanFound {
  std::vector<std::string> layers;  // one spec per layer
  double value = 0;                 // the metric on the calibration data
  double attention_cost = 0, full_cost = 0;  // the plan's and full attention's, summed over layers
  int64_t evaluations = 0;
  std::map<std::string, double> costs;  // one layer's attention per candidate and "full" (PlanSearch::unit)
  // Every plan the search evaluated, in order: its cost (summed over layers) and its metric on the
  // calibration data (`clattn plot --plan` draws them against each other).
  struct Evaluated {
    std::string plan;
    double cost = 0, value = 0;
  };
  std::vector<Evaluated> evaluated;
  std::string plan() const { return join(layers); }  // ';'-joined
  static std::string join(const std::vector<std::string>& layers);
};

// Runs the search. Deterministic given deterministic callbacks: candidates of equal cost keep
// their given order, layers of equal sensitivity their index order.
PlanFound search_plan(const PlanSearch& s);

}  // namespace clattn
