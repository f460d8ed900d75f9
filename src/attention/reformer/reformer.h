// Reformer LSH attention (Kitaev et al. 2020), shared-QK (docs/design.md).
#pragma once

#include <cstdint>
#include <vector>

#include "attention/tile/ref_problem.h"
#include "clattn/attention.h"
#include "clattn/tensor.h"

namespace clattn {

struct ReformerParams {
  int64_t rounds = 1, chunk = 32;
  int64_t buckets = 0;  // 0 = auto: 2·ceil(N/chunk), made factorisable above 128
  uint64_t seed = 0;
};

// The partition of every round, held fixed for backward: positions sorted by (bucket, position)
// and cut into chunks. With causal, each bucket's run is padded with -1 to whole chunks, so a chunk
// holds one bucket (reformer.cpp, "Causal").
struct ReformerState : ContextState {
  int64_t rounds = 0, chunk = 0, buckets = 0;
  bool causal = false;
  int64_t len = 0;               // stride of perm: N, or with causal a bound on the padded length
  std::vector<int32_t> perm;     // (B, H, rounds, len)
  std::vector<int32_t> nch;      // (B, H, rounds) chunks of each round
  std::vector<int32_t> cbucket;  // causal: (B, H, rounds, len / chunk) the bucket of each chunk
  Tensor lse2;                   // (B, H, N) log2-sum-exp2 over every round's visible keys
  size_t bytes() const override { return held_bytes(perm, nch, cbucket, lse2); }
  // Round r of head t = b·H + h as the forward left it: its perm, the bucket of each chunk
  // (causal; else nullptr), its chunks, and the length of perm they cover (N without causal).
  struct Round {
    const int32_t* perm;
    const int32_t* cbucket;
    int64_t nch, len;
  };
  Round round(int64_t t, int64_t r, int64_t N) const {
    const int64_t at = t * rounds + r, n = nch[static_cast<size_t>(at)];
    return {perm.data() + at * len, causal ? cbucket.data() + at * (len / chunk) : nullptr, n, causal ? n * chunk : N};
  }
};

inline constexpr int64_t kReformerMaxChunk = 64;  // the longest chunk= (a chunk's rows live on the stack)
struct ReformerWorkspace;  // reformer.cpp; kept in the caller's Scratch
ReformerWorkspace& reformer_workspace(Scratch& scratch);
// Stride of a round's perm: N, or with causal the longest padded length (each non-empty bucket
// adds at most ch - 1 entries of padding).
int64_t reformer_perm_len(int64_t n, int64_t nb, int64_t ch, bool causal);
// Upper bound of the Scratch and saved state of one call.
size_t reformer_workspace_bytes(const AttentionDims& d, const ReformerParams& p, Mode mode,
                                int threads);

// Bucket count actually used for a sequence of n (the auto rule, or p.buckets checked).
int64_t reformer_buckets(const ReformerParams& p, int64_t n);

// The useful work of a call (clattn/attention.h, WorkModel): per round the rotations of the unit
// queries, and softmax attention of each query over its chunk and the one before (with the
// causal mask, about half of those keys); the rounds' combination.
WorkModel reformer_work(const AttentionDims& d, const ReformerParams& p, bool causal, Mode mode);

// Forward: hashes every position with the rotations of rng stream `step` (shared by every head),
// sorts into st's partition, and attends chunk by chunk.
void attn_reformer_fwd(const AttentionInputs& in, const AttentionDims& d, const ReformerParams& p,
                       uint64_t step, View out, ReformerState& st, ReformerWorkspace& ws);
// All gradient goes to dq (k is q); dk is left unchanged. out is the output the forward wrote
// (D_i = dO_i · O_i).
void attn_reformer_bwd(const AttentionInputs& in, const AttentionDims& d, const ReformerState& st,
                       ConstView out, ConstView dout, View dq, View dv, ReformerWorkspace& ws);

// Reference hash in double: the bucket of every position of (b, h) in round `round`, the argmax
// over [x·R, −x·R] of the unit query x (factorised above 128 buckets: b1 + f1·b2), with the
// rotations the forward draws for step `step`. The forward's perm sorts by (bucket, position).
void reformer_buckets_ref(const RefProblem& pr, const ReformerParams& p, uint64_t step, int64_t b,
                          int64_t h, int64_t round, std::vector<int32_t>& bucket);

// Reference in double with st's partition (pr.k is ignored: keys are pr.q normalised).
void attn_reformer_ref(const RefProblem& pr, const ReformerState& st, std::vector<double>& out);

}  // namespace clattn
