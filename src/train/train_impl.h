// What the two trainable architectures share (train.h): the flat parameter and gradient buffers
// with their Hugging Face names, the per-layer attentions with their training Contexts over one
// Scratch, the activation arena sized once per (B, T), timers, and the head's loss.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "clattn/attention.h"
#include "clattn/parallel.h"
#include "clattn/train.h"

namespace clattn::train {

enum class Init { normal, one, zero };

using Clock = std::chrono::steady_clock;
inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Strided (B, heads, T, hd) view over token-major rows of stride ld: no transpose is ever made.
inline View heads_view(float* base, int64_t B, int64_t heads, int64_t T, int64_t hd, int64_t ld) {
  View v{base, Shape{B, heads, T, hd}, {}};
  v.strides = {T * ld, hd, ld, 1};
  return v;
}

// fn(i) for i in [0, n), each of about `work` floats: serially when the whole is small (an OpenMP
// region costs a few µs), else over the team in blocks of ~4096 floats.
template <class F>
void for_rows(int64_t n, int64_t work, F&& fn) {
  if (n * work < 32768) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  const int64_t blk = std::max<int64_t>(1, 4096 / std::max<int64_t>(work, 1));
  parallel_for((n + blk - 1) / blk, [&](int64_t b) {
    for (int64_t i = b * blk; i < std::min(n, (b + 1) * blk); ++i) fn(i);
  });
}

// Bump allocator over one buffer: each piece 64-byte aligned; carving is two passes (measure,
// then place) so the buffer is allocated once per (B, T).
class Arena {
 public:
  void begin(float* base) { base_ = base; used_ = 0; }
  float* take(int64_t n) {
    float* p = base_ ? base_ + used_ : nullptr;
    used_ += (n + 15) / 16 * 16;
    return p;
  }
  int64_t used() const { return used_; }
 private:
  float* base_ = nullptr;
  int64_t used_ = 0;
};

class ModelBase : public TrainModel {
 public:
  ModelBase(const ModelConfig& cfg, TaskKind head) : cfg_(cfg), head_(head) {}
  const ModelConfig& config() const override { return cfg_; }
  TaskKind head() const override { return head_; }
  void set_attention(const std::string& plan, bool training = true) override;
  const std::string& attention_plan() const { return plan_; }
  void set_dropout(float p) override;
  std::span<float> params() override { return {params_.data(), params_.size()}; }
  std::span<float> grads() override { return {grads_.data(), grads_.size()}; }
  const std::vector<ParamInfo>& param_info() const override { return info_; }
  void zero_grads() override;
  double train_bytes(int64_t B, int64_t T) const override;
  ConstView last_hidden() const override { return make_view(static_cast<const float*>(xf_), Shape{B_ * T_, cfg_.hidden}); }
  void save(const std::string& dir) const override;

  // Layout: every parameter once, in order (adjacent tensors that form one fused matrix must be
  // added in that order), then allocate() and init().
  int64_t add(const std::string& name, std::vector<int64_t> shape, Init init);
  void allocate();
  void init(uint64_t seed);
  float* p(int64_t off) { return params_.data() + off; }
  float* g(int64_t off) { return grads_.data() + off; }
  // Copies a saved tensor into its slot (load()): every name must be present with its shape.
  void load_tensors(const std::string& file);

 protected:
  virtual bool causal() const = 0;
  // Floats of the activation arena at (B, T) (an upper bound of what ensure() carves).
  virtual double arena_floats(int64_t B, int64_t T) const = 0;
  // Validates the batch against the model (sizes, lengths, targets' shape).
  void check_batch(const Batch& b) const;
  // Runs layer l's attention forward / backward with the batch's lengths and this step's draws.
  void attn_forward(int64_t l, const AttentionInputs& in, View out);
  void attn_backward(int64_t l, const AttentionInputs& in, ConstView out, ConstView dout, View dq,
                     View dk, View dv);
  AttentionInputs attn_inputs(int64_t l, ConstView q, ConstView k, ConstView v, const Batch& b,
                              bool train, uint64_t step);
  // The loss head over the final hidden state xf (rows, H): classify (mean over valid tokens) or
  // token targets (mlm / lm, only rows with target != -1). With `train`, writes dxf (rows, H)
  // for the gradient of the batch's MEAN loss and accumulates the head's parameter gradients.
  void head_forward_backward(const Batch& b, const float* xf, float* dxf, bool train, StepResult& r);
  // Head parameters: the output matrix (V or C, H) and bias (or -1), and their row count.
  int64_t head_w_ = -1, head_b_ = -1, head_out_ = 0;

  // The step's result with this call's timings (attention, dense layers, total since t0).
  StepResult timed(StepResult r, Clock::time_point t0) const {
    r.attention_ms = attn_ms_;
    r.dense_ms = dense_ms_;
    r.total_ms = ms_since(t0);
    return r;
  }
  // A linear layer with timing: y = x·Wᵀ + b, or with `res`, y = res + x·Wᵀ + b (the residual fused
  // into the GEMM's C).
  void lin(float* y, int64_t ldy, const float* x, int64_t ldx, const float* w, const float* b,
           int64_t rows, int64_t in, int64_t out, const float* res = nullptr);
  void lin_bwd(float* dx, int64_t lddx, float* dw, float* db, const float* dy, int64_t lddy,
               const float* x, int64_t ldx, const float* w, int64_t rows, int64_t in, int64_t out,
               bool accumulate = false);

  ModelConfig cfg_;
  TaskKind head_;
  std::string plan_ = "full";
  bool trainable_ = true;  // every layer's attention has a backward (set_attention)
  std::vector<std::string> specs_;
  std::vector<std::unique_ptr<Attention>> att_;
  std::vector<Context> ctx_;
  std::vector<AttentionState> states_;
  Scratch scratch_;
  float dropout_ = 0;
  std::vector<float> params_, grads_;  // one allocation each
  std::vector<ParamInfo> info_;
  std::vector<Init> inits_;
  // Head workspace (sized with the arena): selected rows, their targets, gathered hidden states.
  std::vector<int32_t> sel_, tsel_;
  float *hs_ = nullptr, *dhs_ = nullptr, *logits_ = nullptr;
  float* xf_ = nullptr;  // (rows, H) final norm output
  Tensor arena_;
  int64_t B_ = 0, T_ = 0;
  double attn_ms_ = 0, dense_ms_ = 0;
};

std::string head_name(TaskKind k);
TaskKind head_from_name(const std::string& s);

}  // namespace clattn::train
