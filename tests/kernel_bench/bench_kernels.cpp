// Micro-benchmarks (Google Benchmark) of the internal pieces under the attention variants: the
// tile microkernels, the vectorised exp and the random-order row gathers of the sort-based
// variants. `clattn bench` and bench/ measure through the public API; these isolate where the time
// goes inside it.
// Where they live: bench/ builds on the public headers only (as the CLI, the bindings and the fuzz
// targets do), and no public call runs one microkernel, one exp loop or one gather on its own, so
// these benchmarks need src/ headers. They are kept here, beside the tests (which may include
// src/), as their own executable clattn_kernel_bench, built with the benchmarks
// (CLATTN_BUILD_BENCH) and never registered with CTest.
// Run: ./build/clattn_kernel_bench --benchmark_filter=Abt (RowsDot: the decode step's products)
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "attention/tile/gather.h"
#include "clattn/gemm.h"
#include "clattn/nn.h"
#include "clattn/threads.h"
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

// y (1, 1408) = x (1, 512) · Wᵀ over 60 weight matrices in turn (173 MB of f32, past the caches,
// as a decode step's MLP reads them): rows_dot on f32 (range(0) = 0) against rows_dot16 on f16 (1)
// and bf16 (2), one thread. Bytes/s is the rate W streams at.
void BM_RowsDot(benchmark::State& st) {
  const int64_t n = 1408, k = 512, mats = 60;
  const int type = static_cast<int>(st.range(0));
  auto x = randv(static_cast<size_t>(k), 1);
  std::vector<float> w32, y(static_cast<size_t>(n));
  std::vector<uint16_t> w16;
  if (type == 0) w32 = randv(static_cast<size_t>(n * k * mats), 2);
  else w16.assign(static_cast<size_t>(n * k * mats), type == 1 ? 0x2e66 : 0x3dcc);  // about 0.1
  for (auto _ : st) {
    for (int64_t m = 0; m < mats; ++m) {
      if (type == 0) mk::rows_dot(1, n, k, 1.f, x.data(), k, w32.data() + m * n * k, k, 0.f, y.data(), n);
      else mk::rows_dot16(type == 1 ? mk::Half::f16 : mk::Half::bf16, 1, n, k, 1.f, x.data(), k, w16.data() + m * n * k, k, 0.f, y.data(), n);
    }
    benchmark::DoNotOptimize(y.data());
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * n * k * mats * (type == 0 ? 4 : 2));
}
BENCHMARK(BM_RowsDot)->Arg(0)->Arg(1)->Arg(2);

// The forward's softmax pass over one (64, 512) score tile: row max, then exp2 and sum, in the
// active ISA's copy (rows_isa.cpp), as full attention runs it.
void BM_OnlineSoftmax(benchmark::State& st) {
  auto x = randv(64 * 512, 1);
  // range(0) = 1: three quarters of each row masked (-inf), as a band's or a causal tile's rows are.
  if (st.range(0) == 1)
    for (size_t i = 0; i < x.size(); ++i)
      if (i % 512 >= 128) x[i] = -INFINITY;
  std::vector<float> s(x.size());
  for (auto _ : st) {
    s = x;
    float m = -1e30f, l = 0.f;
    for (int64_t r = 0; r < 64; ++r) {
      m = -1e30f;
      mk::online_softmax_row(s.data() + r * 512, 512, m, l);
    }
    benchmark::DoNotOptimize(l);
  }
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations()) * static_cast<int64_t>(x.size()));
}
BENCHMARK(BM_OnlineSoftmax)->Arg(0)->Arg(1);

