// Opening and reading input files (checkpoints, configs, tokenizers, token and feature sets, bench
// results, logs, corpora) so that no path can hang or exhaust the process: the one way clattn
// opens a file it reads.
//
// A FIFO, a device (/dev/zero, a tty), a socket or a directory given where a file is expected is
// refused before any read: the file is opened with O_NONBLOCK (so a FIFO without a writer cannot
// block the open), fstat-ed, and only a regular file is read (in blocking mode again). Reads are
// bounded by the caller's limit, checked against the size before reading and again while reading
// (a file that grows meanwhile is an error, not an endless read).
//
// Errors are clattn::Error "<what> '<path>': <reason>", the reason with the system's words:
// "cannot open: No such file or directory", "cannot open: Not a directory", "cannot open:
// Permission denied", "not a regular file (a FIFO)", "is 80.0 MB, above the 64.0 MB accepted".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace clattn {

// Limits of whole-file reads of JSON and text (a file above its limit is refused, never read).
inline constexpr uint64_t kMaxJsonBytes = uint64_t{64} << 20;  // config.json, tokenizer.json, indexes, bench JSON
inline constexpr uint64_t kMaxTextBytes = uint64_t{64} << 20;  // texts to tokenize for one run (approx --text)
inline constexpr uint64_t kMaxDataBytes = uint64_t{4} << 30;   // training corpora and TSV sets (--data)

// A read-only descriptor (O_CLOEXEC, blocking) of the regular file `path`; `size` receives its
// size. The caller closes it. Throws as described above.
int open_input_file(const std::string& path, std::string_view what, uint64_t* size = nullptr);

// The whole content of the regular file `path`, at most max_bytes bytes.
std::string read_input_file(const std::string& path, std::string_view what, uint64_t max_bytes);

// Whether `path` exists as anything (a broken symlink counts): optional files such as
// tokenizer_config.json are read when this says so, then refused if they are not regular files.
bool input_exists(const std::string& path);

}  // namespace clattn
