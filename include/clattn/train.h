// Training transformers on the CPU: a trainable encoder or decoder with its task head, every layer
// with a hand-written backward (nn.h), any registered attention per layer, AdamW, and checkpoints
// in Hugging Face naming that the inference loaders of model.h read.
//
// Architectures (from ModelConfig):
//   kind bert  pre-LN encoder (norm_placement "pre"), learned positions, GELU FFN; head
//              classify: [CLS]-free mean-pooled... (see src/train/ header for the exact head)
//              mlm: a tied output layer over the vocabulary
//   kind llama decoder (RMSNorm, RoPE, SwiGLU, tied embeddings), head lm (next token)
// Parameters, gradients and optimiser moments live in flat float buffers (one allocation each),
// so the optimiser step and gradient clipping are single passes.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "clattn/data.h"
#include "clattn/model.h"
#include "clattn/nn.h"

namespace clattn {

struct ParamInfo {
  std::string name;            // Hugging Face tensor name, e.g. "encoder.layer.0.attention.self.query.weight"
  std::vector<int64_t> shape;
  int64_t offset = 0, size = 0;  // into params() / grads()
  bool decay = true;           // AdamW weight decay (matrices and embeddings; not biases or norms)
};

struct StepResult {
  double loss_sum = 0;   // summed loss over counted targets (nats)
  int64_t counted = 0;   // targets counted
  int64_t correct = 0;   // argmax == target among counted
  double attention_ms = 0, total_ms = 0;
};

class TrainModel {
 public:
  // Random initialisation (N(0, 0.02) matrices, unit norms, zero biases) from cfg's sizes.
  static std::unique_ptr<TrainModel> create(const ModelConfig& cfg, TaskKind head, uint64_t seed);
  // A checkpoint folder written by save() (config.json + model.safetensors).
  static std::unique_ptr<TrainModel> load(const std::string& dir);
  virtual ~TrainModel() = default;

  virtual const ModelConfig& config() const = 0;
  virtual TaskKind head() const = 0;
  virtual void set_attention(const std::string& plan) = 0;  // model.h plan syntax
  virtual void set_dropout(float p) = 0;

  // Forward of a batch and the loss; with `train` also the backward, ACCUMULATING into grads().
  // `step` seeds the stochastic attentions and dropout (fresh draws each step, reproducible).
  virtual StepResult forward_backward(const Batch& batch, bool train, uint64_t step) = 0;

  virtual std::span<float> params() = 0;
  virtual std::span<float> grads() = 0;
  virtual const std::vector<ParamInfo>& param_info() const = 0;
  virtual void zero_grads() = 0;

  // config.json + model.safetensors, atomically (atomic_file.h), loadable by Encoder::load /
  // Decoder::load.
  virtual void save(const std::string& dir) const = 0;
};

struct OptimizerOptions {
  float lr = 1e-3f, min_lr = 1e-4f;
  int64_t warmup = 100, total_steps = 1000;
  float clip = 1.0f;  // global gradient-norm clip (0 = off)
  nn::AdamWOptions adamw;
};

// AdamW over a TrainModel's flat buffers: clip, schedule, step. No allocation after construction.
class Optimizer {
 public:
  Optimizer(TrainModel& model, const OptimizerOptions& opt);
  // Applies one update from the model's grads (already averaged); returns the pre-clip grad norm.
  double step(float* lr_used = nullptr);
  int64_t steps_done() const { return t_; }
  void save(const std::string& path) const;  // m, v, t (safetensors, atomic)
  void load(const std::string& path);
 private:
  TrainModel* model_;
  OptimizerOptions opt_;
  std::vector<float> m_, v_;
  int64_t t_ = 0;
};

}  // namespace clattn
