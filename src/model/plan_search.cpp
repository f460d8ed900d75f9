// The greedy plan search (include/clattn/plan_search.h).
#include "clattn/plan_search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>

#include "clattn/error.h"

namespace clattn {

namespace {
std::string fmt(const char* f, auto... a) {
  char buf[512];
  std::snprintf(buf, sizeof buf, f, a...);
  return buf;
}
}  // namespace

LogitAgreement compare_logits(ConstView reference, ConstView approx, std::span<const int32_t> labels) {
  check(reference.rank() == 2 && approx.shape == reference.shape, "compare_logits: the logits must be (rows, classes) "
        "of one shape; the reference is ", reference.shape, ", the approximation ", approx.shape);
  const int64_t rows = reference.dim(0), C = reference.dim(1);
  check(rows > 0 && C > 0, "compare_logits: nothing to compare: the logits are ", reference.shape);
  check(labels.empty() || static_cast<int64_t>(labels.size()) == rows, "compare_logits: ", labels.size(),
        " labels for ", rows, " rows of logits");
  std::vector<double> la(static_cast<size_t>(C)), lb(static_cast<size_t>(C));  // (C) a row's log-softmax
  // Row r of v as its log-softmax in double, and its argmax.
  auto log_softmax = [&](const char* which, ConstView v, int64_t r, std::vector<double>& out) {
    int64_t arg = 0;
    for (int64_t c = 0; c < C; ++c) {
      const float x = *v.ptr(r, c);
      check(std::isfinite(x), "compare_logits: the ", which, "'s logit (", r, ", ", c, ") is ", x);
      out[static_cast<size_t>(c)] = x;
      if (x > out[static_cast<size_t>(arg)]) arg = c;
    }
    const double mx = out[static_cast<size_t>(arg)];
    double s = 0;
    for (const double y : out) s += std::exp(y - mx);
    const double lse = mx + std::log(s);
    for (double& y : out) y -= lse;
    return arg;
  };
  LogitAgreement m;
  int64_t agree = 0, correct = 0, labelled = 0;
  double kl = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t ia = log_softmax("reference", reference, r, la), ib = log_softmax("approximation", approx, r, lb);
    agree += ia == ib;
    if (!labels.empty()) {
      const int32_t y = labels[static_cast<size_t>(r)];
      check(y >= -1 && y < C, "compare_logits: the label of row ", r, " is ", y, ", outside [0, ", C,
            ") (or -1 for none)");
      labelled += y >= 0;
      correct += y >= 0 && ib == y;
    }
    double k = 0;
    for (int64_t c = 0; c < C; ++c) {
      const size_t u = static_cast<size_t>(c);
      k += std::exp(la[u]) * (la[u] - lb[u]);
      m.max_diff = std::max(m.max_diff, std::abs(static_cast<double>(*reference.ptr(r, c)) - *approx.ptr(r, c)));
    }
    kl += k;
  }
  m.agreement = static_cast<double>(agree) / static_cast<double>(rows);
  m.accuracy = labelled ? static_cast<double>(correct) / static_cast<double>(labelled) : -1;
  m.kl = kl / static_cast<double>(rows);
  return m;
}

std::string PlanFound::join(const std::vector<std::string>& layers) {
  std::string out;
  for (const std::string& s : layers) out += (out.empty() ? "" : ";") + s;
  return out;
}

