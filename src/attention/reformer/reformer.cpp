// Reformer LSH attention with shared QK. Keys are the queries normalised to unit length; per round
// a random rotation hashes each position to the argmax of [x·R, −x·R] (factorised into two
// rotations above 128 buckets, bucket = b1 + f1·b2, as in the original); positions are sorted by
// (bucket, position) with a counting sort and cut into chunks; each chunk's queries attend the
// keys of the chunk and of the one before it (the first wraps to the last; with a single chunk it
// attends only itself, never a key twice). Logits are q · k_unit with no scaling. A query never
// attends to itself unless nothing else in its round is visible; causal and key-padding masks
// apply by original position. Rounds combine by log-sum-exp (one softmax over every round's keys).
// Causal (strictly: a position's output never depends on a later position). Cutting the global
// (bucket, position) order into fixed chunks would not be: where a chunk boundary falls, and so
// which keys a query meets, depends on how many later positions land in earlier buckets. With
// the causal mask each bucket is cut into its own chunks instead, in position order (its run
// padded to whole chunks), and a chunk attends itself and the chunk before it in the same bucket
// (no wrap): a query sees the earlier positions of its bucket from the start of the previous
// chunk of that bucket, i.e. ranks [(⌊r/chunk⌋ − 1)·chunk, r] of its rank r there — chosen by
// earlier positions only. (The reference implementation cuts the global order; it is not
// strictly causal.)
// The K input must be Q itself (validate_inputs checks it for shared-QK variants): all gradient
// flows into dq, through both the query and the normalised-key role; dk is left unchanged.
// Layout of the work: heads go to threads statically, and a thread hashes its next head in
// slices between the chunks of the current one (the hash is compute, the chunk loop waits on
// memory). A chunk's rows are staged once per round (Slot): each chunk is also the next one's
// "previous", so q and v rows are read once per position and round, and the backward
// accumulates per slot and writes dq/dv once per position and round. Hashing costs
// D·(f1 + f2)/2 per position with f1·f2 = buckets ≈ 2N/chunk: it grows as N^1.5 (docs/design.md).
#include "attention/validate.h"
#include "attention/reformer/reformer.h"
#include "attention/reformer/reformer_internal.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "attention/tile/gather.h"
#include "attention/tile/tile_ops.h"
#include "attention/query_groups.h"
#include "attention/registry.h"
#include "attention/work.h"
#include "clattn/threads.h"
#include "clattn/rng.h"
#include "cluster/cluster.h"
#include "core/microkernel.h"
#include "core/simd.h"

namespace clattn {

using mk::round_up;
using reformer_parts::chunk_keys;
using reformer_parts::chunk_len;
using reformer_parts::factorise;
using reformer_parts::prev_chunk;
using reformer_parts::rotation;
using tile::kInf;
using tile::kLn2;
using tile::kLog2e;

namespace {

constexpr int64_t kMaxChunk = kReformerMaxChunk;

// One chunk's rows, staged once per round: a chunk is the "current" chunk of its own queries and
// the "previous" chunk of the next one, so keeping two consecutive chunks (plus the last chunk,
// which the first wraps to) gathered means every position's rows are read once per round.
struct Slot {
  int64_t n = 0, w = 0;     // members, width (n rounded up to 16)
  int32_t idx[kMaxChunk];   // positions
  alignas(64) float nrm[kMaxChunk];  // |q|
  float* kt = nullptr;      // (Dk, w) unit keys k̂ = q/|q|, transposed; columns past n zero
  float* vr = nullptr;      // (w, Dvp) values; rows past n zero
  // backward only
  float* kr = nullptr;      // (w, Dkp) unit keys as rows
  float* vt = nullptr;      // (Dv, w) values transposed
  float* gq = nullptr;      // (w, Dkp) ∂L/∂q through the query role
  float* gk = nullptr;      // (w, Dkp) ∂L/∂k̂
  float* gv = nullptr;      // (w, Dvp) ∂L/∂v
};

// Per-thread scratch; sized on first use, reused by every later call on the same Scratch.
struct ThreadScratch {
  std::vector<int32_t> bucket;  // (2, R, N) this head's buckets and the next one's
  std::vector<int32_t> offsets;
  std::vector<int32_t> sorted;  // (N) causal: the (bucket, position) order before padding
  std::vector<char> has_borrowed;  // split backward: which spans borrowed a chunk
  Slot slots[3];
  Workspace proj, slot_mem, s, o, go, dp;
  size_t bytes() const { return held_bytes(bucket, offsets, sorted, has_borrowed, proj, slot_mem, s, o, go, dp); }
};

}  // namespace

struct ReformerWorkspace {
  std::vector<ThreadScratch> threads;
  // Backward of a head split over the team: per span of chunks, the slot of the chunk before
  // its first one (the span adds that chunk's key-role gradients; they are flushed after all
  // spans), and the slots' floats.
  std::vector<Slot> borrowed;
  Workspace borrowed_mem;

