// Micro-benchmarks (Google Benchmark) of the pieces under full attention: the tile microkernels,
// the vectorised exp and one full-attention head. `clattn bench` measures whole variants; these
// isolate where the time goes. Run: ./build/clattn_bench --benchmark_filter=Abt
#include <benchmark/benchmark.h>

#include <vector>

#include "clattn/attention.h"
#include "clattn/parallel.h"
#include "clattn/rng.h"
#include "core/microkernel.h"
#include "core/simd.h"

namespace {

using namespace clattn;

std::vector<float> randv(size_t n, uint64_t stream) {
  std::vector<float> v(n);
  Rng r(42);
  for (size_t i = 0; i < n; ++i) v[i] = r.normal(stream, i);
  return v;
}

// S (64, 512) = Q (64, 64) · K panels: the forward's score tile.
void BM_Abt(benchmark::State& st) {
  const int64_t m = 64, np = 8, depth = 64;
  auto a = randv(static_cast<size_t>(m * depth), 1), p = randv(static_cast<size_t>(np * 64 * depth), 2);
  std::vector<float> c(static_cast<size_t>(m * np * 64));
  for (auto _ : st) {
    mk::gemm_abt(m, np, depth, a.data(), depth, p.data(), c.data(), np * 64);
    benchmark::DoNotOptimize(c.data());
  }
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * m * np * 64 * depth, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_Abt);

// O (64, 64) = diag(a)·O + P (64, 512) · V (512, 64): the forward's value tile.
void BM_Ab(benchmark::State& st) {
  const int64_t m = 64, k = 512, n = 64;
  auto a = randv(static_cast<size_t>(m * k), 1), b = randv(static_cast<size_t>(k * n), 2), s = randv(static_cast<size_t>(m), 3);
  std::vector<float> c(static_cast<size_t>(m * n));
  for (auto _ : st) {
    mk::gemm_ab(m, n, k, a.data(), k, 1, b.data(), n, c.data(), n, s.data());
    benchmark::DoNotOptimize(c.data());
  }
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * m * n * k, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_Ab);

void BM_Exp2(benchmark::State& st) {
  auto x = randv(64 * 512, 1);
  for (auto _ : st) {
    simd::vf acc{};
    for (size_t i = 0; i < x.size(); i += 16) acc += simd::exp2(simd::load(x.data() + i));
    benchmark::DoNotOptimize(acc);
  }
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations()) * static_cast<int64_t>(x.size()));
}
BENCHMARK(BM_Exp2);

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
