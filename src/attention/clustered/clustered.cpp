// Clustered attention: queries grouped by Hamming k-means on LSH codes, one attention per
// centroid, broadcast to the members (docs/design.md). The centroid attention runs flash-style over key
// tiles (memory O(C·D), never C×M), and with topk > 0 also keeps each centroid's k best keys and
// hands them to the improved variant's member stage (improved_clustered.cpp).
//
// Where we differ from the reference (fast-transformers): planes and centroid seeds come from a
// seeded counter-based rng; initial centroids are distinct codes; C > N is allowed (each query is
// then its own cluster, which is exact); key padding is honoured per head and cluster; work is
// parallel over (batch × head), not batch only; memory is O((N + M)·D), not O(C·M) float masks.
#include "attention/validate.h"
#include "attention/clustered/clustered.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "attention/clustered/clustered_internal.h"
#include "attention/tile/tile_ops.h"
#include "attention/tile/topk_select.h"
#include "attention/tile/grad_util.h"
#include "attention/registry.h"
#include "clattn/threads.h"
#include "core/microkernel.h"

namespace clattn {

using mk::kPanel;
using mk::round_up;
using tile::kInf;
using tile::kLn2;
using tile::kLog2e;


namespace {

// Rng streams: (step, purpose, head) never collide for realistic step counts.
uint64_t stream_of(uint64_t step, uint64_t purpose, uint64_t head) {
  return ((step * 4 + purpose) << 32) + head;
}

}  // namespace

int64_t assign_clusters(const float* q, int64_t n, int64_t ldq, const ClusteredParams& p,
                        const cluster::LshPlanes& planes, const Rng& rng, uint64_t kstream, int32_t* assign,
                        ClusterScratch& cs) {
  if (p.positional) {
    const int64_t ce = std::min(p.clusters, n);
    for (int64_t i = 0; i < n; ++i) assign[i] = static_cast<int32_t>(i * ce / n);
    return ce;
  }
  if (p.clusters >= n) {  // every query its own cluster: exact attention
    std::iota(assign, assign + n, 0);
    return n;
  }
  cs.codes.resize(static_cast<size_t>(n));
  cs.centroids.resize(static_cast<size_t>(p.clusters));
  cs.proj.resize(static_cast<size_t>(cluster::kHashBlock * kPanel));
  cluster::hash_codes(q, n, ldq, planes, cs.codes.data(), cs.proj.data());
  return cluster::hamming_kmeans(cs.codes.data(), n, p.clusters, p.iterations, rng, kstream, assign,
                                 cs.centroids.data(), cs.km);
}

namespace {

// Steps 1-3 of docs/design.md for one (b, h): hash the valid queries, Hamming k-means, counting sort
// into st's segments. Returns C_eff (0 when no query or no key is valid). With `split` (called
// outside a parallel region, the head alone on the team) the hashing runs over row blocks on every
// thread, each with its own projection scratch, and k-means splits its assignment passes itself;
// every code and cluster is the one the single-thread path gives.
int64_t assign_head(const AttentionInputs& in, const AttentionDims& d, const ClusteredParams& p,
                    uint64_t step, const Rng& rng, const cluster::LshPlanes& planes, int64_t t,
                    ClusteredState& st, ClusterScratch& sc, bool split, ClusteredWorkspace& ws) {
  const int64_t b = t / d.H, h = t % d.H;
  const int64_t nv = valid_queries(in, d, b), mv = valid_keys(in, d, b);
  if (nv == 0 || mv == 0) return 0;  // every output row of this head is 0
  sc.assign.resize(static_cast<size_t>(nv));
  int64_t ce;
  const uint64_t kstream = stream_of(step, 1, static_cast<uint64_t>(t));
  if (split && !p.positional && p.clusters < nv) {
    sc.codes.resize(static_cast<size_t>(nv));
    sc.centroids.resize(static_cast<size_t>(p.clusters));
    const int64_t nblocks = (nv + cluster::kHashBlock - 1) / cluster::kHashBlock;
    parallel_for(nblocks, [&](int64_t blk, int thread) {
      std::vector<float>& proj = ws.threads[static_cast<size_t>(thread)].cs.proj;  // (kHashBlock, 64)
      proj.resize(static_cast<size_t>(cluster::kHashBlock * kPanel));
      const int64_t r0 = blk * cluster::kHashBlock, rows = std::min(cluster::kHashBlock, nv - r0);
      cluster::hash_codes(in.q.ptr(b, h, r0), rows, in.q.stride(2), planes, sc.codes.data() + r0, proj.data());
    });
    ce = cluster::hamming_kmeans(sc.codes.data(), nv, p.clusters, p.iterations, rng, kstream, sc.assign.data(),
                                 sc.centroids.data(), sc.km);
  } else {
    ce = assign_clusters(in.q.ptr(b, h, 0), nv, in.q.stride(2), p, planes, rng, kstream, sc.assign.data(), sc);
  }
  cluster::counting_sort(sc.assign.data(), nv, ce, st.order.data() + t * d.N,
                         st.offsets.data() + t * (st.cmax + 1));
  return ce;
}

}  // namespace

namespace {

// Qc_j = mean of the member queries of every cluster: (ce, Dk) rows into qc. One pass over the
// queries in position order (assign (nv) = cluster of each), so q streams from memory instead of
// being read in cluster order. Split, the columns are cut into one span per thread (whole cache
// lines of each row: each thread reads its lines of q once): every element is still summed in
// position order, so the means equal the single-thread ones bit for bit. (Per cluster in parallel
// it read q in cluster order and took twice as long on 2 threads; it was the serial step of a
// head alone on the team, ~1 ms of 14 at N = 32768.)
void centroids(const AttentionInputs& in, int64_t b, int64_t h, int64_t Dk, int64_t ce, int64_t nv,
               const int32_t* assign, const int32_t* off, float* qc, bool split, int thread) {
  const int64_t cols = split ? round_up((Dk + max_threads() - 1) / max_threads(), 16) : Dk;
  const int64_t spans = (Dk + cols - 1) / cols;
  split_for(split && spans > 1, spans, thread, [&](int64_t x, int) {
    const int64_t e0 = x * cols, w = std::min(cols, Dk - e0);
    for (int64_t j = 0; j < ce; ++j) std::fill(qc + j * Dk + e0, qc + j * Dk + e0 + w, 0.f);
    for (int64_t i = 0; i < nv; ++i) simd::axpy_row(qc + assign[i] * Dk + e0, in.q.ptr(b, h, i) + e0, w);
    for (int64_t j = 0; j < ce; ++j) {
      const int64_t n = off[j + 1] - off[j];
      if (n > 0)
        for (int64_t e = e0; e < e0 + w; ++e) qc[j * Dk + e] /= static_cast<float>(n);
    }
  });
}

}  // namespace

void centroid_pass(const float* kb, int64_t krs, int64_t nk, int64_t D, const float* vrd, int64_t vld, int64_t Dvp,
                   const float* qcs, int64_t c0, int64_t c1, float* m, float* l, float* alpha, float* vc,
                   int64_t k, int64_t kidx0, ThreadScratch& cands, float* kt, float* s) {
  for (int64_t k0 = 0; k0 < nk; k0 += kBc) {
    const int64_t bc = std::min(kBc, nk - k0), npan = (bc + kPanel - 1) / kPanel, width = npan * kPanel;
    mk::pack_panels(kb + k0 * krs, bc, D, krs, kt);  // (8, D, 64) this key tile
    for (int64_t j0 = c0; j0 < c1; j0 += kCb) {
      const int64_t rows = std::min(kCb, c1 - j0);
      mk::gemm_abt(rows, npan, D, qcs + j0 * D, D, kt, s, kBc);  // (Cb, Bc) scores, then P
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t j = j0 + r;
        float* row = s + r * kBc;
        tile::mask_tail(row, width, bc);
        if (k > 0)
          top_scan(row, width, kidx0 + k0, cands.cand.data() + j * 2 * k, cands.ncand[static_cast<size_t>(j)],
                   cands.thr[static_cast<size_t>(j)], k);
        alpha[j] = tile::online_softmax_row(row, width, m[j], l[j]);
      }
      mk::gemm_ab(rows, Dvp, bc, s, kBc, 1, vrd + k0 * vld, vld, vc + j0 * Dvp, Dvp, alpha + j0);
    }
  }
}

