// The attention contract (docs/design.md). Inputs are head-major: q (B, H, N, Dk), k (B, Hkv, M, Dk),
// v (B, Hkv, M, Dv), out (B, H, N, Dv). Only the innermost stride must be 1; the others are free.
// H % Hkv == 0 (grouped-query attention: query head h reads key/value head h / (H / Hkv)).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include "clattn/error.h"
#include "clattn/scratch.h"
#include "clattn/spec.h"
#include "clattn/tensor.h"

namespace clattn {

class KVCache;
struct AttentionState;

struct AttentionInputs {                    // views only; nothing owned
  ConstView q, k, v;                        // (B, H, N, Dk), (B, Hkv, M, Dk), (B, Hkv, M, Dv)
  std::span<const int32_t> query_lengths;   // [B]; empty = all N valid (padding at the end)
  std::span<const int32_t> key_lengths;     // [B]; empty = all M valid
  bool causal = false;                      // query i sees keys j <= i + (M - N)
  ConstView bias;                           // (N, M) additive logits; `full` only
  // Random stream of stochastic variants (capabilities().stochastic): every draw is a function
  // of the spec's seed= and this step, so the same inputs and step give the same output. Training
  // advances it each step; a resumed run passes the step it stopped at.
  uint64_t step = 0;
  // Layer state of stateful variants (capabilities().stateful: routing's EMA centroids), owned
  // by the caller, saved and loaded with checkpoints. Required by a stateful variant.
  AttentionState* state = nullptr;
  // A training call: stateful variants update their state (routing's EMA); an evaluation call
  // only reads it.
  bool train = false;
  // Decoding: k and v are cache->keys() and cache->values(); full reads its packed panels.
  const KVCache* cache = nullptr;
};

// Sizes read off validated inputs.
struct AttentionDims {
  int64_t B = 0, H = 0, Hkv = 0, N = 0, M = 0, Dk = 0, Dv = 0;
  int64_t group() const { return H / Hkv; }  // query heads per key/value head
};

// What a variant honours and is; a mask it cannot honour is refused with an error naming mask and
// variant.
struct Capabilities {
  bool causal = false;
  bool query_lengths = false;
  bool key_lengths = false;
  bool bias = false;
  bool cross = false;       // N != M
  bool gqa = false;         // H != Hkv
  bool trainable = false;   // has backward
  bool shared_qk = false;   // keys are the queries: k must be q, or identical to it (reformer)
  bool stochastic = false;  // output depends on seed= and AttentionInputs::step
  bool stateful = false;    // reads (and in training calls updates) AttentionInputs::state
  // Decoding with a KVCache reproduces a prefill only when the cache also keeps the queries
  // (KVCache query_heads): causal clustered builds its centroids from earlier queries. Without
  // them such an attention attends the cached prefix exactly (docs/models.md says so).
  bool decode_queries = false;
  // Runs with one sequence split across the ranks of a communicator (seq_parallel.h), without a
  // mask and with the causal one; the refusals of the split list the variants that set these.
  bool splits_sequence = false;
  bool splits_sequence_causal = false;
  // Decodes from a KVCache of 16-bit floats (kv_cache.h): its kernels read the cache's key panels
  // and value rows, widening them in registers (full, local; the clustered pair when causal, from a
  // cache that keeps queries).
  bool half_cache = false;
  // Has a PyTorch tensor-op form (python/clattn/_device.py) with the C++ kernels' clusters: runs
  // on tensors of any device, non-causal (full: causal too). Python's dispatch reads this flag.
  bool torch_ops = false;
};

// Every capability under one name, in one order: each field of Capabilities under its own name,
// then "decode" (decodes token by token through a KVCache: causal, and its keys are not its
// queries). The one serialization: `clattn variants -o json` and Python's `capabilities` both
// print this list.
std::vector<std::pair<std::string, bool>> capability_list(const Capabilities& c);

// Forward only (inference), or forward then backward (training): what a call keeps and needs.
enum class Mode { inference, training };

// The useful work of one call, stage by stage: what the algorithm must compute (its products,
// popcounts and the bytes it must at least move), not what an implementation happens to do, so
// that GFLOP/s against it is the distance to the machine's limit (docs/performance.md). Products
// count 2 flops per multiply-add; exponentials and comparisons are not counted. A backward stage
// counts the FlashAttention convention for softmax attention: scores recomputed, then dV, dP, dQ
// and dK, 2.5x the forward's products when Dk = Dv.
struct WorkStage {
  std::string name;     // "hashing", "k-means", "centroid attention", "top-k recomputation", ...
  bool backward = false;
  double flops = 0;     // floating-point operations
  double int_ops = 0;   // integer work: k-means counts one per (code, centroid) popcount
  double bytes = 0;     // bytes the stage must read and write at least
};
struct WorkModel {
  std::vector<WorkStage> stages;
  double flops() const;
  double int_ops() const;
  double bytes() const;
  // Adds a stage; one of a name already held (same direction) adds to it.
  WorkModel& add(std::string name, bool backward, double flops, double int_ops = 0, double bytes = 0);
  WorkModel& operator+=(const WorkModel& o);
};

// Persistent layer state as named buffers (routing's "centroids" (H, C, Dk)). A variant creates
// a missing buffer from its seed on first use; the caller saves and restores them.
struct AttentionState {
  std::vector<std::pair<std::string, Tensor>> buffers;
  Tensor* find(std::string_view name);
  const Tensor* find(std::string_view name) const;
  Tensor& add(std::string name, const Shape& shape);  // zero-filled; replaces one of that name
};

// Name, shape and meaning of one state buffer.
struct StateBuffer {
  std::string name;
  Shape shape;
  std::string what;
};

// Base of each variant's saved state (log-sum-exp, clusters, top-k sets...; never N x M).
struct ContextState {
  virtual ~ContextState() = default;
  virtual size_t bytes() const = 0;
};

// What forward leaves for backward, and the Scratch a call borrows. A Context owns its Scratch
// unless given one to share (a model passes one Scratch to every layer's Context). Reusing one
// Context across calls reuses every buffer; destroying it frees them. An inference context
// (Context::for_inference()) keeps no backward state, and a backward given one is refused.
class Context {
 public:
  explicit Context(Mode mode = Mode::training, Scratch* shared = nullptr)
      : inference_(mode == Mode::inference), shared_(shared) {}
  static Context for_inference(Scratch* shared = nullptr) { return Context(Mode::inference, shared); }
  bool inference() const { return inference_; }
  Mode mode() const { return inference_ ? Mode::inference : Mode::training; }
  Scratch& scratch() { return shared_ ? *shared_ : own_; }

