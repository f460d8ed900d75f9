// `clattn plot`: pictures of saved results, drawn by gnuplot (plot_util.h).
//   --bench A.json [B.json ...]  time and peak memory against N, log-log, one line per spec and
//                                mode, bars from the fastest to the slowest timed call, several
//                                files overlaid (e.g. forward and forward+backward); the same
//                                figure `clattn bench --plot` draws at the end of a sweep. A file
//                                that is not a bench result (an approx or eval result, a log) is
//                                refused, named for what it is.
//   --logs RUN.jsonl [...]       `clattn train --log` files: training loss against step, the
//                                evaluation metric against step and against wall-clock time, one
//                                line per run named by its attention spec and its file (or
//                                --label); runs of different metrics get a row of panels each.
//   --plan-search PLAN.json      a plan file of `clattn approx --target`: every plan the search
//                                evaluated as its attention cost (a share of full attention's)
//                                against its metric on the calibration data, the Pareto front of
//                                the cheapest plans at each metric, the target and the chosen plan.
// Log lines are read tolerantly: unknown keys are ignored, a line that is not JSON (a run killed
// mid-write) is skipped with a note, and a file with no usable line is refused.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "clattn/error.h"
#include "clattn/input_file.h"
#include "commands.h"
#include "plot_util.h"
#include "progress.h"

namespace clattn::cli {
namespace plot {
namespace {

using nlohmann::json;

constexpr int kBenchWidth = 1400, kBenchHeight = 640;
constexpr int kLogsWidth = 1500, kLogsHeight = 520;  // per row of panels (one row per metric)
constexpr uint64_t kMaxLogBytes = uint64_t{1} << 30;  // a training log: ~200 bytes a step

std::string num(double x, const char* f = "%.6g") {
  char b[64];
  std::snprintf(b, sizeof b, f, x);
  return b;
}

std::string str_or(const json& j, const char* key, const std::string& dflt) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : dflt;
}

bool number_at(const json& j, const char* key, double& out) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return false;
  out = j[key].get<double>();
  return std::isfinite(out);
}

// The preamble of every figure: pngcairo at a fixed size, literal text (no enhanced markup).
std::string preamble(const TempDir& dir, int w, int h) {
  return "set terminal pngcairo size " + std::to_string(w) + "," + std::to_string(h) +
         " enhanced font 'DejaVu Sans,10'\nset termoption noenhanced\nset output " +
         quote(dir.file("plot.png")) + "\nset grid\nset encoding utf8\n";
}

struct Point {
  double n, ms, ms_min, ms_max, rss;  // median, fastest and slowest timed call; peak memory added
  bool operator<(const Point& o) const { return n < o.n; }
};

struct Series {
  std::string spec, mode, file;
  bool causal = false;
  std::vector<Point> points;
};

std::string mode_text(const std::string& mode, bool causal) {
  std::string m = mode == "fwdbwd" ? "forward+backward" : mode == "fwd" ? "forward" : mode;
  return causal ? m + ", causal" : m;
}

}  // namespace

