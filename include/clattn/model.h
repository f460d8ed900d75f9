// Transformers around the attention (docs/design.md): Hugging Face checkpoints (config.json +
// safetensors, single or sharded) loaded into an Encoder (BERT family, KWT) or a Decoder (LLaMA
// family), each running any registered attention, per layer if asked.
//
// Attention plans. A plan is one spec for every layer, or a ';'-separated list with one spec per
// layer in order, the last one repeating for the layers after it:
//   "full"                                      every layer full
//   "full;full;improved-clustered:clusters=25"  layers 0-1 full, layers 2.. improved-clustered
// (';' never occurs inside a spec, and ':' and ',' keep their spec meaning.)
//
// Memory: a model sizes its activations once per (batch, length) in an arena it owns and reuses
// (no allocation inside the layer loop); every layer's attention Context borrows one Scratch.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "clattn/attention.h"
#include "clattn/kv_cache.h"
#include "clattn/tensor.h"

namespace clattn {

// One spec per layer, parsed from a plan string (errors name the layer and the spec).
std::vector<std::string> parse_attention_plan(const std::string& plan, int64_t layers);
// The attention of each layer of a plan, refusing (by layer) a spec that cannot run there: for
// decoders a missing causal mask or grouped heads, and shared-QK attention (keys = queries)
// unless the model can give it its queries as keys (shared_qk_ok: the trainable models, which
// learn with it; a pretrained checkpoint's keys are their own projection).
std::vector<std::unique_ptr<Attention>> make_plan_attentions(const std::vector<std::string>& specs,
                                                             bool causal, bool gqa,
                                                             bool shared_qk_ok = false);

enum class ModelKind { bert, kwt, llama };

struct ModelConfig {
  ModelKind kind = ModelKind::bert;
  std::string model_type, architecture;
  int64_t hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0;
  int64_t vocab = 0, max_positions = 0, type_vocab = 0, num_labels = 0;
  float eps = 1e-12f;
  bool gelu_tanh = false;      // hidden_act gelu_tanh / gelu_new / gelu_pytorch_tanh
  bool pre_ln = false;         // norm_placement "pre" (default post, as BERT)
  bool final_layer_norm = false;
  // "classifier_pooling": "mean" (clattn's trained classifiers): the classifier reads the mean of
  // each sequence's valid tokens; otherwise the first token (BERT's [CLS], KWT's class token).
  bool mean_pooling = false;
  bool qkv_bias = true;
  float attention_scale = 0;   // 0 = 1/sqrt(head_dim)
  // KWT input path
  int64_t input_dim = 0, num_patches = 0;
  // LLaMA
  float rope_theta = 10000.f;
  bool tie_embeddings = false;
  int32_t bos = -1, eos = -1;
  std::vector<std::string> labels;  // id2label, when the config has it
};

// Reads config.json (errors name the file and the field).
ModelConfig read_model_config(const std::string& path);

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

class Weights;  // model/weights.h: the checkpoint's tensors, read into memory at load (never mapped: a file changed underneath cannot fault)

struct LoadOptions {
  bool verbose = false;  // list unused tensors of the checkpoint on stderr
};

// Encoder: BERT-style (post-LN, or pre-LN with norm_placement "pre") and KWT.
class Encoder {
 public:
  static std::unique_ptr<Encoder> load(const std::string& dir, const LoadOptions& opt = {});
  // A BERT-shaped encoder with random weights (N(0, 0.02) matrices, unit LayerNorms) from cfg's
  // sizes, for benchmarks: the long-input encoder this library exists for.
  static std::unique_ptr<Encoder> random_bert(const ModelConfig& cfg, uint64_t seed);
  ~Encoder();
  const ModelConfig& config() const { return cfg_; }
  // Sets the attention of every layer from a plan (see above). Default: "full".
  void set_attention(const std::string& plan);
  const std::vector<std::string>& attention_specs() const { return specs_; }

