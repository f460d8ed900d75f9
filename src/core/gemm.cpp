// The dense-product backend: OpenBLAS's sgemm, with its kernel chosen by clattn from the CPU's
// features (include/clattn/cpu.h) rather than by OpenBLAS's table of model numbers.
//
// Why: OpenBLAS picks its kernels when it loads, by CPU model number; Debian 12's 0.3.21 does not
// know Sapphire/Emerald Rapids (family 6, models 143 and 207) and runs its SSE3 "Prescott" kernels
// there, at a fifth of the machine's rate (docs/performance.md has the table). The OpenMP build
// Debian ships is DYNAMIC_ARCH: it exports gotoblas_dynamic_quit/init, which re-run its kernel
// choice and read $OPENBLAS_CORETYPE again, so the choice is redone here before the first product:
//   AVX-512 (F, BW, DQ, VL, CD) -> SkylakeX; AVX2 + FMA -> Zen on AMD, Haswell elsewhere.
// A user's own $OPENBLAS_CORETYPE is kept when the CPU can run the kernel it names, and replaced
// (with the reason in gemm_backend()) when it cannot. Whatever the kernel, it must pass a
// known-answer check on products of several shapes and transpositions against a double reference
// before clattn uses it; one that fails is replaced by the next candidate (Haswell, then
// OpenBLAS's own choice), and clattn refuses to run when none passes.
//
// The library is opened by path: the OpenMP build the project was configured with
// (CLATTN_OPENBLAS_PATH). In a process where another libopenblas.so.0 was loaded first (NumPy and
// PyTorch load Debian's pthreads build, same soname), that path is a second copy opened with
// RTLD_DEEPBIND so its internal calls stay inside it, and clattn's calls from its OpenMP regions
// never start the pthreads pool (docs/building.md).
#include "clattn/gemm.h"

#include <cblas.h>
#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "clattn/cpu.h"
#include "clattn/error.h"
#include "clattn/rng.h"
#include "core/ascii.h"
#include "core/microkernel.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CLATTN_NO_DEEPBIND 1  // the sanitizer runtimes refuse RTLD_DEEPBIND
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define CLATTN_NO_DEEPBIND 1
#endif
#endif

