// Helpers of `clattn bench`: list parsing, structured inputs, memory probes, timing statistics and
// atomic file writes. Kept apart from the subcommand so bench.cpp reads as the benchmark's plan.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "clattn/tensor.h"

namespace clattn::bench {

// How `clattn bench` draws its inputs (shown by `clattn bench --help`).
inline constexpr const char* kInputRecipe =
    "Inputs (built once per length, shared by every spec, reproducible from --seed and a prefix of\n"
    "the next length's): per (batch, kv-head), 32 centres c_j ~ N(0, I_D); every query and key row\n"
    "picks a centre uniformly and is x = a * (c_j + 0.5 * N(0, I_D)) with a = 2 / D^(1/4), so with\n"
    "the default scale 1/sqrt(D) a query meets keys of its own centre with logits around 4 and the\n"
    "others with logits of spread ~0.6 -- clustered like real attention, not uniform noise.\n"
    "Query heads share the centres of their kv head (grouped-query attention). Values carry the\n"
    "keys' clusters: each centre j also has a value vector u_j ~ N(0, I_D), and value row i is\n"
    "v_i = u_j + 0.5 * N(0, I_D) with j the centre of key row i, so exact attention returns (about)\n"
    "the value of the query's own cluster and an approximation that finds the right keys scores\n"
    "well. dO ~ N(0, 1). rel_err is ||O - O_full|| / ||O_full||, cos the cosine similarity of the\n"
    "flattened outputs. Shared-QK attention (reformer) gets k = q, so its rel_err and cos are '-'.\n"
    "GFLOP/s and %peak are against each variant's own work model (the useful products its algorithm\n"
    "must compute, docs/performance.md): 4*B*H*N*M*D for full (about half causal; x3.5 with\n"
    "--backward); hashing, centroid attention and top-k recomputation for improved-clustered (its\n"
    "k-means popcounts are integer work, work_int_ops in JSON); 'largest stage' names the stage with\n"
    "the most work. ms_max is the slowest timed call. rss MB is the peak resident\n"
    "memory a case adds beyond its inputs, output and gradients (workspace, context, temporaries).\n"
    "The first spec named 'full' runs first at each length: it is the 'x full' baseline and, when\n"
    "it is plain default full, its output is the rel_err reference (else full is run once for it).";

// ';'-separated spec strings, items trimmed; empty items are errors.
std::vector<std::string> split_specs(std::string_view list);
// ','-separated lengths in [1, cli::kMaxCount] of command `cmd`'s --lengths; empty items,
// non-numbers and values out of range are usage errors (cli::UsageError).
std::vector<int64_t> parse_lengths(std::string_view list, const char* cmd);

struct InputDims {
  int64_t B = 1, H = 1, Hkv = 1, N = 1, D = 1;
};

struct Inputs {
  Tensor q, k, v;  // (B, H, N, D), (B, Hkv, N, D), (B, Hkv, N, D)
};

// The structured inputs of kInputRecipe, filled in parallel over (head, row block).
Inputs make_inputs(const InputDims& d, uint64_t seed);
// Standard normal entries (the upstream gradient dO of --backward), filled in parallel.
Tensor make_normal(const Shape& s, uint64_t seed);
// Zero-filled tensor whose pages are touched now, in parallel (so a case is not charged for them).
Tensor make_zeros(const Shape& s);

// ||a - ref|| / ||ref|| over all elements, accumulated in double (0 when both are all zero).
double relative_error(ConstView a, ConstView ref);

// rel_err (as relative_error) and the cosine similarity of the flattened a and ref, in one pass
// (cos is 1 when both are all zero, 0 when only one is).
struct OutputAgreement {
  double rel_err = 0, cos = 0;
};
OutputAgreement compare_outputs(ConstView a, ConstView ref);

// Machine facts for the JSON document: /proc/cpuinfo's first "model name" ("" if absent) and the
// current UTC time as ISO 8601 (2026-01-31T12:00:00Z).
std::string cpu_model();
std::string utc_now_iso8601();
// The lines every benchmark prints before its table: CPU (model, family/model, features), the
// ISA of the kernels, the GEMM backend with its kernel and why, the threads and the sgemm rate
// that %peak is measured against, and the memory read bandwidth that a decode step's %bw is.
// Runnable tasks of other processes now: the least of 5 samples 10 ms apart of /proc/stat's
// procs_running, less this process's own running threads; -1 when /proc cannot be read.
int other_runnable_tasks();
// The machine lines of bench and bench-model, and a note when other processes share the cores.
void print_machine(FILE* out, double sgemm_gflops, double read_gbs, int threads);

// Memory: glibc settings so freed big buffers go back to the OS, and /proc/self probes.
void configure_malloc_for_rss();
bool reset_peak_rss();                   // writes "5" to /proc/self/clear_refs; false on failure
int64_t read_status_kib(const char* key);  // "VmRSS", "VmHWM" from /proc/self/status; -1 if absent
// Touches OpenBLAS's per-thread buffers and the OpenMP team once, so the first case is not
// charged for them.
void prime_threads_and_blas();

struct TimeStats {
  double median = 0, min = 0, max = 0;
};
TimeStats summarise(std::vector<double> ms);

// Writes text to path.tmp.<pid>, fsyncs and renames it over path.
void write_file_atomic(const std::string& path, const std::string& text);

}  // namespace clattn::bench
