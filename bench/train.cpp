// One training step of a small BERT-shaped encoder (4 layers, hidden 128, 2 heads, FFN 256, vocab
// 256, mlm head with 15 % of the positions as targets) at sequence length N: forward, backward and
// AdamW, with the share of the step in attention, in the dense layers (and their GFLOP/s) and in
// the optimizer. Through the public API, as `clattn train` runs it.
// Run: ./build/clattn_bench --benchmark_filter='TrainStep/(2048|4096)/' (N = 2048, 4096; 16384 also registered)
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "clattn/data.h"
#include "clattn/model.h"
#include "clattn/train.h"

namespace {

using namespace clattn;

const char* const kSpecs[] = {"full", "improved-clustered:clusters=100,topk=32", "clustered:clusters=100"};

// range(0) = N, range(1) = the spec's index in kSpecs.
void BM_TrainStep(benchmark::State& st) {
  const int64_t N = st.range(0);
  const std::string spec = kSpecs[st.range(1)];
  st.SetLabel(spec);
  ModelConfig c;
  c.kind = ModelKind::bert;
  c.hidden = 128;
  c.layers = 4;
  c.heads = 2;
  c.ffn = 256;
  c.vocab = 256;
  c.max_positions = N;
  c.eps = 1e-5f;
  std::unique_ptr<Model> m = Model::create(c, TaskKind::mlm, 1);
  m->set_attention(spec);
  Optimizer opt(*m, OptimizerOptions{});
  Batch b;
  b.B = 1;
  b.T = N;
  b.lengths = {static_cast<int32_t>(N)};
  b.ids.resize(static_cast<size_t>(N));
  b.targets.assign(static_cast<size_t>(N), -1);
  for (int64_t i = 0; i < N; ++i) {
    b.ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + 13) % 256);
    if (i % 20 < 3) b.targets[static_cast<size_t>(i)] = static_cast<int32_t>((i * 104729 + 7) % 256);
  }
  uint64_t step = 0;
  auto one = [&](double& att, double& dense, double& optms) {
    m->zero_grads();
    const StepResult r = m->forward_backward(b, true, step++);
    const auto t0 = std::chrono::steady_clock::now();
    opt.step();
    optms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    att += r.attention_ms;
    dense += r.dense_ms;
  };
  double att = 0, dense = 0, optms = 0;
  one(att, dense, optms);  // the first step sizes the arena
  att = dense = optms = 0;
  for (auto _ : st) one(att, dense, optms);
  const double steps = static_cast<double>(st.iterations());
  // Dense FLOPs per step: per layer q|k|v, output and the two FFN products, forward once and
  // backward twice (dx and dW), plus the output layer over the target rows.
  const double H = 128, F = 256, targets = static_cast<double>(N / 20 * 3 + std::min<int64_t>(N % 20, 3));
  const double flops = 3.0 * (4 * 2.0 * static_cast<double>(N) * H * (3 * H + H + 2 * F) + 2.0 * targets * H * 256);
  st.counters["attention_ms"] = att / steps;
  st.counters["dense_ms"] = dense / steps;
  st.counters["optimizer_ms"] = optms / steps;
  st.counters["dense_GFLOP/s"] = flops / (dense / steps) / 1e6;
  st.counters["train_MB"] = m->train_bytes(1, N) / 1e6;
}
BENCHMARK(BM_TrainStep)
    ->ArgsProduct({{2048, 4096, 16384}, {0, 1, 2}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(5);

}  // namespace
