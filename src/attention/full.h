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
void attn_full_fwd(const AttentionInputs& in, const AttentionDims& d, float scale, View out,
                   float* lse, FullWorkspace& ws);
// Accumulates into dq, dk, dv. out and lse as left by attn_full_fwd.
void attn_full_bwd(const AttentionInputs& in, const AttentionDims& d, float scale, ConstView out,
                   const float* lse, ConstView dout, View dq, View dk, View dv, FullWorkspace& ws);

// Reference: one row at a time in double, obviously right, O(M) memory per row.
void attn_full_ref_fwd(const AttentionInputs& in, float scale, View out, float* lse);
void attn_full_ref_bwd(const AttentionInputs& in, float scale, ConstView dout, View dq, View dk,
                       View dv);

}  // namespace clattn