namespace clattn {
namespace {

using Sgemm = decltype(&cblas_sgemm);
using CharFn = char* (*)();
using VoidFn = void (*)();

struct Openblas {
  Sgemm sgemm = nullptr;
  CharFn corename = nullptr, config = nullptr;
  VoidFn dynamic_init = nullptr, dynamic_quit = nullptr;
  GemmBackend info;
};

// What each x86-64 kernel family of OpenBLAS's DYNAMIC_ARCH build executes beyond SSE4 (the
// names OPENBLAS_CORETYPE accepts, compared without case). One table for every decision: a core
// whose needs the CPU lacks is never loaded, since its first product would die of SIGILL (the
// Bulldozer family's kernels use AMD's FMA4, which no Intel CPU and no Zen has), and a name not
// here is not a kernel OpenBLAS has.
struct CoreNeeds {
  const char* name;
  bool avx, fma4, avx2, avx512, bf16_amx;
};
constexpr CoreNeeds kCores[] = {
    {"katmai", false, false, false, false, false},      {"coppermine", false, false, false, false, false},
    {"northwood", false, false, false, false, false},   {"prescott", false, false, false, false, false},
    {"banias", false, false, false, false, false},      {"atom", false, false, false, false, false},
    {"core2", false, false, false, false, false},       {"penryn", false, false, false, false, false},
    {"dunnington", false, false, false, false, false},  {"nehalem", false, false, false, false, false},
    {"athlon", false, false, false, false, false},      {"opteron", false, false, false, false, false},
    {"opteron_sse3", false, false, false, false, false}, {"barcelona", false, false, false, false, false},
    {"nano", false, false, false, false, false},        {"bobcat", false, false, false, false, false},
    {"sandybridge", true, false, false, false, false},  {"bulldozer", true, true, false, false, false},
    {"piledriver", true, true, false, false, false},    {"steamroller", true, true, false, false, false},
    {"excavator", true, true, false, false, false},     {"haswell", true, false, true, false, false},
    {"zen", true, false, true, false, false},           {"skylakex", true, false, true, true, false},
    {"cooperlake", true, false, true, true, true},      {"sapphirerapids", true, false, true, true, true},
};

const CoreNeeds* core_needs(const std::string& core) {
  const std::string c = detail::ascii_lower(core);
  for (const CoreNeeds& k : kCores)
    if (c == k.name) return &k;
  return nullptr;
}

std::string wanted_kernel(const CpuFeatures& f) {
  if (f.has_avx512()) return "SkylakeX";
  if (f.has_avx2()) return f.vendor == "AuthenticAMD" ? "Zen" : "Haswell";
  return "";  // pre-AVX2: OpenBLAS's own choice
}

// The features of `core` this CPU lacks, "" when it runs it.
std::string missing_for(const CpuFeatures& f, const CoreNeeds& k) {
  std::string m;
  auto need = [&](bool want, bool have, const char* what) {
    if (want && !have) m += std::string(m.empty() ? "" : ", ") + what;
  };
  need(k.avx, f.avx && f.os_avx, "AVX");
  need(k.fma4, f.fma4, "FMA4");
  need(k.avx2, f.has_avx2(), "AVX2 + FMA");
  need(k.avx512, f.has_avx512(), "AVX-512");
  need(k.bf16_amx, f.avx512_bf16 && f.amx_tile, "AVX512-BF16 + AMX");
  return m;
}

// C = alpha·op(A)·op(B) + beta·C on shapes that reach OpenBLAS's small-matrix, edge and packed
// paths, against a double reference; error bound 1e-4 of Σ|alpha·a·b| + |beta·c| per element
// (rounding gives ~k·6e-8 of it; a broken kernel is off by O(1)).
bool known_answer_ok(Sgemm sgemm) {
  struct Case {
    int m, n, k;
    bool ta, tb;
  };
  static constexpr Case kCases[] = {{1, 1, 1, false, false},   {3, 5, 7, false, true},
                                    {17, 33, 9, true, false},  {67, 131, 97, false, true},
                                    {99, 64, 256, false, true}, {129, 200, 150, true, true},
                                    {192, 160, 128, false, false}};
  Rng rng(7);
  uint64_t counter = 0;
  for (const Case& t : kCases) {
    const int lda = t.ta ? t.m : t.k, ldb = t.tb ? t.k : t.n;
    std::vector<float> a(static_cast<size_t>(t.m) * t.k), b(static_cast<size_t>(t.k) * t.n),
        c(static_cast<size_t>(t.m) * t.n);
    for (float& x : a) x = rng.uniform(0, counter++) - 0.5f;
    for (float& x : b) x = rng.uniform(1, counter++) - 0.5f;
    for (float& x : c) x = rng.uniform(2, counter++) - 0.5f;
    const std::vector<float> c0 = c;
    const float alpha = 0.75f, beta = -1.25f;
    sgemm(CblasRowMajor, t.ta ? CblasTrans : CblasNoTrans, t.tb ? CblasTrans : CblasNoTrans, t.m, t.n, t.k,
          alpha, a.data(), lda, b.data(), ldb, beta, c.data(), t.n);
    for (int i = 0; i < t.m; ++i)
      for (int j = 0; j < t.n; ++j) {
        double sum = 0, mag = 0;
        for (int p = 0; p < t.k; ++p) {
          const double x = t.ta ? a[static_cast<size_t>(p) * lda + i] : a[static_cast<size_t>(i) * lda + p];
          const double y = t.tb ? b[static_cast<size_t>(j) * ldb + p] : b[static_cast<size_t>(p) * ldb + j];
          sum += x * y;
          mag += std::fabs(x * y);
        }
        const double ref = alpha * sum + beta * c0[static_cast<size_t>(i) * t.n + j];
        const double bound = 1e-4 * (std::fabs(alpha) * mag + std::fabs(beta * c0[static_cast<size_t>(i) * t.n + j]));
        const double got = c[static_cast<size_t>(i) * t.n + j];
        if (!(std::fabs(got - ref) <= bound)) return false;
      }
  }
  return true;
}

void* open_library(std::string& where) {
#if defined(CLATTN_OPENBLAS_PATH)
  where = CLATTN_OPENBLAS_PATH;
  if (void* h = dlopen(CLATTN_OPENBLAS_PATH, RTLD_NOW | RTLD_NOLOAD)) return h;  // already in the process
#if defined(CLATTN_NO_DEEPBIND)
  if (void* h = dlopen(CLATTN_OPENBLAS_PATH, RTLD_NOW | RTLD_LOCAL)) return h;
#else
  if (void* h = dlopen(CLATTN_OPENBLAS_PATH, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND)) return h;
#endif
#endif
  return nullptr;
}

Openblas load() {
  Openblas o;
  std::string path;
  void* h = open_library(path);
  auto sym = [&](const char* name) -> void* { return h ? dlsym(h, name) : dlsym(RTLD_DEFAULT, name); };
  o.sgemm = reinterpret_cast<Sgemm>(sym("cblas_sgemm"));
  if (!o.sgemm) o.sgemm = &cblas_sgemm;  // the library clattn was linked with
  o.corename = reinterpret_cast<CharFn>(sym("openblas_get_corename"));
  o.config = reinterpret_cast<CharFn>(sym("openblas_get_config"));
  o.dynamic_init = reinterpret_cast<VoidFn>(sym("gotoblas_dynamic_init"));
  o.dynamic_quit = reinterpret_cast<VoidFn>(sym("gotoblas_dynamic_quit"));
  Dl_info dl{};
  if (dladdr(reinterpret_cast<void*>(o.sgemm), &dl) && dl.dli_fname) o.info.library = dl.dli_fname;

  GemmBackend& info = o.info;
  std::string config = o.config ? o.config() : "";
  // "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Zen MAX_THREADS=64": the name and version, the rest
  // is build flags and the kernel.
  {
    const auto sp1 = config.find(' ');
    const auto sp2 = sp1 == std::string::npos ? sp1 : config.find(' ', sp1 + 1);
    info.name = config.empty() ? "BLAS (cblas_sgemm)" : config.substr(0, sp2);
    if (config.find("USE_OPENMP") != std::string::npos || path.find("openmp") != std::string::npos)
      info.name += " (OpenMP)";
  }
  auto current = [&] { return o.corename ? std::string(o.corename()) : std::string("unknown"); };
  info.detected = current();
  info.products = "A·B and A·Bt (alpha 1, beta 0 or 1) with k <= 1024, n <= 4096 and more than 4 rows: clattn's "
                  "register tiles; A·Bt of up to 4 rows: clattn's rows_dot; the rest: sgemm";
  const CpuFeatures& f = cpu_features();

  auto use_kernel = [&](const std::string& core) {
    if (!o.dynamic_init || !o.dynamic_quit || detail::ascii_lower(current()) == detail::ascii_lower(core)) return;
    const char* prev = std::getenv("OPENBLAS_CORETYPE");
    const std::string saved = prev ? prev : "";
    setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
    o.dynamic_quit();
    o.dynamic_init();
    if (prev) setenv("OPENBLAS_CORETYPE", saved.c_str(), 1);
    else unsetenv("OPENBLAS_CORETYPE");
  };

  const char* user_env = std::getenv("OPENBLAS_CORETYPE");
  const std::string user = user_env ? user_env : "";
  std::string want = wanted_kernel(f);
  std::vector<std::string> candidates;
  const CoreNeeds* user_core = user.empty() ? nullptr : core_needs(user);
  const std::string user_missing = user_core ? missing_for(f, *user_core) : "";
  if (user_core && user_missing.empty()) {
    info.reason = "$OPENBLAS_CORETYPE=" + user + " kept (this CPU runs it)";
    candidates.push_back(user);
  } else {
    if (user_core)
      info.reason = "$OPENBLAS_CORETYPE=" + user + " needs an ISA this CPU lacks (" + user_missing + "), replaced: ";
    else if (!user.empty())
      info.reason = "$OPENBLAS_CORETYPE=" + user + " is not a kernel of OpenBLAS, replaced: ";
    if (!want.empty()) {
      info.reason += "chosen from CPU features (" + std::string(f.has_avx512() ? "AVX-512" : "AVX2 + FMA") +
                     (f.vendor == "AuthenticAMD" && !f.has_avx512() ? ", AMD" : "") + ")";
      candidates.push_back(want);
    } else {
      info.reason += "OpenBLAS's own choice (no AVX2 on this CPU)";
    }
  }
  if (f.has_avx2()) candidates.push_back("Haswell");
  // OpenBLAS's own choice last, unless it is a core this CPU cannot run (it loads the kernel
  // $OPENBLAS_CORETYPE names without checking).
  if (const CoreNeeds* d = core_needs(info.detected); !d || missing_for(f, *d).empty())
    candidates.push_back(info.detected);
  if (!o.dynamic_init || !o.dynamic_quit) {
    candidates = {info.detected};
    info.reason = "this OpenBLAS cannot change its kernel (no DYNAMIC_ARCH): its own choice";
  }
  for (size_t i = 0; i < candidates.size(); ++i) {
    use_kernel(candidates[i]);
    info.kernel = current();
    if (!candidates[i].empty() && detail::ascii_lower(info.kernel) != detail::ascii_lower(candidates[i]) && i + 1 < candidates.size()) {
      info.reason += "; " + candidates[i] + " not in this OpenBLAS";
      continue;
    }
    if (known_answer_ok(o.sgemm)) {
      info.verified = true;
      break;
    }
    info.reason += "; " + info.kernel + " failed the known-answer check";
  }
  check(info.verified, "gemm: ", info.name, " (", info.library, ") gives wrong products with every kernel tried (",
        info.reason, "); set OPENBLAS_CORETYPE to a kernel that works on this CPU");
  return o;
}

const Openblas& openblas() {
  static const Openblas o = load();
  return o;
}

// Products with at most this many rows of A go to mk::rows_dot. Measured on the decode step of a
// LLaMA-shaped model (hidden 512, FFN 1408, 8 layers; see docs/performance.md).
constexpr int64_t kRowsDotMax = 4;

// Splits the n rows of W over the OpenMP team in 16-row slices (whole cache lines of Y), when W
// is large enough to pay for a parallel region; one thread inside someone else's region.
void rows_dot_threads(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* w,
                      int64_t ldw, float beta, float* c, int64_t ldc) {
  constexpr int64_t kSlice = 16;
  const int64_t slices = (n + kSlice - 1) / kSlice;
  const bool par = !omp_in_parallel() && n * k >= (int64_t{1} << 15) && slices > 1;
  const int teams = par ? std::min<int>(omp_get_max_threads(), static_cast<int>(slices)) : 1;
#pragma omp parallel num_threads(teams) if (teams > 1)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t s0 = slices * t / nt, s1 = slices * (t + 1) / nt;
    const int64_t r0 = s0 * kSlice, r1 = std::min(n, s1 * kSlice);
    if (r1 > r0) mk::rows_dot(m, r1 - r0, k, alpha, a, lda, w + r0 * ldw, ldw, beta, c + r0, ldc);
  }
}

// Products with at most this many rows of X stream a 16-bit W through mk::rows_dot16, a pass over
// W per pair of rows; more widen W for sgemm. Measured (2 threads, W 2816 x 512 f16, 20 matrices
// in turn): m = 5 3.3 ms against 10.9 widened, m = 8 4.4 against 11.4, m = 16 8.3 against 11.5,
// m = 32 equal; 8 leaves room for a W too large for the caches, read again per pair.
constexpr int64_t kRowsDot16Max = 8;

// Rows of W widened per sgemm of a 16-bit linear_gemm: about 1 MB of f32 (an L2's worth on the
// machines measured), at least 64 rows so each sgemm is wide enough to run at its rate.
int64_t widen_block_rows(int64_t n, int64_t k) {
  const int64_t rows = std::max<int64_t>(64, (int64_t{1} << 18) / std::max<int64_t>(k, 1) / 16 * 16);
  return std::min(n, rows);
}

void rows_dot16_threads(mk::Half f, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                        const uint16_t* w, int64_t ldw, float beta, float* c, int64_t ldc) {
  constexpr int64_t kSlice = 16;
  const int64_t slices = (n + kSlice - 1) / kSlice;
  const bool par = !omp_in_parallel() && n * k >= (int64_t{1} << 15) && slices > 1;
  const int teams = par ? std::min<int>(omp_get_max_threads(), static_cast<int>(slices)) : 1;
#pragma omp parallel num_threads(teams) if (teams > 1)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t s0 = slices * t / nt, s1 = slices * (t + 1) / nt;
    const int64_t r0 = s0 * kSlice, r1 = std::min(n, s1 * kSlice);
    if (r1 > r0) mk::rows_dot16(f, m, r1 - r0, k, alpha, a, lda, w + r0 * ldw, ldw, beta, c + r0, ldc);
  }
}

