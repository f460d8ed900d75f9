// What a training run writes (train.h): checkpoint folders swapped in atomically, and the
// JSON-lines log.
#pragma once

#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

namespace clattn::train {

// A checkpoint folder NAME of root whose .tmp-/.old- leftovers from a killed run are settled:
// a lone .old-NAME (killed between the two renames) becomes NAME again; a .tmp-NAME is dropped.
void recover(const std::filesystem::path& root, const std::string& name);
// Writes root/NAME whole through root/.tmp-NAME: fill(tmp) writes its files, then the two
// renames swap it in and the folder is synced.
template <class Fill>
void write_checkpoint(const std::filesystem::path& root, const std::string& name, Fill&& fill);
void swap_in(const std::filesystem::path& root, const std::string& name);

// JSON lines, each flushed whole so a killed run leaves only complete lines.
class Log {
 public:
  Log() = default;
  Log(const std::string& path, bool append);
  ~Log();
  Log(const Log&) = delete;
  Log& operator=(Log&& o) noexcept {
    std::swap(f_, o.f_);
    std::swap(path_, o.path_);
    return *this;
  }
  void write(const nlohmann::json& j);

 private:
  std::FILE* f_ = nullptr;
  std::string path_;
};

template <class Fill>
void write_checkpoint(const std::filesystem::path& root, const std::string& name, Fill&& fill) {
  const std::filesystem::path tmp = root / (".tmp-" + name);
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
  fill(tmp);
  swap_in(root, name);
}

}  // namespace clattn::train
