// Routing attention. Routing uses unit-norm copies of queries and keys; centroids (per head, shared
// by queries and keys) come from spherical k-means on the sequence's unit queries and keys
// (centroids=kmeans, the default) or are layer state kept by EMA (centroids=ema: the caller's
// AttentionState buffer "centroids" (H, C, Dk), seeded unit rows when absent; a training call
// (AttentionInputs::train) updates it after the forward with the mean of the unit vectors nearest
// each centroid (decay 0.999), then renormalises; an evaluation call only reads it). Each cluster takes the `window` keys and the `window` queries most similar to
// its centroid (cosine; ties to the lower index); its queries attend its keys with the real s·q·k,
// and a query chosen by several clusters averages their outputs. A query chosen by none attends
// the key window of its nearest centroid (the original gives it 0).
// Causal (strictly: a position's output never depends on a later position). Choosing each
// cluster's `window` most similar queries and keys over the whole sequence, or centroids by
// k-means over it, would not be. Under a causal mask the routing needs fixed centroids
// (centroids=ema: with k-means the causal mask is refused), and each query and each key joins its
// nearest centroid (cosine, first maximum): the attention is the causal bucket-window attention of
// tile/bucket_window.h with those clusters as buckets and the key window (window=, or ceil(M/C))
// as its window — a query attends the `window` most recent earlier keys of its cluster, and
// always its own key. Training calls update the EMA centroids from the same nearest centroids.
// Work is parallel over (batch, head): k-means on
// a sample, one cosine pass over the raw rows (blocks of 256 against the centroids) feeding the
// window selection, then per cluster three small products on gathered blocks of 64 members.
// Memory O(N + C·window + 256·C). The default window N/C makes the attention O(N²/C) at fixed
// C; a fixed `window=` keeps it linear (docs/design.md, "Routing's window").
#include "attention/validate.h"
#include "attention/routing/routing.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "attention/full/full.h"
#include "attention/tile/gather.h"
#include "attention/tile/tile_ops.h"
#include "attention/tile/topk_select.h"
#include "attention/tile/grad_util.h"
#include "attention/query_groups.h"
#include "attention/registry.h"
#include "clattn/threads.h"
#include "clattn/rng.h"
#include "core/microkernel.h"
#include "core/simd.h"

namespace clattn {

using mk::kPanel;
using mk::round_up;
using tile::kInf;
using tile::kLog2e;

namespace {

constexpr int64_t kRows = 64;    // members per block
constexpr int64_t kScore = 256;  // rows per block of the cosine pass

// For every column c < C of a stream of score rows: its `w` largest entries (ties to the lower
// row), kept as a threshold-filtered candidate buffer per column (topk_select.h), so after the
// first rows a whole vector of 16 columns is usually rejected by one compare. The buffer holds 4w
// candidates: each compaction (a selection over the buffer) then makes room for 3w insertions,
// which halves the selection work of a 2w buffer. Rows arrive block by block; finish() writes
// ascending row indices.
struct TopColumns {
  static constexpr int64_t kSlack = 4;
  int64_t C = 0, w = 0;
  std::vector<Cand> cand;     // (C, 4w)
  std::vector<int64_t> ncand; // (C)
  std::vector<float> thr;     // (C rounded up to 16)
  void reset(int64_t c, int64_t width) {
    C = c;
    w = width;
    cand.resize(static_cast<size_t>(C * kSlack * w));
    ncand.assign(static_cast<size_t>(C), 0);
    thr.assign(static_cast<size_t>(round_up(C, simd::kLanes)), w > 0 ? -kInf : kInf);
  }
  // rows (n, ld) of scores, the first being row r0 of the stream.
  void add(const float* scores, int64_t n, int64_t ld, int64_t r0) {
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
          Cand* buf = cand.data() + c * kSlack * w;
          int64_t& nc = ncand[static_cast<size_t>(c)];
          buf[nc++] = Cand{row[c], static_cast<int32_t>(r0 + r)};
          if (nc == kSlack * w) thr[static_cast<size_t>(c)] = top_compact(buf, nc, w);
        }
      }
    }
  }
  // Takes in the candidates of `other`, the same columns over a later, disjoint range of rows:
  // each holds its range's exact w best (ties to the lower row), so the w best of the two sets
  // are the w best of both ranges, whatever order the ranges were scanned in.
  // Column by column, so a split head merges and finishes its columns over the team.
  void merge(int64_t c, TopColumns& other) {
    Cand* buf = cand.data() + c * kSlack * w;
    Cand* ob = other.cand.data() + c * kSlack * w;
    int64_t& nc = ncand[static_cast<size_t>(c)];
    int64_t& on = other.ncand[static_cast<size_t>(c)];
    top_compact(buf, nc, w);
    top_compact(ob, on, w);
    std::copy(ob, ob + on, buf + nc);  // nc, on <= w: fits the 4w buffer
    nc += on;
    thr[static_cast<size_t>(c)] = top_compact(buf, nc, w);
  }
  // Column c's w rows, ascending, to out (w).
  void finish(int64_t c, int32_t* out) {
    Cand* buf = cand.data() + c * kSlack * w;
    int64_t nc = ncand[static_cast<size_t>(c)];
    top_compact(buf, nc, w);
    for (int64_t x = 0; x < w; ++x) out[x] = buf[x].i;
    std::sort(out, out + w);
  }
};

