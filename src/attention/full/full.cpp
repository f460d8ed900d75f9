// Full (exact) attention, tiled with an online softmax so memory stays O(N·D): FlashAttention-2's
// scheme on the CPU. Forward walks (batch, head, 64-query tile) tasks over 512-key tiles; backward
// walks (batch, head, key chunk) tasks, key tile outer and query tile inner, recomputing scores
// from the saved log-sum-exp. K and V are packed once per head for the microkernels
// (core/microkernel.h); logits are kept in log2 units (Q pre-scaled by scale·log2 e) so every
// exponential is one exp2.
#include "attention/validate.h"
#include "attention/full/full.h"
#include "clattn/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attention/tile/grad_util.h"
#include "attention/registry.h"
#include "clattn/threads.h"
#include "core/microkernel.h"
#include "core/simd.h"
#include "sequence_split/split_attention.h"
#include "attention/tile/tile_ops.h"
#include "attention/work.h"

namespace clattn {
namespace {

constexpr int64_t kBr = 64;    // forward: query rows per tile
constexpr int64_t kBc = 512;   // forward: keys per tile (8 panels); S tile 128 KB stays in L2
constexpr int64_t kBrB = 64;   // backward: query rows per tile
constexpr int64_t kBcB = 256;  // backward: keys per tile
using tile::kInf;
using tile::kLn2;
using tile::kLog2e;
using mk::kPanel;
using mk::round_up;

// Per-thread tiles; sized on first use, reused by every later call on the same Scratch.
struct ThreadScratch {
  Workspace a, b, c, d, e, f;
  size_t bytes() const { return held_bytes(a, b, c, d, e, f); }
};

}  // namespace

struct FullWorkspace {
  Workspace kpan;   // (B, Hkv, np, Dk, 64) K panels
  Workspace vpan;   // (B, Hkv, np, Dv, 64) V panels (backward: dP = dO·Vᵀ)
  Workspace vrow;   // (B, Hkv, Mp, Dvp) V rows (forward: O += P·V)
  Workspace krow;   // (B, Hkv, Mp, Dkp) K rows (backward: dQ += dS·K)
  Workspace stats;  // (B, H, N) backward: D_i = dO_i·O_i
  Workspace dqp;    // (B, H, P, N, Dkp) backward: per-task partial dQ
  Workspace dkvp;   // (B, H, Mp, Dkp + Dvp) backward with GQA: per-query-head partial dK, dV
  std::vector<ThreadScratch> threads;
  // Forward task lists and V operands, kept so a call allocates nothing once sized.
  std::vector<int64_t> task_b, task_h, task_q0;
  std::vector<mk::RowsOperand> vops;

