// Safetensors: round trips through the writer, the byte layout it writes, half-precision decoding
// (hand-computed bit patterns and all 65536 F16 values against an ldexp oracle), unaligned data,
// and every malformed file the reader must refuse with an Error naming the file and the rule.
// A sweep of truncated and byte-corrupted files checks that nothing a header says leads to a crash
// or an out-of-bounds read (run under ASan + UBSan to make that check bite).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "clattn/error.h"
#include "clattn/safetensors.h"
#include "clattn/tensor.h"

namespace clattn {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}

template <class T>
std::string bytes_of(const std::vector<T>& v) {
  std::string s(v.size() * sizeof(T), '\0');
  if (!v.empty()) std::memcpy(s.data(), v.data(), s.size());
  return s;
}

// A safetensors file image: length, header exactly as given (no padding), data.
std::string image(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The message of the Error that open() throws, "" when it opens. Any other exception is a failure:
// the contract is that everything wrong with a file is a clattn::Error.
std::string open_error(const std::string& path) {
  try {
    SafetensorsFile::open(path);
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "non-Error exception for " << path << ": " << e.what();
    return "non-Error exception";
  }
  return "";
}

// Ramp values so every element differs and misplaced data shows.
Tensor ramp(const Shape& s, float start = -7.5f) {
  Tensor t(s);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = start + 0.25f * static_cast<float>(i);
  return t;
}

void expect_same(const Tensor& got, ConstView want) {
  ASSERT_EQ(got.shape(), want.shape);
  const Tensor w = Tensor::from(want);
  for (int64_t i = 0; i < w.numel(); ++i) EXPECT_EQ(got.data()[i], w.data()[i]) << "at " << i;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* t = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           (std::string("clattn_st_") + std::to_string(::getpid()) + "_" + t->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::string write_raw(const std::string& name, const std::string& bytes) const {
    const std::string p = path(name);
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p;
  }

  // Files an atomic write left behind (.NAME.clattn-tmp-XXXXXX).
  std::vector<std::string> leftovers() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path().filename().string().find(".clattn-tmp-") != std::string::npos) out.push_back(e.path());
    return out;
  }

  fs::path dir_;
};

// ---------------------------------------------------------------------------------------------
// Round trips

TEST_F(SafetensorsTest, RoundTripF32Shapes) {
  const std::vector<Shape> shapes = {Shape{2, 3, 4}, Shape{1},    Shape{0, 3}, Shape{},
                                     Shape{7},       Shape{3, 0}, Shape{1, 2, 1, 3, 1, 2}};
  SafetensorsWriter w;
  std::vector<Tensor> ts;
  for (size_t i = 0; i < shapes.size(); ++i) {
    ts.push_back(ramp(shapes[i], static_cast<float>(i)));
    w.add(std::string("t") + std::to_string(i), ts.back().view());
  }
  const std::string p = path("f32.safetensors");
  w.write(p);
  const SafetensorsFile f = SafetensorsFile::open(p);
  EXPECT_EQ(f.path(), p);
  ASSERT_EQ(f.names().size(), shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    const std::string name = std::string("t") + std::to_string(i);
    SCOPED_TRACE(name + " " + shapes[i].str());
    ASSERT_TRUE(f.has(name));
    const TensorInfo& in = f.info(name);
    EXPECT_EQ(in.dtype, DType::F32);
    EXPECT_EQ(in.shape, std::vector<int64_t>(shapes[i].dims.begin(), shapes[i].dims.begin() + shapes[i].rank));
    EXPECT_EQ(in.end - in.begin, static_cast<uint64_t>(shapes[i].numel()) * 4);
    const Tensor got = f.get_f32(name);
    EXPECT_EQ(got.rank(), shapes[i].rank);
    expect_same(got, ts[i].view());
  }
  EXPECT_EQ(f.get_f32("t3").numel(), 1);  // rank 0 holds one element
  EXPECT_TRUE(f.metadata().empty());
}

TEST_F(SafetensorsTest, RoundTripKeepsSpecialFloats) {
  Tensor t(Shape{6});
  const float vals[] = {0.f, -0.f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                        std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max()};
  std::memcpy(t.data(), vals, sizeof vals);
  SafetensorsWriter w;
  w.add("x", t.view());
  const std::string p = path("special.safetensors");
  w.write(p);
  const Tensor got = SafetensorsFile::open(p).get_f32("x");
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(std::bit_cast<uint32_t>(got.data()[i]), std::bit_cast<uint32_t>(vals[i])) << i;
}

