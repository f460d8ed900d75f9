// What the public Model, Encoder and Decoder (model.h) are handles over: ModelImpl, what the
// architectures share (the flat parameter and gradient buffers, loading and saving, the attention
// stack, the arena, timed dense layers, residual dropout, the loss heads, sequence parallelism),
// and each architecture, EncoderImpl (encoder.cpp) and DecoderImpl (decoder.cpp). Internal: only
// src/model includes it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "clattn/comm.h"
#include "clattn/data.h"
#include "clattn/gemm.h"
#include "clattn/kv_cache.h"
#include "clattn/model.h"
#include "clattn/seq_parallel.h"
#include "clattn/tensor.h"

namespace clattn {

class LayerAttention;  // src/model/layer_attention.h: the per-layer attention stack
struct DecoderRecipe;  // src/model/decoder.cpp: a decoder family as data
class Weights;         // src/model/weights.h: a checkpoint's tensors, read into memory at load

// What a layout is checked against as it is made, before anything is allocated: the tensors of a
// checkpoint (known from its headers), the prefix its names take and the names it may lack (a new
// head). A config that lies about sizes or layer counts is refused here, naming the field and the
// tensor, instead of allocating what it claims.
struct CheckpointNames {
  const Weights* w = nullptr;
  std::string prefix;
  std::vector<std::string> optional;
};

// The sequence split of a call (set_sequence_parallel, begin_split).
struct SplitState {
  Communicator* comm = nullptr;   // the ranks a sequence is split over; null: not split
  SeqSplit split;                 // of the current call's sequences
  std::vector<int32_t> local_pos; // (n) global position of each local row of a sequence
  int64_t T = 0;                  // the current call's sequence length (global)
};

// The loss head's buffers, carved from the arena with the activations (carve_into).
struct HeadWorkspace {
  std::vector<int32_t> sel, tsel;  // the rows that have targets, and their targets
  float *hs = nullptr, *dhs = nullptr, *logits = nullptr;  // gathered hidden states, their gradient, logits
  const float* xf = nullptr;       // (rows_xf, H) the final hidden state
  int64_t rows_xf = 0;
};

class ModelImpl {
 public:
  virtual ~ModelImpl();
  ModelImpl(const ModelImpl&) = delete;
  ModelImpl& operator=(const ModelImpl&) = delete;

  // What Model's public calls run (model.h says what each does).
  const ModelConfig& config() const { return cfg_; }
  bool has_head() const { return head_.has_value(); }
  TaskKind head() const;
  void set_attention(const std::string& plan);
  const std::string& attention_plan() const;
  const std::vector<std::string>& attention_specs() const;
  bool trainable() const;
  void set_dropout(float p);
  void set_sequence_parallel(Communicator* comm);
  Communicator* sequence_parallel() const { return seq_.comm; }
  SeqSplit sequence_split(int64_t T) const;
  virtual StepResult forward_backward(const Batch& b, bool train, uint64_t step, double divisor) = 0;
  ConstView last_hidden() const;
  double last_attention_ms() const;
  virtual double forward_bytes(int64_t B, int64_t T) const = 0;
  double train_bytes(int64_t B, int64_t T) const;
  std::span<float> params() {
    check_f32_weights("params()");
    return {params_.data(), params_.size()};
  }
  std::span<const float> params() const {
    check_f32_weights("params()");
    return {params_.data(), params_.size()};
  }
  std::span<float> grads();
  WeightType weights() const { return weights_; }
  // Bytes the parameters take as held: 4 per f32 value, 2 per 16-bit weight.
  double param_bytes() const;
  const std::vector<ParamInfo>& param_info() const { return info_; }
  const ParamInfo& param(const std::string& name) const;
  void zero_grads();
  void save(const std::string& dir) const;
  void set_capture(AttentionCapture* cap);

  // The handle's Model::on_grads_ready (it outlives this), set by the handle.
  const std::function<void(int64_t begin, int64_t end)>* on_grads_ready = nullptr;

