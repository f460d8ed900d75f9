// Spec strings: "name" or "name:key=value,key=value", and for wrappers "name:<inner spec>"
// (e.g. "conditional-full:length_limit=512,improved-clustered:clusters=100").
// Errors list what is accepted: unknown names, unknown parameters, bad or out-of-range values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace clattn {

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

// The candidates nearest to `word` by edit distance (insertions, deletions, substitutions and
// swaps of neighbours), if near enough to be a slip: within a third of its letters (leading '-'
// not counted; at least 1, at most 3 edits). Several at the same distance are all returned, in
// the candidates' order; none when nothing is that near. Spec errors and the CLI's "did you mean"
// both use it.
std::vector<std::string> nearest_names(const std::string& word, const std::vector<std::string>& candidates);
// " (did you mean 'a'?)", " (did you mean 'a' or 'b'?)", or "" when nothing is near.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

// One parameter a variant accepts, as its factory reads it (registered_attentions() lists them).
struct SpecParam {
  std::string key;
  std::string type;            // "int", "float", "bool" or "choice"
  std::string default_value;   // as text ("63", "true", "lsh", "1/sqrt(Dk)"); "" when required
  std::string range;           // "[1, 64]", "lsh|positional", "" for bool
  bool required = false;
};

}  // namespace clattn
