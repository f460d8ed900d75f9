// The inputs of `clattn plot`: a bench result (--json document or -o jsonl rows) or a training log,
// read and turned into the gnuplot script, as the command does (without running gnuplot). Anything
// wrong with the file must be a clattn::Error; a file the command accepts must give a script in
// which nothing the file holds can act as gnuplot code: every string from the data sits inside a
// single-quoted string (no escapes there, '' for '), none spans a line, and outside them there is
// no backquote (command substitution), no '@' (macro) and no double-quoted string but the "\n"
// joining lines of a title. The first byte picks the reader; the rest is the file.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "clattn/error.h"
#include "fuzz_util.h"
#include "plot_util.h"

namespace {

// Aborts (a finding) when the script could let data act as code.
void check_inert(const std::string& s) {
  bool in_single = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const auto byte = static_cast<unsigned char>(c);
    if (in_single) {
      if (c == '\'') {
        if (i + 1 < s.size() && s[i + 1] == '\'') {
          ++i;  // '' is a quote inside the string
          continue;
        }
        in_single = false;
      } else if (byte < 0x20 || byte == 0x7f) {
        std::abort();  // a line break or control character inside a string
      }
      continue;
    }
    if (c == '\'') {
      in_single = true;
    } else if (c == '`' || c == '@') {
      std::abort();  // command substitution or a macro outside a string
    } else if (c == '"') {
      if (s.compare(i, 4, "\"\\n\"") != 0) std::abort();  // only the constant "\n"
      i += 3;
    } else if ((byte < 0x20 && c != '\n') || byte == 0x7f) {
      std::abort();
    }
  }
  if (in_single) std::abort();  // an unterminated string
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace clattn;
  if (size < 1 || size > (1 << 20)) return 0;
  const bool logs = data[0] & 1;
  const fuzz::MemFile input(data + 1, size - 1);
  try {
    const cli::plot::TempDir dir;
    if (logs) {
      std::vector<cli::plot::LogRun> runs{cli::plot::read_log(input.path()), cli::plot::read_log(input.path())};
      cli::plot::name_runs(runs, {});
      check_inert(cli::plot::logs_script(runs, dir));
    } else {
      const cli::plot::BenchRun run = cli::plot::read_bench_file(input.path());
      check_inert(cli::plot::bench_script({run, run}, dir));
    }
  } catch (const Error&) {
  }
  return 0;
}