  void ensure_threads() {
    if (threads.size() < static_cast<size_t>(max_threads()))
      threads.resize(static_cast<size_t>(max_threads()));
  }
  size_t bytes() const {
    size_t n = held_bytes(kpan, vpan, vrow, krow, stats, dqp, dkvp, threads, task_b, task_h, task_q0, vops);
    for (const ThreadScratch& t : threads) n += t.bytes();
    return n;
  }
};

namespace {

// Key chunks per head of the backward: enough tasks for >= 4 per thread. The partial dQ of each
// chunk is summed in chunk order, so the backward's rounding depends on the thread count (see
// docs/design.md: what the thread count may change).
int64_t bwd_chunks(const AttentionDims& d, int threads) {
  const int64_t nkt_max = std::max<int64_t>(1, (d.M + kBcB - 1) / kBcB), BH = d.B * d.H;
  return std::clamp<int64_t>((4 * threads + BH - 1) / BH, 1, nkt_max);
}

// Keys [key_begin(i), key_end(i)) are visible to query i (before the bias's own -inf entries).
// Query i sits at key position i + off (off = M − N, the prefix-cache convention); causal keeps
// keys up to that position; the band (full.h) narrows the start, or with no causal mask both
// ends. Both bounds are non-decreasing in i (a block band's start jumps forward at each block).
struct RowLimits {
  int64_t mv, off;
  bool causal;
  Band band;
  int64_t key_begin(int64_t i) const {
    const int64_t p = i + off;
    if (band.block > 0) return p < band.exact_before ? 0 : std::clamp(p / band.block * band.block, int64_t{0}, mv);
    if (band.window == 0) return 0;
    return std::clamp(causal ? p - band.window + 1 : p - band.window / 2, int64_t{0}, mv);
  }
  int64_t key_end(int64_t i) const {
    if (causal) return std::clamp(i + off + 1, int64_t{0}, mv);
    return band.window == 0 ? mv : std::clamp(i + off + band.window / 2 + 1, int64_t{0}, mv);
  }
};

// Adds the bias (in log2 units) and writes -inf outside the visible keys [lo, hi), over a row of
// `width` scores for keys k0 .. k0 + width (lo, hi relative to k0).
inline void mask_row(float* row, int64_t width, int64_t lo, int64_t hi, const float* bias_row) {
  const int64_t a = std::clamp(lo, int64_t{0}, width), e = std::clamp(hi, a, width);
  for (int64_t j = 0; j < a; ++j) row[j] = -kInf;
  if (bias_row)
    for (int64_t j = a; j < e; ++j) row[j] += bias_row[j] * kLog2e;
  for (int64_t j = e; j < width; ++j) row[j] = -kInf;
}

// First i in [lo, hi) with pred(i) true, for a predicate that is false then true (hi if none).
template <class Pred>
int64_t first_row(int64_t lo, int64_t hi, Pred pred) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (pred(mid)) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

const float* bias_row_ptr(const AttentionInputs& in, int64_t i, int64_t k0) {
  return in.bias.data ? in.bias.data + i * in.bias.stride(0) + k0 : nullptr;
}

}  // namespace

namespace {

// One task of the forward: query rows [q0, q0 + rows) of head (b, h), rows <= kBr, after
// full_fwd_prepare. The padded rows of a head are zeroed by the task that owns its first tile.
void fwd_tile(const AttentionInputs& in, const AttentionDims& d, float scale, const Band& bnd, int64_t b,
              int64_t h, int64_t q0, int64_t rows, View out, float* lse, float* parts, FullWorkspace& ws,
              int thread) {
  float* pm = parts;                                          // (B, H, N) row max, log2 units
  float* pl = parts ? parts + d.B * d.H * d.N : nullptr;      // (B, H, N) log2 of the row sum
  const int64_t D = d.Dk, Dv = d.Dv, Mp = round_up(d.M, kPanel), hk = h / d.group();
  const int64_t Dvp = round_up(Dv, mk::kLanes);
  const float c = scale * kLog2e;
  const bool band = bnd.window > 0, cached = in.cache != nullptr;
  ThreadScratch& sc = ws.threads[static_cast<size_t>(thread)];
  float* qs = sc.a.floats(static_cast<size_t>(kBr * D));      // (Br, D) scaled by c
  float* s = sc.b.floats(static_cast<size_t>(kBr * kBc));     // (Br, Bc) scores, then P
  float* oacc = sc.c.floats(static_cast<size_t>(kBr * Dvp));  // (Br, Dvp)
  float* st = sc.d.floats(static_cast<size_t>(3 * kBr));      // m, l, alpha: (Br) each
  float *m = st, *l = st + kBr, *alpha = st + 2 * kBr;
  mk::pack_rows(in.q.ptr(b, h, q0), rows, D, in.q.stride(2), qs, rows, D, c);
  std::fill(m, m + rows, -kInf);
  std::fill(l, l + rows, 0.f);
  std::memset(oacc, 0, sizeof(float) * static_cast<size_t>(rows * Dvp));
  const RowLimits lim{valid_keys(in, d, b), d.M - d.N, in.causal, bnd};
  const int64_t kbeg = lim.key_begin(q0) / kPanel * kPanel, kend = lim.key_end(q0 + rows - 1);
  // Panels of keys [kfirst, ...): a cache's own (f32, or 16-bit widened by the kernels), the whole
  // head packed up front, or a band tile's own keys.
  const float* kp = nullptr;
  const uint16_t* kp16 = nullptr;  // a 16-bit cache's panels, and its value rows below
  const uint16_t* vr16 = nullptr;
  const mk::Half hf = cached && in.cache->type() == KVCacheType::bf16 ? mk::Half::bf16 : mk::Half::f16;
  int64_t kfirst = 0;
  if (cached && in.cache->type() != KVCacheType::f32) {
    kp16 = in.cache->key_panels16(b, hk);
    vr16 = in.cache->value_rows16(b, hk);
  } else if (cached) {
    kp = in.cache->key_panels(b, hk);
  } else if (band) {
    float* own = sc.e.floats(static_cast<size_t>((std::max<int64_t>(kend - kbeg, 1) + kPanel) * D));
    if (kend > kbeg) mk::pack_panels(in.k.ptr(b, hk, kbeg), kend - kbeg, D, in.k.stride(2), own);
    kp = own;
    kfirst = kbeg;
  } else {
    kp = ws.kpan.data() + (b * d.Hkv + hk) * Mp * D;
  }
  const mk::RowsOperand vr = ws.vops[static_cast<size_t>(b * d.Hkv + hk)];

  for (int64_t k0 = kbeg; k0 < kend; k0 += kBc) {
    const int64_t bc = std::min(kBc, kend - k0), npan = (bc + kPanel - 1) / kPanel;
    const int64_t width = npan * kPanel;
    if (kp16) mk::gemm_abt16(hf, rows, npan, D, qs, D, kp16 + (k0 / kPanel) * D * kPanel, s, kBc);
    else mk::gemm_abt(rows, npan, D, qs, D, kp + ((k0 - kfirst) / kPanel) * D * kPanel, s, kBc);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = s + r * kBc;
      const int64_t i = q0 + r, lo = lim.key_begin(i) - k0, hi = lim.key_end(i) - k0;
      if (lo > 0 || hi < width || in.bias.data) mask_row(row, width, lo, hi, bias_row_ptr(in, i, k0));
      alpha[r] = tile::online_softmax_row(row, width, m[r], l[r]);
    }
    // O = diag(alpha)·O + P·V
    if (vr16) mk::gemm_ab16(hf, rows, Dvp, bc, s, kBc, 1, vr16 + k0 * vr.ld, vr.ld, oacc, Dvp, alpha);
    else mk::gemm_ab(rows, Dvp, bc, s, kBc, 1, vr.data + k0 * vr.ld, vr.ld, oacc, Dvp, alpha);
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* o = out.ptr(b, h, q0 + r);
    const int64_t at = (b * d.H + h) * d.N + q0 + r;
    if (l[r] > 0.f) {
      const float inv = 1.f / l[r];
      for (int64_t e = 0; e < Dv; ++e) o[e] = oacc[r * Dvp + e] * inv;
      lse[at] = (m[r] + std::log2(l[r])) * kLn2;
      if (parts) pm[at] = m[r], pl[at] = std::log2(l[r]);
    } else {
      std::memset(o, 0, sizeof(float) * static_cast<size_t>(Dv));
      lse[at] = kInf;  // no visible key: backward's 2^(s - m) is then 0
      if (parts) pm[at] = kInf, pl[at] = 0.f;
    }
  }
}

}  // namespace