struct ThreadScratch {
  std::vector<int32_t> assign, prev, idx, qcount, nearest, qsel, nfall;
  std::vector<float> qinv, kinv;  // (nv), (mv) 1/|x|
  std::vector<float> sums, unit;
  TopColumns qtop, ktop;
  Workspace xs, cent, cpan, sblk, qs, kr, kt, vr, vt, s, o, go, dp, dqc, dkc, dvc;
  size_t bytes() const {
    return held_bytes(assign, prev, idx, qcount, nearest, qsel, nfall, qinv, kinv, sums, unit,
                      qtop.cand, qtop.ncand, qtop.thr, ktop.cand, ktop.ncand, ktop.thr, xs, cent,
                      cpan, sblk, qs, kr, kt, vr, vt, s, o, go, dp, dqc, dkc, dvc);
  }
};

}  // namespace

struct RoutingWorkspace {
  Workspace part;  // (B, H, M, Dkp + Dvp) backward with GQA
  Workspace ema_sum;  // (B, H, C, D + 1) EMA training calls: sums and counts for the EMA update
  // A head split over the team (fewer heads than threads): per member slot its weighted output,
  // or in the backward its dq row (members, Dkp) and per window slot its dK, dV rows
  // (C·wk, Dkp + Dvp); offsets and lists of gather::by_row.
  Workspace slots, wslots;
  std::vector<int64_t> off, list;
  std::vector<ThreadScratch> threads;
  size_t bytes() const {
    size_t n = held_bytes(part, ema_sum, slots, wslots, off, list, threads);
    for (const ThreadScratch& t : threads) n += t.bytes();
    return n;
  }
};

namespace {

// 1/|x| of rows (n, D) with row stride rs (0 for a zero row).
void inverse_norms(const float* base, int64_t rs, int64_t n, int64_t D, float* inv) {
  for (int64_t i = 0; i < n; ++i) {
    const float nn = std::sqrt(simd::dot(base + i * rs, base + i * rs, D));
    inv[i] = nn > 0.f ? 1.f / nn : 0.f;
  }
}

// First index of the maximum of row[0, C): a vector max, then the first lane holding it. A
// partial last vector is padded with -inf (load_partial's zeros would beat negative cosines).
int32_t argmax_row(const float* row, int64_t C) {
  constexpr int L = simd::kLanes;
  auto lanes_at = [&](int64_t c) {
    if (C - c >= L) return simd::load(row + c);
    alignas(64) float tail[L];
    std::fill(tail, tail + L, -kInf);
    std::copy(row + c, row + C, tail);
    return simd::load(tail);
  };
  simd::vf m = simd::splat(-kInf);
  for (int64_t c = 0; c < C; c += L) m = simd::vmax(m, lanes_at(c));
  const float best = simd::hmax(m);
  for (int64_t c = 0; c < C; c += L) {
    const uint32_t hit = ~simd::mask_gt_v(simd::splat(best), lanes_at(c)) & 0xFFFFu;
    if (hit) return static_cast<int32_t>(c + __builtin_ctz(hit));
  }
  return 0;  // a row of NaN (never: inputs are finite)
}

struct Dims {
  int64_t D, Dv, Dkp, Dvp;
};

// Cosines of rows (n, D) (row stride rs, inverse norms inv) against the packed centroids, block
// by block in scratch: every block feeds the top-window selection, and `each` sees every row's
// cosines (nearest centroid, EMA sums).
// Rows [first, n) only, when given: one thread's range of a head split over the team.
template <class Each>
void cosine_pass(const float* base, int64_t rs, int64_t n, const float* inv, const Dims& dm,
                 const float* cpan, int64_t C, float* blk, TopColumns& top, Each&& each, int64_t first = 0) {
  const int64_t np = (C + kPanel - 1) / kPanel, ld = np * kPanel;
  for (int64_t r0 = first; r0 < n; r0 += kScore) {
    const int64_t nr = std::min(kScore, n - r0);
    mk::gemm_abt(nr, np, dm.D, base + r0 * rs, rs, cpan, blk, ld);
    for (int64_t r = 0; r < nr; ++r) {
      float* row = blk + r * ld;
      const simd::vf f = simd::splat(inv[r0 + r]);
      for (int64_t c = 0; c < ld; c += simd::kLanes) simd::store(row + c, simd::load(row + c) * f);
      each(r0 + r, row);
    }
    top.add(blk, nr, ld, r0);
  }
}

// A block of one cluster's members against its key window (gathered once per cluster): scaled
// query rows and their scores (rows, kw), key columns past nk masked. (A causal mask never
// reaches the clusters: it takes the bucket-window path.)
struct Block {
  int64_t rows, nk, kw;
  const int32_t* qi;
  const int32_t* kj;
  float *qs, *s;
};

void build_block(const AttentionInputs& in, int64_t b, int64_t h, const Dims& dm, float c, const float* kt,
                 Block& blk, ThreadScratch& sc) {
  const int64_t kw = blk.kw;
  blk.qs = sc.qs.floats(static_cast<size_t>(kRows * dm.Dkp));
  blk.s = sc.s.floats(static_cast<size_t>(kRows * kw));
  gather::rows(in.q.ptr(b, h, 0), in.q.stride(2), blk.qi, blk.rows, dm.D, blk.qs, dm.Dkp, blk.rows, c);
  std::memset(blk.s, 0, sizeof(float) * static_cast<size_t>(blk.rows * kw));
  mk::gemm_ab(blk.rows, kw, dm.D, blk.qs, dm.Dkp, 1, kt, kw, blk.s, kw, nullptr);
  for (int64_t r = 0; r < blk.rows; ++r) tile::mask_tail(blk.s + r * kw, kw, blk.nk);
}

// Requests the key window of the next cluster (its key and value rows) while this one computes.
void prefetch_window(const AttentionInputs& in, int64_t b, int64_t hk, const Dims& dm,
                     const int32_t* kj, int64_t nk) {
  gather::prefetch(in.k.ptr(b, hk, 0), in.k.stride(2), kj, nk, dm.D);
  gather::prefetch(in.v.ptr(b, hk, 0), in.v.stride(2), kj, nk, dm.Dv);
}

}  // namespace