 protected:
  friend class Model;  // the factories: init(), load_weights()
  enum class Init { normal, one, zero };
  // weights: how the parameters add_linear() lays out are held (the rest stay f32).
  explicit ModelImpl(const ModelConfig& cfg, const CheckpointNames* ckpt = nullptr,
                     WeightType weights = WeightType::f32);
  // Layout: every parameter once, in order (adjacent tensors that form one fused matrix must be
  // added in that order), then allocate(). Under a checkpoint each add() checks the tensor's
  // presence and shape first. Without one the config alone sizes the model: once the first layer
  // is laid out, check_layers_fit() refuses a model that cannot fit in memory before the other
  // layers are laid out; allocate() checks the exact figure.
  // `transposed`: the checkpoint stores this matrix as (in, out) (GPT-2's Conv1D) while the model
  // holds it (out, in) like every other linear layer; load and save transpose it.
  int64_t add(const std::string& name, std::vector<int64_t> shape, Init init, bool transposed = false);
  // add() of a linear layer's weight (out, in), Init::normal: held in 16 bits when weights_ is
  // f16 or bf16, and read only through lin() (weight()).
  int64_t add_linear(const std::string& name, std::vector<int64_t> shape, bool transposed = false);
  void check_layers_fit(int64_t first_layer_begin);
  void allocate();
  // The checkpoint's tensor `stored` (the parameter `name` with its prefix) has `shape` as stored.
  void expect_tensor(const std::string& stored, const std::string& name, const std::vector<int64_t>& shape) const;
  // Refuses parameters of `floats` values, naming the model's sizes and the figure.
  [[noreturn]] void refuse_size(double floats) const;
  void init(uint64_t seed);
  // Copies each parameter from the checkpoint folder's tensors (prefix_ applied to the names
  // that take it); names in `optional` may be absent (they keep their initial values).
  void load_weights(Weights& w, bool verbose, const std::vector<std::string>& optional);
  // The f32 parameter at (logical) offset off; with 16-bit weights the f32 buffer leaves them out,
  // and the offset is mapped past them.
  float* p(int64_t off) { return params_.data() + f32_at(off); }
  const float* p(int64_t off) const { return params_.data() + f32_at(off); }
  int64_t f32_at(int64_t off) const { return at_.empty() ? off : f32_at_mapped(off); }
  int64_t f32_at_mapped(int64_t off) const;
  size_t param_index(int64_t off) const;  // the parameter that holds offset off
  bool is_half(size_t i) const { return !at_.empty() && linear_[i]; }
  // The linear weight at offset off, (rows, in) row-major, as it is held.
  WeightMatrix weight(int64_t off, int64_t in) const;
  // Refuses what needs every parameter in f32 (training, saving, params()) with 16-bit weights.
  void check_f32_weights(const char* what) const;
  int64_t param_count() const { return info_.empty() ? 0 : info_.back().offset + info_.back().size; }
  float* g(int64_t off) { return grads_.data() + off; }
  virtual bool causal() const = 0;
  // What every architecture's plan of the arena holds for the code they share: the floats it
  // takes and the loss head's workspace (token_loss, pooled_loss).
  struct ArenaPlan {
    int64_t floats = 0;
    float *hs = nullptr, *dhs = nullptr, *logits = nullptr;
  };
  // The floats of the architecture's plan of (B, T): every layer's activations for training, one
  // shared set for inference; `head` adds the loss head's buffers.
  virtual int64_t plan_floats(int64_t B, int64_t T, bool train, bool head) const = 0;
  // The architecture's buffers carved from base by that plan (and its own extras), returned.
  virtual const ArenaPlan& carve_into(float* base, int64_t B, int64_t T, bool train, bool head) = 0;
  // Floats of the activation arena at (B, T): training keeps every layer's activations.
  double arena_floats(int64_t B, int64_t T, bool train) const;
  // The activations of (B, T) in the arena, carved again only when the layout changes.
  void carve(int64_t B, int64_t T, bool train, bool head);
  // Validates a batch against the model (sizes, lengths, targets, the head).
  void check_batch(const Batch& b) const;
  // The arena holds at least n floats (grows, never shrinks; contents are not kept).
  float* arena(int64_t n);