PlanFound search_plan(const PlanSearch& s) {
  check(s.layers >= 1 && !s.candidates.empty(), "plan search: needs layers (>= 1) and candidate specs");
  check(s.evaluate && s.cost, "plan search: needs an evaluate and a cost function");
  const auto step = [&](int64_t n, const std::string& what) {
    if (s.on_step) s.on_step(n, what);
  };
  const auto note = [&](const std::string& line) {
    if (s.on_note) s.on_note(line);
  };
  const int64_t L = s.layers;
  // Candidates cheapest first, each measured once (every layer has the same shape).
  std::map<std::string, double> cost;
  for (const std::string& c : s.candidates) {
    step(0, "cost of " + c);
    cost[c] = s.cost(c);
  }
  step(0, "cost of full");
  const double full = s.cost("full");
  std::vector<std::string> cands = s.candidates;
  std::stable_sort(cands.begin(), cands.end(), [&](const std::string& a, const std::string& b) { return cost[a] < cost[b]; });
  const char* u = s.unit.c_str();
  note(fmt("search: attention of one layer at the deployment length: full %.2f %s", full, u));
  for (const std::string& c : cands)
    note(fmt("search:   %-56s %8.2f %s  %6.3fx full", c.c_str(), cost[c], u, cost[c] / full));
  // Candidates no cheaper than full are never worth taking.
  cands.erase(std::remove_if(cands.begin(), cands.end(), [&](const std::string& c) { return cost[c] >= full; }), cands.end());
  PlanFound f;
  f.costs = cost;
  f.costs["full"] = full;
  f.layers.assign(static_cast<size_t>(L), "full");
  f.full_cost = full * static_cast<double>(L);
  auto eval = [&](const std::vector<std::string>& plan, const std::string& what) {
    step(f.evaluations, what);
    ++f.evaluations;
    PlanFound::Evaluated e;
    e.plan = PlanFound::join(plan);
    for (const std::string& spec : plan) e.cost += spec == "full" ? full : cost[spec];
    e.value = s.evaluate(e.plan);
    f.evaluated.push_back(e);
    return e.value;
  };
  f.value = eval(f.layers, "full attention");
  if (cands.empty()) {
    note("search: no candidate is cheaper than full attention at this length");
    f.attention_cost = f.full_cost;
    return f;
  }
  // 1. Sensitivity of each layer alone to the cheapest candidate.
  std::vector<double> alone(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) {
    std::vector<std::string> p = f.layers;
    p[static_cast<size_t>(l)] = cands.front();
    alone[static_cast<size_t>(l)] = eval(p, "sensitivity of layer " + std::to_string(l));
  }
  // 2. Least sensitive first: the layer whose approximation alone moves the metric least.
  const bool higher_better = s.higher_better;
  std::vector<int64_t> order(static_cast<size_t>(L));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const double va = alone[static_cast<size_t>(a)], vb = alone[static_cast<size_t>(b)];
    return higher_better ? va > vb : va < vb;
  });
  std::string line = "search: each layer alone with " + cands.front() + ":";
  for (int64_t l = 0; l < L; ++l) line += fmt(" %lld:%.4f", static_cast<long long>(l), alone[static_cast<size_t>(l)]);
  note(line);
  for (int64_t l : order) {
    // The cheapest candidate that keeps the target, unless one costing at most `slack` more keeps
    // the metric better: candidates of nearly one cost (KWT's at N = 16384: 16-24 ms) differ in
    // quality more than in time, and the margin a better one leaves is what the later layers and
    // unseen data spend.
    std::string taken = "full";
    double value = f.value, limit = 0;
    for (const std::string& c : cands) {
      if (taken != "full" && cost[c] > limit) break;
      std::vector<std::string> p = f.layers;
      p[static_cast<size_t>(l)] = c;
      const double v = eval(p, "layer " + std::to_string(l) + ": " + c);
      if (!s.meets(v)) continue;
      if (taken == "full") {
        limit = cost[c] * (1 + s.slack);
      } else if (higher_better ? v <= value : v >= value) {
        continue;
      }
      taken = c;
      value = v;
    }
    f.layers[static_cast<size_t>(l)] = taken;
    f.value = value;
    note(fmt("search: layer %lld -> %s (%.4f)", static_cast<long long>(l), taken.c_str(), value));
  }
  f.attention_cost = 0;
  for (const std::string& spec : f.layers) f.attention_cost += spec == "full" ? full : cost[spec];
  return f;
}

}  // namespace clattn
