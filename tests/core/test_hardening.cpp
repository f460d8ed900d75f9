// Hardening regressions of core: sizes checked once, in Shape, with checked arithmetic
// (a zero-element tensor with huge dims would overflow its strides: UBSan), and safetensors
// files read rather than mapped (a file truncated after open would raise SIGBUS).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "clattn/atomic_file.h"
#include "clattn/error.h"
#include "clattn/safetensors.h"
#include "clattn/tensor.h"

namespace clattn {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ShapeSizes, OverflowingElementCountRefused) {
  const int64_t big = int64_t{1} << 40;
  EXPECT_THAT(error_of([&] { Shape s{big, big}; }), HasSubstr("overflow a 64-bit element count"));
  EXPECT_THAT(error_of([&] { Shape s{std::numeric_limits<int64_t>::max(), 2}; }), HasSubstr("too large"));
  // 2^62 · 4 elements: the make-inputs probe whose count wrapped to 0.
  EXPECT_THAT(error_of([&] { Shape s{1, 4, int64_t{1} << 62, 4}; }), HasSubstr("too large"));
  EXPECT_NO_THROW((Shape{int64_t{1} << 31, int64_t{1} << 31}));
}

// An empty tensor whose other dims multiply past int64: no data, but its strides would overflow.
TEST(ShapeSizes, EmptyShapeWithHugeDimsRefused) {
  const int64_t big = int64_t{1} << 40;
  EXPECT_THAT(error_of([&] { Shape s{0, big, big}; }), HasSubstr("too large"));
  const Shape ok{0, int64_t{1} << 30, int64_t{1} << 30};
  EXPECT_EQ(ok.numel(), 0);
  const auto st = contiguous_strides(ok);
  EXPECT_EQ(st[0], int64_t{1} << 60);
  EXPECT_EQ(st[2], 1);
  Tensor t(ok);  // nothing to allocate, nothing overflows
  EXPECT_EQ(t.numel(), 0);
}

// A shape edited after construction (dims is public) is still checked where it is used.
TEST(ShapeSizes, EditedShapeChecked) {
  Shape s{2, 2};
  s.dims[0] = s.dims[1] = int64_t{1} << 40;
  EXPECT_THROW((void)s.numel(), Error);
  EXPECT_THROW((void)contiguous_strides(s), Error);
}

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("clattn_hardening_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}

using SafetensorsHardening = TempDir;

TEST_F(SafetensorsHardening, EmptyTensorWithHugeDimsRefusedAtOpen) {
  const std::string header = R"({"t":{"dtype":"F32","shape":[0,1099511627776,1099511627776],"data_offsets":[0,0]}})";
  {
    std::ofstream f(path("huge.safetensors"), std::ios::binary);
    f << le64(header.size()) << header;
  }
  try {
    SafetensorsFile::open(path("huge.safetensors"));
    FAIL() << "opened";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("overflows a 64-bit element count"));
    EXPECT_THAT(e.what(), HasSubstr("huge.safetensors"));
  }
}

// The file is truncated by "another process" after open: the data must still be readable (a
// mapping would raise SIGBUS here and end the test binary).
TEST_F(SafetensorsHardening, TruncatedAfterOpenStillReadable) {
  Tensor t(Shape{64, 1024});  // 256 KB: many pages
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = static_cast<float>(i % 1000) - 500.f;
  SafetensorsWriter w;
  w.add("t", t.view());
  w.write(path("x.safetensors"));
  const SafetensorsFile f = SafetensorsFile::open(path("x.safetensors"));
  ASSERT_EQ(::truncate(path("x.safetensors").c_str(), 0), 0);
  const Tensor got = f.get_f32("t");
  for (int64_t i = 0; i < t.numel(); i += 997) ASSERT_EQ(got.data()[i], t.data()[i]);
  const float* p = f.mapped_f32("t");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p[t.numel() - 1], t.data()[t.numel() - 1]);
  // And the truncated file itself is refused cleanly.
  EXPECT_THAT(error_of([&] { SafetensorsFile::open(path("x.safetensors")); }), HasSubstr("shorter than"));
}

// ---- Bad sizes and outputs through the CLI (CLATTN_BIN is set by CTest; skipped without it) ----

struct CliRun {
  int code = -1;  // exit code, or 128 + signal
  std::string err;
};

CliRun run_cli(const std::string& args, const std::string& err_file) {
  const char* bin = std::getenv("CLATTN_BIN");
  CliRun r;
  if (!bin) return r;
  const int st = std::system((std::string(bin) + " " + args + " >/dev/null 2>" + err_file).c_str());
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  std::ifstream f(err_file);
  r.err.assign(std::istreambuf_iterator<char>(f), {});
  return r;
}

using CliProbes = TempDir;

