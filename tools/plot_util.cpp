// The gnuplot driver (plot_util.h): find the program, run it on a script in a private folder,
// check what it made, and read saved bench results.
#include "plot_util.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "clattn/atomic_file.h"
#include "clattn/error.h"
#include "clattn/input_file.h"

extern char** environ;

namespace clattn::cli::plot {
namespace {

constexpr const char* kInstallHint =
    "install Debian's gnuplot-nox (apt-get install gnuplot-nox; scripts/install-deps.sh does it), "
    "or point CLATTN_GNUPLOT at a gnuplot with the pngcairo terminal";

bool executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The last few non-empty lines of a program's message, joined by " | ", for an error.
std::string tail_lines(const std::string& text, size_t lines) {
  std::vector<std::string> all;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos) all.push_back(line);
  if (all.empty()) return "(no message)";
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i)
    out += (out.empty() ? "" : " | ") + all[i];
  return out;
}

// $CLATTN_PLOT_KEEP: a folder where each picture's script and data files are kept, in a
// subfolder named after the picture (for debugging a figure, and for tests that read them).
void keep_files(const TempDir& dir, const std::string& out_png) {
  const char* keep = std::getenv("CLATTN_PLOT_KEEP");
  if (!keep || !*keep) return;
  namespace fs = std::filesystem;
  const fs::path to = fs::path(keep) / fs::path(out_png).stem();
  std::error_code ec;
  fs::create_directories(to, ec);
  check(!ec, "plot: CLATTN_PLOT_KEEP: cannot create '", to.string(), "': ", ec.message());
  for (const auto& e : fs::directory_iterator(dir.path())) {
    fs::copy_file(e.path(), to / e.path().filename(), fs::copy_options::overwrite_existing, ec);
    check(!ec, "plot: CLATTN_PLOT_KEEP: cannot copy '", e.path().string(), "' to '", to.string(), "': ", ec.message());
  }
}

}  // namespace

std::string find_gnuplot() {
  if (const char* env = std::getenv("CLATTN_GNUPLOT"); env && *env) {
    check(executable_file(env), "plot: gnuplot not found: CLATTN_GNUPLOT='", env,
          "' is not an executable file; ", kInstallHint);
    return env;
  }
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  for (std::string d; std::getline(dirs, d, ':');) {
    const std::filesystem::path candidate = std::filesystem::path(d.empty() ? "." : d) / "gnuplot";
    if (executable_file(candidate.string())) return candidate.string();
  }
  fail("plot: gnuplot not found on PATH; ", kInstallHint);
}

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/clattn-plot-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  check(::mkdtemp(buf.data()) != nullptr, "plot: cannot create a temporary folder from '", tmpl,
        "': ", std::strerror(errno));
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string TempDir::write(const std::string& name, const std::string& text) const {
  const std::string p = file(name);
  std::ofstream out(p, std::ios::binary);
  out << text;
  out.close();
  check(out.good(), "plot: cannot write '", p, "'");
  return p;
}

std::string TempDir::write_floats(const std::string& name, std::span<const float> values) const {
  const std::string p = file(name);
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(values.data()),
            static_cast<std::streamsize>(values.size() * sizeof(float)));
  out.close();
  check(out.good(), "plot: cannot write '", p, "'");
  return p;
}

void run_gnuplot(const TempDir& dir, const std::string& script, const std::string& out_png) {
  const std::string program = find_gnuplot();
  const std::string gp = dir.write("plot.gp", script);
  const std::string log = dir.file("gnuplot.log");
  const std::string png = dir.file("plot.png");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char*> argv = {const_cast<char*>(program.c_str()), const_cast<char*>(gp.c_str()), nullptr};
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, program.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  check(rc == 0, "plot: cannot run '", program, "': ", std::strerror(rc), "; ", kInstallHint);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    check(errno == EINTR, "plot: waiting for gnuplot failed: ", std::strerror(errno));
  }
  const std::string msg = read_all(log);
  check(WIFEXITED(status), "plot: gnuplot ('", program, "') was killed by signal ",
        WIFSIGNALED(status) ? WTERMSIG(status) : 0, ": ", tail_lines(msg, 4));
  check(WEXITSTATUS(status) == 0, "plot: gnuplot ('", program, "') failed with exit status ",
        WEXITSTATUS(status), ": ", tail_lines(msg, 4));
  const std::string bytes = read_all(png);
  check(bytes.size() > 24 && bytes.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0, "plot: gnuplot ('", program,
        "') exited normally but wrote no PNG (does it have the pngcairo terminal? ", kInstallHint,
        "); its message: ", tail_lines(msg, 4));
  AtomicFile f(out_png);
  f.write(bytes);
  f.commit();
  keep_files(dir, out_png);
}