  void ensure_threads() {
    if (threads.size() < static_cast<size_t>(max_threads()))
      threads.resize(static_cast<size_t>(max_threads()));
  }
  size_t bytes() const {
    size_t n = held_bytes(threads, borrowed, borrowed_mem);
    for (const ThreadScratch& t : threads) n += t.bytes();
    return n;
  }
};

int64_t reformer_perm_len(int64_t n, int64_t nb, int64_t ch, bool causal) {
  return causal ? round_up(n + std::min(nb, n) * (ch - 1), ch) : n;
}

WorkModel reformer_work(const AttentionDims& d, const ReformerParams& p, bool causal, Mode mode) {
  const int64_t nb = reformer_buckets(p, d.N);
  const auto [f1, f2] = factorise(nb);
  const double rounds = static_cast<double>(p.rounds), bh = static_cast<double>(d.B * d.H);
  const double nrot = static_cast<double>(f1 / 2 + (f2 > 1 ? f2 / 2 : 0));
  const double keys = std::min(static_cast<double>(2 * p.chunk) * (causal ? 0.5 : 1.0), static_cast<double>(d.N));
  const double pairs = rounds * static_cast<double>(d.N) * keys;
  WorkModel w;
  w.add("hashing", false, rounds * 2.0 * static_cast<double>(d.N * d.Dk) * nrot * bh);
  w += work::softmax_attention(d, pairs, mode, "chunk attention");
  if (p.rounds > 1) {
    w.add("round combination", false, rounds * 2.0 * static_cast<double>(d.N * d.Dv) * bh);
    if (mode == Mode::training) w.add("round combination", true, rounds * 2.0 * static_cast<double>(d.N * d.Dv) * bh);
  }
  return w;
}

int64_t reformer_buckets(const ReformerParams& p, int64_t n) {
  if (p.buckets > 0) {
    check(p.buckets % 2 == 0, "reformer: buckets must be even, got ", p.buckets);
    check(factorise(p.buckets).first > 0, "reformer: above 128, buckets must be a product of two ",
          "even numbers (f1·f2, hashed by two rotations), got ", p.buckets);
    return p.buckets;
  }
  int64_t nb = std::max<int64_t>(2, 2 * ((n + p.chunk - 1) / p.chunk));
  if (nb <= 128) return nb;
  const int64_t f1 = 2 * static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(nb)) / 2));
  return f1 * (2 * ((nb + 2 * f1 - 1) / (2 * f1)));  // rounded up to f1 · (even f2)
}

