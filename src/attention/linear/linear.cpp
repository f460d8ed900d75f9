// Linear attention, forward and backward in chunks of 64 queries so every product is a small
// GEMM (tile microkernels): the keys every query of a chunk sees enter a running state
// S (Dk, Dv), z (Dk); the keys only some of them see (the causal diagonal) are handled by a masked
// 64 x 64 product. Without a causal mask the state holds all valid keys from the first chunk on,
// so one code path serves both. Time O(N·Dk·Dv), memory O(N·D).
// Work is parallel over (batch, kv head); the query heads of a group run inside the task, so their
// key gradients never race. With fewer such pairs than threads a head splits instead, as a
// prefix scan over groups of 16 chunks: each group's own keys summed in parallel, the running
// sums taken in order, then the groups walked in parallel from their starting states (the
// backward's reverse pass likewise over query states). An unsplit head walks the same groups
// from the same sums, so the values do not depend on the split; the split costs one more pass
// over the keys when causal (the groups' own keys are absorbed twice), none otherwise.
#include "attention/validate.h"
#include "attention/linear/linear.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "attention/registry.h"
#include "attention/work.h"
#include "clattn/threads.h"
#include "core/microkernel.h"
#include "core/simd.h"

namespace clattn {

using mk::round_up;

namespace {

constexpr int64_t kChunk = 64;     // queries per chunk
constexpr int64_t kKeyStep = 256;  // keys per step when the state absorbs a range of keys
// The fixed partition that lets one head split over the team and still compute what one thread
// computes, bit for bit: work items of kGroup chunks, and the keys every query sees summed as
// kKeyBlock-key partial states in order.
constexpr int64_t kGroup = 16;       // chunks per work item (1024 queries)
constexpr int64_t kKeyBlock = 4096;  // keys per partial state

// Scratch of one work item (any thread may run any item).
struct ThreadScratch {
  Workspace phq, phk, phkt, vrow, a, num, r, comb, sct, t, tc, dphq;
  size_t bytes() const { return held_bytes(phq, phk, phkt, vrow, a, num, r, comb, sct, t, tc, dphq); }
};

// Scratch of one head, held by the thread that owns the head (the caller's when a head splits).
struct HeadScratch {
  Workspace pre, suf, dnum, dka, dva;
  size_t bytes() const { return held_bytes(pre, suf, dnum, dka, dva); }
};

}  // namespace

struct LinearWorkspace {
  std::vector<ThreadScratch> threads;
  std::vector<HeadScratch> heads;
  size_t bytes() const {
    size_t n = held_bytes(threads) + held_bytes(heads);
    for (const ThreadScratch& t : threads) n += t.bytes();
    for (const HeadScratch& h : heads) n += h.bytes();
    return n;
  }
};

namespace {

// φ(x) = elu(x) + 1 over a row into dst (n_pad wide, zero-padded); dphi (optional) gets φ'(x).
void phi_row(const float* x, int64_t n, int64_t n_pad, float* dst) {
  int64_t e = 0;
  for (; e < n; e += simd::kLanes) {
    const int r = static_cast<int>(std::min<int64_t>(simd::kLanes, n - e));
    const simd::vf v = simd::load_partial(x + e, r);
    const simd::vf ex = simd::exp(simd::vmin(v, simd::splat(0.f)));
    const simd::vf y = v > 0.f ? v + 1.f : ex;
    simd::store_partial(dst + e, y, r);
  }
  for (e = n; e < n_pad; ++e) dst[e] = 0.f;
}

// Rows [r0, r0 + n) of a (rows, cols) head through φ into (n, cols_pad).
void phi_rows(ConstView t, int64_t b, int64_t h, int64_t r0, int64_t n, int64_t cols,
              int64_t cols_pad, float* dst) {
  for (int64_t r = 0; r < n; ++r) phi_row(t.ptr(b, h, r0 + r), cols, cols_pad, dst + r * cols_pad);
}

// dst[e] += g[e] · φ'(x[e]).
void add_dphi(float* dst, const float* g, const float* x, int64_t n) {
  for (int64_t e = 0; e < n; ++e) dst[e] += g[e] * (x[e] > 0.f ? 1.f : std::exp(x[e]));
}

// dst = a + b over n floats (dst may be a).
void add_states(float* dst, const float* a, const float* b, int64_t n) {
  for (int64_t e = 0; e < n; ++e) dst[e] = a[e] + b[e];
}

struct Dims {
  int64_t D, Dv, Dkp, Dvp;
  int64_t sf() const { return Dkp * Dvp + Dkp; }      // a key state: S (Dkp, Dvp), z (Dkp)
  int64_t gf() const { return 2 * Dkp * Dvp + Dkp; }  // a query state: G (Dkp, Dvp), Gᵀ (Dvp, Dkp), gz (Dkp)
};

int64_t blocks_of(int64_t n, int64_t size) { return (n + size - 1) / size; }

// The per-head walk shared by forward and backward: for chunk c of queries, keys [0, kp) are
// visible to all its rows and keys [kp, kend) to some (i sees j <= i + off). Group g (chunks
// [c0, c1)) absorbs the keys [start(g), kp(c1 − 1)) into its state as it goes; the keys before
// start(g) come summed from the groups before it.
struct ChunkPlan {
  int64_t nv, mv, off;
  bool causal;
  int64_t chunks() const { return (nv + kChunk - 1) / kChunk; }
  int64_t i0(int64_t c) const { return c * kChunk; }
  int64_t i1(int64_t c) const { return std::min(nv, (c + 1) * kChunk); }
  int64_t kp(int64_t c) const { return causal ? std::clamp(i0(c) + off, int64_t{0}, mv) : mv; }
  int64_t kend(int64_t c) const { return causal ? std::clamp(i1(c) + off, int64_t{0}, mv) : mv; }
  int64_t groups() const { return blocks_of(chunks(), kGroup); }
  int64_t c0(int64_t g) const { return g * kGroup; }
  int64_t c1(int64_t g) const { return std::min(chunks(), (g + 1) * kGroup); }
  int64_t start(int64_t g) const { return g == 0 ? kp(0) : kp(c0(g) - 1); }
  // Whether any group absorbs keys (causal); if not, every chunk sees the keys [0, kp(0)) only.
  bool walks() const { return chunks() > 0 && kp(chunks() - 1) > kp(0); }
};

// S += φ(K)ᵀ V and z += Σ φ(k) over keys [k0, k1); st is a key state (Dims::sf).
void absorb_keys(const AttentionInputs& in, int64_t b, int64_t hk, int64_t k0, int64_t k1,
                 const Dims& dm, float* st, ThreadScratch& sc) {
  float* z = st + dm.Dkp * dm.Dvp;
  for (int64_t j0 = k0; j0 < k1; j0 += kKeyStep) {
    const int64_t n = std::min(kKeyStep, k1 - j0);
    float* phk = sc.phk.floats(static_cast<size_t>(kKeyStep * dm.Dkp));  // (n, Dkp)
    phi_rows(in.k, b, hk, j0, n, dm.D, dm.Dkp, phk);
    const mk::RowsOperand v = mk::rows_operand(in.v.ptr(b, hk, j0), n, dm.Dv, in.v.stride(2),
                                               sc.vrow.floats(static_cast<size_t>(kKeyStep * dm.Dvp)));
    mk::gemm_ab(dm.D, dm.Dvp, n, phk, 1, dm.Dkp, v.data, v.ld, st, dm.Dvp, nullptr);
    for (int64_t r = 0; r < n; ++r) simd::axpy_row(z, phk + r * dm.Dkp, dm.D);
  }
}

// The key states every chunk starts from, for one (batch, key head): slot g holds the keys
// before group g — those every query sees ([0, kp(0)), summed as kKeyBlock partial states in
// order) and the keys the groups before g absorb. A split head gets every slot (the groups'
// own absorption done once more, in parallel, to get there); otherwise only slot 0, which the
// caller advances group by group (`advance`). Either way the same sums in the same order.
struct KeyStates {
  float* slots;     // (split ? groups + 1 : 1, sf)
  bool split, walks;
  int64_t sf;
  const float* at(int64_t g) const { return split && walks ? slots + g * sf : slots; }
  void advance(const float* r) {  // slot 0 += the group's own keys (unsplit heads)
    if (!split && walks) add_states(slots, slots, r, sf);
  }
};

KeyStates key_states(const AttentionInputs& in, int64_t b, int64_t hk, const ChunkPlan& pl, const Dims& dm,
                     bool split, int owner, LinearWorkspace& ws) {
  const int64_t sf = dm.sf(), ng = pl.groups(), base = pl.kp(0), nb = blocks_of(base, kKeyBlock);
  const bool walks = pl.walks();
  const int64_t slots = split && walks ? ng + 1 : 1;
  float* pre = ws.heads[static_cast<size_t>(owner)].pre.floats(
      static_cast<size_t>((slots + (split ? std::max<int64_t>(nb, 1) : 1)) * sf));
  float* part = pre + slots * sf;  // (split ? nb : 1, sf) partial states of the shared keys
  std::memset(pre, 0, sizeof(float) * static_cast<size_t>(sf));
  split_for(split, nb, owner, [&](int64_t x, int thread) {
    float* p = split ? part + x * sf : part;
    std::memset(p, 0, sizeof(float) * static_cast<size_t>(sf));
    absorb_keys(in, b, hk, x * kKeyBlock, std::min(base, (x + 1) * kKeyBlock), dm, p,
                ws.threads[static_cast<size_t>(thread)]);
    if (!split) add_states(pre, pre, p, sf);
  });
  if (split)
    for (int64_t x = 0; x < nb; ++x) add_states(pre, pre, part + x * sf, sf);
  if (split && walks) {
    // Slot g + 1 holds group g's own keys, absorbed as the group's walk absorbs them; then the
    // running sum in group order.
    split_for(true, ng, owner, [&](int64_t g, int thread) {
      float* r = pre + (g + 1) * sf;
      std::memset(r, 0, sizeof(float) * static_cast<size_t>(sf));
      int64_t absorbed = pl.start(g);
      for (int64_t c = pl.c0(g); c < pl.c1(g); ++c) {
        absorb_keys(in, b, hk, absorbed, pl.kp(c), dm, r, ws.threads[static_cast<size_t>(thread)]);
        absorbed = std::max(absorbed, pl.kp(c));
      }
    });
    for (int64_t g = 0; g < ng; ++g) add_states(pre + (g + 1) * sf, pre + g * sf, pre + (g + 1) * sf, sf);
  }
  return KeyStates{pre, split, walks, sf};
}

// The state chunk c of group g sees: the slot plus what the group has absorbed so far (r).
// Advances `absorbed`; returns slot itself while the group has absorbed nothing.
const float* chunk_state(const AttentionInputs& in, int64_t b, int64_t hk, const ChunkPlan& pl, int64_t g,
                         int64_t c, const Dims& dm, const float* slot, float* r, int64_t& absorbed,
                         ThreadScratch& sc) {
  absorb_keys(in, b, hk, absorbed, pl.kp(c), dm, r, sc);
  absorbed = std::max(absorbed, pl.kp(c));
  if (absorbed == pl.start(g)) return slot;
  float* comb = sc.comb.floats(static_cast<size_t>(dm.sf()));
  add_states(comb, slot, r, dm.sf());
  return comb;
}

// Masked intra-chunk scores A (rows, nkw) = φ(Q_c)·φ(K_in)ᵀ with A_ij = 0 unless key kp + j is
// visible to query i0 + r; returns the φ(K_in) rows (nin, Dkp) in sc.phk.
void intra_scores(const AttentionInputs& in, int64_t b, int64_t hk, const ChunkPlan& pl, int64_t c,
                  const Dims& dm, const float* phq, int64_t rows, float* a, int64_t nkw, ThreadScratch& sc) {
  const int64_t kp = pl.kp(c), nin = pl.kend(c) - kp, i0 = pl.i0(c);
  float* phk = sc.phk.floats(static_cast<size_t>(kKeyStep * dm.Dkp));     // (nin, Dkp)
  float* phkt = sc.phkt.floats(static_cast<size_t>(dm.Dkp * kKeyStep));   // (Dk, nkw)
  phi_rows(in.k, b, hk, kp, nin, dm.D, dm.Dkp, phk);
  mk::pack_transposed(phk, nin, dm.D, dm.Dkp, phkt, nkw);
  std::memset(a, 0, sizeof(float) * static_cast<size_t>(rows * nkw));
  mk::gemm_ab(rows, nkw, dm.D, phq, dm.Dkp, 1, phkt, nkw, a, nkw, nullptr);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = std::max<int64_t>(0, i0 + r + pl.off + 1 - kp); j < nkw; ++j) a[r * nkw + j] = 0.f;
}

// num (rows, Dvp) = φ(Q)·S + A·V_in and den (rows) = φ(Q)·z + rowsum(A) + eps for chunk c, with
// φ(Q) in phq; leaves A (rows, nkw) in a and returns V_in (nin rows) when the chunk has
// partly visible keys.
mk::RowsOperand chunk_num_den(const AttentionInputs& in, int64_t b, int64_t hk, const ChunkPlan& pl,
                              int64_t c, const Dims& dm, const float* state, const float* phq, float* num,
                              float* den, float* a, ThreadScratch& sc) {
  const int64_t rows = pl.i1(c) - pl.i0(c), kp = pl.kp(c), nin = pl.kend(c) - kp;
  const float* z = state + dm.Dkp * dm.Dvp;
  std::memset(num, 0, sizeof(float) * static_cast<size_t>(rows * dm.Dvp));
  mk::gemm_ab(rows, dm.Dvp, dm.D, phq, dm.Dkp, 1, state, dm.Dvp, num, dm.Dvp, nullptr);
  for (int64_t r = 0; r < rows; ++r) den[r] = kLinearEps + simd::dot(phq + r * dm.Dkp, z, dm.D);
  if (nin <= 0) return mk::RowsOperand{nullptr, 0};
  const int64_t nkw = round_up(nin, mk::kLanes);
  intra_scores(in, b, hk, pl, c, dm, phq, rows, a, nkw, sc);
  const mk::RowsOperand v = mk::rows_operand(in.v.ptr(b, hk, kp), nin, dm.Dv, in.v.stride(2),
                                             sc.vrow.floats(static_cast<size_t>(kKeyStep * dm.Dvp)));
  mk::gemm_ab(rows, dm.Dvp, nin, a, nkw, 1, v.data, v.ld, num, dm.Dvp, nullptr);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < nin; ++j) den[r] += a[r * nkw + j];
  return v;
}