TEST_F(SafetensorsTest, RoundTripNonContiguousViews) {
  Tensor big = ramp(Shape{4, 6});
  const View cols{big.data(), Shape{4, 3}, {6, 2}};        // every other column
  const View transposed{big.data(), Shape{6, 4}, {1, 6}};
  ConstView broadcast{big.data() + 6, Shape{3, 6}, {0, 1}};  // row 1 repeated three times
  ConstView one_dim_odd_stride{big.data(), Shape{1, 6}, {99, 1}};  // contiguous despite stride 99
  ASSERT_FALSE(cols.contiguous());
  ASSERT_FALSE(transposed.contiguous());
  ASSERT_TRUE(one_dim_odd_stride.contiguous());
  SafetensorsWriter w;
  w.add("cols", cols);
  w.add("transposed", transposed);
  w.add("broadcast", broadcast);
  w.add("row0", one_dim_odd_stride);
  const std::string p = path("views.safetensors");
  w.write(p);
  const SafetensorsFile f = SafetensorsFile::open(p);
  expect_same(f.get_f32("cols"), cols);
  expect_same(f.get_f32("transposed"), transposed);
  expect_same(f.get_f32("broadcast"), broadcast);
  expect_same(f.get_f32("row0"), one_dim_odd_stride);
  // Spot checks against the source, not through Tensor::from, in case both were wrong alike.
  EXPECT_EQ(f.get_f32("cols").data()[4], big.data()[1 * 6 + 2]);        // (1, 1) -> big[1][2]
  EXPECT_EQ(f.get_f32("transposed").data()[1 * 4 + 2], big.data()[2 * 6 + 1]);  // (1, 2) -> big[2][1]
  EXPECT_EQ(f.get_f32("broadcast").data()[2 * 6 + 5], big.data()[6 + 5]);
}

