// Spec strings: "name" or "name:key=value,key=value", and for wrappers "name:<inner spec>"
// (e.g. "conditional-full:length_limit=512,improved-clustered:clusters=100").
// Errors list what is accepted: unknown names, unknown parameters, bad or out-of-range values.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace clattn {

class Attention;

struct Spec {
  std::string name;
  std::vector<std::pair<std::string, std::string>> params;  // in order of appearance
  std::string text;                                         // the original string
  std::string inner;  // wrappers: the inner spec after the key=value pairs ("" when none)
};

// Splits name and key=value pairs; rejects whitespace, empty names, items, keys or values and
// repeated keys. The first item that is not key=value starts `inner` (make_attention refuses it
// for every variant but a wrapper, so a forgotten '=' is still an error).
Spec parse_spec(std::string_view text);

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

}  // namespace clattn