// A narrow model's linear layer over a whole batch: Y (m, n) = X (m, k) · Wᵀ with m = 29700
// (KWT-1's 300 clips of 99 tokens), k = range(0), n = range(1), on the OpenMP team: clattn::gemm
// (range(2) = 0) against the tile product over W packed in panels, rows split over the team (1).
void BM_Linear(benchmark::State& st) {
  const int64_t m = 29700, k = st.range(0), n = st.range(1);
  auto x = randv(static_cast<size_t>(m * k), 1), w = randv(static_cast<size_t>(n * k), 2);
  std::vector<float> y(static_cast<size_t>(m * n)), panels(static_cast<size_t>(mk::round_up(n, 64) * k));
  for (auto _ : st) {
    if (st.range(2) == 0) {
      gemm(false, true, m, n, k, 1.f, x.data(), k, w.data(), k, 0.f, y.data(), n);
    } else {
      mk::pack_panels(w.data(), n, k, k, panels.data());
      const int64_t blocks = (m + 191) / 192;
#pragma omp parallel for schedule(static)
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t r0 = b * 192, rows = std::min<int64_t>(192, m - r0);
        mk::gemm_abt(rows, (n + 63) / 64, k, x.data() + r0 * k, k, panels.data(), y.data() + r0 * n, n);
      }
    }
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * m * n * k, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_Linear)->ArgsProduct({{64, 256}, {64, 192, 256}, {0, 1}})->Args({256, 1024, 0})->Args({256, 1024, 1})->Args({1024, 256, 0})->Args({1024, 256, 1})->Args({512, 512, 0})->Args({512, 512, 1})->UseRealTime();

// GELU over 1M floats of N(0, σ²) on one thread (a BERT layer's FFN activations are 16384 x 1024):
// the exact form (range(0) = 0) and the tanh form (1), in the active ISA's copy; σ = range(1).
// σ = 2 is a trained layer's spread; σ = 8 puts 6 % of the inputs below −12.6, where the results
// fall under 1e−35 and, unflushed, would be computed as denormals (microcode assists on x86).
void BM_Gelu(benchmark::State& st) {
  const ThreadLimit one(1);
  auto x = randv(size_t{1} << 20, 1);
  for (float& v : x) v *= static_cast<float>(st.range(1));
  std::vector<float> y(x.size());
  const nn::Gelu kind = st.range(0) == 0 ? nn::Gelu::erf : nn::Gelu::tanh;
  for (auto _ : st) {
    nn::gelu_fwd(y.data(), x.data(), static_cast<int64_t>(x.size()), kind);
    benchmark::DoNotOptimize(y.data());
  }
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations()) * static_cast<int64_t>(x.size()));
}
BENCHMARK(BM_Gelu)->ArgsProduct({{0, 1}, {2, 8}});

// The sort-based variants' gather: 32-row blocks in random order from a head of range(0) rows of
// 64 floats (16 MB at 65536: DRAM, not cache), with the next block requested while copying and
// the block four ahead into L2 when range(1) is 1. Bytes/s counts the rows copied.
void BM_GatherBlocks(benchmark::State& st) {
  const int64_t n = st.range(0), D = 64, blk = 32;
  const bool prefetch = st.range(1) != 0;
  auto x = randv(static_cast<size_t>(n * D), 1);
  std::vector<int32_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  Rng rng(5);
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(rng.below(static_cast<uint64_t>(i + 1), 0, static_cast<uint64_t>(i)))]);
  std::vector<float> dst(static_cast<size_t>(blk * D));
  for (auto _ : st)
    for (int64_t c = 0; c * blk < n; ++c) {
      const int32_t* idx = perm.data() + c * blk;
      gather::Ahead next;
      if (prefetch && (c + 1) * blk < n) next = {idx + blk, blk};
      if (prefetch && (c + gather::kFarBlocks) * blk < n)
        gather::prefetch_l2(x.data(), D, idx + gather::kFarBlocks * blk, blk, D);
      gather::rows(x.data(), D, idx, blk, D, dst.data(), D, blk, 1.f, next);
      benchmark::DoNotOptimize(dst.data());
    }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * n * D * 4);
}
BENCHMARK(BM_GatherBlocks)->Args({16384, 0})->Args({16384, 1})->Args({65536, 0})->Args({65536, 1})->Args({262144, 0})->Args({262144, 1});

}  // namespace

BENCHMARK_MAIN();
