// Routing attention. Routing uses unit-norm copies of queries and keys; centroids (per head, shared
// by queries and keys) come from spherical k-means on the sequence's unit queries and keys (eval,
// the default) or are layer state kept by EMA (mode=train: decay 0.999, seeded initialisation,
// updated after each forward with the mean of the unit vectors nearest each centroid, then
// renormalised). Each cluster takes the `window` keys and the `window` queries most similar to
// its centroid (cosine; ties to the lower index); its queries attend its keys with the real s·q·k,
// and a query chosen by several clusters averages their outputs. A query chosen by none attends
// the key window of its nearest centroid (the original gives it 0). Causal: keys after the query
// (position i + M − N) are masked, and a query always sees the key at its own position, added to
// a cluster's softmax when the window lacks it. Work is parallel over (batch, head); each cluster
// is three small products on gathered blocks of 64 members. Memory O(N·C + window·C).
#include "attention/routing.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "attention/full.h"
#include "attention/tile_ops.h"
#include "attention/topk_select.h"
#include "attention/grad_util.h"
#include "attention/variants.h"
#include "clattn/parallel.h"
#include "clattn/rng.h"
#include "core/microkernel.h"
#include "core/simd.h"

namespace clattn {

using mk::kPanel;
using mk::round_up;
using tile::kInf;
using tile::kLog2e;

namespace {

constexpr int64_t kRows = 64;  // members per block

struct Scratch {
  std::vector<int32_t> assign, prev, idx, qcount, fallback;
  std::vector<Cand> cand;
  std::vector<int64_t> ncand;
  std::vector<float> thr;
  std::vector<float> sums;
  Workspace x, cent, cpan, sq, sk, qs, kr, kt, vr, vt, s, o, go, dp, dqc, dkc, dvc;
};

}  // namespace

struct RoutingWorkspace {
  Workspace part;  // (B, H, M, Dkp + Dvp) backward with GQA
  Workspace ema_sum;  // (B, H, C, D + 1) train mode: sums and counts for the EMA update
  std::vector<Scratch> threads;
};
void RoutingWorkspaceDeleter::operator()(RoutingWorkspace* w) const { delete w; }
RoutingWorkspacePtr make_routing_workspace() { return RoutingWorkspacePtr(new RoutingWorkspace); }

namespace {

void unit_row(const float* x, int64_t D, int64_t Dp, float* dst) {
  const float n = std::sqrt(simd::dot(x, x, D));
  simd::copy_row(dst, x, D, Dp, n > 0.f ? 1.f / n : 0.f);
}

// scores (n, Cp) = rows (n, Dp) · centroidsᵀ, centroids packed as panels.
void cosine_scores(const float* rows, int64_t n, int64_t D, int64_t Dp, const float* cpan,
                   int64_t C, float* scores) {
  const int64_t np = (C + kPanel - 1) / kPanel;
  mk::gemm_abt(n, np, D, rows, Dp, cpan, scores, np * kPanel);
}

// First index of the maximum of row[0, C): a vector max, then the scan for its first position.
int32_t argmax_row(const float* row, int64_t C) {
  simd::vf m = simd::splat(-kInf);
  int64_t c = 0;
  for (; c + simd::kLanes <= C; c += simd::kLanes) m = simd::vmax(m, simd::load(row + c));
  float best = simd::hmax(m);
  for (; c < C; ++c) best = std::max(best, row[c]);
  for (c = 0; c < C; ++c)
    if (row[c] == best) break;
  return static_cast<int32_t>(c);
}

// For every column c < C of scores (n, ld): its `w` largest entries (ties to the lower row),
// as ascending row indices in out (C, w). Rows stream in order; each column keeps a threshold-
// filtered candidate buffer (topk_select.h), so after the first rows a whole vector of 16
// columns is usually rejected by one compare.
void top_columns(const float* scores, int64_t n, int64_t ld, int64_t C, int64_t w,
                 std::vector<Cand>& cand, std::vector<int64_t>& ncand, std::vector<float>& thr,
                 int32_t* out, int64_t out_ld) {
  cand.resize(static_cast<size_t>(C * 2 * w));
  ncand.assign(static_cast<size_t>(C), 0);
  thr.assign(static_cast<size_t>(round_up(C, simd::kLanes)), -kInf);
  for (int64_t r = 0; r < n; ++r) {
    const float* row = scores + r * ld;
    for (int64_t c0 = 0; c0 < C; c0 += simd::kLanes) {
      const int lanes = static_cast<int>(std::min<int64_t>(simd::kLanes, C - c0));
      uint32_t m = simd::mask_gt_v(simd::load_partial(row + c0, lanes), simd::load(thr.data() + c0)) &
                   ((lanes == 32 ? 0u : (1u << lanes)) - 1u);
      while (m) {
        const int l = __builtin_ctz(m);
        m &= m - 1;
        const int64_t c = c0 + l;
        Cand* buf = cand.data() + c * 2 * w;
        int64_t& nc = ncand[static_cast<size_t>(c)];
        buf[nc++] = Cand{row[c], static_cast<int32_t>(r)};
        if (nc == 2 * w) thr[static_cast<size_t>(c)] = top_compact(buf, nc, w);
      }
    }
  }
  for (int64_t c = 0; c < C; ++c) {
    Cand* buf = cand.data() + c * 2 * w;
    int64_t nc = ncand[static_cast<size_t>(c)];
    top_compact(buf, nc, w);
    int32_t* o = out + c * out_ld;
    for (int64_t x = 0; x < w; ++x) o[x] = buf[x].i;
    std::sort(o, o + w);
  }
}

struct Dims {
  int64_t D, Dv, Dkp, Dvp;
};

// A block of one cluster's members against its key window: scaled query rows, key/value rows,
// scores (rows, kw) with masks, and the causal own-key logits.
struct Block {
  int64_t rows, nk, kw;
  const int32_t* qi;
  const int32_t* kj;
  float *qs, *kr, *vr, *s;
  float own[kRows];
  int32_t own_j[kRows];
};

void build_block(const AttentionInputs& in, int64_t b, int64_t h, int64_t hk, const Dims& dm,
                 float c, int64_t off, int64_t mv, Block& blk, Scratch& sc) {
  const int64_t kw = round_up(std::max<int64_t>(blk.nk, 1), mk::kLanes);
  blk.kw = kw;
  blk.qs = sc.qs.floats(static_cast<size_t>(kRows * dm.Dkp));
  blk.s = sc.s.floats(static_cast<size_t>(kRows * kw));
  for (int64_t r = 0; r < blk.rows; ++r) simd::copy_row(blk.qs + r * dm.Dkp, in.q.ptr(b, h, blk.qi[r]), dm.D, dm.Dkp, c);
  std::memset(blk.s, 0, sizeof(float) * static_cast<size_t>(blk.rows * kw));
  mk::gemm_ab(blk.rows, kw, dm.D, blk.qs, dm.Dkp, 1, sc.kt.floats(0), kw, blk.s, kw, nullptr);
  for (int64_t r = 0; r < blk.rows; ++r) {
    float* row = blk.s + r * kw;
    tile::mask_tail(row, kw, blk.nk);
    blk.own[r] = -kInf;
    blk.own_j[r] = -1;
    if (!in.causal) continue;
    const int64_t pos = blk.qi[r] + off;
    bool self_in = false;
    for (int64_t x = 0; x < blk.nk; ++x) {
      if (blk.kj[x] > pos) row[x] = -kInf;
      self_in |= blk.kj[x] == pos;
    }
    if (!self_in && pos >= 0 && pos < mv) {
      blk.own_j[r] = static_cast<int32_t>(pos);
      blk.own[r] = simd::dot(blk.qs + r * dm.Dkp, in.k.ptr(b, hk, pos), dm.D);
    }
  }
}

// Gathers a cluster's key window once: rows (kw, Dkp), transpose (D, kw) in sc.kt, values (kw, Dvp).
void gather_window(const AttentionInputs& in, int64_t b, int64_t hk, const Dims& dm,
                   const int32_t* kj, int64_t nk, Scratch& sc, float** kr, float** vr) {
  const int64_t kw = round_up(std::max<int64_t>(nk, 1), mk::kLanes);
  *kr = sc.kr.floats(static_cast<size_t>(kw * dm.Dkp));
  *vr = sc.vr.floats(static_cast<size_t>(kw * dm.Dvp));
  for (int64_t x = 0; x < kw; ++x) {
    if (x < nk) {
      simd::copy_row(*kr + x * dm.Dkp, in.k.ptr(b, hk, kj[x]), dm.D, dm.Dkp);
      simd::copy_row(*vr + x * dm.Dvp, in.v.ptr(b, hk, kj[x]), dm.Dv, dm.Dvp);
    } else {
      std::memset(*kr + x * dm.Dkp, 0, sizeof(float) * static_cast<size_t>(dm.Dkp));
      std::memset(*vr + x * dm.Dvp, 0, sizeof(float) * static_cast<size_t>(dm.Dvp));
    }
  }
  mk::pack_transposed(*kr, kw, dm.D, dm.Dkp, sc.kt.floats(static_cast<size_t>(dm.Dkp * kw)), kw);
}

}  // namespace

void attn_routing_fwd(const AttentionInputs& in, const AttentionDims& d, const RoutingParams& p,
                      uint64_t call, float* ema, View out, RoutingState& st, RoutingWorkspace& ws) {
  const Dims dm{d.Dk, d.Dv, round_up(d.Dk, mk::kLanes), round_up(d.Dv, mk::kLanes)};
  const int64_t C = p.clusters, Cp = round_up(C, kPanel), BH = d.B * d.H;
  const float scale = p.scale > 0 ? p.scale : 1.f / std::sqrt(static_cast<float>(d.Dk));
  const float c = scale * kLog2e;
  const int64_t wq_max = p.window > 0 ? std::min(p.window, d.N) : (d.N + C - 1) / C;
  st.C = C;
  st.wk = std::max<int64_t>(1, p.window > 0 ? std::min(p.window, d.M) : (d.M + C - 1) / C);
  st.cap = C * wq_max + d.N;
  st.keys.assign(static_cast<size_t>(BH * C * st.wk), -1);
  st.nkeys.assign(static_cast<size_t>(BH * C), 0);
  st.mem_off.assign(static_cast<size_t>(BH * (C + 1)), 0);
  st.mem.assign(static_cast<size_t>(BH * st.cap), 0);
  st.weight.assign(static_cast<size_t>(BH * st.cap), 0.f);
  st.lse2.assign(static_cast<size_t>(BH * st.cap), 0.f);
  ws.threads.resize(std::max(ws.threads.size(), static_cast<size_t>(max_threads())));
  float* ema_sum = p.train ? ws.ema_sum.floats(static_cast<size_t>(BH * C * (d.Dk + 1))) : nullptr;
  const Rng rng(p.seed);

  parallel_for(BH, [&](int64_t t) {
    const int64_t b = t / d.H, h = t % d.H, hk = h / d.group(), off = d.M - d.N;
    const int64_t nv = valid_queries(in, d, b), mv = valid_keys(in, d, b);
    Scratch& sc = ws.threads[static_cast<size_t>(thread_id())];
    for (int64_t i = 0; i < d.N; ++i) std::memset(out.ptr(b, h, i), 0, sizeof(float) * static_cast<size_t>(dm.Dv));
    if (ema_sum) std::memset(ema_sum + t * C * (d.Dk + 1), 0, sizeof(float) * static_cast<size_t>(C * (d.Dk + 1)));
    if (nv == 0 || mv == 0) return;
    // Unit copies: X = [û (nv rows); k̂ (mv rows)], (n, Dkp).
    const int64_t n = nv + mv;
    float* x = sc.x.floats(static_cast<size_t>(n * dm.Dkp));
    for (int64_t i = 0; i < nv; ++i) unit_row(in.q.ptr(b, h, i), dm.D, dm.Dkp, x + i * dm.Dkp);
    for (int64_t j = 0; j < mv; ++j) unit_row(in.k.ptr(b, hk, j), dm.D, dm.Dkp, x + (nv + j) * dm.Dkp);
    float* cent = sc.cent.floats(static_cast<size_t>(C * dm.D));     // (C, D)
    float* cpan = sc.cpan.floats(static_cast<size_t>(Cp * dm.D));    // (C/64, D, 64)
    float* sx = sc.sq.floats(static_cast<size_t>(n * Cp));          // (n, Cp) cosines
    if (p.train) {
      std::memcpy(cent, ema + h * C * d.Dk, sizeof(float) * static_cast<size_t>(C * d.Dk));
      mk::pack_panels(cent, C, dm.D, dm.D, cpan);
      cosine_scores(x, n, dm.D, dm.Dkp, cpan, C, sx);
    } else {
      // Spherical k-means on an evenly strided sample of at most max(32·C, 4096) unit rows
      // (mini-batch style: the centroids need a sample, not every row; the cost stays O(C·D)
      // per row of the sequence instead of O(iterations·C·D)): C distinct sample rows by a
      // seeded partial Fisher-Yates, then rounds of (nearest by cosine, first maximum wins;
      // centroid = normalised mean; empty keeps its old value) until an assignment repeats or
      // `iterations` rounds are done. Every row is then scored once against the centroids.
      const int64_t stride = std::max<int64_t>(1, (n + std::max<int64_t>(32 * C, 4096) - 1) / std::max<int64_t>(32 * C, 4096));
      const int64_t ns = (n + stride - 1) / stride;
      float* xs = x;  // sample rows are x[r·stride]
      sc.idx.resize(static_cast<size_t>(ns));
      std::iota(sc.idx.begin(), sc.idx.end(), 0);
      for (int64_t s2 = 0; s2 < C; ++s2) {
        const int64_t tt = s2 % ns;
        if (s2 < ns) std::swap(sc.idx[static_cast<size_t>(tt)], sc.idx[static_cast<size_t>(tt + static_cast<int64_t>(rng.below(static_cast<uint64_t>(ns - tt), (call << 32) + static_cast<uint64_t>(t), static_cast<uint64_t>(s2))))]);
        const float* src = xs + sc.idx[static_cast<size_t>(tt)] * stride * dm.Dkp;
        std::copy(src, src + dm.D, cent + s2 * dm.D);
      }
      sc.assign.assign(static_cast<size_t>(ns), -1);
      for (int it = 0; it < p.iterations; ++it) {
        mk::pack_panels(cent, C, dm.D, dm.D, cpan);
        // Sample rows are strided: score them through a row stride of stride·Dkp.
        mk::gemm_abt(ns, (C + kPanel - 1) / kPanel, dm.D, xs, stride * dm.Dkp, cpan, sx, Cp);
        sc.prev = sc.assign;
        for (int64_t r = 0; r < ns; ++r) sc.assign[static_cast<size_t>(r)] = argmax_row(sx + r * Cp, C);
        if (sc.assign == sc.prev) break;
        sc.sums.assign(static_cast<size_t>(C * dm.D), 0.f);
        for (int64_t r = 0; r < ns; ++r) simd::axpy_row(sc.sums.data() + sc.assign[static_cast<size_t>(r)] * dm.D, xs + r * stride * dm.Dkp, dm.D);
        for (int64_t k = 0; k < C; ++k) {
          const float* sm = sc.sums.data() + k * dm.D;
          const float nn = std::sqrt(simd::dot(sm, sm, dm.D));
          if (nn > 0.f) simd::copy_row(cent + k * dm.D, sm, dm.D, dm.D, 1.f / nn);
        }
      }
      mk::pack_panels(cent, C, dm.D, dm.D, cpan);
      cosine_scores(x, n, dm.D, dm.Dkp, cpan, C, sx);
    }
    const float* sq = sx;                   // (nv, Cp) queries' cosines
    const float* sk = sx + nv * Cp;         // (mv, Cp) keys' cosines
    if (ema_sum) {  // train: sums of the unit vectors nearest each centroid, for the EMA update
      float* es = ema_sum + t * C * (d.Dk + 1);
      for (int64_t r = 0; r < n; ++r) {
        const int32_t k = argmax_row(sx + r * Cp, C);
        simd::axpy_row(es + k * (d.Dk + 1), x + r * dm.Dkp, dm.D);
        es[k * (d.Dk + 1) + d.Dk] += 1.f;
      }
    }
    // Windows: the wk keys and wq queries most similar to each centroid.
    const int64_t wk = std::min(st.wk, mv), wq = std::min(wq_max, nv);
    int32_t* keys = st.keys.data() + t * C * st.wk;
    std::vector<int32_t> qsel(static_cast<size_t>(C * wq));
    sc.qcount.assign(static_cast<size_t>(nv), 0);
    top_columns(sk, mv, Cp, C, wk, sc.cand, sc.ncand, sc.thr, keys, st.wk);
    top_columns(sq, nv, Cp, C, wq, sc.cand, sc.ncand, sc.thr, qsel.data(), wq);
    for (int64_t k = 0; k < C; ++k) {
      st.nkeys[static_cast<size_t>(t * C + k)] = static_cast<int32_t>(wk);
      for (int64_t x2 = 0; x2 < wq; ++x2) ++sc.qcount[static_cast<size_t>(qsel[static_cast<size_t>(k * wq + x2)])];
    }
    // Members: each cluster's chosen queries, plus the unchosen queries nearest to it.
    sc.fallback.assign(static_cast<size_t>(nv), -1);
    std::vector<int32_t> nfall(static_cast<size_t>(C), 0);
    for (int64_t i = 0; i < nv; ++i)
      if (sc.qcount[static_cast<size_t>(i)] == 0) {
        sc.fallback[static_cast<size_t>(i)] = argmax_row(sq + i * Cp, C);
        ++nfall[static_cast<size_t>(sc.fallback[static_cast<size_t>(i)])];
      }
    int32_t* moff = st.mem_off.data() + t * (C + 1);
    int32_t* mem = st.mem.data() + t * st.cap;
    float* wgt = st.weight.data() + t * st.cap;
    float* lse2 = st.lse2.data() + t * st.cap;
    for (int64_t k = 0; k < C; ++k) {
      int32_t m = moff[k];
      for (int64_t x2 = 0; x2 < wq; ++x2) {
        const int32_t i = qsel[static_cast<size_t>(k * wq + x2)];
        mem[m] = i;
        wgt[m++] = 1.f / static_cast<float>(sc.qcount[static_cast<size_t>(i)]);
      }
      for (int64_t i = 0; i < nv; ++i)
        if (sc.fallback[static_cast<size_t>(i)] == k) {
          mem[m] = static_cast<int32_t>(i);
          wgt[m++] = 1.f;
        }
      moff[k + 1] = m;
    }
    // Attention inside each cluster; member outputs are added with their weights.
    float* o = sc.o.floats(static_cast<size_t>(kRows * dm.Dvp));
    for (int64_t k = 0; k < C; ++k) {
      Block blk;
      blk.kj = keys + k * st.wk;
      blk.nk = wk;
      gather_window(in, b, hk, dm, blk.kj, blk.nk, sc, &blk.kr, &blk.vr);
      for (int64_t m0 = moff[k]; m0 < moff[k + 1]; m0 += kRows) {
        blk.qi = mem + m0;
        blk.rows = std::min<int64_t>(kRows, moff[k + 1] - m0);
        build_block(in, b, h, hk, dm, c, off, mv, blk, sc);
        std::memset(o, 0, sizeof(float) * static_cast<size_t>(blk.rows * dm.Dvp));
        for (int64_t r = 0; r < blk.rows; ++r) {
          float po;
          const float l2 = tile::softmax_row_extra(blk.s + r * blk.kw, blk.kw, blk.own[r], po);
          lse2[m0 + r] = l2 == -kInf ? kInf : l2;  // nothing visible in this cluster: P = 0 in backward
          if (blk.own_j[r] >= 0 && po > 0.f) simd::axpy_row(o + r * dm.Dvp, in.v.ptr(b, hk, blk.own_j[r]), dm.Dv, po);
        }
        mk::gemm_ab(blk.rows, dm.Dvp, blk.nk, blk.s, blk.kw, 1, blk.vr, dm.Dvp, o, dm.Dvp, nullptr);
        for (int64_t r = 0; r < blk.rows; ++r)
          simd::axpy_row(out.ptr(b, h, blk.qi[r]), o + r * dm.Dvp, dm.Dv, wgt[m0 + r]);
      }
    }
  });
  if (ema_sum)  // EMA update per head over the batch, in a fixed order (deterministic)
    for (int64_t h = 0; h < d.H; ++h)
      for (int64_t k = 0; k < C; ++k) {
        std::vector<double> mean(static_cast<size_t>(d.Dk), 0.0);
        double cnt = 0;
        for (int64_t b = 0; b < d.B; ++b) {
          const float* es = ema_sum + ((b * d.H + h) * C + k) * (d.Dk + 1);
          for (int64_t e = 0; e < d.Dk; ++e) mean[static_cast<size_t>(e)] += es[e];
          cnt += es[d.Dk];
        }
        if (cnt == 0) continue;
        float* ce = ema + (h * C + k) * d.Dk;
        double nn = 0;
        for (int64_t e = 0; e < d.Dk; ++e) {
          ce[e] = static_cast<float>(p.decay * ce[e] + (1.0 - p.decay) * mean[static_cast<size_t>(e)] / cnt);
          nn += static_cast<double>(ce[e]) * ce[e];
        }
        if (nn > 0)
          for (int64_t e = 0; e < d.Dk; ++e) ce[e] = static_cast<float>(ce[e] / std::sqrt(nn));
      }
}

void attn_routing_bwd(const AttentionInputs& in, const AttentionDims& d, const RoutingParams& p,
                      const RoutingState& st, ConstView dout, View dq, View dk, View dv,
                      RoutingWorkspace& ws) {
  const Dims dm{d.Dk, d.Dv, round_up(d.Dk, mk::kLanes), round_up(d.Dv, mk::kLanes)};
  const int64_t C = st.C, G = d.group(), BH = d.B * d.H;
  const float scale = p.scale > 0 ? p.scale : 1.f / std::sqrt(static_cast<float>(d.Dk));
  const float c = scale * kLog2e;
  ws.threads.resize(std::max(ws.threads.size(), static_cast<size_t>(max_threads())));
  float* part = G > 1 ? ws.part.floats(static_cast<size_t>(BH * d.M * (dm.Dkp + dm.Dvp))) : nullptr;
  parallel_for(BH, [&](int64_t t) {
    const int64_t b = t / d.H, h = t % d.H, hk = h / G, off = d.M - d.N;
    const int64_t nv = valid_queries(in, d, b), mv = valid_keys(in, d, b);
    float* pk = part ? part + t * d.M * (dm.Dkp + dm.Dvp) : nullptr;
    if (pk) std::memset(pk, 0, sizeof(float) * static_cast<size_t>(d.M * (dm.Dkp + dm.Dvp)));
    auto gk = [&](int64_t j) { return pk ? pk + j * (dm.Dkp + dm.Dvp) : dk.ptr(b, hk, j); };
    auto gv = [&](int64_t j) { return pk ? pk + j * (dm.Dkp + dm.Dvp) + dm.Dkp : dv.ptr(b, hk, j); };
    if (nv == 0 || mv == 0) return;
    Scratch& sc = ws.threads[static_cast<size_t>(thread_id())];
    const int32_t* moff = st.mem_off.data() + t * (C + 1);
    const int32_t* mem = st.mem.data() + t * st.cap;
    const float* wgt = st.weight.data() + t * st.cap;
    const float* lse2 = st.lse2.data() + t * st.cap;
    float* go = sc.go.floats(static_cast<size_t>(kRows * dm.Dvp));
    for (int64_t k = 0; k < C; ++k) {
      Block blk;
      blk.kj = st.keys.data() + (t * C + k) * st.wk;
      blk.nk = st.nkeys[static_cast<size_t>(t * C + k)];
      gather_window(in, b, hk, dm, blk.kj, blk.nk, sc, &blk.kr, &blk.vr);
      const int64_t kw = round_up(std::max<int64_t>(blk.nk, 1), mk::kLanes);
      float* vt = sc.vt.floats(static_cast<size_t>(dm.Dvp * kw));     // (Dv, kw)
      mk::pack_transposed(blk.vr, kw, dm.Dv, dm.Dvp, vt, kw);
      float* dkc = sc.dkc.floats(static_cast<size_t>(kw * dm.Dkp));   // (kw, Dkp)
      float* dvc = sc.dvc.floats(static_cast<size_t>(kw * dm.Dvp));   // (kw, Dvp)
      std::memset(dkc, 0, sizeof(float) * static_cast<size_t>(kw * dm.Dkp));
      std::memset(dvc, 0, sizeof(float) * static_cast<size_t>(kw * dm.Dvp));
      for (int64_t m0 = moff[k]; m0 < moff[k + 1]; m0 += kRows) {
        blk.qi = mem + m0;
        blk.rows = std::min<int64_t>(kRows, moff[k + 1] - m0);
        build_block(in, b, h, hk, dm, c, off, mv, blk, sc);
        float* dp = sc.dp.floats(static_cast<size_t>(kRows * kw));         // (rows, kw)
        float* dqc = sc.dqc.floats(static_cast<size_t>(kRows * dm.Dkp));   // (rows, Dkp)
        float po[kRows];
        // O_i = Σ_c w_ic O_ic: this cluster's share of dO_i is w_ic dO_i.
        for (int64_t r = 0; r < blk.rows; ++r) {
          simd::copy_row(go + r * dm.Dvp, dout.ptr(b, h, blk.qi[r]), dm.Dv, dm.Dvp, wgt[m0 + r]);
          tile::exp2_row(blk.s + r * kw, kw, lse2[m0 + r]);
          po[r] = std::exp2(blk.own[r] - lse2[m0 + r]);
        }
        std::memset(dp, 0, sizeof(float) * static_cast<size_t>(blk.rows * kw));
        mk::gemm_ab(blk.rows, kw, dm.Dv, go, dm.Dvp, 1, vt, kw, dp, kw, nullptr);
        std::memset(dqc, 0, sizeof(float) * static_cast<size_t>(blk.rows * dm.Dkp));
        for (int64_t r = 0; r < blk.rows; ++r) {
          const float* prow = blk.s + r * kw;
          float* drow = dp + r * kw;
          float dpo = 0.f;
          if (blk.own_j[r] >= 0) dpo = simd::dot(go + r * dm.Dvp, in.v.ptr(b, hk, blk.own_j[r]), dm.Dv);
          float di = po[r] * dpo;  // D = Σ_j P dP over the window and the own key
          for (int64_t x = 0; x < kw; ++x) di += prow[x] * drow[x];
          for (int64_t x = 0; x < kw; ++x) drow[x] = prow[x] * (drow[x] - di) * scale;
          if (blk.own_j[r] >= 0) {
            const int64_t j = blk.own_j[r];
            const float dso = po[r] * (dpo - di) * scale;
            simd::axpy_row(dqc + r * dm.Dkp, in.k.ptr(b, hk, j), dm.D, dso);
            simd::axpy_row(gk(j), in.q.ptr(b, h, blk.qi[r]), dm.D, dso);
            simd::axpy_row(gv(j), go + r * dm.Dvp, dm.Dv, po[r]);
          }
        }
        mk::gemm_ab(blk.rows, dm.Dkp, blk.nk, dp, kw, 1, blk.kr, dm.Dkp, dqc, dm.Dkp, nullptr);
        mk::gemm_ab(blk.nk, dm.Dkp, blk.rows, dp, 1, kw, blk.qs, dm.Dkp, dkc, dm.Dkp, nullptr);
        mk::gemm_ab(blk.nk, dm.Dvp, blk.rows, blk.s, 1, kw, go, dm.Dvp, dvc, dm.Dvp, nullptr);
        for (int64_t r = 0; r < blk.rows; ++r) simd::axpy_row(dq.ptr(b, h, blk.qi[r]), dqc + r * dm.Dkp, dm.D);
      }
      for (int64_t x = 0; x < blk.nk; ++x) {
        simd::axpy_row(gk(blk.kj[x]), dkc + x * dm.Dkp, dm.D, 1.f / c);
        simd::axpy_row(gv(blk.kj[x]), dvc + x * dm.Dvp, dm.Dv);
      }
    }
  });
  if (part) reduce_group_partials(in, d, part, d.M, dm.Dkp + dm.Dvp, dm.Dkp, dk, dv);
}

void attn_routing_ref(const RefProblem& pr, const RoutingState& st, std::vector<double>& out) {
  const AttentionDims& d = pr.d;
  out.assign(static_cast<size_t>(d.B * d.H * d.N * d.Dv), 0.0);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t t = b * d.H + h, mv = pr.nk(b);
      if (pr.nq(b) == 0 || mv == 0) continue;
      const int32_t* moff = st.mem_off.data() + t * (st.C + 1);
      for (int64_t k = 0; k < st.C; ++k) {
        const int32_t* keys = st.keys.data() + (t * st.C + k) * st.wk;
        const int64_t nk = st.nkeys[static_cast<size_t>(t * st.C + k)];
        for (int64_t m = moff[k]; m < moff[k + 1]; ++m) {
          const int64_t i = st.mem[static_cast<size_t>(t * st.cap + m)], pos = i + d.M - d.N;
          std::vector<int64_t> ks;
          bool self_in = false;
          for (int64_t x = 0; x < nk; ++x) {
            if (pr.causal && keys[x] > pos) continue;
            self_in |= keys[x] == pos;
            ks.push_back(keys[x]);
          }
          if (pr.causal && !self_in && pos >= 0 && pos < mv) ks.push_back(pos);
          if (ks.empty()) continue;
          std::vector<double> s(ks.size());
          double mx = -INFINITY, z = 0;
          for (size_t x = 0; x < ks.size(); ++x) {
            double a = 0;
            for (int64_t e = 0; e < d.Dk; ++e) a += pr.qe(b, h, i, e) * pr.ke(b, h, ks[x], e);
            s[x] = a * pr.scale;
            mx = std::max(mx, s[x]);
          }
          for (auto& a : s) z += (a = std::exp(a - mx));
          const double w = st.weight[static_cast<size_t>(t * st.cap + m)];
          double* o = out.data() + (t * d.N + i) * d.Dv;
          for (size_t x = 0; x < ks.size(); ++x)
            for (int64_t e = 0; e < d.Dv; ++e) o[e] += w * s[x] / z * pr.ve(b, h, ks[x], e);
        }
      }
    }
}

