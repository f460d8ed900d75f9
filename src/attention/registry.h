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
// `shown` is the default as the documentation states it when the number is a placeholder
// ("1/sqrt(Dk)" for scale 0, "auto"); empty shows the number.
class SpecReader {
 public:
  explicit SpecReader(const Spec& spec);
  ~SpecReader();
  SpecReader(const SpecReader&) = delete;
  SpecReader& operator=(const SpecReader&) = delete;
  double get_float(const std::string& key, double dflt, double lo, double hi, const std::string& shown = {});
  int64_t get_int(const std::string& key, int64_t dflt, int64_t lo, int64_t hi, const std::string& shown = {});
  bool get_bool(const std::string& key, bool dflt);
  // One of `choices` (error listing them otherwise).
  std::string get_choice(const std::string& key, const std::string& dflt,
                         const std::vector<std::string>& choices);
  // Marks `key` as required; its absence is reported by finish(), after any unknown parameter
  // (a misspelt required key is named as such, not as missing). Read it with get_* as usual.
  void require(const std::string& key, const std::string& example);
  bool has(const std::string& key) const;
  // Throws if parameters remain that no get_* consumed (naming the nearest accepted one), then
  // if a required one is missing.
  void finish() const;

 private:
  const std::string* find(const std::string& key) const;
  void note(const std::string& key, const char* type, std::string dflt, std::string range);
  const Spec& spec_;
  std::vector<std::string> accepted_;
  std::vector<std::pair<std::string, std::string>> required_;  // key, example spec
  std::set<std::string> used_;
  std::vector<SpecParam>* record_ = nullptr;  // describe_parameters() collects here
};


// Variants register a factory under their name (see src/attention/registry.cpp).
using AttentionFactory = std::function<std::unique_ptr<Attention>(const Spec&)>;

// The parameters `make` reads while building `example` (from the first SpecReader it creates: a
// wrapper's own, not its inner spec's), and the object it built.
std::vector<SpecParam> describe_parameters(const AttentionFactory& make, const Spec& example,
                                           std::unique_ptr<Attention>* built = nullptr);
struct Registration {
  std::string name, params, summary;
  std::string example;  // a complete spec that builds this variant
  AttentionFactory make;
};
const std::vector<Registration>& registrations();
// Adds a variant from outside the library's table (a test's own, a program's): make_attention,
// registered_attentions and the sequence split's refusal lists then know it as any other. Its
// name must be new and its example spec must build. Not thread-safe: register at start-up,
// before attention is made or listed elsewhere.
void register_attention(Registration r);

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