// Products Y = X·Wᵀ of a linear layer's shape go to the attention kernels' register tiles over W
// packed in 64-column panels, rows of X read in place: OpenBLAS packs both operands for every
// call and, on the narrow and shallow products of small models (k = 64: KWT-1's layers), spent
// more time packing than computing. Measured (clattn_kernel_bench BM_Linear, m = 29700, 2
// threads, Intel Xeon with AVX-512): k 64 / n 64-256 at 283-300 GFLOP/s against OpenBLAS's
// 132-140; k 256 / n 256 236 against 216; k 1024 / n 256 277 against 238; the AVX2 copy 185-189
// against 98-107 at k = 64. Deeper than kTileMaxDepth, a panel (k, 64) no longer fits the L2 of
// the smallest machines served (512 KB): sgemm keeps those, as it keeps wider W (n > 4096: a
// vocabulary's head) and products with A transposed (a backward's dW = dYᵀ·X, deep in rows).
// A·B with B (k, n) untransposed (a backward's dX = dY·W) takes the same tiles: B's panels are
// its rows cut in 64-column pieces.
constexpr int64_t kTileMaxDepth = 1024;
constexpr int64_t kTileMaxCols = 4096;
constexpr int64_t kTileRows = 96;  // rows of X per task: 16 tiles of 6, (96, k) in L2

