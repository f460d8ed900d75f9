// Spec strings: "name[:key=value,...[,inner-spec]]". Parsing is strict: no whitespace (an error,
// not trimmed), no empty items, keys or values, no repeated keys; the first item after ':' that is
// not key=value (no '=', or a ':' before its '=') starts the inner spec of a wrapper (everything
// after it, verbatim). Only wrappers accept one: the registry rejects it for every other variant.
#include "attention/registry.h"
#include "clattn/spec.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "clattn/error.h"

namespace clattn {

Spec parse_spec(std::string_view text) {
  Spec s;
  s.text = std::string(text);
  check(!text.empty(), "spec is empty; expected e.g. 'full' or 'full:scale=0.125'");
  for (char ch : text)
    check(!std::isspace(static_cast<unsigned char>(ch)), "spec '", text,
          "' contains whitespace; write it as name:key=value,key=value");
  const size_t colon = text.find(':');
  s.name = std::string(text.substr(0, colon));
  check(!s.name.empty(), "spec '", text, "' has no attention name before ':'");
  if (colon == std::string_view::npos) return s;
  std::string_view rest = text.substr(colon + 1);
  check(!rest.empty(), "spec '", text, "' ends with ':'; give parameters as key=value or drop the ':'");
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    // Caught here, or ",x=1" would pass for an inner spec and the error would say the wrong thing.
    check(!item.empty(), "spec '", text, "' has an empty parameter (',' right after ':' or ',,')");
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos || item.substr(0, eq).find(':') != std::string_view::npos) {
      // Not key=value (no '=', or a name with ':' before it): the inner spec of a wrapper,
      // verbatim to the end (it may hold ',').
      s.inner = std::string(rest);
      break;
    }
    const std::string key(item.substr(0, eq)), value(item.substr(eq + 1));
    check(!key.empty(), "spec '", text, "': parameter '", item, "' has no name before '='");
    check(!value.empty(), "spec '", text, "': parameter '", key, "' has no value after '='");
    check(value.find('=') == std::string::npos, "spec '", text, "': parameter '", item,
          "' has more than one '='");
    for (const auto& [k, v] : s.params)
      check(k != key, "spec '", text, "': parameter '", key, "' is given twice");
    s.params.emplace_back(key, value);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
    check(!rest.empty(), "spec '", text, "' ends with ','");
  }
  return s;
}

namespace {

// A factory may read a key twice (e.g. once to decide a default); list it once in errors.
void note_accepted(std::vector<std::string>& accepted, const std::string& key) {
  if (std::find(accepted.begin(), accepted.end(), key) == accepted.end()) accepted.push_back(key);
}

}  // namespace

SpecReader::SpecReader(const Spec& spec) : spec_(spec) {}

const std::string* SpecReader::find(const std::string& key) const {
  for (const auto& [k, v] : spec_.params)
    if (k == key) return &v;
  return nullptr;
}

bool SpecReader::has(const std::string& key) const { return find(key) != nullptr; }

// The whole value must parse (strtod's syntax: "0.125", "1e-3"; not "1.5x", "nan", "inf").
// Overflow and underflow ("1e400", "1e-400") are numbers, reported as out of range.
double SpecReader::get_float(const std::string& key, double dflt, double lo, double hi) {
  note_accepted(accepted_, key);
  const std::string* v = find(key);
  if (!v) return dflt;
  used_.insert(key);
  errno = 0;
  char* end = nullptr;
  const double x = std::strtod(v->c_str(), &end);
  const bool out_of_double = errno == ERANGE;
  check(end == v->c_str() + v->size() && (std::isfinite(x) || out_of_double), "spec '", spec_.text,
        "': ", key, " must be a number, got '", *v, "'");
  check(!out_of_double && x >= lo && x <= hi, "spec '", spec_.text, "': ", key, " must be in [", lo,
        ", ", hi, "], got ", *v);
  return x;
}

// Decimal digits with an optional sign only: "1.5", "1e3" and "0x10" are errors; values beyond
// int64 are reported as out of range.
int64_t SpecReader::get_int(const std::string& key, int64_t dflt, int64_t lo, int64_t hi) {
  note_accepted(accepted_, key);
  const std::string* v = find(key);
  if (!v) return dflt;
  used_.insert(key);
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v->c_str(), &end, 10);
  const bool out_of_int64 = errno == ERANGE;
  check(end == v->c_str() + v->size(), "spec '", spec_.text, "': ", key,
        " must be an integer, got '", *v, "'");
  check(!out_of_int64 && x >= lo && x <= hi, "spec '", spec_.text, "': ", key, " must be in [", lo,
        ", ", hi, "], got ", *v);
  return x;
}

bool SpecReader::get_bool(const std::string& key, bool dflt) {
  note_accepted(accepted_, key);
  const std::string* v = find(key);
  if (!v) return dflt;
  used_.insert(key);
  if (*v == "true" || *v == "1") return true;
  if (*v == "false" || *v == "0") return false;
  fail("spec '", spec_.text, "': ", key, " must be true or false (or 1 or 0), got '", *v, "'");
}

std::string SpecReader::get_choice(const std::string& key, const std::string& dflt,
                                   const std::vector<std::string>& choices) {
  note_accepted(accepted_, key);
  const std::string* v = find(key);
  if (!v) return dflt;
  used_.insert(key);
  if (std::find(choices.begin(), choices.end(), *v) != choices.end()) return *v;
  std::ostringstream os;
  for (size_t i = 0; i < choices.size(); ++i) os << (i ? ", " : "") << choices[i];
  fail("spec '", spec_.text, "': ", key, " must be one of ", os.str(), ", got '", *v, "'");
}

void SpecReader::finish() const {
  std::ostringstream unknown, accepted;
  int n = 0;
  for (const auto& [k, v] : spec_.params)
    if (!used_.count(k)) unknown << (n++ ? "', '" : "'") << k;
  if (n == 0) return;
  for (size_t i = 0; i < accepted_.size(); ++i) accepted << (i ? ", " : "") << accepted_[i];
  fail("spec '", spec_.text, "': unknown parameter", n > 1 ? "s " : " ", unknown.str(), "'; ",
       spec_.name, " accepts: ", accepted_.empty() ? std::string("no parameters") : accepted.str());
}

}  // namespace clattn