namespace {

// EMA update per head over the batch, in a fixed order (deterministic): ema_sum (B, H, C, Dk + 1)
// holds the sums of the unit vectors nearest each centroid and their count.
void ema_update(float* ema, const float* ema_sum, const AttentionDims& d, const RoutingParams& p) {
  const int64_t C = p.clusters;
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

}  // namespace

void routing_causal_buckets(const AttentionInputs& in, const AttentionDims& d, const RoutingParams& p,
                            float* ema, bool update, BucketWindow& bw, RoutingWorkspace& ws) {
  const int64_t C = p.clusters, Cp = round_up(C, kPanel), BH = d.B * d.H, D = d.Dk;
  bw.rounds = 1;
  bw.window = std::max<int64_t>(1, p.window > 0 ? p.window : (d.M + C - 1) / C);
  bw.qb.assign(static_cast<size_t>(BH * d.N), 0);
  bw.kb.assign(static_cast<size_t>(BH * d.M), 0);
  ws.threads.resize(std::max(ws.threads.size(), static_cast<size_t>(max_threads())));
  float* ema_sum = update ? ws.ema_sum.floats(static_cast<size_t>(BH * C * (D + 1))) : nullptr;
  parallel_for(BH, [&](int64_t t, int thread) {
    const int64_t b = t / d.H, h = t % d.H, hk = h / d.group();
    const int64_t nv = valid_queries(in, d, b), mv = valid_keys(in, d, b);
    ThreadScratch& sc = ws.threads[static_cast<size_t>(thread)];
    float* cpan = sc.cpan.floats(static_cast<size_t>(Cp * D));          // (C/64, D, 64)
    float* blk = sc.sblk.floats(static_cast<size_t>(kPanel * Cp));      // (64, Cp) scores
    mk::pack_panels(ema + h * C * D, C, D, D, cpan);
    float* es = ema_sum ? ema_sum + t * C * (D + 1) : nullptr;
    if (es) std::memset(es, 0, sizeof(float) * static_cast<size_t>(C * (D + 1)));
    // The nearest centroid of each row (argmax of x·μ_c: the positive 1/|x| changes no argmax),
    // and for the EMA the sum of the unit rows nearest each centroid.
    auto route = [&](const float* base, int64_t rs, int64_t n, int32_t* out) {
      for (int64_t r0 = 0; r0 < n; r0 += kPanel) {
        const int64_t rows = std::min<int64_t>(kPanel, n - r0);
        mk::gemm_abt(rows, (C + kPanel - 1) / kPanel, D, base + r0 * rs, rs, cpan, blk, Cp);
        for (int64_t r = 0; r < rows; ++r) {
          const int32_t k = argmax_row(blk + r * Cp, C);
          out[r0 + r] = k;
          if (!es) continue;
          const float* x = base + (r0 + r) * rs;
          const float nn = std::sqrt(simd::dot(x, x, D));
          if (nn > 0.f) simd::axpy_row(es + k * (D + 1), x, D, 1.f / nn);
          es[k * (D + 1) + D] += 1.f;
        }
      }
    };
    route(in.q.ptr(b, h, 0), in.q.stride(2), nv, bw.qb.data() + t * d.N);
    route(in.k.ptr(b, hk, 0), in.k.stride(2), mv, bw.kb.data() + t * d.M);
  });
  if (ema_sum) ema_update(ema, ema_sum, d, p);
}

void attn_routing_fwd(const AttentionInputs& in, const AttentionDims& d, const RoutingParams& p,
                      uint64_t step, float* ema, bool update, View out, RoutingState& st,
                      RoutingWorkspace& ws) {
  const Dims dm{d.Dk, d.Dv, round_up(d.Dk, mk::kLanes), round_up(d.Dv, mk::kLanes)};
  const int64_t C = p.clusters, Cp = round_up(C, kPanel), BH = d.B * d.H;
  const float scale = softmax_scale(p.scale, d.Dk);
  const float c = scale * kLog2e;
  const int64_t wq_max = p.window > 0 ? std::min(p.window, d.N) : (d.N + C - 1) / C;
  st.C = C;
  st.wk = std::max<int64_t>(1, p.window > 0 ? std::min(p.window, d.M) : (d.M + C - 1) / C);
  st.cap = C * wq_max + d.N;
  st.keys.assign(static_cast<size_t>(BH * C * st.wk), -1);
  st.nkeys.assign(static_cast<size_t>(BH * C), 0);
  st.mem_off.assign(static_cast<size_t>(BH * (C + 1)), 0);
  st.mem.resize(static_cast<size_t>(BH * st.cap));
  st.weight.resize(static_cast<size_t>(BH * st.cap));
  st.lse2.resize(static_cast<size_t>(BH * st.cap));
  st.centroids.assign(static_cast<size_t>(BH * C * d.Dk), 0.f);
  ws.threads.resize(std::max(ws.threads.size(), static_cast<size_t>(max_threads())));
  float* ema_sum = p.train && update ? ws.ema_sum.floats(static_cast<size_t>(BH * C * (d.Dk + 1))) : nullptr;
  const Rng rng(p.seed);

  // With fewer heads than threads a head's clusters split over the team (split_tasks): the
  // selection before them is serial, and each member's weighted output goes to its slot, added
  // into its query's row in slot order afterwards (the unsplit order).
  const bool split = split_tasks(BH);
  auto head = [&](int64_t t, int thread) {
    const int64_t b = t / d.H, h = t % d.H, hk = h / d.group();
    const int64_t nv = valid_queries(in, d, b), mv = valid_keys(in, d, b);
    ThreadScratch& sc = ws.threads[static_cast<size_t>(thread)];
    for (int64_t i = 0; i < d.N; ++i) std::memset(out.ptr(b, h, i), 0, sizeof(float) * static_cast<size_t>(dm.Dv));
    if (ema_sum) std::memset(ema_sum + t * C * (d.Dk + 1), 0, sizeof(float) * static_cast<size_t>(C * (d.Dk + 1)));
    if (nv == 0 || mv == 0) return;
    const float* qb = in.q.ptr(b, h, 0);
    const float* kb = in.k.ptr(b, hk, 0);
    const int64_t qrs = in.q.stride(2), krs = in.k.stride(2);
    sc.qinv.resize(static_cast<size_t>(nv));
    sc.kinv.resize(static_cast<size_t>(mv));
    // A split head's selection runs over the team too, in ranges of rows whose results are the
    // same as the serial pass's: norms and nearest centroids row by row, the top windows per
    // thread range and merged (TopColumns::merge). The EMA sums of a training call stay serial.
    constexpr int64_t kNormRows = 4096;
    auto norms = [&](const float* base, int64_t rs, int64_t n, float* inv) {  // inv (n)
      split_for(split, (n + kNormRows - 1) / kNormRows, thread, [&](int64_t x, int) {
        const int64_t r0 = x * kNormRows;
        inverse_norms(base + r0 * rs, rs, std::min(kNormRows, n - r0), dm.D, inv + r0);
      });
    };
    norms(qb, qrs, nv, sc.qinv.data());
    norms(kb, krs, mv, sc.kinv.data());
    // Row r of the routing set [q̂ (nv rows); k̂ (mv rows)].
    auto unit_row = [&](int64_t r, float* dst, int64_t pad) {
      if (r < nv) simd::copy_row(dst, qb + r * qrs, dm.D, pad, sc.qinv[static_cast<size_t>(r)]);
      else simd::copy_row(dst, kb + (r - nv) * krs, dm.D, pad, sc.kinv[static_cast<size_t>(r - nv)]);
    };
    const int64_t n = nv + mv;
    float* cent = st.centroids.data() + t * C * d.Dk;                 // (C, D)
    float* cpan = sc.cpan.floats(static_cast<size_t>(Cp * dm.D));     // (C/64, D, 64)
    if (p.train) {
      std::memcpy(cent, ema + h * C * d.Dk, sizeof(float) * static_cast<size_t>(C * d.Dk));
    } else {
      // Spherical k-means on an evenly strided sample of at most max(32·C, 4096) unit rows
      // (mini-batch style: the centroids need a sample, not every row; the cost stays O(C·D)
      // per row of the sequence instead of O(iterations·C·D)): C distinct sample rows by a
      // seeded partial Fisher-Yates, then rounds of (nearest by cosine, first maximum wins;
      // centroid = normalised mean; empty keeps its old value) until an assignment repeats or
      // `iterations` rounds are done. Every row is then scored once against the centroids.
      const int64_t cap = std::max<int64_t>(32 * C, 4096);
      const int64_t stride = std::max<int64_t>(1, (n + cap - 1) / cap);
      const int64_t ns = (n + stride - 1) / stride;
      float* xs = sc.xs.floats(static_cast<size_t>(ns * dm.Dkp));  // (ns, Dkp) sample rows r·stride
      for (int64_t r = 0; r < ns; ++r) unit_row(r * stride, xs + r * dm.Dkp, dm.Dkp);
      float* sx = sc.sblk.floats(static_cast<size_t>(ns * Cp));     // (ns, Cp) their cosines
      sc.idx.resize(static_cast<size_t>(ns));
      std::iota(sc.idx.begin(), sc.idx.end(), 0);
      for (int64_t s2 = 0; s2 < C; ++s2) {
        const int64_t tt = s2 % ns;
        if (s2 < ns) std::swap(sc.idx[static_cast<size_t>(tt)], sc.idx[static_cast<size_t>(tt + static_cast<int64_t>(rng.below(static_cast<uint64_t>(ns - tt), (step << 32) + static_cast<uint64_t>(t), static_cast<uint64_t>(s2))))]);
        const float* src = xs + sc.idx[static_cast<size_t>(tt)] * dm.Dkp;
        std::copy(src, src + dm.D, cent + s2 * dm.D);
      }
      sc.assign.assign(static_cast<size_t>(ns), -1);
      for (int it = 0; it < p.iterations; ++it) {
        mk::pack_panels(cent, C, dm.D, dm.D, cpan);
        sc.prev = sc.assign;
        split_for(split, (ns + kScore - 1) / kScore, thread, [&](int64_t x, int) {
          const int64_t r0 = x * kScore, nr = std::min(kScore, ns - r0);
          mk::gemm_abt(nr, (C + kPanel - 1) / kPanel, dm.D, xs + r0 * dm.Dkp, dm.Dkp, cpan, sx + r0 * Cp, Cp);
          for (int64_t r = r0; r < r0 + nr; ++r) sc.assign[static_cast<size_t>(r)] = argmax_row(sx + r * Cp, C);
        });
        if (sc.assign == sc.prev) break;
        sc.sums.assign(static_cast<size_t>(C * dm.D), 0.f);
        for (int64_t r = 0; r < ns; ++r) simd::axpy_row(sc.sums.data() + sc.assign[static_cast<size_t>(r)] * dm.D, xs + r * dm.Dkp, dm.D);
        for (int64_t k = 0; k < C; ++k) {
          const float* sm = sc.sums.data() + k * dm.D;
          const float nn = std::sqrt(simd::dot(sm, sm, dm.D));
          if (nn > 0.f) simd::copy_row(cent + k * dm.D, sm, dm.D, dm.D, 1.f / nn);
        }
      }
    }
    mk::pack_panels(cent, C, dm.D, dm.D, cpan);
    // One pass over the queries, then the keys: the wk keys and wq queries most similar to each
    // centroid, every query's nearest centroid (the fallback of unchosen ones) and, in train
    // mode, the sums of the unit vectors nearest each centroid for the EMA update.
    const int64_t wk = std::min(st.wk, mv), wq = std::min(wq_max, nv);
    float* blk = sc.sblk.floats(static_cast<size_t>(kScore * Cp));  // (256, Cp) cosines
    float* es = ema_sum ? ema_sum + t * C * (d.Dk + 1) : nullptr;
    sc.unit.resize(static_cast<size_t>(dm.Dkp));
    float* unit = sc.unit.data();
    auto ema_add = [&](int64_t r, const float* row) {
      const int32_t k = argmax_row(row, C);
      unit_row(r, unit, dm.D);
      simd::axpy_row(es + k * (d.Dk + 1), unit, dm.D);
      es[k * (d.Dk + 1) + d.Dk] += 1.f;
    };
    // top (C, w) over rows (n) of base: serially, or over the team in contiguous ranges (each in
    // row order, as TopColumns::add needs) whose partial tops merge in range order.
    auto select = [&](const float* base, int64_t rs, int64_t n, const float* inv, TopColumns& top, int64_t w,
                      auto&& each) {
      top.reset(C, w);
      if (!split || es) return cosine_pass(base, rs, n, inv, dm, cpan, C, blk, top, each);
      const int64_t chunks = (n + kScore - 1) / kScore;
      int team = 1;
      parallel_team([&](int th, int T) {
        if (th == 0) team = T;
        ThreadScratch& tc = ws.threads[static_cast<size_t>(th)];
        TopColumns& part = th == 0 ? top : tc.qtop;  // thread 0's scratch is sc: its own top
        if (th != 0) part.reset(C, w);
        float* tb = th == 0 ? blk : tc.sblk.floats(static_cast<size_t>(kScore * Cp));  // (256, Cp)
        const int64_t c0 = chunks * th / T, c1 = chunks * (th + 1) / T;
        cosine_pass(base, rs, std::min(n, c1 * kScore), inv, dm, cpan, C, tb, part, each, c0 * kScore);
      });
      split_for(true, C, thread, [&](int64_t col, int) {
        for (int th = 1; th < team; ++th) top.merge(col, ws.threads[static_cast<size_t>(th)].qtop);
      });
    };
    sc.nearest.resize(static_cast<size_t>(nv));
    select(qb, qrs, nv, sc.qinv.data(), sc.qtop, wq, [&](int64_t i, const float* row) {
      sc.nearest[static_cast<size_t>(i)] = argmax_row(row, C);
      if (es) ema_add(i, row);
    });
    select(kb, krs, mv, sc.kinv.data(), sc.ktop, wk, [&](int64_t j, const float* row) {
      if (es) ema_add(nv + j, row);
    });
    int32_t* keys = st.keys.data() + t * C * st.wk;
    sc.qsel.resize(static_cast<size_t>(C * wq));
    split_for(split, C, thread, [&](int64_t col, int) {
      sc.ktop.finish(col, keys + col * st.wk);
      sc.qtop.finish(col, sc.qsel.data() + col * wq);
    });
    sc.qcount.assign(static_cast<size_t>(nv), 0);
    for (int64_t k = 0; k < C; ++k) {
      st.nkeys[static_cast<size_t>(t * C + k)] = static_cast<int32_t>(wk);
      for (int64_t x2 = 0; x2 < wq; ++x2) ++sc.qcount[static_cast<size_t>(sc.qsel[static_cast<size_t>(k * wq + x2)])];
    }
    // Members: each cluster's chosen queries, then the unchosen queries nearest to it (a
    // counting sort by nearest centroid keeps them in increasing index).
    int32_t* moff = st.mem_off.data() + t * (C + 1);
    int32_t* mem = st.mem.data() + t * st.cap;
    float* wgt = st.weight.data() + t * st.cap;
    float* lse2 = st.lse2.data() + t * st.cap;
    sc.nfall.assign(static_cast<size_t>(C + 1), 0);
    for (int64_t i = 0; i < nv; ++i)
      if (sc.qcount[static_cast<size_t>(i)] == 0) ++sc.nfall[static_cast<size_t>(sc.nearest[static_cast<size_t>(i)]) + 1];
    for (int64_t k = 0; k < C; ++k) moff[k + 1] = static_cast<int32_t>(moff[k] + wq + sc.nfall[static_cast<size_t>(k) + 1]);
    for (int64_t k = 0; k < C; ++k) {
      for (int64_t x2 = 0; x2 < wq; ++x2) {
        const int32_t i = sc.qsel[static_cast<size_t>(k * wq + x2)];
        mem[moff[k] + x2] = i;
        wgt[moff[k] + x2] = 1.f / static_cast<float>(sc.qcount[static_cast<size_t>(i)]);
      }
      sc.nfall[static_cast<size_t>(k)] = static_cast<int32_t>(moff[k] + wq);  // next fallback slot
    }
    for (int64_t i = 0; i < nv; ++i)
      if (sc.qcount[static_cast<size_t>(i)] == 0) {
        const int32_t m = sc.nfall[static_cast<size_t>(sc.nearest[static_cast<size_t>(i)])]++;
        mem[m] = static_cast<int32_t>(i);
        wgt[m] = 1.f;
      }
    // Attention inside each cluster; member outputs are added with their weights.
    const int64_t kw = round_up(std::max<int64_t>(wk, 1), mk::kLanes);
    float* ob = out.ptr(b, h, 0);
    const int64_t ors = out.stride(2);
    auto attend = [&](int64_t k, ThreadScratch& tc, auto&& emit) {  // emit(member slot, output row)
      float* kt = tc.kt.floats(static_cast<size_t>(dm.Dkp * kw));  // (D, kw) window keys transposed
      float* vr = tc.vr.floats(static_cast<size_t>(kw * dm.Dvp));  // (wk, Dvp) window values
      float* o = tc.o.floats(static_cast<size_t>(kRows * dm.Dvp));
      Block blk2;
      blk2.kj = keys + k * st.wk;
      blk2.nk = wk;
      blk2.kw = kw;
      gather::transposed(kb, krs, blk2.kj, wk, dm.D, kt, kw);
      gather::rows(in.v.ptr(b, hk, 0), in.v.stride(2), blk2.kj, wk, dm.Dv, vr, dm.Dvp, wk);
      if (k + 1 < C) prefetch_window(in, b, hk, dm, keys + (k + 1) * st.wk, wk);
      for (int64_t m0 = moff[k]; m0 < moff[k + 1]; m0 += kRows) {
        blk2.qi = mem + m0;
        blk2.rows = std::min<int64_t>(kRows, moff[k + 1] - m0);
        build_block(in, b, h, dm, c, kt, blk2, tc);
        std::memset(o, 0, sizeof(float) * static_cast<size_t>(blk2.rows * dm.Dvp));
        for (int64_t r = 0; r < blk2.rows; ++r) {
          const float l2 = tile::softmax_row(blk2.s + r * kw, kw);
          lse2[m0 + r] = l2 == -kInf ? kInf : l2;  // nothing visible in this cluster: P = 0 in backward
        }
        mk::gemm_ab(blk2.rows, dm.Dvp, blk2.nk, blk2.s, kw, 1, vr, dm.Dvp, o, dm.Dvp, nullptr);
        for (int64_t r = 0; r < blk2.rows; ++r) emit(m0 + r, o + r * dm.Dvp);
      }
    };
    if (!split) {
      for (int64_t k = 0; k < C; ++k)
        attend(k, sc, [&](int64_t m, const float* row) { simd::axpy_row(ob + mem[m] * ors, row, dm.Dv, wgt[m]); });
      return;
    }
    float* mo = ws.slots.floats(static_cast<size_t>(std::max(1, moff[C]) * dm.Dvp));  // (members, Dvp)
    parallel_for(C, [&](int64_t k, int th) {
      attend(k, ws.threads[static_cast<size_t>(th)], [&](int64_t m, const float* row) {
        std::memcpy(mo + m * dm.Dvp, row, sizeof(float) * static_cast<size_t>(dm.Dv));
      });
    });
    gather::by_row(
        moff[C], nv, [&](int64_t m) { return mem[m]; },
        [&](int64_t i, int64_t m) { simd::axpy_row(ob + i * ors, mo + m * dm.Dvp, dm.Dv, wgt[m]); }, ws.off,
        ws.list);
  };
  if (split) {
    for (int64_t t = 0; t < BH; ++t) head(t, 0);
  } else {
    parallel_for(BH, [&](int64_t t, int thread) { head(t, thread); });
  }
  if (ema_sum) ema_update(ema, ema_sum, d, p);
}

void attn_routing_bwd(const AttentionInputs& in, const AttentionDims& d, const RoutingParams& p,
                      const RoutingState& st, ConstView dout, View dq, View dk, View dv,
                      RoutingWorkspace& ws) {
  const Dims dm{d.Dk, d.Dv, round_up(d.Dk, mk::kLanes), round_up(d.Dv, mk::kLanes)};
  const int64_t C = st.C, G = d.group(), BH = d.B * d.H;
  const float scale = softmax_scale(p.scale, d.Dk);
  const float c = scale * kLog2e;
  ws.threads.resize(std::max(ws.threads.size(), static_cast<size_t>(max_threads())));
  float* part = G > 1 ? ws.part.floats(static_cast<size_t>(BH * d.M * (dm.Dkp + dm.Dvp))) : nullptr;
  // A split head (as in the forward): clusters over the team, each member's dq row and each
  // window slot's dK, dV rows to their slots, added into their rows in slot order afterwards.
  const bool split = split_tasks(BH);
  auto head = [&](int64_t t, int thread) {
    const int64_t b = t / d.H, h = t % d.H, hk = h / G;
    const int64_t nv = valid_queries(in, d, b), mv = valid_keys(in, d, b);
    float* pk = part ? part + t * d.M * (dm.Dkp + dm.Dvp) : nullptr;
    if (pk) std::memset(pk, 0, sizeof(float) * static_cast<size_t>(d.M * (dm.Dkp + dm.Dvp)));
    auto gk = [&](int64_t j) { return pk ? pk + j * (dm.Dkp + dm.Dvp) : dk.ptr(b, hk, j); };
    auto gv = [&](int64_t j) { return pk ? pk + j * (dm.Dkp + dm.Dvp) + dm.Dkp : dv.ptr(b, hk, j); };
    if (nv == 0 || mv == 0) return;
    const int32_t* moff = st.mem_off.data() + t * (C + 1);
    const int32_t* mem = st.mem.data() + t * st.cap;
    const float* wgt = st.weight.data() + t * st.cap;
    const float* lse2 = st.lse2.data() + t * st.cap;
    const float* kb = in.k.ptr(b, hk, 0);
    const int64_t krs = in.k.stride(2);
    // emit_q(member slot, dq row); emit_k(window slot x, dK row, dV row).
    auto cluster = [&](int64_t k, ThreadScratch& sc, auto&& emit_q, auto&& emit_k) {
      float* go = sc.go.floats(static_cast<size_t>(kRows * dm.Dvp));
      Block blk;
      blk.kj = st.keys.data() + (t * C + k) * st.wk;
      blk.nk = st.nkeys[static_cast<size_t>(t * C + k)];
      const int64_t kw = round_up(std::max<int64_t>(blk.nk, 1), mk::kLanes);
      blk.kw = kw;
      float* kr = sc.kr.floats(static_cast<size_t>(kw * dm.Dkp));     // (nk, Dkp) window key rows
      float* kt = sc.kt.floats(static_cast<size_t>(dm.Dkp * kw));     // (D, kw) their transpose
      float* vt = sc.vt.floats(static_cast<size_t>(dm.Dvp * kw));     // (Dv, kw) values transposed
      gather::rows(kb, krs, blk.kj, blk.nk, dm.D, kr, dm.Dkp, blk.nk);
      gather::transpose(kr, dm.Dkp, blk.nk, dm.D, kt, kw);
      gather::transposed(in.v.ptr(b, hk, 0), in.v.stride(2), blk.kj, blk.nk, dm.Dv, vt, kw);
      if (k + 1 < C) prefetch_window(in, b, hk, dm, st.keys.data() + (t * C + k + 1) * st.wk,
                                     st.nkeys[static_cast<size_t>(t * C + k + 1)]);
      float* dkc = sc.dkc.floats(static_cast<size_t>(kw * dm.Dkp));   // (kw, Dkp)
      float* dvc = sc.dvc.floats(static_cast<size_t>(kw * dm.Dvp));   // (kw, Dvp)
      std::memset(dkc, 0, sizeof(float) * static_cast<size_t>(kw * dm.Dkp));
      std::memset(dvc, 0, sizeof(float) * static_cast<size_t>(kw * dm.Dvp));
      for (int64_t m0 = moff[k]; m0 < moff[k + 1]; m0 += kRows) {
        blk.qi = mem + m0;
        blk.rows = std::min<int64_t>(kRows, moff[k + 1] - m0);
        build_block(in, b, h, dm, c, kt, blk, sc);
        float* dp = sc.dp.floats(static_cast<size_t>(kRows * kw));         // (rows, kw)
        float* dqc = sc.dqc.floats(static_cast<size_t>(kRows * dm.Dkp));   // (rows, Dkp)
        // O_i = Σ_c w_ic O_ic: this cluster's share of dO_i is w_ic dO_i.
        for (int64_t r = 0; r < blk.rows; ++r) {
          simd::copy_row(go + r * dm.Dvp, dout.ptr(b, h, blk.qi[r]), dm.Dv, dm.Dvp, wgt[m0 + r]);
          tile::exp2_row(blk.s + r * kw, kw, lse2[m0 + r]);
        }
        std::memset(dp, 0, sizeof(float) * static_cast<size_t>(blk.rows * kw));
        mk::gemm_ab(blk.rows, kw, dm.Dv, go, dm.Dvp, 1, vt, kw, dp, kw, nullptr);
        std::memset(dqc, 0, sizeof(float) * static_cast<size_t>(blk.rows * dm.Dkp));
        for (int64_t r = 0; r < blk.rows; ++r) {
          const float* prow = blk.s + r * kw;
          float* drow = dp + r * kw;
          float di = 0.f;  // D = Σ_j P dP over the window
          for (int64_t x = 0; x < kw; ++x) di += prow[x] * drow[x];
          for (int64_t x = 0; x < kw; ++x) drow[x] = prow[x] * (drow[x] - di) * scale;
        }
        mk::gemm_ab(blk.rows, dm.Dkp, blk.nk, dp, kw, 1, kr, dm.Dkp, dqc, dm.Dkp, nullptr);
        mk::gemm_ab(blk.nk, dm.Dkp, blk.rows, dp, 1, kw, blk.qs, dm.Dkp, dkc, dm.Dkp, nullptr);
        mk::gemm_ab(blk.nk, dm.Dvp, blk.rows, blk.s, 1, kw, go, dm.Dvp, dvc, dm.Dvp, nullptr);
        for (int64_t r = 0; r < blk.rows; ++r) emit_q(m0 + r, dqc + r * dm.Dkp);
      }
      for (int64_t x = 0; x < blk.nk; ++x) emit_k(x, dkc + x * dm.Dkp, dvc + x * dm.Dvp);
    };
    if (!split) {
      for (int64_t k = 0; k < C; ++k)
        cluster(
            k, ws.threads[static_cast<size_t>(thread)],
            [&](int64_t m, const float* row) { simd::axpy_row(dq.ptr(b, h, mem[m]), row, dm.D); },
            [&](int64_t x, const float* kr, const float* vr) {
              const int32_t j = st.keys[static_cast<size_t>((t * C + k) * st.wk + x)];
              simd::axpy_row(gk(j), kr, dm.D, 1.f / c);
              simd::axpy_row(gv(j), vr, dm.Dv);
            });
      return;
    }
    const int64_t W = st.wk, KV = dm.Dkp + dm.Dvp;
    float* qsl = ws.slots.floats(static_cast<size_t>(std::max(1, moff[C]) * dm.Dkp));  // (members, Dkp)
    float* wsl = ws.wslots.floats(static_cast<size_t>(C * W * KV));                    // (C, wk, Dkp + Dvp)
    parallel_for(C, [&](int64_t k, int th) {
      cluster(
          k, ws.threads[static_cast<size_t>(th)],
          [&](int64_t m, const float* row) {
            std::memcpy(qsl + m * dm.Dkp, row, sizeof(float) * static_cast<size_t>(dm.D));
          },
          [&](int64_t x, const float* kr, const float* vr) {
            float* w = wsl + (k * W + x) * KV;
            std::memcpy(w, kr, sizeof(float) * static_cast<size_t>(dm.D));
            std::memcpy(w + dm.Dkp, vr, sizeof(float) * static_cast<size_t>(dm.Dv));
          });
    });
    gather::by_row(
        moff[C], nv, [&](int64_t m) { return mem[m]; },
        [&](int64_t i, int64_t m) { simd::axpy_row(dq.ptr(b, h, i), qsl + m * dm.Dkp, dm.D); }, ws.off, ws.list);
    // Window slots in (cluster, slot) order; a cluster's unused slots (x >= nkeys) belong to no key.
    const int32_t* keys = st.keys.data() + t * C * W;
    const int32_t* nkeys = st.nkeys.data() + t * C;
    gather::by_row(
        C * W, mv + 1, [&](int64_t e) { return e % W < nkeys[e / W] ? keys[e] : mv; },
        [&](int64_t j, int64_t e) {
          if (j == mv) return;
          simd::axpy_row(gk(j), wsl + e * KV, dm.D, 1.f / c);
          simd::axpy_row(gv(j), wsl + e * KV + dm.Dkp, dm.Dv);
        },
        ws.off, ws.list);
  };
  if (split) {
    for (int64_t t = 0; t < BH; ++t) head(t, 0);
  } else {
    parallel_for(BH, [&](int64_t t, int thread) { head(t, thread); });
  }
  if (part) reduce_group_partials(in, d, part, d.M, dm.Dkp + dm.Dvp, dm.Dkp, dk, dv);
}

RoutingWorkspace& routing_workspace(Scratch& scratch) { return scratch.get<RoutingWorkspace>(); }

}  // namespace clattn

