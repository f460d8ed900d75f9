// Exact softmax attention: the fast tiled kernels and the plain reference beside them.
#pragma once

#include "attention/validate.h"
#include "clattn/attention.h"
#include "clattn/comm.h"
#include "clattn/scratch.h"
#include "clattn/seq_parallel.h"
#include "clattn/tensor.h"
#include "core/microkernel.h"

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

// Which keys a query row sees beyond the causal and padding masks.
//   window > 0: `local` — keys within window/2 of the query's position, or with causal the last
//     `window` positions up to it.
//   block > 0 (causal only): the keys from the start of the query's block of `block` positions
//     up to its own; rows at positions < exact_before see every key up to their own instead
//     (causal clustered's in-block part and its exact first segment).
struct Band {
  int64_t window = 0;
  int64_t block = 0;
  int64_t exact_before = 0;
};

// Scratch of the full kernels (packed K/V per head, per-thread tiles, partial gradients), kept
// in the caller's Scratch; full_workspace_bytes bounds it with the saved lse.
struct FullWorkspace;
size_t full_workspace_bytes(const AttentionDims& d, Mode mode, int threads, const Band& band = {});
FullWorkspace& full_workspace(Scratch& scratch);
// The operands the kernels packed in ws, for a caller that goes on with the same keys (causal
// clustered): after attn_full_fwd without a window band or cache, the K panels
// (B, Hkv, np, Dk, 64) and the V rows operand of kv head t = b·Hkv + hk; after attn_full_bwd also
// the V panels (B, Hkv, np, Dv, 64) and K rows (B, Hkv, Mp, Dkp), np = ceil(M / 64), Mp = 64·np.
const float* full_key_panels(const FullWorkspace& ws);
mk::RowsOperand full_value_rows(const FullWorkspace& ws, int64_t t);
const float* full_value_panels(const FullWorkspace& ws);
const float* full_key_rows(const FullWorkspace& ws);

// `full` (window 0) or `local` (window > 0) as an Attention.
std::unique_ptr<Attention> make_full_attention(float scale, int64_t window);

// Fast kernels. Inputs must already be validated (validate_inputs). out (B, H, N, Dv), lse (B, H, N).
// band as above (default: every key the masks leave).
// parts (2, B, H, N) as FullState::parts (nullptr: not needed).
void attn_full_fwd(const AttentionInputs& in, const AttentionDims& d, float scale, View out,
                   float* lse, FullWorkspace& ws, const Band& band = {}, float* parts = nullptr);
// The same forward, scheduled by the caller (causal clustered runs each block's rows inside its own
// tasks): full_fwd_prepare packs what the tiles read (once per call, parallel), then each
// attn_full_fwd_rows runs query rows [r0, r1) of head (b, h) on the calling thread with that
// thread's scratch (`thread`, as parallel_for numbers them), and full_zero_padded_rows writes the
// rows past query_lengths (0, lse 0) that attn_full_fwd's first tile of a head writes.
void full_fwd_prepare(const AttentionInputs& in, const AttentionDims& d, FullWorkspace& ws, const Band& band);
void attn_full_fwd_rows(const AttentionInputs& in, const AttentionDims& d, float scale, const Band& band,
                        int64_t b, int64_t h, int64_t r0, int64_t r1, View out, float* lse, float* parts,
                        FullWorkspace& ws, int thread);
void full_zero_padded_rows(const AttentionInputs& in, const AttentionDims& d, int64_t b, int64_t h, View out,
                           float* lse, float* parts);
// Accumulates into dq, dk, dv. out and parts as left by attn_full_fwd. dout_scale (B, H, N), when
// given, multiplies each row of dout (the gradient of a row blended with other parts: the share
// of this part), without a scaled copy of dout.
void attn_full_bwd(const AttentionInputs& in, const AttentionDims& d, float scale, ConstView out,
                   const float* parts, ConstView dout, View dq, View dk, View dv, FullWorkspace& ws,
                   const Band& band = {}, const float* dout_scale = nullptr);

// Reference: one row at a time in double, obviously right, O(M) memory per row.
void attn_full_ref_fwd(const AttentionInputs& in, float scale, View out, float* lse,
                       int64_t window = 0);
void attn_full_ref_bwd(const AttentionInputs& in, float scale, ConstView dout, View dq, View dk,
                       View dv, int64_t window = 0);

}  // namespace clattn

namespace clattn::sp {

// Ring attention (ring.cpp): full softmax attention over a split sequence; comm counts the
// traffic (seq_parallel.cpp wraps the caller's). The forward leaves its rows' merged softmax terms.
struct RingState : ContextState {
  Tensor parts;  // (2, B, H, n_local) merged row max (log2 units) and log2 of the row sum
  size_t bytes() const override { return parts.bytes(); }
};
void ring_forward(Communicator& comm, const SeqSplit& split, float scale, const AttentionInputs& in, View out,
                  RingState& st, Scratch& scratch);
void ring_backward(Communicator& comm, const SeqSplit& split, float scale, const AttentionInputs& in, ConstView out,
                   const RingState& st, ConstView dout, View dq, View dk, View dv, Scratch& scratch);

}  // namespace clattn::sp
