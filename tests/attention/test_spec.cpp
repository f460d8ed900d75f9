// Spec strings and the registry: good specs parse, every malformed one is an Error that says why.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "clattn/attention.h"
#include "attention/registry.h"
#include "clattn/spec.h"

namespace clattn {
namespace {

// The message of the Error that f throws ("" when it throws none; any other exception fails).
template <class F>
std::string error_of_call(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string error_of(const std::string& text) {
  return error_of_call([&] { make_attention(text); });
}

#define EXPECT_HAS(haystack, needle)                                                  \
  do {                                                                                \
    const std::string h_ = (haystack);                                                \
    EXPECT_NE(h_.find(needle), std::string::npos) << "message: '" << h_ << "'"; \
  } while (0)

TEST(Spec, Parses) {
  Spec s = parse_spec("improved-clustered:clusters=100,topk=32");
  EXPECT_EQ(s.name, "improved-clustered");
  EXPECT_EQ(s.text, "improved-clustered:clusters=100,topk=32");
  ASSERT_EQ(s.params.size(), 2u);
  EXPECT_EQ(s.params[0].first, "clusters");
  EXPECT_EQ(s.params[1].first, "topk");
  EXPECT_EQ(s.params[1].second, "32");
  EXPECT_TRUE(s.inner.empty());
  EXPECT_EQ(parse_spec("full").params.size(), 0u);
  EXPECT_EQ(parse_spec("full").name, "full");
  // A ':' inside a value does not start an inner spec (only one before the '=' does).
  Spec p = parse_spec("x:path=a:b");
  ASSERT_EQ(p.params.size(), 1u);
  EXPECT_EQ(p.params[0].second, "a:b");
  EXPECT_TRUE(p.inner.empty());
}

TEST(Spec, WrapperInnerSpec) {
  Spec w = parse_spec("conditional-full:length_limit=512,improved-clustered:clusters=100,topk=8");
  EXPECT_EQ(w.name, "conditional-full");
  ASSERT_EQ(w.params.size(), 1u);
  EXPECT_EQ(w.params[0].first, "length_limit");
  EXPECT_EQ(w.inner, "improved-clustered:clusters=100,topk=8");
  // An inner spec without parameters, and one right after ':'.
  EXPECT_EQ(parse_spec("conditional-full:length_limit=4,full").inner, "full");
  Spec bare = parse_spec("conditional-full:full:scale=0.5");
  EXPECT_TRUE(bare.params.empty());
  EXPECT_EQ(bare.inner, "full:scale=0.5");
}

TEST(Spec, MalformedStringsAreErrorsThatSayWhy) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "spec is empty"},
      {":scale=1", "no attention name"},
      {"full:", "ends with ':'"},
      {"full:=1", "has no name before '='"},
      {"full:scale=", "'scale' has no value after '='"},
      {"full:scale=1,scale=2", "'scale' is given twice"},
      {"full:scale=1,", "ends with ','"},
      {"full:,scale=1", "empty parameter"},
      {"full:scale=1,,x=2", "empty parameter"},
      {"full :scale=1", "whitespace"},
      {"full:scale= 1", "whitespace"},
      {"full:scale=1\t", "whitespace"},
      {"full:a=b=c", "more than one '='"},
  };
  for (const auto& [bad, why] : cases) {
    const std::string msg = error_of_call([&bad = bad] { parse_spec(bad); });
    EXPECT_FALSE(msg.empty()) << "'" << bad << "' parsed";
    EXPECT_HAS(msg, why);
    if (!bad.empty()) EXPECT_HAS(msg, "'" + bad + "'");  // the whole spec is quoted back
  }
}

TEST(SpecReader, TypedReads) {
  Spec s = parse_spec("x:f=0.125,i=42,b=false,e=1e-3,c=lsh,n=-7,t=1,z=0");
  SpecReader r(s);
  EXPECT_DOUBLE_EQ(r.get_float("f", 0, 0, 1), 0.125);
  EXPECT_EQ(r.get_int("i", 0, 0, 100), 42);
  EXPECT_FALSE(r.get_bool("b", true));
  EXPECT_DOUBLE_EQ(r.get_float("e", 0, 0, 1), 1e-3);
  EXPECT_EQ(r.get_choice("c", "x", {"lsh", "positional"}), "lsh");
  EXPECT_EQ(r.get_int("n", 0, -10, 10), -7);
  EXPECT_TRUE(r.get_bool("t", false));
  EXPECT_FALSE(r.get_bool("z", true));
  EXPECT_TRUE(r.has("f"));
  EXPECT_FALSE(r.has("missing"));
  // Absent keys give the default, even one outside the range (a factory's "unset" marker).
  EXPECT_EQ(r.get_int("missing", 7, 0, 10), 7);
  EXPECT_DOUBLE_EQ(r.get_float("unset", 0.0, 1e-6, 1e6), 0.0);
  EXPECT_TRUE(r.get_bool("absent", true));
  EXPECT_NO_THROW(r.finish());
}

