// The per-layer attention stack every model runs its layers through: the plan (one spec per
// layer), the attention objects, their Contexts over one shared Scratch (inference contexts keep
// nothing for a backward; training ones keep what the backward reads), the layer state of
// stateful attentions, the inspection capture and the time spent in attention.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "clattn/attention.h"
#include "clattn/comm.h"
#include "clattn/model.h"
#include "clattn/seq_parallel.h"
#include "clattn/safetensors.h"
#include "model/weights.h"

namespace clattn {

class LayerAttention {
 public:
  LayerAttention(int64_t layers, bool causal, bool gqa) : layers_(layers), causal_(causal), gqa_(gqa) {}

  // Parses and builds the plan (errors name the layer); a layer keeps its state while its spec is
  // unchanged. Nothing changes when the plan is refused.
  void set_plan(const std::string& plan);
  const std::string& plan() const { return plan_; }
  const std::vector<std::string>& specs() const { return specs_; }
  const Attention& at(int64_t l) const { return *att_[static_cast<size_t>(l)]; }
  bool trainable() const;
  // An Error naming the first layer whose attention has no backward.
  void check_trainable() const;

  // The inputs of layer l's call: q, k (q itself for shared-QK attention), v and the masks, with
  // the layer's state for stateful attentions.
  AttentionInputs inputs(int64_t l, ConstView q, ConstView k, ConstView v, std::span<const int32_t> lengths,
                         uint64_t step, bool train);
  // Runs layer l's forward (training contexts when `train`), timed, copying its inputs into the
  // capture when it names this layer.
  void forward(int64_t l, const AttentionInputs& in, View out, bool train);
  void backward(int64_t l, const AttentionInputs& in, ConstView out, ConstView dout, View dq, View dk,
                View dv);

  // Sequence parallelism: with comm, every call runs split over its ranks as *split lays the
  // positions out (seq_parallel.h); nullptr: one process. Refuses (nothing changed) a plan with a
  // layer whose attention cannot run split, naming the layer.
  void set_split(Communicator* comm, const SeqSplit* split);

  // Largest workspace of one call, or (training) the sum over layers of workspace and saved state.
  double workspace_bytes(const AttentionDims& d, bool train) const;

  // Layer state as "clattn.attention_state.<layer>.<name>" tensors of a checkpoint.
  void save_state(SafetensorsWriter& w) const;
  void load_state(const Weights& w);

  double ms = 0;  // attention time since the caller last reset it
  AttentionCapture* capture = nullptr;

 private:
  void use_mode(bool train);
  int64_t layers_;
  bool causal_, gqa_;
  std::string plan_;
  std::vector<std::string> specs_;
  std::vector<std::unique_ptr<Attention>> att_;
  std::vector<AttentionState> states_;
  std::vector<Context> ctx_;
  bool train_ctx_ = false;
  Scratch scratch_;
  Communicator* comm_ = nullptr;
  const SeqSplit* split_ = nullptr;
};

}  // namespace clattn
