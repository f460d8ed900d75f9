// Routing attention (Roy et al. 2020; docs/design.md).
#pragma once

#include <vector>

#include "attention/tile/bucket_window.h"
#include "attention/tile/ref_problem.h"
#include "clattn/attention.h"

namespace clattn {

struct RoutingParams {
  int64_t clusters = 0;   // C (required)
  int64_t window = 0;     // 0 = auto: ceil(N / C) queries and ceil(M / C) keys per cluster
  int iterations = 10;    // spherical k-means rounds (eval mode)
  bool train = false;     // centroids=ema: EMA centroids (layer state) instead of k-means
  float decay = 0.999f;   // EMA decay
  float scale = 0.f;      // 0 = 1/sqrt(Dk)
  uint64_t seed = 0;
};

// The routing of one forward, held fixed for backward. Per (b, h), cluster c has members
// mem[mem_off[c], mem_off[c + 1]) (its `window` queries most similar to the centroid, plus the
// queries no cluster chose whose nearest centroid it is) and keys keys[c·wk, ...) (its window).
struct RoutingState : ContextState {
  int64_t C = 0, wk = 0, cap = 0;  // clusters, key window, member capacity per head
  std::vector<int32_t> keys;       // (B, H, C, wk) key window of each cluster (-1 past the end)
  std::vector<int32_t> nkeys;      // (B, H, C)
  std::vector<int32_t> mem_off;    // (B, H, C + 1) into mem
  std::vector<int32_t> mem;        // (B, H, cap) member queries
  std::vector<float> weight;       // (B, H, cap) 1 / number of clusters the member is in
  std::vector<float> lse2;         // (B, H, cap) the member's log2-sum-exp2 in that cluster
  std::vector<float> centroids;    // (B, H, C, Dk) the unit centroids the routing used
  bool causal = false;             // causal (routing.cpp, "Causal"): bw holds the routing instead
  BucketWindow bw;
  size_t bytes() const override {
    return held_bytes(keys, nkeys, mem_off, mem, weight, lse2, centroids) + bw.bytes();
  }
};

struct RoutingWorkspace;  // per-thread scratch and partial gradients; kept in the caller's Scratch
RoutingWorkspace& routing_workspace(Scratch& scratch);
size_t routing_workspace_bytes(const AttentionDims& d, const RoutingParams& p, Mode mode,
                               int threads);

// ema (H, C, Dk): the EMA centroids with centroids=ema (nullptr with k-means), updated in place
// from this batch when `update` (a training call). Random draws come from (seed, step).
void attn_routing_fwd(const AttentionInputs& in, const AttentionDims& d, const RoutingParams& p,
                      uint64_t step, float* ema, bool update, View out, RoutingState& st,
                      RoutingWorkspace& ws);
void attn_routing_bwd(const AttentionInputs& in, const AttentionDims& d, const RoutingParams& p,
                      const RoutingState& st, ConstView dout, View dq, View dk, View dv,
                      RoutingWorkspace& ws);

// Causal (centroids=ema): every query's and key's nearest centroid of ema (H, C, Dk) into bw;
// with `update` (a training call) the EMA centroids then move towards this batch, as in the
// forward above.
void routing_causal_buckets(const AttentionInputs& in, const AttentionDims& d, const RoutingParams& p,
                            float* ema, bool update, BucketWindow& bw, RoutingWorkspace& ws);

// Reference in double with st's routing: each member attends its cluster's keys (causal: not
// after it, always itself), outputs averaged by weight.
void attn_routing_ref(const RefProblem& pr, const RoutingState& st, std::vector<double>& out);

}  // namespace clattn
