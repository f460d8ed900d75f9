// Internals of causal clustered attention shared by its forward (causal_clustered.cpp,
// causal_segment.cpp), backward (causal_backward.cpp) and decoding (causal_decode.cpp): the
// clusters of a segment, the running centroid attention over a growing prefix, and the member stage
// of one block. The definition they implement is in causal_clustered.cpp's header.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "attention/clustered/clustered.h"
#include "attention/clustered/clustered_internal.h"
#include "attention/tile/topk_select.h"
#include "clattn/kv_cache.h"
#include "clattn/rng.h"
#include "cluster/cluster.h"
#include "core/microkernel.h"

namespace clattn::causal {

// The sizes every stage reads, fixed per call.
struct Geometry {
  int64_t Lb = 0, Ls = 0;      // block and (longest) segment lengths (positions)
  int64_t nb = 0, ns = 0;      // blocks and segments of key positions 0 .. M
  std::vector<int64_t> start;  // (ns + 1) causal_segment_starts
  int64_t exact_before = 0;    // rows at positions < exact_before are exact: start[s0], or none clustered
  int64_t s0 = 0;              // the first clustered segment (ns: all exact)
  int64_t off = 0;             // M − N: query i sits at position i + off
  float scale = 0.f;           // s
  float log2_scale = 0.f;      // s · log2 e: logits in log2 units
};

// Where one (b, kv head) reads its keys and values: K in panels (np, Dk, 64) and V rows (M, vld),
// vld >= Dv with zero padding — full's packed operands, or a KVCache's own. A 16-bit cache gives
// the same layouts in f16 or bf16 bits (kpan16, vrow16) and K's rows (M, kld) for the gathers of
// T_j; the f32 pointers are then null and the kernels widen in registers.
struct KeyOperands {
  const float* kpan = nullptr;
  const float* vrow = nullptr;
  int64_t vld = 0;
  const uint16_t* kpan16 = nullptr;
  const uint16_t* vrow16 = nullptr;
  const uint16_t* krow16 = nullptr;
  int64_t kld = 0;
  mk::Half half = mk::Half::f16;
  bool is16() const { return kpan16 != nullptr; }
};

// A KVCache's own operands for (b, kv head): f32 panels and rows, or a 16-bit cache's (whose K
// rows it holds when it keeps queries).
KeyOperands cache_operands(const KVCache& kc, int64_t b, int64_t hk);

// The clusters of one segment: hashing of its definers, Hamming k-means, centroid means.
// Returns the number of clusters ce (<= C); assign (np) gets each definer's cluster and qc (ce, Dk)
// the centroids (the definers' means in feature space). k-means draws from `kstream`.
int64_t segment_clusters(const float* qdef, int64_t np, int64_t ldq, int64_t D,
                         const ClusteredParams& p, const cluster::LshPlanes& planes, const Rng& rng,
                         uint64_t kstream, int32_t* assign, float* qc, ClusterScratch& cs);

// The centroids qc (ce, D) as nearest_centroids reads them: norms (ce) = |qc_j|² and pan
// (ceil(ce/64), D, 64) their panels.
void pack_centroids(const float* qc, int64_t ce, int64_t D, std::vector<float>& norms, Workspace& pan);
// Nearest centroid (Euclidean; first minimum wins) of n query rows: argmin_j |qc_j|² − 2 q·qc_j as
// one tile product against the centroid panels of pack_centroids; ws holds the scores.
void nearest_centroids(const float* q, int64_t n, int64_t ldq, int64_t D, const float* qcpan,
                       const float* norms, int64_t ce, int32_t* out, Workspace& ws);

struct CausalThread;

// The running centroid attention of a segment's clusters over keys [0, pos): per centroid the
// online softmax of FlashAttention (max m in log2 units, sum l, unnormalised accumulator) and,
// improved, the streaming top-k candidates (2k per centroid). Tiles are cut at multiples of kBc
// and at each requested end, so a prefill and a decoding cache that stop at the same block ends
// see the same tiles and compute the same numbers.
struct Stream {
  int64_t ce = 0, topk = 0, pos = 0, D = 0, Dv = 0;
  std::vector<float> qcs;      // (ce, D) centroids · c
  std::vector<float> m, l;     // (ce)
  Workspace acc;               // (ce, Dvp)
  std::vector<Cand> cand;      // (ce, 2·topk)
  std::vector<int64_t> ncand;  // (ce)
  std::vector<float> thr;      // (ce)
  void reset(const float* qc, int64_t ce, int64_t D, int64_t Dv, int64_t topk, float c);
  // Streams keys [pos, to) into every centroid's state; tile holds kCb·kBc floats.
  void advance(int64_t to, const KeyOperands& ko, float* tile);
  // The same, its blocks of kCb centroids over the team (each thread's own tile): equal bit for bit,
  // since a centroid's state reads its own row only.
  void advance_over_team(int64_t to, const KeyOperands& ko, std::vector<CausalThread>& team);
  size_t bytes() const { return held_bytes(qcs, m, l, acc, cand, ncand, thr); }

