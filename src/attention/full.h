// Exact softmax attention: the fast tiled kernels and the plain reference beside them.
#pragma once

#include "clattn/attention.h"
#include "clattn/tensor.h"

namespace clattn {

struct FullParams {
  float scale = 0.f;  // 0 = 1/sqrt(Dk)
};

// What full attention's forward leaves for backward.
struct FullState : ContextState {
  Tensor lse;  // (B, H, N) natural-log log-sum-exp of the scaled logits; +inf for rows that see
               // no key, 0 for padded rows
  Tensor out;  // (B, H, N, Dv) copy of the output (backward needs D_i = dO_i · O_i)
};

// Scratch reused across calls (packed K/V per head, per-thread tiles, partial gradients).
struct FullWorkspace;
struct FullWorkspaceDeleter { void operator()(FullWorkspace* w) const; };
using FullWorkspacePtr = std::unique_ptr<FullWorkspace, FullWorkspaceDeleter>;
FullWorkspacePtr make_full_workspace();

// Fast kernels. Inputs must already be validated (validate_inputs). out (B, H, N, Dv), lse (B, H, N).
// window > 0 restricts query i (at key position i + M − N) to keys within window/2 of it, or with
// causal to the last `window` positions up to it: the `local` variant.
void attn_full_fwd(const AttentionInputs& in, const AttentionDims& d, float scale, View out,
                   float* lse, FullWorkspace& ws, int64_t window = 0);
// Accumulates into dq, dk, dv. out and lse as left by attn_full_fwd.
void attn_full_bwd(const AttentionInputs& in, const AttentionDims& d, float scale, ConstView out,
                   const float* lse, ConstView dout, View dq, View dk, View dv, FullWorkspace& ws,
                   int64_t window = 0);

// Copies an output (B, H, N, Dv) view into dst, reusing dst's storage: the FullState.out that the
// backward's D_i = dO_i · O_i needs.
void save_output(ConstView out, Tensor& dst);

// Reference: one row at a time in double, obviously right, O(M) memory per row.
void attn_full_ref_fwd(const AttentionInputs& in, float scale, View out, float* lse,
                       int64_t window = 0);
void attn_full_ref_bwd(const AttentionInputs& in, float scale, ConstView dout, View dq, View dk,
                       View dv, int64_t window = 0);

}  // namespace clattn