  // Timed helpers over the flat buffers: y = x·Wᵀ + b, or with `res`, y = res + x·Wᵀ + b (the
  // residual fused into the GEMM's C; y may equal res). w: the weight's parameter offset (f32 or
  // 16-bit, weight()).
  void lin(float* y, int64_t ldy, const float* x, int64_t ldx, int64_t w, const float* b,
           int64_t rows, int64_t in, int64_t out, const float* res = nullptr);
  void lin_bwd(float* dx, int64_t lddx, float* dw, float* db, const float* dy, int64_t lddy,
               const float* x, int64_t ldx, const float* w, int64_t rows, int64_t in, int64_t out,
               bool accumulate = false);
  // A linear map's weight gradient: dW (out, in) += dyᵀ·x, and db (out) += Σ_rows dy when b >= 0.
  struct WeightGrad {
    int64_t w, b;  // parameter offsets
    const float* dy;
    int64_t lddy;
    const float* x;
    int64_t ldx, rows, in, out;
  };
  // The first layer's weight gradients wait until the embeddings' gradient has been reported
  // (on_grads_ready): the embeddings are the last range of a backward to finish and the largest,
  // and these products are the compute left to overlap their exchange with. Only while a caller
  // listens; the products are the same, so the gradient has the same bits either way.
  bool hold_first_layer() const { return *on_grads_ready != nullptr; }
  // lin_bwd of one linear map: dx now; the weight gradient now, or, with `hold`, kept for
  // release_weights. keep (rows, out), when not null, receives a copy of dy, for a dy the
  // backward overwrites before then.
  void lin_bwd_held(bool hold, float* dx, int64_t lddx, const WeightGrad& wg, const float* w, float* keep,
                    bool accumulate = false);
  // Computes the held weight gradients, reporting each as it is done, then the rest of the
  // layer's range [begin, end) (its norms, final already).
  void release_weights(int64_t begin, int64_t end);
  // dst = src + dropout(branch) for the residual of (layer, which) over B sequences of T rows of
  // `width`: one stream per (layer, which, Batch::first + sequence), so the mask of a sequence
  // does not depend on its batch. dst may equal src; branch is overwritten.
  void residual_dropout(float* dst, const float* src, float* branch, int64_t B, int64_t T, int64_t width,
                        int64_t layer, int which, uint64_t step, int64_t first) const;
  void dropout_grad(float* d, const float* dy, int64_t B, int64_t T, int64_t width, int64_t layer,
                    int which, uint64_t step, int64_t first) const;
  // The loss over the rows of xf (rows, H) that have targets (mlm / lm), through the output matrix
  // w (O, H) and bias (or null); with `train` writes dxf (rows, H) and accumulates dw, db. `scale`
  // multiplies the gradient of the summed loss.
  void token_loss(const Batch& b, const float* xf, float* dxf, int64_t w, int64_t bias, bool train,
                  float scale, StepResult& r);
  // The same over pooled rows hs (B, H) with one target per sequence (classify).
  void pooled_loss(const Batch& b, int64_t w, int64_t bias, bool train, float scale, StepResult& r);
  StepResult timed(StepResult r, double t0_ms) const;
  // Sequence parallelism. begin_split(T) starts a call over sequences of T positions: it sets
  // seq_'s split, local_pos (the global position of each local row) and T, hands the split to the
  // attention, and returns the rows each sequence has here (T when not split).
  int64_t begin_split(int64_t T);
  bool split_on() const { return seq_.comm != nullptr && seq_.comm->size() > 1; }
  // Whether this rank reports what every rank computes alike (the pooled head): rank 0 of the
  // split, or the only one.
  bool split_lead() const { return !split_on() || seq_.comm->rank() == 0; }
  // The (B, T) values of the whole batch at this rank's positions: (B, n) in split order.
  void take_local(std::span<const int32_t> all, int64_t B, std::vector<int32_t>& out) const;
  // The batch of this rank's positions (ids, token targets; lengths stay global).
  Batch local_batch(const Batch& b) const;
  // Model::on_grads_ready for layer l's range, and at the end of a backward for everything else.
  void layer_grads_ready(int64_t begin, int64_t end) const;
  void other_grads_ready(int64_t layers_begin, int64_t layers_end) const;
  int64_t param_rows(int64_t off) const;  // first dim of the parameter at offset off
  // FLOPs of an inference call over `rows` tokens that each attend `keys` keys: 2 per parameter
  // and row (the linear layers), plus the attention's 4·heads·head_dim·keys per row and layer.
  // Inference entry points run on threads_for_flops() of it (threads.h): a decode step or a
  // short prefill stays on one thread rather than paying a team's barriers.
  double inference_flops(int64_t rows, double keys) const;