std::string quote(const std::string& text) {
  std::string q = "'";
  for (const char c : text) {
    if (c == '\n') {
      q += "'.\"\\n\".'";
    } else if (c == '\'') {
      q += "''";
    } else if ((static_cast<unsigned char>(c) < 0x20) || c == 0x7f) {
      q += ' ';
    } else {
      q += c;
    }
  }
  return q + "'";
}

PngSize png_size(const std::string& path) {
  const std::string b = read_all(path);
  check(b.size() >= 24 && b.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0 && b.compare(12, 4, "IHDR") == 0,
        "'", path, "' is not a PNG file");
  auto be32 = [&](size_t at) {
    return (int64_t{static_cast<uint8_t>(b[at])} << 24) | (int64_t{static_cast<uint8_t>(b[at + 1])} << 16) |
           (int64_t{static_cast<uint8_t>(b[at + 2])} << 8) | int64_t{static_cast<uint8_t>(b[at + 3])};
  };
  return {be32(16), be32(20)};
}

namespace {

// What a JSON document that is not a bench result is, for the refusal ("" when it is one).
std::string other_result(const nlohmann::json& doc) {
  if (!doc.is_object()) return "a JSON " + std::string(doc.type_name()) + ", not an object";
  if (doc.contains("results") && doc["results"].is_array()) {
    if (doc.contains("model")) return "an approx result (clattn approx --json)";
    if (doc.contains("checkpoint")) return "an eval result (clattn eval -o json)";
    if (!doc.contains("machine")) return "a JSON document with \"results\" but no \"machine\"";
    for (const auto& r : doc["results"])
      if (r.is_object() && r.contains("attention") && !r.contains("spec"))
        return "a bench-model result (clattn bench-model --json)";
    return "";
  }
  if (doc.contains("config") || doc.contains("step") || doc.contains("end"))
    return "a training log (clattn train --log; draw it with plot --logs)";
  return "";
}

// A row of `clattn bench`: a spec and a sequence length (its times are null when the case failed).
bool bench_row(const nlohmann::json& r) {
  return r.is_object() && r.contains("spec") && r["spec"].is_string() && r.contains("n");
}

[[noreturn]] void not_bench(const std::string& path, const std::string& what) {
  fail("plot: '", path, "' is ", what, ", not a bench result: plot --bench draws `clattn bench --json` files ",
       "({\"machine\", \"results\"}) and `clattn bench -o jsonl` rows");
}

}  // namespace

BenchRun read_bench_file(const std::string& path) {
  // Bounded, and never blocking on a FIFO or device (clattn/input_file.h).
  const std::string text = read_input_file(path, "plot: bench file", kMaxJsonBytes);
  BenchRun run;
  run.name = std::filesystem::path(path).filename().string();
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
  if (!doc.is_discarded() && doc.is_object() && doc.contains("results")) {
    check(doc["results"].is_array(), "plot: '", path, "': \"results\" is not an array");
    if (const std::string other = other_result(doc); !other.empty()) not_bench(path, other);
    if (doc.contains("machine") && doc["machine"].is_object()) run.machine = doc["machine"];
    for (const auto& r : doc["results"]) run.results.push_back(r);
    return run;
  }
  if (!doc.is_discarded() && !doc.is_object()) not_bench(path, other_result(doc));
  // -o jsonl: one result object per line.
  std::istringstream lines(text);
  std::string line;
  int64_t number = 0;
  while (std::getline(lines, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json r = nlohmann::json::parse(line, nullptr, false);
    check(!r.is_discarded() && r.is_object(), "plot: '", path, "' is neither a bench --json document ",
          "({\"machine\", \"results\"}) nor bench -o jsonl rows: line ", number, " is not a JSON object");
    if (!bench_row(r)) {
      const std::string other = other_result(r);
      not_bench(path, other.empty() ? "JSON lines whose line " + std::to_string(number) +
                                          " is not a bench row (no \"spec\" and \"n\")"
                                    : other);
    }
    run.results.push_back(r);
  }
  return run;
}

}  // namespace clattn::cli::plot
