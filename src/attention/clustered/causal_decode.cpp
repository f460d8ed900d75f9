// Decoding with causal clustered attention: a call whose KVCache keeps queries computes, for its
// N new queries, the same function a prefill of the whole sequence computes (causal_clustered.cpp's
// definition) — the definers of every segment are read from the cache's queries.
//
// So that a decode step does not redo the prefix work, the cache keeps derived state per (b, h)
// (KVCache::derived, dropped by clear() and truncate()): the clusters of the current segment and
// their running attention over the prefix (the Stream), advanced to the current block's start. A
// step then costs its in-block part (full attention's cached kernel), the nearest centroid, and
// one gather of T_j's k rows; a new block advances the stream by one block (C·Lb), a new segment
// builds clusters from the previous segment's queries and streams the whole prefix once (C·P).
// The stream stops at the same block ends as a prefill's, so it computes the same tiles: a step's
// output equals the prefill's row up to the rounding of the member products.
#include <algorithm>
#include <cmath>
#include <string>

#include "attention/clustered/causal_internal.h"
#include "attention/registry.h"
#include "attention/validate.h"
#include "clattn/kv_cache.h"
#include "clattn/threads.h"

namespace clattn::causal {

namespace {

struct DecodeHead {
  int64_t sigma = -1, ce = 0;               // segment whose clusters are held (-1: none)
  std::vector<float> qc, norms;             // (ce, D), (ce)
  Workspace qcpan;                          // (ceil(ce/64), D, 64)
  Stream st;                                // the centroids' attention over keys [0, st.pos)
  int64_t beta = -1, k = 0;                 // block whose prefix the stream is at
  std::vector<float> lse_c, mass, resid;    // (ce), (ce), (ce, Dv): that block's snapshot
  std::vector<int32_t> topk;                // (ce, kmax)
  size_t bytes() const { return held_bytes(qc, norms, qcpan, lse_c, mass, resid, topk) + st.bytes(); }
};

struct DecodeState final : CacheState {
  std::string key;                 // the attention and call it belongs to (parameters, step, sizes)
  cluster::LshPlanes planes;       // drawn once per key: a pure function of (seed, step)
  std::vector<DecodeHead> heads;   // (B·H)
  Workspace rows;                  // (2, B·H, N) lzp and alpha of the call's rows
  size_t bytes() const override {
    size_t n = key.capacity() + rows.bytes() + held_bytes(planes.panel, planes.thresholds);
    for (const DecodeHead& h : heads) n += h.bytes();
    return n;
  }
};

}  // namespace

void decode_prefix(const AttentionInputs& in, const AttentionDims& d, const ClusteredParams& p,
                   uint64_t step, const Geometry& g, View out, const float* inl, Scratch& scratch) {
  const KVCache& kc = *in.cache;
  const int64_t BH = d.B * d.H, D = d.Dk, Dv = d.Dv;
  DecodeState& ds = kc.derived<DecodeState>();
  const std::string key = detail::concat(p.clusters, ',', p.topk, ',', p.bits, ',', p.iterations, ',', p.hash_bias,
                                         ',', p.positional, ',', p.block, ',', p.segment, ',', p.scale, ',', p.seed,
                                         ',', step, ',', d.B, ',', d.H, ',', D, ',', Dv);
  const Rng rng(p.seed);
  if (ds.key != key || static_cast<int64_t>(ds.heads.size()) != BH) {
    ds.key = key;
    ds.heads.clear();
    ds.heads.resize(static_cast<size_t>(BH));
    ds.planes = p.positional ? cluster::LshPlanes{} : cluster::draw_planes(rng, planes_stream(step), p.bits, D, p.hash_bias);
  }
  const cluster::LshPlanes& planes = ds.planes;
  CausalWorkspace& ws = scratch.get<CausalWorkspace>();
  ws.ensure_threads();
  const ConstView qall = kc.queries();  // (B, H, M, Dk): every position's query, this call's too
  float* rowbuf = ds.rows.floats(static_cast<size_t>(2 * BH * d.N));  // (2, BH, N) lzp, alpha
  const bool improved = p.topk > 0;
  const int64_t kmax = improved ? std::max<int64_t>(1, p.topk) : 0;
  auto head = [&](int64_t t, int thread, bool split) {
    const int64_t b = t / d.H, h = t % d.H, hk = h / d.group();
    const int64_t nv = valid_queries(in, d, b), mv = valid_keys(in, d, b);
    DecodeHead& dh = ds.heads[static_cast<size_t>(t)];
    CausalThread& sc = ws.threads[static_cast<size_t>(thread)];
    const KeyOperands ko = cache_operands(kc, b, hk);
    float* tile = sc.tile.floats(static_cast<size_t>(kCb * kBc));
    for (int64_t ra = std::clamp(g.exact_before - g.off, int64_t{0}, nv); ra < nv;) {
      const int64_t beta = (ra + g.off) / g.Lb, rb = std::min(nv, (beta + 1) * g.Lb - g.off);
      const int64_t sigma = causal_segment_of(g.start, beta * g.Lb);
      if (dh.sigma != sigma) {  // this segment's clusters, from the previous segment's queries
        const int64_t q0 = g.start[static_cast<size_t>(sigma - 1)], np = g.start[static_cast<size_t>(sigma)] - q0;
        sc.assign.resize(static_cast<size_t>(std::max(np, rb - ra)));
        dh.qc.resize(static_cast<size_t>(std::min(p.clusters, np) * D));
        dh.ce = segment_clusters(qall.ptr(b, h, q0), np, qall.stride(2), D, p, planes, rng, kmeans_stream(step, t, sigma),
                                 sc.assign.data(), dh.qc.data(), sc.cs);
        pack_centroids(dh.qc.data(), dh.ce, D, dh.norms, dh.qcpan);
        dh.st.reset(dh.qc.data(), dh.ce, D, Dv, p.topk, g.log2_scale);
        dh.sigma = sigma;
        dh.beta = -1;
      }
      const int64_t P = std::min(beta * g.Lb, mv);
      if (dh.beta != beta) {  // the stream at this block's prefix (from 0 again if it went past)
        if (P < dh.st.pos) dh.st.reset(dh.qc.data(), dh.ce, D, Dv, p.topk, g.log2_scale);
        if (split) {
          dh.st.advance_over_team(P, ko, ws.threads);
        } else {
          dh.st.advance(P, ko, tile);
        }
        dh.lse_c.resize(static_cast<size_t>(dh.ce));
        dh.mass.resize(static_cast<size_t>(dh.ce));
        dh.resid.resize(static_cast<size_t>(dh.ce * Dv));
        dh.topk.resize(static_cast<size_t>(dh.ce * kmax));
        dh.beta = beta;
      }
      // The block's new rows: nearest centroids, then the member stage as in a prefill.
      sc.assign.resize(static_cast<size_t>(std::max<int64_t>(rb - ra, static_cast<int64_t>(sc.assign.size()))));
      int32_t* mem = sc.assign.data();  // (rb − ra) the rows' clusters
      nearest_centroids(in.q.ptr(b, h, ra), rb - ra, in.q.stride(2), D, dh.qcpan.data(), dh.norms.data(), dh.ce, mem,
                        sc.near);
      const Snapshot snap{dh.lse_c.data(), dh.mass.data(), dh.resid.data(), improved ? dh.topk.data() : nullptr, kmax};
      block_fwd(dh.st, in, ko, b, h, hk, ra, rb, mem, snap, dh.k, inl + t * d.N, g.log2_scale, out, rowbuf + t * d.N,
                rowbuf + (BH + t) * d.N, sc.ms);
      ra = rb;
    }
  };
  // B·H below the thread count: one head at a time, its stream (the one step that reads the
  // whole prefix, C·P at a new segment) over the team; the rest of a step is a few rows.
  if (split_tasks(BH)) {
    for (int64_t t = 0; t < BH; ++t) head(t, 0, true);
  } else {
    parallel_for(BH, [&](int64_t t, int thread) { head(t, thread, false); });
  }
}

}  // namespace clattn::causal
