// Argument conventions shared by every clattn subcommand: usage errors (exit code 2, see main.cpp),
// the --threads option and bounds of size options, so each command checks them the same way.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "clattn/cpu.h"
#include "clattn/error.h"

namespace clattn::cli {

// The process exit codes, listed in `clattn --help`.
inline constexpr int kExitOk = 0;
inline constexpr int kExitRuntime = 1;  // the run failed: unreadable input, refused spec, I/O ...
inline constexpr int kExitUsage = 2;    // the command line is wrong: unknown option, bad value ...

// A command line the command cannot run with (an option's value out of range, options that
// contradict each other). main() exits with kExitUsage on it; it is a clattn::Error too, so code
// that catches Error sees it as before.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& what) : Error(what) {}
};

template <class... Args>
[[noreturn]] void usage_fail(const Args&... args) {
  throw UsageError(detail::concat(args...));
}

template <class... Args>
inline void usage_check(bool cond, const Args&... args) {
  if (!cond) [[unlikely]] usage_fail(args...);
}

// Upper bound of counts (batch, heads, lengths, dims, tokens, ...): larger values are refused up
// front as usage errors instead of failing later on an allocation.
inline constexpr int64_t kMaxCount = int64_t{1} << 31;
// Upper bound of the elements of one tensor a command allocates from its options (16 GiB of F32).
inline constexpr int64_t kMaxElements = int64_t{1} << 32;

// Usage error unless lo <= v <= hi. `what` names the option with its command, e.g. "bench: --batch".
void check_size(int64_t v, int64_t lo, int64_t hi, const char* what);
// Usage error unless the product of dims (each already checked >= 0) is at most kMaxElements.
// `what` names the tensor, e.g. "make-inputs: q (B, H, N, D)".
void check_elements(std::initializer_list<int64_t> dims, const char* what);

// Token sequences past a model's context (max_position_embeddings; 0 = not given) are refused:
// positions the model was never trained on give outputs that mean nothing. `what` names the
// command and the input, e.g. "approx: 'x.safetensors'".
void check_context(int64_t T, int64_t context, const std::string& what,
                   const char* field = "max_position_embeddings");


// A path a command reads or writes, with the option that named it ("--features"). `folder`: a
// model folder, every file of which counts as read (config.json, the shards, tokenizer.json ...).
struct PathArg {
  std::string option;
  std::string path;  // empty: the option was not given
  bool folder = false;
};
// Paths of a repeatable option (plot --bench a --bench b, --plan files): one PathArg each.
std::vector<PathArg> path_args(const std::string& option, const std::vector<std::string>& paths);

// The one rule for what every command writes: an output is never one of the command's inputs, a
// file inside a model folder it reads, or another of its outputs (each write would destroy what
// the command, or the next run on that model, reads). Files are compared by identity (device and
// inode, so through symlinks and hard links) where both exist, else by absolute path with the
// symlinks of its existing part resolved. A usage error (exit 2) naming both:
//   approx: --json 'x.safetensors' is the command's input --features 'x.safetensors'
// Run it before anything is read or written.
void check_outputs(const char* cmd, const std::vector<PathArg>& outputs, const std::vector<PathArg>& inputs);

// The processors this process may run on (its CPU affinity), at least 1.
int available_processors();
// Under an MPI launcher (more than one rank): every rank's command line (less the program's path)
// and the fingerprints of `inputs` (name, path: file_fingerprint of include/clattn/comm.h) agree,
// or every rank ends with the same error naming the difference (check_ranks_agree). Called first
// by the commands that run under mpirun, before anything that could fail on one rank alone.
void check_cli_ranks_agree(const std::string& who, const std::vector<std::pair<std::string, std::string>>& inputs);
// Ranks of this job on this machine (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS,
// SLURM_NTASKS_PER_NODE), 1 outside a job.
int local_ranks();

// Registers `--threads N` on sub: an explicit value must be >= 1 (a usage error otherwise, at
// parse time); absent leaves `threads` at 0.
CLI::Option* add_threads_option(CLI::App* sub, int& threads, const char* cmd);
// --comm-timeout SECONDS of the commands that run under mpirun (clattn::set_comm_timeout): how long
// a rank may wait in one exchange before it ends the job (default 300 s, 0: for ever).
void add_comm_timeout_option(CLI::App* sub);

// The thread count to run with: 0 (option absent) is all available (OpenMP's default, which
// OMP_NUM_THREADS sets); negative is a usage error; more than available_processors() is capped
// with a note on stderr. Does not change the OpenMP setting: callers pass the result to set_threads.
int checked_threads(int requested, const char* cmd);

// Checks a spec, or a plan of ';'-separated specs, as the option is parsed: one the registry
// refuses (unknown variant or parameter — with the nearest name —, a bad value) is a usage error
// (exit 2) whose first line is the registry's message. Empty items and bench's `all` are left to
// the command's own checks. Use as sub->add_option(...)->check(spec_validator()).
CLI::Validator spec_validator();

// `--plan FILE`: a plan file (`clattn approx --target` writes one; read_plan_file in model.h)
// wherever an attention plan is accepted. Its plan replaces a single --attention value or is added
// to a repeatable one; the file is read and checked as the option is parsed.
// `files`, when given, collects the plan files' paths: inputs of the command (check_outputs).
CLI::Option* add_plan_file_option(CLI::App* sub, std::string& attention, std::vector<std::string>* files = nullptr);
CLI::Option* add_plan_file_option(CLI::App* sub, std::vector<std::string>& attention,
                                  std::vector<std::string>* files = nullptr);

// `--kv-cache f32|f16|bf16`: how a decoder's KV cache stores keys and values (Decoder::set_kv_cache).
CLI::Option* add_kv_cache_option(CLI::App* sub, std::string& type);
// `--weights f32|f16|bf16`: how a decoder holds its linear layers' weights (LoadOptions::weights).
CLI::Option* add_weights_option(CLI::App* sub, std::string& type);

// `-o,--format`: what goes to stdout — text (the default), md, csv, json or jsonl (result_table.h).
CLI::Option* add_format_option(CLI::App* sub, std::string& format);

// What to add to a parse error: for each argument that names no option of its command (or no
// subcommand), the closest known names by edit distance ("unknown option '--lenghts': did you mean
// --lengths?"), and the subcommand the arguments were for ("" for the top level).
struct UsageHints {
  std::vector<std::string> lines;
  std::string command;
  bool no_command = false;  // no subcommand was given at all
};
UsageHints usage_hints(CLI::App& app, int argc, const char* const* argv);

// The non-empty lines of a --text file (at most kMaxTextBytes; a trailing "\r" dropped, lines of
// blanks skipped): one example each. None is an Error naming the command and the file.
std::vector<std::string> non_empty_lines(const std::string& path, const char* cmd);

}  // namespace clattn::cli
