#include "bench_util.h"

#include "clattn/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "cli_util.h"
#include "clattn/cpu.h"
#include "clattn/error.h"
#include "clattn/gemm.h"
#include "clattn/threads.h"
#include "clattn/rng.h"

namespace clattn::bench {
namespace {

std::string_view trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\n\r");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t\n\r");
  return s.substr(b, e - b + 1);
}

std::vector<std::string_view> split(std::string_view list, char sep) {
  std::vector<std::string_view> items;
  size_t start = 0;
  while (true) {
    const size_t pos = list.find(sep, start);
    items.push_back(trim(list.substr(start, pos == std::string_view::npos ? pos : pos - start)));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return items;
}

// Random streams of the inputs: (kind << 40) | head, where head is b * Hx + h of the tensor drawn
// (or of the centre set, b * Hkv + g). Counters index rows, so a longer sequence extends a shorter
// one instead of redrawing it.
enum Kind : uint64_t {
  kCentres = 1,
  kQueryPick,
  kQueryNoise,
  kKeyPick,
  kKeyNoise,
  kValues,
  kNormal,
  kValueCentres
};
constexpr int64_t kCentreCount = 32;
constexpr int64_t kRowBlock = 512;  // rows per parallel work item
constexpr float kNoise = 0.5f;      // noise sd relative to the centres' unit sd

uint64_t stream_of(uint64_t kind, int64_t head) { return (kind << 40) | static_cast<uint64_t>(head); }

// Four standard normals from one counter (Box-Muller on both word pairs, cos and sin).
void normal4(const Rng& rng, uint64_t stream, uint64_t index, float z[4]) {
  const auto w = rng.bits(stream, index);
  for (int p = 0; p < 2; ++p) {
    const double u1 = (static_cast<double>(w[2 * p]) + 1.0) * (1.0 / 4294967296.0);  // (0, 1]
    const double u2 = static_cast<double>(w[2 * p + 1]) * (1.0 / 4294967296.0);
    const double r = std::sqrt(-2.0 * std::log(u1));
    z[2 * p] = static_cast<float>(r * std::cos(6.283185307179586 * u2));
    z[2 * p + 1] = static_cast<float>(r * std::sin(6.283185307179586 * u2));
  }
}

// Row `row` (D entries) of the standard normal stream into dst.
void normal_row(const Rng& rng, uint64_t stream, int64_t row, int64_t D, float* dst) {
  const int64_t per_row = (D + 3) / 4;
  for (int64_t t = 0; t < per_row; ++t) {
    float z[4];
    normal4(rng, stream, static_cast<uint64_t>(row * per_row + t), z);
    const int64_t n = std::min<int64_t>(4, D - 4 * t);
    for (int64_t e = 0; e < n; ++e) dst[4 * t + e] = z[e];
  }
}

// One parallel work item: rows [r0, r1) of one head of one tensor.
struct FillTask {
  float* head_base;        // (N, D) of this head
  uint64_t pick, noise;    // stream kinds; pick == 0 means plain N(0, 1) rows from `noise`
  int64_t head, centre_set;
  int64_t r0, r1;
  uint64_t centres = kCentres;  // stream kind of the centre vectors (values: kValueCentres)
  float amplitude = 1.f;
};

void run_fill(const FillTask& t, const Rng& rng, int64_t D) {
  const float amplitude = t.amplitude;
  if (t.pick == 0) {
    for (int64_t r = t.r0; r < t.r1; ++r)
      normal_row(rng, stream_of(t.noise, t.head), r, D, t.head_base + r * D);
    return;
  }
  std::vector<float> centres(static_cast<size_t>(kCentreCount * D));  // (32, D)
  for (int64_t j = 0; j < kCentreCount; ++j)
    normal_row(rng, stream_of(t.centres, t.centre_set), j, D, centres.data() + j * D);
  for (int64_t r = t.r0; r < t.r1; ++r) {
    const auto j = static_cast<int64_t>(
        rng.below(kCentreCount, stream_of(t.pick, t.head), static_cast<uint64_t>(r)));
    float* x = t.head_base + r * D;
    normal_row(rng, stream_of(t.noise, t.head), r, D, x);
    const float* c = centres.data() + j * D;
    for (int64_t e = 0; e < D; ++e) x[e] = amplitude * (c[e] + kNoise * x[e]);
  }
}

void add_tasks(std::vector<FillTask>& tasks, float* data, int64_t heads, int64_t N, int64_t D,
               uint64_t pick, uint64_t noise, int64_t group_div, int64_t heads_per_batch,
               int64_t sets_per_batch, float amplitude = 1.f, uint64_t centres = kCentres) {
  for (int64_t hd = 0; hd < heads; ++hd) {
    const int64_t b = hd / heads_per_batch, h = hd % heads_per_batch;
    const int64_t set = b * sets_per_batch + h / group_div;
    for (int64_t r0 = 0; r0 < N; r0 += kRowBlock)
      tasks.push_back({data + hd * N * D, pick, noise, hd, set, r0, std::min(N, r0 + kRowBlock),
                       centres, amplitude});
  }
}

}  // namespace

