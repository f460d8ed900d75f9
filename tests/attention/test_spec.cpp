// Spec strings and the registry: good specs parse, every malformed one is an Error that says why.
#include <gtest/gtest.h>

#include <string>

#include "clattn/attention.h"
#include "clattn/spec.h"

namespace clattn {
namespace {

std::string error_of(const std::string& text) {
  try {
    make_attention(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Spec, Parses) {
  Spec s = parse_spec("improved-clustered:clusters=100,topk=32");
  EXPECT_EQ(s.name, "improved-clustered");
  ASSERT_EQ(s.params.size(), 2u);
  EXPECT_EQ(s.params[1].first, "topk");
  EXPECT_EQ(s.params[1].second, "32");
  EXPECT_TRUE(s.inner.empty());
  Spec w = parse_spec("conditional-full:length_limit=512,improved-clustered:clusters=100,topk=8");
  EXPECT_EQ(w.params.size(), 1u);
  EXPECT_EQ(w.inner, "improved-clustered:clusters=100,topk=8");
  EXPECT_EQ(parse_spec("full").params.size(), 0u);
}

TEST(Spec, MalformedStringsAreErrors) {
  for (const char* bad : {"", ":scale=1", "full:", "full:=1", "full:scale=",
                          "full:scale=1,scale=2", "full:scale=1,", "full :scale=1", "full:a=b=c"})
    EXPECT_THROW(parse_spec(bad), Error) << "'" << bad << "'";
}

TEST(Spec, TypedReads) {
  Spec s = parse_spec("x:f=0.125,i=42,b=false,e=1e-3,c=lsh");
  SpecReader r(s);
  EXPECT_DOUBLE_EQ(r.get_float("f", 0, 0, 1), 0.125);
  EXPECT_EQ(r.get_int("i", 0, 0, 100), 42);
  EXPECT_FALSE(r.get_bool("b", true));
  EXPECT_DOUBLE_EQ(r.get_float("e", 0, 0, 1), 1e-3);
  EXPECT_EQ(r.get_choice("c", "x", {"lsh", "positional"}), "lsh");
  EXPECT_EQ(r.get_int("missing", 7, 0, 10), 7);
  EXPECT_NO_THROW(r.finish());
  Spec t = parse_spec("x:i=1.5,f=abc,b=yes,r=11,c=kmeans");
  SpecReader q(t);
  EXPECT_THROW(q.get_int("i", 0, 0, 10), Error);
  EXPECT_THROW(q.get_float("f", 0, 0, 10), Error);
  EXPECT_THROW(q.get_bool("b", false), Error);
  EXPECT_THROW(q.get_int("r", 0, 0, 10), Error);
  EXPECT_THROW(q.get_choice("c", "lsh", {"lsh", "positional"}), Error);
}

TEST(Registry, ErrorsListWhatIsAccepted) {
  EXPECT_NE(error_of("fulll").find("registered: full"), std::string::npos) << error_of("fulll");
  EXPECT_NE(error_of("full:foo=1").find("unknown parameter 'foo'; full accepts: scale"), std::string::npos)
      << error_of("full:foo=1");
  EXPECT_NE(error_of("full:scale=-1").find("scale must be in"), std::string::npos) << error_of("full:scale=-1");
  EXPECT_NE(error_of("full:scale=0.1,clustered:clusters=3").find("not a key=value"), std::string::npos);
  EXPECT_NE(error_of("clustered").find("clusters is required"), std::string::npos);
  EXPECT_NE(error_of("full:scale").find("not a key=value"), std::string::npos) << error_of("full:scale");
}

TEST(Registry, BuildsEveryVariant) {
  EXPECT_EQ(make_attention("full")->name(), "full");
  EXPECT_NE(make_attention("full:scale=0.125")->name().find("scale=0.125"), std::string::npos);
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
