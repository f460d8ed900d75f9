#include "cli_util.h"

#include "clattn/attention.h"
#include "clattn/comm.h"
#include "clattn/cpu.h"
#include "clattn/input_file.h"
#include "clattn/model.h"
#include "clattn/spec.h"

#include <omp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <vector>

namespace clattn::cli {

void check_size(int64_t v, int64_t lo, int64_t hi, const char* what) {
  if (v >= lo && v <= hi) return;
  if (hi == std::numeric_limits<int64_t>::max()) usage_fail(what, " must be >= ", lo, ", got ", v);
  usage_fail(what, " must be in [", lo, ", ", hi, "], got ", v);
}

void check_elements(std::initializer_list<int64_t> dims, const char* what) {
  bool too_big = false;
  int64_t n = 1;
  for (const int64_t d : dims) {
    if (d == 0) return;  // an empty tensor, whatever the other sizes
    if (too_big || d > kMaxElements / n) too_big = true;  // n * d > kMaxElements, without overflow
    else n *= d;
  }
  usage_check(!too_big, what, " would have more than ", kMaxElements, " elements (",
              kMaxElements / (int64_t{1} << 28), " GiB of F32): reduce the sizes");
}

int available_processors() { return std::max(1, omp_get_num_procs()); }

void check_cli_ranks_agree(const std::string& who, const std::vector<std::pair<std::string, std::string>>& inputs) {
  if (!launched_by_mpi()) return;
  Communicator& comm = world();
  if (comm.size() <= 1) return;
  // The arguments as the launcher passed them (NUL-separated in /proc/self/cmdline), without the
  // program, whose path may differ between nodes.
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  const std::string raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::string args;
  const size_t first = raw.find('\0');
  for (size_t at = first == std::string::npos ? raw.size() : first + 1; at < raw.size();) {
    const size_t e = std::min(raw.find('\0', at), raw.size());
    args += (args.empty() ? "" : " ") + raw.substr(at, e - at);
    at = e + 1;
  }
  std::vector<std::pair<std::string, std::string>> facts{{"command line", args}};
  for (const auto& [name, path] : inputs)
    if (!path.empty()) facts.emplace_back(name, file_fingerprint(path));
  check_ranks_agree(comm, who, facts);
}

CLI::Option* add_threads_option(CLI::App* sub, int& threads, const char* cmd) {
  return sub->add_option_function<int>(
      "--threads",
      [&threads, cmd](const int& v) {
        usage_check(v >= 1, cmd, ": --threads must be >= 1 (leave it out to use every processor), got ", v);
        threads = v;
      },
      "OpenMP threads, >= 1 (default: all available; more than the machine's processors are capped)");
}

namespace {

// The candidates nearest to `word`, if near enough to be a slip (the library's rule, spec.h).
std::vector<std::string> nearest(const std::string& word, const std::vector<std::string>& candidates) {
  return nearest_names(word, candidates);
}

std::vector<std::string> option_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* opt : app.get_options()) {
    for (const std::string& l : opt->get_lnames()) names.push_back("--" + l);
    for (const std::string& s : opt->get_snames()) names.push_back("-" + s);
  }
  return names;
}

bool is_number(const std::string& s) {
  if (s.empty()) return false;
  char* end = nullptr;
  (void)std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

}  // namespace

// The subcommands that have an option named `name`, and whether it takes a value there.
std::vector<std::string> commands_with_option(CLI::App& app, const std::string& name, bool& takes_value) {
  std::vector<std::string> out;
  takes_value = false;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    for (const CLI::Option* opt : sub->get_options()) {
      bool match = false;
      for (const std::string& l : opt->get_lnames()) match = match || "--" + l == name;
      for (const std::string& s : opt->get_snames()) match = match || "-" + s == name;
      if (!match || opt->get_group().empty()) continue;
      out.push_back(sub->get_name());
      takes_value = takes_value || opt->get_items_expected_min() > 0;
    }
  return out;
}

