#include "clattn/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <utility>
#include <vector>

#include "clattn/error.h"

namespace clattn {
namespace {

std::pair<std::string, std::string> split_dir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

// ---- Temporary files removed when SIGINT, SIGTERM or SIGHUP ends the process ----
// The handler may only call async-signal-safe functions: it reads fixed slots (paths copied in,
// never pointers to heap strings that a destructor may free meanwhile) and calls unlink().
constexpr int kSlots = 16;
constexpr size_t kSlotPath = 4096;
struct Slot {
  std::atomic<int> state{0};  // 0 free, 1 being filled or emptied, 2 holds a live temporary
  char path[kSlotPath];
};
Slot g_slots[kSlots];
constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
struct sigaction g_previous[3];

void on_signal(int sig) {
  for (Slot& s : g_slots)
    if (s.state.load(std::memory_order_acquire) == 2) ::unlink(s.path);
  // Then die of the signal as before: the previous (default) action, raised again.
  for (int i = 0; i < 3; ++i)
    if (kSignals[i] == sig) ::sigaction(sig, &g_previous[i], nullptr);
  ::raise(sig);
}

// Installed once, and only over the default action: a program with its own handlers keeps them
// (and its own cleanup); an ignored signal stays ignored.
void install_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int i = 0; i < 3; ++i) {
      struct sigaction cur {};
      if (::sigaction(kSignals[i], nullptr, &cur) != 0 || cur.sa_handler != SIG_DFL ||
          (cur.sa_flags & SA_SIGINFO))
        continue;
      struct sigaction sa {};
      sa.sa_handler = on_signal;
      sigemptyset(&sa.sa_mask);
      g_previous[i] = cur;
      ::sigaction(kSignals[i], &sa, nullptr);
    }
  });
}

// The slot now holding tmp (-1 when all are taken or the path is too long: then a signal leaves
// the file behind, to be removed by the next run's stale sweep).
int register_tmp(const std::string& tmp) {
  if (tmp.size() >= kSlotPath) return -1;
  install_handlers();
  for (int i = 0; i < kSlots; ++i) {
    int expect = 0;
    if (g_slots[i].state.compare_exchange_strong(expect, 1, std::memory_order_acq_rel)) {
      std::memcpy(g_slots[i].path, tmp.c_str(), tmp.size() + 1);
      g_slots[i].state.store(2, std::memory_order_release);
      return i;
    }
  }
  return -1;
}

void unregister_tmp(int slot) {
  if (slot < 0) return;
  g_slots[slot].state.store(1, std::memory_order_release);
  g_slots[slot].state.store(0, std::memory_order_release);
}

// ---- Leftovers of killed runs (SIGKILL, power loss) ----
// Temporaries are named `.NAME.clattn-tmp-PID-XXXXXX`. A new write of NAME removes those of its
// siblings whose process is gone (kill(PID, 0) fails with ESRCH), that this user owns, that are
// regular files and that nobody has written for a minute — a live writer on another host (a
// shared folder) keeps writing, so its file stays younger than that.
void remove_stale(const std::string& dir, const std::string& name) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  const std::string prefix = "." + name + ".clattn-tmp-";
  const time_t now = std::time(nullptr);
  while (const dirent* e = ::readdir(d)) {
    const char* n = e->d_name;
    if (std::strncmp(n, prefix.c_str(), prefix.size()) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(n + prefix.size(), &end, 10);
    if (pid <= 0 || end == n + prefix.size() || *end != '-') continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    struct stat st {};
    if (::fstatat(::dirfd(d), n, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
        st.st_uid != ::geteuid() || now - st.st_mtime < 60)
      continue;
    (void)::unlinkat(::dirfd(d), n, 0);
  }
  ::closedir(d);
}

}  // namespace

AtomicFile::AtomicFile(const std::string& path) : path_(path) {
  check(!path.empty(), "output path is empty");
  struct stat st{};
  if (::lstat(path.c_str(), &st) == 0) {
    check(S_ISREG(st.st_mode) || S_ISLNK(st.st_mode), "cannot write '", path, "': it exists and is not a regular file (",
          S_ISDIR(st.st_mode) ? "a directory" : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : S_ISFIFO(st.st_mode) ? "a FIFO" : "not a file",
          ")");
  }
  const auto [dir, name] = split_dir(path);
  check(!name.empty() && name != "." && name != "..", "cannot write '", path, "': not a file name");
  remove_stale(dir, name);
  std::string tmpl = dir + "/." + name + ".clattn-tmp-" + std::to_string(::getpid()) + "-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  fd_ = ::mkostemp(buf.data(), O_CLOEXEC);  // O_EXCL by definition: never an existing file or link
  const int err = errno;
  check(fd_ >= 0, "cannot write '", path, "': cannot create a temporary file in '", dir, "': ", std::strerror(err));
  tmp_ = buf.data();
  slot_ = register_tmp(tmp_);
  ::fchmod(fd_, 0644);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  unregister_tmp(slot_);
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
}

std::string write_fully(int fd, const void* data, size_t n) {
  const auto* c = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    const int err = errno;
    if (w < 0 && err == EINTR) continue;
    if (w <= 0) return w == 0 ? "no progress" : std::strerror(err);
    c += w;
    n -= static_cast<size_t>(w);
  }
  return {};
}

void AtomicFile::write(const void* data, size_t n) {
  const std::string why = write_fully(fd_, data, n);
  check(why.empty(), "cannot write '", path_, "': ", why);
}

void AtomicFile::commit() {
  int err = ::fsync(fd_) == 0 ? 0 : errno;
  check(err == 0, "cannot write '", path_, "': fsync failed: ", std::strerror(err));
  const int fd = std::exchange(fd_, -1);  // close() frees the descriptor even when it fails
  err = ::close(fd) == 0 ? 0 : errno;
  check(err == 0, "cannot write '", path_, "': close failed: ", std::strerror(err));
  unregister_tmp(std::exchange(slot_, -1));  // from here on the file is the target, not a temporary
  err = ::rename(tmp_.c_str(), path_.c_str()) == 0 ? 0 : errno;
  check(err == 0, "cannot write '", path_, "': cannot rename the temporary file into place: ", std::strerror(err));
  committed_ = true;
  // Best effort: make the rename durable (the file is complete either way).
  const int dfd = ::open(split_dir(path_).first.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomic(const std::string& path, const std::string& text) {
  AtomicFile f(path);
  f.write(text);
  f.commit();
}

}  // namespace clattn
