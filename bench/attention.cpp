// Micro-benchmarks (Google Benchmark) of attention through the public API, as a consumer calls it:
// one full-attention head, the baseline every variant is measured against. `clattn bench` sweeps
// whole variants; the internal kernels under them (tile microkernels, exp, row gathers) are timed
// by tests/kernel_bench (clattn_kernel_bench), which may include src/ headers.
// Run: ./build/clattn_bench --benchmark_filter=FullHead
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "clattn/attention.h"
#include "clattn/parallel.h"
#include "clattn/rng.h"
#include "clattn/tensor.h"

namespace {

using namespace clattn;

std::vector<float> randv(size_t n, uint64_t stream) {
  std::vector<float> v(n);
  Rng r(42);
  for (size_t i = 0; i < n; ++i) v[i] = r.normal(stream, i);
  return v;
}

// One head of full attention forward, single thread, N = M = range(0), D = 64.
void BM_FullHead(benchmark::State& st) {
  const int64_t n = st.range(0);
  set_threads(1);
  auto q = randv(static_cast<size_t>(n * 64), 1), k = randv(static_cast<size_t>(n * 64), 2), v = randv(static_cast<size_t>(n * 64), 3);
  std::vector<float> o(static_cast<size_t>(n * 64));
  AttentionInputs in;
  in.q = make_view(static_cast<const float*>(q.data()), Shape{1, 1, n, 64});
  in.k = make_view(static_cast<const float*>(k.data()), Shape{1, 1, n, 64});
  in.v = make_view(static_cast<const float*>(v.data()), Shape{1, 1, n, 64});
  auto att = make_attention("full");
  Context ctx;
  for (auto _ : st) att->forward(in, make_view(o.data(), Shape{1, 1, n, 64}), ctx);
  st.counters["GFLOP/s"] = benchmark::Counter(4.0 * n * n * 64, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_FullHead)->Arg(1024)->Arg(4096)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
