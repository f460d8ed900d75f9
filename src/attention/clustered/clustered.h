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
  float scale = 0.f;       // 0 = 1/sqrt(Dk)
  uint64_t seed = 0;
};

// What forward leaves for backward: the discrete choices and the small per-cluster tensors.
// Per (b, h): C_eff clusters, segments of `order` delimited by `offsets`.
struct ClusteredState : ContextState {
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
    return held_bytes(nclusters, order, offsets, topk_idx, ksel, qc, lse_c, mass, lse_m, resid);
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

// Reference: the definition in double, with the clusters and top-k sets of st held fixed.
void attn_clustered_ref_fwd(const AttentionInputs& in, const ClusteredParams& p,
                            const ClusteredState& st, View out);

}  // namespace clattn