bool tiles_take(int64_t m, int64_t n, int64_t k) {
  return m > kRowsDotMax && k > 0 && k <= kTileMaxDepth && n > 0 && n <= kTileMaxCols;
}

// Panel p of B (k, n) row stride ldb for the tiles: its rows d are B[d, 64p .. 64p + 64), the
// columns past n zero. (B = Wᵀ of a backward's dX = dY·W: W's rows cut in 64-column pieces.)
void pack_column_panels(const float* b, int64_t ldb, int64_t k, int64_t n, int64_t p, float* dst) {
  constexpr int64_t P = mk::kPanel;
  const int64_t c0 = p * P, w = std::min(P, n - c0);
  for (int64_t d = 0; d < k; ++d) {
    float* row = dst + d * P;
    std::memcpy(row, b + d * ldb + c0, sizeof(float) * static_cast<size_t>(w));
    std::fill(row + w, row + P, 0.f);
  }
}

// Y (m, n) = [Y +] [bias +] X (m, k)·op(B): op(B) = Wᵀ with W (n, k) row stride ldw (w_rows, a
// linear layer's forward), or B (k, n) itself (a backward's dX = dY·W). Each element is one tile's
// sum in depth order, whatever the thread count or the task it falls in.
void linear_tiles(int64_t m, int64_t n, int64_t k, const float* x, int64_t ldx, const float* w, int64_t ldw,
                  bool w_rows, const float* bias, bool add, float* y, int64_t ldy) {
  constexpr int64_t P = mk::kPanel;
  const int64_t np = (n + P - 1) / P, nfull = n / P, tail = n % P;
  // (np, k, 64) W's panels: the calling thread's, grown to the largest W it has multiplied.
  thread_local std::vector<float> panels;
  if (panels.size() < static_cast<size_t>(np * P * k)) panels.resize(static_cast<size_t>(np * P * k));
  float* pan = panels.data();
  alignas(64) float bias_tail[P] = {};  // the last panel's bias, zero-padded
  if (bias && tail) std::copy(bias + nfull * P, bias + n, bias_tail);
  const int64_t blocks = (m + kTileRows - 1) / kTileRows, tasks = blocks * np;
  const bool par = !omp_in_parallel() && tasks > 1 && m * n * k >= (int64_t{1} << 18);
#pragma omp parallel if (par)
  {
#pragma omp for schedule(static)
    for (int64_t p = 0; p < np; ++p) {
      if (w_rows) mk::pack_panels(w + p * P * ldw, std::min(P, n - p * P), k, ldw, pan + p * P * k);
      else pack_column_panels(w, ldw, k, n, p, pan + p * P * k);
    }
    alignas(64) float part[kTileRows * P];  // (kTileRows, 64) the last panel's columns
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t r0 = t / np * kTileRows, p = t % np, rows = std::min(kTileRows, m - r0);
      const float* xr = x + r0 * ldx;
      float* yr = y + r0 * ldy + p * P;
      if (p < nfull) {
        mk::gemm_abt_add(rows, 1, k, xr, ldx, pan + p * P * k, yr, ldy, bias ? bias + p * P : nullptr, add);
        continue;
      }
      for (int64_t i = 0; i < rows; ++i) {
        float* pr = part + i * P;
        std::fill(pr, pr + P, 0.f);
        if (add) std::copy(yr + i * ldy, yr + i * ldy + tail, pr);
      }
      mk::gemm_abt_add(rows, 1, k, xr, ldx, pan + p * P * k, part, P, bias ? bias_tail : nullptr, add);
      for (int64_t i = 0; i < rows; ++i) std::copy(part + i * P, part + i * P + tail, yr + i * ldy);
    }
  }
}

}  // namespace

