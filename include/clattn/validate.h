// The attention contract (attention.h) as checks: what every variant runs at the top of forward and
// backward, for callers that want the same answer before a call (bindings turning a broken contract
// into their own error class, a CLI checking a file's tensors). Each throws clattn::Error with a
// message that names the rule, `who` (the variant or caller) and the values seen.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "clattn/attention.h"
#include "clattn/tensor.h"

namespace clattn {

// The largest magnitudes of a call's inputs (finite entries; a bias's -inf entries skipped): what
// the overflow rule of each variant (Attention::check_magnitudes) reads.
struct Magnitudes {
  double q = 0, k = 0, v = 0, bias = 0;
};

// Inputs against the contract and a variant's capabilities: ranks, shapes and strides of q, k, v
// (and bias), H % Hkv, lengths in range, no NaN/Inf in q, k, v (bias: -inf allowed), masks the
// variant cannot honour, k identical to q for shared-QK, a state for stateful variants, a cache's
// views. Returns the sizes.
AttentionDims validate_inputs(const AttentionInputs& in, const Capabilities& caps, std::string_view who);

// What a variant's forward checks before it computes: validate_inputs with the variant's capabilities
// and name, then its magnitude rule (Attention::check_magnitudes).
AttentionDims validate_forward_inputs(const Attention& att, const AttentionInputs& in);

// An output or gradient view: shape `expected`, unit innermost stride, data present.
void validate_output(ConstView t, const Shape& expected, std::string_view what, std::string_view who);

// The views of a backward: out and dout (B, H, N, Dv), dout finite, dq, dk, dv shaped like q, k, v;
// refuses a cache (decoding is inference). d comes from validate_inputs.
void validate_backward(const AttentionInputs& in, const AttentionDims& d, ConstView out, ConstView dout,
                       ConstView dq, ConstView dk, ConstView dv, std::string_view who);

// What a caller whose tensors the kernels do not read (clattn.torch's tensor-op path, on any device)
// knows of one input: its shape and, from one pass over it, its largest finite |x| and the index
// of its first non-finite element (for a bias: NaN or +inf; -inf is a mask).
struct TensorFacts {
  Shape shape;
  double max_abs = 0;
  std::vector<int64_t> first_bad;  // full index of the first bad element; empty: none
  double bad_value = 0;
};
struct InputFacts {
  TensorFacts q, k, v;
  TensorFacts bias;  // rank 0: no bias
  std::vector<int32_t> query_lengths, key_lengths;  // empty: every position valid
  bool causal = false;
};
// validate_inputs and the variant's magnitude rule on facts instead of data: the same rules, in
// the same order, with the same messages. Shared-QK variants need the data (k identical to q) and
// stateful ones a state: both are refused here.
AttentionDims validate_facts(const Attention& att, const InputFacts& in);

// No NaN or Inf in a rank-2 or rank-4 view; the error names `what`, `who` and the first index.
void check_finite(ConstView t, std::string_view what, std::string_view who);

}  // namespace clattn
