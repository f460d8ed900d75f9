// The attention contract (DESIGN §2). Inputs are head-major: q (B, H, N, Dk), k (B, Hkv, M, Dk),
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

#include "clattn/tensor.h"

namespace clattn {

struct AttentionInputs {                    // views only; nothing owned
  ConstView q, k, v;                        // (B, H, N, Dk), (B, Hkv, M, Dk), (B, Hkv, M, Dv)
  std::span<const int32_t> query_lengths;   // [B]; empty = all N valid (padding at the end)
  std::span<const int32_t> key_lengths;     // [B]; empty = all M valid
  bool causal = false;                      // query i sees keys j <= i + (M - N)
  ConstView bias;                           // (N, M) additive logits; `full` only
};

// Sizes read off validated inputs.
struct AttentionDims {
  int64_t B = 0, H = 0, Hkv = 0, N = 0, M = 0, Dk = 0, Dv = 0;
  int64_t group() const { return H / Hkv; }  // query heads per key/value head
};

// What a variant honours; anything else is refused with an error naming mask and variant.
struct Capabilities {
  bool causal = false;
  bool query_lengths = false;
  bool key_lengths = false;
  bool bias = false;
  bool cross = false;      // N != M
  bool gqa = false;        // H != Hkv
  bool trainable = false;  // has backward
};

// Base of each variant's saved state (log-sum-exp, clusters, top-k sets...; never N x M).
struct ContextState {
  virtual ~ContextState() = default;
};

// What forward leaves for backward. Reusing one Context across calls reuses its buffers.
// Context::for_inference() makes one for forward-only use (serving, evaluation, benchmarks of the
// forward): forward then skips what only backward reads, such as the copy of the output that
// full, smyrf and reformer keep for D_i = dO_i · O_i (an extra pass over (B, H, N, Dv) each
// call), and a backward given such a context is refused.
class Context {
 public:
  Context() = default;
  static Context for_inference() {
    Context c;
    c.inference_ = true;
    return c;
  }
  bool inference() const { return inference_; }
  template <class T>
  T& state() {
    if (!state_ || typeid(*state_) != typeid(T)) state_ = std::make_unique<T>();
    return static_cast<T&>(*state_);
  }
  template <class T>
  const T& state() const {
    check(!inference_, "attention: backward needs a training context, but this one was made by ",
          "Context::for_inference(), whose forward keeps no backward state");
    check(state_ && typeid(*state_) == typeid(T),
          "attention: backward needs the context filled by forward of the same variant");
    return static_cast<const T&>(*state_);
  }
  bool empty() const { return !state_; }

 private:
  std::unique_ptr<ContextState> state_;
  bool inference_ = false;
};

class Attention {
 public:
  virtual ~Attention() = default;
  virtual std::string name() const = 0;  // canonical spec string, all parameters spelled out
  virtual const Capabilities& capabilities() const = 0;
  // out (B, H, N, Dv) is overwritten.
  virtual void forward(const AttentionInputs& in, View out, Context& ctx) = 0;
  // Gradients are accumulated with +=: dq (B, H, N, Dk), dk (B, Hkv, M, Dk), dv (B, Hkv, M, Dv).
  virtual void backward(const AttentionInputs& in, const Context& ctx, ConstView dout, View dq,
                        View dk, View dv) = 0;
};

// Validates inputs against the contract and the variant's capabilities (shapes, strides, lengths,
// NaN/Inf, masks it cannot honour); returns the sizes. `who` names the variant in messages.
AttentionDims validate_inputs(const AttentionInputs& in, const Capabilities& caps,
                              std::string_view who);
// Checks an output or gradient view has the expected shape and a unit innermost stride.
void validate_output(ConstView t, const Shape& expected, std::string_view what,
                     std::string_view who);

// Checks the backward's gradient views: dout (B, H, N, Dv) and dq, dk, dv shaped like q, k, v.
void validate_backward(const AttentionInputs& in, const AttentionDims& d, ConstView dout,
                       ConstView dq, ConstView dk, ConstView dv, std::string_view who);

// Valid query / key count of batch b (lengths default to the full size).
inline int64_t valid_queries(const AttentionInputs& in, const AttentionDims& d, int64_t b) {
  return in.query_lengths.empty() ? d.N : in.query_lengths[static_cast<size_t>(b)];
}
inline int64_t valid_keys(const AttentionInputs& in, const AttentionDims& d, int64_t b) {
  return in.key_lengths.empty() ? d.M : in.key_lengths[static_cast<size_t>(b)];
}

// The registry: builds a variant from a spec string such as "full:scale=0.125".
std::unique_ptr<Attention> make_attention(std::string_view spec);

struct VariantInfo {
  std::string name;
  std::string params;  // "scale=<float>" style summary of accepted parameters
  std::string summary;
  std::string example;  // a complete spec string, e.g. "local:window=256"
};
std::vector<VariantInfo> registered_attentions();

}  // namespace clattn