void linear_product(int64_t m, int64_t n, int64_t k, const float* x, int64_t ldx, const float* w, int64_t ldw,
                    const float* bias, bool accumulate, float* y, int64_t ldy) {
  check(m >= 0 && n >= 0 && k >= 0, "linear_product: sizes must be >= 0, got m=", m, " n=", n, " k=", k);
  check(ldx >= k && ldw >= k && ldy >= n, "linear_product: row strides must cover a row: ldx=", ldx, ", ldw=", ldw,
        " (k=", k, "), ldy=", ldy, " (n=", n, ")");
  if (m == 0 || n == 0) return;
  if (tiles_take(m, n, k)) {
    linear_tiles(m, n, k, x, ldx, w, ldw, true, bias, accumulate, y, ldy);
    return;
  }
  // y = [y +] bias (or 0) over the team, then the product with beta = 1 (see nn/linear.cpp).
  if (!accumulate || bias) {
    const size_t row_bytes = sizeof(float) * static_cast<size_t>(n);
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && m * n > 32768)
    for (int64_t r = 0; r < m; ++r) {
      float* yr = y + r * ldy;
      if (!accumulate) {
        if (bias) std::memcpy(yr, bias, row_bytes);
        else std::memset(yr, 0, row_bytes);
      } else {
        for (int64_t e = 0; e < n; ++e) yr[e] += bias[e];
      }
    }
  }
  gemm(false, true, m, n, k, 1.f, x, ldx, w, ldw, 1.f, y, ldy);
}

