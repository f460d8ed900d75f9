// Transformers around the attention (docs/design.md): one implementation per architecture, the
// same object for inference and for training.
//
//   Encoder  BERT family (post-LN or pre-LN, token types, pooler, GELU erf or tanh), read from and
//            written as BERT, RoBERTa or DistilBERT checkpoints (model_type bert, roberta,
//            distilbert: each family's tensor names and config.json fields), and KWT (a linear
//            input projection of feature frames, a class token, learned positions)
//   Decoder  LLaMA family (RMSNorm, rotate-half RoPE, grouped-query attention, SwiGLU, tied or
//            untied output layer) and GPT-2 (LayerNorm, learned positions, biases, GELU-tanh
//            MLP, tied output layer), with KV-cache decoding
//
// Both derive from Model: the parameters in one flat buffer in Hugging Face naming (loaded from
// safetensors + config.json, saved the same way, atomically), any registered attention per layer,
// one forward that serves inference (nothing kept for a backward) and training (every activation
// the backward reads kept in one arena), and one hand-written backward. A checkpoint that loads
// for inference trains (fine-tuning), and a trained model is the object that runs inference.
//
// Attention plans. A plan is one spec for every layer, or a ';'-separated list with one spec per
// layer in order, the last one repeating for the layers after it:
//   "full"                                      every layer full
//   "full;improved-clustered:clusters=25"       layer 0 full, layers 1.. improved-clustered
// (';' never occurs inside a spec, and ':' and ',' keep their spec meaning.)
//
// Memory: a model sizes its activations per (B, T) in one arena it owns and reuses (no allocation
// inside the layer loop; the arena grows, never shrinks); inference carves one set of buffers that
// every layer reuses, training one set per layer. Gradients are allocated on first use, so a model
// that only runs inference holds its parameters once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "clattn/attention.h"
#include "clattn/comm.h"
#include "clattn/data.h"
#include "clattn/kv_cache.h"
#include "clattn/seq_parallel.h"
#include "clattn/tensor.h"