namespace clattn {

size_t routing_workspace_bytes(const AttentionDims& d, const RoutingParams& p, Mode mode,
                               int threads) {
  const int64_t C = p.clusters, Cp = round_up(C, kPanel), BH = d.B * d.H, N = d.N, M = d.M;
  const int64_t Dkp = round_up(d.Dk, mk::kLanes), Dvp = round_up(d.Dv, mk::kLanes);
  const int64_t wq = p.window > 0 ? std::min(p.window, N) : (N + C - 1) / C;
  const int64_t wk = std::max<int64_t>(1, p.window > 0 ? std::min(p.window, M) : (M + C - 1) / C);
  const int64_t kw = round_up(wk, mk::kLanes), cap = C * wq + N;
  const int64_t ns = std::min(N + M, std::max<int64_t>(32 * C, 4096)) + 1;
  constexpr int64_t f = 4, cand = sizeof(Cand);
  // Per thread: norms, k-means on the sample, the cosine pass, window selection, member blocks.
  int64_t per = f * (N + M + Cp * d.Dk + ns * Dkp + std::max<int64_t>(ns, kScore) * Cp + C * d.Dk + Dkp) +
                4 * (3 * ns + 3 * N + C * wq + C + 1) +
                (C * TopColumns::kSlack * (wq + wk)) * cand + 2 * (C * 8 + f * round_up(C, simd::kLanes)) +
                f * (kRows * Dkp + kRows * kw + Dkp * kw + kw * Dvp + kRows * Dvp);
  int64_t shared = 0;
  if (p.train) shared += f * BH * C * (d.Dk + 1);
  if (mode == Mode::training) {
    per += f * (kRows * Dvp + kw * Dkp + Dvp * kw + kw * Dkp + kw * Dvp + kRows * kw + kRows * Dkp);
    if (d.group() > 1) shared += f * BH * M * (Dkp + Dvp);
  }
  // A head split over the team: member slots' outputs (or dq rows) and, in training, the window
  // slots' dK, dV rows; gather::by_row's offsets and lists.
  shared += f * cap * std::max(Dkp, Dvp) + 8 * (std::max(N, C * wk) + 2 + std::max(cap, C * wk));
  if (mode == Mode::training) shared += f * C * wk * (Dkp + Dvp);
  const int64_t state = BH * (C * wk * 4 + C * 4 + (C + 1) * 4 + cap * 12 + C * d.Dk * f);
  return static_cast<size_t>(threads * (per + static_cast<int64_t>(sizeof(ThreadScratch))) + shared + state);
}

}  // namespace clattn
