// The attention contract (attention.h) as checks: what every variant runs at the top of forward and
// backward, for callers that want the same answer before a call (bindings turning a broken contract
// into their own error class, a CLI checking a file's tensors). Each throws clattn::Error with a
// message that names the rule, `who` (the variant or caller) and the values seen.
#pragma once

#include <string_view>

#include "clattn/attention.h"
#include "clattn/tensor.h"

namespace clattn {

// Inputs against the contract and a variant's capabilities: ranks, shapes and strides of q, k, v
// (and bias), H % Hkv, lengths in range, no NaN/Inf in q, k, v (bias: -inf allowed), masks the
// variant cannot honour, k identical to q for shared-QK, a state for stateful variants, a cache's
// views. Returns the sizes.
AttentionDims validate_inputs(const AttentionInputs& in, const Capabilities& caps, std::string_view who);

// An output or gradient view: shape `expected`, unit innermost stride, data present.
void validate_output(ConstView t, const Shape& expected, std::string_view what, std::string_view who);

// The views of a backward: out and dout (B, H, N, Dv), dout finite, dq, dk, dv shaped like q, k, v;
// refuses a cache (decoding is inference). d comes from validate_inputs.
void validate_backward(const AttentionInputs& in, const AttentionDims& d, ConstView out, ConstView dout,
                       ConstView dq, ConstView dk, ConstView dv, std::string_view who);

// No NaN or Inf in a rank-2 or rank-4 view; the error names `what`, `who` and the first index.
void check_finite(ConstView t, std::string_view what, std::string_view who);

}  // namespace clattn