std::vector<std::string> split_specs(std::string_view list) {
  std::vector<std::string> out;
  const auto items = split(list, ';');
  for (size_t i = 0; i < items.size(); ++i) {
    cli::usage_check(!items[i].empty(), "bench: --attention item ", i + 1, " of '", list,
                     "' is empty (specs are separated by ';')");
    out.emplace_back(items[i]);
  }
  return out;
}

std::vector<int64_t> parse_lengths(std::string_view list, const char* cmd) {
  using cli::usage_check;
  std::vector<int64_t> out;
  const auto items = split(list, ',');
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string_view s = items[i];
    usage_check(!s.empty(), cmd, ": --lengths item ", i + 1, " of '", list,
                "' is empty (lengths are separated by ',')");
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    usage_check(ec == std::errc() && end == s.data() + s.size(), cmd, ": --lengths item ", i + 1, " ('", s,
                "') is not an integer", ec == std::errc::result_out_of_range ? " that fits 64 bits" : "");
    usage_check(v >= 1 && v <= cli::kMaxCount, cmd, ": --lengths item ", i + 1, " must be in [1, ",
                cli::kMaxCount, "], got ", v);
    out.push_back(v);
  }
  return out;
}

// Recipe (kInputRecipe): x = a * (c_j + 0.5 * eps), c_j, eps ~ N(0, I_D), a = 2 / D^(1/4).
// Same-centre q·k ≈ a² |c|² ≈ a² D, so its scaled logit a² D / sqrt(D) = 4. Different centres give
// q·k with sd a² · 1.25 sqrt(D), a scaled logit of sd 1.25 a² = 5 / sqrt(D) (0.6 at D = 64).
Inputs make_inputs(const InputDims& d, uint64_t seed) {
  check(d.B > 0 && d.H > 0 && d.Hkv > 0 && d.N > 0 && d.D > 0 && d.H % d.Hkv == 0,
        "bench: bad input sizes B=", d.B, " H=", d.H, " Hkv=", d.Hkv, " N=", d.N, " D=", d.D);
  Inputs in;
  in.q = Tensor::empty_like_shape(Shape{d.B, d.H, d.N, d.D});
  in.k = Tensor::empty_like_shape(Shape{d.B, d.Hkv, d.N, d.D});
  in.v = Tensor::empty_like_shape(Shape{d.B, d.Hkv, d.N, d.D});
  const int64_t group = d.H / d.Hkv;
  const float amplitude = static_cast<float>(2.0 / std::pow(static_cast<double>(d.D), 0.25));
  std::vector<FillTask> tasks;
  add_tasks(tasks, in.q.data(), d.B * d.H, d.N, d.D, kQueryPick, kQueryNoise, group, d.H, d.Hkv,
            amplitude);
  add_tasks(tasks, in.k.data(), d.B * d.Hkv, d.N, d.D, kKeyPick, kKeyNoise, 1, d.Hkv, d.Hkv,
            amplitude);
  // Value row i follows key row i's centre (the same pick stream): v_i = u_j + 0.5 * eps, with
  // u_j ~ N(0, I_D) the value vector of centre j, so exact attention's output is the value of the
  // query's own cluster, not a vanishing average of noise.
  add_tasks(tasks, in.v.data(), d.B * d.Hkv, d.N, d.D, kKeyPick, kValues, 1, d.Hkv, d.Hkv, 1.f,
            kValueCentres);
  const Rng rng(seed);
  parallel_for(static_cast<int64_t>(tasks.size()),
               [&](int64_t i) { run_fill(tasks[static_cast<size_t>(i)], rng, d.D); });
  return in;
}

