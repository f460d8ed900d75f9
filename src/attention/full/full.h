// Exact softmax attention: the fast tiled kernels and the plain reference beside them.
#pragma once

#include "attention/validate.h"
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
  // (2, B, H, N) the same in two parts, log2 units: the row max m and log2 of the row sum l.
  // Backward recomputes P = 2^((S − m) − log2 l): S − m is exact for the large entries, where a
  // single lse (m + log2 l, rounded to float, then converted between ln and log2) loses up to
  // ~1.5 of the exponent once |logits| pass ~1e6 (q, k ~ 3000·N(0, 1): dv off by a factor 7).
  Tensor parts;
  size_t bytes() const override { return lse.bytes() + parts.bytes(); }
};

// Scratch of the full kernels (packed K/V per head, per-thread tiles, partial gradients), kept
// in the caller's Scratch; full_workspace_bytes bounds it with the saved lse.
struct FullWorkspace;
size_t full_workspace_bytes(const AttentionDims& d, Mode mode, int threads, int64_t window);

// `full` (window 0) or `local` (window > 0) as an Attention.
std::unique_ptr<Attention> make_full_attention(float scale, int64_t window);

// Fast kernels. Inputs must already be validated (validate_inputs). out (B, H, N, Dv), lse (B, H, N).
// window > 0 restricts query i (at key position i + M − N) to keys within window/2 of it, or with
// causal to the last `window` positions up to it: the `local` variant.
// parts (2, B, H, N) as FullState::parts (nullptr: not needed).
void attn_full_fwd(const AttentionInputs& in, const AttentionDims& d, float scale, View out,
                   float* lse, FullWorkspace& ws, int64_t window = 0, float* parts = nullptr);
// Accumulates into dq, dk, dv. out and parts as left by attn_full_fwd.
void attn_full_bwd(const AttentionInputs& in, const AttentionDims& d, float scale, ConstView out,
                   const float* parts, ConstView dout, View dq, View dk, View dv, FullWorkspace& ws,
                   int64_t window = 0);

// Reference: one row at a time in double, obviously right, O(M) memory per row.
void attn_full_ref_fwd(const AttentionInputs& in, float scale, View out, float* lse,
                       int64_t window = 0);
void attn_full_ref_bwd(const AttentionInputs& in, float scale, ConstView dout, View dq, View dk,
                       View dv, int64_t window = 0);

}  // namespace clattn
