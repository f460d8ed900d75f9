// Training transformers on the CPU: a trainable encoder or decoder with its task head, every layer
// with a hand-written backward (nn.h), any registered attention per layer, AdamW, and checkpoints
// in Hugging Face naming that the inference loaders of model.h read.
//
// Architectures (from ModelConfig; sizes from it, the rest fixed as below whatever it says):
//   kind bert  pre-LN encoder: word + learned position embeddings (no token types), embedding
//              LayerNorm, L x [LN -> MHA -> residual, LN -> GELU FFN -> residual], final LayerNorm
//              (config: norm_placement "pre", final_layer_norm true, type_vocab_size 0). Heads:
//              classify  MEAN over each sequence's valid tokens -> linear ("classifier.weight",
//                        "classifier.bias"). Not a class token: with clustered attentions one
//                        position's output is its cluster centroid's, a mean is robust to that,
//                        and the data need not prepend anything. (Encoder::load reads the folder;
//                        its classifier reads position 0 unless it honours "classifier_pooling".)
//              mlm       output layer tied to the word embeddings plus "cls.predictions.bias"
//                        (no transform layer), at the positions whose target is not -1.
//   kind llama decoder (RMSNorm, rotate-half RoPE, SwiGLU, GQA when kv_heads < heads, embeddings
//              tied to the output layer), head lm (next token; targets -1 are skipped).
// Parameters, gradients and optimiser moments live in flat float buffers (one allocation each),
// so the optimiser step and gradient clipping are single passes. Tensors that one GEMM reads as a
// single matrix are adjacent: q, k, v (weights, and biases) and LLaMA's gate and up.
// Activations are saved in one arena sized per (B, T): the first call at a new size allocates,
// later ones do not.
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
  double attention_ms = 0;  // attention forward + backward
  double dense_ms = 0;      // linear layers (GEMMs) forward + backward, the output layer included
  double total_ms = 0;      // the whole call
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
  // model.h plan syntax; refuses variants without per-example lengths, and, unless `training` is
  // false (evaluation only: forward_backward with train = false), variants without a backward.
  // Shared-QK attention (reformer) is given the layer's queries as keys (the K projection is then
  // unused, as in the Reformer paper's shared-QK model).
  // Saved in config.json ("clattn_attention") and restored by load(), with the layer state of
  // stateful attentions (routing's EMA centroids, as "clattn.attention_state.<layer>.<name>"
  // tensors of model.safetensors); a layer whose spec changes starts a fresh state.
  virtual void set_attention(const std::string& plan, bool training = true) = 0;
  virtual void set_dropout(float p) = 0;

  // Forward of a batch and the loss; with `train` also the backward, ACCUMULATING into grads()
  // the gradient of the batch's MEAN loss (loss_sum / counted). `step` seeds the stochastic
  // attentions and dropout (fresh draws each step, reproducible); `train` also lets stateful
  // attentions (routing's EMA) update their state. Dropout applies to both residual branches of
  // every layer, only when `train`.
  virtual StepResult forward_backward(const Batch& batch, bool train, uint64_t step) = 0;

  // The final hidden state of the last forward_backward, after the final norm: (B·T, hidden),
  // valid until the next call (what the head reads; tests compare it with the inference models).
  virtual ConstView last_hidden() const = 0;

  // Bytes a training step of (B, T) holds, to refuse a request before allocating it: the
  // activation arena, every layer's attention workspace and saved state (training mode), and the
  // parameters with their gradients and both AdamW moments.
  virtual double train_bytes(int64_t B, int64_t T) const = 0;

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
  // Applies one update from the model's grads (already averaged; clipped in place when their
  // global norm exceeds clip); returns the pre-clip grad norm. The learning rate is
  // nn::lr_schedule(steps_done(), ...) before the step. A non-finite norm is an error (nothing is
  // updated). Does not zero the grads.
  double step(float* lr_used = nullptr);
  int64_t steps_done() const { return t_; }
  // m, v (F32, bit-exact) and t (metadata) as safetensors, written atomically; load() checks
  // that the sizes match the model's parameters.
  void save(const std::string& path) const;
  void load(const std::string& path);
 private:
  struct Run {  // consecutive parameters with the same weight-decay flag: one adamw_step each
    int64_t offset, size;
    bool decay;
  };
  TrainModel* model_;
  OptimizerOptions opt_;
  std::vector<float> m_, v_;
  std::vector<Run> runs_;
  int64_t t_ = 0;
};

}  // namespace clattn