namespace clattn {

// One spec per layer, parsed from a plan string (errors name the layer and the spec).
std::vector<std::string> parse_attention_plan(const std::string& plan, int64_t layers);
// The plan of a plan file: JSON whose "plan" is a plan string, beside what found it (`clattn
// approx --target` writes "layers", "metric", "target", the calibration and held-out figures,
// "length" and the attention cost). Every spec is checked; errors name the file and the field.
std::string read_plan_file(const std::string& path);
// The attention of each layer of a plan, refusing (by layer) a spec that cannot run there: for
// decoders a missing causal mask or grouped heads.
std::vector<std::unique_ptr<Attention>> make_plan_attentions(const std::vector<std::string>& specs,
                                                             bool causal, bool gqa);

// bert: token encoders (model_type bert, roberta, distilbert); kwt: feature encoders; llama: the
// decoder (model_type llama or gpt2).
enum class ModelKind { bert, kwt, llama };

struct ModelConfig {
  ModelKind kind = ModelKind::bert;
  // model_type names the checkpoint family of an encoder (bert, roberta, distilbert, kwt): its
  // tensor names and config.json fields. The computation differs only as the fields below say.
  std::string model_type, architecture;
  int64_t hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0;
  // max_positions is the longest sequence the model takes. RoBERTa numbers its positions from
  // pad_token_id + 1 (position_offset), so its table holds max_positions + position_offset rows
  // and config.json's max_position_embeddings counts them all.
  int64_t vocab = 0, max_positions = 0, type_vocab = 0, num_labels = 0, position_offset = 0;
  float eps = 1e-12f;
  bool gelu_tanh = false;      // hidden_act gelu_tanh / gelu_new / gelu_pytorch_tanh
  bool pre_ln = false;         // norm_placement "pre" (default post, as BERT)
  bool final_layer_norm = false;
  // "classifier_pooling": "mean" (clattn's trained classifiers): the classifier reads the mean of
  // each sequence's valid tokens; otherwise the first token (BERT's [CLS], KWT's class token).
  bool mean_pooling = false;
  bool qkv_bias = true;
  // The pooler before the classifier: tanh (BERT's pooler, RoBERTa's classifier.dense) or ReLU
  // (DistilBERT's pre_classifier).
  bool pooler_relu = false;
  // The masked-LM head of a pretrained checkpoint: dense, GELU and LayerNorm before the output
  // layer tied to the word embeddings (BERT's cls.predictions.transform, RoBERTa's lm_head,
  // DistilBERT's vocab_transform / vocab_layer_norm). Off: the output layer reads the final hidden
  // state directly (the masked-token models clattn trains).
  bool mlm_transform = false;
  float attention_scale = 0;   // 0 = 1/sqrt(head_dim)
  // KWT input path
  int64_t input_dim = 0, num_patches = 0;
  // LLaMA (GPT-2 has learned positions, no rotary base)
  float rope_theta = 10000.f;
  bool tie_embeddings = false;
  int32_t bos = -1, eos = -1;
  std::vector<std::string> labels;  // id2label, when the config has it
  // clattn's own keys of a checkpoint it wrote: the task head ("clattn_head") and the attention
  // plan ("clattn_attention"); absent in other checkpoints (no head stated, full attention).
  std::optional<TaskKind> saved_head;
  std::string saved_plan = "full";
};

// Reads config.json (errors name the file and the field).
ModelConfig read_model_config(const std::string& path);
// The config.json text of a model (every field read_model_config reads), with clattn's own keys
// "clattn_head" (the task head, when the model has one) and "clattn_attention" (its plan).
std::string model_config_json(const ModelConfig& c, const std::optional<TaskKind>& head,
                              const std::string& plan);
// The model folder's kind, read from its config.json (bert / kwt -> Encoder, llama -> Decoder).
ModelKind model_kind(const std::string& dir);

// Inspection (`clattn inspect`): copies of what one layer's attention received in a forward — q
// (B, H, T, D), k and v (B, Hkv, T, D) after the projections (and RoPE in decoders), the random
// step and the causal flag — so a tool can replay that layer's attention on them. The caller owns
// it and hands it to set_capture(); only a capturing forward allocates the copies.
struct AttentionCapture {
  int64_t layer = -1;  // the layer to copy; -1 (or past the last layer) copies nothing
  Tensor q, k, v;
  uint64_t step = 0;
  bool causal = false;
};

// One parameter tensor of a model's flat buffer.
struct ParamInfo {
  std::string name;            // Hugging Face tensor name, e.g. "encoder.layer.0.attention.self.query.weight"
  std::vector<int64_t> shape;
  int64_t offset = 0, size = 0;  // into params() / grads()
  bool decay = true;           // AdamW weight decay (matrices and embeddings; not biases or norms)
};

// What forward_backward reports.
struct StepResult {
  double loss_sum = 0;   // summed loss over counted targets (nats)
  int64_t counted = 0;   // targets counted
  int64_t correct = 0;   // argmax == target among counted
  double attention_ms = 0;  // attention forward (+ backward)
  double dense_ms = 0;      // linear layers (GEMMs) forward (+ backward), the output layer included
  double total_ms = 0;      // the whole call
};

struct LoadOptions {
  bool verbose = false;  // list unused tensors of the checkpoint on stderr
  // The task head to give the model. Absent: the checkpoint's own ("clattn_head" in config.json;
  // else a classifier when it has one, lm for a decoder, none for an encoder without classifier).
  // Given: mlm adds "cls.predictions.bias" (zero) when the checkpoint lacks it; classify adds a
  // classifier of `num_labels` classes (N(0, 0.02), from `seed`) when it lacks one, and refuses
  // one with fewer classes.
  std::optional<TaskKind> head;
  int64_t num_labels = 0;
  uint64_t seed = 0;
};

class LayerAttention;  // src/model/layer_attention.h: the per-layer attention stack
class Weights;         // src/model/weights.h: a checkpoint's tensors, read into memory at load

class Model {
 public:
  // A model of cfg's sizes with a task head and random weights (N(0, 0.02) matrices and
  // embeddings, unit norm gains, zero biases). kind bert takes classify or mlm, llama takes lm.
  static std::unique_ptr<Model> create(const ModelConfig& cfg, TaskKind head, uint64_t seed);
  // A checkpoint folder (config.json + model.safetensors, or the sharded form): an Encoder or a
  // Decoder by its kind. A clattn checkpoint also restores its attention plan and layer state.
  static std::unique_ptr<Model> load(const std::string& dir, const LoadOptions& opt = {});
  virtual ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return cfg_; }
  bool has_head() const { return head_.has_value(); }
  TaskKind head() const;  // the task head (an Error when the model has none)