  // Forward: the variant's state, made on first use (replaced when another variant's is held).
  template <class T>
  T& state() {
    // typeid of a raw pointer's target: clang warns that typeid(*unique_ptr) evaluates a call.
    if (const ContextState* s = state_.get(); !s || typeid(*s) != typeid(T)) state_ = std::make_unique<T>();
    return static_cast<T&>(*state_);
  }
  // Whether the saved state is T (a forward of the variant that keeps T filled this context).
  template <class T>
  bool holds() const {
    const ContextState* s = state_.get();
    return s && typeid(*s) == typeid(T);
  }
  // Backward: the state a forward of the same variant left.
  template <class T>
  const T& saved() const {
    check(!inference_, "attention: backward needs a training context, but this one was made by ",
          "Context::for_inference(), whose forward keeps no backward state");
    const ContextState* s = state_.get();
    check(s && typeid(*s) == typeid(T),
          "attention: backward needs the context filled by forward of the same variant");
    return static_cast<const T&>(*state_);
  }
  bool empty() const { return !state_; }
  // Bytes held: the saved state and the Context's own Scratch (not a shared one).
  size_t bytes() const { return (state_ ? state_->bytes() : 0) + own_.bytes(); }
  // Frees the saved state and the own Scratch.
  void release() {
    state_.reset();
    own_.release();
  }

