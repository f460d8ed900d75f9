// `clattn bench`: times attention variants over a sweep of sequence lengths (llama-bench style:
// warm-up, repetitions, median and min, a human table and --json), against the machine's measured
// sgemm peak and against full attention measured in the same run. Per case it also reports the
// peak memory the variant adds and its relative error to exact attention.
//
// Plan of one run: measure sgemm; then per length build the inputs once (bench_util.h explains the
// recipe), and per spec: allocate output and gradients, reset the peak-RSS counter, create the
// attention and its Context, run once to warm up, time `repeat` calls, read the peak RSS.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "cli_util.h"
#include "clattn/cpu.h"
#include "clattn/attention.h"
#include "clattn/error.h"
#include "clattn/gemm.h"
#include "clattn/threads.h"
#include "clattn/spec.h"
#include "commands.h"
#include "result_table.h"
#include "plot_util.h"
#include "progress.h"
#include "version.h"

namespace clattn::cli {
namespace {

using nlohmann::ordered_json;

constexpr int64_t kMaxErrorLength = 16384;  // rel_err needs exact attention: skipped above this
constexpr double kMiB = 1024.0 * 1024.0;

struct BenchOptions {
  std::string attention = "all";
  std::string lengths = "1024,2048,4096";
  int64_t batch = 1, heads = 8, kv_heads = 0, dim = 64;
  int threads = 0;
  bool backward = false, causal = false, no_error = false;
  int repeat = 5;
  std::string json;
  std::string plot;  // --plot FILE.png
  std::string format = "text";  // -o: text, md, csv, json, jsonl
  uint64_t seed = 0;
  const CLI::Option* kv_heads_opt = nullptr;
};

// One table row / JSON result. Optional fields are "-" in the table and null in JSON.
struct CaseResult {
  std::string spec;
  int64_t n = 0;
  std::optional<std::string> error;
  double ms_median = 0, ms_min = 0, ms_max = 0, rss_mb = 0;
  // Against the variant's own work model (Attention::work): the useful products it must compute.
  std::optional<double> gflops, peak_fraction;
  double work_flops = 0, work_int_ops = 0, work_bytes = 0;
  std::string largest_stage;  // the stage with the most flops (or integer work when none has flops)
  std::optional<double> rel_err, cos, ratio_to_full;
};

constexpr double kProgressSeconds = 5.0;  // a case whose warm-up took longer is announced on stderr

struct Buffers {               // allocated and touched before a case's RSS baseline
  Tensor out;                  // (B, H, N, D)
  Tensor dq, dk, dv;           // (B, H, N, D), (B, Hkv, N, D), (B, Hkv, N, D); --backward only
};

struct MemoryProbe {
  bool resettable = false;     // /proc/self/clear_refs accepted "5"
  int64_t base_kib = 0;
  void start() {
    const bool reset = resettable && bench::reset_peak_rss();
    // With a reset VmHWM the case's peak is measured from the current RSS; otherwise only the
    // growth of the process-wide peak can be seen.
    base_kib = bench::read_status_kib(reset ? "VmRSS" : "VmHWM");
  }
  double stop_mb() const {
    const int64_t hwm = bench::read_status_kib("VmHWM");
    if (hwm < 0 || base_kib < 0) return 0;
    return static_cast<double>(std::max<int64_t>(0, hwm - base_kib)) * 1024.0 / kMiB;
  }
};

// Usage errors for sizes out of range, before anything is measured.
void validate(const BenchOptions& o, const std::vector<int64_t>& lengths) {
  check_size(o.batch, 1, kMaxCount, "bench: --batch");
  check_size(o.heads, 1, kMaxCount, "bench: --heads");
  check_size(o.kv_heads, 1, kMaxCount, "bench: --kv-heads");
  usage_check(o.heads % o.kv_heads == 0, "bench: --heads must be a multiple of --kv-heads, got heads=",
              o.heads, " kv-heads=", o.kv_heads);
  check_size(o.dim, 1, kMaxCount, "bench: --dim");
  check_size(o.repeat, 1, kMaxCount, "bench: --repeat");
  for (const int64_t n : lengths) check_elements({o.batch, o.heads, n, o.dim}, "bench: q (B, H, N, D)");
}

// `all` stands for every registered variant's example spec (full first, the baseline), leaving
// out those that cannot honour the run's causal mask or grouped-query heads (said on stderr).
std::vector<std::string> expand_all(const std::vector<std::string>& items, const BenchOptions& o) {
  std::vector<std::string> out;
  for (const std::string& item : items) {
    if (item != "all") {
      out.push_back(item);
      continue;
    }
    for (const VariantInfo& v : registered_attentions()) {
      const Capabilities caps = make_attention(v.example)->capabilities();
      const char* why = o.causal && !caps.causal           ? "the causal mask"
                        : o.kv_heads != o.heads && !caps.gqa ? "grouped-query heads"
                                                             : nullptr;
      if (why) std::fprintf(stderr, "clattn bench: all: %s left out (it refuses %s)\n", v.example.c_str(), why);
      else out.push_back(v.example);
    }
  }
  return out;
}

// Shared-QK attention (reformer) takes the queries as its keys: read off its capabilities.
bool shares_qk(const std::string& spec) { return make_attention(spec)->capabilities().shared_qk; }

// Runs one (spec, n) case on prepared inputs; a variant that throws yields an error row.
CaseResult run_case(const std::string& spec, const AttentionInputs& in_given, const ConstView& dout,
                    Buffers& buf, const BenchOptions& o, MemoryProbe& mem, Progress& progress, int64_t done) {
  CaseResult r;
  r.spec = spec;
  r.n = in_given.q.dim(2);
  mem.start();
  try {
    std::unique_ptr<Attention> att = make_attention(spec);
    // Shared-QK attention (reformer) takes the queries as its keys (see the --help recipe).
    AttentionInputs in = in_given;
    if (att->capabilities().shared_qk) in.k = in.q;
    AttentionState state;  // layer state of a stateful variant (routing's EMA centroids)
    in.state = &state;
    in.train = o.backward;
    // A forward-only case times inference: no backward state is kept (Context::for_inference).
    Context ctx = o.backward ? Context() : Context::for_inference();
    auto call = [&] {
      att->forward(in, buf.out, ctx);
      if (o.backward) att->backward(in, buf.out, ctx, dout, buf.dq, buf.dk, buf.dv);
    };
    const std::string what = detail::concat(spec, " N=", r.n, " ", o.backward ? "fwdbwd" : "fwd");
    progress.set(done, what + ", warm-up");
    const auto w0 = std::chrono::steady_clock::now();
    call();  // warm-up: pays first touches of workspace and context, as a first real call would
    const double warm_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
    if (warm_s > kProgressSeconds && !progress.enabled()) {  // the status line says it when shown
      std::fprintf(stderr, "bench: %s N=%lld %s ... (running, %.0f s so far; %d timed calls to go)\n",
                   spec.c_str(), static_cast<long long>(r.n), o.backward ? "fwdbwd" : "fwd", warm_s,
                   o.repeat);
      std::fflush(stderr);
    }
    std::vector<double> ms;
    for (int i = 0; i < o.repeat; ++i) {
      progress.set(done, detail::concat(what, ", call ", i + 1, "/", o.repeat));
      const auto t0 = std::chrono::steady_clock::now();
      call();
      const auto t1 = std::chrono::steady_clock::now();
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    const bench::TimeStats st = bench::summarise(std::move(ms));
    r.ms_median = st.median;
    r.ms_min = st.min;
    r.ms_max = st.max;
    const AttentionDims d{in.q.dim(0), in.q.dim(1), in.k.dim(1), in.q.dim(2), in.k.dim(2), in.q.dim(3), in.v.dim(3)};
    const WorkModel w = att->work(d, o.causal, o.backward ? Mode::training : Mode::inference);
    r.work_flops = w.flops();
    r.work_int_ops = w.int_ops();
    r.work_bytes = w.bytes();
    if (r.work_flops > 0) r.gflops = r.work_flops / (st.median * 1e-3) * 1e-9;
    const WorkStage* top = nullptr;
    for (const WorkStage& s : w.stages)
      if (!top || s.flops > top->flops || (top->flops == 0 && s.int_ops > top->int_ops)) top = &s;
    if (top) r.largest_stage = top->name + (top->backward ? " (bwd)" : "");
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  r.rss_mb = mem.stop_mb();
  return r;
}

ordered_json to_json(const CaseResult& r, const BenchOptions& o, const char* mode) {
  auto num = [&](double x) { return r.error ? ordered_json(nullptr) : ordered_json(x); };
  auto opt = [&](const std::optional<double>& x) {
    return x && !r.error ? ordered_json(*x) : ordered_json(nullptr);
  };
  ordered_json j = {{"spec", r.spec},
                    {"batch", o.batch},
                    {"heads", o.heads},
                    {"kv_heads", o.kv_heads},
                    {"dim", o.dim},
                    {"n", r.n},
                    {"m", r.n},
                    {"causal", o.causal},
                    {"mode", mode},
                    {"threads", o.threads},
                    {"repeat", o.repeat},
                    {"ms_median", num(r.ms_median)},
                    {"ms_min", num(r.ms_min)},
                    {"ms_max", num(r.ms_max)},
                    {"gflops", opt(r.gflops)},
                    {"work_flops", num(r.work_flops)},
                    {"work_int_ops", num(r.work_int_ops)},
                    {"work_bytes", num(r.work_bytes)},
                    {"largest_stage", r.error ? ordered_json(nullptr) : ordered_json(r.largest_stage)},
                    {"peak_fraction", opt(r.peak_fraction)},
                    {"rss_mb", num(r.rss_mb)},
                    {"rel_err", opt(r.rel_err)},
                    {"cos", opt(r.cos)},
                    {"ratio_to_full", opt(r.ratio_to_full)}};
  if (r.error) j["error"] = *r.error;  // failed cases only: the schema's fields stay null
  return j;
}

// The table's columns; text widths are fixed by the longest spec so rows of a long sweep line up
// as they stream in. The csv header names each column by its JSON key.
std::vector<Column> columns(int spec_w) {
  return {{"spec", "spec", "", spec_w, true, false, true},
          {"n", "n", "", 7, false, false, true},
          {"mode", "mode", "", 6, true, false, true},
          {"ms_median", "ms_median", "%.2f"},
          {"ms_min", "ms_min", "%.2f"},
          {"ms_max", "ms_max", "%.2f"},
          {"GFLOP/s", "gflops", "%.1f", 9},
          {"%peak", "peak_fraction", "%.4f", 7, false, true},
          {"x full", "ratio_to_full", "%.3f", 7},
          {"rss MB", "rss_mb", "%.1f", 8},
          {"rel_err", "rel_err", "%.2e", 9},
          {"cos", "cos", "%.4f", 7},
          {"largest stage", "largest_stage", "", 22, true},
          {"error", "error", "", 0, false, false, false, true}};
}

void run_bench(BenchOptions o) {
  // Before anything big is allocated, so every buffer follows the same rules (bench_util.cpp).
  bench::configure_malloc_for_rss();
  if (o.kv_heads_opt->count() == 0) o.kv_heads = o.heads;
  o.threads = checked_threads(o.threads, "bench");
  const std::vector<int64_t> lengths = bench::parse_lengths(o.lengths, "bench");
  validate(o, lengths);
  check_outputs("bench", {{"--json", o.json}, {"--plot", o.plot}}, {});
  const std::vector<std::string> specs = expand_all(bench::split_specs(o.attention), o);
  if (!o.plot.empty()) {  // a missing gnuplot fails now, not after the sweep
    const std::string ext = std::filesystem::path(o.plot).extension().string();
    usage_check(ext == ".png" || ext == ".PNG", "bench: --plot must name a .png file, got '", o.plot, "'");
    plot::find_gnuplot();
  }
  // Memory before allocation: each length's inputs, output (and dO and gradients) plus the largest
  // workspace any spec states for it; refused up front with the estimate, never a bad_alloc.
  for (const int64_t n : lengths) {
    const AttentionDims d{o.batch, o.heads, o.kv_heads, n, n, o.dim, o.dim};
    const double qsz = 4.0 * o.batch * o.heads * n * o.dim, kvsz = 4.0 * o.batch * o.kv_heads * n * o.dim;
    double bytes = (qsz + 2 * kvsz + qsz) * (o.backward ? 2 : 1) + (o.backward ? qsz : 0);
    size_t ws = 0;
    for (const auto& sp : specs)
      ws = std::max(ws, make_attention(sp)->workspace_bytes(d, o.backward ? Mode::training : Mode::inference, max_threads()));
    bytes += static_cast<double>(ws) + qsz;  // + the reference output of rel_err
    check_memory(bytes, detail::concat("bench: N = ", n, " (B = ", o.batch, ", H = ", o.heads, ", D = ", o.dim, ")"));
  }

  // Every spec is built once up front, so a typo fails now rather than after an hour of sweep.
  // The first spec named `full` is the baseline; it runs first at each length.
  std::optional<size_t> baseline;
  bool baseline_is_reference = false;
  for (size_t i = 0; i < specs.size(); ++i) {
    std::string canonical;
    try {
      canonical = make_attention(specs[i])->name();
    } catch (const std::exception& e) {
      fail("bench: --attention item ", i + 1, " ('", specs[i], "') is not a valid spec: ",
           e.what());
    }
    if (!baseline && parse_spec(specs[i]).name == "full") {
      baseline = i;
      baseline_is_reference = canonical == make_attention("full")->name();
    }
  }
  std::vector<size_t> order;
  if (baseline) order.push_back(*baseline);
  for (size_t i = 0; i < specs.size(); ++i)
    if (i != baseline) order.push_back(i);

  set_threads(o.threads);
  const double sgemm = measure_sgemm_gflops(2048);
  const double read_gbs = measure_read_gbs();
  bench::prime_threads_and_blas();
  MemoryProbe mem;
  mem.resettable = bench::reset_peak_rss();
  // The run's preamble is part of the text table; the machine-readable formats keep stdout to
  // their data and say it on stderr.
  FILE* pre = o.format == "text" ? stdout : stderr;
  bench::print_machine(pre, sgemm, read_gbs, o.threads);
  std::fprintf(pre, "batch %lld, heads %lld (kv %lld), dim %lld, %s%s, repeat %d, seed %llu\n",
              static_cast<long long>(o.batch), static_cast<long long>(o.heads),
              static_cast<long long>(o.kv_heads), static_cast<long long>(o.dim),
              o.backward ? "forward+backward" : "forward", o.causal ? ", causal" : "", o.repeat,
              static_cast<unsigned long long>(o.seed));
  if (!mem.resettable)
    std::fprintf(pre, "note: /proc/self/clear_refs is not writable: rss MB is the growth of the "
                "process's peak RSS only\n");

  int spec_w = 4;
  for (const auto& s : specs) spec_w = std::max<int>(spec_w, static_cast<int>(s.size()));
  const ResultTable table(o.format, columns(spec_w));
  table.header();

  const char* mode = o.backward ? "fwdbwd" : "fwd";
  const std::string cpu = bench::cpu_model();
  ordered_json machine = {{"cpu", cpu.empty() ? ordered_json(nullptr) : ordered_json(cpu)},
                          {"cores", available_processors()},
                          {"cpu_flags", cpu_features().flags()},
                          {"isa", isa_name(active_isa())},
                          {"gemm", gemm_backend().name},
                          {"gemm_kernel", gemm_backend().kernel},
                          {"sgemm_gflops", sgemm},
                          {"read_gbs", read_gbs},
                          {"threads", o.threads},
                          {"clattn", {{"version", kVersion}, {"commit", kCommit}}},
                          {"date", bench::utc_now_iso8601()}};
  ordered_json doc = {{"machine", std::move(machine)}, {"results", ordered_json::array()}};
  // Written now too, so an unwritable path fails before the sweep rather than after its first case.
  auto write_json = [&] {
    if (!o.json.empty()) bench::write_file_atomic(o.json, doc.dump(2) + "\n");
  };
  write_json();
  int failed = 0, total = 0;
  Progress progress("bench", static_cast<int64_t>(lengths.size() * order.size()));
  for (const int64_t n : lengths) {
    const int64_t B = o.batch, H = o.heads, Hkv = o.kv_heads, D = o.dim;
    bench::Inputs inputs = bench::make_inputs({B, H, Hkv, n, D}, o.seed);
    Tensor dout;
    if (o.backward) dout = bench::make_normal(Shape{B, H, n, D}, o.seed);
    AttentionInputs in;
    in.q = inputs.q;
    in.k = inputs.k;
    in.v = inputs.v;
    in.causal = o.causal;

    // The rel_err reference: the baseline's own output when it is default full, else one extra
    // untimed full forward, done between cases so its memory is not charged to any of them.
    const bool want_error = !o.no_error && n <= kMaxErrorLength;
    Tensor reference;
    auto compute_reference = [&] {
      try {
        reference = bench::make_zeros(Shape{B, H, n, D});
        Context ctx = Context::for_inference();
        make_attention("full")->forward(in, reference, ctx);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "clattn bench: no rel_err at n=%lld: full attention failed: %s\n",
                     static_cast<long long>(n), e.what());
        reference = Tensor();
      }
    };
    if (want_error && !baseline_is_reference) compute_reference();

    std::optional<double> baseline_ms;
    for (const size_t si : order) {
      Buffers buf;
      buf.out = bench::make_zeros(Shape{B, H, n, D});
      if (o.backward) {
        buf.dq = bench::make_zeros(Shape{B, H, n, D});
        buf.dk = bench::make_zeros(Shape{B, Hkv, n, D});
        buf.dv = bench::make_zeros(Shape{B, Hkv, n, D});
      }
      CaseResult r = run_case(specs[si], in, dout.cview(), buf, o, mem, progress, total);
      ++total;
      const bool is_baseline = baseline && si == *baseline;
      if (r.error) {
        ++failed;
      } else {
        if (r.gflops) r.peak_fraction = *r.gflops / sgemm;
        if (is_baseline) baseline_ms = r.ms_median;
        if (baseline_ms) r.ratio_to_full = r.ms_median / *baseline_ms;
        if (reference.defined() && !shares_qk(specs[si])) {  // full's keys are not the queries
          const bench::OutputAgreement g = bench::compare_outputs(buf.out.cview(), reference.cview());
          r.rel_err = g.rel_err;
          r.cos = g.cos;
        } else if (want_error && is_baseline && baseline_is_reference) {
          r.rel_err = 0.0;  // it is the reference
          r.cos = 1.0;
          reference = std::move(buf.out);
        }
      }
      if (want_error && is_baseline && !reference.defined()) compute_reference();  // it failed
      ordered_json j = to_json(r, o, mode);
      progress.above([&] { table.row(j); });
      doc["results"].push_back(std::move(j));
      write_json();  // after every row: an interrupted sweep keeps what it measured
    }
  }
  progress.finish();
  table.end(doc);
  if (!o.plot.empty()) {  // drawn from the rows the JSON holds, as `clattn plot --bench` would
    const nlohmann::json d = nlohmann::json::parse(doc.dump());
    plot::plot_bench({plot::BenchRun{"bench", d["machine"], d["results"].get<std::vector<nlohmann::json>>()}}, o.plot);
    std::fprintf(stderr, "bench: wrote %s\n", o.plot.c_str());
  }
  check(failed == 0, "bench: ", failed, " of ", total,
        " cases failed (rows marked 'error'); the other results are valid");
}

}  // namespace

void add_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* sub = app.add_subcommand(
      "bench", "Time attention variants over sequence lengths: ms, GFLOP/s against the measured "
               "sgemm peak, ratio to full, peak memory, error against exact attention");
  sub->add_option("--attention", o->attention,
                  "Spec strings separated by ';', e.g. 'full;improved-clustered:clusters=100'; "
                  "'all' is every registered variant with its example parameters")
      ->check(spec_validator())
      ->capture_default_str();
  sub->add_option("--lengths", o->lengths, "Sequence lengths N (= M), comma-separated")
      ->capture_default_str();
  sub->add_option("--batch", o->batch, "Batch size B")->capture_default_str();
  sub->add_option("--heads", o->heads, "Query heads H")->capture_default_str();
  o->kv_heads_opt =
      sub->add_option("--kv-heads", o->kv_heads, "Key/value heads Hkv (default: --heads)");
  sub->add_option("--dim", o->dim, "Head dimension D (Dk = Dv)")->capture_default_str();
  add_threads_option(sub, o->threads, "bench");
  sub->add_flag("--backward", o->backward, "Time forward + backward instead of forward only");
  sub->add_flag("--causal", o->causal, "Causal mask");
  sub->add_option("--repeat", o->repeat, "Timed calls per case, after one warm-up call")
      ->capture_default_str();
  sub->add_option("--json", o->json, "Also write the results as JSON to this file (atomically)");
  sub->add_option("--plot", o->plot,
                  "Also draw time and peak memory against N (log-log, one line per spec) to this PNG "
                  "with gnuplot (Debian gnuplot-nox)");
  add_format_option(sub, o->format);
  sub->add_option("--seed", o->seed, "Seed of the inputs")->capture_default_str();
  sub->add_flag("--no-error", o->no_error,
                "Skip rel_err and cos (otherwise computed against full attention for n <= 16384)");
  sub->footer(bench::kInputRecipe);
  sub->callback([o] { run_bench(*o); });
}

}  // namespace clattn::cli
