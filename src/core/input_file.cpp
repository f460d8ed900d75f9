// The one way input files are opened (clattn/input_file.h): non-blocking open, fstat, regular
// files only, bounded reads.
#include "clattn/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "clattn/error.h"

namespace clattn {
namespace {

const char* file_type(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a file";
}

std::string megabytes(uint64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return b;
}

}  // namespace

int open_input_file(const std::string& path, std::string_view what, uint64_t* size) {
  check(!path.empty(), what, ": no file given (empty path)");
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, for ever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    fail(what, " '", path, "': cannot open: ", std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(what, " '", path, "': cannot stat: ", std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(what, " '", path, "': not a regular file (", file_type(st.st_mode), ")");
  }
  // A regular file never blocks; clear the flag anyway so reads are plain blocking reads.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  if (size) *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

std::string read_input_file(const std::string& path, std::string_view what, uint64_t max_bytes) {
  uint64_t size = 0;
  const int fd = open_input_file(path, what, &size);
  if (size > max_bytes) {
    ::close(fd);
    fail(what, " '", path, "': is ", megabytes(size), ", above the ", megabytes(max_bytes), " accepted");
  }
  std::string out;
  out.resize(static_cast<size_t>(size));
  size_t got = 0;
  // One byte past the size: a file that grew since fstat is read to its end, up to the limit.
  char extra[4096];
  while (true) {
    char* dst = got < out.size() ? out.data() + got : extra;
    const size_t want = got < out.size() ? out.size() - got : sizeof extra;
    const ssize_t r = ::read(fd, dst, want);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ::close(fd);
      fail(what, " '", path, "': read error after ", got, " bytes: ", std::strerror(err));
    }
    if (r == 0) break;
    if (dst == extra) {
      if (got + static_cast<size_t>(r) > max_bytes) {
        ::close(fd);
        fail(what, " '", path, "': grew past the ", megabytes(max_bytes), " accepted while being read");
      }
      out.append(extra, static_cast<size_t>(r));
      got = out.size();
      continue;
    }
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  out.resize(std::min(out.size(), got));
  return out;
}

bool input_exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

}  // namespace clattn