  // Sets the attention of every layer from a plan (default "full"). Any variant that can run on
  // the model is accepted; training (forward_backward with train) needs every layer's to have a
  // backward. Shared-QK attention (reformer) is given the layer's queries as keys (the K
  // projection then goes unused, as in the Reformer paper's shared-QK model). A layer keeps its
  // attention state (routing's EMA centroids) while its spec is unchanged.
  void set_attention(const std::string& plan);
  const std::string& attention_plan() const;
  const std::vector<std::string>& attention_specs() const;
  bool trainable() const;  // every layer's attention has a backward
  // Dropout on both residual branches of every layer, in training calls only.
  void set_dropout(float p);

  // Sequence parallelism (docs/sequence-parallel.md): the ranks of comm split every sequence of
  // a call, each computing the positions it holds — encoders contiguous slices, decoders the
  // zig-zag layout of causal attention (sequence_split() says which) — with token-local layers at
  // their global positions and attention computed together (seq_parallel.h); nullptr (or one
  // rank) turns it off. Every rank of comm passes the same whole inputs, and a call returns this
  // rank's share: forward_backward its share of the loss figures and of the gradient (summed over
  // the ranks they are the whole batch's, exactly as data-parallel shares are), forward_tokens
  // and forward the rows of its positions, in split order, while classifier logits and prefill's
  // last logits are whole on every rank. Refused, with the reason: a layer whose attention does
  // not run split, dropout (its masks are drawn per whole sequence), KWT models (their 99-frame
  // clips split by batch), and decoding after a split prefill (the KV cache is spread over the
  // ranks). comm must outlive the calls.
  void set_sequence_parallel(Communicator* comm);
  Communicator* sequence_parallel() const { return sp_; }
  // How a sequence of T positions splits over the ranks of set_sequence_parallel (one rank when
  // off: everything on rank 0).
  SeqSplit sequence_split(int64_t T) const;

  // Forward of a batch through the task head: the loss summed over the counted targets. With
  // `train` also the backward, ACCUMULATING into grads() the gradient of loss_sum / divisor
  // (divisor 0: the batch's own count of targets, i.e. its mean loss). `step` seeds the stochastic
  // attentions and dropout (fresh draws each step, reproducible); `train` also lets stateful
  // attentions (routing's EMA) update their state. Batch::first offsets the dropout streams, so a
  // sequence gets the same mask whichever batch it is in.
  virtual StepResult forward_backward(const Batch& b, bool train, uint64_t step, double divisor = 0) = 0;

  // The final hidden state of the last forward, after the final norm: (B·T, hidden) (decoders
  // after prefill/step: only the rows whose logits were computed), valid until the next call.
  ConstView last_hidden() const;
  // Milliseconds spent in attention during the last forward (for the share of time outside it).
  double last_attention_ms() const;
  // Bytes a forward of (B, T) allocates: activations and the largest attention workspace.
  virtual double forward_bytes(int64_t B, int64_t T) const = 0;
  // Bytes a training step of (B, T) holds: the activation arena, every layer's attention
  // workspace and saved state, and the parameters with their gradients and both AdamW moments.
  double train_bytes(int64_t B, int64_t T) const;

  std::span<float> params() { return {params_.data(), params_.size()}; }
  std::span<const float> params() const { return {params_.data(), params_.size()}; }
  std::span<float> grads();  // allocated (zero) on first use
  const std::vector<ParamInfo>& param_info() const { return info_; }
  const ParamInfo& param(const std::string& name) const;  // an Error naming it when absent
  void zero_grads();

  // Called during a training call's backward as ranges [begin, end) of grads() become final for
  // the call: each layer's parameters as its backward finishes (top layer first), then the rest
  // (embeddings, final norm, head). A caller can start reducing gradients while the backward runs.
  std::function<void(int64_t begin, int64_t end)> on_grads_ready;