const char* weight_type_name(WeightType t) {
  switch (t) {
    case WeightType::f32: return "f32";
    case WeightType::f16: return "f16";
    case WeightType::bf16: return "bf16";
  }
  return "?";
}

WeightType parse_weight_type(std::string_view s) {
  const std::string low = detail::ascii_lower(std::string(s));
  for (WeightType t : {WeightType::f32, WeightType::f16, WeightType::bf16})
    if (low == weight_type_name(t)) return t;
  fail("weights: unknown type '", s, "' (choose f32, f16 or bf16)");
}

int64_t linear_gemm_workspace(WeightType t, int64_t n, int64_t k) {
  return t == WeightType::f32 || n <= 0 || k <= 0 ? 0 : widen_block_rows(n, k) * k;
}

void linear_gemm(int64_t m, int64_t n, int64_t k, float alpha, const float* x, int64_t ldx, const WeightMatrix& w,
                 float beta, float* y, int64_t ldy, float* workspace) {
  if (w.type == WeightType::f32) {
    gemm(false, true, m, n, k, alpha, x, ldx, static_cast<const float*>(w.data), w.ld, beta, y, ldy);
    return;
  }
  check(m >= 0 && n >= 0 && k >= 0, "linear_gemm: sizes must be >= 0, got m=", m, " n=", n, " k=", k);
  check(w.ld >= k, "linear_gemm: W's row stride ", w.ld, " is below its row length k=", k);
  if (m == 0 || n == 0) return;
  const mk::Half f = w.type == WeightType::f16 ? mk::Half::f16 : mk::Half::bf16;
  const uint16_t* wh = static_cast<const uint16_t*>(w.data);  // (n, k) with row stride w.ld
  if (m <= kRowsDot16Max || k == 0) {
    rows_dot16_threads(f, m, n, k, alpha, x, ldx, wh, w.ld, beta, y, ldy);
    return;
  }
  check(workspace != nullptr, "linear_gemm: a 16-bit W with m=", m, " > ", kRowsDot16Max,
        " rows needs the workspace of linear_gemm_workspace()");
  const int64_t block = widen_block_rows(n, k);
  for (int64_t r0 = 0; r0 < n; r0 += block) {
    const int64_t nb = std::min(block, n - r0);
    float* wf = workspace;  // (nb, k) the block of W rows widened
    const int64_t chunks = (nb + 15) / 16;
    const bool par = !omp_in_parallel() && nb * k >= (int64_t{1} << 16);
#pragma omp parallel for schedule(static) if (par)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t a = c * 16, b = std::min(nb, a + 16);
      mk::widen_rows(f, wh + (r0 + a) * w.ld, b - a, k, w.ld, wf + a * k, k);
    }
    openblas().sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(nb),
                     static_cast<int>(k), alpha, x, static_cast<int>(ldx), wf, static_cast<int>(k), beta, y + r0,
                     static_cast<int>(ldy));
  }
}