UsageHints usage_hints(CLI::App& app, int argc, const char* const* argv) {
  UsageHints hints;
  std::vector<std::string> commands;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    commands.push_back(sub->get_name());
  const CLI::App* context = &app;
  std::vector<std::string> known = option_names(app);
  bool saw_command = false, skip_value = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;  // the rest are values
    if (arg.size() > 1 && arg[0] == '-' && !is_number(arg)) {
      skip_value = false;
      const std::string name = arg.substr(0, arg.find('='));
      if (std::find(known.begin(), known.end(), name) != known.end()) continue;
      if (!saw_command) {
        // An option of a command written before the command ("clattn --attention full").
        bool takes_value = false;
        const std::vector<std::string> owners = commands_with_option(app, name, takes_value);
        if (!owners.empty()) {
          hints.lines.push_back("'" + name + "' is an option of a command (" + joined(owners) +
                                "), not of clattn itself: put the command first, e.g. 'clattn " + owners.front() +
                                " " + name + (takes_value ? " ..." : "") + "'");
          skip_value = takes_value && arg.find('=') == std::string::npos;
          continue;
        }
      }
      const auto near = nearest(name, known);
      if (!near.empty())
        hints.lines.push_back("unknown option '" + name + "'" +
                              (context == &app ? "" : " of " + context->get_name()) +
                              ": did you mean " + joined(near) + "?");
    } else if (skip_value) {
      skip_value = false;
    } else if (!saw_command) {  // the first word is the subcommand
      saw_command = true;
      if (std::find(commands.begin(), commands.end(), arg) != commands.end()) {
        context = app.get_subcommand(arg);
        known = option_names(*context);
        hints.command = arg;
      } else {
        const auto near = nearest(arg, commands);
        hints.lines.push_back("unknown command '" + arg + "'" +
                              (near.empty() ? " (the commands: " + joined(commands) + ")"
                                                    : ": did you mean " + joined(near) + "?"));
      }
    }
  }
  if (!saw_command && hints.lines.empty()) {
    hints.no_command = true;
    hints.lines.push_back("give a command: " + joined(commands) + " ('clattn --help' says what each does)");
  }
  return hints;
}

CLI::Validator spec_validator() {
  return CLI::Validator(
      [](std::string& plan) -> std::string {
        size_t start = 0;
        while (start <= plan.size()) {
          const size_t end = std::min(plan.find(';', start), plan.size());
          const std::string spec = plan.substr(start, end - start);
          if (!spec.empty() && spec != "all") {
            try {
              (void)make_attention(spec);
            } catch (const Error& e) {
              return e.what();
            }
          }
          start = end + 1;
        }
        return {};
      },
      "SPEC");
}

namespace {
const char* const kPlanHelp = "attention plan file written by `clattn approx --target` (JSON with \"plan\")";
}

CLI::Option* add_plan_file_option(CLI::App* sub, std::string& attention, std::vector<std::string>* files) {
  return sub->add_option_function<std::string>(
      "--plan",
      [&attention, files](const std::string& path) {
        attention = read_plan_file(path);
        if (files) files->push_back(path);
      },
      kPlanHelp);
}

CLI::Option* add_plan_file_option(CLI::App* sub, std::vector<std::string>& attention, std::vector<std::string>* files) {
  return sub->add_option_function<std::string>(
      "--plan",
      [&attention, files](const std::string& path) {
        attention.push_back(read_plan_file(path));
        if (files) files->push_back(path);
      },
      kPlanHelp);
}

namespace {

struct FileId {
  dev_t dev;
  ino_t ino;
  bool operator==(const FileId&) const = default;
};

// The file `path` names, following symlinks; none when it does not exist (or cannot be seen).
std::optional<FileId> file_id(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileId{st.st_dev, st.st_ino};
}

// Where a path that may not exist yet would be: absolute, its existing part's symlinks resolved.
std::filesystem::path where(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::weakly_canonical(std::filesystem::absolute(path, ec), ec);
  return ec ? std::filesystem::path(path).lexically_normal() : p;
}

// Why writing `out` would destroy the input `in` (the message's tail after the output's name),
// or "" when it would not.
std::string clash(const std::string& out, const PathArg& in) {
  namespace fs = std::filesystem;
  const std::optional<FileId> o = file_id(out);
  const std::optional<FileId> i = file_id(in.path);
  const std::string named = in.option + " '" + in.path + "'";
  if (!in.folder) {
    if (o && i ? *o == *i : where(out) == where(in.path))
      return "is the command's input " + named + ": it would be overwritten; write the output elsewhere";
    return "";
  }
  // Any file of the folder may be read (shards, tokenizer files), and one written there may be
  // read on the next load: the folder is out of bounds, through any name of it.
  fs::path parent = fs::path(out).parent_path();
  if (parent.empty()) parent = ".";
  const std::optional<FileId> pd = file_id(parent.string());
  if (i && pd ? *pd == *i : where(parent.string()) == where(in.path))
    return "is inside the command's input " + named +
           ", a model folder (its files are read, now or at the next load): write the output elsewhere";
  if (!o || !i) return "";
  std::error_code ec;
  for (fs::directory_iterator it(in.path, ec), end; !ec && it != end; it.increment(ec))
    if (file_id(it->path().string()) == o)
      return "is '" + it->path().string() + "', a file of the command's input " + named +
             " (a model folder): it would be overwritten; write the output elsewhere";
  return "";
}

}  // namespace