void full_fwd_prepare(const AttentionInputs& in, const AttentionDims& d, FullWorkspace& ws, const Band& bnd) {
  const int64_t D = d.Dk, Dv = d.Dv, Mp = round_up(d.M, kPanel);
  // A window band (local) packs each tile's few panels itself: packing every head up front would
  // be a pass over all of K into a (B, Hkv, M, Dk) buffer that no cache holds at long N. A block
  // band's tiles reach back to their block start, or to key 0 before exact_before: it packs once.
  // A KVCache already holds K in panels and V in padded rows: a decode step reads them as they are.
  const bool band = bnd.window > 0, cached = in.cache != nullptr;
  float* kpan = band || cached ? nullptr : ws.kpan.floats(static_cast<size_t>(d.B * d.Hkv * Mp * D));  // (B, Hkv, np, D, 64)
  // V rows for O += P·V: used in place when Dv is a multiple of 16, else padded copies.
  float* vrow = cached ? nullptr : ws.vrow.floats(static_cast<size_t>(std::max<int64_t>(1, d.B * d.Hkv * mk::rows_operand_size(d.M, Dv))));
  std::vector<mk::RowsOperand>& vops = ws.vops;
  vops.resize(static_cast<size_t>(d.B * d.Hkv));
  ws.ensure_threads();
  if (cached) {
    const bool f32 = in.cache->type() == KVCacheType::f32;  // 16-bit rows: fwd_tile reads value_rows16
    for (int64_t t = 0; t < d.B * d.Hkv; ++t)
      vops[static_cast<size_t>(t)] = {f32 ? in.cache->value_rows(t / d.Hkv, t % d.Hkv) : nullptr, in.cache->value_ld()};
    return;
  }
  parallel_for(d.B * d.Hkv, [&](int64_t t) {
    const int64_t b = t / d.Hkv, hk = t % d.Hkv;
    if (!band) mk::pack_panels(in.k.ptr(b, hk, 0), d.M, D, in.k.stride(2), kpan + t * Mp * D);
    vops[static_cast<size_t>(t)] = mk::rows_operand(in.v.ptr(b, hk, 0), d.M, Dv, in.v.stride(2),
                                                    vrow + t * mk::rows_operand_size(d.M, Dv));
  });
}