namespace {

// The partition of round r from its buckets: sorted by (bucket, position); with causal each
// bucket's run padded with -1 to whole chunks. Returns the number of chunks.
int64_t partition(const int32_t* bucket, int64_t n, int64_t nb, int64_t ch, bool causal, int32_t* perm,
                  int32_t* cbucket, std::vector<int32_t>& sorted, std::vector<int32_t>& offsets) {
  if (!causal) {
    cluster::counting_sort(bucket, n, nb, perm, offsets.data());
    return (n + ch - 1) / ch;
  }
  sorted.resize(static_cast<size_t>(n));
  cluster::counting_sort(bucket, n, nb, sorted.data(), offsets.data());
  int64_t len = 0;
  for (int64_t bk = 0; bk < nb; ++bk) {
    const int32_t a = offsets[static_cast<size_t>(bk)], e = offsets[static_cast<size_t>(bk + 1)];
    if (a == e) continue;
    std::copy(sorted.data() + a, sorted.data() + e, perm + len);
    const int64_t end = round_up(len + (e - a), ch);
    std::fill(perm + len + (e - a), perm + end, -1);
    for (int64_t c = len / ch; c < end / ch; ++c) cbucket[c] = static_cast<int32_t>(bk);
    len = end;
  }
  return len / ch;
}


struct Dims {
  int64_t N, D, Dv, Dkp, Dvp;
};

// Floats of one slot (sized for the widest chunk).
int64_t slot_floats(const Dims& dm, bool backward) {
  const int64_t W = kMaxChunk;
  return dm.Dkp * W + W * dm.Dvp + (backward ? 3 * W * dm.Dkp + dm.Dvp * W + W * dm.Dvp : 0);
}

// Carves n slots out of m (n · slot_floats floats).
void carve(Slot* slots, int64_t n, float* m, const Dims& dm, bool backward) {
  const int64_t W = kMaxChunk;
  for (int64_t x = 0; x < n; ++x) {
    Slot& sl = slots[x];
    sl.kt = m, m += dm.Dkp * W;
    sl.vr = m, m += W * dm.Dvp;
    if (!backward) continue;
    sl.kr = m, m += W * dm.Dkp;
    sl.vt = m, m += dm.Dvp * W;
    sl.gq = m, m += W * dm.Dkp;
    sl.gk = m, m += W * dm.Dkp;
    sl.gv = m, m += W * dm.Dvp;
  }
}

// Carves a thread's three slots out of its one allocation.
void carve_slots(ThreadScratch& sc, const Dims& dm, bool backward) {
  carve(sc.slots, 3, sc.slot_mem.floats(static_cast<size_t>(3 * slot_floats(dm, backward))), dm, backward);
}

// Gathers chunk c of perm into sl: norms, unit keys (transposed, and as rows for backward),
// values; zeroes the backward accumulators.
// ahead: the positions of the chunk staged next, whose rows are requested meanwhile.
void stage_chunk(const float* qb, int64_t qrs, const float* vb, int64_t vrs, const Dims& dm,
                 const int32_t* perm, int64_t len, int64_t ch, int64_t c, Slot& sl, bool backward,
                 const gather::Ahead& ahead) {
  sl.n = chunk_len(perm, len, ch, c);
  sl.w = round_up(sl.n, mk::kLanes);
  std::copy(perm + c * ch, perm + c * ch + sl.n, sl.idx);
  gather::transposed(qb, qrs, sl.idx, sl.n, dm.D, sl.kt, sl.w, ahead);
  // |q| from the staged columns (no second read of the rows), 16 members at a time.
  alignas(64) float inv[kMaxChunk];
  for (int64_t x = 0; x < sl.w; x += mk::kLanes) {
    simd::vf ss{};
    for (int64_t e = 0; e < dm.D; ++e) {
      const simd::vf k = simd::load(sl.kt + e * sl.w + x);
      ss += k * k;
    }
    simd::store(sl.nrm + x, ss);
  }
  for (int64_t x = 0; x < sl.w; ++x) {
    sl.nrm[x] = std::sqrt(sl.nrm[x]);
    inv[x] = sl.nrm[x] > 0.f ? 1.f / sl.nrm[x] : 0.f;
  }
  for (int64_t e = 0; e < dm.D; ++e)
    for (int64_t x = 0; x < sl.w; x += mk::kLanes)
      simd::store(sl.kt + e * sl.w + x, simd::load(sl.kt + e * sl.w + x) * simd::load(inv + x));
  if (!backward) {
    gather::rows(vb, vrs, sl.idx, sl.n, dm.Dv, sl.vr, dm.Dvp, sl.w, 1.f, ahead);
    return;
  }
  gather::transpose(sl.kt, sl.w, dm.D, sl.w, sl.kr, dm.Dkp);  // (Dk, w)ᵀ -> (w, Dkp) rows
  gather::transposed(vb, vrs, sl.idx, sl.n, dm.Dv, sl.vt, sl.w, ahead);
  std::memset(sl.gq, 0, sizeof(float) * static_cast<size_t>(sl.w * dm.Dkp));
  std::memset(sl.gk, 0, sizeof(float) * static_cast<size_t>(sl.w * dm.Dkp));
  std::memset(sl.gv, 0, sizeof(float) * static_cast<size_t>(sl.w * dm.Dvp));
}

// Scores of chunk `cur` against its keys [cur | prev] (prev null: a single chunk), log2 units,
// S (n, kw) with kw = cur.w + prev.w: s_ij = |q_i| (k̂_i · k̂_j) · log2 e = (q_i · k̂_j) log2 e.
// Invisible keys and the query's own position get -inf; self_s[r] keeps the own logit and
// self[r] says row r must fall back to it (nothing else visible).
int64_t chunk_scores(const Slot& cur, const Slot* prev, const Dims& dm, int64_t mv, bool causal,
                     float* s, float* self_s, bool* self) {
  const int64_t kw = cur.w + (prev ? prev->w : 0);
  std::memset(s, 0, sizeof(float) * static_cast<size_t>(cur.n * kw));
  // A = the chunk's own unit keys read as rows (transposed access), B = the key panels.
  mk::gemm_ab(cur.n, cur.w, dm.D, cur.kt, 1, cur.w, cur.kt, cur.w, s, kw, nullptr);
  if (prev) mk::gemm_ab(cur.n, prev->w, dm.D, cur.kt, 1, cur.w, prev->kt, prev->w, s + cur.w, kw, nullptr);
  int32_t cols[2 * kMaxChunk];
  for (int64_t x = 0; x < kw; ++x) {
    const bool in_cur = x < cur.w;
    const int64_t y = in_cur ? x : x - cur.w;
    const Slot& sl = in_cur ? cur : *prev;
    cols[x] = y < sl.n ? sl.idx[y] : -1;
  }
  for (int64_t r = 0; r < cur.n; ++r) {
    float* row = s + r * kw;
    const float f = cur.nrm[r] * kLog2e;
    for (int64_t x = 0; x < kw; x += mk::kLanes) simd::store(row + x, simd::load(row + x) * f);
    self_s[r] = row[r];
    const int64_t i = cur.idx[r];
    bool any = false;
    for (int64_t x = 0; x < kw; ++x) {
      const int64_t j = cols[x];
      const bool vis = j >= 0 && j < mv && j != i && (!causal || j <= i);
      if (!vis) row[x] = -kInf;
      any |= vis;
    }
    self[r] = !any && i < mv;
    if (!self[r]) self_s[r] = -kInf;
  }
  return kw;
}

// argmax over [x, −x] of x (half floats), the first in the order x0, −x0, x1, −x1, ... on ties:
// the first u with |x_u| maximal, as u when x_u ≥ 0 and u + half otherwise. Branch-free for
// half ≤ 64 (the hit bits of all vectors in one word): which half holds the maximum is a coin
// toss per row, and a mispredicted early exit cost more than the comparisons.
inline __attribute__((always_inline)) int64_t argmax_pm(const float* x, int64_t half) {
  constexpr int L = simd::kLanes;
  simd::vf m = simd::splat(0.f);  // |x| ≥ 0, so zero-padded lanes never win a strict maximum
  for (int64_t u = 0; u < half; u += L) {
    const simd::vf v = half - u >= L ? simd::load(x + u) : simd::load_partial(x + u, static_cast<int>(half - u));
    m = simd::vmax(m, simd::vmax(v, -v));
  }
  const simd::vf mx = simd::splat(simd::hmax(m)), zero = simd::splat(0.f);
  for (int64_t w = 0; w < half; w += 4 * L) {  // words of 64 positions
    uint64_t hit = 0, neg = 0;
    for (int64_t u = w; u < std::min(half, w + 4 * L); u += L) {
      const int n = static_cast<int>(std::min<int64_t>(L, half - u));
      const simd::vf v = n == L ? simd::load(x + u) : simd::load_partial(x + u, n);
      const uint64_t valid = n == L ? 0xFFFFu : (1u << n) - 1u;
      hit |= (~static_cast<uint64_t>(simd::mask_gt_v(mx, simd::vmax(v, -v))) & valid) << (u - w);
      neg |= static_cast<uint64_t>(simd::mask_gt_v(zero, v)) << (u - w);
    }
    if (hit) {
      const int b = __builtin_ctzll(hit);
      return w + b + static_cast<int64_t>((neg >> b) & 1u) * half;
    }
  }
  return 0;  // unreachable for finite x: some |x_u| equals the maximum
}

// Buckets of positions [r0, r1) for every round, bucket (R, N): one tile product of q against all
// rounds' rotations (the argmax is unchanged by the positive factor 1/|q|, so q is hashed as is).
void hash_positions(const float* qb, int64_t qrs, const Dims& dm, const float* rot, int64_t R,
                    int64_t f1, int64_t f2, int64_t nrot, int64_t r0, int64_t r1, float* proj,
                    int32_t* bucket) {
  const int64_t ncol = round_up(R * nrot, mk::kLanes), rows = 64;
  for (int64_t j0 = r0; j0 < r1; j0 += rows) {
    const int64_t nr = std::min(rows, r1 - j0);
    std::memset(proj, 0, sizeof(float) * static_cast<size_t>(nr * ncol));
    mk::gemm_ab(nr, ncol, dm.D, qb + j0 * qrs, qrs, 1, rot, ncol, proj, ncol, nullptr);
    for (int64_t x = 0; x < nr; ++x)
      for (int64_t r = 0; r < R; ++r) {
        const float* pr = proj + x * ncol + r * nrot;
        int64_t bk = argmax_pm(pr, f1 / 2);
        if (f2 > 1) bk += f1 * argmax_pm(pr + f1 / 2, f2 / 2);
        bucket[r * dm.N + j0 + x] = static_cast<int32_t>(bk);
      }
  }
}

// The positions of chunk c when it is staged from memory (the last chunk is staged first, at
// the start of the round), for the gathers of the chunk before it to request.
gather::Ahead ahead_of(const int32_t* perm, int64_t ch, int64_t c, int64_t nch, int64_t len) {
  if (c >= nch - 1) return {};
  return {perm + c * ch, chunk_len(perm, len, ch, c)};
}

// Requests into L2 the rows of chunk c + gather::kFarBlocks: q and v, which it will stage, and
// a third array it will read by position (the output read back by later rounds, or dO; null
// for none).
void request_far(const int32_t* perm, int64_t ch, int64_t c, int64_t nch, int64_t len, const Dims& dm,
                 const float* qb, int64_t qrs, const float* vb, int64_t vrs, const float* xb,
                 int64_t xrs) {
  const gather::Ahead far = ahead_of(perm, ch, c + gather::kFarBlocks, nch, len);
  gather::prefetch_l2(qb, qrs, far.idx, far.n, dm.D);
  gather::prefetch_l2(vb, vrs, far.idx, far.n, dm.Dv);
  if (xb) gather::prefetch_l2(xb, xrs, far.idx, far.n, dm.Dv);
}

// Chunk `cur` of round r attends [cur | prev]; its rows' outputs are blended into ob (row
// stride ors) with the running log2-sum-exp2 L of the rounds.
void fwd_chunk(const Slot& cur, const Slot* prev, const Dims& dm, int64_t mv, int64_t nv, bool causal,
               int64_t r, float* s, float* o, float* ob, int64_t ors, float* L, const gather::Ahead& ahead) {
  float self_s[kMaxChunk];
  bool self[kMaxChunk];
  const int64_t kw = chunk_scores(cur, prev, dm, mv, causal, s, self_s, self);
  std::memset(o, 0, sizeof(float) * static_cast<size_t>(cur.n * dm.Dvp));
  float lse_r[kMaxChunk];
  float ps[kMaxChunk];
  for (int64_t q = 0; q < cur.n; ++q) lse_r[q] = tile::softmax_row_extra(s + q * kw, kw, self_s[q], ps[q]);
  mk::gemm_ab(cur.n, dm.Dvp, cur.n, s, kw, 1, cur.vr, dm.Dvp, o, dm.Dvp, nullptr);
  if (prev) mk::gemm_ab(cur.n, dm.Dvp, prev->n, s + cur.w, kw, 1, prev->vr, dm.Dvp, o, dm.Dvp, nullptr);
  for (int64_t q = 0; q < cur.n; ++q) {
    if (self[q] && ps[q] > 0.f) simd::axpy_row(o + q * dm.Dvp, cur.vr + q * dm.Dvp, dm.Dv, ps[q]);
    if (r > 0) gather::prefetch_one(ob, ors, ahead, q, dm.Dv, true);  // round 0 only writes
    const int64_t i = cur.idx[q];
    if (i < nv) tile::blend_round(ob + i * ors, o + q * dm.Dvp, dm.Dv, L[i], lse_r[q], r == 0);
  }
}

// Backward of chunk `cur` of a round against [cur | prev]: accumulates into cur.gq, cur.gk,
// cur.gv and prev->gk, prev->gv (flushed into dq, dv once a chunk has served both roles).
// lse2 (N) the all-round log2-sum-exp2, di (N) D_i = dO_i·O_i; s, dp (64, 128), go (64, Dvp).
void bwd_chunk(Slot& cur, Slot* prev, const Dims& dm, int64_t mv, int64_t nv, bool causal, const float* lse2,
               const float* di, const float* vb, int64_t vrs, const float* gb, int64_t grs, const float* dqb,
               int64_t dqrs, const float* dvb, int64_t dvrs, float* s, float* dp, float* go,
               const gather::Ahead& ahead) {
  float self_s[kMaxChunk], ps[kMaxChunk], nrm_dss[kMaxChunk];
  bool self[kMaxChunk];
  const int64_t kw = chunk_scores(cur, prev, dm, mv, causal, s, self_s, self);
  for (int64_t q = 0; q < cur.n; ++q) {
    const int64_t i = cur.idx[q];
    gather::prefetch_one(gb, grs, ahead, q, dm.Dv);
    gather::prefetch_one(dqb, dqrs, ahead, q, dm.D, true);
    gather::prefetch_one(dvb, dvrs, ahead, q, dm.Dv, true);
    if (i < nv) {
      gather::rows(gb, grs, cur.idx + q, 1, dm.Dv, go + q * dm.Dvp, dm.Dvp, 1);
      tile::exp2_row(s + q * kw, kw, lse2[i]);  // P against the all-round log-sum-exp
      ps[q] = std::exp2(self_s[q] - lse2[i]);
    } else {  // padded query: no output, no gradient through its query role
      std::memset(go + q * dm.Dvp, 0, sizeof(float) * static_cast<size_t>(dm.Dvp));
      std::fill(s + q * kw, s + (q + 1) * kw, 0.f);
      ps[q] = 0.f;
    }
  }
  // dP = dO·Vᵀ over [cur | prev]
  std::memset(dp, 0, sizeof(float) * static_cast<size_t>(cur.n * kw));
  mk::gemm_ab(cur.n, cur.w, dm.Dv, go, dm.Dvp, 1, cur.vt, cur.w, dp, kw, nullptr);
  if (prev) mk::gemm_ab(cur.n, prev->w, dm.Dv, go, dm.Dvp, 1, prev->vt, prev->w, dp + cur.w, kw, nullptr);
  for (int64_t q = 0; q < cur.n; ++q) {
    const int64_t i = cur.idx[q];
    const float* prow = s + q * kw;
    float* drow = dp + q * kw;
    const float dd = i < nv ? di[i] : 0.f;
    for (int64_t x = 0; x < kw; ++x) drow[x] = prow[x] * (drow[x] - dd);
    nrm_dss[q] = 0.f;
    if (self[q] && ps[q] > 0.f) {  // the self-key fallback: s_ii = q_i · k̂_i
      const float dss = ps[q] * (simd::dot(go + q * dm.Dvp, vb + i * vrs, dm.Dv) - dd);
      simd::axpy_row(cur.gq + q * dm.Dkp, cur.kr + q * dm.Dkp, dm.D, dss);
      nrm_dss[q] = dss * cur.nrm[q];
      simd::axpy_row(cur.gv + q * dm.Dvp, go + q * dm.Dvp, dm.Dv, ps[q]);
    }
  }
  // natural logits s_ij = q_i·k̂_j: ∂q_i (query role) += dS·K̂ ; ∂k̂_j += dSᵀ·q_i, q_i = |q_i| k̂_i ;
  // ∂v_j += Pᵀ·dO
  mk::gemm_ab(cur.n, dm.Dkp, cur.n, dp, kw, 1, cur.kr, dm.Dkp, cur.gq, dm.Dkp, nullptr);
  if (prev) mk::gemm_ab(cur.n, dm.Dkp, prev->n, dp + cur.w, kw, 1, prev->kr, dm.Dkp, cur.gq, dm.Dkp, nullptr);
  for (int64_t q = 0; q < cur.n; ++q) {
    float* drow = dp + q * kw;
    for (int64_t x = 0; x < kw; ++x) drow[x] *= cur.nrm[q];
    simd::axpy_row(cur.gk + q * dm.Dkp, cur.kr + q * dm.Dkp, dm.D, nrm_dss[q]);
  }
  mk::gemm_ab(cur.n, dm.Dkp, cur.n, dp, 1, kw, cur.kr, dm.Dkp, cur.gk, dm.Dkp, nullptr);
  if (prev) mk::gemm_ab(prev->n, dm.Dkp, cur.n, dp + cur.w, 1, kw, cur.kr, dm.Dkp, prev->gk, dm.Dkp, nullptr);
  mk::gemm_ab(cur.n, dm.Dvp, cur.n, s, 1, kw, go, dm.Dvp, cur.gv, dm.Dvp, nullptr);
  if (prev) mk::gemm_ab(prev->n, dm.Dvp, cur.n, s + cur.w, 1, kw, go, dm.Dvp, prev->gv, dm.Dvp, nullptr);
}

// A slot's accumulators once its chunk has served as current and as previous:
// dq_j += gq + (gk − (k̂·gk) k̂)/|q| (k̂ = q/|q|), dv_j += gv. dqb, dvb: the head's rows.
void flush(const Slot& sl, const Dims& dm, float* dqb, int64_t dqrs, float* dvb, int64_t dvrs) {
  for (int64_t x = 0; x < sl.n; ++x) {
    const int64_t j = sl.idx[x];
    const float* kh = sl.kr + x * dm.Dkp;
    const float* gk = sl.gk + x * dm.Dkp;
    const float inv = sl.nrm[x] > 0.f ? 1.f / sl.nrm[x] : 0.f, pr = simd::dot(kh, gk, dm.D);
    float* gq = dqb + j * dqrs;
    for (int64_t e = 0; e < dm.D; ++e) gq[e] += sl.gq[x * dm.Dkp + e] + (gk[e] - pr * kh[e]) * inv;
    simd::axpy_row(dvb + j * dvrs, sl.gv + x * dm.Dvp, dm.Dv);
  }
}

// Chunks per work item of a head split over the team.
constexpr int64_t kSpan = 32;

// Which slot holds chunk c: the last chunk has its own (the first chunk's previous), the others
// alternate.
int slot_of(int64_t c, int64_t nch) { return c == nch - 1 ? 2 : static_cast<int>(c % 2); }

}  // namespace

