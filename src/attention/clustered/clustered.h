// Clustered and improved-clustered attention (Vyas, Katharopoulos & Fleuret 2020; docs/design.md).
// One pipeline serves both: topk = 0 is plain clustered; topk > 0 adds the improved variant's
// per-cluster recomputation on the centroid's top-k keys.
#pragma once

#include <cstdint>
#include <vector>

#include "clattn/attention.h"
#include "clattn/tensor.h"
#include "cluster/cluster.h"

namespace clattn {

struct ClusteredParams {
  int64_t clusters = 0;    // C (required)
  int bits = 63;           // LSH code length, 1..64
  int iterations = 10;     // Hamming k-means rounds
  bool hash_bias = true;   // thresholds t_b ~ N(0, 1) (else 0)
  bool positional = false; // clustering=positional: contiguous blocks of positions
  int64_t topk = 0;        // 0 = clustered; k > 0 = improved-clustered
  int64_t block = 512;     // causal only: positions per block (causal_clustered.cpp)
  float scale = 0.f;       // 0 = 1/sqrt(Dk)
  uint64_t seed = 0;
};

// What the causal forward leaves for backward (causal_clustered.cpp): per (b, h) and block β the
// clusters of the block's queries, the queries defining each centroid, the centroids' top-k sets,
// and per query the log-sum-exps that combine the prefix and in-block parts. O(N·(D + k)) per
// head, never N × M.
struct CausalClusters {
  int64_t block = 0, nb = 0;        // positions per block, blocks (of key positions 0 .. M)
  int64_t cmax = 0, kmax = 0;       // clusters (C, or block for singletons), top-k per block
  std::vector<int32_t> ncl;         // (BH, nb) clusters of block β (0: no prefix part)
  std::vector<int32_t> member;      // (BH, N) cluster of query i within its block, -1 if none
  std::vector<int32_t> def_order;   // (BH, nb, block) queries defining the centroids, by cluster
  std::vector<int32_t> def_off;     // (BH, nb, cmax + 1) segments of def_order
  std::vector<int32_t> topk_idx;    // (BH, nb, cmax, kmax) T_j, ascending key index
  std::vector<int32_t> ksel;        // (BH, nb) k used in block β: min(topk, prefix keys)
  Tensor qc;                        // (BH, nb, cmax, Dk) centroids
  Tensor lse_c;                     // (BH, nb, cmax) centroid log-sum-exp over the prefix
  Tensor mass;                      // (BH, nb, cmax) improved: m_j
  Tensor resid;                     // (BH, nb, cmax, Dv) R_j (clustered: Vc_j)
  Tensor lzp;                       // (BH, N) log Z of the prefix part (-inf: none)
  Tensor lse;                       // (BH, N) log-sum-exp of the whole row (prefix and block)
  std::vector<Context> inblock;     // (nb) full attention's contexts of the in-block parts
  size_t bytes() const {
    size_t n = held_bytes(ncl, member, def_order, def_off, topk_idx, ksel, qc, lse_c, mass, resid,
                          lzp, lse);
    for (const Context& c : inblock) n += c.bytes();
    return n;
  }
};

// What forward leaves for backward: the discrete choices and the small per-cluster tensors.
// Per (b, h): C_eff clusters, segments of `order` delimited by `offsets`.
struct ClusteredState : ContextState {
  bool causal = false;             // the causal variant's forward filled `cz`, not the fields below
  CausalClusters cz;
  int64_t cmax = 0, kmax = 0;      // C and k capacity per head (strides below)
  std::vector<int32_t> nclusters;  // (B, H) C_eff, 0 when no query or no key is valid
  std::vector<int32_t> order;      // (B, H, N) valid queries sorted by cluster
  std::vector<int32_t> offsets;    // (B, H, cmax + 1)
  std::vector<int32_t> topk_idx;   // (B, H, cmax, kmax) improved: T_j, ascending key index
  std::vector<int32_t> ksel;       // (B, H) k actually used: min(topk, valid keys)
  Tensor qc;                       // (B, H, cmax, Dk) query centroids
  Tensor lse_c;                    // (B, H, cmax) log-sum-exp of centroid logits (natural log)
  Tensor mass;                     // (B, H, cmax) improved: m_j = Σ_{l∈T_j} A_jl
  Tensor lse_m;                    // (B, H, N) improved: per-query log-sum-exp over T_j, by position
  Tensor resid;                    // (B, H, cmax, Dv) Vc_j − Σ_{l∈T_j} A_jl v_l (= Vc_j when k = 0)
  size_t bytes() const override {
    return held_bytes(nclusters, order, offsets, topk_idx, ksel, qc, lse_c, mass, lse_m, resid) +
           cz.bytes();
  }
};

struct ClusteredWorkspace;  // clustered_internal.h; kept in the caller's Scratch
// Upper bound of the Scratch and saved state of one call.
size_t clustered_workspace_bytes(const AttentionDims& d, const ClusteredParams& p, Mode mode,
                                 int threads);

// Forward: clusters every (b, h) (hashing with the planes of rng stream `step`, Hamming k-means,
// counting sort), then the centroid attention and the broadcast (or improved member stage).
// Fills st with everything backward needs.
void attn_clustered_fwd(const AttentionInputs& in, const AttentionDims& d,
                        const ClusteredParams& p, uint64_t step, View out, ClusteredState& st,
                        ClusteredWorkspace& ws);
void attn_clustered_bwd(const AttentionInputs& in, const AttentionDims& d,
                        const ClusteredParams& p, const ClusteredState& st, ConstView dout,
                        View dq, View dk, View dv, ClusteredWorkspace& ws);

// Causal (causal_clustered.cpp): the block design in the header of that file. ctx is the
// caller's Context: the in-block parts run full attention on contexts sharing its Scratch.
void attn_causal_clustered_fwd(const AttentionInputs& in, const AttentionDims& d,
                               const ClusteredParams& p, uint64_t step, View out,
                               ClusteredState& st, Context& ctx);
void attn_causal_clustered_bwd(const AttentionInputs& in, const AttentionDims& d,
                               const ClusteredParams& p, ClusteredState& st, ConstView out,
                               ConstView dout, View dq, View dk, View dv, Context& ctx);
size_t causal_clustered_workspace_bytes(const AttentionDims& d, const ClusteredParams& p,
                                        Mode mode, int threads);

// Reference: the definition in double, with the clusters and top-k sets of st held fixed.
void attn_clustered_ref_fwd(const AttentionInputs& in, const ClusteredParams& p,
                            const ClusteredState& st, View out);

}  // namespace clattn