Tensor make_normal(const Shape& s, uint64_t seed) {
  check(s.rank >= 2, "bench: make_normal needs rank >= 2, got ", s.str());
  Tensor t = Tensor::empty_like_shape(s);
  const int64_t D = s[s.rank - 1], N = s[s.rank - 2], heads = s.numel() / std::max<int64_t>(1, N * D);
  std::vector<FillTask> tasks;
  add_tasks(tasks, t.data(), heads, N, D, 0, kNormal, 1, heads, 1);
  const Rng rng(seed);
  parallel_for(static_cast<int64_t>(tasks.size()),
               [&](int64_t i) { run_fill(tasks[static_cast<size_t>(i)], rng, D); });
  return t;
}

Tensor make_zeros(const Shape& s) {
  Tensor t = Tensor::empty_like_shape(s);
  constexpr int64_t kChunk = 1 << 18;
  const int64_t n = t.numel();
  float* p = t.data();
  parallel_for((n + kChunk - 1) / kChunk, [&](int64_t c) {
    const int64_t e = std::min(n, (c + 1) * kChunk);
    std::fill(p + c * kChunk, p + e, 0.f);
  });
  return t;
}

double relative_error(ConstView a, ConstView ref) {
  check(a.shape == ref.shape && a.contiguous() && ref.contiguous(),
        "bench: relative_error needs contiguous views of one shape, got ", a.shape, " and ",
        ref.shape);
  double diff = 0, norm = 0;
  const int64_t n = a.numel();
  for (int64_t i = 0; i < n; ++i) {
    const double r = ref.data[i], x = static_cast<double>(a.data[i]) - r;
    diff += x * x;
    norm += r * r;
  }
  if (norm == 0) return diff == 0 ? 0.0 : std::sqrt(diff);
  return std::sqrt(diff / norm);
}

OutputAgreement compare_outputs(ConstView a, ConstView ref) {
  check(a.shape == ref.shape && a.contiguous() && ref.contiguous(),
        "bench: compare_outputs needs contiguous views of one shape, got ", a.shape, " and ",
        ref.shape);
  double diff = 0, norm = 0, norm_a = 0, dot = 0;
  const int64_t n = a.numel();
  for (int64_t i = 0; i < n; ++i) {
    const double r = ref.data[i], x = a.data[i], e = x - r;
    diff += e * e;
    norm += r * r;
    norm_a += x * x;
    dot += x * r;
  }
  OutputAgreement g;
  g.rel_err = norm == 0 ? (diff == 0 ? 0.0 : std::sqrt(diff)) : std::sqrt(diff / norm);
  if (norm == 0 || norm_a == 0) g.cos = (norm == 0 && norm_a == 0) ? 1.0 : 0.0;
  else g.cos = dot / (std::sqrt(norm) * std::sqrt(norm_a));
  return g;
}

// glibc's default malloc keeps freed memory in the process: its mmap threshold is dynamic (after
// a big mmapped block is freed the threshold rises to its size, so the next buffers of that size
// come from the brk heap and stay resident after free), and the heap is trimmed only above 128 KiB
// of free top. A case would then reuse pages an earlier case touched and its peak-RSS growth would
// read near 0. Fixed settings turn the adjustment off: every block >= 64 KiB is its own mmap,
// returned to the OS on free (and paid for in first touches by whoever allocates it, like a real
// first call), and any free heap top is trimmed at once. Small blocks are too small to matter.
void configure_malloc_for_rss() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 64 * 1024);
  mallopt(M_TRIM_THRESHOLD, 0);
#endif
}