TEST(SpecReader, BadValuesAreErrorsThatSayWhy) {
  Spec t = parse_spec(
      "x:i=1.5,h=0x10,e=1e3,f=abc,g=0.5x,nan=nan,inf=inf,b=yes,B=TRUE,r=11,big=99999999999999999999,"
      "tiny=1e-400,huge=1e400,c=kmeans");
  SpecReader q(t);
  auto err = [](auto&& f) { return error_of_call(f); };
  EXPECT_HAS(err([&] { q.get_int("i", 0, 0, 10); }), "i must be an integer, got '1.5'");
  EXPECT_HAS(err([&] { q.get_int("h", 0, 0, 100); }), "h must be an integer, got '0x10'");
  EXPECT_HAS(err([&] { q.get_int("e", 0, 0, 10000); }), "e must be an integer, got '1e3'");
  EXPECT_HAS(err([&] { q.get_float("f", 0, 0, 10); }), "f must be a number, got 'abc'");
  EXPECT_HAS(err([&] { q.get_float("g", 0, 0, 10); }), "g must be a number, got '0.5x'");
  EXPECT_HAS(err([&] { q.get_float("nan", 0, 0, 10); }), "nan must be a number, got 'nan'");
  EXPECT_HAS(err([&] { q.get_float("inf", 0, 0, 10); }), "inf must be a number, got 'inf'");
  EXPECT_HAS(err([&] { q.get_bool("b", false); }), "b must be true or false (or 1 or 0), got 'yes'");
  EXPECT_HAS(err([&] { q.get_bool("B", false); }), "got 'TRUE'");
  EXPECT_HAS(err([&] { q.get_int("r", 0, 0, 10); }), "r must be in [0, 10], got 11");
  EXPECT_HAS(err([&] { q.get_int("big", 0, 0, 10); }), "big must be in [0, 10], got 99999999999999999999");
  EXPECT_HAS(err([&] { q.get_float("tiny", 1, 1e-6, 1e6); }), "tiny must be in [1e-06, 1e+06], got 1e-400");
  EXPECT_HAS(err([&] { q.get_float("huge", 1, 1e-6, 1e6); }), "huge must be in [1e-06, 1e+06], got 1e400");
  EXPECT_HAS(err([&] { q.get_choice("c", "lsh", {"lsh", "positional"}); }),
             "c must be one of lsh, positional, got 'kmeans'");
  EXPECT_HAS(err([&] { q.get_int("r", 0, 0, 10); }), "spec '" + t.text + "'");
}

TEST(SpecReader, FinishListsUnknownAndAccepted) {
  Spec s = parse_spec("x:a=1,foo=2,bar=3");
  SpecReader r(s);
  r.get_int("a", 0, 0, 10);
  r.get_int("a", 0, 0, 10);  // read twice, listed once
  r.get_bool("flag", false);
  EXPECT_EQ(error_of_call([&] { r.finish(); }),
            "spec 'x:a=1,foo=2,bar=3': unknown parameters 'foo', 'bar'; x accepts: a, flag");
}

TEST(Registry, ErrorsListWhatIsAccepted) {
  EXPECT_HAS(error_of("fulll"), "unknown attention 'fulll'");
  for (const VariantInfo& v : registered_attentions()) EXPECT_HAS(error_of("fulll"), v.name);
  EXPECT_HAS(error_of("fulll"), "registered: full, ");
  EXPECT_EQ(error_of("full:foo=1"), "spec 'full:foo=1': unknown parameter 'foo'; full accepts: scale");
  EXPECT_EQ(error_of("full:scale=-1"), "spec 'full:scale=-1': scale must be in [1e-06, 1e+06], got -1");
  EXPECT_HAS(error_of("linear:x=1"), "linear accepts: no parameters");
  EXPECT_HAS(error_of("full:scale=0.1,clustered:clusters=3"), "not a key=value");
  EXPECT_HAS(error_of("full:scale"), "not a key=value");
  EXPECT_HAS(error_of("clustered"), "clusters is required");
  // A wrapper's parameter without '=' is reported against the spec the user wrote.
  EXPECT_HAS(error_of("conditional-full:length_limit"),
             "spec 'conditional-full:length_limit': 'length_limit' is neither a key=value parameter");
  EXPECT_HAS(error_of("conditional-full:length_limit=4,fulll"), "unknown attention 'fulll'");
  EXPECT_HAS(error_of("conditional-full:length_limit=4,full:foo=1"), "unknown parameter 'foo'");
}

