// Files written atomically and safely: readers never see a half-written file, and a planted
// symlink or a device node at the output path is never followed or replaced.
//
// The data goes to a fresh temporary file created exclusively (mkstemp, O_EXCL) in the target's
// directory, named `.NAME.clattn-tmp-PID-XXXXXX`; it is fsynced, then renamed over the target, and
// the directory is fsynced. Temporaries never outlive their writer when they can help it: the
// destructor removes an uncommitted one; SIGINT, SIGTERM and SIGHUP remove every live one before
// the process dies of the signal (a handler installed on first use, only where the action is the
// default); and a later write of NAME removes leftovers of processes that no longer exist
// (SIGKILL, a crash) once they are a minute old. An existing target must be
// a regular file (or a symlink, which rename replaces rather than follows); anything else — a
// directory such as ".", a device node, a FIFO — is refused with an error naming it.
#pragma once

#include <cstddef>
#include <string>

namespace clattn {

class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path);  // throws clattn::Error naming path and reason
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();  // removes the temporary file unless committed

  void write(const void* data, size_t n);
  void write(const std::string& s) { write(s.data(), s.size()); }
  void commit();  // fsync, rename into place, fsync the directory
  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  int slot_ = -1;  // the signal handler's record of tmp_ (-1: none)
  bool committed_ = false;
};

// Writes all n bytes to fd, retrying interrupted and short writes. Returns "" when done, else the
// reason it stopped (strerror of errno, or "no progress" for a write that returned 0: a regular
// file never does that for n > 0, and retrying would spin forever).
std::string write_fully(int fd, const void* data, size_t n);

// The whole text of a small file, written atomically.
void write_file_atomic(const std::string& path, const std::string& text);

}  // namespace clattn
