// Micro-benchmarks (Google Benchmark) of attention through the public API, as a consumer calls it:
// one full-attention head, the baseline every variant is measured against, and token-by-token
// decoding of one head with causal improved-clustered attention. `clattn bench` sweeps
// whole variants; the internal kernels under them (tile microkernels, exp, row gathers) are timed
// by tests/kernel_bench (clattn_kernel_bench), which may include src/ headers.
// Run: ./build/clattn_bench --benchmark_filter=FullHead
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "clattn/attention.h"
#include "clattn/kv_cache.h"
#include "clattn/threads.h"
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

// Decoding one head (B 1, H 1, D 64) with improved-clustered (100 clusters, top-32, blocks of 512,
// segments of 4096) on range(0) threads: the cache holds 61440 positions, the end of a segment, and
// each iteration decodes 64 tokens from there one at a time. Its first token starts a segment, so
// it builds the new clusters and streams their attention over all 61440 keys (the step a decode
// pays once per segment); the other 63 are ordinary steps.
void BM_CausalClusteredDecode(benchmark::State& st) {
  constexpr int64_t kPrefix = 61440, kTokens = 64, D = 64, M = kPrefix + kTokens;
  set_threads(static_cast<int>(st.range(0)));
  auto q = randv(static_cast<size_t>(M * D), 1), k = randv(static_cast<size_t>(M * D), 2), v = randv(static_cast<size_t>(M * D), 3);
  auto rows = [&](const std::vector<float>& x, int64_t pos, int64_t n) {
    return make_view(x.data() + pos * D, Shape{1, 1, n, D});
  };
  auto att = make_attention("improved-clustered:clusters=100,topk=32");
  KVCache kc(1, 1, M, D, D, 1);
  Context ctx = Context::for_inference();
  std::vector<float> o(static_cast<size_t>(kPrefix * D));
  auto decode = [&](int64_t pos, int64_t n) {
    kc.append(rows(k, pos, n), rows(v, pos, n), rows(q, pos, n));
    AttentionInputs in;
    in.q = rows(q, pos, n);
    in.k = kc.keys();
    in.v = kc.values();
    in.cache = &kc;
    in.causal = true;
    att->forward(in, make_view(o.data(), Shape{1, 1, n, D}), ctx);
  };
  decode(0, kPrefix);
  for (auto _ : st) {
    kc.truncate(kPrefix);  // drops the derived state: the next token rebuilds the segment's
    for (int64_t t = 0; t < kTokens; ++t) decode(kPrefix + t, 1);
  }
  st.counters["tokens/s"] = benchmark::Counter(static_cast<double>(kTokens), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_CausalClusteredDecode)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