TEST_F(SafetensorsTest, RoundTripI32AndMetadata) {
  const std::vector<int32_t> lens = {3, 0, 7};
  const std::vector<int32_t> grid = {std::numeric_limits<int32_t>::min(), -1, 0, std::numeric_limits<int32_t>::max()};
  SafetensorsWriter w;
  w.add_i32("lens", {3}, lens);
  w.add_i32("grid", {2, 2}, grid);
  w.add_i32("none", {0, 5}, {});
  w.add_i32("scalar", {}, std::vector<int32_t>{42});
  w.set_metadata("format", "pt");
  w.set_metadata("empty", "");
  w.set_metadata("unicode", "d\xC3\xA9j\xC3\xA0 vu \xE2\x9C\x93");
  w.set_metadata("format", "clattn");  // set again: replaced
  const std::string p = path("i32.safetensors");
  w.write(p);
  const SafetensorsFile f = SafetensorsFile::open(p);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"grid", "lens", "none", "scalar"}));
  EXPECT_EQ(f.get_i32("lens"), lens);
  EXPECT_EQ(f.get_i32("grid"), grid);
  EXPECT_EQ(f.info("grid").shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(f.info("grid").dtype, DType::I32);
  EXPECT_TRUE(f.get_i32("none").empty());
  EXPECT_EQ(f.info("none").shape, (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(f.get_i32("scalar"), std::vector<int32_t>{42});
  EXPECT_TRUE(f.info("scalar").shape.empty());
  const std::map<std::string, std::string> want = {
      {"empty", ""}, {"format", "clattn"}, {"unicode", "d\xC3\xA9j\xC3\xA0 vu \xE2\x9C\x93"}};
  EXPECT_EQ(f.metadata(), want);
  EXPECT_FALSE(f.has("__metadata__"));
}

TEST_F(SafetensorsTest, EmptyWriterWritesAValidFile) {
  const std::string p = path("empty.safetensors");
  SafetensorsWriter().write(p);
  const SafetensorsFile f = SafetensorsFile::open(p);
  EXPECT_TRUE(f.names().empty());
  EXPECT_EQ(fs::file_size(p) % 8, 0u);
}

// The bytes on disk: padded header, sorted names, contiguous offsets, as the HF writer lays out.
TEST_F(SafetensorsTest, WrittenLayout) {
  SafetensorsWriter w;
  w.add("zeta", ramp(Shape{3}).view());
  w.add_i32("alpha", {2}, std::vector<int32_t>{1, 2});
  w.add("mid", ramp(Shape{2, 2}).view());
  w.add("empty", Tensor(Shape{0}).view());
  w.set_metadata("k", "v");
  const std::string p = path("layout.safetensors");
  w.write(p);
  const std::string raw = slurp(p);
  ASSERT_GE(raw.size(), 8u);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = hlen << 8 | static_cast<uint8_t>(raw[static_cast<size_t>(i)]);
  EXPECT_EQ(hlen % 8, 0u);
  ASSERT_LE(8 + hlen, raw.size());
  const std::string header = raw.substr(8, hlen);
  const size_t last = header.find_last_not_of(' ');
  ASSERT_NE(last, std::string::npos);
  EXPECT_EQ(header[last], '}');
  EXPECT_LT(header.size() - last - 1, 8u) << "padding is fewer than 8 spaces";
  const nlohmann::json j = nlohmann::json::parse(header);
  EXPECT_EQ(j.at("__metadata__").at("k"), "v");
  uint64_t off = 0;
  for (const char* name : {"alpha", "empty", "mid", "zeta"}) {  // sorted name order
    SCOPED_TRACE(name);
    ASSERT_TRUE(j.contains(name));
    EXPECT_EQ(j.at(name).at("dtype"), std::string(name) == "alpha" ? "I32" : "F32");
    EXPECT_EQ(j.at(name).at("data_offsets").at(0).get<uint64_t>(), off);
    off = j.at(name).at("data_offsets").at(1).get<uint64_t>();
  }
  EXPECT_EQ(8 + hlen + off, raw.size()) << "data buffer is exactly the tensors, no gaps, no tail";
  float z0;
  std::memcpy(&z0, raw.data() + 8 + hlen + j.at("zeta").at("data_offsets").at(0).get<uint64_t>(), 4);
  EXPECT_EQ(z0, -7.5f);  // little-endian F32 on disk
}

// ---------------------------------------------------------------------------------------------
// Atomic writing

TEST_F(SafetensorsTest, OverwriteIsAtomicAndLeavesNoTempFile) {
  const std::string p = path("model.safetensors");
  SafetensorsWriter w1;
  w1.add("a", ramp(Shape{4}).view());
  w1.write(p);
  EXPECT_TRUE(leftovers().empty());
  const SafetensorsFile before = SafetensorsFile::open(p);  // a reader holding the old file

  SafetensorsWriter w2;
  w2.add("b", ramp(Shape{2, 5}, 100.f).view());
  w2.write(p);
  EXPECT_TRUE(leftovers().empty());
  const SafetensorsFile after = SafetensorsFile::open(p);
  EXPECT_EQ(after.names(), std::vector<std::string>{"b"});
  EXPECT_EQ(after.get_f32("b").data()[9], 100.f + 0.25f * 9);
  // The old mapping still sees the old contents: rename replaced the file, it did not rewrite it.
  EXPECT_EQ(before.names(), std::vector<std::string>{"a"});
  EXPECT_EQ(before.get_f32("a").data()[3], -7.5f + 0.75f);
}

// A symlink planted where the old writer put its predictable temporary file is never followed, a
// symlink at the target is replaced (not written through), and non-regular targets are refused.
TEST_F(SafetensorsTest, OutputCannotBeHijacked) {
  const std::string victim = path("victim.txt");
  std::ofstream(victim) << "precious";
  const std::string p = path("out.safetensors");
  fs::create_symlink(victim, p + ".tmp." + std::to_string(::getpid()));
  SafetensorsWriter w;
  w.add("a", ramp(Shape{3}).view());
  w.write(p);
  std::ifstream in(victim);
  std::string text;
  in >> text;
  EXPECT_EQ(text, "precious");
  // A symlink at the target itself is replaced by the new file; its target is untouched.
  const std::string link = path("link.safetensors");
  fs::create_symlink(victim, link);
  w.write(link);
  EXPECT_FALSE(fs::is_symlink(link));
  std::ifstream in2(victim);
  in2 >> text;
  EXPECT_EQ(text, "precious");
  for (const std::string& bad : {dir_.string(), std::string("/dev/null")}) {
    try {
      w.write(bad);
      ADD_FAILURE() << "wrote to " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(leftovers().empty());
}

TEST_F(SafetensorsTest, CannotCreateNamesPathAndErrno) {
  SafetensorsWriter w;
  w.add("a", ramp(Shape{2}).view());
  const std::string p = path("no/such/dir/x.safetensors");
  try {
    w.write(p);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(p));
    EXPECT_THAT(e.what(), HasSubstr("cannot create"));
    EXPECT_THAT(e.what(), HasSubstr(std::strerror(ENOENT)));
  }
}

TEST_F(SafetensorsTest, DirectoryTargetIsRefusedBeforeAnyWrite) {
  const std::string p = path("is_a_dir");
  fs::create_directories(fs::path(p) / "child");
  SafetensorsWriter w;
  w.add("a", ramp(Shape{2}).view());
  try {
    w.write(p);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("not a regular file (a directory)"));
    EXPECT_THAT(e.what(), HasSubstr(p));
  }
  EXPECT_TRUE(leftovers().empty());
  EXPECT_TRUE(fs::is_directory(p));
}

// A write that fails half-way (here: the file size limit, EFBIG) throws, removes its temporary
// file and leaves the previous file intact.
TEST_F(SafetensorsTest, FailedWriteKeepsOldFile) {
  const std::string p = path("keep.safetensors");
  SafetensorsWriter small;
  small.add("old", ramp(Shape{3}).view());
  small.write(p);

  SafetensorsWriter big;
  big.add("new", Tensor(Shape{64, 1024}).view());  // 256 KiB, over the limit below
  rlimit old_lim{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_lim), 0);
  if (old_lim.rlim_max != RLIM_INFINITY && old_lim.rlim_max < 4096) GTEST_SKIP() << "hard limit too low";
  const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);  // get EFBIG instead of being killed
  rlimit lim = old_lim;
  lim.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  std::string msg;
  try {
    big.write(p);
  } catch (const Error& e) {
    msg = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_lim);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_THAT(msg, HasSubstr("cannot write"));
  EXPECT_THAT(msg, HasSubstr(p));
  EXPECT_THAT(msg, HasSubstr(std::strerror(EFBIG)));
  EXPECT_TRUE(leftovers().empty());
  const SafetensorsFile f = SafetensorsFile::open(p);
  EXPECT_EQ(f.names(), std::vector<std::string>{"old"});
}

