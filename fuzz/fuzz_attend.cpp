// `clattn attend` input files, end to end through the command: the input is a safetensors file
// (q, k, v, optional lengths, bias, do) run with one of a few specs chosen by the input's length.
// Anything wrong with the file must be a clattn::Error; a file the command accepts runs forward
// (and backward when it has do) and writes its output.
#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "clattn/error.h"
#include "clattn/parallel.h"
#include "commands.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace clattn;
  if (size > (1 << 20)) return 0;
  // Variants with different input paths: masks and bias (full), sparse (topk), linear, shared-QK
  // (reformer, k absent or equal to q), clustering.
  static const char* const kSpecs[] = {"full", "topk:topk=3", "linear", "reformer:chunk=4",
                                        "improved-clustered:clusters=2,topk=2", "local:window=3"};
  const std::string spec = kSpecs[size % (sizeof kSpecs / sizeof kSpecs[0])];
  const fuzz::MemFile input(data, size);
  const std::string output = fuzz::scratch_dir() + "/out.safetensors";
  CLI::App app;
  cli::add_attend(app);
  std::vector<std::string> args{"attend", "--spec", spec, "--input", input.path(), "--output", output, "--threads", "1"};
  if (size % 7 == 3) args.push_back("--causal");
  std::vector<const char*> argv{"clattn"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError&) {
    std::abort();  // the command line is fixed: a parse error is a bug of this target
  } catch (const Error&) {
  }
  return 0;
}
