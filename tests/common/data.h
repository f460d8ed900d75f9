// The real models and data beside the repository (README, "Real models and data"): where the
// suites find them, and what a test that reads them does when they are absent. Such a test starts
// with CLATTN_NEED_DATA("stories260k", ...): without those paths it is skipped with one line that
// names CLATTN_DATA, or, where the data is required (CI, scripts/test.sh), it fails with that line.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <initializer_list>
#include <string>
#include <string_view>

namespace clattn::testing {

// CLATTN_DATA, else the source tree's sibling ../shared/data (CTest sets CLATTN_SOURCE_DIR), else
// ../shared/data from the working directory.
// The whole file as bytes ("" when it cannot be read: the caller's check then fails by name).
inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

inline std::filesystem::path data_dir() {
  if (const char* d = std::getenv("CLATTN_DATA"); d && *d) return d;
  if (const char* s = std::getenv("CLATTN_SOURCE_DIR"); s && *s)
    return std::filesystem::path(s) / ".." / "shared" / "data";
  return std::filesystem::path("..") / "shared" / "data";
}

// Whether missing data is a failure rather than a skip: CLATTN_REQUIRE_DATA when it is set
// (scripts/test.sh sets 1; 0 turns the requirement off), else whether CI is set (CI runs
// `CI=true bash .ci/run`). "", "0" and "false" count as unset.
inline bool data_required() {
  auto on = [](const char* v) {
    const std::string_view s = v ? v : "";
    return !s.empty() && s != "0" && s != "false";
  };
  if (const char* r = std::getenv("CLATTN_REQUIRE_DATA"); r && *r) return on(r);
  return on(std::getenv("CI"));
}

// "" when every path (relative to data_dir()) exists, else one line naming the first missing one.
inline std::string missing_data(std::initializer_list<std::string_view> paths) {
  for (const std::string_view p : paths) {
    const std::filesystem::path full = data_dir() / p;
    std::error_code ec;
    if (!std::filesystem::exists(full, ec))
      return "real data not found: " + full.string() + " is missing (set CLATTN_DATA to the shared data folder" +
             (data_required() ? "; required here: CI or CLATTN_REQUIRE_DATA is set)" : ")");
  }
  return {};
}

}  // namespace clattn::testing

// First statement of a test body or fixture SetUp that reads the real data: the paths it needs,
// relative to data_dir(). Absent, the test is skipped (GTEST_SKIP) or, when data_required(), fails.
#define CLATTN_NEED_DATA(...)                                                                      \
  do {                                                                                             \
    if (const std::string clattn_missing_ = ::clattn::testing::missing_data({__VA_ARGS__});        \
        !clattn_missing_.empty()) {                                                                \
      if (::clattn::testing::data_required()) FAIL() << clattn_missing_;                           \
      GTEST_SKIP() << clattn_missing_;                                                             \
    }                                                                                              \
  } while (0)
