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

}  // namespace clattn