void attn_clustered_fwd(const AttentionInputs& in, const AttentionDims& d,
                        const ClusteredParams& p, uint64_t step, View out, ClusteredState& st,
                        ClusteredWorkspace& ws) {
  const int64_t D = d.Dk, Dv = d.Dv, BH = d.B * d.H;
  st.cmax = std::max<int64_t>(1, std::min(p.clusters, d.N));
  st.nclusters.assign(static_cast<size_t>(BH), 0);
  st.order.resize(static_cast<size_t>(BH * d.N));
  st.offsets.assign(static_cast<size_t>(BH * (st.cmax + 1)), 0);
  const int64_t cmax = st.cmax;
  const Rng rng(p.seed);
  cluster::LshPlanes planes;  // one draw per step, shared by every head
  if (!p.positional) planes = cluster::draw_planes(rng, stream_of(step, 0, 0), p.bits, D, p.hash_bias);
  const int64_t Dvp = round_up(Dv, mk::kLanes);
  const float scale = softmax_scale(p.scale, D);
  const float c = scale * kLog2e;
  const bool improved = p.topk > 0;
  st.kmax = improved ? std::max<int64_t>(1, std::min(p.topk, d.M)) : 0;
  st.qc.resize(Shape{d.B, d.H, cmax, D});
  st.lse_c.resize(Shape{d.B, d.H, cmax});
  st.resid.resize(Shape{d.B, d.H, cmax, Dv});
  st.mass.resize(Shape{d.B, d.H, cmax});
  st.ksel.assign(static_cast<size_t>(BH), 0);
  if (improved) {
    st.topk_idx.resize(static_cast<size_t>(BH * cmax * st.kmax));
    st.lse_m.resize(Shape{d.B, d.H, d.N});
  }
  ws.ensure_threads();

  // One task per (b, h) runs the whole pipeline: one barrier per step, and the head's packed keys
  // live in per-thread scratch instead of a (B, Hkv, M, D) buffer. When B·H cannot fill the team,
  // the heads run one after another and each phase of a head is split over the team instead
  // (`split`): hashing and k-means over query blocks, the centroid attention over blocks of
  // centroids (each thread packs the key tiles it reads), the top-k and residual finish over
  // centroids, the member stage over clusters (improved) or query blocks. Every row is computed by
  // the same operations in the same order either way, so the results do not depend on the split.
  auto head = [&](int64_t t, int owner, bool split) {
    const int64_t b = t / d.H, h = t % d.H, hk = h / d.group();
    const int64_t nv = valid_queries(in, d, b), mv = valid_keys(in, d, b);
    ThreadScratch& sc = ws.threads[static_cast<size_t>(owner)];
    const int64_t ce = assign_head(in, d, p, step, rng, planes, t, st, sc.cs, split, ws);
    st.nclusters[static_cast<size_t>(t)] = static_cast<int32_t>(ce);
    for (int64_t i = ce > 0 ? nv : 0; i < d.N; ++i)  // padded rows, or all rows when nothing is visible
      std::memset(out.ptr(b, h, i), 0, sizeof(float) * static_cast<size_t>(Dv));
    if (ce == 0) return;
    const int32_t* off = st.offsets.data() + t * (cmax + 1);
    float* qc = st.qc.data() + t * cmax * D;        // (cmax, D)
    float* lse_c = st.lse_c.data() + t * cmax;      // (cmax)
    float* resid = st.resid.data() + t * cmax * Dv; // (cmax, Dv)
    float* mass = st.mass.data() + t * cmax;        // (cmax)
    const int64_t k = improved ? std::min(p.topk, mv) : 0;
    st.ksel[static_cast<size_t>(t)] = static_cast<int32_t>(k);
    const int32_t* assign = sc.cs.assign.data();  // (nv) cluster of each valid query
    centroids(in, b, h, D, ce, nv, assign, off, qc, split, owner);
    // V rows for Vc += P·V: in place when Dv is a multiple of 16, else a padded copy.
    const mk::RowsOperand vr = mk::rows_operand(in.v.ptr(b, hk, 0), mv, Dv, in.v.stride(2),
                                                sc.vr.floats(static_cast<size_t>(std::max<int64_t>(1, mk::rows_operand_size(mv, Dv)))));
    // Per centroid, shared by the threads of a split head (each writes its own rows):
    float* qcs = sc.a.floats(static_cast<size_t>(ce * D));       // (C, D) Qc·c
    float* vc = sc.c.floats(static_cast<size_t>(ce * Dvp));      // (C, Dvp) Vc accumulators
    float* rs = sc.d.floats(static_cast<size_t>(3 * ce));        // m, l, alpha: (C) each
    float *m = rs, *l = rs + ce, *alpha = rs + 2 * ce;
    if (improved) sc.cand.resize(static_cast<size_t>(ce * 2 * k));
    sc.ncand.assign(static_cast<size_t>(ce), 0);
    sc.thr.assign(static_cast<size_t>(ce), -kInf);
    mk::pack_rows(qc, ce, D, D, qcs, ce, D, c);
    std::fill(m, m + ce, -kInf);
    std::fill(l, l + ce, 0.f);
    std::memset(vc, 0, sizeof(float) * static_cast<size_t>(ce * Dvp));
    // Ac = softmax(s·Qc·Kᵀ) over valid keys, Vc = Ac·V, flash-style, for centroids [c0, c1). Key
    // tiles outer: each tile of K is read from memory once per call, packed while it is in cache,
    // and serves every centroid block of the range.
    auto centroid_range = [&](int64_t c0, int64_t c1, ThreadScratch& own) {
      centroid_pass(in.k.ptr(b, hk, 0), in.k.stride(2), mv, D, vr.data, vr.ld, Dvp, qcs, c0, c1, m, l, alpha, vc, k, 0,
                    sc, own.kp.floats(static_cast<size_t>(kBc * D)), own.b.floats(static_cast<size_t>(kCb * kBc)));
    };
    // Per centroid: lse, R_j and (improved) T_j with its mass.
    auto finish = [&](int64_t j) {
      const float inv = 1.f / l[j];  // l > 0: mv >= 1 keys are visible
      const float lse2 = m[j] + std::log2(l[j]);
      lse_c[j] = lse2 * kLn2;
      float* res = resid + j * Dv;
      for (int64_t e = 0; e < Dv; ++e) res[e] = vc[j * Dvp + e] * inv;
      mass[j] = 0.f;
      if (!improved) return;
      // T_j: the k best centroid scores, ascending key index; m_j and R_j = Vc_j − Σ_T A v.
      Cand* cand = sc.cand.data() + j * 2 * k;
      top_compact(cand, sc.ncand[static_cast<size_t>(j)], k);
      int32_t* tk = st.topk_idx.data() + (t * cmax + j) * st.kmax;
      for (int64_t x = 0; x < k; ++x) tk[x] = cand[x].i;
      std::sort(tk, tk + k);
      if (k == mv) {  // T_j holds every key: m_j = 1, R_j = 0 exactly
        mass[j] = 1.f;
        std::fill(res, res + Dv, 0.f);
        return;
      }
      double msum = 0;
      for (int64_t x = 0; x < k; ++x) {
        const float a = tile::prob(cand[x].v, lse2);
        msum += a;
        simd::axpy_row(res, in.v.ptr(b, hk, cand[x].i), Dv, -a);
      }
      mass[j] = static_cast<float>(msum);
    };
    if (split) {
      // One even block of centroids per thread: each packs the key tiles and reads V itself, so
      // more blocks cost more of that (measured: 4 blocks of 25 rows gave 1.44x on 2 threads, 2
      // of 50 rows 1.7x).
      const int64_t blocks = std::min<int64_t>(ce, max_threads()), per = (ce + blocks - 1) / blocks;
      parallel_for(blocks, [&](int64_t x, int thread) {
        if (x * per < ce) centroid_range(x * per, std::min(ce, (x + 1) * per), ws.threads[static_cast<size_t>(thread)]);
      });
      parallel_for(ce, [&](int64_t j) { finish(j); });
    } else {
      centroid_range(0, ce, sc);
      for (int64_t j = 0; j < ce; ++j) finish(j);
    }
    // Step 6: members receive their centroid's output (improved: recomputed on T_j).
    if (improved) {
      if (split) {
        parallel_for(ce, [&](int64_t j, int thread) {
          improved_members_fwd(in, d, b, h, scale, st, out, ws.threads[static_cast<size_t>(thread)], j, j + 1);
        });
      } else {
        improved_members_fwd(in, d, b, h, scale, st, out, sc, 0, ce);
      }
    } else {
      // In position order: out streams to memory; the (ce, Dv) centroid outputs stay in cache.
      auto broadcast = [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i)
          std::memcpy(out.ptr(b, h, i), resid + assign[i] * Dv, sizeof(float) * static_cast<size_t>(Dv));
      };
      if (split) {
        constexpr int64_t kRows = 1024;
        parallel_for((nv + kRows - 1) / kRows, [&](int64_t x) { broadcast(x * kRows, std::min(nv, (x + 1) * kRows)); });
      } else {
        broadcast(0, nv);
      }
    }
  };
  if (!split_tasks(BH)) {
    parallel_for(BH, [&](int64_t t, int thread) { head(t, thread, false); });
  } else {
    for (int64_t t = 0; t < BH; ++t) head(t, thread_id(), true);
  }
}