  // config.json + model.safetensors (in the checkpoint's own tensor naming), written atomically
  // (atomic_file.h): loadable by Model::load, Encoder::load / Decoder::load and Hugging Face.
  // The layer state of stateful attentions travels as "clattn.attention_state.<layer>.<name>".
  void save(const std::string& dir) const;
  // Later forwards fill cap (nullptr: stop capturing); cap must outlive them.
  void set_capture(AttentionCapture* cap);

 protected:
  enum class Init { normal, one, zero };
  explicit Model(const ModelConfig& cfg);
  // load() with config.json already read (the checkpoint's folder is read once).
  static std::unique_ptr<Model> load(const std::string& dir, const ModelConfig& cfg, const LoadOptions& opt);
  // Layout: every parameter once, in order (adjacent tensors that form one fused matrix must be
  // added in that order), then allocate().
  // `transposed`: the checkpoint stores this matrix as (in, out) (GPT-2's Conv1D) while the model
  // holds it (out, in) like every other linear layer; load and save transpose it.
  int64_t add(const std::string& name, std::vector<int64_t> shape, Init init, bool transposed = false);
  void allocate();
  void init(uint64_t seed);
  // Copies each parameter from the checkpoint folder's tensors (prefix_ applied to the names
  // that take it); names in `optional` may be absent (they keep their initial values).
  void load_weights(Weights& w, bool verbose, const std::vector<std::string>& optional);
  float* p(int64_t off) { return params_.data() + off; }
  const float* p(int64_t off) const { return params_.data() + off; }
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
  // residual fused into the GEMM's C; y may equal res).
  void lin(float* y, int64_t ldy, const float* x, int64_t ldx, const float* w, const float* b,
           int64_t rows, int64_t in, int64_t out, const float* res = nullptr);
  void lin_bwd(float* dx, int64_t lddx, float* dw, float* db, const float* dy, int64_t lddy,
               const float* x, int64_t ldx, const float* w, int64_t rows, int64_t in, int64_t out,
               bool accumulate = false);
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
  // split_, local_pos_ (the global position of each local row) and seq_T_, hands the split to the
  // attention, and returns the rows each sequence has here (T when not split).
  int64_t begin_split(int64_t T);
  bool split_on() const { return sp_ != nullptr && sp_->size() > 1; }
  // Whether this rank reports what every rank computes alike (the pooled head): rank 0 of the
  // split, or the only one.
  bool split_lead() const { return !split_on() || sp_->rank() == 0; }
  // The (B, T) values of the whole batch at this rank's positions: (B, n) in split order.
  void take_local(std::span<const int32_t> all, int64_t B, std::vector<int32_t>& out) const;
  // The batch of this rank's positions (ids, token targets; lengths stay global).
  Batch local_batch(const Batch& b) const;
  // on_grads_ready for layer l's range, and at the end of a backward for everything else.
  void layer_grads_ready(int64_t begin, int64_t end) const;
  void other_grads_ready(int64_t layers_begin, int64_t layers_end) const;
  int64_t param_rows(int64_t off) const;  // first dim of the parameter at offset off
  // FLOPs of an inference call over `rows` tokens that each attend `keys` keys: 2 per parameter
  // and row (the linear layers), plus the attention's 4·heads·head_dim·keys per row and layer.
  // Inference entry points run on threads_for_flops() of it (parallel.h): a decode step or a
  // short prefill stays on one thread rather than paying a team's barriers.
  double inference_flops(int64_t rows, double keys) const;

