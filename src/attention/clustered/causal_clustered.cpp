// Causal clustered and improved-clustered attention (docs/design.md).
//
// Definition. Keys sit at positions 0 .. M−1; query i sits at position p_i = i + M − N and sees keys
// j <= p_i with j < mv (key_lengths); queries i >= nv (query_lengths) and queries with p_i < 0
// get 0. Positions are cut into blocks of Lb = `block` positions, block β = [β·Lb, (β+1)·Lb), and
// into segments whose lengths double from one block up to Ls = `segment` (a multiple of Lb), then
// stay Ls: segment starts 0, Lb, 2·Lb, 4·Lb, ..., each the previous plus min(max(previous, Lb), Ls)
// (causal_segment_starts; e.g. Lb = 256, Ls = 2048: 0, 256, 512, 1024, 2048, 4096, 6144, ...).
// Every segment is a whole number of blocks.
//
//   Exact rows: a query with p_i < E attends every key it sees exactly (causal full attention).
//     E = the end of the first segment that starts at or after q0, the first position whose query
//     is among the inputs: q0 = max(0, M − N), or 0 when the call's KVCache keeps queries
//     (decoding). So E = Lb for a whole sequence: only the first block is exact. E = ∞ when
//     clusters >= Ls (every query its own cluster).
//   Otherwise, for a valid query i of block β in segment σ (so σ >= 1):
//     in-block part: exact softmax over the keys B_i = [β·Lb, min(p_i, mv − 1)]: O_in,i and its
//       log-sum-exp lse_in,i (−inf when B_i is empty: key padding before the block).
//     prefix part, over the keys P_β = [0, min(β·Lb, mv)), each before every query of the block:
//       clusters of segment σ — the queries of segment σ − 1 (the definers, all before every query
//       of segment σ) are hashed and grouped by Hamming k-means exactly as
//       non-causal clustered does (C clusters; planes from (seed, step), initial centroids from
//       (seed, step, b, h, σ)); clusters left without a definer are dropped; centroid qc_j is the
//       mean of its definers; query i joins the centroid nearest to it in Euclidean distance
//       (first minimum wins). So query i's cluster depends on q_i and segment σ−1 only, never on
//       a later query.
//       Centroid attention A_j = softmax(s·qc_j·K_Pᵀ) over P_β, its log-sum-exp lse_c,j,
//       Vc_j = A_j·V_P.
//       clustered:   O_pre,i = Vc_j,  log Z_pre,i = lse_c,j.
//       improved:    T_j = the k = min(topk, |P_β|) keys of largest A_j (ties to the lower index),
//                    m_j = Σ_{l∈T_j} A_jl,
//                    O_pre,i = m_j · Σ_{l∈T_j} softmax_T(s·q_i·k_l) v_l + Σ_{l∉T_j} A_jl v_l,
//                    log Z_pre,i = log Σ_{l∈T_j} exp(s·q_i·k_l) − log m_j.
//         Z_pre = Z_T,i / m_j keeps the exact unnormalised weights of the top-k keys and spreads the
//         rest of the prefix in the centroid's proportions; m_j >= k/|P_β| > 0 (the k largest).
//     The parts combine through their log-sum-exps: L_i = log(Z_pre,i + e^lse_in,i),
//       O_i = (Z_pre,i · O_pre,i + e^lse_in,i · O_in,i) / e^L_i.
//   With segment = block this is the design of one cluster set per block; a longer segment builds
//   the clusters once for several blocks, so the centroid attention over the prefix is one stream
//   per segment with a snapshot at each block end (cost ÷ Ls/Lb), at the price of centroids made
//   of older queries. The doubling start keeps the exact part to the first block (a fixed Ls from
//   position 0 would leave the whole first segment exact: (Ls/N)² of causal full's cost) and gives
//   short sequences clusters early.
//
// Properties (tested in tests/attention/test_causal_clustered.cpp and test_causality.cpp):
//   * strictly causal: O_i depends on q_i, on the queries before its segment, and on keys and values
//     at positions <= p_i; changing anything after p_i leaves O_i bit-identical (the clusters of a
//     segment never look at its own queries but to place them, and every kernel's order of
//     operations for row i is independent of later rows).
//   * no empty row: the key at p_i itself is in B_i (or the exact row) whenever it is valid.
//   * clusters >= segment gives causal full attention; topk >= the prefix gives it for improved.
//   * backward: the exact gradient of this function with the clusters, definers and T_j fixed;
//     the centroids are means of earlier queries, so those queries receive gradient through them.
// Cost per head, C clusters: N·Lb/2 (in-block) + C·N²/(2·Ls) (one prefix stream per segment) +
// N·k (members), times Dk + Dv: about Lb/N + C/Ls of causal full's, plus the clustering (N·C
// popcounts per k-means round) and per block and cluster the gather of T_j's rows. Defaults (block=512,
// segment=8·block: docs/performance.md; docs/design.md) were chosen by measuring speed
// at N = 4096..65536 and fidelity on stories260k and a causal character model (docs/approximation.md).
//
// Implementation: the in-block parts and the exact rows are one call of full attention's kernels
// with a block band (Band{block, exact_before = E}); then one task per (b, h, segment) clusters
// the definers, streams the prefix once for all its centroids (causal_segment.cpp: tiles cut at
// block ends, snapshots there) and runs each block's members. Decoding with a KVCache that keeps
// queries computes the same function (causal_decode.cpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "attention/clustered/causal_internal.h"
#include "attention/full/full.h"
#include "attention/tile/grad_util.h"
#include "attention/tile/tile_ops.h"
#include "clattn/kv_cache.h"
#include "clattn/threads.h"