TEST_F(SafetensorsTest, WriterRejectsBadNamesAndShapes) {
  SafetensorsWriter w;
  const Tensor a = ramp(Shape{2});
  w.add("a", a.view());
  auto msg = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_THAT(msg([&] { w.add("", a.view()); }), HasSubstr("must not be empty"));
  EXPECT_THAT(msg([&] { w.add("a", a.view()); }), HasSubstr("added twice"));
  EXPECT_THAT(msg([&] { w.add_i32("a", {1}, std::vector<int32_t>{1}); }), HasSubstr("added twice"));
  EXPECT_THAT(msg([&] { w.add_i32("", {1}, std::vector<int32_t>{1}); }), HasSubstr("must not be empty"));
  EXPECT_THAT(msg([&] { w.add("__metadata__", a.view()); }), HasSubstr("reserved"));
  EXPECT_THAT(msg([&] { w.add("bad\xFF", a.view()); }), HasSubstr("UTF-8"));
  EXPECT_THAT(msg([&] { w.set_metadata("k", "\xC3"); }), HasSubstr("UTF-8"));
  EXPECT_THAT(msg([&] { w.add_i32("n", {2, 2}, std::vector<int32_t>{1, 2, 3}); }),
              HasSubstr("3 values for a shape of 4"));
  EXPECT_THAT(msg([&] { w.add_i32("n", {-1}, {}); }), HasSubstr("dims must be >= 0"));
  EXPECT_THAT(msg([&] { w.add_i32("n", {1ll << 40, 1ll << 40}, {}); }), HasSubstr("overflows"));
  EXPECT_THAT(msg([&] { w.add("v", ConstView{}); }), HasSubstr("no data"));
  EXPECT_EQ(msg([&] { w.add("v0", ConstView{nullptr, Shape{0, 4}, {4, 1}}); }), "");  // empty is fine
  // Failed adds left nothing behind.
  const std::string p = path("after_errors.safetensors");
  w.write(p);
  EXPECT_EQ(SafetensorsFile::open(p).names(), (std::vector<std::string>{"a", "v0"}));
}

// ---------------------------------------------------------------------------------------------
// Reading: dtypes, conversions, getters

TEST_F(SafetensorsTest, F16AndBF16HandPatterns) {
  const float inf = std::numeric_limits<float>::infinity();
  // F16: 1.0, -2.5, 65504 (max), 2^-24 (smallest subnormal), 1023·2^-24 (largest subnormal),
  // 2^-14 (smallest normal), -2^-24, +inf, -inf, quiet NaN, signalling NaN, -0, 0x3555 ≈ 1/3.
  const std::vector<uint16_t> f16 = {0x3C00, 0xC100, 0x7BFF, 0x0001, 0x03FF, 0x0400, 0x8001,
                                     0x7C00, 0xFC00, 0x7E00, 0x7C01, 0x8000, 0x3555};
  const std::vector<float> f16_want = {1.f, -2.5f, 65504.f, std::ldexp(1.f, -24), std::ldexp(1023.f, -24),
                                       std::ldexp(1.f, -14), -std::ldexp(1.f, -24), inf, -inf,
                                       NAN, NAN, -0.f, 0.333251953125f};
  // BF16: 1.0, -2.5, max finite (2 − 2^-7)·2^127, 2^-133 (smallest subnormal), 2^-126, +inf, -inf,
  // NaN, -0, 3.140625.
  const std::vector<uint16_t> bf16 = {0x3F80, 0xC020, 0x7F7F, 0x0001, 0x0080,
                                      0x7F80, 0xFF80, 0x7FC0, 0x8000, 0x4049};
  const std::vector<float> bf16_want = {1.f, -2.5f, std::ldexp(255.f, 120), std::ldexp(1.f, -133),
                                        std::ldexp(1.f, -126), inf, -inf, NAN, -0.f, 3.140625f};
  const std::string header =
      R"({"h":{"dtype":"F16","shape":[13],"data_offsets":[0,26]},)"
      R"("b":{"dtype":"BF16","shape":[2,5],"data_offsets":[26,46]}})";
  const std::string p = write_raw("half.safetensors", image(header, bytes_of(f16) + bytes_of(bf16)));
  const SafetensorsFile f = SafetensorsFile::open(p);
  const Tensor h = f.get_f32("h"), b = f.get_f32("b");
  EXPECT_EQ(f.info("h").dtype, DType::F16);
  EXPECT_EQ(f.info("b").dtype, DType::BF16);
  EXPECT_EQ(b.shape(), (Shape{2, 5}));
  auto same = [](float got, float want) {
    if (std::isnan(want)) return std::isnan(got);
    return got == want && std::signbit(got) == std::signbit(want);
  };
  for (size_t i = 0; i < f16.size(); ++i)
    EXPECT_TRUE(same(h.data()[i], f16_want[i])) << "F16 0x" << std::hex << f16[i] << ": " << h.data()[i];
  for (size_t i = 0; i < bf16.size(); ++i)
    EXPECT_TRUE(same(b.data()[i], bf16_want[i])) << "BF16 0x" << std::hex << bf16[i] << ": " << b.data()[i];
}