  ModelConfig cfg_;
  std::optional<TaskKind> head_;
  std::string prefix_;  // "bert.", "roberta.", "transformer." ... when the checkpoint names its tensors so
  std::unique_ptr<LayerAttention> att_;
  float dropout_ = 0;
  Communicator* sp_ = nullptr;
  SeqSplit split_;
  std::vector<int32_t> local_pos_;  // (n) global position of each local row of a sequence
  int64_t seq_T_ = 0;               // the current call's sequence length (global)
  std::vector<float> params_, grads_;  // one allocation each
  std::vector<ParamInfo> info_;
  std::vector<Init> inits_;
  std::vector<bool> prefixed_;  // per parameter: its checkpoint name takes prefix_
  std::vector<bool> transposed_;  // per parameter: stored (in, out) in the checkpoint
  Tensor arena_;
  // Head workspace (carved from the arena): selected rows, their targets, gathered hidden states.
  std::vector<int32_t> sel_, tsel_;
  float *hs_ = nullptr, *dhs_ = nullptr, *logits_ = nullptr;
  const float* xf_ = nullptr;  // (rows_xf_, H) the final hidden state
  int64_t rows_xf_ = 0;
  double dense_ms_ = 0;
  int64_t B_ = -1, T_ = -1;  // the layout carve() made last
  bool train_layout_ = false, head_layout_ = false;
};

// Encoder: BERT-style (post-LN, or pre-LN with norm_placement "pre") and KWT.
class Encoder final : public Model {
 public:
  static std::unique_ptr<Encoder> load(const std::string& dir, const LoadOptions& opt = {});
  // A BERT-shaped encoder with random weights (N(0, 0.02) matrices, unit LayerNorms) from cfg's
  // sizes, post-LN with two token types and no head, for benchmarks: the long-input encoder this
  // library exists for.
  static std::unique_ptr<Encoder> random_bert(const ModelConfig& cfg, uint64_t seed);
  ~Encoder() override;

  // BERT: ids (B, T) row-major, lengths (B) (empty: all T), token types (B, T) or empty.
  // Returns the classifier logits (B, num_labels), or with no classifier the last hidden state
  // (B, T, hidden).
  Tensor forward_tokens(std::span<const int32_t> ids, int64_t B, int64_t T,
                        std::span<const int32_t> lengths = {}, std::span<const int32_t> types = {});
  // A masked-token model (the mlm head): logits (B, T, vocab) at every position, through the
  // output layer tied to the word embeddings — read them at the masked positions.
  Tensor forward_mlm(std::span<const int32_t> ids, int64_t B, int64_t T, std::span<const int32_t> lengths = {});
  // KWT: features (B, num_patches, input_dim). Returns logits (B, num_labels).
  Tensor forward_features(ConstView features);
  StepResult forward_backward(const Batch& b, bool train, uint64_t step, double divisor = 0) override;
  double forward_bytes(int64_t B, int64_t T) const override;

 private:
  friend class Model;
  struct Layout;  // offsets of every parameter
  struct Bufs;    // the activations carved from the arena
  Encoder(const ModelConfig& cfg, const std::optional<TaskKind>& head, bool pooler);
  // The layout a checkpoint implies (its config, which tensors it has, the head asked for), and
  // the names allowed to be absent (they start from their initial values).
  static std::unique_ptr<Encoder> for_checkpoint(ModelConfig cfg, const Weights& w, const LoadOptions& opt,
                                                 std::vector<std::string>& optional);
  bool causal() const override { return false; }
  // The activations of (B, T): every layer's for training, one shared set for inference; `head`
  // adds the loss head's buffers. With no base only measures (Bufs::floats).
  Bufs plan(int64_t B, int64_t T, bool train, bool head, float* base) const;
  int64_t plan_floats(int64_t B, int64_t T, bool train, bool head) const override;
  const ArenaPlan& carve_into(float* base, int64_t B, int64_t T, bool train, bool head) override;
  // Embeddings of a token batch (types may be null) or a feature batch into the first layer's x.
  void embed_tokens(const int32_t* ids, const int32_t* types, int64_t B, int64_t T);
  void embed_features(const float* feats, int64_t B);
  // The masked-LM transform (ModelConfig::mlm_transform) of `rows` rows of b_->xf into b_->mt,
  // and its backward from b_->mdt into dxf (rows, H).
  void mlm_transform(int64_t rows);
  void mlm_transform_backward(int64_t rows, float* dxf);
  // forward_tokens / forward_mlm up to the final norm (b_->xf); returns the rows per sequence
  // held here (T, or this rank's share when the sequence is split).
  int64_t encode_tokens(std::span<const int32_t> ids, int64_t B, int64_t T, std::span<const int32_t> lengths,
                        std::span<const int32_t> types);
  void forward_layers(int64_t B, int64_t T, std::span<const int32_t> lengths, bool train, uint64_t step,
                      int64_t first);
  void final_norm(int64_t rows);
  void backward_layers(int64_t B, int64_t T, std::span<const int32_t> lengths, uint64_t step, int64_t first);
  void embed_backward(const Batch& b);
  // Pooled rows (B, H) for the classifier into hs_, and its backward into dxf (rows, H).
  void pool(int64_t B, int64_t T, std::span<const int32_t> lengths);
  void pool_backward(int64_t B, int64_t T, std::span<const int32_t> lengths, float* dxf);
  std::unique_ptr<Layout> L_;
  std::unique_ptr<Bufs> b_;
  std::vector<int32_t> zero_types_;
  bool pooler_ = false;
};

