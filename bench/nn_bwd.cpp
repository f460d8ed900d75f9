// Micro-benchmarks (Google Benchmark) of the nn layers' training passes: the linear layer's
// backward (two sgemms and the bias column sum) against its forward at the same shape, and the
// bandwidth-bound passes a training step makes over every activation (LayerNorm backward,
// GELU backward, cross-entropy with its gradient, AdamW). GFLOP/s counts 2·rows·in·out per sgemm.
// Run: ./build/clattn_bench --benchmark_filter=Linear
#include <benchmark/benchmark.h>

#include <vector>

#include "clattn/nn.h"
#include "clattn/rng.h"

namespace {

using namespace clattn;

std::vector<float> randv(int64_t n, uint64_t stream) {
  std::vector<float> v(static_cast<size_t>(n));
  Rng r(42);
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = r.normal(stream, static_cast<uint64_t>(i));
  return v;
}

void linear_args(benchmark::internal::Benchmark* b) {
  b->Args({4096, 128, 256})->Args({16384, 256, 1024})->Args({16384, 1024, 256})->Unit(benchmark::kMillisecond);
}

// y (rows, out) = x (rows, in) · Wᵀ + b.
void BM_LinearFwd(benchmark::State& st) {
  const int64_t rows = st.range(0), in = st.range(1), out = st.range(2);
  auto x = randv(rows * in, 1), w = randv(out * in, 2), b = randv(out, 3);
  std::vector<float> y(static_cast<size_t>(rows * out));
  for (auto _ : st) {
    nn::linear_fwd(y.data(), out, x.data(), in, w.data(), b.data(), rows, in, out);
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * rows * in * out, benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
}
BENCHMARK(BM_LinearFwd)->Apply(linear_args);

// dx (rows, in) = dy · W, dW += dyᵀ · x, db += Σ dy: 4·rows·in·out flops.
void BM_LinearBwd(benchmark::State& st) {
  const int64_t rows = st.range(0), in = st.range(1), out = st.range(2);
  auto x = randv(rows * in, 1), w = randv(out * in, 2), dy = randv(rows * out, 4);
  std::vector<float> dx(static_cast<size_t>(rows * in)), dw(static_cast<size_t>(out * in)), db(static_cast<size_t>(out));
  for (auto _ : st) {
    nn::linear_bwd(dx.data(), in, dw.data(), db.data(), dy.data(), out, x.data(), in, w.data(), rows, in, out);
    benchmark::DoNotOptimize(dx.data());
  }
  st.counters["GFLOP/s"] = benchmark::Counter(4.0 * rows * in * out, benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
}
BENCHMARK(BM_LinearBwd)->Apply(linear_args);

// Each part of the backward alone (0: dx, 1: dW, 2: db) to see where its time goes.
void BM_LinearBwdPart(benchmark::State& st) {
  const int64_t rows = st.range(0), in = st.range(1), out = st.range(2), part = st.range(3);
  auto x = randv(rows * in, 1), w = randv(out * in, 2), dy = randv(rows * out, 4);
  std::vector<float> dx(static_cast<size_t>(rows * in)), dw(static_cast<size_t>(out * in)), db(static_cast<size_t>(out));
  for (auto _ : st) {
    nn::linear_bwd(part == 0 ? dx.data() : nullptr, in, part == 1 ? dw.data() : nullptr, part == 2 ? db.data() : nullptr,
                   dy.data(), out, x.data(), in, w.data(), rows, in, out);
    benchmark::DoNotOptimize(dx.data());
  }
  st.counters["GFLOP/s"] = benchmark::Counter(part == 2 ? 1.0 * rows * out : 2.0 * rows * in * out,
                                              benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_LinearBwdPart)
    ->Args({16384, 256, 1024, 0})->Args({16384, 256, 1024, 1})->Args({16384, 256, 1024, 2})
    ->Unit(benchmark::kMillisecond);

// Bandwidth-bound passes over (rows, dim) activations; GB/s counts the floats read and written.
void BM_LayerNormBwd(benchmark::State& st) {
  const int64_t rows = st.range(0), dim = st.range(1);
  auto x = randv(rows * dim, 1), g = randv(dim, 2), bt = randv(dim, 3), dy = randv(rows * dim, 4);
  std::vector<float> y(static_cast<size_t>(rows * dim)), mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
  std::vector<float> dx(y.size()), dg(static_cast<size_t>(dim)), db(static_cast<size_t>(dim));
  nn::layernorm_fwd(y.data(), x.data(), g.data(), bt.data(), rows, dim, 1e-5f, mean.data(), rstd.data());
  for (auto _ : st) {
    nn::layernorm_bwd(dx.data(), dg.data(), db.data(), dy.data(), x.data(), g.data(), mean.data(), rstd.data(), rows, dim);
    benchmark::DoNotOptimize(dx.data());
  }
  st.counters["GB/s"] = benchmark::Counter(4.0 * 3 * rows * dim, benchmark::Counter::kIsIterationInvariantRate,
                                           benchmark::Counter::kIs1000);
}
BENCHMARK(BM_LayerNormBwd)->Args({16384, 256})->Unit(benchmark::kMillisecond);

void BM_GeluBwd(benchmark::State& st) {
  const int64_t n = st.range(0);
  auto x = randv(n, 1), dy = randv(n, 2);
  std::vector<float> dx(static_cast<size_t>(n));
  for (auto _ : st) {
    nn::gelu_bwd(dx.data(), dy.data(), x.data(), n, nn::Gelu::erf);
    benchmark::DoNotOptimize(dx.data());
  }
  st.counters["GB/s"] = benchmark::Counter(4.0 * 3 * n, benchmark::Counter::kIsIterationInvariantRate,
                                           benchmark::Counter::kIs1000);
}
BENCHMARK(BM_GeluBwd)->Arg(16384 * 1024)->Unit(benchmark::kMillisecond);

// Loss and gradient over (rows, classes) logits, the gradient written over the logits.
void BM_CrossEntropy(benchmark::State& st) {
  const int64_t rows = st.range(0), classes = st.range(1);
  auto l = randv(rows * classes, 1);
  std::vector<int32_t> t(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) t[static_cast<size_t>(r)] = static_cast<int32_t>(r % classes);
  std::vector<float> d(l.size());
  for (auto _ : st) {
    benchmark::DoNotOptimize(nn::cross_entropy(d.data(), l.data(), t.data(), rows, classes, 1.f / rows, nullptr));
  }
  st.counters["GB/s"] = benchmark::Counter(4.0 * 2 * rows * classes, benchmark::Counter::kIsIterationInvariantRate,
                                           benchmark::Counter::kIs1000);
}
BENCHMARK(BM_CrossEntropy)->Args({16384, 256})->Unit(benchmark::kMillisecond);

void BM_AdamW(benchmark::State& st) {
  const int64_t n = st.range(0);
  auto p = randv(n, 1), g = randv(n, 2);
  std::vector<float> m(static_cast<size_t>(n)), v(static_cast<size_t>(n));
  int64_t t = 0;
  for (auto _ : st) {
    nn::adamw_step(p.data(), g.data(), m.data(), v.data(), n, ++t, 1e-3f, nn::AdamWOptions{}, true);
    benchmark::DoNotOptimize(p.data());
  }
  st.counters["GB/s"] = benchmark::Counter(4.0 * 7 * n, benchmark::Counter::kIsIterationInvariantRate,
                                           benchmark::Counter::kIs1000);
}
BENCHMARK(BM_AdamW)->Arg(1 << 22)->Unit(benchmark::kMillisecond);

}  // namespace