std::string bench_script(const std::vector<BenchRun>& runs, const TempDir& dir) {
  std::vector<Series> series;
  std::map<std::tuple<size_t, std::string, std::string, bool>, size_t> index;
  int64_t skipped = 0;
  for (size_t fi = 0; fi < runs.size(); ++fi) {
    for (const json& r : runs[fi].results) {
      double n = 0, ms = 0, rss = 0;
      const std::string spec = str_or(r, "spec", "");
      if (spec.empty() || !number_at(r, "n", n) || !number_at(r, "ms_median", ms) || n <= 0 || ms <= 0) {
        ++skipped;  // a failed case (error row) or a row of another schema
        continue;
      }
      if (!number_at(r, "rss_mb", rss)) rss = 0;
      // The spread of the timed calls (older files without it draw a bar of zero height).
      double lo = ms, hi = ms;
      if (!number_at(r, "ms_min", lo) || lo > ms) lo = ms;
      if (!number_at(r, "ms_max", hi) || hi < ms) hi = ms;
      const std::string mode = str_or(r, "mode", "fwd");
      const bool causal = r.contains("causal") && r["causal"].is_boolean() && r["causal"].get<bool>();
      const auto key = std::make_tuple(fi, spec, mode, causal);
      auto [it, fresh] = index.emplace(key, series.size());
      if (fresh) series.push_back(Series{spec, mode, runs[fi].name, causal, {}});
      series[it->second].points.push_back(Point{n, ms, lo, hi, rss});
    }
  }
  check(!series.empty(), "plot: no bench result with a time to draw (", skipped,
        " rows without one) in ", runs.size() == 1 ? "'" + runs[0].name + "'" : "the given files");
  if (skipped > 0) std::fprintf(stderr, "plot: %lld bench rows without a time (failed cases) left out\n",
                                static_cast<long long>(skipped));

  // Colour by spec, dash type by (file, mode): the same variant keeps its colour across overlays.
  std::vector<std::string> specs;
  std::vector<std::string> variants;  // "file|mode|causal"
  for (const Series& s : series) {
    if (std::find(specs.begin(), specs.end(), s.spec) == specs.end()) specs.push_back(s.spec);
    const std::string v = s.file + "|" + s.mode + "|" + (s.causal ? "c" : "");
    if (std::find(variants.begin(), variants.end(), v) == variants.end()) variants.push_back(v);
  }
  bool several_modes = false, several_files = runs.size() > 1;
  for (const Series& s : series)
    several_modes |= s.mode != series[0].mode || s.causal != series[0].causal;

  std::string caption;
  for (const BenchRun& run : runs) {
    std::string modes;
    for (const Series& s : series) {
      if (s.file != run.name) continue;
      const std::string m = mode_text(s.mode, s.causal);
      if (modes.find(m) == std::string::npos) modes += (modes.empty() ? "" : " / ") + m;
    }
    std::string line = several_files ? run.name + ": " : "clattn bench: ";
    line += modes.empty() ? "no results" : modes;
    if (!run.results.empty()) {
      const json& r0 = run.results.front();
      double b = 0, h = 0, d = 0;
      if (number_at(r0, "batch", b) && number_at(r0, "heads", h) && number_at(r0, "dim", d))
        line += ", B=" + num(b) + " H=" + num(h) + " D=" + num(d);
    }
    double sg = 0, th = 0;
    if (number_at(run.machine, "sgemm_gflops", sg)) line += "; sgemm " + num(sg, "%.0f") + " GFLOP/s";
    if (number_at(run.machine, "threads", th)) line += ", " + num(th) + " threads";
    const std::string cpu = str_or(run.machine, "cpu", "");
    if (!cpu.empty()) line += ", " + cpu;
    caption += (caption.empty() ? "" : "\n") + line;
  }

  std::string s = preamble(dir, kBenchWidth, kBenchHeight);
  s += "set logscale x 2\nset logscale y 10\nset format x '%g'\nset format y '%g'\nset xlabel 'sequence length N'\n";
  s += "set key top left Left reverse font ',9' samplen 3\n";
  s += "set bmargin 4\nset tmargin 6\n";
  s += "set multiplot layout 1,2 title " + quote(caption) + " font ',11'\n";
  std::string plot_t, plot_m;
  for (size_t i = 0; i < series.size(); ++i) {
    Series& se = series[i];
    std::sort(se.points.begin(), se.points.end());
    std::string data;
    for (const Point& p : se.points)
      data += num(p.n) + " " + num(p.ms) + " " + num(p.rss) + " " + num(p.ms_min) + " " + num(p.ms_max) + "\n";
    const std::string f = dir.write("bench" + std::to_string(i) + ".dat", data);
    const size_t color = std::find(specs.begin(), specs.end(), se.spec) - specs.begin();
    const std::string v = se.file + "|" + se.mode + "|" + (se.causal ? "c" : "");
    const size_t dash = std::find(variants.begin(), variants.end(), v) - variants.begin();
    std::string title = se.spec;
    if (several_modes) title += " (" + mode_text(se.mode, se.causal) + ")";
    if (several_files) title += " [" + se.file + "]";
    const std::string look = " lw 2 lc " + std::to_string(color + 1) + " dt " + std::to_string(dash + 1) +
                             " pt " + std::to_string(7 + dash % 6);
    const std::string style = " with linespoints" + look;
    // Time: the median joined by lines, a bar from the fastest to the slowest timed call.
    plot_t += (plot_t.empty() ? "plot " : ", \\\n  ") + quote(f) + " using 1:2:4:5 with yerrorlines" + look +
              " title " + quote(title);
    plot_m += (plot_m.empty() ? "plot " : ", \\\n  ") + quote(f) + " using 1:($3 > 0 ? $3 : 1/0)" +
              style + " notitle";
  }
  s += "set title 'time per call (median of the timed calls; bars: fastest to slowest)'\nset ylabel 'ms'\n" +
       plot_t + "\n";
  s += "set title 'peak memory added by the call (workspace, context; 0 MB not drawn)'\nset ylabel 'MB'\n" + plot_m + "\n";
  s += "unset multiplot\n";
  return s;
}

