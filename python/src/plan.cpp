// clattn.search_plan: the library's plan search (include/clattn/plan_search.h) with Python
// functions as its metric and its cost, so a plan is searched on whatever Python measures (a
// model of its own, an agreement over its own data) by the same search `clattn approx --target`
// runs; clattn.compare_logits: the metrics that command searches on.
#include <string>
#include <vector>

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include "clattn/plan_search.h"
#include "common.h"

namespace clattn::py {

void bind_plan(pb::module_& m) {
  m.def(
      "compare_logits",
      [](pb::handle reference, pb::handle approx, pb::handle labels) {
        const FloatArg r = float_arg(reference, "reference", 2, "(rows, classes)");
        const FloatArg a = float_arg(approx, "approx", 2, "(rows, classes)");
        const pb::array_t<int32_t> l = int_arg(labels, "labels");
        // Everything it refuses is a shape or a value.
        const LogitAgreement g = value_errors([&] { return compare_logits(r.view, a.view, span_of(l)); });
        pb::dict out;
        out["agreement"] = g.agreement;
        out["accuracy"] = g.accuracy < 0 ? pb::object(pb::none()) : pb::object(pb::float_(g.accuracy));
        out["kl"] = g.kl;
        out["max_diff"] = g.max_diff;
        return out;
      },
      pb::arg("reference"), pb::arg("approx"), pb::arg("labels") = pb::none(),
      "How far approx's (rows, classes) logits are from the reference's, as `clattn approx` measures\n"
      "a plan against full attention: agreement (share of rows with the reference's argmax), accuracy\n"
      "against labels (one per row, -1 for none; None without labelled rows), kl (mean KL(reference ||\n"
      "approx) of the softmax distributions, nats) and max_diff (largest |reference - approx|).");
  m.def(
      "search_plan",
      [](int64_t layers, std::vector<std::string> candidates, std::function<double(const std::string&)> evaluate,
         std::function<double(const std::string&)> cost, double target, bool higher_better, double slack,
         std::string unit, std::function<void(const std::string&)> on_note) {
        if (layers < 1) throw pb::value_error("search_plan: layers must be >= 1, got " + std::to_string(layers));
        if (candidates.empty()) throw pb::value_error("search_plan: give at least one candidate spec");
        if (!(slack >= 0)) throw pb::value_error("search_plan: slack must be >= 0");
        PlanSearch s;
        s.layers = layers;
        s.candidates = std::move(candidates);
        s.evaluate = std::move(evaluate);
        s.cost = std::move(cost);
        s.target = target;
        s.higher_better = higher_better;
        s.slack = slack;
        s.unit = std::move(unit);
        if (on_note) s.on_note = std::move(on_note);
        const PlanFound f = search_plan(s);
        pb::list evaluated;
        for (const PlanFound::Evaluated& e : f.evaluated) {
          pb::dict d;
          d["plan"] = e.plan;
          d["cost"] = e.cost;
          d["value"] = e.value;
          evaluated.append(d);
        }
        pb::dict out;
        out["plan"] = f.plan();
        out["layers"] = f.layers;
        out["value"] = f.value;
        out["attention_cost"] = f.attention_cost;
        out["full_cost"] = f.full_cost;
        out["evaluations"] = f.evaluations;
        out["costs"] = f.costs;
        out["evaluated"] = evaluated;
        return out;
      },
      pb::arg("layers"), pb::arg("candidates"), pb::arg("evaluate"), pb::arg("cost"), pb::arg("target"),
      pb::kw_only(), pb::arg("higher_better") = true, pb::arg("slack") = 0.25, pb::arg("unit") = "ms",
      pb::arg("on_note") = nullptr,
      "The cheapest per-layer plan (one spec per layer, ';'-joined) whose evaluate(plan) reaches target\n"
      "(at most target when higher_better is False, as for KL), greedy by layer sensitivity, each\n"
      "candidate priced once by cost(spec) (\"full\" too). Returns plan, layers, value, attention_cost,\n"
      "full_cost, evaluations, costs and every evaluated plan with its cost and value.");
}

}  // namespace clattn::py