void attn_full_fwd_rows(const AttentionInputs& in, const AttentionDims& d, float scale, const Band& band,
                        int64_t b, int64_t h, int64_t r0, int64_t r1, View out, float* lse, float* parts,
                        FullWorkspace& ws, int thread) {
  for (int64_t q0 = r0; q0 < r1; q0 += kBr)
    fwd_tile(in, d, scale, band, b, h, q0, std::min(kBr, r1 - q0), out, lse, parts, ws, thread);
}

void attn_full_fwd(const AttentionInputs& in, const AttentionDims& d, float scale, View out,
                   float* lse, FullWorkspace& ws, const Band& bnd, float* parts) {
  full_fwd_prepare(in, d, ws, bnd);
  // Tasks: (b, h, query tile) over valid queries; padded rows are zeroed by the task owning
  // the head's first tile. Causal tiles late in the sequence are the big ones: schedule first.
  std::vector<int64_t>& task_b = ws.task_b;
  std::vector<int64_t>& task_h = ws.task_h;
  std::vector<int64_t>& task_q0 = ws.task_q0;
  task_b.clear();
  task_h.clear();
  task_q0.clear();
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t nv = valid_queries(in, d, b);
      for (int64_t q0 = 0; q0 < std::max<int64_t>(nv, 1); q0 += kBr) {
        task_b.push_back(b);
        task_h.push_back(h);
        task_q0.push_back(q0);
      }
    }
  const int64_t ntasks = static_cast<int64_t>(task_b.size());
  parallel_for(ntasks, [&](int64_t tt, int thread) {
    const int64_t t = in.causal ? ntasks - 1 - tt : tt;
    const int64_t b = task_b[static_cast<size_t>(t)], h = task_h[static_cast<size_t>(t)];
    const int64_t q0 = task_q0[static_cast<size_t>(t)];
    const int64_t nv = valid_queries(in, d, b);
    if (q0 == 0) full_zero_padded_rows(in, d, b, h, out, lse, parts);
    const int64_t rows = std::min(kBr, nv - q0);
    if (rows > 0) fwd_tile(in, d, scale, bnd, b, h, q0, rows, out, lse, parts, ws, thread);
  });
}

void full_zero_padded_rows(const AttentionInputs& in, const AttentionDims& d, int64_t b, int64_t h, View out,
                           float* lse, float* parts) {
  const int64_t nv = valid_queries(in, d, b), BH = d.B * d.H;
  for (int64_t i = nv; i < d.N; ++i) {
    std::memset(out.ptr(b, h, i), 0, sizeof(float) * static_cast<size_t>(d.Dv));
    const int64_t at = (b * d.H + h) * d.N + i;
    lse[at] = 0.f;
    if (parts) parts[at] = parts[BH * d.N + at] = 0.f;
  }
}

