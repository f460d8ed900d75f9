// `clattn variants`: the registered attention variants (include/clattn/attention.h,
// registered_attentions()), each with what it honours and the parameters its spec accepts —
// read from the registry itself, so the list cannot drift from the code.
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "clattn/attention.h"
#include "clattn/spec.h"
#include "commands.h"
#include "result_table.h"

namespace clattn::cli {
namespace {

struct VariantsOptions {
  std::vector<std::string> names;
  std::string format = "text";
};

nlohmann::ordered_json capabilities_json(const Capabilities& c) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [name, value] : capability_list(c)) j[name] = value;
  return j;
}

// Sequence parallelism in the overview: with and without the causal mask, without it only, or not.
const char* splits(const Capabilities& c) {
  return c.splits_sequence_causal ? "yes" : c.splits_sequence ? "no mask" : "-";
}

nlohmann::ordered_json param_json(const SpecParam& p) {
  return {{"key", p.key},
          {"type", p.type},
          {"default", p.required ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(p.default_value)},
          {"range", p.range},
          {"required", p.required}};
}

// "clusters (required), bits=63, ..." for the summary table.
std::string param_summary(const VariantInfo& v) {
  std::string s;
  for (const SpecParam& p : v.parameters)
    s += (s.empty() ? "" : ", ") + p.key + (p.required ? " (required)" : "=" + p.default_value);
  if (v.name == "conditional-full") s += ", then an inner spec";
  return s.empty() ? "(none)" : s;
}

const char* yes(bool b) { return b ? "yes" : "-"; }

void run_variants(const VariantsOptions& o) {
  const std::vector<VariantInfo> all = registered_attentions();
  std::vector<std::string> names;
  for (const VariantInfo& v : all) names.push_back(v.name);
  for (const std::string& n : o.names) {
    bool found = false;
    for (const std::string& k : names) found = found || k == n;
    usage_check(found, "variants: unknown attention '", n, "'", did_you_mean(n, names), "; registered: ", [&] {
      std::string s;
      for (const std::string& k : names) s += (s.empty() ? "" : ", ") + k;
      return s;
    }());
  }
  auto wanted = [&](const VariantInfo& v) {
    if (o.names.empty()) return true;
    for (const std::string& n : o.names)
      if (n == v.name) return true;
    return false;
  };
  nlohmann::ordered_json doc = nlohmann::ordered_json::array();
  for (const VariantInfo& v : all) {
    if (!wanted(v)) continue;
    nlohmann::ordered_json params = nlohmann::ordered_json::array();
    for (const SpecParam& p : v.parameters) params.push_back(param_json(p));
    doc.push_back({{"name", v.name},
                   {"summary", v.summary},
                   {"example", v.example},
                   {"capabilities", capabilities_json(v.capabilities)},
                   {"parameters", params}});
  }
  if (o.format == "json") {
    std::printf("%s\n", nlohmann::ordered_json({{"variants", doc}}).dump(2).c_str());
    return;
  }
  if (o.names.empty()) {
    // The overview: one row per variant.
    const ResultTable table(o.format, {{"variant", "name", "", 18, true},
                                       {"causal", "causal", "", 6},
                                       {"backward", "backward", "", 8},
                                       {"GQA", "gqa", "", 4},
                                       {"padding", "padding", "", 7},
                                       {"decode", "decode", "", 6},
                                       {"split seq", "splits_sequence", "", 9},
                                       {"torch ops", "torch_ops", "", 9},
                                       {"parameters (default)", "parameters", "", 0, true}});
    table.header();
    for (const VariantInfo& v : all) {
      const Capabilities& c = v.capabilities;
      const nlohmann::ordered_json caps = capabilities_json(c);
      const bool text = o.format == "text" || o.format == "md";
      auto cap = [&](bool b) { return text ? nlohmann::ordered_json(yes(b)) : nlohmann::ordered_json(b); };
      table.row({{"name", v.name},
                 {"causal", cap(c.causal)},
                 {"backward", cap(c.trainable)},
                 {"gqa", cap(c.gqa)},
                 {"padding", cap(c.query_lengths && c.key_lengths)},
                 {"decode", cap(caps["decode"].get<bool>())},
                 {"splits_sequence", text ? nlohmann::ordered_json(splits(c)) : nlohmann::ordered_json(c.splits_sequence)},
                 {"torch_ops", cap(caps["torch_ops"].get<bool>())},
                 {"parameters", param_summary(v)}});
    }
    table.end({});
    if (o.format == "text")
      std::printf("\n'clattn variants NAME' lists a variant's parameters with their ranges; -o json everything.\n");
    return;
  }
  // Named variants: their parameters, one row each.
  for (const VariantInfo& v : all) {
    if (!wanted(v)) continue;
    if (o.format == "text") {
      std::printf("%s: %s\n  example: %s\n  honours:", v.name.c_str(), v.summary.c_str(), v.example.c_str());
      const nlohmann::ordered_json caps = capabilities_json(v.capabilities);
      for (const auto& [k, val] : caps.items())
        if (val.get<bool>()) std::printf(" %s", k.c_str());
      std::printf("\n");
    }
    const ResultTable table(o.format, {{"parameter", "key", "", 12, true},
                                       {"type", "type", "", 6, true},
                                       {"default", "default", "", 12, true},
                                       {"range", "range", "", 0, true}});
    table.header();
    for (const SpecParam& p : v.parameters) {
      nlohmann::ordered_json r = param_json(p);
      r["variant"] = v.name;
      if (p.required) r["default"] = "(required)";
      table.row(r);
    }
    if (v.parameters.empty() && o.format == "text") std::printf("  (no parameters)\n");
    if (v.name == "conditional-full" && o.format == "text")
      std::printf("  then an inner spec: conditional-full:length_limit=512,improved-clustered:clusters=100\n");
    if (o.format == "text") std::printf("\n");
  }
}

}  // namespace

void add_variants(CLI::App& app) {
  auto o = std::make_shared<VariantsOptions>();
  CLI::App* sub = app.add_subcommand(
      "variants", "List the registered attention variants: what each honours (causal, backward, GQA, sequence split, "
                  "padding, decode) and its spec parameters with defaults and ranges");
  sub->add_option("names", o->names, "variants to describe in full (default: an overview of all)");
  add_format_option(sub, o->format);
  sub->callback([o] { run_variants(*o); });
}

}  // namespace clattn::cli
