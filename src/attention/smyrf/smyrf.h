// SMYRF (Daras et al. 2020): asymmetric LSH clustering of queries and keys, attention inside
// clusters, rounds combined by log-sum-exp (docs/design.md).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "attention/tile/bucket_window.h"
#include "attention/tile/ref_problem.h"
#include "clattn/attention.h"
#include "clattn/tensor.h"

namespace clattn {

struct SmyrfParams {
  int64_t hashes = 2, q_cluster = 32, k_cluster = 32;
  float scale = 0.f;  // 0 = 1/sqrt(Dk)
  uint64_t seed = 0;
};

// The partition of every round, held fixed for backward: queries and keys sorted by their
// projection; cluster c of a round is sorted queries [c·q_cluster, ...) and sorted keys
// [c·k_cluster, ...).
// With a causal mask (smyrf.cpp, "Causal") the partition is bw's buckets instead.
struct SmyrfState : ContextState {
  int64_t rounds = 0, qc = 0, kc = 0;
  bool causal = false;
  std::vector<int32_t> qperm;  // (B, H, rounds, N) valid queries in projection order
  std::vector<int32_t> kperm;  // (B, H, rounds, M) valid keys in projection order
  Tensor lse2;                 // (B, H, N) log2-sum-exp2 over all rounds (+inf: no key seen)
  BucketWindow bw;             // causal: each row's bucket per round
  size_t bytes() const override { return held_bytes(qperm, kperm, lse2) + bw.bytes(); }
};

// Rows [first, second) of cluster cl when n sorted rows are cut into nc balanced consecutive
// clusters (sizes differ by at most one, so at most ceil(n / nc) <= q_cluster or k_cluster). Keys
// pass at_least_one: a key cluster that would be empty (fewer keys than clusters) takes one key,
// so no query cluster is ever left with nothing to attend.
inline std::pair<int64_t, int64_t> smyrf_cluster_range(int64_t n, int64_t nc, int64_t cl, bool at_least_one) {
  const int64_t b = cl * n / nc, e = (cl + 1) * n / nc;
  if (at_least_one && e == b && n > 0) return {std::min(b, n - 1), std::min(b, n - 1) + 1};
  return {b, e};
}

struct SmyrfWorkspace;  // smyrf.cpp; kept in the caller's Scratch
// Upper bound of the Scratch and saved state of one call.
size_t smyrf_workspace_bytes(const AttentionDims& d, const SmyrfParams& p, Mode mode, int threads);

// Forward: the directions of rng stream `step` (one per round, shared by every head), the sorted
// partition of every round into st, and the output.
void attn_smyrf_fwd(const AttentionInputs& in, const AttentionDims& d, const SmyrfParams& p,
                    uint64_t step, View out, SmyrfState& st, SmyrfWorkspace& ws);
// Accumulates into dq, dk, dv. out is the output the forward wrote (D_i = dO_i · O_i).
void attn_smyrf_bwd(const AttentionInputs& in, const AttentionDims& d, const SmyrfParams& p,
                    const SmyrfState& st, ConstView out, ConstView dout, View dq, View dk, View dv,
                    SmyrfWorkspace& ws);

// Reference projections in double of round `round` for (b, h): qproj (nv) and kproj (mv) are
// F(q_i)·a and G(k_j)·a with the round's direction a (D + 2) as the forward draws it for step
// `step`. The forward's qperm/kperm sort these (tests allow rounding-level ties).
void smyrf_projections_ref(const RefProblem& pr, const SmyrfParams& p, uint64_t step, int64_t b,
                           int64_t h, int64_t round, std::vector<double>& qproj,
                           std::vector<double>& kproj);

// Reference in double with st's partition: every query attends, in every round, the keys of its
// cluster (causal: not after it, but always its own position); the rounds' keys form one softmax.
void attn_smyrf_ref(const RefProblem& pr, const SmyrfState& st, std::vector<double>& out);

// Causal: every row's bucket in every round (smyrf.cpp, "Causal") into bw.
void smyrf_causal_buckets(const AttentionInputs& in, const AttentionDims& d, const SmyrfParams& p,
                          uint64_t step, BucketWindow& bw);

}  // namespace clattn
