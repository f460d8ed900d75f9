// Tiny models and batches shared by the training tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "clattn/data.h"
#include "clattn/model.h"
#include "clattn/threads.h"
#include "clattn/rng.h"
#include "clattn/train.h"

namespace clattn::testing {

// Runs a scope on one thread: at these sizes an OpenMP region costs more than its work (and on a
// loaded machine much more), and the loops calling the model many times would take minutes.
struct OneThread {
  int saved = max_threads();
  OneThread() { set_threads(1); }
  ~OneThread() { set_threads(saved); }
};

inline ModelConfig tiny_bert(int64_t vocab = 11, int64_t labels = 0) {
  ModelConfig c;
  c.kind = ModelKind::bert;
  c.hidden = 16;
  c.layers = 2;
  c.heads = 2;
  c.ffn = 32;
  c.vocab = vocab;
  c.max_positions = 32;
  c.num_labels = labels;
  c.eps = 1e-5f;
  // What a fresh clattn classifier / masked LM is: pre-LN with a final LayerNorm, mean pooling.
  c.pre_ln = true;
  c.final_layer_norm = true;
  c.mean_pooling = true;
  return c;
}

inline ModelConfig tiny_llama(int64_t vocab = 13, int64_t kv_heads = 2) {
  ModelConfig c;
  c.kind = ModelKind::llama;
  c.hidden = 16;
  c.layers = 2;
  c.heads = 2;
  c.kv_heads = kv_heads;
  c.head_dim = 8;
  c.ffn = 24;
  c.vocab = vocab;
  c.max_positions = 64;
  c.eps = 1e-5f;
  c.tie_embeddings = true;
  return c;
}

// B sequences padded to T with the given lengths; targets for `kind` (mlm: about half the valid
// positions; lm: every valid position; classify: one label per sequence), -1 elsewhere.
inline Batch tiny_batch(TaskKind kind, int64_t T, std::vector<int32_t> lengths, int64_t vocab, int64_t classes,
                        uint64_t seed) {
  Batch b;
  b.B = static_cast<int64_t>(lengths.size());
  b.T = T;
  b.lengths = std::move(lengths);
  const Rng rng(seed);
  b.ids.assign(static_cast<size_t>(b.B * T), 0);
  for (int64_t i = 0; i < b.B * T; ++i) b.ids[static_cast<size_t>(i)] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab), 1, static_cast<uint64_t>(i)));
  if (kind == TaskKind::classify) {
    for (int64_t s = 0; s < b.B; ++s) b.targets.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(classes), 2, static_cast<uint64_t>(s))));
    return b;
  }
  b.targets.assign(static_cast<size_t>(b.B * T), -1);
  for (int64_t s = 0; s < b.B; ++s)
    for (int64_t t = 0; t < b.lengths[static_cast<size_t>(s)]; ++t) {
      const uint64_t i = static_cast<uint64_t>(s * T + t);
      if (kind == TaskKind::lm || rng.uniform(3, i) < 0.5f)
        b.targets[i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab), 4, i));
    }
  return b;
}

// Moves the parameters away from the initialisation, so every gradient is exercised: matrices to
// N(0, 0.3²) (large enough that attention is far from uniform), norm gains and biases by N(0, 0.1²).
inline void roughen(Model& m, uint64_t seed) {
  const Rng rng(seed);
  std::span<float> p = m.params();
  for (const ParamInfo& pi : m.param_info())
    for (int64_t i = 0; i < pi.size; ++i) {
      float& x = p[static_cast<size_t>(pi.offset + i)];
      const float z = rng.normal(7, static_cast<uint64_t>(pi.offset + i));
      x = pi.decay ? 0.3f * z : x + 0.1f * z;
    }
}

}  // namespace clattn::testing