  // BERT: ids (B, T) row-major, lengths (B) (empty: all T), token types (B, T) or empty.
  // Returns the classifier logits (B, num_labels), or with no classifier the last hidden state
  // (B, T, hidden).
  Tensor forward_tokens(std::span<const int32_t> ids, int64_t B, int64_t T,
                        std::span<const int32_t> lengths = {}, std::span<const int32_t> types = {});
  // KWT: features (B, num_patches, input_dim). Returns logits (B, num_labels).
  Tensor forward_features(ConstView features);
  // Milliseconds spent in attention during the last forward (for the share of time outside it).
  double last_attention_ms() const { return attn_ms_; }
  // Bytes a forward of (B, T) allocates: activations and the largest attention workspace.
  double forward_bytes(int64_t B, int64_t T) const;
  // Later forwards fill cap (nullptr: stop capturing); cap must outlive them.
  void set_capture(AttentionCapture* cap) { capture_ = cap; }

 private:
  Encoder();
  struct Params;  // pointers to every weight, checked against the config on load
  static std::unique_ptr<Encoder> build(ModelConfig cfg, std::unique_ptr<Weights> w, const LoadOptions& opt);
  void run_layers(int64_t B, int64_t T, std::span<const int32_t> lengths);
  Tensor classify(int64_t B, int64_t T, std::span<const int32_t> lengths);
  void ensure(int64_t B, int64_t T);
  ModelConfig cfg_;
  std::unique_ptr<Weights> w_;
  std::unique_ptr<Params> p_;
  std::vector<std::string> specs_;
  std::vector<std::unique_ptr<Attention>> att_;
  std::vector<Context> ctx_;
  // Layer state of stateful attentions (routing's EMA centroids, made from the spec's seed on
  // first use; inference calls only read it). Reset when the plan changes.
  std::vector<AttentionState> states_;
  Scratch scratch_;
  Tensor x_, xn_, qkv_, ao_, t_, h_;  // activations, sized once per (B, T)
  int64_t B_ = 0, T_ = 0;
  uint64_t step_ = 0;
  double attn_ms_ = 0;
  AttentionCapture* capture_ = nullptr;
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

// Decoder: LLaMA family (RMSNorm, rotate-half RoPE, GQA, SwiGLU, tied or untied embeddings).
class Decoder {
 public:
  static std::unique_ptr<Decoder> load(const std::string& dir, const LoadOptions& opt = {});
  ~Decoder();
  const ModelConfig& config() const { return cfg_; }
  void set_attention(const std::string& plan);  // every layer's spec must honour a causal mask
  const std::vector<std::string>& attention_specs() const { return specs_; }

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
  double last_attention_ms() const { return attn_ms_; }
  // Bytes a forward of (B, T) allocates: activations, logits, the largest attention workspace,
  // and with cache_positions > 0 the KV caches of that many positions.
  double forward_bytes(int64_t B, int64_t T, int64_t cache_positions = 0) const;
  // Later forwards fill cap (nullptr: stop capturing); cap must outlive them.
  void set_capture(AttentionCapture* cap) { capture_ = cap; }

 private:
  Decoder();
  struct Params;
  // Runs rows (B·T tokens at positions pos) through the layers; with caches, appends K and V and
  // attends over the cache (batch 1).
  void run(int64_t B, int64_t T, std::span<const int32_t> lengths, const int32_t* pos,
           bool use_cache, int64_t logits_from);
  void ensure(int64_t B, int64_t T);
  ModelConfig cfg_;
  std::unique_ptr<Weights> w_;
  std::unique_ptr<Params> p_;
  std::vector<std::string> specs_;
  std::vector<std::unique_ptr<Attention>> att_;
  std::vector<Context> ctx_;
  // Layer state of stateful attentions (routing's EMA centroids, made from the spec's seed on
  // first use; inference calls only read it). Reset when the plan changes.
  std::vector<AttentionState> states_;
  std::vector<KVCache> cache_;
  Scratch scratch_;
  Tensor x_, xn_, q_, kv_, ao_, g_, u_, logits_;
  std::vector<int32_t> posbuf_;
  int64_t B_ = 0, T_ = 0, pos_ = 0;
  uint64_t step_ = 0;
  double attn_ms_ = 0;
  AttentionCapture* capture_ = nullptr;
};

// The model folder's kind, read from its config.json (bert / kwt -> Encoder, llama -> Decoder).
ModelKind model_kind(const std::string& dir);

}  // namespace clattn
