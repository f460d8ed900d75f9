// clattn: attention for long sequences on the CPU. `clattn --help` lists the subcommands.
// Exit codes (kExit* in cli_util.h): 0 success (and --help, --version), 1 runtime error, 2 usage
// error -- a command line CLI11 cannot parse (with "did you mean" for a misspelt name) or a value
// a command refuses before it starts (UsageError).
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "cli_util.h"
#include "clattn/comm.h"
#include "clattn/error.h"
#include "commands.h"
#include "version.h"
#include "clattn/cpu.h"

namespace {

constexpr const char* kExitCodes =
    "Exit codes: 0 success; 1 runtime error (an input that cannot be read or is refused, a failed\n"
    "run); 2 usage error (an unknown or misspelt option or command, a missing or out-of-range value).";

// The useful line first: for a UsageError its own message; for a parse error CLI11 could not
// explain (an unknown or misplaced option or command), clattn's hints, then CLI11's own line
// ("The following arguments were not expected: ..."), which a missing command replaces.
int usage_error(CLI::App& app, const std::string& message, bool ours, int argc, char** argv) {
  const clattn::cli::UsageHints hints = clattn::cli::usage_hints(app, argc, argv);
  std::vector<std::string> lines;
  if (ours) lines.push_back(message);
  lines.insert(lines.end(), hints.lines.begin(), hints.lines.end());
  if (!ours && !hints.no_command) lines.push_back(message);
  for (size_t i = 0; i < lines.size(); ++i)
    std::fprintf(stderr, "clattn: %s%s\n", i == 0 ? "usage error: " : "", lines[i].c_str());
  std::fprintf(stderr, "Run 'clattn%s%s --help' for the options.\n", hints.command.empty() ? "" : " ",
               hints.command.c_str());
  return clattn::cli::kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"clattn: clustered attention and its rivals, fast on the CPU"};
  app.require_subcommand(1);
  // The version, then the machine facts every figure depends on (include/clattn/cpu.h).
  app.set_version_flag(
      "--version",
      [] {
        return std::string("clattn ") + clattn::cli::kVersion + " (commit " + clattn::cli::kCommit + ")\n" +
               clattn::machine_summary() + "\nGEMM kernel: " + clattn::gemm_backend().reason +
               "\nProducts: " + clattn::gemm_backend().products;
      },
      "Print the version and the machine facts (CPU, ISA, GEMM backend and kernel, threads), and exit");
  app.footer(kExitCodes);
  clattn::cli::add_approx(app);
  clattn::cli::add_attend(app);
  clattn::cli::add_generate(app);
  clattn::cli::add_classify(app);
  clattn::cli::add_embed(app);
  clattn::cli::add_tokenize(app);
  clattn::cli::add_bench(app);
  clattn::cli::add_bench_model(app);
  clattn::cli::add_make_inputs(app);
  clattn::cli::add_train(app);
  clattn::cli::add_eval(app);
  clattn::cli::add_plot(app);
  clattn::cli::add_inspect(app);
  clattn::cli::add_variants(app);
  try {
    // A CLATTN_ISA this CPU cannot run is refused before any work, by name (not a SIGILL later);
    // --version alone still prints the version and the machine, with the reason in the ISA field.
    if (!(argc == 2 && std::string_view(argv[1]) == "--version")) clattn::active_isa();
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version: printed on stdout, exit 0
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return usage_error(app, e.what(), false, argc, argv);
  } catch (const clattn::cli::UsageError& e) {
    return usage_error(app, e.what(), true, argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "clattn: error: out of memory (std::bad_alloc): try smaller sizes\n");
    return clattn::cli::kExitRuntime;
  } catch (const std::exception& e) {  // clattn::Error and the rest
    // In a job of several ranks the others may be waiting on this one: end them all.
    if (clattn::built_with_mpi() && clattn::launched_by_mpi() && clattn::world().size() > 1)
      clattn::world().abort(std::string("error: ") + e.what(), clattn::cli::kExitRuntime);
    std::fprintf(stderr, "clattn: error: %s\n", e.what());
    return clattn::cli::kExitRuntime;
  }
  return clattn::cli::kExitOk;
}
