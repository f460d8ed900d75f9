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
//   "full;local:window=64;full;"                a trailing ';': exactly these 3 layers (a model
//                                               of another depth refuses it)
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
#include <string_view>
#include <vector>

#include "clattn/attention.h"
#include "clattn/comm.h"
#include "clattn/data.h"
#include "clattn/gemm.h"
#include "clattn/kv_cache.h"
#include "clattn/seq_parallel.h"
#include "clattn/tensor.h"

namespace clattn {

// One spec per layer, parsed from a plan string (errors name the layer and the spec).
std::vector<std::string> parse_attention_plan(const std::string& plan, int64_t layers);
// The plan of a plan file: JSON whose "plan" is a plan string, beside what found it (`clattn
// approx --target` writes "layers", "metric", "target", the calibration and held-out figures,
// "length" and the attention cost). Every spec is checked; errors name the file and the field.
// With "layers" (one spec per layer of the model it was searched for) the plan returned is that
// list ending in ';', which a model of another layer count refuses.
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

// The config.json field that sets a model's positions, as its family spells it: GPT-2's
// n_positions, max_position_embeddings elsewhere (for messages about sequences that exceed it).
inline const char* positions_field(const ModelConfig& c) {
  return c.model_type == "gpt2" ? "n_positions" : "max_position_embeddings";
}

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
  // How the linear layers' weights are held (a decoder's attention q, k, v, o, its MLP and an
  // untied output layer; an encoder's layer matrices): f32, or f16 / bf16 for inference, half the
  // bytes a decode step reads. A checkpoint stored in that type is taken bit for bit; others are
  // rounded to nearest even (an f16 value past 65504 is refused, naming the tensor). Embeddings (a
  // tied output layer with them), norms, biases and encoders' pooler and classifier stay f32. A
  // model with 16-bit weights does not train or save, and its params() are refused.
  WeightType weights = WeightType::f32;
};

// The implementation behind the handles below (src/model/model_impl.h).
class ModelImpl;
class EncoderImpl;
class DecoderImpl;

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

  const ModelConfig& config() const;
  bool has_head() const;
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
  Communicator* sequence_parallel() const;
  // How a sequence of T positions splits over the ranks of set_sequence_parallel (one rank when
  // off: everything on rank 0).
  SeqSplit sequence_split(int64_t T) const;

  // Forward of a batch through the task head: the loss summed over the counted targets. With
  // `train` also the backward, ACCUMULATING into grads() the gradient of loss_sum / divisor
  // (divisor 0: the batch's own count of targets, i.e. its mean loss). `step` seeds the stochastic
  // attentions and dropout (fresh draws each step, reproducible); `train` also lets stateful
  // attentions (routing's EMA) update their state. Batch::first offsets the dropout streams, so a
  // sequence gets the same mask whichever batch it is in.
  StepResult forward_backward(const Batch& b, bool train, uint64_t step, double divisor = 0);

  // The final hidden state of the last forward, after the final norm: (B·T, hidden) (decoders
  // after prefill/step: only the rows whose logits were computed), valid until the next call.
  ConstView last_hidden() const;
  // Milliseconds spent in attention during the last forward (for the share of time outside it).
  double last_attention_ms() const;
  // Bytes a forward of (B, T) allocates: activations and the largest attention workspace.
  double forward_bytes(int64_t B, int64_t T) const;
  // Bytes a training step of (B, T) holds: the activation arena, every layer's attention
  // workspace and saved state, and the parameters with their gradients and both AdamW moments.
  double train_bytes(int64_t B, int64_t T) const;

  // Every parameter as f32 (an Error for a model loaded with 16-bit weights).
  std::span<float> params();
  std::span<const float> params() const;
  WeightType weights() const;  // how the linear layers' weights are held (LoadOptions::weights)
  std::span<float> grads();  // allocated (zero) on first use
  const std::vector<ParamInfo>& param_info() const;
  const ParamInfo& param(const std::string& name) const;  // an Error naming it when absent
  void zero_grads();

  // Called during a training call's backward as ranges [begin, end) of grads() become final for
  // the call: each layer's parameters as its backward finishes (top layer first), then the rest
  // (embeddings, final norm, head), then the first layer's, weight by weight: while this is set,
  // the first layer computes its weight gradients after the embeddings' (the same values), so the
  // largest range can travel during those products. Every parameter is reported once. A caller
  // can start reducing gradients while the backward runs.
  std::function<void(int64_t begin, int64_t end)> on_grads_ready;

  // config.json + model.safetensors (in the checkpoint's own tensor naming), written atomically
  // (atomic_file.h): loadable by Model::load, Encoder::load / Decoder::load and Hugging Face.
  // The layer state of stateful attentions travels as "clattn.attention_state.<layer>.<name>".
  void save(const std::string& dir) const;
  // Later forwards fill cap (nullptr: stop capturing); cap must outlive them.
  void set_capture(AttentionCapture* cap);

 protected:
  // Encoder and Decoder are handles over their implementation (src/model/model_impl.h).
  explicit Model(std::unique_ptr<ModelImpl> impl);
  // load() with config.json already read (the checkpoint's folder is read once).
  static std::unique_ptr<Model> load(const std::string& dir, const ModelConfig& cfg, const LoadOptions& opt);
  std::unique_ptr<ModelImpl> impl_;
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

 private:
  friend class Model;
  explicit Encoder(std::unique_ptr<EncoderImpl> impl);
  EncoderImpl& impl() const;
};