namespace {

class RoutingAttention final : public Attention {
 public:
  explicit RoutingAttention(const RoutingParams& p) : p_(p), ws_(make_routing_workspace()) {
    caps_ = Capabilities{.causal = true, .query_lengths = true, .key_lengths = true, .bias = false,
                         .cross = true, .gqa = true, .trainable = true};
  }
  std::string name() const override {
    return detail::concat("routing:clusters=", p_.clusters,
                          p_.window > 0 ? detail::concat(",window=", p_.window) : std::string(),
                          ",iterations=", p_.iterations, ",mode=", p_.train ? "train" : "eval",
                          ",seed=", p_.seed,
                          p_.scale > 0 ? detail::concat(",scale=", p_.scale) : std::string());
  }
  const Capabilities& capabilities() const override { return caps_; }
  // The EMA centroids (H, C, Dk) of train mode; empty until the first train-mode forward.
  const Tensor& ema() const { return ema_; }
  void forward(const AttentionInputs& in, View out, Context& ctx) override {
    const AttentionDims d = validate_inputs(in, caps_, "routing");
    validate_output(out, Shape{d.B, d.H, d.N, d.Dv}, "out", "routing");
    if (p_.train && !(ema_.shape() == Shape{d.H, p_.clusters, d.Dk})) {
      // Layer state: unit-norm Gaussian centroids from the seeded rng, per head.
      ema_.resize(Shape{d.H, p_.clusters, d.Dk});
      const Rng rng(p_.seed);
      for (int64_t r = 0; r < d.H * p_.clusters; ++r) {
        float* ce = ema_.data() + r * d.Dk;
        double nn = 0;
        for (int64_t e = 0; e < d.Dk; ++e) {
          ce[e] = rng.normal(~uint64_t{0}, static_cast<uint64_t>(r * d.Dk + e));
          nn += static_cast<double>(ce[e]) * ce[e];
        }
        for (int64_t e = 0; e < d.Dk; ++e) ce[e] = static_cast<float>(ce[e] / std::sqrt(nn));
      }
    }
    attn_routing_fwd(in, d, p_, calls_++, p_.train ? ema_.data() : nullptr, out, ctx.state<RoutingState>(), *ws_);
  }
  void backward(const AttentionInputs& in, const Context& ctx, ConstView dout, View dq, View dk,
                View dv) override {
    const AttentionDims d = validate_inputs(in, caps_, "routing");
    const RoutingState& st = ctx.state<RoutingState>();
    check(st.mem_off.size() == static_cast<size_t>(d.B * d.H * (st.C + 1)) && st.C == p_.clusters,
          "routing: backward inputs have shapes other than the forward's (q is now ", in.q.shape.str(), ")");
    validate_backward(in, d, dout, dq, dk, dv, "routing");
    attn_routing_bwd(in, d, p_, st, dout, dq, dk, dv, *ws_);
  }

 private:
  RoutingParams p_;
  Capabilities caps_;
  uint64_t calls_ = 0;
  Tensor ema_;
  RoutingWorkspacePtr ws_;
};

}  // namespace

std::unique_ptr<Attention> make_routing(const Spec& spec) {
  SpecReader r(spec);
  RoutingParams p;
  check(r.has("clusters"), "spec '", spec.text, "': clusters is required (e.g. routing:clusters=128)");
  p.clusters = r.get_int("clusters", 0, 1, 1 << 16);
  p.window = r.get_int("window", 0, 1, int64_t{1} << 40);
  p.iterations = static_cast<int>(r.get_int("iterations", 10, 0, 1000));
  p.train = r.get_choice("mode", "eval", {"eval", "train"}) == "train";
  p.decay = static_cast<float>(r.get_float("decay", 0.999, 0.0, 1.0));
  p.scale = static_cast<float>(r.get_float("scale", 0.0, 1e-6, 1e6));
  p.seed = static_cast<uint64_t>(r.get_int("seed", 0, 0, int64_t{1} << 62));
  r.finish();
  return std::make_unique<RoutingAttention>(p);
}

}  // namespace clattn