void attn_reformer_fwd(const AttentionInputs& in, const AttentionDims& d, const ReformerParams& p,
                       uint64_t step, View out, ReformerState& st, ReformerWorkspace& ws) {
  const Dims dm{d.N, d.Dk, d.Dv, round_up(d.Dk, mk::kLanes), round_up(d.Dv, mk::kLanes)};
  const int64_t R = p.rounds, nb = reformer_buckets(p, d.N), ch = p.chunk;
  const int64_t f1 = factorise(nb).first, f2 = factorise(nb).second;  // lambdas capture them
  st.rounds = R;
  st.chunk = ch;
  st.buckets = nb;
  st.causal = in.causal;
  st.len = reformer_perm_len(d.N, nb, ch, in.causal);
  st.perm.resize(static_cast<size_t>(d.B * d.H * R * st.len));
  st.nch.assign(static_cast<size_t>(d.B * d.H * R), 0);
  st.cbucket.resize(in.causal ? static_cast<size_t>(d.B * d.H * R * (st.len / ch)) : 0);
  st.lse2.resize(Shape{d.B, d.H, d.N});
  // Rotations of all rounds, shared by all heads, as one (D, ncol) operand: round r's columns
  // [r·nrot, (r+1)·nrot) are its (D, f1/2) rotation and, factorised, its (D, f2/2) one.
  const int64_t nrot = f1 / 2 + (f2 > 1 ? f2 / 2 : 0), ncol = round_up(R * nrot, mk::kLanes);
  std::vector<float> rot(static_cast<size_t>(d.Dk * ncol), 0.f);  // (D, ncol)
  for (int64_t r = 0; r < R; ++r)
    for (int64_t e = 0; e < d.Dk; ++e)
      for (int64_t u = 0; u < nrot; ++u)
        rot[static_cast<size_t>(e * ncol + r * nrot + u)] = rotation(p, step, d.Dk, nrot, r, e, u);
  ws.ensure_threads();

  const int64_t BH = d.B * d.H, nch0 = (d.N + ch - 1) / ch;
  // Rows of the next head hashed after each chunk: all of them within one head's chunk loop.
  const int64_t slice = std::max<int64_t>(16, round_up((d.N + R * nch0 - 1) / std::max<int64_t>(1, R * nch0), 16));
  auto hash_head = [&](int64_t t, int32_t* bucket, int64_t r0, int64_t r1, ThreadScratch& sc) {
    hash_positions(in.q.ptr(t / d.H, t % d.H, 0), in.q.stride(2), dm, rot.data(), R, f1, f2, nrot,
                   r0, r1, sc.proj.floats(static_cast<size_t>(64 * ncol)), bucket);
  };
  if (split_tasks(BH)) {
    // Fewer heads than threads: one head at a time over the team. Hashing over row blocks; per
    // round the partition (a counting sort, serial), then the chunks in spans of kSpan over the
    // team, each span staging the chunk before its first one itself. A round writes each row
    // once, so spans never share a row, and each chunk computes what it computes in the chain.
    ThreadScratch& own = ws.threads[0];
    own.bucket.resize(static_cast<size_t>(2 * R * d.N));
    own.offsets.resize(static_cast<size_t>(nb + 1));
    for (int64_t t = 0; t < BH; ++t) {
      const int64_t b = t / d.H, h = t % d.H;
      const int64_t nv = valid_queries(in, d, b), mv = valid_keys(in, d, b);
      float* L = st.lse2.data() + t * d.N;
      float* ob = out.ptr(b, h, 0);
      const int64_t ors = out.stride(2);
      for (int64_t i = nv; i < d.N; ++i) std::memset(ob + i * ors, 0, sizeof(float) * static_cast<size_t>(dm.Dv));
      std::fill(L + nv, L + d.N, 0.f);
      const float* qb = in.q.ptr(b, h, 0);
      const float* vb = in.v.ptr(b, h, 0);
      const int64_t qrs = in.q.stride(2), vrs = in.v.stride(2);
      int32_t* bucket = own.bucket.data();  // (R, N)
      parallel_for((d.N + 1023) / 1024, [&](int64_t x, int th) {
        hash_head(t, bucket, x * 1024, std::min(d.N, (x + 1) * 1024), ws.threads[static_cast<size_t>(th)]);
      });
      for (int64_t r = 0; r < R && nv > 0; ++r) {
        int32_t* perm = st.perm.data() + (t * R + r) * st.len;
        int32_t* cbucket = in.causal ? st.cbucket.data() + (t * R + r) * (st.len / ch) : nullptr;
        const int64_t nch = partition(bucket + r * d.N, d.N, nb, ch, in.causal, perm, cbucket, own.sorted, own.offsets);
        const int64_t len = in.causal ? nch * ch : d.N;
        st.nch[static_cast<size_t>(t * R + r)] = static_cast<int32_t>(nch);
        parallel_for((nch + kSpan - 1) / kSpan, [&](int64_t x, int th) {
          ThreadScratch& sc = ws.threads[static_cast<size_t>(th)];
          carve_slots(sc, dm, false);
          float* s = sc.s.floats(static_cast<size_t>(kMaxChunk * 2 * kMaxChunk));  // (n, kw)
          float* o = sc.o.floats(static_cast<size_t>(kMaxChunk * dm.Dvp));         // (n, Dvp)
          const int64_t c0 = x * kSpan, c1 = std::min(nch, c0 + kSpan), p0 = prev_chunk(c0, nch, cbucket);
          if (p0 >= 0) stage_chunk(qb, qrs, vb, vrs, dm, perm, len, ch, p0, sc.slots[2], false, {});
          for (int64_t c = c0; c < c1; ++c) {
            const gather::Ahead ahead = ahead_of(perm, ch, c + 1, nch, len);
            Slot& cur = sc.slots[c % 2];
            stage_chunk(qb, qrs, vb, vrs, dm, perm, len, ch, c, cur, false, ahead);
            const int64_t pc = prev_chunk(c, nch, cbucket);
            const Slot* prev = pc < 0 ? nullptr : c == c0 ? &sc.slots[2] : &sc.slots[pc % 2];
            fwd_chunk(cur, prev, dm, mv, nv, in.causal, r, s, o, ob, ors, L, ahead);
          }
          simd::store_fence();
        });
      }
      for (int64_t i = 0; i < nv; ++i)
        if (L[i] == -kInf) L[i] = kInf;
    }
    return;
  }
  // Hashing is compute-bound while the chunk loop waits on memory at long N, so each thread
  // hashes its next head in slices between the chunks of the current one: heads go to threads
  // statically (t = thread, thread + team, ...) so the next head is known.
  parallel_team([&](int tid, int team) {
    ThreadScratch& sc = ws.threads[static_cast<size_t>(tid)];
    sc.bucket.resize(static_cast<size_t>(2 * R * d.N));
    sc.offsets.resize(static_cast<size_t>(nb + 1));
    carve_slots(sc, dm, false);
    float* s = sc.s.floats(static_cast<size_t>(kMaxChunk * 2 * kMaxChunk));  // (n, kw)
    float* o = sc.o.floats(static_cast<size_t>(kMaxChunk * dm.Dvp));         // (n, Dvp)
    if (tid < BH) hash_head(tid, sc.bucket.data(), 0, d.N, sc);
    for (int64_t t = tid, k = 0; t < BH; t += team, ++k) {
      int32_t* bucket = sc.bucket.data() + (k % 2) * R * d.N;        // (R, N) this head's
      int32_t* next_bucket = sc.bucket.data() + ((k + 1) % 2) * R * d.N;
      const int64_t next = t + team < BH ? t + team : -1;
      int64_t hashed = 0;  // rows of the next head hashed so far
      auto hash_slice = [&] {
        if (next < 0 || hashed >= d.N) return;
        const int64_t r1 = std::min(d.N, hashed + slice);
        hash_head(next, next_bucket, hashed, r1, sc);
        hashed = r1;
      };
      const int64_t b = t / d.H, h = t % d.H;
      const int64_t nv = valid_queries(in, d, b), mv = valid_keys(in, d, b);
      float* L = st.lse2.data() + t * d.N;  // running log2-sum-exp2 of the rounds (blend_round)
      float* ob = out.ptr(b, h, 0);
      const int64_t ors = out.stride(2);
      for (int64_t i = nv; i < d.N; ++i) std::memset(ob + i * ors, 0, sizeof(float) * static_cast<size_t>(dm.Dv));
      std::fill(L + nv, L + d.N, 0.f);
      const float* qb = in.q.ptr(b, h, 0);
      const float* vb = in.v.ptr(b, h, 0);
      const int64_t qrs = in.q.stride(2), vrs = in.v.stride(2);
      for (int64_t r = 0; r < R && nv > 0; ++r) {
        int32_t* perm = st.perm.data() + (t * R + r) * st.len;
        int32_t* cbucket = in.causal ? st.cbucket.data() + (t * R + r) * (st.len / ch) : nullptr;
        const int64_t nch = partition(bucket + r * d.N, d.N, nb, ch, in.causal, perm, cbucket, sc.sorted, sc.offsets);
        const int64_t len = in.causal ? nch * ch : d.N;
        st.nch[static_cast<size_t>(t * R + r)] = static_cast<int32_t>(nch);
        stage_chunk(qb, qrs, vb, vrs, dm, perm, len, ch, nch - 1, sc.slots[2], false, ahead_of(perm, ch, 0, nch, len));
        for (int64_t c = 0; c < nch; ++c) {
          const gather::Ahead ahead = ahead_of(perm, ch, c + 1, nch, len);
          request_far(perm, ch, c, nch, len, dm, qb, qrs, vb, vrs, r > 0 ? ob : nullptr, ors);
          Slot& cur = sc.slots[slot_of(c, nch)];
          if (c < nch - 1) stage_chunk(qb, qrs, vb, vrs, dm, perm, len, ch, c, cur, false, ahead);
          const int64_t pc = prev_chunk(c, nch, cbucket);
          const Slot* prev = pc < 0 ? nullptr : &sc.slots[slot_of(pc, nch)];
          fwd_chunk(cur, prev, dm, mv, nv, in.causal, r, s, o, ob, ors, L, ahead);
          hash_slice();
        }
      }
      // Nothing visible in any round (e.g. a padded own key): output 0, lse2 = +inf.
      for (int64_t i = 0; i < nv; ++i)
        if (L[i] == -kInf) L[i] = kInf;
      while (next >= 0 && hashed < d.N) hash_slice();
    }
    simd::store_fence();
  });
}

