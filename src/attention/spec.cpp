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
#include <vector>

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

// Optimal string alignment distance: insertions, deletions, substitutions and transpositions of
// neighbours each cost 1 ("clusterd" is 1 from "clustered").
size_t edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i)
    for (size_t j = 1; j <= m; ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

// describe_parameters(): the parameter list of the first SpecReader made on this thread while it
// runs. Readers made later in the same call (a wrapper's inner spec) record nothing.
thread_local std::vector<SpecParam>* g_record = nullptr;

std::string number_text(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

// "[lo, hi]" (a stream: GCC 12 warns falsely on string concatenation here).
template <class T>
std::string range_text(T lo, T hi) {
  std::ostringstream os;
  os << "[" << lo << ", " << hi << "]";
  return os.str();
}

}  // namespace

std::vector<std::string> nearest_names(const std::string& word, const std::vector<std::string>& candidates) {
  const size_t letters = word.size() - std::min(word.find_first_not_of('-'), word.size());
  const size_t limit = std::clamp<size_t>(letters / 3, 1, 3);
  size_t best = limit + 1;
  std::vector<std::string> out;
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d > limit) continue;  // too far to be a slip (best starts one beyond the limit)
    if (d < best) {
      best = d;
      out.clear();
    }
    if (d == best && std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  }
  return out;
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  const std::vector<std::string> near = nearest_names(word, candidates);
  if (near.empty()) return "";
  std::string s = " (did you mean ";
  for (size_t i = 0; i < near.size(); ++i)
    s += (i == 0 ? "'" : i + 1 == near.size() ? " or '" : ", '") + near[i] + "'";
  return s + "?)";
}

SpecReader::SpecReader(const Spec& spec) : spec_(spec) {
  if (g_record) {
    record_ = g_record;
    g_record = nullptr;
  }
}

SpecReader::~SpecReader() = default;

void SpecReader::note(const std::string& key, const char* type, std::string dflt, std::string range) {
  if (std::find(accepted_.begin(), accepted_.end(), key) != accepted_.end()) return;  // read twice: once
  accepted_.push_back(key);
  if (!record_) return;
  SpecParam p{key, type, std::move(dflt), std::move(range), false};
  for (const auto& [k, example] : required_)
    if (k == key) {
      p.required = true;
      p.default_value.clear();
    }
  record_->push_back(std::move(p));
}

const std::string* SpecReader::find(const std::string& key) const {
  for (const auto& [k, v] : spec_.params)
    if (k == key) return &v;
  return nullptr;
}

bool SpecReader::has(const std::string& key) const { return find(key) != nullptr; }

void SpecReader::require(const std::string& key, const std::string& example) {
  required_.emplace_back(key, example);
}

// The whole value must parse (strtod's syntax: "0.125", "1e-3"; not "1.5x", "nan", "inf").
// Overflow and underflow ("1e400", "1e-400") are numbers, reported as out of range.
double SpecReader::get_float(const std::string& key, double dflt, double lo, double hi, const std::string& shown) {
  note(key, "float", shown.empty() ? number_text(dflt) : shown, range_text(lo, hi));
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
int64_t SpecReader::get_int(const std::string& key, int64_t dflt, int64_t lo, int64_t hi, const std::string& shown) {
  note(key, "int", shown.empty() ? std::to_string(dflt) : shown, range_text(lo, hi));
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
  note(key, "bool", dflt ? "true" : "false", "");
  const std::string* v = find(key);
  if (!v) return dflt;
  used_.insert(key);
  if (*v == "true" || *v == "1") return true;
  if (*v == "false" || *v == "0") return false;
  fail("spec '", spec_.text, "': ", key, " must be true or false (or 1 or 0), got '", *v, "'");
}

std::string SpecReader::get_choice(const std::string& key, const std::string& dflt,
                                   const std::vector<std::string>& choices) {
  std::ostringstream os;
  for (size_t i = 0; i < choices.size(); ++i) os << (i ? "|" : "") << choices[i];
  note(key, "choice", dflt, os.str());
  const std::string* v = find(key);
  if (!v) return dflt;
  used_.insert(key);
  if (std::find(choices.begin(), choices.end(), *v) != choices.end()) return *v;
  std::ostringstream list;
  for (size_t i = 0; i < choices.size(); ++i) list << (i ? ", " : "") << choices[i];
  fail("spec '", spec_.text, "': ", key, " must be one of ", list.str(), ", got '", *v, "'",
       did_you_mean(*v, choices));
}

void SpecReader::finish() const {
  std::ostringstream unknown, accepted;
  int n = 0;
  std::string hint;
  for (const auto& [k, v] : spec_.params)
    if (!used_.count(k)) {
      unknown << (n++ ? "', '" : "'") << k;
      if (hint.empty()) hint = did_you_mean(k, accepted_);
    }
  if (n > 0) {
    for (size_t i = 0; i < accepted_.size(); ++i) accepted << (i ? ", " : "") << accepted_[i];
    fail("spec '", spec_.text, "': unknown parameter", n > 1 ? "s " : " ", unknown.str(), "'", hint, "; ",
         spec_.name, " accepts: ", accepted_.empty() ? std::string("no parameters") : accepted.str());
  }
  for (const auto& [key, example] : required_)
    check(has(key), "spec '", spec_.text, "': ", key, " is required (e.g. ", example, ")");
}

std::vector<SpecParam> describe_parameters(const AttentionFactory& make, const Spec& example,
                                           std::unique_ptr<Attention>* built) {
  std::vector<SpecParam> params;
  g_record = &params;
  try {
    std::unique_ptr<Attention> a = make(example);
    g_record = nullptr;
    if (built) *built = std::move(a);
  } catch (...) {
    g_record = nullptr;
    throw;
  }
  return params;
}

}  // namespace clattn