// Every F16 bit pattern against an oracle built from the definition with ldexp.
TEST_F(SafetensorsTest, F16AllPatternsMatchDefinition) {
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  const std::string header = R"({"all":{"dtype":"F16","shape":[256,256],"data_offsets":[0,131072]}})";
  const Tensor t = SafetensorsFile::open(write_raw("all.safetensors", image(header, bytes_of(all)))).get_f32("all");
  int bad = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    const int sign = static_cast<int>(i >> 15), e = static_cast<int>((i >> 10) & 31), m = static_cast<int>(i & 1023);
    double want = e == 0 ? std::ldexp(m, -24)
                  : e == 31 ? (m ? std::nan("") : HUGE_VAL)
                            : std::ldexp(1024 + m, e - 25);
    if (sign) want = -want;
    const float got = t.data()[i];
    const bool ok = std::isnan(want) ? std::isnan(got)
                                     : (got == static_cast<float>(want) && std::signbit(got) == (sign == 1));
    if (!ok && ++bad < 10) ADD_FAILURE() << "F16 0x" << std::hex << i << " -> " << got << ", want " << want;
  }
  EXPECT_EQ(bad, 0);
}

// Offsets need not be aligned: odd header length, tensors at odd offsets. UBSan flags any
// misaligned load, so this checks the reader copies bytes rather than casting pointers.
TEST_F(SafetensorsTest, UnalignedData) {
  const std::vector<uint8_t> u8 = {1, 2, 3};
  const std::vector<float> f32 = {1.5f, -3.25f};
  const std::vector<uint16_t> f16 = {0x3C00};
  const std::vector<int32_t> i32 = {-9, 123456};
  const std::vector<int64_t> i64 = {-5, 2147483647, -2147483648ll};
  const std::string data = bytes_of(u8) + bytes_of(f32) + bytes_of(f16) + bytes_of(i32) + bytes_of(i64) +
                           std::string(5, '\x7F') + bytes_of(f32);  // 5 bytes, then a tensor at odd offset 50
  std::string header =
      R"({"u":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},)"
      R"("f":{"dtype":"F32","shape":[2],"data_offsets":[3,11]},)"
      R"("h":{"dtype":"F16","shape":[1],"data_offsets":[11,13]},)"
      R"("i":{"dtype":"I32","shape":[2],"data_offsets":[13,21]},)"
      R"("l":{"dtype":"I64","shape":[3],"data_offsets":[21,45]},)"
      R"("p":{"dtype":"U8","shape":[5],"data_offsets":[45,50]},)"
      R"("after_hole":{"dtype":"F32","shape":[1,2],"data_offsets":[50,58]}})";
  if (header.size() % 2 == 0) header += ' ';  // odd header length: the data buffer starts odd too
  const SafetensorsFile f = SafetensorsFile::open(write_raw("unaligned.safetensors", image(header, data)));
  const Tensor ft = f.get_f32("f");
  EXPECT_EQ(ft.data()[0], 1.5f);
  EXPECT_EQ(ft.data()[1], -3.25f);
  EXPECT_EQ(f.get_f32("h").data()[0], 1.f);
  EXPECT_EQ(f.get_i32("i"), i32);
  EXPECT_EQ(f.get_i32("l"), (std::vector<int32_t>{-5, 2147483647, -2147483647 - 1}));
  expect_same(f.get_f32("after_hole"), make_view(f32.data(), Shape{1, 2}));
  EXPECT_EQ(f.info("u").dtype, DType::U8);
}

TEST_F(SafetensorsTest, GetterErrorsNameTensorAndDType) {
  const std::string header =
      R"({"u":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
      R"("flag":{"dtype":"BOOL","shape":[4],"data_offsets":[4,8]},)"
      R"("big":{"dtype":"I64","shape":[1],"data_offsets":[8,16]},)"
      R"("small":{"dtype":"I64","shape":[1],"data_offsets":[16,24]},)"
      R"("d":{"dtype":"F64","shape":[1],"data_offsets":[24,32]},)"
      R"("r7":{"dtype":"F32","shape":[1,1,1,1,1,1,1],"data_offsets":[32,36]}})";
  const std::string data = std::string(8, '\0') + bytes_of(std::vector<int64_t>{2147483648ll, -2147483649ll}) +
                           bytes_of(std::vector<double>{1.0}) + bytes_of(std::vector<float>{2.f});
  const std::string p = write_raw("getters.safetensors", image(header, data));
  const SafetensorsFile f = SafetensorsFile::open(p);
  auto msg = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_THAT(msg([&] { f.get_f32("u"); }), HasSubstr("'u' is U8"));
  EXPECT_THAT(msg([&] { f.get_f32("flag"); }), HasSubstr("'flag' is BOOL"));
  EXPECT_THAT(msg([&] { f.get_f32("d"); }), HasSubstr("F64"));
  EXPECT_THAT(msg([&] { f.get_f32("big"); }), HasSubstr("I64"));
  EXPECT_THAT(msg([&] { f.get_i32("d"); }), HasSubstr("'d' is F64"));
  EXPECT_THAT(msg([&] { f.get_i32("r7"); }), HasSubstr("is F32"));
  EXPECT_THAT(msg([&] { f.get_i32("big"); }), HasSubstr("2147483648 at flat index 0 does not fit"));
  EXPECT_THAT(msg([&] { f.get_i32("small"); }), HasSubstr("-2147483649 at flat index 0 does not fit"));
  EXPECT_THAT(msg([&] { f.get_f32("r7"); }), HasSubstr("rank 7"));
  EXPECT_EQ(f.info("r7").shape.size(), 7u);  // a file may hold it; only get_f32 refuses
  const std::string absent = msg([&] { f.get_f32("nope"); });
  EXPECT_THAT(absent, HasSubstr("no tensor 'nope'"));
  EXPECT_THAT(absent, HasSubstr("big, d, flag"));
  EXPECT_THAT(absent, HasSubstr(p));
  EXPECT_THAT(msg([&] { f.get_i32("nope"); }), HasSubstr("no tensor 'nope'"));
  EXPECT_THAT(msg([&] { f.info("nope"); }), HasSubstr("no tensor 'nope'"));
  for (const char* m : {"u", "flag", "big", "d", "r7"}) EXPECT_THAT(msg([&] { f.get_f32(m); }), HasSubstr(p));
}