void plot_bench(const std::vector<BenchRun>& runs, const std::string& out_png) {
  find_gnuplot();
  TempDir dir;
  run_gnuplot(dir, bench_script(runs, dir), out_png);
}

namespace {

// The attention spec of a run from its header line: "attention" at the top or inside "config".
std::string attention_of(const json& j) {
  std::string a = str_or(j, "attention", "");
  if (a.empty() && j.contains("config")) a = str_or(j["config"], "attention", "");
  return a;
}

}  // namespace

LogRun read_log(const std::string& path) {
  // Bounded, and never blocking on a FIFO or device (clattn/input_file.h).
  std::istringstream in(read_input_file(path, "plot: log", kMaxLogBytes));
  LogRun run;
  run.file = path;
  std::string line;
  int64_t number = 0, bad = 0;
  std::map<double, double> loss;
  std::map<double, std::pair<double, double>> eval;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      ++bad;
      continue;
    }
    if (run.spec.empty()) run.spec = attention_of(j);
    for (const char* k : {"metric", "eval_metric_name", "metric_name"}) {
      const std::string m = str_or(j, k, str_or(j.contains("config") ? j["config"] : json(), k, ""));
      if (!m.empty()) run.metric = m;
    }
    double step = 0, v = 0, t = 0;
    if (!number_at(j, "step", step)) continue;
    // A resumed run appends: a step logged twice keeps its last line.
    if (number_at(j, "loss", v)) loss[step] = v;
    if (number_at(j, "eval_metric", v)) eval[step] = {v, number_at(j, "elapsed_s", t) ? t : std::nan("")};
  }
  for (const auto& [st, v] : loss) run.loss.emplace_back(st, v);
  for (const auto& [st, vt] : eval) run.eval.emplace_back(st, vt.first, vt.second);
  check(run.loss.size() + run.eval.size() > 0, "plot: '", path, "' has no usable line (", number,
        " lines, ", bad, " not JSON): expected `clattn train --log` lines with \"step\" and \"loss\", or ",
        "\"step\" and \"eval_metric\"");
  if (bad > 0) std::fprintf(stderr, "plot: '%s': %lld lines that are not JSON objects skipped\n", path.c_str(),
                            static_cast<long long>(bad));
  return run;
}

void name_runs(std::vector<LogRun>& runs, const std::vector<std::string>& labels) {
  for (size_t i = 0; i < runs.size(); ++i) {
    LogRun& r = runs[i];
    std::string who = i < labels.size() ? labels[i] : std::filesystem::path(r.file).filename().string();
    if (i >= labels.size())
      for (size_t k = 0; k < runs.size(); ++k)
        if (k != i && k >= labels.size() && std::filesystem::path(runs[k].file).filename() ==
                                                std::filesystem::path(r.file).filename())
          who = r.file;
    r.label = r.spec.empty() ? who : r.spec + " (" + who + ")";
  }
}