void attn_reformer_bwd(const AttentionInputs& in, const AttentionDims& d, const ReformerState& st,
                       ConstView out, ConstView dout, View dq, View dv, ReformerWorkspace& ws) {
  const Dims dm{d.N, d.Dk, d.Dv, round_up(d.Dk, mk::kLanes), round_up(d.Dv, mk::kLanes)};
  const int64_t R = st.rounds, ch = st.chunk;
  ws.ensure_threads();
  if (split_tasks(d.B * d.H)) {
    // Fewer heads than threads: each round's chunks in spans over the team (as in the forward).
    // A span flushes its own chunks; the key-role gradients it adds to the chunk before its
    // first one go to that chunk's borrowed slot, flushed once every span is done (the chain
    // adds them to the chunk's own slot before one flush: the same sums in another order).
    for (int64_t t = 0; t < d.B * d.H; ++t) {
      const int64_t b = t / d.H, h = t % d.H;
      const int64_t nv = valid_queries(in, d, b), mv = valid_keys(in, d, b);
      if (nv == 0 || d.N == 0) continue;
      const float* qb = in.q.ptr(b, h, 0);
      const float* vb = in.v.ptr(b, h, 0);
      const float* gb = dout.ptr(b, h, 0);
      const int64_t qrs = in.q.stride(2), vrs = in.v.stride(2), grs = dout.stride(2);
      float* dqb = dq.ptr(b, h, 0);
      float* dvb = dv.ptr(b, h, 0);
      const int64_t dqrs = dq.stride(2), dvrs = dv.stride(2);
      const float* lse2 = st.lse2.data() + t * d.N;
      float* di = ws.threads[0].o.floats(static_cast<size_t>(d.N));  // (N) D_i = dO_i · O_i
      parallel_for((nv + 1023) / 1024, [&](int64_t x) {
        for (int64_t i = x * 1024; i < std::min(nv, (x + 1) * 1024); ++i)
          di[i] = simd::dot(gb + i * grs, out.ptr(b, h, i), dm.Dv);
      });
      for (int64_t r = 0; r < R; ++r) {
        // Plain locals, not structured bindings: the span lambda captures them.
        const ReformerState::Round rd = st.round(t, r, d.N);
        const int32_t* perm = rd.perm;
        const int32_t* cbucket = rd.cbucket;
        const int64_t nch = rd.nch, len = rd.len;
        const int64_t spans = (nch + kSpan - 1) / kSpan;
        ws.borrowed.resize(std::max(ws.borrowed.size(), static_cast<size_t>(spans)));
        carve(ws.borrowed.data(), spans,
              ws.borrowed_mem.floats(static_cast<size_t>(std::max<int64_t>(1, spans) * slot_floats(dm, true))), dm, true);
        std::vector<char>& has = ws.threads[0].has_borrowed;
        has.assign(static_cast<size_t>(spans), 0);
        parallel_for(spans, [&](int64_t x, int th) {
          ThreadScratch& sc = ws.threads[static_cast<size_t>(th)];
          carve_slots(sc, dm, true);
          float* s = sc.s.floats(static_cast<size_t>(kMaxChunk * 2 * kMaxChunk));
          float* dp = sc.dp.floats(static_cast<size_t>(kMaxChunk * 2 * kMaxChunk));
          float* go = sc.go.floats(static_cast<size_t>(kMaxChunk * dm.Dvp));
          const int64_t c0 = x * kSpan, c1 = std::min(nch, c0 + kSpan), p0 = prev_chunk(c0, nch, cbucket);
          Slot* bp = nullptr;
          if (p0 >= 0) {
            bp = &ws.borrowed[static_cast<size_t>(x)];
            stage_chunk(qb, qrs, vb, vrs, dm, perm, len, ch, p0, *bp, true, {});
            has[static_cast<size_t>(x)] = 1;
          }
          for (int64_t c = c0; c < c1; ++c) {
            const gather::Ahead ahead = ahead_of(perm, ch, c + 1, nch, len);
            request_far(perm, ch, c, nch, len, dm, qb, qrs, vb, vrs, gb, grs);
            Slot& cur = sc.slots[c % 2];
            stage_chunk(qb, qrs, vb, vrs, dm, perm, len, ch, c, cur, true, ahead);
            const int64_t pc = prev_chunk(c, nch, cbucket);
            Slot* prev = pc < 0 ? nullptr : c == c0 ? bp : &sc.slots[pc % 2];
            bwd_chunk(cur, prev, dm, mv, nv, in.causal, lse2, di, vb, vrs, gb, grs, dqb, dqrs, dvb, dvrs, s, dp,
                      go, ahead);
            if (c > c0) flush(sc.slots[(c - 1) % 2], dm, dqb, dqrs, dvb, dvrs);
          }
          flush(sc.slots[(c1 - 1) % 2], dm, dqb, dqrs, dvb, dvrs);
        });
        parallel_for(spans, [&](int64_t x) {
          if (has[static_cast<size_t>(x)]) flush(ws.borrowed[static_cast<size_t>(x)], dm, dqb, dqrs, dvb, dvrs);
        });
      }
    }
    return;
  }
  parallel_for(d.B * d.H, [&](int64_t t, int thread) {
    const int64_t b = t / d.H, h = t % d.H;
    const int64_t nv = valid_queries(in, d, b), mv = valid_keys(in, d, b);
    if (nv == 0 || d.N == 0) return;
    ThreadScratch& sc = ws.threads[static_cast<size_t>(thread)];
    const float* qb = in.q.ptr(b, h, 0);
    const float* vb = in.v.ptr(b, h, 0);
    const float* gb = dout.ptr(b, h, 0);
    const int64_t qrs = in.q.stride(2), vrs = in.v.stride(2), grs = dout.stride(2);
    const float* lse2 = st.lse2.data() + t * d.N;
    carve_slots(sc, dm, true);
    float* di = sc.o.floats(static_cast<size_t>(d.N));  // (N) D_i = dO_i · O_i
    for (int64_t i = 0; i < nv; ++i) di[i] = simd::dot(gb + i * grs, out.ptr(b, h, i), dm.Dv);
    float* s = sc.s.floats(static_cast<size_t>(kMaxChunk * 2 * kMaxChunk));   // (n, kw) S, then P
    float* dp = sc.dp.floats(static_cast<size_t>(kMaxChunk * 2 * kMaxChunk)); // (n, kw) dP, then dS
    float* go = sc.go.floats(static_cast<size_t>(kMaxChunk * dm.Dvp));        // (n, Dvp) dO rows
    auto flush = [&](const Slot& sl) { clattn::flush(sl, dm, dq.ptr(b, h, 0), dq.stride(2), dv.ptr(b, h, 0), dv.stride(2)); };
    for (int64_t r = 0; r < R; ++r) {
      const auto [perm, cbucket, nch, len] = st.round(t, r, d.N);
      stage_chunk(qb, qrs, vb, vrs, dm, perm, len, ch, nch - 1, sc.slots[2], true, ahead_of(perm, ch, 0, nch, len));
      for (int64_t c = 0; c < nch; ++c) {
        const gather::Ahead ahead = ahead_of(perm, ch, c + 1, nch, len);
        request_far(perm, ch, c, nch, len, dm, qb, qrs, vb, vrs, gb, grs);
        Slot& cur = sc.slots[slot_of(c, nch)];
        if (c < nch - 1) stage_chunk(qb, qrs, vb, vrs, dm, perm, len, ch, c, cur, true, ahead);
        const int64_t pc = prev_chunk(c, nch, cbucket);
        Slot* prev = pc < 0 ? nullptr : &sc.slots[slot_of(pc, nch)];
        bwd_chunk(cur, prev, dm, mv, nv, in.causal, lse2, di, vb, vrs, gb, grs, dq.ptr(b, h, 0), dq.stride(2),
                  dv.ptr(b, h, 0), dv.stride(2), s, dp, go, ahead);
        if (c >= 1) flush(sc.slots[slot_of(c - 1, nch)]);  // chunk c − 1: current and previous done
      }
      flush(sc.slots[2]);  // the last chunk, the first one's previous
    }
  });
}