TEST_F(SafetensorsTest, MoveTransfersTheMapping) {
  SafetensorsWriter w1, w2;
  w1.add("x", ramp(Shape{3}).view());
  w2.add("y", ramp(Shape{2}, 5.f).view());
  const std::string p1 = path("m1.safetensors"), p2 = path("m2.safetensors");
  w1.write(p1);
  w2.write(p2);
  SafetensorsFile a = SafetensorsFile::open(p1);
  SafetensorsFile b(std::move(a));
  EXPECT_EQ(b.get_f32("x").data()[2], -7.f);
  SafetensorsFile c = SafetensorsFile::open(p2);
  c = std::move(b);  // c's old mapping is released, b's moves in
  EXPECT_EQ(c.path(), p1);
  EXPECT_EQ(c.get_f32("x").data()[1], -7.25f);
  EXPECT_FALSE(c.has("y"));
  std::vector<SafetensorsFile> many;  // vector growth moves them around
  for (int i = 0; i < 5; ++i) many.push_back(SafetensorsFile::open(i % 2 ? p1 : p2));
  EXPECT_EQ(many[4].get_f32("y").data()[1], 5.25f);
}

// What the reader tolerates, knowingly: padding with spaces or NULs after the JSON (nlohmann ends
// its input at a NUL), an empty header object. (A name given twice is refused: bad_files.)
TEST_F(SafetensorsTest, LenientButSafeHeaders) {
  const std::string data = bytes_of(std::vector<float>{1.f, 2.f});
  const std::string one = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  for (const std::string& pad : {std::string(5, ' '), std::string(5, '\0'), std::string("\0junk", 5)}) {
    const SafetensorsFile g = SafetensorsFile::open(write_raw("pad.safetensors", image(one + pad, data)));
    EXPECT_EQ(g.get_f32("t").data()[1], 2.f);
  }
  EXPECT_TRUE(SafetensorsFile::open(write_raw("empty.safetensors", image("{}", ""))).names().empty());
  EXPECT_TRUE(SafetensorsFile::open(write_raw("meta.safetensors", image(R"({"__metadata__":{}})", "")))
                  .metadata()
                  .empty());
}

// ---------------------------------------------------------------------------------------------
// Malformed files

struct BadFile {
  const char* what;
  std::string bytes;
  const char* needle;       // a word of the expected message
  const char* tensor = "";  // the tensor the message must name, if any
};

std::string nested(int depth) { return std::string(static_cast<size_t>(depth), '[') + std::string(static_cast<size_t>(depth), ']'); }