std::string logs_script(const std::vector<LogRun>& runs, const TempDir& dir) {
  // Runs of different metrics (bits per character, accuracy ...) never share an axis: one row of
  // panels per metric. Runs whose log names no metric share the row "eval metric".
  std::vector<std::string> metrics;
  for (const LogRun& r : runs)
    if (std::find(metrics.begin(), metrics.end(), r.metric) == metrics.end()) metrics.push_back(r.metric);
  if (metrics.size() > 1)
    std::fprintf(stderr, "plot: the runs have %zu metrics; one row of panels each\n", metrics.size());
  const int rows = static_cast<int>(metrics.size());
  std::string s = preamble(dir, kLogsWidth, kLogsHeight * rows);
  s += "set key top right font ',9'\nset tmargin 4\n";
  s += "set multiplot layout " + std::to_string(rows) + ",3 title " +
       quote("clattn train: " + std::to_string(runs.size()) + (runs.size() == 1 ? " run" : " runs")) +
       " font ',11'\n";
  auto add = [](std::string& plot, const std::string& item) { plot += (plot.empty() ? "plot " : ", \\\n  ") + item; };
  // A panel no run has data for says so instead of drawing empty axes.
  auto panel = [&](const std::string& plot, const char* none) {
    return plot.empty() ? "set label 1 " + quote(none) + " at graph 0.5,0.5 center\nplot [0:1][0:1] 1/0 notitle\n"
                               "unset label 1\n"
                        : plot + "\n";
  };
  for (const std::string& metric_name : metrics) {
    const std::string metric = metric_name.empty() ? "eval metric" : metric_name;
    std::string p_loss, p_step, p_time;
    for (size_t i = 0; i < runs.size(); ++i) {
      const LogRun& r = runs[i];
      if (r.metric != metric_name) continue;
      const std::string lc = " lc " + std::to_string(i + 1) + " title " + quote(r.label);
      if (!r.loss.empty()) {
        std::string d;
        for (const auto& [st, v] : r.loss) d += num(st) + " " + num(v) + "\n";
        add(p_loss, quote(dir.write("loss" + std::to_string(i) + ".dat", d)) + " using 1:2 with lines lw 1.5" + lc);
      }
      std::string de, dt;
      for (const auto& [st, v, t] : r.eval) {
        de += num(st) + " " + num(v) + "\n";
        if (!std::isnan(t)) dt += num(t) + " " + num(v) + "\n";
      }
      if (!de.empty())
        add(p_step, quote(dir.write("eval" + std::to_string(i) + ".dat", de)) + " using 1:2 with linespoints lw 2 pt 7" + lc);
      if (!dt.empty())
        add(p_time, quote(dir.write("time" + std::to_string(i) + ".dat", dt)) + " using 1:2 with linespoints lw 2 pt 7" + lc);
    }
    const std::string of = rows > 1 ? " (runs of " + metric + ")" : "";
    s += "set title " + quote("training loss" + of) + "\nset xlabel 'step'\nset ylabel 'loss'\n" +
         panel(p_loss, "no training lines");
    s += "set title " + quote(metric + " (evaluation)") + "\nset xlabel 'step'\nset ylabel " + quote(metric) + "\n" +
         panel(p_step, "no evaluation lines");
    s += "set title " + quote(metric + " against wall-clock time") + "\nset xlabel 'elapsed (s)'\nset ylabel " +
         quote(metric) + "\n" + panel(p_time, "no evaluation lines with elapsed_s");
  }
  s += "unset multiplot\n";
  return s;
}

