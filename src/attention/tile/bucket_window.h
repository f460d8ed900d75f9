// Causal bucket-window attention: the strictly causal form that SMYRF and routing take under a
// causal mask (smyrf.cpp, routing.cpp say how each assigns buckets).
//
// Definition. Keys sit at positions 0 .. M−1, query i at p_i = i + M − N (valid: i < nv, keys
// j < mv). In round r every valid query has a bucket qb_r(i) and every valid key a bucket kb_r(j),
// each a function of that one row (and of fixed parameters or state), never of another position.
// In round r query i attends
//   W_r(i) = the `window` most recent keys j <= p_i with kb_r(j) = qb_r(i),
//   plus its own key p_i (when valid), as one extra key if W_r(i) lacks it,
// with logits s·q_i·k_j. The rounds combine by log-sum-exp: one softmax over the keys of every
// round (a key met in two rounds counts twice). A query that meets no key gets 0.
// Every choice for row i reads rows at positions <= p_i only: the output and gradients at p_i
// never depend on a later position (test_causality). Cost O(N·window·D) per round.
//
// Implementation: per (b, h) and round, queries and keys are sorted by (bucket, position); a block
// is up to 64 consecutive queries of one bucket with its keys from `window` before the first one's
// to the last one's (at most window + 64 keys, gathered once), and row r keeps the columns of its
// own window. The own key, when outside the bucket, is a logit computed once per query and a
// weight accumulated over the rounds, applied after them (as smyrf.cpp's causal own key).
#pragma once

#include <cstdint>
#include <vector>

#include "attention/tile/ref_problem.h"
#include "clattn/attention.h"
#include "clattn/tensor.h"

namespace clattn {

// The partition of a call, filled by the caller before the forward and kept for backward.
struct BucketWindow {
  int64_t rounds = 0, window = 0;
  std::vector<int32_t> qb;  // (B, H, rounds, N) bucket of each valid query (>= 0)
  std::vector<int32_t> kb;  // (B, H, rounds, M) bucket of each valid key, per query head (>= 0)
  Tensor lse2;              // (B, H, N) log2-sum-exp2 over every round's keys (+inf: none)
  size_t bytes() const { return held_bytes(qb, kb, lse2); }
};

struct BucketWindowWorkspace;  // bucket_window.cpp; kept in the caller's Scratch
BucketWindowWorkspace& bucket_window_workspace(Scratch& scratch);
// Bytes of the scratch of one call (per thread tiles, GQA partials) and the saved state.
size_t bucket_window_bytes(const AttentionDims& d, int64_t rounds, int64_t window, Mode mode, int threads);

// Inputs validated; in.causal must be set. out (B, H, N, Dv); fills bw.lse2.
void attn_bucket_window_fwd(const AttentionInputs& in, const AttentionDims& d, float scale, BucketWindow& bw,
                            View out, BucketWindowWorkspace& ws);
// Accumulates into dq, dk, dv; out is the forward's output (D_i = dO_i · O_i).
void attn_bucket_window_bwd(const AttentionInputs& in, const AttentionDims& d, float scale, const BucketWindow& bw,
                            ConstView out, ConstView dout, View dq, View dk, View dv, BucketWindowWorkspace& ws);
// Reference in double with bw's buckets.
void attn_bucket_window_ref(const RefProblem& pr, const BucketWindow& bw, std::vector<double>& out);

}  // namespace clattn