void attn_clustered_bwd(const AttentionInputs& in, const AttentionDims& d,
                        const ClusteredParams& p, const ClusteredState& st, ConstView dout,
                        View dq, View dk, View dv, ClusteredWorkspace& ws) {
  const int64_t D = d.Dk, Dv = d.Dv, BH = d.B * d.H, cmax = st.cmax, G = d.group();
  const int64_t np = (d.M + kPanel - 1) / kPanel, Mp = np * kPanel;
  const int64_t Dkp = round_up(D, mk::kLanes), Dvp = round_up(Dv, mk::kLanes);
  const float scale = softmax_scale(p.scale, D);
  const float c = scale * kLog2e;
  const bool improved = p.topk > 0;
  // As in the forward: with B·H below the thread count, each head's phases run on the whole team.
  const bool split = split_tasks(BH);
  ws.ensure_threads();
  float* kpan = ws.kpan.floats(static_cast<size_t>(d.B * d.Hkv * Mp * D));    // (B, Hkv, np, D, 64)
  float* vpan = ws.vpan.floats(static_cast<size_t>(d.B * d.Hkv * Mp * Dv));   // (B, Hkv, np, Dv, 64)
  float* krow = ws.krow.floats(static_cast<size_t>(d.B * d.Hkv * Mp * Dkp));  // (B, Hkv, Mp, Dkp)
  // Packing by (key head, block of kPack rows): a whole panel per block, so the split is exact.
  constexpr int64_t kPack = 64 * kPanel;
  const int64_t pblocks = (Mp + kPack - 1) / kPack;
  parallel_for(d.B * d.Hkv * pblocks, [&](int64_t w) {
    const int64_t t = w / pblocks, r0 = (w % pblocks) * kPack, b = t / d.Hkv, hk = t % d.Hkv;
    const int64_t rows = std::max<int64_t>(0, std::min(kPack, d.M - r0)), rpad = std::min(kPack, Mp - r0);
    mk::pack_panels(in.k.ptr(b, hk, 0) + r0 * in.k.stride(2), rows, D, in.k.stride(2), kpan + t * Mp * D + r0 * D);
    mk::pack_panels(in.v.ptr(b, hk, 0) + r0 * in.v.stride(2), rows, Dv, in.v.stride(2), vpan + t * Mp * Dv + r0 * Dv);
    mk::pack_rows(in.k.ptr(b, hk, 0) + r0 * in.k.stride(2), rows, D, in.k.stride(2), krow + (t * Mp + r0) * Dkp, rpad, Dkp);
  });
  // With GQA several query heads write the same key rows: give each its own partial dK, dV.
  float* dkvp = G > 1 ? ws.dkvp.floats(static_cast<size_t>(BH * Mp * (Dkp + Dvp))) : nullptr;

  auto head = [&](int64_t t, int owner) {
    const int64_t b = t / d.H, h = t % d.H, hk = h / G;
    const int64_t mv = valid_keys(in, d, b), ce = st.nclusters[static_cast<size_t>(t)];
    KeyGrads kg{dkvp ? dkvp + t * Mp * (Dkp + Dvp) : nullptr, Dkp + Dvp, dk, dv, b, hk, Dkp};
    if (dkvp) std::memset(kg.part, 0, sizeof(float) * static_cast<size_t>(mv * (Dkp + Dvp)));
    if (ce == 0) return;
    const int32_t* order = st.order.data() + t * d.N;
    const int32_t* off = st.offsets.data() + t * (cmax + 1);
    const float* qc = st.qc.data() + t * cmax * D;
    const float* lse_c = st.lse_c.data() + t * cmax;
    const float* resid = st.resid.data() + t * cmax * Dv;
    const float* mass = st.mass.data() + t * cmax;
    ThreadScratch& sc = ws.threads[static_cast<size_t>(owner)];
    // Runs fn(x, thread scratch) for x in [0, n): over the team when split, else on this thread.
    auto each = [&](int64_t n, auto&& fn) {
      split_for(split, n, owner, [&](int64_t x, int thread) { fn(x, ws.threads[static_cast<size_t>(thread)]); });
    };
    float* gsum = sc.e.floats(static_cast<size_t>(ce * Dvp));   // (C, Dvp) G_j = Σ_members dO_i
    float* dqc = sc.f.floats(static_cast<size_t>(ce * Dkp));    // (C, Dkp) dQc
    float* delta = sc.g.floats(static_cast<size_t>(2 * ce));    // (C) δ_j, then (C) dm_j
    float* dm = delta + ce;
    std::fill(dm, dm + ce, 0.f);
    each(ce, [&](int64_t j, ThreadScratch&) {
      float* g = gsum + j * Dvp;
      std::memset(g, 0, sizeof(float) * static_cast<size_t>(Dvp));
      for (int64_t x = off[j]; x < off[j + 1]; ++x) simd::axpy_row(g, dout.ptr(b, h, order[x]), Dv);
    });
    // Improved: exact gradients of m_j·Σ_T softmax_T(s q·k) v through q, K_T, V_T; yields dm_j.
    // Split: clusters in parallel, each writing its T_j rows' dK, dV into its own slot, added to
    // the key gradients after in cluster order (the order of the single-thread pass).
    const int64_t k = st.ksel[static_cast<size_t>(t)];
    if (improved) {
      if (split) {
        const int64_t slot = round_up(k, mk::kLanes) * (Dkp + Dvp);
        float* kvt = sc.kvt.floats(static_cast<size_t>(ce * slot));  // (C, kw, Dkp + Dvp)
        parallel_for(ce, [&](int64_t j, int thread) {
          improved_members_bwd(in, d, b, h, scale, st, dout, dq, kg, dm, ws.threads[static_cast<size_t>(thread)], j,
                               j + 1, kvt + j * slot);
        });
        const int64_t kw = round_up(k, mk::kLanes);
        for (int64_t j = 0; j < ce; ++j) {
          if (off[j + 1] == off[j]) continue;
          const int32_t* tk = st.topk_idx.data() + (t * cmax + j) * st.kmax;
          const float* dkt = kvt + j * slot;
          const float* dvt = dkt + kw * Dkp;
          for (int64_t x = 0; x < k; ++x) {
            kg.add_k(tk[x], dkt + x * Dkp, D, 1.f / c);
            kg.add_v(tk[x], dvt + x * Dvp, Dv, mass[j]);
          }
        }
      } else {
        improved_members_bwd(in, d, b, h, scale, st, dout, dq, kg, dm, sc, 0, ce, nullptr);
      }
    }
    // Through Ac: dA_jl = G_j·v_l off T_j and dm_j on T_j; δ_j = Σ_l A_jl dA_jl = G_j·R_j + m_j dm_j.
    for (int64_t j = 0; j < ce; ++j) {
      float x = mass[j] * dm[j];
      for (int64_t e = 0; e < Dv; ++e) x += gsum[j * Dvp + e] * resid[j * Dv + e];
      delta[j] = x;
    }
    const size_t hkv = static_cast<size_t>(b * d.Hkv + hk);
    // Key tiles in a fixed number of groups (16, or fewer tiles): each group accumulates its own
    // dQc, summed after in group order, so dQc is the same whether the groups run on one thread
    // or many; dK and dV rows of a tile belong to that tile alone.
    const int64_t ntiles = (mv + kBc - 1) / kBc, ngroups = std::min<int64_t>(16, ntiles);
    const int64_t per = (ntiles + ngroups - 1) / ngroups;
    float* dqcp = sc.dqp.floats(static_cast<size_t>(ngroups * ce * Dkp));  // (groups, C, Dkp)
    each(ngroups, [&](int64_t gi, ThreadScratch& own) {
      float* dqg = dqcp + gi * ce * Dkp;
      std::memset(dqg, 0, sizeof(float) * static_cast<size_t>(ce * Dkp));
      float* qcs = own.a.floats(static_cast<size_t>(kCb * Dkp));       // (Cb, Dkp) Qc·c
      float* a = own.b.floats(static_cast<size_t>(kCb * kBc));         // (Cb, Bc) A, then A off T
      float* da = own.c.floats(static_cast<size_t>(kCb * kBc));        // (Cb, Bc) dA, then dS
      float* dkacc = own.h.floats(static_cast<size_t>(kBc * Dkp));     // (Bc, Dkp)
      float* dvacc = own.i.floats(static_cast<size_t>(kBc * Dvp));     // (Bc, Dvp)
      for (int64_t tile_i = gi * per; tile_i < std::min(ntiles, (gi + 1) * per); ++tile_i) {
        const int64_t k0 = tile_i * kBc;
        const int64_t bc = std::min(kBc, mv - k0), npan = (bc + kPanel - 1) / kPanel, width = npan * kPanel;
        std::memset(dkacc, 0, sizeof(float) * static_cast<size_t>(width * Dkp));
        std::memset(dvacc, 0, sizeof(float) * static_cast<size_t>(width * Dvp));
        for (int64_t j0 = 0; j0 < ce; j0 += kCb) {
          const int64_t rows = std::min(kCb, ce - j0);
          mk::pack_rows(qc + j0 * D, rows, D, D, qcs, rows, Dkp, c);
          // A = 2^(c·Qc·Kᵀ − lse2)
          mk::gemm_abt(rows, npan, D, qcs, Dkp, kpan + hkv * Mp * D + k0 * D, a, kBc);
          for (int64_t r = 0; r < rows; ++r) {
            float* row = a + r * kBc;
            tile::mask_tail(row, width, bc);
            tile::prob_row(row, width, lse_c[j0 + r] * kLog2e);
          }
          // dA = G·Vᵀ, replaced by dm_j on T_j; dS = s·A∘(dA − δ); A loses its T_j entries (they
          // reach V through the member stage instead).
          mk::gemm_abt(rows, npan, Dv, gsum + j0 * Dvp, Dvp, vpan + hkv * Mp * Dv + k0 * Dv, da, kBc);
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t j = j0 + r;
            float* ar = a + r * kBc;
            float* dr = da + r * kBc;
            const int32_t* tk = improved ? st.topk_idx.data() + (t * cmax + j) * st.kmax : nullptr;
            // T_j's entries inside this tile: [lo, hi) of the ascending key indices.
            const int64_t lo = improved ? std::lower_bound(tk, tk + k, static_cast<int32_t>(k0)) - tk : 0;
            const int64_t hi = improved ? std::lower_bound(tk, tk + k, static_cast<int32_t>(k0 + bc)) - tk : 0;
            for (int64_t x = lo; x < hi; ++x) dr[tk[x] - k0] = dm[j];
            const simd::vf dj = simd::splat(delta[j]), sv = simd::splat(scale);
            for (int64_t x = 0; x < width; x += simd::kLanes)
              simd::store(dr + x, simd::load(ar + x) * (simd::load(dr + x) - dj) * sv);
            for (int64_t x = lo; x < hi; ++x) ar[tk[x] - k0] = 0.f;
          }
          // Vc = A·V -> dV += A_offTᵀ·G ;  S = s·Qc·Kᵀ -> dQc += dS·K, dK += dSᵀ·Qc
          mk::gemm_ab(width, Dvp, rows, a, 1, kBc, gsum + j0 * Dvp, Dvp, dvacc, Dvp, nullptr);
          mk::gemm_ab(rows, Dkp, width, da, kBc, 1, krow + (hkv * Mp + k0) * Dkp, Dkp, dqg + j0 * Dkp, Dkp, nullptr);
          mk::gemm_ab(width, Dkp, rows, da, 1, kBc, qcs, Dkp, dkacc, Dkp, nullptr);
        }
        const float inv_c = 1.f / c;
        for (int64_t x = 0; x < bc; ++x) {
          kg.add_k(k0 + x, dkacc + x * Dkp, D, inv_c);
          kg.add_v(k0 + x, dvacc + x * Dvp, Dv, 1.f);
        }
      }
    });
    std::memcpy(dqc, dqcp, sizeof(float) * static_cast<size_t>(ce * Dkp));
    for (int64_t gi = 1; gi < ngroups; ++gi)
      for (int64_t x = 0; x < ce * Dkp; ++x) dqc[x] += dqcp[gi * ce * Dkp + x];
    // Qc_j = mean of members -> dq_i += dQc_j / |j| (each query in one cluster: disjoint rows)
    each(ce, [&](int64_t j, ThreadScratch&) {
      const int64_t n = off[j + 1] - off[j];
      if (n == 0) return;
      const float inv = 1.f / static_cast<float>(n);
      for (int64_t x = off[j]; x < off[j + 1]; ++x) simd::axpy_row(dq.ptr(b, h, order[x]), dqc + j * Dkp, D, inv);
    });
  };
  if (split) {
    for (int64_t t = 0; t < BH; ++t) head(t, thread_id());
  } else {
    parallel_for(BH, [&](int64_t t, int thread) { head(t, thread); });
  }
  if (dkvp) reduce_group_partials(in, d, dkvp, Mp, Dkp + Dvp, Dkp, dk, dv);
}

}  // namespace clattn

