// Clustered and improved-clustered attention (Vyas, Katharopoulos & Fleuret 2020; docs/design.md).
// One pipeline serves both: topk = 0 is plain clustered; topk > 0 adds the improved variant's
// per-cluster recomputation on the centroid's top-k keys.
#pragma once

#include <algorithm>
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
  int64_t block = 512;     // causal only: positions per block, attended exactly (causal_clustered.cpp)
  int64_t segment = 4096;  // causal only: positions per segment (clusters rebuilt), a multiple of
                           // block
  float scale = 0.f;       // 0 = 1/sqrt(Dk)
  uint64_t seed = 0;
};

// What the causal forward leaves for backward (causal_clustered.cpp): per (b, h) and segment σ the
// clusters (centroids and the queries defining them), per (b, h) and block β the snapshot of the
// centroid attention over the block's prefix (log-sum-exp, top-k set, m_j, R_j), per query its
// cluster and the log-sum-exps that blend the prefix and in-block parts. O(N·(D + k)) per head,
// never N × M.
struct CausalClusters {
  int64_t block = 0, segment = 0;   // Lb, Ls (positions)
  int64_t nb = 0, ns = 0;           // blocks and segments of key positions 0 .. M
  std::vector<int64_t> seg_start;   // (ns + 1) segment σ is positions [seg_start[σ], seg_start[σ + 1])
  int64_t exact_before = 0;         // E: rows at positions < E are causal full attention
  int64_t cmax = 0, kmax = 0;       // clusters per segment (C), top-k capacity per block
  std::vector<int32_t> ncl;         // (BH, ns) clusters of segment σ (0: no prefix part)
  std::vector<int32_t> member;      // (BH, N) cluster of query i in its segment, -1 if none
  std::vector<int32_t> def_order;   // (BH, ns, Ls) rows of the queries defining the centroids, by cluster
  std::vector<int32_t> def_off;     // (BH, ns, cmax + 1) segments of def_order
  std::vector<int32_t> topk_idx;    // (BH, nb, cmax, kmax) T_j, ascending key index
  std::vector<int32_t> ksel;        // (BH, nb) k used in block β: min(topk, prefix keys); -1: no snapshot
  Tensor qc;                        // (BH, ns, cmax, Dk) centroids
  Tensor lse_c;                     // (BH, nb, cmax) centroid log-sum-exp over the prefix
  Tensor mass;                      // (BH, nb, cmax) improved: m_j
  Tensor resid;                     // (BH, nb, cmax, Dv) R_j (clustered: Vc_j)
  Tensor lzp;                       // (BH, N) log Z of the prefix part (-inf: none)
  Tensor alpha;                     // (BH, N) the prefix part's share Z_pre / (Z_pre + e^lse_in) (0: none)
  Tensor inlse;                     // (BH, N) the in-block part's log-sum-exp (full's kernel)
  Tensor inparts;                   // (2, BH, N) its row max and log2 sum (FullState::parts)
  size_t bytes() const {
    return held_bytes(seg_start, ncl, member, def_order, def_off, topk_idx, ksel, qc, lse_c, mass, resid,
                      lzp, alpha, inlse, inparts);
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

// The parameters of a clustered or improved-clustered Attention (nullptr for other variants).
const ClusteredParams* clustered_attention_params(const Attention& a);

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

// Causal (causal_clustered.cpp): the block and segment design in the header of that file. The
// in-block parts run full attention's kernels on the same Scratch.
void attn_causal_clustered_fwd(const AttentionInputs& in, const AttentionDims& d,
                               const ClusteredParams& p, uint64_t step, View out,
                               ClusteredState& st, Scratch& scratch);
void attn_causal_clustered_bwd(const AttentionInputs& in, const AttentionDims& d,
                               const ClusteredParams& p, const ClusteredState& st, ConstView out,
                               ConstView dout, View dq, View dk, View dv, Scratch& scratch);
size_t causal_clustered_workspace_bytes(const AttentionDims& d, const ClusteredParams& p,
                                        Mode mode, int threads);

// The useful work of a call (clustered_work.cpp; clattn/attention.h, WorkModel).
WorkModel clustered_work(const AttentionDims& d, const ClusteredParams& p, bool causal, Mode mode);
// Bytes of a causal decode step through a KVCache that keeps queries (Attention::decode_bytes).
double causal_decode_bytes(const AttentionDims& d, const ClusteredParams& p, double context, double element_bytes);

// Where the segments of causal clustered attention start (causal_clustered.cpp): 0, Lb, 2·Lb,
// 4·Lb, ... doubling up to segments of Ls, then every Ls — the starts of every segment that begins
// before M, followed by the end of the last one.
std::vector<int64_t> causal_segment_starts(int64_t M, int64_t block, int64_t segment);
// The segment σ holding position pos (0 <= pos < starts.back()) of those starts.
inline int64_t causal_segment_of(const std::vector<int64_t>& starts, int64_t pos) {
  return std::upper_bound(starts.begin(), starts.end(), pos) - starts.begin() - 1;
}

// Reference: the definition in double, with the clusters and top-k sets of st held fixed.
void attn_clustered_ref_fwd(const AttentionInputs& in, const ClusteredParams& p,
                            const ClusteredState& st, View out);

}  // namespace clattn