 private:
  // Centroids [j0, j0 + kCb) over keys [pos, to); acc is (ce, Dvp).
  void advance_rows(int64_t j0, int64_t to, const KeyOperands& ko, float* acc, float* tile);
};

// What a block keeps of the stream at its prefix P (per cluster of the segment): the log-sum-exp
// (natural log) of every centroid, and for the clusters the block's queries join, improved's T_j
// (k = min(topk, P) keys in key order) with m_j and R_j = Vc_j − Σ_T A v, or clustered's
// R_j = Vc_j. Clusters no query of the block joins keep m_j = 0 and R_j = 0.
struct Snapshot {
  float* lse_c;   // (ce)
  float* mass;    // (ce)
  float* resid;   // (ce, Dv)
  int32_t* topk;  // (ce, kmax)
  int64_t kmax;
};

// T_j's rows gathered for the member products (improved): f32, or the 16-bit bits of a 16-bit
// cache (kt16, vt16, same shapes), which the products widen in registers.
struct MemberScratch {
  std::vector<int32_t> order, off, used;
  Workspace kt, vt, qm, sm, um, tmp;
  std::vector<uint16_t> kt16, vt16;
  bool half = false;  // the gathered rows are kt16, vt16
  mk::Half hf = mk::Half::f16;
  size_t bytes() const { return held_bytes(order, off, used, kt, vt, qm, sm, um, tmp, kt16, vt16); }
};

// Every centroid's log-sum-exp at the stream's position; returns k = min(topk, P) (0: clustered).
int64_t snapshot_lse(const Stream& st, const Snapshot& out);
// Cluster j's T_j from the stream at its position: the k = min(topk, P) best keys so far, in key
// order, into out.topk (improved only; the running candidates go on from there).
void select_topk(Stream& st, int64_t j, const Snapshot& out);
// Completes cluster j's snapshot (m_j, R_j; T_j already selected) and, improved, gathers T_j's
// rows into sc as K_Tᵀ (D, kw) and V_T (kw, Dvp), kw = round_up(k, 16): the operands of
// cluster_members_fwd. next (k indices, or nullptr) are the rows the next call will gather:
// requested now, so their misses overlap this cluster's work.
void finish_cluster(const Stream& st, int64_t j, int64_t k, ConstView kh, ConstView vh, const KeyOperands& ko,
                    const Snapshot& out, const int32_t* next, MemberScratch& sc);
// The prefix part of the members mi[0, n) (rows ra + mi[r]) of cluster j, T_j's rows in sc, blended
// into out, which holds the in-block part with its log-sum-exp inl (per row, −inf when empty).
// Writes lzp (log Z_pre) and alpha (the prefix part's share) of those rows.
void cluster_members_fwd(const AttentionInputs& in, int64_t b, int64_t h, int64_t ra, const int32_t* mi,
                         int64_t n, int64_t j, int64_t k, bool improved, const Snapshot& snap,
                         const float* inl, float c, View out, float* lzp, float* alpha, MemberScratch& sc);
// A block of the prefill: the snapshot and the members of rows [ra, rb) (row r in cluster
// mem[r − ra]); T_j's rows come from in.k, in.v, or from ko when it is a 16-bit cache's.
void block_fwd(Stream& st, const AttentionInputs& in, const KeyOperands& ko, int64_t b, int64_t h, int64_t hk, int64_t ra,
               int64_t rb, const int32_t* mem, const Snapshot& snap, int64_t& k, const float* inl,
               float c, View out, float* lzp, float* alpha, MemberScratch& sc);

// Per-thread scratch of the prefix stages, forward and backward.
struct CausalThread {
  ClusterScratch cs;
  std::vector<int32_t> assign;            // (Ls) definers' clusters
  Workspace qcpan, near;                  // centroid panels, nearest-centroid scores
  std::vector<float> norms;               // (C) |qc|²
  Stream stream;
  Workspace tile;                         // (kCb, kBc) the stream's score tile
  MemberScratch ms;
  // Backward.
  Workspace g, dz, delta, qcs, am, da, dkacc, dvacc, dqc, tmp, kgt, vgt, dkt, dvt;
  Workspace dqspan;  // (ceil(M / kSpan), C, Dkp) the dense pass's dQc, per span of keys
  std::vector<int32_t> morder, moff;
  std::vector<char> has;
  size_t bytes() const {
    return held_bytes(assign, qcpan, near, norms, tile, g, dz, delta, qcs, am, da, dkacc, dvacc, dqc, tmp,
                      kgt, vgt, dkt, dvt, dqspan, morder, moff, has) +
           cs.km.bytes() + held_bytes(cs.codes, cs.centroids, cs.assign, cs.proj) + stream.bytes() + ms.bytes();
  }
};

// A task of the prefill: segment sigma of head t, or (sigma < 0) exact rows [r0, r1) of head t.
struct Task {
  int64_t t, sigma, r0, r1;
};

struct CausalWorkspace {
  std::vector<CausalThread> threads;
  std::vector<Task> tasks;
  Workspace dscale;  // (B, H, N) backward: each row's in-block share 1 − α_i
  Workspace part;    // (B, H, Mp, Dkp + Dvp) backward with GQA: per-query-head partial dK, dV
  size_t bytes() const {
    size_t n = held_bytes(dscale, part, tasks);
    for (const CausalThread& t : threads) n += t.bytes();
    return n;
  }
  void ensure_threads();
};

// The geometry of a call (exact_before from the available queries: causal_clustered.cpp).
Geometry geometry(const AttentionInputs& in, const AttentionDims& d, const ClusteredParams& p);

// The rows [ra, rb) of segment σ's valid queries, clipped to [0, nv).
struct Rows {
  int64_t a, b;
};
inline Rows segment_rows(const Geometry& g, int64_t sigma, int64_t nv) {
  return {std::clamp(g.start[static_cast<size_t>(sigma)] - g.off, int64_t{0}, nv),
          std::clamp(g.start[static_cast<size_t>(sigma + 1)] - g.off, int64_t{0}, nv)};
}
inline Rows block_rows(const Geometry& g, int64_t beta, Rows seg) {
  return {std::clamp(beta * g.Lb - g.off, seg.a, seg.b), std::clamp((beta + 1) * g.Lb - g.off, seg.a, seg.b)};
}

// Decoding (causal_decode.cpp): the prefix parts of the call's rows when its KVCache keeps
// queries, from the cache's derived state; out holds the in-block parts.
void decode_prefix(const AttentionInputs& in, const AttentionDims& d, const ClusteredParams& p,
                   uint64_t step, const Geometry& g, View out, const float* inl, Scratch& scratch);

// Keys per span of the backward's dense pass: the unit it splits over the team.
inline constexpr int64_t kSpan = 4 * kBc;

// Backward of the prefix parts of head t (causal_backward.cpp): members, centroid attention over
// every block's prefix, and the definers through the centroid means, on ws.threads[owner]; with
// `split` the dense pass over the prefix's keys runs on the whole team (B·H below the thread
// count), with the same result.
void prefix_bwd(const AttentionInputs& in, const AttentionDims& d, const ClusteredParams& p,
                const Geometry& g, const CausalClusters& cz, int64_t t, ConstView out,
                ConstView dout, View dq, const KeyGrads& kg, const float* kpan, const float* vpan,
                const float* krow, int64_t Mp, CausalWorkspace& ws, int owner, bool split);

// The log-sum-exp of row i's in-block part from full's saved lse and parts: −inf when it saw no
// key (full's +inf marker).
inline float inblock_lse(const float* lse, const float* pm, int64_t at) {
  return pm[at] == std::numeric_limits<float>::infinity() ? -std::numeric_limits<float>::infinity() : lse[at];
}

// The k-means stream of segment σ of head t (b·H + h): a pure function of (step, t, σ).
inline uint64_t kmeans_stream(uint64_t step, int64_t t, int64_t sigma) {
  return ((step * 4 + 3) << 32) ^ (static_cast<uint64_t>(t) * 0x9E3779B1ull + static_cast<uint64_t>(sigma));
}
// The LSH planes of a call: from (seed, step), as non-causal clustered.
inline uint64_t planes_stream(uint64_t step) { return (step * 4) << 32; }

}  // namespace clattn::causal