bool reset_peak_rss() {
  const int fd = ::open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, "5", 1) == 1;
  ::close(fd);
  return ok;
}

int64_t read_status_kib(const char* key) {
  std::ifstream f("/proc/self/status");
  const std::string prefix = std::string(key) + ":";
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(prefix, 0) != 0) continue;
    int64_t kib = -1;
    std::string_view rest = trim(std::string_view(line).substr(prefix.size()));
    std::from_chars(rest.data(), rest.data() + rest.size(), kib);
    return kib;
  }
  return -1;
}

void prime_threads_and_blas() {
  constexpr int64_t n = 256;
  const int threads = max_threads();
  std::vector<float> buf(static_cast<size_t>(threads) * 3 * n * n, 0.5f);
#pragma omp parallel num_threads(threads)
  {
    float* a = buf.data() + static_cast<size_t>(thread_id()) * 3 * n * n;
    gemm(false, true, n, n, n, 1.f, a, n, a + n * n, n, 0.f, a + 2 * n * n, n);
  }
}

TimeStats summarise(std::vector<double> ms) {
  check(!ms.empty(), "bench: no timings to summarise");
  std::sort(ms.begin(), ms.end());
  const size_t m = ms.size() / 2;
  TimeStats s;
  s.median = ms.size() % 2 ? ms[m] : 0.5 * (ms[m - 1] + ms[m]);
  s.min = ms.front();
  s.max = ms.back();
  return s;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) return std::string(trim(std::string_view(line).substr(colon + 1)));
  }
  return {};
}

int other_runnable_tasks() {
  const auto own_running = [] {
    int n = 0;
    std::error_code ec;
    for (const auto& t : std::filesystem::directory_iterator("/proc/self/task", ec)) {
      std::ifstream f(t.path() / "stat");
      std::string line;
      if (!std::getline(f, line)) continue;
      const size_t close = line.rfind(')');  // the state follows the command name, which may hold ')'
      if (close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'R') ++n;
    }
    return n;
  };
  int best = -1;
  for (int i = 0; i < 5; ++i) {
    if (i > 0) ::usleep(10000);
    std::ifstream f("/proc/stat");
    std::string key;
    long long running = -1;
    while (f >> key) {
      if (key == "procs_running") {
        f >> running;
        break;
      }
      f.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
    }
    if (running < 0) return -1;
    const int others = std::max(0, static_cast<int>(running) - own_running());
    best = best < 0 ? others : std::min(best, others);
  }
  return best;
}

void print_machine(FILE* out, double sgemm_gflops, double read_gbs, int threads) {
  const CpuFeatures& f = cpu_features();
  const GemmBackend& g = gemm_backend();
  std::fprintf(out, "cpu: %s (%s family %d model %d; %s)\n", f.model_name.empty() ? cpu_model().c_str() : f.model_name.c_str(),
               f.vendor.c_str(), f.family, f.model, f.flags().c_str());
  std::fprintf(out, "kernels: %s; gemm: %s, %s kernel (%s); %d threads\n", isa_name(active_isa()), g.name.c_str(),
               g.kernel.c_str(), g.reason.c_str(), threads);
  std::fprintf(out, "sgemm 2048: %.1f GFLOP/s (the %%peak reference); memory read: %.1f GB/s (the %%bw reference)\n",
               sgemm_gflops, read_gbs);
  // Another process on the cores slows an OpenMP team by 2-3x (every barrier waits for the thread
  // that lost its core): say so beside the figures it spoils, with the count that shows it.
  const int busy = other_runnable_tasks(), cpus = cli::available_processors();
  if (busy > 0 && busy + threads > cpus)
    std::fprintf(out,
                 "note: %d task%s of other processes running beside this one on %d processors (/proc/stat): the "
                 "timings of %d threads will be slow and noisy (on a busy machine --threads %d may be faster)\n",
                 busy, busy == 1 ? "" : "s", cpus, threads, std::max(1, cpus - busy));
}

std::string utc_now_iso8601() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void write_file_atomic(const std::string& path, const std::string& text) {
  clattn::write_file_atomic(path, text);  // exclusive temporary, only over a regular file
}

}  // namespace clattn::bench