// One (batch, key head): its query heads, their chunks in groups. Split: every phase over the
// team; else on `owner`, group after group.
void linear_fwd_head(const AttentionInputs& in, const AttentionDims& d, const Dims& dm, int64_t b,
                     int64_t hk, bool split, int owner, View out, LinearWorkspace& ws) {
  const ChunkPlan pl{valid_queries(in, d, b), valid_keys(in, d, b), d.M - d.N, in.causal};
  const int64_t G = d.group();
  for (int64_t h = hk * G; h < (hk + 1) * G; ++h)
    for (int64_t i = pl.nv; i < d.N; ++i) std::memset(out.ptr(b, h, i), 0, sizeof(float) * static_cast<size_t>(d.Dv));
  if (pl.chunks() == 0) return;
  KeyStates ks = key_states(in, b, hk, pl, dm, split, owner, ws);
  // Leaves the group's own keys in sc.r.
  auto walk = [&](int64_t g, int64_t h, const float* slot, ThreadScratch& sc) {
    float* r = sc.r.floats(static_cast<size_t>(dm.sf()));                // (sf) the group's own keys
    float* phq = sc.phq.floats(static_cast<size_t>(kChunk * dm.Dkp));   // (64, Dkp)
    float* num = sc.num.floats(static_cast<size_t>(kChunk * dm.Dvp));   // (64, Dvp)
    float* a = sc.a.floats(static_cast<size_t>(kChunk * kChunk));       // (64, 64) intra scores
    std::memset(r, 0, sizeof(float) * static_cast<size_t>(dm.sf()));
    int64_t absorbed = pl.start(g);
    for (int64_t c = pl.c0(g); c < pl.c1(g); ++c) {
      const float* st = chunk_state(in, b, hk, pl, g, c, dm, slot, r, absorbed, sc);
      const int64_t i0 = pl.i0(c), rows = pl.i1(c) - i0;
      phi_rows(in.q, b, h, i0, rows, dm.D, dm.Dkp, phq);
      float den[kChunk];
      chunk_num_den(in, b, hk, pl, c, dm, st, phq, num, den, a, sc);
      for (int64_t r2 = 0; r2 < rows; ++r2)
        simd::copy_row(out.ptr(b, h, i0 + r2), num + r2 * dm.Dvp, dm.Dv, dm.Dv, 1.f / den[r2]);
    }
  };
  const int64_t ng = pl.groups();
  if (split) {
    split_for(true, ng * G, owner, [&](int64_t x, int thread) {
      walk(x / G, hk * G + x % G, ks.at(x / G), ws.threads[static_cast<size_t>(thread)]);
    });
    return;
  }
  ThreadScratch& sc = ws.threads[static_cast<size_t>(owner)];
  for (int64_t g = 0; g < ng; ++g) {
    for (int64_t h = hk * G; h < (hk + 1) * G; ++h) walk(g, h, ks.at(g), sc);
    ks.advance(sc.r.floats(0));
  }
}

