// Internals of the registry, not part of the public API: typed reading of spec parameters, and
// the table of registered variants with their factories.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "clattn/attention.h"
#include "clattn/spec.h"

namespace clattn {

// Reads typed parameters of one spec; finish() rejects any parameter nobody asked for.
class SpecReader {
 public:
  explicit SpecReader(const Spec& spec);
  double get_float(const std::string& key, double dflt, double lo, double hi);
  int64_t get_int(const std::string& key, int64_t dflt, int64_t lo, int64_t hi);
  bool get_bool(const std::string& key, bool dflt);
  // One of `choices` (error listing them otherwise).
  std::string get_choice(const std::string& key, const std::string& dflt,
                         const std::vector<std::string>& choices);
  bool has(const std::string& key) const;
  void finish() const;  // throws if parameters remain that no get_* consumed

 private:
  const std::string* find(const std::string& key) const;
  const Spec& spec_;
  std::vector<std::string> accepted_;
  std::set<std::string> used_;
};

// Variants register a factory under their name (see src/attention/registry.cpp).
using AttentionFactory = std::function<std::unique_ptr<Attention>(const Spec&)>;
struct Registration {
  std::string name, params, summary;
  std::string example;  // a complete spec that builds this variant
  AttentionFactory make;
};
const std::vector<Registration>& registrations();

// Factories of the registered variants; registry.cpp lists them (explicitly, so a static link
// never drops one).
std::unique_ptr<Attention> make_full(const Spec& spec);
std::unique_ptr<Attention> make_clustered(const Spec& spec);
std::unique_ptr<Attention> make_improved_clustered(const Spec& spec);
std::unique_ptr<Attention> make_conditional_full(const Spec& spec);
std::unique_ptr<Attention> make_local(const Spec& spec);
std::unique_ptr<Attention> make_linear(const Spec& spec);
std::unique_ptr<Attention> make_topk(const Spec& spec);
std::unique_ptr<Attention> make_smyrf(const Spec& spec);
std::unique_ptr<Attention> make_reformer(const Spec& spec);
std::unique_ptr<Attention> make_routing(const Spec& spec);

}  // namespace clattn
