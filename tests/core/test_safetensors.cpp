// Safetensors: round trips, half-precision decoding, and every malformed file is an Error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <unistd.h>

#include "clattn/safetensors.h"

namespace clattn {
namespace {

std::string tmp_path(const std::string& name) { return ::testing::TempDir() + "clattn_st_" + name; }

// Writes an 8-byte length + header + data exactly as given.
std::string raw_file(const std::string& name, const std::string& header, const std::string& data,
                     uint64_t len_override = 0) {
  const std::string p = tmp_path(name);
  std::ofstream f(p, std::ios::binary);
  const uint64_t len = len_override ? len_override : header.size();
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>((len >> (8 * i)) & 0xFF));
  f << header << data;
  return p;
}

std::string open_error(const std::string& path) {
  try {
    SafetensorsFile::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, RoundTrip) {
  Tensor a(Shape{2, 3, 4});
  for (int64_t i = 0; i < a.numel(); ++i) a.data()[i] = static_cast<float>(i) - 7.5f;
  Tensor empty(Shape{0, 3});
  Tensor big(Shape{4, 6});
  for (int64_t i = 0; i < big.numel(); ++i) big.data()[i] = static_cast<float>(i);
  View strided = big.view();  // every other column: (4, 3) with stride 2
  strided.shape = Shape{4, 3};
  strided.strides = {6, 2};
  SafetensorsWriter w;
  w.add("a", a.view());
  w.add("empty", empty.view());
  w.add("strided", strided);
  const int32_t lens[] = {3, 0, 7};
  w.add_i32("lens", {3}, lens);
  w.set_metadata("who", "test");
  const std::string p = tmp_path("rt.safetensors");
  w.write(p);
  w.write(p);  // overwriting works
  EXPECT_FALSE(std::filesystem::exists(p + ".tmp." + std::to_string(::getpid())));
  SafetensorsFile f = SafetensorsFile::open(p);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "empty", "lens", "strided"}));
  Tensor b = f.get_f32("a");
  EXPECT_EQ(b.shape(), a.shape());
  for (int64_t i = 0; i < a.numel(); ++i) EXPECT_EQ(a.data()[i], b.data()[i]);
  EXPECT_EQ(f.get_f32("empty").numel(), 0);
  Tensor s = f.get_f32("strided");
  EXPECT_EQ(s.shape(), (Shape{4, 3}));
  EXPECT_EQ(s.data()[4], 8.f);  // row 1, col 1 -> big[1][2]
  EXPECT_EQ(f.get_i32("lens"), (std::vector<int32_t>{3, 0, 7}));
  EXPECT_EQ(f.metadata().at("who"), "test");
  EXPECT_THROW(f.get_f32("lens"), Error);
  EXPECT_THROW(f.get_i32("a"), Error);
  EXPECT_THROW(f.get_f32("nope"), Error);
  EXPECT_THROW(w.add("a", a.view()), Error);
  EXPECT_THROW(w.add("", a.view()), Error);
}

TEST(Safetensors, HalfPrecision) {
  // 1.0, -2.5, 65504, smallest subnormal, +inf, NaN as F16; 1.0, -2.5 as BF16.
  const uint16_t f16[] = {0x3C00, 0xC100, 0x7BFF, 0x0001, 0x7C00, 0x7E00};
  const uint16_t bf16[] = {0x3F80, 0xC020};
  std::string d16(reinterpret_cast<const char*>(f16), sizeof f16), db(reinterpret_cast<const char*>(bf16), sizeof bf16);
  const std::string p = raw_file("half.safetensors",
                                 R"({"h":{"dtype":"F16","shape":[6],"data_offsets":[0,12]},"b":{"dtype":"BF16","shape":[2],"data_offsets":[12,16]}})",
                                 d16 + db);
  SafetensorsFile f = SafetensorsFile::open(p);
  Tensor h = f.get_f32("h"), b = f.get_f32("b");
  EXPECT_EQ(h.data()[0], 1.f);
  EXPECT_EQ(h.data()[1], -2.5f);
  EXPECT_EQ(h.data()[2], 65504.f);
  EXPECT_EQ(h.data()[3], std::ldexp(1.f, -24));
  EXPECT_EQ(h.data()[4], std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(h.data()[5]));
  EXPECT_EQ(b.data()[0], 1.f);
  EXPECT_EQ(b.data()[1], -2.5f);
}

TEST(Safetensors, MalformedFilesAreErrors) {
  const std::string ok = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string data(8, '\0');
  EXPECT_EQ(open_error(raw_file("fine", ok, data)), "");
  struct Case {
    std::string name, header, data, needle;
    uint64_t len = 0;
  };
  const Case cases[] = {
      {"short", "", "", "shorter than"},
      {"zero_len", "", "xxxxxxxx", "absurd", 0},
      {"huge_len", ok, data, "absurd", 1ull << 40},
      {"past_end", ok, data, "past the end", 100000},
      {"not_json", "{not json", data, "not valid JSON"},
      {"not_object", "[1,2]", data, "must be a JSON object"},
      {"no_dtype", R"({"t":{"shape":[2],"data_offsets":[0,8]}})", data, "dtype"},
      {"bad_dtype", R"({"t":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", data, "unknown dtype"},
      {"neg_dim", R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data, "shape entries"},
      {"bad_offsets", R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8]}})", data, "data_offsets"},
      {"reversed", R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", data, "begin"},
      {"truncated", R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", data, "beyond the data buffer"},
      {"wrong_size", R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data, "needs 12"},
      {"overlap", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data, "overlap"},
      {"huge_shape", R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", data, "too many elements"},
      {"bad_meta", R"({"__metadata__":{"a":1}})", data, "not a string"},
  };
  for (const Case& c : cases) {
    const std::string p = c.name == "short" ? tmp_path("short") : raw_file(c.name, c.header, c.data, c.len);
    if (c.name == "short") std::ofstream(p, std::ios::binary) << "abc";
    if (c.name == "zero_len") {
      std::ofstream f(p, std::ios::binary);
      f << std::string(8, '\0') << "xxxxxxxx";
    }
    const std::string e = open_error(p);
    EXPECT_NE(e.find(c.needle), std::string::npos) << c.name << ": '" << e << "'";
    EXPECT_NE(e.find(p), std::string::npos) << c.name << ": message should name the file: " << e;
  }
  EXPECT_NE(open_error(tmp_path("does_not_exist")).find("cannot open"), std::string::npos);
}

TEST(Safetensors, WriteFailureIsAnError) {
  SafetensorsWriter w;
  Tensor a(Shape{2});
  w.add("a", a.view());
  EXPECT_THROW(w.write("/nonexistent-dir/x.safetensors"), Error);
}

}  // namespace
}  // namespace clattn
