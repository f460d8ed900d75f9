// Exact top-k attention (the oracle): each query keeps its k best-scoring visible keys and takes
// the softmax over them. Time O(N·M·D) like full attention, memory O(N·k): scores stream through
// 64 x 512 tiles and a per-row threshold filter keeps the candidates (topk_select.h).
#pragma once

#include <vector>

#include "attention/tile/ref_problem.h"
#include "clattn/attention.h"

namespace clattn {

struct TopkState : ContextState {
  int64_t k = 0;
  std::vector<int32_t> idx;  // (B, H, N, k) the selected keys of each query (first cnt valid)
  std::vector<int32_t> cnt;  // (B, H, N) how many keys each query kept (< k when fewer visible)
  Tensor lse;                // (B, H, N) natural log-sum-exp of the kept scaled logits
  size_t bytes() const override { return held_bytes(idx, cnt, lse); }
};

struct TopkWorkspace;  // packed K, per-thread tiles; kept in the caller's Scratch
// Upper bound of the Scratch and saved state of one call with k kept keys.
size_t topk_workspace_bytes(const AttentionDims& d, int64_t k, Mode mode, int threads);

void attn_topk_fwd(const AttentionInputs& in, const AttentionDims& d, int64_t k, float scale,
                   View out, TopkState& st, TopkWorkspace& ws);
void attn_topk_bwd(const AttentionInputs& in, const AttentionDims& d, float scale,
                   const TopkState& st, ConstView dout, View dq, View dk, View dv,
                   TopkWorkspace& ws);

// Reference in double: softmax over the keys st selected (the discrete choice held fixed).
void attn_topk_ref(const RefProblem& pr, const TopkState& st, std::vector<double>& out);

}  // namespace clattn