std::vector<PathArg> path_args(const std::string& option, const std::vector<std::string>& paths) {
  std::vector<PathArg> out;
  for (const std::string& p : paths) out.push_back({option, p, false});
  return out;
}

void check_outputs(const char* cmd, const std::vector<PathArg>& outputs, const std::vector<PathArg>& inputs) {
  for (size_t k = 0; k < outputs.size(); ++k) {
    const PathArg& out = outputs[k];
    if (out.path.empty()) continue;
    // Files before folders: a feature set kept in its model's folder is named as the input it is.
    for (const bool folders : {false, true})
      for (const PathArg& in : inputs) {
        if (in.path.empty() || in.folder != folders) continue;
        const std::string why = clash(out.path, in);
        usage_check(why.empty(), cmd, ": ", out.option, " '", out.path, "' ", why);
      }
    for (size_t j = 0; j < k; ++j) {
      if (outputs[j].path.empty()) continue;
      const std::optional<FileId> a = file_id(out.path), b = file_id(outputs[j].path);
      usage_check(!(a && b ? *a == *b : where(out.path) == where(outputs[j].path)), cmd, ": ", out.option, " '",
                  out.path, "' is also ", outputs[j].option, " '", outputs[j].path,
                  "': one would overwrite the other; give two files");
    }
  }
}

CLI::Option* add_kv_cache_option(CLI::App* sub, std::string& type) {
  return sub
      ->add_option("--kv-cache", type,
                   "KV cache storage: f32, or f16/bf16 (half the bytes a decode step reads; full and local "
                   "attention only; compute stays f32)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}, CLI::ignore_case))
      ->capture_default_str();
}

CLI::Option* add_weights_option(CLI::App* sub, std::string& type) {
  return sub
      ->add_option("--weights", type,
                   "weights of the linear layers: f32, or f16/bf16 (half the bytes a decode step reads; "
                   "embeddings, norms and biases stay f32; compute stays f32)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}, CLI::ignore_case))
      ->capture_default_str();
}

CLI::Option* add_format_option(CLI::App* sub, std::string& format) {
  CLI::Option* o = sub->add_option("-o,--format", format,
                                   "what goes to stdout: text (a table), md (Markdown table), csv (a header row, "
                                   "then one line per result), json (one document), jsonl (one object per result)")
                       ->check(CLI::IsMember({"text", "md", "csv", "json", "jsonl"}))
                       ->capture_default_str();
  return o;
}

int checked_threads(int requested, const char* cmd) {
  usage_check(requested >= 0, cmd, ": --threads must be >= 1 (leave it out to use every processor), got ",
              requested);
  if (requested == 0) return std::max(1, omp_get_max_threads());
  const int procs = available_processors();
  if (requested <= procs) return requested;
  std::fprintf(stderr, "clattn %s: --threads %d capped at %d (the machine's processors)\n", cmd, requested, procs);
  return procs;
}

}  // namespace clattn::cli

namespace clattn::cli {

void check_context(int64_t T, int64_t context, const std::string& what, const char* field) {
  check(context <= 0 || T <= context, what, " holds ", T, " tokens per sequence, past the model's context of ",
        context, " (", field, "): give at most ", context, " tokens");
}

int local_ranks() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const char* s = std::getenv(v); s && *s) {
      const int n = std::atoi(s);
      if (n >= 1) return n;
    }
  return 1;
}

}  // namespace clattn::cli

namespace clattn::cli {

void add_comm_timeout_option(CLI::App* sub) {
  sub->add_option_function<double>(
      "--comm-timeout",
      [](double s) {
        usage_check(s >= 0 && std::isfinite(s), "--comm-timeout must be >= 0 seconds (0: wait for ever), got ", s);
        set_comm_timeout(s);
      },
      "under mpirun: seconds a rank may wait in one exchange before it ends the job, naming it (a stopped or hung "
      "peer; default 300, or $CLATTN_COMM_TIMEOUT; 0 waits for ever)");
}

std::vector<std::string> non_empty_lines(const std::string& path, const char* cmd) {
  const std::string text = read_input_file(path, std::string(cmd) + ": --text", kMaxTextBytes);
  std::vector<std::string> lines;
  for (size_t at = 0; at < text.size();) {
    const size_t e = std::min(text.find('\n', at), text.size());
    std::string_view line = std::string_view(text).substr(at, e - at);
    at = e + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") != std::string_view::npos) lines.emplace_back(line);
  }
  check(!lines.empty(), cmd, ": '", path, "' has no non-empty line");
  return lines;
}

}  // namespace clattn::cli
