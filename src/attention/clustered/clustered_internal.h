// Internals shared by clustered.cpp and improved_clustered.cpp: tile sizes, scratch, and the
// member stage of the improved variant.
#pragma once

#include <cstdint>
#include <vector>

#include "attention/clustered/clustered.h"
#include "attention/tile/topk_select.h"
#include "clattn/threads.h"
#include "clattn/rng.h"
#include "clattn/tensor.h"
#include "cluster/cluster.h"
#include "core/simd.h"

namespace clattn {

inline constexpr int64_t kCb = 64;   // centroid rows per block
inline constexpr int64_t kBc = 512;  // keys per tile of the centroid attention
inline constexpr int64_t kMb = 64;   // member rows per block of the improved member stage

// Per-thread scratch of the clustering steps.
struct ClusterScratch {
  std::vector<uint64_t> codes, centroids;
  std::vector<int32_t> assign;
  std::vector<float> proj;
  cluster::KMeansScratch km;
};

// Steps 1-2 of docs/design.md over n query rows (row stride ldq): contiguous blocks
// (clustering=positional), every query its own cluster (clusters >= n), or LSH codes grouped by
// Hamming k-means drawing from `kstream`. Writes assign (n), each row's cluster; returns the number
// of clusters. Non-causal clustering of a head and causal clustering of a segment's definers.
int64_t assign_clusters(const float* q, int64_t n, int64_t ldq, const ClusteredParams& p,
                        const cluster::LshPlanes& planes, const Rng& rng, uint64_t kstream, int32_t* assign,
                        ClusterScratch& cs);

// Per-thread tiles, sized on first use and reused by later calls.
struct ThreadScratch {
  ClusterScratch cs;                                // hashing and k-means
  Workspace kp, vr;                                 // a K tile's panels, V rows (forward)
  Workspace a, b, c, d, e, f, g, h, i;              // centroid stage
  Workspace kt, ktp, ktr, vt, vtp, vtr, qm, gm, sm, dp, um, dkt, dvt;  // member stage
  Workspace dqp, kvt;  // backward of a split head: dQc per key-tile group; dK_T, dV_T per cluster
  std::vector<Cand> cand;           // (C, 2k) top-k candidates per centroid
  std::vector<int64_t> ncand;       // (C) candidates held
  std::vector<float> thr;           // (C) filter threshold (k-th best so far)
  std::vector<int64_t> cursor;
  size_t bytes() const {
    return held_bytes(cs.codes, cs.centroids, cs.assign, cs.proj, kp, vr, a, b, c, d, e, f, g, h, i,
                      kt, ktp, ktr, vt, vtp, vtr, qm, gm, sm, dp, um, dkt, dvt, dqp, kvt, cand, ncand, thr,
                      cursor) + cs.km.bytes();
  }
};

struct ClusteredWorkspace {
  Workspace kpan;   // (B, Hkv, np, Dk, 64) K panels (backward)
  Workspace vpan;   // (B, Hkv, np, Dv, 64) V panels (backward)
  Workspace krow;   // (B, Hkv, Mp, Dkp) K rows (backward)
  Workspace dkvp;   // (B, H, Mp, Dkp + Dvp) backward with GQA: per-query-head partial dK, dV
  std::vector<ThreadScratch> threads;
  size_t bytes() const {
    size_t n = held_bytes(kpan, vpan, krow, dkvp, threads);
    for (const ThreadScratch& t : threads) n += t.bytes();
    return n;
  }
  void ensure_threads() {
    if (threads.size() < static_cast<size_t>(max_threads()))
      threads.resize(static_cast<size_t>(max_threads()));
  }
};

// The centroid attention's pass over keys [0, nk) of kb (row stride krs, values vr) for
// centroids [c0, c1) of the scaled centroids qcs (C, D), flash-style with key tiles outer (each
// tile is read from memory once and serves every centroid block): per centroid the running max
// m and sum l (log2), alpha the last rescale (C each), the value sums vc (C, Dvp) and, with k > 0,
// the streaming top-k candidates in cands (sc.cand (C, 2k), sc.ncand, sc.thr), their key indices
// offset by kidx0. kt (kBc·D) and s (kCb·kBc) are scratch of the calling thread.
void centroid_pass(const float* kb, int64_t krs, int64_t nk, int64_t D, const float* vrd, int64_t vld, int64_t Dvp,
                   const float* qcs, int64_t c0, int64_t c1, float* m, float* l, float* alpha, float* vc,
                   int64_t k, int64_t kidx0, ThreadScratch& cands, float* kt, float* s);

// Where key gradients of one (b, h) go: straight into dk/dv, or into a per-head partial buffer
// (rows of Dkp + Dvp floats) when several query heads share the key head.
struct KeyGrads {
  float* part;  // (Mp, ld) or nullptr
  int64_t ld;
  View dk, dv;
  int64_t b, hk;
  int64_t voff = 0;  // offset of the dV part inside a partial row (= Dkp)
  void add_k(int64_t j, const float* g, int64_t D, float s) const {
    simd::axpy_row(part ? part + j * ld : dk.ptr(b, hk, j), g, D, s);
  }
  void add_v(int64_t j, const float* g, int64_t Dv, float s) const {
    simd::axpy_row(part ? part + j * ld + voff : dv.ptr(b, hk, j), g, Dv, s);
  }
};

// Improved member stage of one (b, h): O_i = m_j · Σ_{l∈T_j} softmax_T(s q_i·k_l) v_l + R_j for
// every member i of the clusters j in [j_begin, j_end); saves the per-query log-sum-exp in
// st.lse_m. Disjoint cluster ranges write disjoint rows, so they may run on different threads.
void improved_members_fwd(const AttentionInputs& in, const AttentionDims& d, int64_t b, int64_t h,
                          float scale, ClusteredState& st, View out, ThreadScratch& sc, int64_t j_begin,
                          int64_t j_end);
// Its exact backward: accumulates dq of the members and dK, dV of the T_j rows; dm (C) gets
// ∂L/∂m_j = Σ_i dO_i · u_i.
// Clusters [j_begin, j_end) only. With kv_out, cluster j's dK_T, dV_T rows are written to its
// slot kv_out + (j - j_begin)·kw·(Dkp + Dvp), (kw, Dkp) then (kw, Dvp), instead of being added to kg (the caller adds them: dK_T / c and
// m_j dV_T), so that disjoint cluster ranges can run on different threads.
void improved_members_bwd(const AttentionInputs& in, const AttentionDims& d, int64_t b, int64_t h,
                          float scale, const ClusteredState& st, ConstView dout, View dq,
                          const KeyGrads& kg, float* dm, ThreadScratch& sc, int64_t j_begin, int64_t j_end,
                          float* kv_out);

}  // namespace clattn