std::vector<BadFile> bad_files() {
  const std::string d8(8, '\0'), d16(16, '\0');
  auto one = [](const std::string& entry) { return R"({"weight":)" + entry + "}"; };
  const std::string ok = one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})");
  return {
      {"empty file", "", "shorter than the 8-byte"},
      {"7 bytes", std::string("\x08\0\0\0\0\0\0", 7), "shorter than the 8-byte"},
      {"header length 0", le64(0) + d8, "header length 0 is absurd"},
      {"header length > 100 MB", le64((100ull << 20) + 1) + ok + d8, "is absurd"},
      {"header length 2^63", le64(1ull << 63) + ok + d8, "is absurd"},
      {"header length past the file", le64(ok.size() + 9) + ok + d8, "runs past the end"},
      {"header not JSON", image("{not json", d8), "not valid JSON"},
      {"header with trailing garbage", image(ok + "x", d8), "not valid JSON"},
      {"header cut by a NUL", image(ok.substr(0, 10) + std::string(1, '\0') + ok.substr(10), d8), "not valid JSON"},
      {"header with invalid UTF-8", image("{\"w\xFF\":1}", d8), "not valid JSON"},
      {"header is an array", image("[1,2]", d8), "must be a JSON object"},
      {"header is a number", image("42", d8), "must be a JSON object"},
      {"header nested 100k deep", image(nested(100000), d8), "must be a JSON object"},
      {"entry not an object", image(one("5"), d8), "entry must be an object", "weight"},
      {"entry nested deep", image(one(nested(50000)), d8), "entry must be an object", "weight"},
      {"no dtype", image(one(R"({"shape":[2],"data_offsets":[0,8]})"), d8), "needs a string 'dtype'", "weight"},
      {"dtype not a string", image(one(R"({"dtype":4,"shape":[2],"data_offsets":[0,8]})"), d8), "'dtype'", "weight"},
      {"no shape", image(one(R"({"dtype":"F32","data_offsets":[0,8]})"), d8), "needs an array 'shape'", "weight"},
      {"shape not an array", image(one(R"({"dtype":"F32","shape":2,"data_offsets":[0,8]})"), d8), "'shape'", "weight"},
      {"no data_offsets", image(one(R"({"dtype":"F32","shape":[2]})"), d8), "'data_offsets'", "weight"},
      {"data_offsets an object", image(one(R"({"dtype":"F32","shape":[2],"data_offsets":{"a":0}})"), d8),
       "'data_offsets'", "weight"},
      {"unknown dtype", image(one(R"({"dtype":"F33","shape":[2],"data_offsets":[0,8]})"), d8), "unknown dtype", "weight"},
      {"lower-case dtype", image(one(R"({"dtype":"f32","shape":[2],"data_offsets":[0,8]})"), d8), "unknown dtype", "weight"},
      {"negative dim", image(one(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"), d8), "integers >= 0", "weight"},
      {"fractional dim", image(one(R"({"dtype":"F32","shape":[2.5],"data_offsets":[0,8]})"), d8), "integers >= 0", "weight"},
      {"string dim", image(one(R"({"dtype":"F32","shape":["2"],"data_offsets":[0,8]})"), d8), "integers >= 0", "weight"},
      {"deeply nested dim", image(one(R"({"dtype":"F32","data_offsets":[0,8],"shape":)" + nested(50000) + "}"), d8),
       "integers >= 0", "weight"},
      {"element count overflows", image(one(R"({"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,0]})"), d8),
       "overflows a 64-bit element count", "weight"},
      {"dim above 2^63", image(one(R"({"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,0]})"), d8),
       "overflows", "weight"},
      {"byte count overflows (2^62 F32 = 0 mod 2^64)",
       image(one(R"({"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]})"), d8),
       "overflows a 64-bit byte count", "weight"},
      {"byte count overflows (2^61 I64)", image(one(R"({"dtype":"I64","shape":[2,1152921504606846976],"data_offsets":[0,0]})"), d8),
       "overflows", "weight"},
      {"one data offset", image(one(R"({"dtype":"F32","shape":[2],"data_offsets":[8]})"), d8), "[begin, end]", "weight"},
      {"three data offsets", image(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8,8]})"), d8), "[begin, end]", "weight"},
      {"negative data offset", image(one(R"({"dtype":"F32","shape":[2],"data_offsets":[-8,0]})"), d8), "[begin, end]", "weight"},
      {"fractional data offsets", image(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0.0,8.0]})"), d8), "[begin, end]", "weight"},
      {"string data offsets", image(one(R"({"dtype":"F32","shape":[2],"data_offsets":["0","8"]})"), d8), "[begin, end]", "weight"},
      {"data offset above 2^64", image(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551616]})"), d8),
       "[begin, end]", "weight"},
      {"begin after end", image(one(R"({"dtype":"F32","shape":[0],"data_offsets":[8,0]})"), d8), "begin 8 > end 0", "weight"},
      {"truncated data", image(one(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})"), d8), "beyond the data buffer", "weight"},
      {"huge offsets", image(one(R"({"dtype":"U8","shape":[8],"data_offsets":[18446744073709551600,18446744073709551608]})"), d8),
       "beyond the data buffer", "weight"},
      {"empty tensor past the end", image(one(R"({"dtype":"F32","shape":[0],"data_offsets":[16,16]})"), d8),
       "beyond the data buffer", "weight"},
      {"span too small for shape", image(one(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})"), d8), "needs 12 bytes", "weight"},
      {"span too big for shape", image(one(R"({"dtype":"F32","shape":[1],"data_offsets":[0,8]})"), d8), "needs 4 bytes", "weight"},
      {"F16 span wrong", image(one(R"({"dtype":"F16","shape":[3],"data_offsets":[0,8]})"), d8), "needs 6 bytes", "weight"},
      {"scalar span wrong", image(one(R"({"dtype":"F32","shape":[],"data_offsets":[0,8]})"), d8), "needs 4 bytes", "weight"},
      {"tensors overlap", image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                R"("weight":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", d16),
       "overlap", "weight"},
      {"tensors share a span", image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                     R"("weight":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})", d8),
       "overlap", "weight"},
      {"tensor inside another", image(R"({"weight":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                                      R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
                                      R"("c":{"dtype":"F32","shape":[0],"data_offsets":[16,16]}})", d16),
       "overlap", "weight"},
      {"overlap far apart in name order", image(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                                R"("m":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},)"
                                                R"("weight":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})", d8),
       "overlap", "weight"},
      // As the Hugging Face reader: a name given twice (JSON keeps the last), a buffer the tensors
      // do not cover exactly.
      {"tensor named twice", image(R"({"weight":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                   R"("weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", d8),
       "is named twice", "weight"},
      {"hole between tensors", image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                     R"("weight":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", d16),
       "hole of 4 bytes", "weight"},
      {"hole before the first tensor", image(one(R"({"dtype":"F32","shape":[1],"data_offsets":[4,8]})"), d8),
       "before its first tensor", "weight"},
      {"bytes past the last tensor", image(one(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})"), d8),
       "4 bytes past its last tensor", "weight"},
      {"data and no tensor", image("{}", d8), "8 bytes past the header"},
      {"__metadata__ a string", image(R"({"__metadata__":"x"})", d8), "__metadata__ must be an object of strings"},
      {"__metadata__ an array", image(R"({"__metadata__":["a","b"]})", d8), "__metadata__ must be an object"},
      {"__metadata__ value a number", image(R"({"__metadata__":{"format":1}})", d8), "value of 'format' must be a string"},
      {"__metadata__ value an object", image(R"({"__metadata__":{"format":{"a":"b"}}})", d8), "must be a string"},
      {"__metadata__ value null", image(R"({"__metadata__":{"format":null}})", d8), "must be a string"},
  };
}