size_t reformer_workspace_bytes(const AttentionDims& d, const ReformerParams& p, Mode mode,
                                int threads) {
  const int64_t Dkp = round_up(d.Dk, mk::kLanes), Dvp = round_up(d.Dv, mk::kLanes);
  const int64_t R = p.rounds, N = d.N, BH = d.B * d.H, W = kMaxChunk;
  const int64_t nb = reformer_buckets(p, N);
  const int64_t f1 = factorise(nb).first, f2 = factorise(nb).second;  // lambdas capture them
  const int64_t nrot = f1 / 2 + (f2 > 1 ? f2 / 2 : 0), ncol = round_up(R * nrot, mk::kLanes);
  constexpr int64_t f = sizeof(float), i32 = sizeof(int32_t);
  // Per thread, in bytes: buckets of two heads, the counting sort's offsets (both resized to one
  // size per call); the tiles: proj, the three slots (carve_slots), s, o.
  int64_t per = i32 * (2 * R * N + nb + 1 + N);  // buckets, offsets, the causal sort
  int64_t slot = Dkp * W + W * Dvp, o = W * Dvp, go = 0, dp = 0;
  if (mode == Mode::training) {  // backward: wider slots, o holds D_i (N), dO rows, dP
    slot += 3 * W * Dkp + Dvp * W + W * Dvp;
    o = std::max(o, N);
    go = W * Dvp;
    dp = W * 2 * W;
  }
  per += f * (64 * ncol + 3 * slot + W * 2 * W + o + go + dp);
  const int64_t len = reformer_perm_len(N, nb, p.chunk, true);  // the causal bound covers both
  const int64_t state = i32 * BH * R * (len + len / p.chunk + 1) + f * BH * N;  // perm, cbucket, nch, lse2
  // A split head's backward: one borrowed slot per span of chunks, and their flags.
  const int64_t spans = (len / p.chunk + kSpan - 1) / kSpan + 1;
  const int64_t borrowed = mode == Mode::training ? spans * (f * slot + static_cast<int64_t>(sizeof(Slot)) + 1) : 0;
  return static_cast<size_t>(threads * (per + static_cast<int64_t>(sizeof(ThreadScratch))) + state + borrowed);
}

ReformerWorkspace& reformer_workspace(Scratch& scratch) { return scratch.get<ReformerWorkspace>(); }

}  // namespace clattn