void attn_full_bwd(const AttentionInputs& in, const AttentionDims& d, float scale, ConstView out,
                   const float* parts, ConstView dout, View dq, View dk, View dv, FullWorkspace& ws,
                   const Band& band, const float* dout_scale) {
  const int64_t D = d.Dk, Dv = d.Dv, np = (d.M + kPanel - 1) / kPanel, Mp = np * kPanel;
  const int64_t Dkp = round_up(D, mk::kLanes), Dvp = round_up(Dv, mk::kLanes);
  const int64_t G = d.group(), BH = d.B * d.H;
  const float c = scale * kLog2e;
  ws.ensure_threads();
  float* kpan = ws.kpan.floats(static_cast<size_t>(d.B * d.Hkv * Mp * D));    // (B, Hkv, np, D, 64)
  float* vpan = ws.vpan.floats(static_cast<size_t>(d.B * d.Hkv * Mp * Dv));   // (B, Hkv, np, Dv, 64)
  float* krow = ws.krow.floats(static_cast<size_t>(d.B * d.Hkv * Mp * Dkp));  // (B, Hkv, Mp, Dkp)
  float* dvec = ws.stats.floats(static_cast<size_t>(BH * d.N));              // (B, H, N)

  parallel_for(d.B * d.Hkv, [&](int64_t t) {
    const int64_t b = t / d.Hkv, hk = t % d.Hkv;
    mk::pack_panels(in.k.ptr(b, hk, 0), d.M, D, in.k.stride(2), kpan + t * Mp * D);
    mk::pack_panels(in.v.ptr(b, hk, 0), d.M, Dv, in.v.stride(2), vpan + t * Mp * Dv);
    mk::pack_rows(in.k.ptr(b, hk, 0), d.M, D, in.k.stride(2), krow + t * Mp * Dkp, Mp, Dkp);
  });
  parallel_for(BH, [&](int64_t t) {
    const int64_t b = t / d.H, h = t % d.H;
    for (int64_t i = 0; i < d.N; ++i) {
      const float* o = out.ptr(b, h, i);
      const float* g = dout.ptr(b, h, i);
      float acc = 0.f;  // D_i = dO_i · O_i = Σ_j P_ij dP_ij
      for (int64_t e = 0; e < Dv; ++e) acc += o[e] * g[e];
      dvec[t * d.N + i] = dout_scale ? dout_scale[t * d.N + i] * acc : acc;
    }
  });

  // Split each head's key tiles into P chunks so there are >= 4 tasks per thread.
  const int64_t P = bwd_chunks(d, max_threads());
  float* dqp = ws.dqp.floats(static_cast<size_t>(BH * P * d.N * Dkp));  // (B, H, P, N, Dkp)
  float* dkvp = G > 1 ? ws.dkvp.floats(static_cast<size_t>(BH * Mp * (Dkp + Dvp)))
                      : nullptr;  // (B, H, Mp, Dkp + Dvp)

  parallel_for(BH * P, [&](int64_t t, int thread) {
    const int64_t b = t / (d.H * P), h = t / P % d.H, chunk = t % P, hk = h / G;
    const int64_t nv = valid_queries(in, d, b);
    const RowLimits lim{valid_keys(in, d, b), d.M - d.N, in.causal, band};
    const int64_t nkt = (lim.mv + kBcB - 1) / kBcB;
    const int64_t kt0 = chunk * nkt / P, kt1 = (chunk + 1) * nkt / P;
    float* dqt = dqp + t * d.N * Dkp;  // (N, Dkp) this task's dQ
    std::memset(dqt, 0, sizeof(float) * static_cast<size_t>(nv * Dkp));
    ThreadScratch& sc = ws.threads[static_cast<size_t>(thread)];
    float* qs = sc.a.floats(static_cast<size_t>(kBrB * Dkp));     // (Br, Dkp) Q·c
    float* dot = sc.b.floats(static_cast<size_t>(kBrB * Dvp));    // (Br, Dvp) dO
    float* p = sc.c.floats(static_cast<size_t>(kBrB * kBcB));     // (Br, Bc) P
    float* ds = sc.d.floats(static_cast<size_t>(kBrB * kBcB));    // (Br, Bc) dP, then dS
    float* dkacc = sc.e.floats(static_cast<size_t>(kBcB * Dkp));  // (Bc, Dkp)
    float* dvacc = sc.f.floats(static_cast<size_t>(kBcB * Dvp));  // (Bc, Dvp)
    const size_t hkv = static_cast<size_t>(b * d.Hkv + hk);
    const float* mh = parts + (b * d.H + h) * d.N;           // (N) row max, log2 units
    const float* llh = parts + (BH + b * d.H + h) * d.N;     // (N) log2 row sum
    const float* dvech = dvec + (b * d.H + h) * d.N;

    for (int64_t kt = kt0; kt < kt1; ++kt) {
      const int64_t k0 = kt * kBcB, bc = std::min(kBcB, lim.mv - k0);
      const int64_t npan = (bc + kPanel - 1) / kPanel, width = npan * kPanel;
      std::memset(dkacc, 0, sizeof(float) * static_cast<size_t>(width * Dkp));
      std::memset(dvacc, 0, sizeof(float) * static_cast<size_t>(width * Dvp));
      // Only the queries whose visible keys meet this tile (both bounds are monotone in i).
      const int64_t qstart = first_row(0, nv, [&](int64_t i) { return lim.key_end(i) > k0; });
      const int64_t qend = first_row(qstart, nv, [&](int64_t i) { return lim.key_begin(i) >= k0 + bc; });
      for (int64_t q0 = qstart; q0 < qend; q0 += kBrB) {
        const int64_t rows = std::min(kBrB, qend - q0);
        mk::pack_rows(in.q.ptr(b, h, q0), rows, D, in.q.stride(2), qs, rows, Dkp, c);
        mk::pack_rows(dout.ptr(b, h, q0), rows, Dv, dout.stride(2), dot, rows, Dvp);
        if (dout_scale)
          for (int64_t r = 0; r < rows; ++r) {
            const float w = dout_scale[(b * d.H + h) * d.N + q0 + r];
            for (int64_t e = 0; e < Dv; ++e) dot[r * Dvp + e] *= w;
          }
        // S = (c·Q)·Kᵀ ; P = 2^((S - m) - log2 l)  (the forward's softmax, recomputed)
        mk::gemm_abt(rows, npan, D, qs, Dkp, kpan + hkv * Mp * D + k0 * D, p, kBcB);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = q0 + r;
          mask_row(p + r * kBcB, width, lim.key_begin(i) - k0, lim.key_end(i) - k0, bias_row_ptr(in, i, k0));
        }
        mk::exp2_rows_shifted(p, rows, kBcB, width, mh + q0, llh + q0);
        // O = P·V  ->  dV += Pᵀ·dO
        mk::gemm_ab(width, Dvp, rows, p, 1, kBcB, dot, Dvp, dvacc, Dvp, nullptr);
        // dP = dO·Vᵀ ; dS = P ∘ (dP - D_i) · scale
        mk::gemm_abt(rows, npan, Dv, dot, Dvp, vpan + hkv * Mp * Dv + k0 * Dv, ds, kBcB);
        mk::grad_scores_rows(ds, p, rows, kBcB, width, dvech + q0, scale);
        // S = scale·Q·Kᵀ  ->  dQ += dS·K ,  dK += dSᵀ·Q  (accumulated against c·Q, undone below)
        mk::gemm_ab(rows, Dkp, width, ds, kBcB, 1, krow + (hkv * Mp + k0) * Dkp, Dkp,
                    dqt + q0 * Dkp, Dkp, nullptr);
        mk::gemm_ab(width, Dkp, rows, ds, 1, kBcB, qs, Dkp, dkacc, Dkp, nullptr);
      }
      const float inv_c = 1.f / c;
      for (int64_t j = 0; j < bc; ++j) {
        float *gk, *gv;
        if (dkvp) {
          gk = dkvp + ((b * d.H + h) * Mp + k0 + j) * (Dkp + Dvp);
          gv = gk + Dkp;
          for (int64_t e = 0; e < D; ++e) gk[e] = dkacc[j * Dkp + e] * inv_c;
          for (int64_t e = 0; e < Dv; ++e) gv[e] = dvacc[j * Dvp + e];
        } else {
          gk = dk.ptr(b, hk, k0 + j);
          gv = dv.ptr(b, hk, k0 + j);
          simd::axpy_row(gk, dkacc + j * Dkp, D, inv_c);
          simd::axpy_row(gv, dvacc + j * Dvp, Dv);
        }
      }
    }
  });

  // Reductions: dQ over key chunks; with GQA, dK and dV over the query heads of each group.
  parallel_for(BH, [&](int64_t t) {
    const int64_t b = t / d.H, h = t % d.H, nv = valid_queries(in, d, b);
    for (int64_t i = 0; i < nv; ++i) {
      float* g = dq.ptr(b, h, i);
      for (int64_t ch = 0; ch < P; ++ch) simd::axpy_row(g, dqp + ((t * P + ch) * d.N + i) * Dkp, D);
    }
  });
  if (dkvp) reduce_group_partials(in, d, dkvp, Mp, Dkp + Dvp, Dkp, dk, dv);
}

