// What a training run writes (train.h): checkpoint folders swapped in atomically, and the
// JSON-lines log.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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

// The saved state of a run (latest/train_state.json), every field checked: a wrong type or a
// value out of range is an Error naming the file, the field and the accepted range.
struct SavedState {
  int64_t step = 0, best_step = -1;
  double elapsed_s = 0;
  std::optional<double> best_metric;
  nlohmann::json args;  // an object
};
SavedState read_train_state(const std::string& path);
// The file as JSON, checked to be an object with an "args" object (what `clattn eval` reads of a
// run; read_train_state checks the rest).
nlohmann::json read_train_state_json(const std::string& path);
// The bound of the counts and lengths a run takes (steps, seq, eval_examples ...), as the command
// line bounds them.
inline constexpr int64_t kMaxCount = int64_t{1} << 31;
// Fields of a run's "args", checked against their type and range: an Error names the file
// (`path`) and the field. Absent: nullopt.
std::optional<std::string> args_text(const nlohmann::json& args, const std::string& path, const char* key);
std::optional<int64_t> args_integer(const nlohmann::json& args, const std::string& path, const char* key, int64_t lo,
                                    int64_t hi);

// JSON lines, each written whole with one write(2) so a killed run leaves only complete lines.
// The log is an output like every other: a symlink, a FIFO, a device or a directory at its path
// is refused (opened with O_NOFOLLOW | O_NONBLOCK, then fstat), so is any of `inputs` (the run's
// data or tokenizer: the same file, by device and inode, under any name), and the file is only
// truncated (a fresh run) once all that is checked. Every write is checked: a full disk is an
// Error naming the log, never a torn log and exit 0.
class Log {
 public:
  Log() = default;
  Log(const std::string& path, bool append, const std::vector<std::string>& inputs);
  ~Log();
  Log(const Log&) = delete;
  Log& operator=(Log&& o) noexcept {
    std::swap(fd_, o.fd_);
    std::swap(path_, o.path_);
    return *this;
  }
  void write(const nlohmann::json& j);

 private:
  int fd_ = -1;
  std::string path_;
};

// An exclusive lock on a checkpoint folder (flock on root/.clattn-train.lock, held until
// destruction), so two runs never write one folder: a second run is refused with "folder in use
// by PID N". The lock file keeps the holder's PID for that message.
class FolderLock {
 public:
  FolderLock() = default;
  explicit FolderLock(const std::filesystem::path& root);
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(FolderLock&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }

 private:
  int fd_ = -1;
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