TEST_F(SafetensorsTest, EveryMalformedFileIsAnError) {
  // The well-formed file the cases are variations of opens.
  EXPECT_EQ(open_error(write_raw("fine", image(R"({"weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                                               std::string(8, '\0')))),
            "");
  int i = 0;
  for (const BadFile& c : bad_files()) {
    SCOPED_TRACE(c.what);
    const std::string p = write_raw(std::string("bad_") + std::to_string(i++), c.bytes);
    const std::string e = open_error(p);
    ASSERT_FALSE(e.empty()) << "opened without an error";
    EXPECT_THAT(e, HasSubstr(c.needle));
    EXPECT_THAT(e, HasSubstr(std::string("'") + p + "'")) << "the message names the file";
    if (*c.tensor) {
      EXPECT_THAT(e, HasSubstr(std::string("'") + std::string(c.tensor) + "'")) << "the message names the tensor";
    }
    EXPECT_LT(e.size(), 2000u) << "messages stay short whatever the header holds";
  }
}

TEST_F(SafetensorsTest, MissingFileAndDirectoryAreErrors) {
  const std::string missing = path("does_not_exist.safetensors");
  EXPECT_THAT(open_error(missing), HasSubstr("cannot open"));
  EXPECT_THAT(open_error(missing), HasSubstr(std::strerror(ENOENT)));
  EXPECT_THAT(open_error(missing), HasSubstr(missing));
  EXPECT_THAT(open_error(dir_.string()), HasSubstr("not a regular file"));
}

TEST_F(SafetensorsTest, HugeNamesAreClippedInMessages) {
  const std::string name(100000, 'n');
  const std::string header = R"({")" + name + R"(":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})";
  const std::string e = open_error(write_raw("long_name", image(header, std::string(8, '\0'))));
  EXPECT_THAT(e, HasSubstr("needs 12 bytes"));
  EXPECT_LT(e.size(), 1000u);
}

// Every truncation of a valid file, and many single-byte corruptions of its header, either open
// and read cleanly or throw clattn::Error: never another exception, never a bad read (ASan).
TEST_F(SafetensorsTest, TruncatedAndCorruptedFilesNeverCrash) {
  SafetensorsWriter w;
  w.add("a", ramp(Shape{2, 3}).view());
  w.add("b", ramp(Shape{1}).view());
  w.add_i32("c", {2}, std::vector<int32_t>{4, 5});
  w.set_metadata("m", "v");
  const std::string good_path = path("good.safetensors");
  w.write(good_path);
  const std::string good = slurp(good_path);

  auto read_all = [](const std::string& p) {
    try {
      const SafetensorsFile f = SafetensorsFile::open(p);
      for (const std::string& n : f.names()) {
        try {
          (void)f.get_f32(n);
        } catch (const Error&) {
        }
        try {
          (void)f.get_i32(n);
        } catch (const Error&) {
        }
      }
      return true;
    } catch (const Error&) {
      return false;
    }
  };
  // ~1500 rewrites of one file: in memory (memfd, opened by its /proc path) when the system has
  // it, since truncating and rewriting a disk file that often stalls on writeback under load.
  const int mfd = ::memfd_create("clattn_st_sweep", MFD_CLOEXEC);
  const std::string p = mfd >= 0 ? std::string("/proc/self/fd/") + std::to_string(mfd) : path("mutant.safetensors");
  auto put = [&](const std::string& bytes) {
    if (mfd < 0) {
      write_raw("mutant.safetensors", bytes);
      return;
    }
    ASSERT_EQ(::ftruncate(mfd, 0), 0);
    ASSERT_EQ(::pwrite(mfd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  };
  for (size_t len = 0; len < good.size(); ++len) {
    put(good.substr(0, len));
    EXPECT_FALSE(read_all(p)) << "a file cut to " << len << " of " << good.size() << " bytes opened";
  }
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = hlen << 8 | static_cast<uint8_t>(good[static_cast<size_t>(i)]);
  int opened = 0;
  for (size_t pos = 0; pos < 8 + hlen; ++pos) {
    for (const char ch : {'\0', '\xFF', '9', '-', '"', '['}) {
      std::string m = good;
      m[pos] = ch;
      put(m);
      opened += read_all(p);
    }
  }
  if (mfd >= 0) ::close(mfd);
  EXPECT_GT(opened, 0);  // e.g. digits changed inside metadata or padding still form a valid file
}

}  // namespace
}  // namespace clattn