namespace {

// Ring attention (ring.cpp): full attention's kernels over a sequence split across ranks.
class RingSplit final : public SplitAttention {
 public:
  explicit RingSplit(float scale) : scale_(scale) {}
  bool holds_state(const Context& ctx) const override { return ctx.holds<sp::RingState>(); }
  float scale_at(int64_t Dk) const override { return softmax_scale(scale_, Dk); }
  bool sums_queries() const override { return false; }
  void forward(Communicator& comm, const SeqSplit& split, const AttentionInputs& in, View out,
               Context& ctx) const override {
    sp::ring_forward(comm, split, scale_at(in.q.dim(3)), in, out, ctx.state<sp::RingState>(), ctx.scratch());
  }
  void backward(Communicator& comm, const SeqSplit& split, const AttentionInputs& in, ConstView out, Context& ctx,
                ConstView dout, View dq, View dk, View dv) const override {
    sp::ring_backward(comm, split, scale_at(in.q.dim(3)), in, out, ctx.saved<sp::RingState>(), dout, dq, dk, dv,
                      ctx.scratch());
  }

 private:
  float scale_;
};

// Exact attention, and with window > 0 the `local` band of it (same kernels, band-limited).
class FullAttention final : public Attention {
 public:
  FullAttention(float scale, int64_t window)
      : kind_(window > 0 ? "local" : "full"), scale_(scale), window_(window), ring_(scale) {
    // The band variant takes no bias: an additive (N, M) bias would defeat its linear memory; nor
    // does it split the sequence (its band would cross the ranks' borders).
    caps_ = Capabilities{.causal = true, .query_lengths = true, .key_lengths = true,
                         .bias = window == 0, .cross = true, .gqa = true, .trainable = true,
                         .splits_sequence = window == 0, .splits_sequence_causal = window == 0,
                         .half_cache = true, .torch_ops = window == 0};
  }
  const SplitAttention* split() const override { return window_ > 0 ? nullptr : &ring_; }
  std::string name() const override {
    std::string s = window_ > 0 ? detail::concat("local:window=", window_) : std::string("full");
    if (scale_ > 0) s += detail::concat(window_ > 0 ? ",scale=" : ":scale=", scale_);
    return s;
  }
  const Capabilities& capabilities() const override { return caps_; }

