#include "train/run_files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "clattn/atomic_file.h"
#include "clattn/error.h"
#include "clattn/input_file.h"

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

namespace {

// obj[key] as an integer in [lo, hi], absent: nullopt. A float, a string or a value beyond int64
// is refused, never converted; the Error names `where` (the file, and "field" or "args field").
std::optional<int64_t> integer_in(const nlohmann::json& obj, const std::string& where, const char* key, int64_t lo,
                                  int64_t hi) {
  if (!obj.contains(key)) return std::nullopt;
  const nlohmann::json& v = obj[key];
  check(v.is_number_integer() && (v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(hi)
                                                          : v.get<int64_t>() >= lo && v.get<int64_t>() <= hi),
        where, " \"", key, "\" must be an integer in [", lo, ", ", hi, "], got ", v.dump());
  return v.get<int64_t>();
}

}  // namespace

nlohmann::json read_train_state_json(const std::string& path) {
  nlohmann::json j = nlohmann::json::parse(read_input_file(path, "train state", kMaxJsonBytes), nullptr, false);
  check(j.is_object() && j.contains("args") && j["args"].is_object(), "'", path,
        "' is not a train state (a JSON object with \"args\")");
  return j;
}

std::optional<std::string> args_text(const nlohmann::json& args, const std::string& path, const char* key) {
  if (!args.contains(key)) return std::nullopt;
  check(args[key].is_string(), "'", path, "': args field \"", key, "\" must be a string, got ", args[key].dump());
  return args[key].get<std::string>();
}

std::optional<int64_t> args_integer(const nlohmann::json& args, const std::string& path, const char* key, int64_t lo,
                                    int64_t hi) {
  return integer_in(args, detail::concat("'", path, "': args field"), key, lo, hi);
}

SavedState read_train_state(const std::string& path) {
  const nlohmann::json j = read_train_state_json(path);
  check(j.contains("step"), "train: '", path, "' is not a train state (a JSON object with \"step\" and \"args\")");
  const std::string where = detail::concat("train: '", path, "': field");
  auto number = [&](const char* key, double lo, double hi) -> std::optional<double> {
    if (!j.contains(key) || j[key].is_null()) return std::nullopt;
    const nlohmann::json& v = j[key];
    check(v.is_number() && v.get<double>() >= lo && v.get<double>() <= hi, where, " \"", key,
          "\" must be a number in [", lo, ", ", hi, "], got ", v.dump());
    return v.get<double>();
  };
  constexpr int64_t kMaxStep = int64_t{1} << 62;
  SavedState st;
  st.step = integer_in(j, where, "step", 0, kMaxStep).value_or(0);
  st.best_step = integer_in(j, where, "best_step", -1, kMaxStep).value_or(-1);
  st.elapsed_s = number("elapsed_s", 0, 1e15).value_or(0.0);
  st.best_metric = number("best_metric", -1e300, 1e300);
  st.args = j["args"];
  return st;
}

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

Log::Log(const std::string& path, bool append, const std::vector<std::string>& inputs) : path_(path) {
  if (path.empty()) return;
  // No O_TRUNC yet: the file may turn out to be an input, which must survive the refusal.
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, 0644);
  if (fd_ < 0) {
    const int err = errno;
    struct stat lst {};
    check(!(err == ELOOP && ::lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode)), "train: --log '", path,
          "' is a symlink; the log is written only to a regular file (give the target's path)");
    fail("train: cannot open the log '", path, "' for writing: ", std::strerror(err),
         err == ENXIO ? " (a FIFO with no reader: the log must be a regular file)" : "");
  }
  struct stat st {};
  const bool regular = ::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode);
  if (!regular) {
    ::close(std::exchange(fd_, -1));
    fail("train: --log '", path, "' exists and is not a regular file (",
         S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : "a device or socket",
         "); the log must be a regular file");
  }
  for (const std::string& in : inputs) {
    struct stat ist {};
    if (in.empty() || ::stat(in.c_str(), &ist) != 0) continue;
    if (ist.st_dev == st.st_dev && ist.st_ino == st.st_ino) {
      ::close(std::exchange(fd_, -1));
      fail("train: --log '", path, "' is the run's input '", in, "'; the log must be another file");
    }
  }
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags >= 0) (void)::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
  if (!append && ::ftruncate(fd_, 0) != 0) {
    const int err = errno;
    ::close(std::exchange(fd_, -1));
    fail("train: cannot truncate the log '", path, "': ", std::strerror(err));
  }
}

Log::~Log() {
  if (fd_ >= 0) ::close(fd_);
}

void Log::write(const nlohmann::json& j) {
  if (fd_ < 0) return;
  const std::string s = j.dump() + "\n";
  const std::string why = write_fully(fd_, s.data(), s.size());
  check(why.empty(), "train: cannot write the log '", path_, "': ", why);
}

FolderLock::FolderLock(const fs::path& root) {
  const std::string path = (root / ".clattn-train.lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, 0644);
  if (fd_ < 0) {
    const int err = errno;
    fail("train: cannot lock the checkpoint folder '", root.string(), "': cannot open '", path, "': ",
         std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(std::exchange(fd_, -1));
    fail("train: cannot lock the checkpoint folder '", root.string(), "': '", path, "' is not a regular file");
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t r = ::pread(fd_, buf, sizeof buf - 1, 0);
    ::close(std::exchange(fd_, -1));
    const long pid = r > 0 ? std::strtol(buf, nullptr, 10) : 0;
    check(err != EWOULDBLOCK, "train: checkpoint folder '", root.string(), "' in use by ",
          pid > 0 ? "PID " + std::to_string(pid) : std::string("another process"),
          " (another run writes it); wait for it to end or choose another --checkpoint");
    fail("train: cannot lock the checkpoint folder '", root.string(), "': ", std::strerror(err));
  }
  const std::string me = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, me.data(), me.size(), 0);
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace clattn::train