TEST_F(CliProbes, HugeSizesAreUsageErrorsAndWriteNothing) {
  if (!std::getenv("CLATTN_BIN")) GTEST_SKIP() << "CLATTN_BIN not set";
  const std::string out = path("a.safetensors"), err = path("err.txt");
  struct Probe {
    std::string args, needle;
  };
  const Probe probes[] = {
      {"make-inputs --output " + out + " --n 9223372036854775807 --heads 1 --dim 1", "--n must be in"},
      {"make-inputs --output " + out + " --n 4611686018427387904 --heads 4 --dim 4", "--n must be in"},
      {"make-inputs --output " + out + " --n 2147483648 --heads 2147483648 --dim 2147483648", "elements"},
      {"make-inputs --output " + out + " --batch 2147483647 --heads 2147483647 --n 2147483647 --dim 1", "elements"},
      {"bench --lengths 1 --heads 1 --dim 4611686018427387904 --attention linear", "--dim must be in"},
      {"bench --lengths 2147483647 --heads 2147483647 --dim 2147483647 --attention linear", "elements"},
  };
  for (const Probe& p : probes) {
    const CliRun r = run_cli(p.args, err);
    EXPECT_EQ(r.code, 2) << p.args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(p.needle)) << p.args;
    EXPECT_FALSE(fs::exists(out)) << p.args;
  }
}

TEST_F(CliProbes, EmptyTensorWithHugeDimsInAnInputFile) {
  if (!std::getenv("CLATTN_BIN")) GTEST_SKIP() << "CLATTN_BIN not set";
  const std::string header =
      R"({"q":{"dtype":"F32","shape":[0,1099511627776,1099511627776,4],"data_offsets":[0,0]},)"
      R"("k":{"dtype":"F32","shape":[0,1,1,4],"data_offsets":[0,0]},"v":{"dtype":"F32","shape":[0,1,1,4],"data_offsets":[0,0]}})";
  {
    std::ofstream f(path("in.safetensors"), std::ios::binary);
    f << le64(header.size()) << header;
  }
  const CliRun r = run_cli("attend --spec full --input " + path("in.safetensors") + " --output " + path("o.safetensors"),
                        path("err.txt"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("overflows a 64-bit element count"));
}

TEST_F(CliProbes, OutputDirectoryNamedWithItsReason) {
  if (!std::getenv("CLATTN_BIN")) GTEST_SKIP() << "CLATTN_BIN not set";
  const CliRun r = run_cli("make-inputs --output " + dir_.string() + " --n 4 --dim 4", path("err.txt"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("a directory"));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("Success")));
}

std::vector<std::string> temporaries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".clattn-tmp-") != std::string::npos) out.push_back(e.path().filename());
  return out;
}

using AtomicFileSignals = TempDir;

// ThreadSanitizer defers signals to its own safe points and loses the handler's re-raise in a
// forked child: the signal test runs in every other build.
#if defined(__SANITIZE_THREAD__)
constexpr bool kTsan = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kTsan = true;
#else
constexpr bool kTsan = false;
#endif
#else
constexpr bool kTsan = false;
#endif

// SIGTERM (or SIGINT) in the middle of a write: the temporary goes, the process still dies of the
// signal, and the target is untouched.
TEST_F(AtomicFileSignals, TemporaryRemovedWhenKilledBySignal) {
  if (kTsan) GTEST_SKIP() << "signals under ThreadSanitizer";
  for (int sig : {SIGTERM, SIGINT}) {
    const std::string out = path("out.bin");
    write_file_atomic(out, "old");
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      AtomicFile f(out);
      f.write(std::string(1 << 20, 'x'));
      ::alarm(20);  // a signal that never arrives fails the test (SIGALRM), never hangs it
      ::raise(sig);
      for (;;) ::sleep(1);  // sanitizers (TSan) may deliver the signal at the next intercepted call
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << "status " << status;
    EXPECT_TRUE(temporaries(dir_).empty()) << temporaries(dir_)[0];
    std::ifstream in(out);
    std::string text;
    in >> text;
    EXPECT_EQ(text, "old");
  }
}

// Leftovers of a process that is gone (SIGKILL) are removed by the next write of the same name
// once a minute old; those of a live process, or fresh ones, stay.
TEST_F(AtomicFileSignals, StaleTemporariesOfDeadProcessesRemoved) {
  const pid_t dead = ::fork();
  ASSERT_GE(dead, 0);
  if (dead == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  auto plant = [&](const std::string& name, bool old) {
    std::ofstream(path(name)) << "partial";
    if (old) {
      const struct timespec t[2] = {{::time(nullptr) - 3600, 0}, {::time(nullptr) - 3600, 0}};
      ASSERT_EQ(::utimensat(AT_FDCWD, path(name).c_str(), t, 0), 0);
    }
  };
  const std::string stale = ".out.bin.clattn-tmp-" + std::to_string(dead) + "-abcdef";
  const std::string fresh = ".out.bin.clattn-tmp-" + std::to_string(dead) + "-ghijkl";
  const std::string live = ".out.bin.clattn-tmp-" + std::to_string(::getpid()) + "-mnopqr";
  const std::string other = ".other.clattn-tmp-" + std::to_string(dead) + "-stuvwx";
  plant(stale, true);
  plant(fresh, false);
  plant(live, true);
  plant(other, true);
  write_file_atomic(path("out.bin"), "new");
  EXPECT_FALSE(fs::exists(path(stale)));
  EXPECT_TRUE(fs::exists(path(fresh)));
  EXPECT_TRUE(fs::exists(path(live)));
  EXPECT_TRUE(fs::exists(path(other)));  // another target's: left to its own next write
}

}  // namespace
}  // namespace clattn