namespace {

void plot_logs(const std::vector<std::string>& paths, const std::vector<std::string>& labels,
               const std::string& out_png) {
  find_gnuplot();
  usage_check(labels.empty() || labels.size() == paths.size(), "plot: --label must be given once per --logs file (",
              paths.size(), " files, ", labels.size(), " labels)");
  std::vector<LogRun> runs;
  for (const std::string& p : paths) runs.push_back(read_log(p));
  name_runs(runs, labels);
  TempDir dir;
  run_gnuplot(dir, logs_script(runs, dir), out_png);
}

// A plan search (`approx --target`'s plan file): cost against metric per evaluated plan.
struct SearchPoint {
  double cost = 0, value = 0;
  std::string plan;
};

std::string search_script(const std::string& path, const TempDir& dir) {
  const json doc = json::parse(read_input_file(path, "plot: --plan-search", uint64_t{64} << 20), nullptr, false);
  check(doc.is_object() && doc.contains("evaluations") && doc["evaluations"].is_array(), "plot: '", path,
        "' is not a plan search (`clattn approx --target` writes one with \"evaluations\"; files of older "
        "versions have none)");
  double full = 0, target = 0;
  check(number_at(doc, "full_attention_cost", full) && full > 0 && number_at(doc, "target", target), "plot: '", path,
        "': full_attention_cost and target must be numbers");
  const std::string metric = str_or(doc, "metric", "agreement"), unit = str_or(doc, "cost_unit", "ms");
  const std::string chosen_plan = str_or(doc, "plan", "");
  const bool higher = metric != "kl";
  std::vector<SearchPoint> pts;
  for (const json& e : doc["evaluations"]) {
    SearchPoint p;
    if (!number_at(e, "cost", p.cost) || !number_at(e, "value", p.value)) continue;
    p.cost /= full;
    p.plan = str_or(e, "plan", "");
    pts.push_back(p);
  }
  check(!pts.empty(), "plot: '", path, "' holds no evaluated plan");
  // The front: sorted by cost (the better metric first at equal cost), each plan that beats every
  // cheaper one.
  std::vector<SearchPoint> sorted = pts;
  std::sort(sorted.begin(), sorted.end(), [&](const SearchPoint& a, const SearchPoint& b) {
    return a.cost < b.cost || (a.cost == b.cost && (higher ? a.value > b.value : a.value < b.value));
  });
  std::string all, front, chosen;
  for (const SearchPoint& p : pts) all += num(p.cost) + " " + num(p.value) + "\n";
  bool first = true;
  double best = 0;
  for (const SearchPoint& p : sorted)
    if (first || (higher ? p.value > best : p.value < best)) {
      front += num(p.cost) + " " + num(p.value) + "\n";
      best = p.value;
      first = false;
    }
  for (const SearchPoint& p : pts)
    if (p.plan == chosen_plan) chosen = num(p.cost) + " " + num(p.value) + "\n";
  int64_t length = 0;
  if (doc.contains("length") && doc["length"].is_number_integer()) length = doc["length"].get<int64_t>();
  std::string s = preamble(dir, 1100, 700);
  s += "set title " + quote("plan search of " + str_or(doc, "model", "?") + ": " + std::to_string(pts.size()) +
                            " plans evaluated, " + metric + " target " + num(target)) + "\n";
  s += "set xlabel " + quote("attention cost / full attention's (" + unit + " at N = " + std::to_string(length) + ", " +
                             str_or(doc, "cost", "timed") + ")") + "\n";
  s += "set ylabel " + quote(metric + " on the calibration half") + "\nset key outside bottom center horizontal\n";
  std::string plot = "plot " + quote(dir.write("all.dat", all)) + " using 1:2 with points pt 7 ps 0.9 lc rgb '#8899cc' "
                     "title 'evaluated plans', " + quote(dir.write("front.dat", front)) +
                     " using 1:2 with linespoints lw 2 pt 7 lc rgb '#cc3333' title 'Pareto front'";
  if (metric != "accuracy") plot += ", " + num(target) + " with lines dt 2 lw 1.5 lc rgb '#555555' title 'target'";
  if (!chosen.empty())
    plot += ", " + quote(dir.write("chosen.dat", chosen)) + " using 1:2 with points pt 6 ps 3 lw 2.5 lc rgb '#000000' "
            "title " + quote("chosen plan");
  return s + plot + "\n";
}

struct PlotOptions {
  std::vector<std::string> bench, logs, labels;
  std::string search, out;
};

void run_plot(const PlotOptions& o) {
  usage_check(!o.bench.empty() + !o.logs.empty() + !o.search.empty() == 1,
              "plot: give exactly one of --bench FILE..., --logs FILE... or --plan-search FILE");
  usage_check(o.labels.empty() || !o.logs.empty(), "plot: --label names --logs runs (bench files are named by file)");
  usage_check(!o.out.empty(), "plot: --output PNG is required");
  const std::string ext = std::filesystem::path(o.out).extension().string();
  usage_check(ext == ".png" || ext == ".PNG", "plot: --output must name a .png file, got '", o.out, "'");
  std::vector<PathArg> inputs = path_args("--bench", o.bench);
  for (const PathArg& p : path_args("--logs", o.logs)) inputs.push_back(p);
  inputs.push_back({"--plan-search", o.search});
  check_outputs("plot", {{"--output", o.out}}, inputs);
  Progress progress("plot", 0);
  progress.set(0, "drawing " + o.out + " with gnuplot");
  if (!o.search.empty()) {
    find_gnuplot();
    TempDir dir;
    run_gnuplot(dir, search_script(o.search, dir), o.out);
  } else if (!o.bench.empty()) {
    std::vector<BenchRun> runs;
    for (const std::string& p : o.bench) runs.push_back(read_bench_file(p));
    plot_bench(runs, o.out);
  } else {
    plot_logs(o.logs, o.labels, o.out);
  }
  const PngSize sz = png_size(o.out);
  std::fprintf(stderr, "plot: wrote %s (%lld x %lld)\n", o.out.c_str(), static_cast<long long>(sz.width),
               static_cast<long long>(sz.height));
}

}  // namespace
}  // namespace plot

void add_plot(CLI::App& app) {
  auto o = std::make_shared<plot::PlotOptions>();
  CLI::App* sub = app.add_subcommand(
      "plot", "Draw saved results with gnuplot (Debian gnuplot-nox): bench JSON (time and memory "
              "against N), train logs (loss and metric against steps and time) or a plan search (cost "
              "against metric)");
  sub->add_option("--bench", o->bench,
                  "`clattn bench --json` files (or -o jsonl output), overlaid in one figure");
  sub->add_option("--logs", o->logs, "`clattn train --log` files (JSON lines), one line per run");
  sub->add_option("--plan-search", o->search,
                  "a plan file of `clattn approx --target`: cost against metric of every evaluated plan, the Pareto "
                  "front, the target and the chosen plan");
  sub->add_option("--label", o->labels,
                  "legend name of each --logs run, in order (default: its file name), shown beside its spec");
  sub->add_option("--output", o->out, "the PNG to write (required)");
  sub->footer("The picture is drawn by gnuplot with the pngcairo terminal ($CLATTN_GNUPLOT, else gnuplot\n"
              "on PATH); without it the command fails and names the package: gnuplot-nox.");
  sub->callback([o] { plot::run_plot(*o); });
}

}  // namespace clattn::cli
