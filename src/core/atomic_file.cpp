#include "clattn/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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
  std::string tmpl = dir + "/." + name + ".clattn-tmp-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  fd_ = ::mkostemp(buf.data(), O_CLOEXEC);  // O_EXCL by definition: never an existing file or link
  const int err = errno;
  check(fd_ >= 0, "cannot write '", path, "': cannot create a temporary file in '", dir, "': ", std::strerror(err));
  tmp_ = buf.data();
  ::fchmod(fd_, 0644);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
  const auto* c = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, c, n);
    const int err = errno;
    if (w < 0 && err == EINTR) continue;
    // A regular file never returns 0 for n > 0; if one does, retrying would spin forever.
    check(w > 0, "cannot write '", path_, "': ", w == 0 ? "no progress" : std::strerror(err));
    c += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::commit() {
  int err = ::fsync(fd_) == 0 ? 0 : errno;
  check(err == 0, "cannot write '", path_, "': fsync failed: ", std::strerror(err));
  const int fd = std::exchange(fd_, -1);  // close() frees the descriptor even when it fails
  err = ::close(fd) == 0 ? 0 : errno;
  check(err == 0, "cannot write '", path_, "': close failed: ", std::strerror(err));
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