void linear_bwd_head(const AttentionInputs& in, const AttentionDims& d, const Dims& dm, int64_t b,
                     int64_t hk, bool split, int owner, ConstView dout, View dq, View dk, View dv,
                     LinearWorkspace& ws) {
  const ChunkPlan pl{valid_queries(in, d, b), valid_keys(in, d, b), d.M - d.N, in.causal};
  if (pl.chunks() == 0) return;
  const int64_t G = d.group(), ng = pl.groups(), gf = dm.gf(), nv = pl.nv, mv = pl.mv;
  KeyStates ks = key_states(in, b, hk, pl, dm, split, owner, ws);
  HeadScratch& hs = ws.heads[static_cast<size_t>(owner)];
  // Per query head and query: dnum = dO / den (G, nv, Dvp) and dden = −dO·O / den (G, nv).
  float* dnum = hs.dnum.floats(static_cast<size_t>(G * nv * (dm.Dvp + 1)));
  float* dden = dnum + G * nv * dm.Dvp;
  float* dka = hs.dka.floats(static_cast<size_t>(std::max<int64_t>(1, mv) * dm.Dkp));  // (mv, Dkp) ∂L/∂φ(k)
  float* dva = hs.dva.floats(static_cast<size_t>(std::max<int64_t>(1, mv) * dm.Dvp));  // (mv, Dvp)
  const int64_t kb = blocks_of(mv, kKeyBlock);
  split_for(split, kb, owner, [&](int64_t x, int) {
    const int64_t j0 = x * kKeyBlock, n = std::min(mv, j0 + kKeyBlock) - j0;
    std::memset(dka + j0 * dm.Dkp, 0, sizeof(float) * static_cast<size_t>(n * dm.Dkp));
    std::memset(dva + j0 * dm.Dvp, 0, sizeof(float) * static_cast<size_t>(n * dm.Dvp));
  });

  // Pass 1, per group in query order: recompute O, then dφ(q) and the intra-chunk key gradients
  // (keys [kp, kend) of a chunk: disjoint between groups). Leaves the group's own keys in sc.r.
  auto walk1 = [&](int64_t g, const float* slot, ThreadScratch& sc) {
    float* r = sc.r.floats(static_cast<size_t>(dm.sf()));
    float* st = sc.sct.floats(static_cast<size_t>(dm.Dvp * dm.Dkp));    // (Dvp, Dkp) Sᵀ
    float* phq = sc.phq.floats(static_cast<size_t>(kChunk * dm.Dkp));   // (64, Dkp)
    float* num = sc.num.floats(static_cast<size_t>(kChunk * dm.Dvp));   // (64, Dvp)
    float* a = sc.a.floats(static_cast<size_t>(2 * kChunk * kChunk));   // (64, 64) A, then dA
    float* da = a + kChunk * kChunk;
    float* dq_c = sc.dphq.floats(static_cast<size_t>(kChunk * dm.Dkp));  // (64, Dkp) ∂L/∂φ(q)
    for (int64_t hh = 0; hh < G; ++hh) {
      const int64_t h = hk * G + hh;
      float* dn_h = dnum + hh * nv * dm.Dvp;
      float* dd_h = dden + hh * nv;
      std::memset(r, 0, sizeof(float) * static_cast<size_t>(dm.sf()));
      int64_t absorbed = pl.start(g);
      for (int64_t c = pl.c0(g); c < pl.c1(g); ++c) {
        const float* s = chunk_state(in, b, hk, pl, g, c, dm, slot, r, absorbed, sc);
        const float* z = s + dm.Dkp * dm.Dvp;
        const int64_t i0 = pl.i0(c), rows = pl.i1(c) - i0, kp = pl.kp(c), nin = pl.kend(c) - kp;
        mk::pack_transposed(s, dm.D, dm.Dvp, dm.Dvp, st, dm.Dkp);  // Sᵀ (Dvp, Dkp)
        phi_rows(in.q, b, h, i0, rows, dm.D, dm.Dkp, phq);
        float den[kChunk];
        const mk::RowsOperand vin = chunk_num_den(in, b, hk, pl, c, dm, s, phq, num, den, a, sc);
        const int64_t nkw = round_up(std::max<int64_t>(nin, 1), mk::kLanes);
        // O = num / den  ->  dnum = dO / den ; dden = −dO·O / den = −dO·num / den²
        for (int64_t r2 = 0; r2 < rows; ++r2) {
          const float* go = dout.ptr(b, h, i0 + r2);
          float* dn = dn_h + (i0 + r2) * dm.Dvp;
          float gdot = 0.f;
          for (int64_t e = 0; e < dm.Dv; ++e) {
            dn[e] = go[e] / den[r2];
            gdot += go[e] * num[r2 * dm.Dvp + e];
          }
          for (int64_t e = dm.Dv; e < dm.Dvp; ++e) dn[e] = 0.f;
          dd_h[i0 + r2] = -gdot / (den[r2] * den[r2]);
        }
        // dφ(Q) = dnum·Sᵀ + dden zᵀ (+ intra: dA·φ(K_in), dA = dnum·V_inᵀ + dden, masked like A)
        std::memset(dq_c, 0, sizeof(float) * static_cast<size_t>(rows * dm.Dkp));
        mk::gemm_ab(rows, dm.Dkp, dm.Dv, dn_h + i0 * dm.Dvp, dm.Dvp, 1, st, dm.Dkp, dq_c, dm.Dkp, nullptr);
        for (int64_t r2 = 0; r2 < rows; ++r2) simd::axpy_row(dq_c + r2 * dm.Dkp, z, dm.D, dd_h[i0 + r2]);
        if (nin > 0) {
          float* vint = sc.phkt.floats(static_cast<size_t>(std::max(dm.Dkp, dm.Dvp) * kKeyStep));  // (Dv, nkw) V_inᵀ
          mk::pack_transposed(vin.data, nin, dm.Dv, vin.ld, vint, nkw);
          std::memset(da, 0, sizeof(float) * static_cast<size_t>(rows * nkw));
          mk::gemm_ab(rows, nkw, dm.Dv, dn_h + i0 * dm.Dvp, dm.Dvp, 1, vint, nkw, da, nkw, nullptr);
          for (int64_t r2 = 0; r2 < rows; ++r2) {  // keys kp + j with j < vis are visible to row r2
            const int64_t vis = std::clamp<int64_t>(i0 + r2 + pl.off + 1 - kp, 0, nin);
            for (int64_t j = 0; j < nkw; ++j) da[r2 * nkw + j] = j < vis ? da[r2 * nkw + j] + dd_h[i0 + r2] : 0.f;
          }
          // φ(K_in) rows are in sc.phk (left by intra_scores)
          mk::gemm_ab(rows, dm.Dkp, nin, da, nkw, 1, sc.phk.floats(0), dm.Dkp, dq_c, dm.Dkp, nullptr);
          // ∂φ(k_j) += Σ_i dA_ij φ(q_i) ; ∂v_j += Σ_i A_ij dnum_i
          mk::gemm_ab(nin, dm.Dkp, rows, da, 1, nkw, phq, dm.Dkp, dka + kp * dm.Dkp, dm.Dkp, nullptr);
          mk::gemm_ab(nin, dm.Dvp, rows, a, 1, nkw, dn_h + i0 * dm.Dvp, dm.Dvp, dva + kp * dm.Dvp, dm.Dvp, nullptr);
        }
        for (int64_t r2 = 0; r2 < rows; ++r2)
          add_dphi(dq.ptr(b, h, i0 + r2), dq_c + r2 * dm.Dkp, in.q.ptr(b, h, i0 + r2), dm.D);
      }
    }
  };
  if (split) {
    split_for(true, ng, owner, [&](int64_t g, int thread) { walk1(g, ks.at(g), ws.threads[static_cast<size_t>(thread)]); });
  } else {
    ThreadScratch& sc = ws.threads[static_cast<size_t>(owner)];
    for (int64_t g = 0; g < ng; ++g) {
      walk1(g, ks.at(g), sc);
      ks.advance(sc.r.floats(0));
    }
  }

  // Pass 2, in reverse: key j is in the state of every chunk c with kp(c) > j; its query state
  // sums φ(q) dnumᵀ and φ(q) dden over those chunks: ∂φ(k_j) += G·v_j + gz ; ∂v_j += Gᵀ φ(k_j).
  // A group's walk starts from the query state of the groups after it (`after`) and adds its
  // own chunks (t); keys [0, kp(0)) see every chunk and take the total.
  auto apply_state = [&](int64_t k0, int64_t k1, const float* q, ThreadScratch& sc) {
    const float* gm = q;
    const float* gt = q + dm.Dkp * dm.Dvp;
    const float* gz = gt + dm.Dvp * dm.Dkp;
    for (int64_t j0 = k0; j0 < k1; j0 += kKeyStep) {
      const int64_t n = std::min(kKeyStep, k1 - j0);
      float* phk = sc.phk.floats(static_cast<size_t>(kKeyStep * dm.Dkp));
      phi_rows(in.k, b, hk, j0, n, dm.D, dm.Dkp, phk);
      const mk::RowsOperand v = mk::rows_operand(in.v.ptr(b, hk, j0), n, dm.Dv, in.v.stride(2),
                                                 sc.vrow.floats(static_cast<size_t>(kKeyStep * dm.Dvp)));
      mk::gemm_ab(n, dm.Dkp, dm.Dv, v.data, v.ld, 1, gt, dm.Dkp, dka + j0 * dm.Dkp, dm.Dkp, nullptr);
      for (int64_t r = 0; r < n; ++r) simd::axpy_row(dka + (j0 + r) * dm.Dkp, gz, dm.D);
      mk::gemm_ab(n, dm.Dvp, dm.D, phk, dm.Dkp, 1, gm, dm.Dvp, dva + j0 * dm.Dvp, dm.Dvp, nullptr);
    }
  };
  auto add_chunk = [&](int64_t c, int64_t hh, float* t, ThreadScratch& sc) {
    const int64_t i0 = pl.i0(c), rows = pl.i1(c) - i0;
    float* phq = sc.phq.floats(static_cast<size_t>(kChunk * dm.Dkp));
    const float* dn = dnum + (hh * nv + i0) * dm.Dvp;
    phi_rows(in.q, b, hk * G + hh, i0, rows, dm.D, dm.Dkp, phq);
    mk::gemm_ab(dm.D, dm.Dvp, rows, phq, 1, dm.Dkp, dn, dm.Dvp, t, dm.Dvp, nullptr);
    mk::gemm_ab(dm.Dv, dm.Dkp, rows, dn, 1, dm.Dvp, phq, dm.Dkp, t + dm.Dkp * dm.Dvp, dm.Dkp, nullptr);
    float* tz = t + 2 * dm.Dkp * dm.Dvp;
    for (int64_t r = 0; r < rows; ++r) simd::axpy_row(tz, phq + r * dm.Dkp, dm.D, dden[hh * nv + i0 + r]);
  };
  // Leaves the group's own query state in sc.t.
  auto walk2 = [&](int64_t g, int64_t hh, const float* after, ThreadScratch& sc) {
    float* t = sc.t.floats(static_cast<size_t>(gf));
    std::memset(t, 0, sizeof(float) * static_cast<size_t>(gf));
    bool empty = true;
    for (int64_t c = pl.c1(g) - 1; c >= pl.c0(g); --c) {
      const int64_t k0 = pl.kp(c), k1 = c + 1 < pl.chunks() ? pl.kp(c + 1) : k0;
      if (k0 < k1) {
        const float* q = after;
        if (!empty) {
          float* comb = sc.tc.floats(static_cast<size_t>(gf));
          add_states(comb, after, t, gf);
          q = comb;
        }
        apply_state(k0, k1, q, sc);
      }
      add_chunk(c, hh, t, sc);
      empty = false;
    }
  };
  // (G, slots, gf): per query head, slot 0 the total, slot g + 1 the groups after g (split heads);
  // unsplit heads keep one running slot, which ends as the total.
  const int64_t slots = split ? ng + 1 : 1;
  float* qs = hs.suf.floats(static_cast<size_t>(G * slots * gf));
  if (split) {
    split_for(true, ng * G, owner, [&](int64_t x, int thread) {
      const int64_t g = x / G, hh = x % G;
      float* t = qs + (hh * slots + g + 1) * gf;
      std::memset(t, 0, sizeof(float) * static_cast<size_t>(gf));
      for (int64_t c = pl.c1(g) - 1; c >= pl.c0(g); --c) add_chunk(c, hh, t, ws.threads[static_cast<size_t>(thread)]);
    });
    float* tmp = ws.threads[static_cast<size_t>(owner)].tc.floats(static_cast<size_t>(gf));
    for (int64_t hh = 0; hh < G; ++hh) {
      float* acc = qs + hh * slots * gf;
      std::memset(acc, 0, sizeof(float) * static_cast<size_t>(gf));
      for (int64_t g = ng - 1; g >= 0; --g) {
        float* sl = acc + (g + 1) * gf;
        std::memcpy(tmp, sl, sizeof(float) * static_cast<size_t>(gf));
        std::memcpy(sl, acc, sizeof(float) * static_cast<size_t>(gf));
        add_states(acc, acc, tmp, gf);
      }
    }
    if (ks.walks)
      split_for(true, ng, owner, [&](int64_t g, int thread) {
        for (int64_t hh = 0; hh < G; ++hh)
          walk2(g, hh, qs + (hh * slots + g + 1) * gf, ws.threads[static_cast<size_t>(thread)]);
      });
  } else {
    ThreadScratch& sc = ws.threads[static_cast<size_t>(owner)];
    for (int64_t hh = 0; hh < G; ++hh) {
      float* acc = qs + hh * gf;
      std::memset(acc, 0, sizeof(float) * static_cast<size_t>(gf));
      for (int64_t g = ng - 1; g >= 0; --g) {
        walk2(g, hh, acc, sc);
        add_states(acc, acc, sc.t.floats(0), gf);
      }
    }
  }
  const int64_t base = pl.kp(0);
  split_for(split, blocks_of(base, kKeyBlock), owner, [&](int64_t x, int thread) {
    for (int64_t hh = 0; hh < G; ++hh)
      apply_state(x * kKeyBlock, std::min(base, (x + 1) * kKeyBlock), qs + hh * slots * gf,
                  ws.threads[static_cast<size_t>(thread)]);
  });
  split_for(split, kb, owner, [&](int64_t x, int) {
    for (int64_t j = x * kKeyBlock; j < std::min(mv, (x + 1) * kKeyBlock); ++j) {
      add_dphi(dk.ptr(b, hk, j), dka + j * dm.Dkp, in.k.ptr(b, hk, j), dm.D);
      simd::axpy_row(dv.ptr(b, hk, j), dva + j * dm.Dvp, dm.Dv);
    }
  });
}

