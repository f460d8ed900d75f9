#include "model/layer_attention.h"

#include <chrono>
#include <cstring>

#include "clattn/error.h"
#include "clattn/threads.h"

namespace clattn {

namespace {

void check_split(const std::vector<std::unique_ptr<Attention>>& att, const std::vector<std::string>& specs, bool causal) {
  for (size_t l = 0; l < att.size(); ++l) {
    std::string why;
    check(sequence_parallel_supported(*att[l], causal, &why), "attention of layer ", l, ": '", specs[l],
          "' cannot run with the sequence split across ranks: ", why);
  }
}

}  // namespace

void LayerAttention::set_split(Communicator* comm, const SeqSplit* split) {
  if (comm) check_split(att_, specs_, causal_);
  comm_ = comm;
  split_ = split;
}

void LayerAttention::set_plan(const std::string& plan) {
  std::vector<std::string> specs = parse_attention_plan(plan, layers_);
  std::vector<std::unique_ptr<Attention>> att = make_plan_attentions(specs, causal_, gqa_);
  if (comm_) check_split(att, specs, causal_);
  std::vector<AttentionState> states(att.size());
  for (size_t l = 0; l < att.size() && l < specs_.size() && l < states_.size(); ++l)
    if (specs_[l] == specs[l]) states[l] = std::move(states_[l]);
  plan_ = plan;
  specs_ = std::move(specs);
  att_ = std::move(att);
  states_ = std::move(states);
  ctx_.clear();
  for (size_t l = 0; l < att_.size(); ++l) ctx_.emplace_back(train_ctx_ ? Mode::training : Mode::inference, &scratch_);
}

bool LayerAttention::trainable() const {
  for (const auto& a : att_)
    if (!a->capabilities().trainable) return false;
  return true;
}

void LayerAttention::check_trainable() const {
  for (size_t l = 0; l < att_.size(); ++l)
    check(att_[l]->capabilities().trainable, "attention of layer ", l, ": '", specs_[l],
          "' has no backward (not trainable); it can only evaluate");
}

void LayerAttention::use_mode(bool train) {
  if (train == train_ctx_ && ctx_.size() == att_.size()) return;
  train_ctx_ = train;
  ctx_.clear();
  for (size_t l = 0; l < att_.size(); ++l) ctx_.emplace_back(train ? Mode::training : Mode::inference, &scratch_);
}

AttentionInputs LayerAttention::inputs(int64_t l, ConstView q, ConstView k, ConstView v,
                                       std::span<const int32_t> lengths, uint64_t step, bool train) {
  const Attention& a = *att_[static_cast<size_t>(l)];
  AttentionInputs ai;
  ai.q = q;
  // Shared-QK attention takes the queries as keys; its backward puts the gradient of both roles
  // into dq and leaves dk (the K projection's slot, zeroed by the caller) alone.
  ai.k = a.capabilities().shared_qk ? q : k;
  ai.v = v;
  ai.query_lengths = lengths;
  ai.key_lengths = lengths;
  ai.causal = causal_;
  ai.step = step;
  ai.train = train;
  if (a.capabilities().stateful) ai.state = &states_[static_cast<size_t>(l)];
  return ai;
}

void LayerAttention::forward(int64_t l, const AttentionInputs& in, View out, bool train) {
  use_mode(train);
  if (capture && capture->layer == l) {  // inspection only: copies
    capture->q = Tensor::from(in.q);
    capture->k = Tensor::from(in.k);
    capture->v = Tensor::from(in.v);
    capture->step = in.step;
    capture->causal = in.causal;
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (comm_) sequence_parallel_forward(*comm_, *split_, *att_[static_cast<size_t>(l)], in, out, ctx_[static_cast<size_t>(l)]);
  else att_[static_cast<size_t>(l)]->forward(in, out, ctx_[static_cast<size_t>(l)]);
  ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void LayerAttention::backward(int64_t l, const AttentionInputs& in, ConstView out, ConstView dout, View dq,
                              View dk, View dv) {
  const auto t0 = std::chrono::steady_clock::now();
  if (comm_)
    sequence_parallel_backward(*comm_, *split_, *att_[static_cast<size_t>(l)], in, out, ctx_[static_cast<size_t>(l)], dout,
                               dq, dk, dv);
  else
    att_[static_cast<size_t>(l)]->backward(in, out, ctx_[static_cast<size_t>(l)], dout, dq, dk, dv);
  ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double LayerAttention::workspace_bytes(const AttentionDims& d, bool train) const {
  double ws = 0;
  for (const auto& a : att_) {
    const double b = static_cast<double>(a->workspace_bytes(d, train ? Mode::training : Mode::inference, max_threads()));
    ws = train ? ws + b : std::max(ws, b);
  }
  return ws;
}

void LayerAttention::save_state(SafetensorsWriter& w) const {
  for (size_t l = 0; l < states_.size(); ++l)
    for (const auto& [name, t] : states_[l].buffers)
      w.add("clattn.attention_state." + std::to_string(l) + "." + name, t.view());
}

void LayerAttention::load_state(const Weights& w) {
  const std::string prefix = "clattn.attention_state.";
  for (const std::string& name : w.names()) {
    if (name.rfind(prefix, 0) != 0) continue;
    const size_t dot = name.find('.', prefix.size());
    check(dot != std::string::npos, "checkpoint '", w.dir(), "': bad attention state name '", name, "'");
    size_t l = 0;
    try {
      l = std::stoul(name.substr(prefix.size(), dot - prefix.size()));
    } catch (...) {
      fail("checkpoint '", w.dir(), "': bad attention state name '", name, "'");
    }
    check(l < states_.size(), "checkpoint '", w.dir(), "': attention state '", name, "' names a layer the model lacks");
    const Tensor t = w.get_any(name);
    Tensor& dst = states_[l].add(name.substr(dot + 1), t.shape());
    std::memcpy(dst.data(), t.data(), sizeof(float) * static_cast<size_t>(t.numel()));
  }
}

}  // namespace clattn
