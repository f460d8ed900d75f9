// Pictures through gnuplot (Debian's gnuplot-nox, pngcairo terminal): the commands write their
// data and a script into a private temporary folder, run gnuplot on it, check its exit status and
// that it made a PNG, then copy the PNG to the output path atomically (clattn/atomic_file.h), so a
// failed plot never leaves a half-written picture. No pixel is drawn by clattn itself.
//
// The program is $CLATTN_GNUPLOT when set (a path; tests point it at nothing to check the error),
// else `gnuplot` on PATH. When it cannot be found the error names the Debian package to install.
// $CLATTN_PLOT_KEEP names a folder where each picture's script and data are kept (in a subfolder
// named after the picture), for debugging a figure.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace clattn::cli::plot {

// The gnuplot executable to run, resolved now; throws clattn::Error naming gnuplot-nox when there
// is none. Commands call it before long work, so a missing tool fails in a second, not after it.
std::string find_gnuplot();

// A fresh private folder (mkdtemp under $TMPDIR or /tmp), removed with its contents on
// destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  // Writes text, or raw floats (gnuplot's `binary array=(cols,rows) format='%float32'`), to a file
  // of the folder and returns its path.
  std::string write(const std::string& name, const std::string& text) const;
  std::string write_floats(const std::string& name, std::span<const float> values) const;

 private:
  std::string path_;
};

// Runs gnuplot on `script` (saved as plot.gp in dir; it must `set output` to dir.file("plot.png"))
// and copies the PNG it made to out_png. Errors name gnuplot's exit status and its last message.
void run_gnuplot(const TempDir& dir, const std::string& script, const std::string& out_png);

// A gnuplot string expression that reads as `text` and runs nothing. Every string from data,
// file names or paths reaches gnuplot through it: gnuplot expands backquotes (`cmd` runs cmd)
// and backslash escapes inside double quotes, but nothing inside single quotes, where only ''
// stands for '. So the text goes in single quotes with ' doubled; a line break becomes the
// constant "\n" joined with `.` (a raw one would end the command), and other control characters
// (NUL, CR, tab ...) a space. Titles are set with `noenhanced`, so _ ^ { } @ print as themselves.
std::string quote(const std::string& text);

// Width and height from a PNG's IHDR chunk; throws when the file is not a PNG.
struct PngSize {
  int64_t width = 0, height = 0;
};
PngSize png_size(const std::string& path);

// One saved `clattn bench` result set: the --json document ({"machine", "results"}), or a
// -o jsonl stream of result rows (then no machine facts); `name` labels it in legends.
struct BenchRun {
  std::string name;
  nlohmann::json machine;  // object or null
  std::vector<nlohmann::json> results;
};
BenchRun read_bench_file(const std::string& path);

// Time against N (log-log, one line per spec and mode, bars from the fastest to the slowest
// call) beside peak memory against N, with the machine facts in the caption (plot.cpp). Throws
// when no run holds a row with a time.
void plot_bench(const std::vector<BenchRun>& runs, const std::string& out_png);
// The gnuplot script of that figure, its data files written into dir (fuzz/fuzz_plot.cpp checks
// that nothing from the files can leave a quoted string).
std::string bench_script(const std::vector<BenchRun>& runs, const TempDir& dir);

// One `clattn train --log` file: read tolerantly (unknown keys ignored, lines that are not JSON —
// a run killed mid-write — skipped with a note); a file with no usable line is refused.
struct LogRun {
  std::string file, spec, label, metric;  // metric "" when no line names it; label: the legend's
  std::vector<std::pair<double, double>> loss;            // (step, loss)
  std::vector<std::tuple<double, double, double>> eval;   // (step, metric, elapsed_s or NaN)
};
LogRun read_log(const std::string& path);
// Legend names: each run's spec and its file (or labels[i] when given), so two runs of one spec
// stay apart; files named alike in different folders keep their paths.
void name_runs(std::vector<LogRun>& runs, const std::vector<std::string>& labels);
// The script of `plot --logs`: loss, metric against step and against time, one row of panels per
// metric (bits per character and accuracy never share an axis); data files written into dir.
std::string logs_script(const std::vector<LogRun>& runs, const TempDir& dir);

}  // namespace clattn::cli::plot