namespace clattn {

size_t clustered_workspace_bytes(const AttentionDims& d, const ClusteredParams& p, Mode mode,
                                 int threads) {
  const int64_t D = d.Dk, Dv = d.Dv, BH = d.B * d.H, N = d.N, M = d.M;
  const int64_t Dkp = round_up(D, mk::kLanes), Dvp = round_up(Dv, mk::kLanes), Mp = round_up(M, kPanel);
  const int64_t C = std::max<int64_t>(1, std::min(p.clusters, N));
  const int64_t k = p.topk > 0 ? std::max<int64_t>(1, std::min(p.topk, M)) : 0;
  const int64_t kw = round_up(k, mk::kLanes);
  int64_t set = 16;
  while (set < 4 * std::min<int64_t>(C + 1, std::max<int64_t>(N, 1))) set *= 2;
  constexpr int64_t f = sizeof(float);
  // Per thread, in bytes: clustering (codes, k-means), the centroid stage, the member stage.
  int64_t per = N * (8 + 4 + 4 + 4 + 8) + C * (8 + 64 * 4 + 8) + set * 9 + cluster::kHashBlock * 64 * f;
  per += f * (kBc * D + mk::rows_operand_size(M, Dv) + C * D + kCb * kBc + C * Dvp + 3 * C) +
         C * (2 * k * static_cast<int64_t>(sizeof(Cand)) + 8 + f);
  if (k > 0)
    per += f * (k * D + D * kw + kw * Dvp + kMb * D + 2 * kMb * kw + kMb * std::max(Dvp, Dkp) +
                kw * Dkp + kw * Dvp + Dv * kw + kMb * Dvp + kw * Dkp + kw * Dvp + kMb * Dkp);
  int64_t shared = 0;
  if (mode == Mode::training) {
    per += f * (C * Dvp + C * Dkp + 2 * C + kCb * Dkp + 2 * kCb * kBc + kBc * Dkp + kBc * Dvp) + C * 8;
    per += f * (16 * C * Dkp + (k > 0 ? C * kw * (Dkp + Dvp) : 0));  // a split head's dQc groups and T_j slots
    shared = f * (d.B * d.Hkv * Mp * (D + Dv + Dkp) + (d.group() > 1 ? BH * Mp * (Dkp + Dvp) : 0));
  }
  const int64_t state = BH * (4 + 4 + N * 4 + (C + 1) * 4 + C * k * 4 + C * (D + Dv + 2) * f +
                              (k > 0 ? N * f : 0));
  return static_cast<size_t>(threads * (per + static_cast<int64_t>(sizeof(ThreadScratch))) +
                             shared + state);
}

}  // namespace clattn