// An encoder's jobs on texts (`clattn classify` / `embed`, Python's Encoder.classify / embed):
// each text through the tokenizer (its template's special tokens added; a text past the model's
// context cut as encode(text, true, max_length) cuts it), `batch` texts per forward padded to the
// longest of them. *truncated (when given) counts the texts that were cut.
class Tokenizer;
struct BatchEncoding;
// The texts as one batch of ids (B, T) for this encoder: each through the tokenizer literally
// (as encode(text): no added token split out of the text), cut at the model's context keeping the
// template's closing token as Hugging Face truncates, padded on the right with id 0 (the encoder
// reads the lengths, not the pad id, and its rows start at position 0: never the file's left
// padding). An Error names a text that gives no token, numbered from `first` (texts[0]'s number in
// the caller's list). What classify_texts and embed_texts run on each batch.
BatchEncoding encode_texts(const Encoder& enc, const Tokenizer& tok, std::span<const std::string> texts,
                           size_t first = 0);
struct Classification {
  int32_t label = 0;  // the largest logit's class (the lower on ties)
  float score = 0;    // its softmax probability
};
// The classifier's choice for each row of logits (rows, classes).
std::vector<Classification> classify_logits(ConstView logits);
std::vector<Classification> classify_texts(Encoder& enc, const Tokenizer& tok, std::span<const std::string> texts,
                                           int64_t batch = 32, int64_t* truncated = nullptr);
// Pooled final hidden states: the mean over each text's positions, or its first ([CLS], <s>).
enum class Pooling { mean, cls };
Pooling parse_pooling(std::string_view name);  // "mean" or "cls"; an Error naming both otherwise
Tensor embed_texts(Encoder& enc, const Tokenizer& tok, std::span<const std::string> texts, Pooling pooling,
                   int64_t batch = 32, int64_t* truncated = nullptr);  // (texts, hidden)

// Sampling for generation, the sampler set of llama.cpp, applied in this order:
//   1. penalties on the logits, over the distinct tokens among the last repeat_last_n of the
//      history (-1: all of it; 0: none): a token seen c times gets l / repeat_penalty if l > 0,
//      else l · repeat_penalty, then l − c · frequency_penalty − presence_penalty;
//   2. temperature 0: the largest logit (the lowest id on ties); otherwise, by decreasing logit
//      (ties to the lower id), p_i = exp((l_i − l_max) / temperature) and
//   3. top-k: the k first (0: all); 4. top-p: the shortest prefix whose normalised mass reaches
//      top_p (1: all); 5. min-p: of those, the tokens with p_i >= min_p · p_max (0: all);
//   6. the draw: u = uniform(seed, step) · Σ kept p, the first token whose running sum passes u.
struct SamplingOptions {
  float temperature = 0.f;
  int64_t top_k = 0;
  float top_p = 1.f;
  uint64_t seed = 0;
  float min_p = 0.f;
  float repeat_penalty = 1.f;  // > 0; 1: off
  float frequency_penalty = 0.f, presence_penalty = 0.f;
  int64_t repeat_last_n = 64;
};
// Throws Error naming the first option out of range ("sample: min_p must be in [0, 1], got 2").
void check_sampling(const SamplingOptions& opt);
// Picks a token from logits (vocab) with the draw `step` of `seed` (reproducible); `history` is
// what the penalties look back over (generate passes the prompt and the tokens so far).
int32_t sample_token(std::span<const float> logits, const SamplingOptions& opt, uint64_t step,
                     std::span<const int32_t> history = {});

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
  // How start() stores the cache: f32 (default), or f16 / bf16, which halve the bytes a decode
  // step reads from it (kv_cache.h); the attention still computes in f32. 16-bit caches are read
  // by full and local attention: start() refuses a plan with another variant.
  void set_kv_cache(KVCacheType type);
  KVCacheType kv_cache() const;
  std::vector<float> prefill(std::span<const int32_t> ids);
  std::vector<float> step(int32_t id);
  int64_t position() const;
  // A context shift on the cache, as llama.cpp's: drops positions [keep, keep + discard) and moves
  // the later ones down by discard, their keys (and any queries a layer keeps) rotated by RoPE
  // through −discard positions, so they read as computed at their new positions; position()
  // falls by discard. Every layer keeps the states it computed with the dropped tokens in view
  // (no recomputation: one pass over the cache instead of a prefill of the window). Refused for
  // learned absolute positions (GPT-2): those are in every cached key and value; encode the
  // window again there.
  void shift(int64_t keep, int64_t discard);
  bool can_shift() const;  // the positions are rotary (shift() is not refused for the family)
  using Model::forward_bytes;
  // With cache_positions > 0 also the KV caches of that many positions.
  double forward_bytes(int64_t B, int64_t T, int64_t cache_positions) const;
  // Bytes one decode step must read with `context` positions cached: every weight once, as held
  // (2 bytes for 16-bit weights(), 4 otherwise; the input embedding only its one row, unless it is
  // also the output layer) and what each layer's attention reads of its cache at the size
  // kv_cache() stores it (Attention::decode_bytes: K and V of every cached position for full
  // attention, of the last `window` for local, a block, a gather and the centroids for causal
  // clustered). Over the step's time it is the rate to compare with measure_read_gbs().
  double step_bytes(double context) const;

 private:
  friend class Model;
  explicit Decoder(std::unique_ptr<DecoderImpl> impl);
  DecoderImpl& impl() const;
};