// Heads over the team, or, with fewer (batch, key head) pairs than threads, each head's phases.
template <class F>
void for_heads(const AttentionDims& d, LinearWorkspace& ws, F&& head) {
  ws.threads.resize(std::max(ws.threads.size(), static_cast<size_t>(max_threads())));
  ws.heads.resize(std::max(ws.heads.size(), static_cast<size_t>(max_threads())));
  const int64_t tasks = d.B * d.Hkv;
  if (split_tasks(tasks)) {
    for (int64_t t = 0; t < tasks; ++t) head(t / d.Hkv, t % d.Hkv, true, 0);
  } else {
    parallel_for(tasks, [&](int64_t t, int thread) { head(t / d.Hkv, t % d.Hkv, false, thread); });
  }
}

}  // namespace

void attn_linear_fwd(const AttentionInputs& in, const AttentionDims& d, View out, LinearWorkspace& ws) {
  const Dims dm{d.Dk, d.Dv, round_up(d.Dk, mk::kLanes), round_up(d.Dv, mk::kLanes)};
  for_heads(d, ws, [&](int64_t b, int64_t hk, bool split, int owner) {
    linear_fwd_head(in, d, dm, b, hk, split, owner, out, ws);
  });
}

void attn_linear_bwd(const AttentionInputs& in, const AttentionDims& d, ConstView dout, View dq,
                     View dk, View dv, LinearWorkspace& ws) {
  const Dims dm{d.Dk, d.Dv, round_up(d.Dk, mk::kLanes), round_up(d.Dv, mk::kLanes)};
  for_heads(d, ws, [&](int64_t b, int64_t hk, bool split, int owner) {
    linear_bwd_head(in, d, dm, b, hk, split, owner, dout, dq, dk, dv, ws);
  });
}