// Sampling for generation: temperature 0 is greedy; top-k (0 = off) then top-p (1 = off).
struct SamplingOptions {
  float temperature = 0.f;
  int64_t top_k = 0;
  float top_p = 1.f;
  uint64_t seed = 0;
};
// Picks a token from logits (vocab) with the draw `step` of `seed` (reproducible).
int32_t sample_token(std::span<const float> logits, const SamplingOptions& opt, uint64_t step);

// Decoder: LLaMA family (RMSNorm, rotate-half RoPE, GQA, SwiGLU, tied or untied embeddings) and
// GPT-2 (model_type gpt2: LayerNorm, learned positions up to n_positions, biases, GELU-tanh MLP).
class Decoder final : public Model {
 public:
  static std::unique_ptr<Decoder> load(const std::string& dir, const LoadOptions& opt = {});
  ~Decoder() override;

  // Causal forward of ids (B, T) with per-example lengths (empty: all T): logits (B, T, vocab).
  Tensor forward(std::span<const int32_t> ids, int64_t B, int64_t T,
                 std::span<const int32_t> lengths = {});

  // Incremental decoding (batch 1): start() clears the cache (capacity positions), prefill()
  // runs the prompt through the cache, step() appends one token; both return the logits of the
  // last position (vocab).
  void start(int64_t capacity);
  std::vector<float> prefill(std::span<const int32_t> ids);
  std::vector<float> step(int32_t id);
  int64_t position() const { return pos_; }
  StepResult forward_backward(const Batch& b, bool train, uint64_t step, double divisor = 0) override;
  double forward_bytes(int64_t B, int64_t T) const override { return forward_bytes(B, T, 0); }
  // With cache_positions > 0 also the KV caches of that many positions.
  double forward_bytes(int64_t B, int64_t T, int64_t cache_positions) const;

 private:
  friend class Model;
  struct Layout;
  struct Bufs;
  Decoder(const ModelConfig& cfg);
  static std::unique_ptr<Decoder> for_checkpoint(ModelConfig cfg, const Weights& w, const LoadOptions& opt);
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
  // The final norm of rows [from, rows) (xf_), and the logits of n such rows into out (n, vocab).
  void final_norm(int64_t rows, int64_t from);
  void inference_logits(float* out, int64_t n);
  // posbuf_ (B·T): each local row's position, local_pos_ plus offset (the cache's length).
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
  std::unique_ptr<Layout> L_;
  std::unique_ptr<Bufs> b_;
  std::vector<KVCache> cache_;
  std::vector<int32_t> posbuf_;
  bool gpt2_ = false;  // model_type gpt2 (see the class comment)
  int64_t pos_ = 0;
  bool split_prefill_ = false;
};

// Generation through the KV cache (batch 1): start(prompt + max_tokens), prefill of `prompt`
// (not empty), then up to max_tokens tokens, draw i by sample_token(logits, opt, i), stopping
// before `eos` (when >= 0; it is not returned). on_token(id) sees each token as it is drawn (for
// streaming). Returns the new tokens; `stats` (optional) gets the prefill and decode seconds.
struct GenerateStats {
  double prefill_s = 0, decode_s = 0;
};
std::vector<int32_t> generate(Decoder& dec, std::span<const int32_t> prompt, int64_t max_tokens,
                              const SamplingOptions& opt, int32_t eos,
                              const std::function<void(int32_t)>& on_token = {}, GenerateStats* stats = nullptr);

}  // namespace clattn