namespace clattn {

using mk::kPanel;
using mk::round_up;
using tile::kInf;
using tile::kLog2e;

namespace causal {

void CausalWorkspace::ensure_threads() {
  if (threads.size() < static_cast<size_t>(max_threads())) threads.resize(static_cast<size_t>(max_threads()));
}

Geometry geometry(const AttentionInputs& in, const AttentionDims& d, const ClusteredParams& p) {
  Geometry g;
  g.Lb = p.block;
  g.Ls = p.segment;
  g.nb = (d.M + g.Lb - 1) / g.Lb;
  g.start = causal_segment_starts(d.M, g.Lb, g.Ls);
  g.ns = static_cast<int64_t>(g.start.size()) - 1;
  g.off = d.M - d.N;
  // exact_before (E above): the end of the first segment that starts at or after q0, the first
  // position whose query is among the inputs (or in the cache), so every later segment has all
  // its definers.
  const int64_t q0 = in.cache && in.cache->keeps_queries() ? 0 : std::max<int64_t>(0, g.off);
  g.s0 = g.ns;
  if (p.clusters < g.Ls)
    for (int64_t s = 0; s < g.ns; ++s)
      if (g.start[static_cast<size_t>(s)] >= q0) {
        g.s0 = s + 1;
        break;
      }
  g.exact_before = g.s0 < g.ns ? g.start[static_cast<size_t>(g.s0)] : std::numeric_limits<int64_t>::max() / 4;
  g.scale = softmax_scale(p.scale, d.Dk);
  g.log2_scale = g.scale * kLog2e;
  return g;
}

namespace {

// Rows [ra, rb) of head (b, h) through full attention's tiles with the block band: their in-block
// parts (exact rows: their whole visible prefix), and in cz.inlse their log-sum-exps as the blend
// reads them (inblock_lse).
void inblock_rows(const AttentionInputs& in, const AttentionDims& d, const Geometry& g, int64_t b, int64_t h,
                  int64_t ra, int64_t rb, View out, CausalClusters& cz, FullWorkspace& fws, int thread) {
  float* inl = cz.inlse.data();
  attn_full_fwd_rows(in, d, g.scale, Band{.block = g.Lb, .exact_before = g.exact_before}, b, h, ra, rb, out, inl,
                     cz.inparts.data(), fws, thread);
  const int64_t at = (b * d.H + h) * d.N;
  for (int64_t x = at + ra; x < at + rb; ++x) inl[x] = inblock_lse(inl, cz.inparts.data(), x);
}

// Segment σ of head t: its clusters, the stream of its centroids over the prefix with a snapshot
// at each block end, and each block's members blended into out.
void segment_fwd(const AttentionInputs& in, const AttentionDims& d, const ClusteredParams& p,
                 const Geometry& g, uint64_t step, const Rng& rng, const cluster::LshPlanes& planes,
                 const KeyOperands& ko, int64_t t, int64_t sigma, View out, CausalClusters& cz,
                 FullWorkspace& fws, int thread, CausalThread& sc) {
  const int64_t b = t / d.H, h = t % d.H, hk = h / d.group(), D = d.Dk, Dv = d.Dv;
  const int64_t nv = valid_queries(in, d, b), mv = valid_keys(in, d, b);
  const Rows seg = segment_rows(g, sigma, nv);
  const size_t ts = static_cast<size_t>(t * g.ns + sigma);
  if (seg.a >= seg.b) return;
  // The in-block part of rows [r.a, r.b), run here so that the block's queries and output rows
  // are in cache for its member stage.
  auto inblock = [&](Rows r) { inblock_rows(in, d, g, b, h, r.a, r.b, out, cz, fws, thread); };
  if (mv <= 0) {  // no valid key: the rows see nothing, and the in-block call writes their zeros
    for (int64_t beta = (seg.a + g.off) / g.Lb; beta <= (seg.b - 1 + g.off) / g.Lb; ++beta) inblock(block_rows(g, beta, seg));
    return;
  }
  // Definers: the queries of segment σ − 1 (rows da .. seg.a, all valid: they precede row
  // seg.a < nv, and da >= 0 since segment σ starts at or after E).
  const int64_t da = g.start[static_cast<size_t>(sigma - 1)] - g.off, np = seg.a - da;
  float* qc = cz.qc.data() + ts * static_cast<size_t>(cz.cmax * D);  // (cmax, D)
  sc.assign.resize(static_cast<size_t>(np));
  const int64_t ce = segment_clusters(in.q.ptr(b, h, da), np, in.q.stride(2), D, p, planes, rng,
                                      kmeans_stream(step, t, sigma), sc.assign.data(), qc, sc.cs);
  cz.ncl[ts] = static_cast<int32_t>(ce);
  int32_t* dord = cz.def_order.data() + ts * static_cast<size_t>(g.Ls);
  int32_t* doff = cz.def_off.data() + ts * static_cast<size_t>(cz.cmax + 1);
  cluster::counting_sort(sc.assign.data(), np, ce, dord, doff);
  for (int64_t x = 0; x < np; ++x) dord[x] += static_cast<int32_t>(da);
  // Members: every valid query of the segment joins its nearest centroid (block by block below).
  pack_centroids(qc, ce, D, sc.norms, sc.qcpan);
  int32_t* member = cz.member.data() + t * d.N;
  // Block by block: the in-block part, the block's queries placed, the stream advanced to its
  // start, the members blended in.
  const bool improved = p.topk > 0;
  sc.stream.reset(qc, ce, D, Dv, p.topk, g.log2_scale);
  for (int64_t beta = (seg.a + g.off) / g.Lb; beta <= (seg.b - 1 + g.off) / g.Lb; ++beta) {
    const Rows r = block_rows(g, beta, seg);
    const size_t tb = static_cast<size_t>(t * g.nb + beta);
    inblock(r);
    nearest_centroids(in.q.ptr(b, h, r.a), r.b - r.a, in.q.stride(2), D, sc.qcpan.data(), sc.norms.data(), ce,
                      member + r.a, sc.near);
    sc.stream.advance(std::min(beta * g.Lb, mv), ko, sc.tile.floats(static_cast<size_t>(kCb * kBc)));
    const Snapshot snap{cz.lse_c.data() + tb * static_cast<size_t>(cz.cmax), cz.mass.data() + tb * static_cast<size_t>(cz.cmax),
                        cz.resid.data() + tb * static_cast<size_t>(cz.cmax * Dv),
                        improved ? cz.topk_idx.data() + tb * static_cast<size_t>(cz.cmax * cz.kmax) : nullptr, cz.kmax};
    int64_t k = 0;
    block_fwd(sc.stream, in, ko, b, h, hk, r.a, r.b, member + r.a, snap, k, cz.inlse.data() + t * d.N, g.log2_scale, out,
              cz.lzp.data() + t * d.N, cz.alpha.data() + t * d.N, sc.ms);
    cz.ksel[tb] = static_cast<int32_t>(k);
  }
}

}  // namespace
}  // namespace causal

using namespace causal;

std::vector<int64_t> causal_segment_starts(int64_t M, int64_t block, int64_t segment) {
  std::vector<int64_t> s{0};
  while (s.back() < M) s.push_back(s.back() + std::min(std::max(s.back(), block), segment));
  return s;
}

void attn_causal_clustered_fwd(const AttentionInputs& in, const AttentionDims& d,
                               const ClusteredParams& p, uint64_t step, View out,
                               ClusteredState& st, Scratch& scratch) {
  CausalClusters& cz = st.cz;
  st.causal = true;
  const Geometry g = geometry(in, d, p);
  const int64_t BH = d.B * d.H, D = d.Dk, Dv = d.Dv;
  cz.block = g.Lb;
  cz.segment = g.Ls;
  cz.nb = g.nb;
  cz.ns = g.ns;
  cz.seg_start = g.start;
  cz.exact_before = g.exact_before;
  cz.cmax = std::min(p.clusters, g.Ls);
  cz.kmax = p.topk > 0 ? std::max<int64_t>(1, std::min(p.topk, (g.nb - 1) * g.Lb)) : 0;
  const bool clustered = g.exact_before < d.M;  // some row has a prefix part
  const size_t nbs = clustered ? static_cast<size_t>(BH * g.nb) : 0, nss = clustered ? static_cast<size_t>(BH * g.ns) : 0;
  cz.ncl.assign(nss, 0);
  cz.ksel.assign(nbs, -1);
  cz.member.assign(clustered ? static_cast<size_t>(BH * d.N) : 0, -1);
  cz.def_order.resize(nss * static_cast<size_t>(g.Ls));
  cz.def_off.resize(nss * static_cast<size_t>(cz.cmax + 1));
  cz.topk_idx.resize(p.topk > 0 ? nbs * static_cast<size_t>(cz.cmax * cz.kmax) : 0);
  cz.qc.resize(Shape{static_cast<int64_t>(nss), cz.cmax, D});
  cz.lse_c.resize(Shape{static_cast<int64_t>(nbs), cz.cmax});
  cz.mass.resize(Shape{static_cast<int64_t>(nbs), cz.cmax});
  cz.resid.resize(Shape{static_cast<int64_t>(nbs), cz.cmax, Dv});
  cz.lzp.resize(Shape{BH, d.N});
  cz.alpha.resize(Shape{BH, d.N});
  cz.inlse.resize(Shape{BH, d.N});
  cz.inparts.resize(Shape{2, BH, d.N});
  // lzp and alpha: no prefix part until a segment's member stage says otherwise.
  std::fill(cz.lzp.data(), cz.lzp.data() + BH * d.N, -kInf);
  std::fill(cz.alpha.data(), cz.alpha.data() + BH * d.N, 0.f);
  FullWorkspace& fws = full_workspace(scratch);
  const Band band{.block = g.Lb, .exact_before = g.exact_before};
  float* inl = cz.inlse.data();
  if (in.cache && in.cache->keeps_queries()) {
    // Decoding: the in-block parts in one call, then the prefix parts from the cache's state.
    attn_full_fwd(in, d, g.scale, out, inl, fws, band, cz.inparts.data());
    for (int64_t x = 0; x < BH * d.N; ++x) inl[x] = inblock_lse(inl, cz.inparts.data(), x);
    if (clustered) decode_prefix(in, d, p, step, g, out, inl, scratch);
    return;
  }
  // Prefill: one task list. Each segment task runs its blocks' in-block parts itself, just before
  // their members (the block's queries and output rows are then in cache); the exact rows (before
  // E) go in chunks. Later segments, the longest prefixes, first.
  full_fwd_prepare(in, d, fws, band);
  for (int64_t t = 0; t < BH; ++t) full_zero_padded_rows(in, d, t / d.H, t % d.H, out, inl, cz.inparts.data());
  const Rng rng(p.seed);
  cluster::LshPlanes planes;
  if (clustered && !p.positional) planes = cluster::draw_planes(rng, planes_stream(step), p.bits, D, p.hash_bias);
  CausalWorkspace& ws = scratch.get<CausalWorkspace>();
  ws.ensure_threads();
  const int64_t Mp = round_up(d.M, kPanel);
  auto operands = [&](int64_t b, int64_t hk) {
    if (in.cache) return cache_operands(*in.cache, b, hk);
    const mk::RowsOperand v = full_value_rows(fws, b * d.Hkv + hk);
    return KeyOperands{full_key_panels(fws) + (b * d.Hkv + hk) * Mp * D, v.data, v.ld};
  };
  std::vector<Task>& tasks = ws.tasks;
  tasks.clear();
  for (int64_t sigma = g.ns - 1; sigma >= g.s0 && clustered; --sigma)
    for (int64_t t = 0; t < BH; ++t) tasks.push_back(Task{t, sigma, 0, 0});
  constexpr int64_t kExactRows = 256;
  for (int64_t t = 0; t < BH; ++t) {
    const int64_t e1 = std::clamp(g.exact_before - g.off, int64_t{0}, valid_queries(in, d, t / d.H));
    for (int64_t r0 = 0; r0 < e1; r0 += kExactRows) tasks.push_back(Task{t, -1, r0, std::min(e1, r0 + kExactRows)});
  }
  parallel_for(static_cast<int64_t>(tasks.size()), [&](int64_t x, int thread) {
    const Task& tk = tasks[static_cast<size_t>(x)];
    const int64_t b = tk.t / d.H, h = tk.t % d.H, hk = h / d.group();
    if (tk.sigma >= 0) {
      segment_fwd(in, d, p, g, step, rng, planes, operands(b, hk), tk.t, tk.sigma, out, cz, fws, thread,
                  ws.threads[static_cast<size_t>(thread)]);
      return;
    }
    inblock_rows(in, d, g, b, h, tk.r0, tk.r1, out, cz, fws, thread);
  });
}

void attn_causal_clustered_bwd(const AttentionInputs& in, const AttentionDims& d,
                               const ClusteredParams& p, const ClusteredState& st, ConstView out,
                               ConstView dout, View dq, View dk, View dv, Scratch& scratch) {
  const CausalClusters& cz = st.cz;
  const Geometry g = geometry(in, d, p);
  check(g.exact_before == cz.exact_before && g.ns == cz.ns, "causal clustered: backward's geometry differs from the forward's");
  const int64_t BH = d.B * d.H, G = d.group(), Dkp = round_up(d.Dk, mk::kLanes), Dvp = round_up(d.Dv, mk::kLanes);
  const int64_t Mp = round_up(d.M, kPanel);
  CausalWorkspace& ws = scratch.get<CausalWorkspace>();
  ws.ensure_threads();
  // In-block parts: full attention's backward with dO scaled by each row's in-block share
  // 1 − α_i: its dS = P (dO'·v − dO'·O) is then the exact gradient of the blended row (the out it
  // reads is the blended O); exact rows have share 1 (a row that sees no key gets no gradient).
  float* w = ws.dscale.floats(static_cast<size_t>(BH * d.N));  // (B, H, N)
  for (int64_t x = 0; x < BH * d.N; ++x) w[x] = 1.f - cz.alpha.data()[x];
  FullWorkspace& fws = full_workspace(scratch);
  attn_full_bwd(in, d, g.scale, out, cz.inparts.data(), dout, dq, dk, dv, fws,
                Band{.block = g.Lb, .exact_before = g.exact_before}, w);
  if (g.exact_before >= d.M) return;
  // Prefix parts: one task per (b, h), segments in order (a segment's definers are the previous
  // segment's queries, so dq rows are shared across segments of a head). full's backward packed
  // K and V for every head; they are read from its workspace.
  float* part = G > 1 ? ws.part.floats(static_cast<size_t>(BH * Mp * (Dkp + Dvp))) : nullptr;  // (B, H, Mp, Dkp + Dvp)
  auto head = [&](int64_t t, int owner, bool split) {
    const int64_t b = t / d.H, hk = (t % d.H) / G;
    KeyGrads kg{part ? part + t * Mp * (Dkp + Dvp) : nullptr, Dkp + Dvp, dk, dv, b, hk, Dkp};
    if (part) std::memset(kg.part, 0, sizeof(float) * static_cast<size_t>(Mp * (Dkp + Dvp)));
    prefix_bwd(in, d, p, g, cz, t, out, dout, dq, kg, full_key_panels(fws), full_value_panels(fws),
               full_key_rows(fws), Mp, ws, owner, split);
  };
  // B·H below the thread count: one head at a time, its dense pass over the team.
  if (split_tasks(BH)) {
    for (int64_t t = 0; t < BH; ++t) head(t, 0, true);
  } else {
    parallel_for(BH, [&](int64_t t, int thread) { head(t, thread, false); });
  }
  if (part) reduce_group_partials(in, d, part, Mp, Dkp + Dvp, Dkp, dk, dv);
}

size_t causal_clustered_workspace_bytes(const AttentionDims& d, const ClusteredParams& p,
                                        Mode mode, int threads) {
  const int64_t D = d.Dk, Dv = d.Dv, BH = d.B * d.H, Lb = p.block, Ls = p.segment;
  const int64_t Dkp = round_up(D, mk::kLanes), Dvp = round_up(Dv, mk::kLanes), Mp = round_up(d.M, kPanel);
  const int64_t nb = (d.M + Lb - 1) / Lb, ns = static_cast<int64_t>(causal_segment_starts(d.M, Lb, Ls).size()) - 1;
  const int64_t C = std::min(p.clusters, Ls);
  const int64_t k = p.topk > 0 ? std::min(p.topk, d.M) : 0, S = Ls / Lb;
  constexpr int64_t f = sizeof(float);
  // Saved state: per (b, h, segment) centroids and definers, per (b, h, block) snapshots, per query
  // member, lzp, lse and the in-block lse with its two parts.
  const int64_t state = BH * ns * (f * C * D + 4 * (Ls + C + 2)) + BH * nb * (C * (4 * k + f * (Dv + 2)) + 4) +
                        BH * d.N * (4 + 5 * f);
  const int64_t cpan = round_up(C, kPanel);
  int64_t per = f * (cpan * D + kPanel * cpan + C * D + C * Dvp + 2 * C + kCb * kBc) +
                C * (2 * k * static_cast<int64_t>(sizeof(Cand)) + 12) + 4 * (2 * Ls + C) + 8 * Ls +
                f * (cpan * 64 + cluster::kHashBlock * 64) +
                f * (round_up(std::max<int64_t>(k, 1), 16) * (D + Dvp) + k * D + kMb * (D + 64 + Dvp) + kMb) +
                // a 16-bit cache's T_j bits and the residual's product
                2 * round_up(std::max<int64_t>(k, 1), 16) * (D + Dvp) + f * (k + Dvp);
  if (mode == Mode::training)
    per += f * (S * C * (Dvp + 2) + C * Dkp * 2 + 2 * kCb * kBc + kBc * (Dkp + Dvp) + 2 * k * (D + Dv) + 4 * Dv) +
           8 * Ls + f * std::max<int64_t>(1, (d.M + kSpan - 1) / kSpan) * C * Dkp;
  int64_t shared = mode == Mode::training ? f * (BH * d.N + (d.group() > 1 ? BH * Mp * (Dkp + Dvp) : 0)) : 0;
  return static_cast<size_t>(threads * (per + static_cast<int64_t>(sizeof(CausalThread))) + shared + state) +
         full_workspace_bytes(d, mode, threads, Band{.block = Lb});
}

}  // namespace clattn