namespace {

class LinearAttention final : public Attention {
 public:
  LinearAttention() {
    caps_ = Capabilities{.causal = true, .query_lengths = true, .key_lengths = true, .bias = false,
                         .cross = true, .gqa = true, .trainable = true};
  }
  std::string name() const override { return "linear"; }
  const Capabilities& capabilities() const override { return caps_; }
  void check_magnitudes(const AttentionDims& d, const Magnitudes& m) const override {
    check_linear_range(d, m, "linear");
  }
  void forward(const AttentionInputs& in, View out, Context& ctx) const override {
    Magnitudes mag;
    const AttentionDims d = validate_inputs(in, caps_, "linear", mag);
    validate_output(out, Shape{d.B, d.H, d.N, d.Dv}, "out", "linear");
    check_magnitudes(d, mag);
    ctx.state<LinearState>().shape = in.q.shape;
    attn_linear_fwd(in, d, out, ctx.scratch().get<LinearWorkspace>());
  }
  void backward(const AttentionInputs& in, ConstView out, Context& ctx, ConstView dout, View dq,
                View dk, View dv) const override {
    Magnitudes mag;
    const AttentionDims d = validate_inputs(in, caps_, "linear", mag);
    check(ctx.saved<LinearState>().shape == in.q.shape, "linear: backward inputs have shapes ",
          "other than the forward's (q is now ", in.q.shape, ")");
    const double mdo = validate_backward_max(in, d, out, dout, dq, dk, dv, "linear");
    check_linear_grad_range(d, mag, mdo, "linear");
    attn_linear_bwd(in, d, dout, dq, dk, dv, ctx.scratch().get<LinearWorkspace>());
  }
  size_t workspace_bytes(const AttentionDims& d, Mode mode, int threads) const override {
    const Dims dm{d.Dk, d.Dv, round_up(d.Dk, mk::kLanes), round_up(d.Dv, mk::kLanes)};
    const bool train = mode == Mode::training;
    // Per work item (every thread): tiles, then the backward's transposed state and query states.
    int64_t item = kChunk * dm.Dkp + kKeyStep * dm.Dkp + std::max(dm.Dkp, dm.Dvp) * kKeyStep +
                   kKeyStep * dm.Dvp + (train ? 2 : 1) * kChunk * kChunk + kChunk * dm.Dvp + 2 * dm.sf();
    if (train) item += dm.Dvp * dm.Dkp + 2 * dm.gf() + kChunk * dm.Dkp;
    // Per head: key states, and in training dnum, the key gradients and the query states. An
    // unsplit head keeps one running state; a split one (only its owner's) keeps every group's.
    const int64_t ng = blocks_of(blocks_of(std::max<int64_t>(1, d.N), kChunk), kGroup);
    const int64_t nb = std::max<int64_t>(1, blocks_of(d.M, kKeyBlock));
    const int64_t grads = d.group() * std::max<int64_t>(1, d.N) * (dm.Dvp + 1) +
                          std::max<int64_t>(1, d.M) * (dm.Dkp + dm.Dvp);
    const int64_t unsplit = 2 * dm.sf() + (train ? grads + d.group() * dm.gf() : 0);
    const int64_t split = (ng + 1 + nb) * dm.sf() + (train ? grads + d.group() * (ng + 1) * dm.gf() : 0);
    return sizeof(float) * static_cast<size_t>(threads * (item + unsplit) + split) +
           static_cast<size_t>(threads) * (sizeof(ThreadScratch) + sizeof(HeadScratch));
  }
  // Per key head the key-value state S = Σ φ(k) vᵀ and z = Σ φ(k); per query φ(q)·S and φ(q)·z.
  // The causal form runs the same sums as prefixes: the same products.
  WorkModel work(const AttentionDims& d, bool /*causal*/, Mode mode) const override {
    const double dk = static_cast<double>(d.Dk), dv = static_cast<double>(d.Dv);
    const double keys = static_cast<double>(d.B * d.Hkv * d.M), queries = static_cast<double>(d.B * d.H * d.N);
    WorkModel w;
    w.add("key-value state", false, keys * (2 * dk * dv + dk), 0, work::io_bytes(d, false));
    w.add("query products", false, queries * (2 * dk * dv + 2 * dk));
    if (mode == Mode::training) {
      // dS = Σ φ(q)ᵀ dO and dφ(q) = dO·Sᵀ per query; dφ(k) = V·dSᵀ and dV = φ(k)·dS per key.
      w.add("query products", true, queries * (4 * dk * dv + 4 * dk), 0, work::io_bytes(d, true));
      w.add("key-value state", true, keys * (4 * dk * dv + 2 * dk));
    }
    return w;
  }

 private:
  // Backward recomputes everything from the inputs; the context only records the forward shape.
  struct LinearState : ContextState {
    Shape shape;
    size_t bytes() const override { return 0; }
  };
  Capabilities caps_;
};

}  // namespace

std::unique_ptr<Attention> make_linear(const Spec& spec) {
  SpecReader r(spec);
  r.finish();
  return std::make_unique<LinearAttention>();
}

}  // namespace clattn