  // What the model is.
  ModelConfig cfg_;
  std::optional<TaskKind> head_;
  std::string prefix_;  // "bert.", "roberta.", "transformer." ... when the checkpoint names its tensors so
  const CheckpointNames* ckpt_ = nullptr;  // while the constructor lays out a checkpoint's model
  std::unique_ptr<LayerAttention> att_;
  float dropout_ = 0;
  // The parameters, their gradients and their layout.
  std::vector<float> params_, grads_;  // one allocation each
  std::vector<ParamInfo> info_;
  std::vector<Init> inits_;
  std::vector<bool> prefixed_;  // per parameter: its checkpoint name takes prefix_
  std::vector<bool> transposed_;  // per parameter: stored (in, out) in the checkpoint
  std::vector<bool> linear_;      // per parameter: laid out by add_linear()
  // With 16-bit weights: per parameter, its offset into params_ (f32) or half_ (16-bit); empty
  // when every parameter is f32 (then offsets index params_ directly).
  WeightType weights_ = WeightType::f32;
  std::vector<int64_t> at_;
  std::vector<uint16_t> half_;  // the linear weights, f16 or bf16 bits, in layout order
  std::vector<float> widen_;    // (linear_gemm_workspace) W rows widened for many-row products
  // A call's state: the activation arena and the layout carve() made last, the loss head's
  // buffers, the sequence split, the dense layers' time, and the held weight gradients.
  Tensor arena_;
  int64_t B_ = -1, T_ = -1;
  bool train_layout_ = false, head_layout_ = false;
  HeadWorkspace head_ws_;
  SplitState seq_;
  double dense_ms_ = 0;
  std::vector<WeightGrad> held_;  // the first layer's weight gradients not yet computed
};

// Encoder (model.h): BERT-style (post-LN, or pre-LN with norm_placement "pre") and KWT.
class EncoderImpl final : public ModelImpl {
 public:
  EncoderImpl(const ModelConfig& cfg, const std::optional<TaskKind>& head, bool pooler,
              const CheckpointNames* ckpt = nullptr, WeightType weights = WeightType::f32);
  ~EncoderImpl() override;
  // The layout a checkpoint implies (its config, which tensors it has, the head asked for), and
  // the names allowed to be absent (they start from their initial values).
  static std::unique_ptr<EncoderImpl> for_checkpoint(ModelConfig cfg, const Weights& w, const LoadOptions& opt,
                                                     std::vector<std::string>& optional);
  // Encoder's public calls (model.h).
  static std::unique_ptr<EncoderImpl> random_bert(const ModelConfig& cfg, uint64_t seed);
  Tensor forward_tokens(std::span<const int32_t> ids, int64_t B, int64_t T, std::span<const int32_t> lengths,
                        std::span<const int32_t> types);
  Tensor forward_mlm(std::span<const int32_t> ids, int64_t B, int64_t T, std::span<const int32_t> lengths);
  Tensor forward_features(ConstView features);
  StepResult forward_backward(const Batch& b, bool train, uint64_t step, double divisor) override;
  double forward_bytes(int64_t B, int64_t T) const override;