// Generation through the KV cache (batch 1): start(prompt + max_tokens), prefill of `prompt`
// (not empty), then up to max_tokens tokens, draw i by sample_token(logits, opt, i, history) with
// the prompt and the tokens so far as history, stopping before `eos` (when >= 0; it is not
// returned) or after a token for which control.stop says so. on_token(id) sees each token as it
// is drawn (for streaming). Returns the new tokens; `stats` (optional) gets the prefill and decode
// seconds.
//
// Past the model's context (prompt + max_tokens > max_positions) generation is refused, unless
// control.context_shift says how to go on: then, as llama.cpp does, when the cache is full the
// oldest half of the tokens after the first control.keep is dropped, and generation continues on
// the window left (the first `keep` tokens, then the newest ones).
enum class ContextShift : uint8_t {
  off,        // refused past the context
  automatic,  // rotate where the decoder can (rotary positions), else reencode
  rotate,     // Decoder::shift: the cache kept, its keys rotated (llama.cpp's); refused for GPT-2
  reencode,   // the window encoded again from position 0 (a prefill of it): exact attention over
              // the window for every family, learned positions included, at one prefill per shift
};
const char* context_shift_name(ContextShift s);  // "off", "auto", "rotate", "reencode"
// Those names (any case); an Error naming the choices otherwise.
ContextShift parse_context_shift(std::string_view s);

struct GenerateStats {
  double prefill_s = 0, decode_s = 0;  // decode_s: the steps with sampling and on_token (and shifts)
  int64_t steps = 0;                   // decode steps run (step() calls)
  double mean_context = 0;             // positions cached before a step, over the steps
  int64_t shifts = 0;                  // context shifts
  ContextShift shifted_by = ContextShift::off;  // rotate or reencode, once automatic is resolved
};
struct GenerateControl {
  ContextShift context_shift = ContextShift::off;
  int64_t keep = 0;  // tokens at the start a shift keeps (a BOS: 1); at most the context − 2
  // Called after each new token with every new token so far: true stops after it.
  std::function<bool(std::span<const int32_t> made)> stop;
};
std::vector<int32_t> generate(Decoder& dec, std::span<const int32_t> prompt, int64_t max_tokens,
                              const SamplingOptions& opt, int32_t eos,
                              const std::function<void(int32_t)>& on_token = {}, GenerateStats* stats = nullptr,
                              const GenerateControl& control = {});

// Stop strings over streamed text (`clattn generate --stop`, Python's generate(stop=)): feed()
// appends each new token's piece and says whether a stop string has now occurred; text() then ends
// before the first one. safe() is how much of text() can be shown while streaming: the tail that
// could still begin a stop string is held back.
class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops);  // empty strings are refused
  bool feed(std::string_view piece);
  const std::string& text() const { return text_; }
  size_t safe() const { return safe_; }
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string text_;
  size_t safe_ = 0;
  bool stopped_ = false;
};

}  // namespace clattn
