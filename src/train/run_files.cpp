#include "train/run_files.h"

#include <fcntl.h>
#include <unistd.h>

#include "clattn/error.h"

namespace clattn::train {

namespace fs = std::filesystem;

namespace {

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    (void)::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

void recover(const fs::path& root, const std::string& name) {
  const fs::path cur = root / name, old = root / (".old-" + name), tmp = root / (".tmp-" + name);
  std::error_code ec;
  if (!fs::exists(cur) && fs::exists(old)) fs::rename(old, cur);
  fs::remove_all(old, ec);
  fs::remove_all(tmp, ec);
}

void swap_in(const fs::path& root, const std::string& name) {
  const fs::path cur = root / name, old = root / (".old-" + name), tmp = root / (".tmp-" + name);
  std::error_code ec;
  fs::remove_all(old, ec);
  if (fs::exists(cur)) fs::rename(cur, old);
  fs::rename(tmp, cur);
  fsync_dir(root);
  fs::remove_all(old, ec);
}

Log::Log(const std::string& path, bool append) : path_(path) {
  if (path.empty()) return;
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  check(f_ != nullptr, "train: cannot open the log '", path, "' for writing");
}

Log::~Log() {
  if (f_) std::fclose(f_);
}

void Log::write(const nlohmann::json& j) {
  if (!f_) return;
  const std::string s = j.dump() + "\n";
  std::fwrite(s.data(), 1, s.size(), f_);
  std::fflush(f_);
}

}  // namespace clattn::train