  void check_magnitudes(const AttentionDims& d, const Magnitudes& m) const override {
    check_softmax_range(d, m, scale_for(d), kind_);
  }

  void forward(const AttentionInputs& in, View out, Context& ctx) const override {
    Magnitudes mag;
    const AttentionDims d = validate_inputs(in, caps_, kind_, mag);
    validate_output(out, Shape{d.B, d.H, d.N, d.Dv}, "out", kind_);
    // A decode step over a KVCache reads the magnitudes its append kept: no second pass.
    check_magnitudes(d, mag);
    FullState& st = ctx.state<FullState>();
    st.lse.resize(Shape{d.B, d.H, d.N});
    st.parts.resize(Shape{2, d.B, d.H, d.N});
    attn_full_fwd(in, d, scale_for(d), out, st.lse.data(), ctx.scratch().get<FullWorkspace>(),
                  Band{.window = window_}, st.parts.data());
  }

  void backward(const AttentionInputs& in, ConstView out, Context& ctx, ConstView dout, View dq,
                View dk, View dv) const override {
    Magnitudes mag;
    const AttentionDims d = validate_inputs(in, caps_, kind_, mag);
    const FullState& st = ctx.saved<FullState>();
    check(st.parts.shape() == Shape{2, d.B, d.H, d.N}, kind_, ": backward inputs have shapes ",
          "other than the forward's: forward saved lse ", st.lse.shape(), ", q is now ",
          in.q.shape);
    validate_softmax_backward(in, d, mag, scale_for(d), out, dout, dq, dk, dv, kind_);
    attn_full_bwd(in, d, scale_for(d), out, st.parts.data(), dout, dq, dk, dv,
                  ctx.scratch().get<FullWorkspace>(), Band{.window = window_});
  }