// A slip names the nearest valid name; a misspelt required key is named as misspelt, not missing.
TEST(Registry, ErrorsNameTheNearestVariantOrParameter) {
  EXPECT_HAS(error_of("clustered:cluster=10"), "unknown parameter 'cluster' (did you mean 'clusters'?)");
  EXPECT_EQ(error_of("clustered:cluster=10").find("is required"), std::string::npos);
  EXPECT_HAS(error_of("clusterd"), "unknown attention 'clusterd' in spec 'clusterd' (did you mean 'clustered'?)");
  EXPECT_HAS(error_of("conditional-full:length_limit=4,ful"), "(did you mean 'full'?");
  EXPECT_HAS(error_of("clustered:clusters=4,clustering=lhs"), "got 'lhs' (did you mean 'lsh'?)");
  EXPECT_HAS(error_of("clustered:bits=8"), "clusters is required (e.g. clustered:clusters=100)");
  EXPECT_EQ(did_you_mean("xyzzy", {"full", "local"}), "");
  EXPECT_EQ(did_you_mean("topk", {"topk", "topq"}), " (did you mean 'topk'?)");
  EXPECT_EQ(nearest_names("--lenghts", {"--lengths", "--heads"}), std::vector<std::string>{"--lengths"});
  // One edit beyond the limit is not a slip: "bar" is 2 from "a", and 3 letters allow 1.
  EXPECT_TRUE(nearest_names("bar", {"a", "flag"}).empty());
}

// registered_attentions() lists each parameter as its factory reads it.
TEST(Registry, ListsParametersWithDefaultsAndRanges) {
  for (const VariantInfo& v : registered_attentions()) {
    if (v.name == "clustered") {
      ASSERT_GE(v.parameters.size(), 3u);
      EXPECT_EQ(v.parameters[0].key, "clusters");
      EXPECT_TRUE(v.parameters[0].required);
      EXPECT_EQ(v.parameters[0].default_value, "");
      const SpecParam& bits = v.parameters[1];
      EXPECT_EQ(bits.key, "bits");
      EXPECT_EQ(bits.type, "int");
      EXPECT_EQ(bits.default_value, "63");
      EXPECT_EQ(bits.range, "[1, 64]");
      EXPECT_TRUE(v.capabilities.causal);
    }
    if (v.name == "linear") {
      EXPECT_TRUE(v.parameters.empty());
    }
    if (v.name == "full") {
      ASSERT_EQ(v.parameters.size(), 1u);
      EXPECT_EQ(v.parameters[0].default_value, "1/sqrt(Dk)");
    }
  }
}

TEST(Registry, BuildsEveryVariant) {
  EXPECT_EQ(make_attention("full")->name(), "full");
  EXPECT_NE(make_attention("full:scale=0.125")->name().find("scale=0.125"), std::string::npos);
  EXPECT_NE(make_attention("conditional-full:length_limit=4,full")->name().find("full"), std::string::npos);
  for (const VariantInfo& v : registered_attentions()) {
    EXPECT_FALSE(v.summary.empty()) << v.name;
    const std::string& spec = v.example;
    EXPECT_EQ(parse_spec(spec).name, v.name);
    auto a = make_attention(spec);
    // The canonical name parses back to an equivalent variant.
    EXPECT_EQ(make_attention(a->name())->name(), a->name()) << spec;
  }
}

}  // namespace
}  // namespace clattn

namespace clattn {
namespace {

// A deeply nested wrapper is refused at the first level, never a stack overflow.
TEST(Spec, NestedConditionalFullIsRefused) {
  std::string spec = "full";
  for (int i = 0; i < 8000; ++i) spec = "conditional-full:length_limit=4," + spec;  // past the depth that crashed
  EXPECT_THROW(make_attention(spec), Error);
  EXPECT_THROW(make_attention("conditional-full:length_limit=4,conditional-full:length_limit=8,full"), Error);
  EXPECT_NO_THROW(make_attention("conditional-full:length_limit=4,full"));
}

}  // namespace
}  // namespace clattn