 private:
  struct Layout;  // offsets of every parameter
  struct Bufs;    // the activations carved from the arena
  bool causal() const override { return false; }
  // The activations of (B, T): every layer's for training, one shared set for inference; `head`
  // adds the loss head's buffers. With no base only measures (Bufs::floats).
  Bufs plan(int64_t B, int64_t T, bool train, bool head, float* base) const;
  int64_t plan_floats(int64_t B, int64_t T, bool train, bool head) const override;
  const ArenaPlan& carve_into(float* base, int64_t B, int64_t T, bool train, bool head) override;
  // Embeddings of a token batch (types may be null) or a feature batch into the first layer's x.
  void embed_tokens(const int32_t* ids, const int32_t* types, int64_t B, int64_t T);
  void embed_features(const float* feats, int64_t B);
  // The masked-LM transform (ModelConfig::mlm_transform) of `rows` rows of bufs_->xf into bufs_->mt,
  // and its backward from bufs_->mdt into dxf (rows, H).
  void mlm_transform(int64_t rows);
  void mlm_transform_backward(int64_t rows, float* dxf);
  // forward_tokens / forward_mlm up to the final norm (bufs_->xf); returns the rows per sequence
  // held here (T, or this rank's share when the sequence is split).
  int64_t encode_tokens(std::span<const int32_t> ids, int64_t B, int64_t T, std::span<const int32_t> lengths,
                        std::span<const int32_t> types);
  void forward_layers(int64_t B, int64_t T, std::span<const int32_t> lengths, bool train, uint64_t step,
                      int64_t first);
  void final_norm(int64_t rows);
  void backward_layers(int64_t B, int64_t T, std::span<const int32_t> lengths, uint64_t step, int64_t first);
  void embed_backward(const Batch& b);
  // Pooled rows (B, H) for the classifier into head_ws_.hs, and its backward into dxf (rows, H).
  void pool(int64_t B, int64_t T, std::span<const int32_t> lengths);
  void pool_backward(int64_t B, int64_t T, std::span<const int32_t> lengths, float* dxf);
  std::unique_ptr<Layout> layout_;
  std::unique_ptr<Bufs> bufs_;
  std::vector<int32_t> zero_types_;
  bool pooler_ = false;
};

// Decoder (model.h): LLaMA family and GPT-2, with KV-cache decoding.
class DecoderImpl final : public ModelImpl {
 public:
  explicit DecoderImpl(const ModelConfig& cfg, const CheckpointNames* ckpt = nullptr,
                       WeightType weights = WeightType::f32);
  ~DecoderImpl() override;
  static std::unique_ptr<DecoderImpl> for_checkpoint(ModelConfig cfg, const Weights& w, const LoadOptions& opt);
  // Decoder's public calls (model.h).
  Tensor forward(std::span<const int32_t> ids, int64_t B, int64_t T, std::span<const int32_t> lengths);
  void start(int64_t capacity);
  void set_kv_cache(KVCacheType t) { kv_type_ = t; }
  KVCacheType kv_cache() const { return kv_type_; }
  std::vector<float> prefill(std::span<const int32_t> ids);
  std::vector<float> step(int32_t id);
  int64_t position() const { return pos_; }
  void shift(int64_t keep, int64_t discard);
  bool can_shift() const;
  double step_bytes(double context) const;
  StepResult forward_backward(const Batch& b, bool train, uint64_t step, double divisor) override;
  double forward_bytes(int64_t B, int64_t T) const override { return forward_bytes(B, T, 0); }
  double forward_bytes(int64_t B, int64_t T, int64_t cache_positions) const;

 private:
  struct Layout;
  struct Bufs;
  bool causal() const override { return true; }
  Bufs plan(int64_t B, int64_t T, bool train, bool head, float* base) const;
  int64_t plan_floats(int64_t B, int64_t T, bool train, bool head) const override;
  const ArenaPlan& carve_into(float* base, int64_t B, int64_t T, bool train, bool head) override;
  // Rows (B·T tokens at positions pos) through the layers; with the caches, appends K and V and
  // attends over the cache (batch 1).
  void forward_layers(int64_t B, int64_t T, std::span<const int32_t> lengths, const int32_t* pos,
                      bool use_cache, bool train, uint64_t step, int64_t first);
  void backward_layers(int64_t B, int64_t T, std::span<const int32_t> lengths, const int32_t* pos, uint64_t step,
                       int64_t first);
  // The final norm of rows [from, rows) (head_ws_.xf), and the logits of n such rows into out (n, vocab).
  void final_norm(int64_t rows, int64_t from);
  void inference_logits(float* out, int64_t n);
  // posbuf_ (B·T): each local row's position, seq_.local_pos plus offset (the cache's length).
  void set_positions(int64_t B, int64_t T, int64_t offset);
  // The first layer's input for `rows` ids at posbuf_: token embeddings, plus GPT-2's learned
  // positions (an Error past n_positions).
  void embed(const int32_t* ids, int64_t rows);
  // Gradients of embed() from dx (rows, H).
  void embed_backward(const int32_t* ids, int64_t B, int64_t T, const float* dx);
  // The family's norm over `rows` rows of hidden: RMSNorm (gain), or GPT-2's LayerNorm (gain,
  // bias). stat: 1/rms (rows), or mean | 1/std (2, rows); nullptr in inference.
  void norm_fwd(float* y, const float* x, int64_t gain, int64_t bias, int64_t rows, float* stat);
  void norm_bwd(float* dx, int64_t gain, int64_t bias, const float* dy, const float* x, const float* stat,
                int64_t rows, bool accumulate);
  // prefill() with the sequence split: no cache; the last position's logits on every rank.
  std::vector<float> split_prefill(std::span<const int32_t> ids);
  std::unique_ptr<Layout> layout_;
  std::unique_ptr<Bufs> bufs_;
  std::vector<KVCache> cache_;
  KVCacheType kv_type_ = KVCacheType::f32;  // what start() allocates
  std::vector<int32_t> posbuf_;
  const DecoderRecipe* recipe_ = nullptr;  // the family (decoder.cpp's table)
  int64_t pos_ = 0;
  bool split_prefill_ = false;
};

}  // namespace clattn