const GemmBackend& gemm_backend() { return openblas().info; }

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc) {
  check(m >= 0 && n >= 0 && k >= 0, "gemm: sizes must be >= 0, got m=", m, " n=", n, " k=", k);
  if (m == 0 || n == 0) return;
  if (!trans_a && alpha == 1.f && (beta == 0.f || beta == 1.f) && tiles_take(m, n, k)) {
    linear_tiles(m, n, k, a, lda, b, ldb, trans_b, nullptr, beta == 1.f, c, ldc);
    return;
  }
  if (m <= kRowsDotMax && !trans_a && trans_b && k > 0) {
    // A few rows times a weight's transpose (a decode step's linear layers): sgemm packs all of
    // B before its first FMA, reading and writing it once more than the product needs.
    rows_dot_threads(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  openblas().sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                   static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
                   static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

double measure_sgemm_gflops(int64_t n, int repeat) {
  const size_t sz = static_cast<size_t>(n * n);
  std::vector<float> a(sz), b(sz), c(sz);
  Rng rng(12345);
  for (size_t i = 0; i < sz; ++i) {
    a[i] = rng.uniform(0, i) - 0.5f;
    b[i] = rng.uniform(1, i) - 0.5f;
  }
  gemm(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);  // warm-up
  double best = 1e30;
  for (int r = 0; r < repeat; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    gemm(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  return 2.0 * static_cast<double>(n) * n * n / best * 1e-9;
}

double measure_read_gbs(int64_t bytes, int repeat) {
  const int64_t n = std::max<int64_t>(bytes / static_cast<int64_t>(sizeof(float)), 1 << 16);
  std::vector<float> a(static_cast<size_t>(n), 1.f);  // (n) zero-filled and touched by the constructor
  constexpr int64_t kBlock = 1 << 16;                  // floats per work item (256 KB)
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  double best = 1e30, sink = 0;
  for (int r = 0; r < repeat + 1; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    double total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total)
    for (int64_t x = 0; x < blocks; ++x) {
      // Eight independent sums: the loop is bound by the loads, not by an add's latency.
      float acc[8] = {};
      const float* p = a.data() + x * kBlock;
      const int64_t m = std::min(kBlock, n - x * kBlock);
      int64_t i = 0;
      for (; i + 8 <= m; i += 8)
        for (int u = 0; u < 8; ++u) acc[u] += p[i + u];
      for (; i < m; ++i) acc[0] += p[i];
      for (int u = 0; u < 8; ++u) total += acc[u];
    }
    auto t1 = std::chrono::steady_clock::now();
    sink += total;
    if (r > 0) best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  // The sums are used, so the reads cannot be removed.
  if (sink < 0) std::fprintf(stderr, "measure_read_gbs: %g\n", sink);
  return static_cast<double>(n) * sizeof(float) / best * 1e-9;
}

}  // namespace clattn