  size_t workspace_bytes(const AttentionDims& d, Mode mode, int threads) const override {
    return full_workspace_bytes(d, mode, threads, Band{.window = window_});
  }
  WorkModel work(const AttentionDims& d, bool causal, Mode mode) const override {
    return work::softmax_attention(
        d, window_ > 0 ? work::band_pairs(d.N, d.M, window_, causal) : work::visible_pairs(d.N, d.M, causal), mode);
  }
  // A causal band reads the last `window` positions.
  double decode_bytes(const AttentionDims& d, double context, double element_bytes) const override {
    return Attention::decode_bytes(d, window_ > 0 ? std::min(context, static_cast<double>(window_)) : context,
                                   element_bytes);
  }

 private:
  float scale_for(const AttentionDims& d) const {
    return softmax_scale(scale_, d.Dk);
  }
  std::string kind_;
  float scale_;
  int64_t window_;
  RingSplit ring_;
  Capabilities caps_;
};

}  // namespace

size_t full_workspace_bytes(const AttentionDims& d, Mode mode, int threads, const Band& band) {
  const int64_t window = band.window;
  const int64_t D = d.Dk, Dv = d.Dv, Mp = round_up(d.M, kPanel);
  const int64_t Dkp = round_up(D, mk::kLanes), Dvp = round_up(Dv, mk::kLanes), BH = d.B * d.H;
  // Forward: packed K (not for a band), padded V rows, per-thread tiles; the saved lse.
  const int64_t band_keys = std::min(d.M, window + kBr + kPanel) + 2 * kPanel;
  int64_t shared = (window > 0 ? 0 : d.B * d.Hkv * Mp * D) +
                   std::max<int64_t>(1, d.B * d.Hkv * mk::rows_operand_size(d.M, Dv));
  int64_t tile[6] = {kBr * D, kBr * kBc, kBr * Dvp, 3 * kBr, window > 0 ? band_keys * D : 0, 0};
  int64_t state = 3 * BH * d.N;  // lse and its two parts
  if (mode == Mode::training) {
    const int64_t P = bwd_chunks(d, threads);
    shared += (window > 0 ? d.B * d.Hkv * Mp * D : 0) + d.B * d.Hkv * Mp * (Dv + Dkp) + BH * d.N +
              BH * P * d.N * Dkp + (d.group() > 1 ? BH * Mp * (Dkp + Dvp) : 0);
    const int64_t btile[6] = {kBrB * Dkp, kBrB * Dvp, kBrB * kBcB, kBrB * kBcB, kBcB * Dkp, kBcB * Dvp};
    for (int i = 0; i < 6; ++i) tile[i] = std::max(tile[i], btile[i]);
  }
  int64_t per_thread = 0;
  for (int64_t t : tile) per_thread += t;
  const int64_t tasks = d.B * d.H * ((std::max<int64_t>(d.N, 1) + kBr - 1) / kBr);
  return sizeof(float) * static_cast<size_t>(shared + state + threads * per_thread) +
         static_cast<size_t>(threads) * sizeof(ThreadScratch) + static_cast<size_t>(3 * 8 * tasks) +
         static_cast<size_t>(d.B * d.Hkv) * sizeof(mk::RowsOperand);
}

FullWorkspace& full_workspace(Scratch& scratch) { return scratch.get<FullWorkspace>(); }
const float* full_key_panels(const FullWorkspace& ws) { return ws.kpan.data(); }
mk::RowsOperand full_value_rows(const FullWorkspace& ws, int64_t t) { return ws.vops[static_cast<size_t>(t)]; }
const float* full_value_panels(const FullWorkspace& ws) { return ws.vpan.data(); }
const float* full_key_rows(const FullWorkspace& ws) { return ws.krow.data(); }

std::unique_ptr<Attention> make_full_attention(float scale, int64_t window) {
  return std::make_unique<FullAttention>(scale, window);
}

std::unique_ptr<Attention> make_full(const Spec& spec) {
  SpecReader r(spec);
  const double scale = r.get_float("scale", 0.0, 1e-6, 1e6, "1/sqrt(Dk)");
  r.finish();
  return make_full_attention(static_cast<float>(scale), 0);
}

}  // namespace clattn