 private:
  std::unique_ptr<ContextState> state_;
  bool inference_ = false;
  Scratch own_;
  Scratch* shared_ = nullptr;
};

// The groups a variant put the queries of one (batch, head) in: the discrete choice its forward
// made and its backward holds fixed (Attention::query_groups).
struct QueryGroups {
  std::vector<int32_t> ids;  // (N) group of each query, numbered from 0; -1: in none (see below)
  std::string kind;          // what a group is: "cluster" or "chunk"; empty for a variant without groups
};

class SplitAttention;  // a variant's sequence-parallel kernels (src/sequence_split/split_attention.h)
struct Magnitudes;     // the largest |x| of q, k, v and the bias (clattn/validate.h)

// One object per spec string. It holds only its parameters: forward and backward are const, keep
// nothing between calls, and may run at once from several threads given different Contexts.
class Attention {
 public:
  virtual ~Attention() = default;
  virtual std::string name() const = 0;  // canonical spec string, all parameters spelled out
  virtual const Capabilities& capabilities() const = 0;
  // out (B, H, N, Dv) is overwritten.
  virtual void forward(const AttentionInputs& in, View out, Context& ctx) const = 0;
  // Gradients are accumulated with +=: dq (B, H, N, Dk), dk (B, Hkv, M, Dk), dv (B, Hkv, M, Dv).
  // `out` is the output the forward on `ctx` wrote (D_i = dO_i · O_i reads it).
  virtual void backward(const AttentionInputs& in, ConstView out, Context& ctx, ConstView dout,
                        View dq, View dk, View dv) const = 0;
  // The variant's overflow rule (src/attention/validate.h): finite inputs of these sizes and
  // magnitudes whose float arithmetic could overflow are refused with the bound they break.
  // forward runs it after validate_inputs; validate_facts runs it for callers that hold facts
  // about their inputs instead of the data.
  virtual void check_magnitudes(const AttentionDims& d, const Magnitudes& m) const = 0;
  // Upper bound of the bytes a call of these sizes takes from the Scratch and the Context's saved
  // state, on `threads` threads (the inputs, output and gradients are the caller's).
  virtual size_t workspace_bytes(const AttentionDims& d, Mode mode, int threads) const = 0;
  // The useful work of a call of these sizes with every query and key valid (WorkModel): the
  // forward's stages, and with Mode::training also the backward's.
  virtual WorkModel work(const AttentionDims& d, bool causal, Mode mode) const = 0;
  // Bytes one decode step reads from a KVCache and from the state a variant derives from it: one
  // new query per head (d.B, d.H; d.N and d.M are not read) with `context` positions cached, the
  // new one included, each cached K or V element `element_bytes` wide (4, or 2 for a 16-bit
  // cache); work a variant spreads over steps (causal clustered's clusters and stream) counted as
  // its average per step. A cached row is counted once per key/value head: the query heads of a
  // group read it while it is in cache. By default every cached key and value.
  virtual double decode_bytes(const AttentionDims& d, double context, double element_bytes) const {
    return element_bytes * static_cast<double>((d.Dk + d.Dv) * d.B * d.Hkv) * context;
  }
  // Stateful variants: the buffers of AttentionInputs::state for H query heads of dim Dk.
  virtual std::vector<StateBuffer> state_buffers(int64_t /*H*/, int64_t /*Dk*/) const { return {}; }
  // The groups of the queries of batch b, query head h, as the last forward on `ctx` made them:
  // `ctx` is a training Context that forward filled (an inference one keeps no partition) and
  // `in` are that forward's inputs (checked as forward checks them; b < B, h < H). Padded queries
  // (i >= query_lengths[b]) are in no group (-1). Per variant:
  //   clustered, improved-clustered  kind "cluster": the query's cluster (0 .. C_eff - 1). Causal:
  //       clusters belong to a segment of positions, numbered segment after segment
  //       (σ·clusters + j for cluster j of segment σ); a row attended exactly (the first block)
  //       is -1.
  //   routing  kind "cluster": a cluster the query attends in (in several: the lowest index).
  //       Causal: its nearest centroid, the bucket it attends in.
  //   smyrf  kind "cluster": its cluster of the first hash round (queries sorted by projection
  //       and cut into consecutive clusters). Causal: its bucket of the first round.
  //   reformer  kind "chunk": its chunk of the first round (positions sorted by bucket and cut
  //       into chunks of `chunk`).
  //   conditional-full  the groups of the variant that ran (none below length_limit).
  // Every other variant has no groups: {} (empty ids and kind).
  virtual QueryGroups query_groups(const AttentionInputs& /*in*/, const Context& /*ctx*/, int64_t /*b*/,
                                   int64_t /*h*/) const {
    return {};
  }
  // The variant's kernels over a sequence split across ranks, which sequence_parallel_forward /
  // _backward (seq_parallel.h) call: non-null exactly when capabilities().splits_sequence.
  virtual const SplitAttention* split() const { return nullptr; }
};

// The registry: builds a variant from a spec string such as "full:scale=0.125".
std::unique_ptr<Attention> make_attention(std::string_view spec);

struct VariantInfo {
  std::string name;
  std::string params;  // "scale=<float>" style summary of accepted parameters
  std::string summary;
  std::string example;  // a complete spec string, e.g. "local:window=256"
  // Every parameter as the factory reads it (type, default, range), in reading order, and the
  // capabilities of the example spec's object (wrappers: of the example's inner variant).
  std::vector<SpecParam> parameters;
  Capabilities capabilities;
};
std::vector<VariantInfo> registered_attentions();

}  // namespace clattn
