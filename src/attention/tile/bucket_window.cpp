// Causal bucket-window attention (definition in bucket_window.h).
#include "attention/tile/bucket_window.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "attention/tile/gather.h"
#include "attention/tile/grad_util.h"
#include "attention/tile/tile_ops.h"
#include "attention/validate.h"
#include "clattn/threads.h"
#include "clattn/scratch.h"
#include "cluster/cluster.h"
#include "core/microkernel.h"
#include "core/simd.h"

namespace clattn {

using mk::round_up;
using tile::kInf;
using tile::kLog2e;

namespace {

constexpr int64_t kRows = 64;  // queries per block

struct ThreadScratch {
  std::vector<int32_t> qorder, qoff, korder, koff, cnt;
  std::vector<float> own_s, own_w;  // (nv) own-key logit (log2 units), its weight / Σ P
  Workspace qs, qr, kt, kr, vr, vt, s, o, go, dp, dqb, dkb, dvb;
  size_t bytes() const {
    return held_bytes(qorder, qoff, korder, koff, cnt, own_s, own_w, qs, qr, kt, kr, vr, vt, s, o, go, dp,
                      dqb, dkb, dvb);
  }
};

}  // namespace

struct BucketWindowWorkspace {
  Workspace part;  // (B, H, M, Dkp + Dvp) backward with GQA: per-query-head partial dK, dV
  std::vector<ThreadScratch> threads;
  size_t bytes() const {
    size_t n = held_bytes(part);
    for (const ThreadScratch& t : threads) n += t.bytes();
    return n;
  }
};

BucketWindowWorkspace& bucket_window_workspace(Scratch& scratch) { return scratch.get<BucketWindowWorkspace>(); }

namespace {

// One block: queries qi[0, nq) (rows) of one bucket, their keys kj[0, nk) (positions, ascending:
// the bucket's list from index k0); row r sees columns [max(0, cnt[r] − window − k0), cnt[r] − k0).
struct Block {
  int64_t bucket = 0, nq = 0, nk = 0, kw = 0, k0 = 0;
  const int32_t* qi = nullptr;
  const int32_t* kj = nullptr;
  const int32_t* cnt = nullptr;
  int64_t col_begin(int64_t r, int64_t window) const { return std::max<int64_t>(0, cnt[r] - window - k0); }
  int64_t col_end(int64_t r) const { return cnt[r] - k0; }
};

int64_t max_keys(int64_t window) { return round_up(window + kRows, mk::kLanes); }

// Calls fn(block) for every block of round `r` of one head: queries and keys sorted by (bucket,
// position) (counting sorts are stable and rows are in position order), blocks of up to kRows
// queries of one bucket whose keys span at most window + kRows.
template <class Fn>
void for_blocks(const int32_t* qb, const int32_t* kb, int64_t nv, int64_t mv, int64_t off, int64_t window,
                ThreadScratch& sc, Fn fn) {
  int64_t nb = 1;
  for (int64_t i = 0; i < nv; ++i) nb = std::max<int64_t>(nb, qb[i] + 1);
  for (int64_t j = 0; j < mv; ++j) nb = std::max<int64_t>(nb, kb[j] + 1);
  sc.qorder.resize(static_cast<size_t>(nv));
  sc.korder.resize(static_cast<size_t>(mv));
  sc.qoff.resize(static_cast<size_t>(nb + 1));
  sc.koff.resize(static_cast<size_t>(nb + 1));
  sc.cnt.resize(static_cast<size_t>(nv));
  cluster::counting_sort(qb, nv, nb, sc.qorder.data(), sc.qoff.data());
  cluster::counting_sort(kb, mv, nb, sc.korder.data(), sc.koff.data());
  for (int64_t bk = 0; bk < nb; ++bk) {
    const int64_t q0 = sc.qoff[static_cast<size_t>(bk)], nq = sc.qoff[static_cast<size_t>(bk + 1)] - q0;
    if (nq == 0) continue;
    const int32_t* Q = sc.qorder.data() + q0;
    const int32_t* K = sc.korder.data() + sc.koff[static_cast<size_t>(bk)];
    const int64_t nk = sc.koff[static_cast<size_t>(bk + 1)] - sc.koff[static_cast<size_t>(bk)];
    int32_t* cnt = sc.cnt.data() + q0;
    for (int64_t x = 0, y = 0; x < nq; ++x) {  // keys of the bucket at positions <= p
      while (y < nk && K[y] <= Q[x] + off) ++y;
      cnt[x] = static_cast<int32_t>(y);
    }
    for (int64_t x0 = 0; x0 < nq;) {
      const int64_t lo = std::max<int64_t>(0, cnt[x0] - window);
      int64_t x1 = x0 + 1;
      while (x1 < nq && x1 - x0 < kRows && cnt[x1] - lo <= window + kRows) ++x1;
      Block blk;
      blk.bucket = bk;
      blk.nq = x1 - x0;
      blk.k0 = lo;
      blk.nk = cnt[x1 - 1] - lo;
      blk.kw = round_up(std::max<int64_t>(blk.nk, 1), mk::kLanes);
      blk.qi = Q + x0;
      blk.kj = K + lo;
      blk.cnt = cnt + x0;
      fn(blk);
      x0 = x1;
    }
  }
}

// S (nq, kw) = qs · kt (log2 units) with every column outside each row's window at -inf; extra[r]
// is row r's own key as an extra logit (-inf when its window holds it or it is not a valid key).
void block_scores(const Block& blk, int64_t window, const float* qs, int64_t Dkp, int64_t D, const float* kt,
                  const int32_t* kbr, const float* own_s, int64_t off, int64_t mv, float* s, float* extra) {
  std::memset(s, 0, sizeof(float) * static_cast<size_t>(blk.nq * blk.kw));
  mk::gemm_ab(blk.nq, blk.kw, D, qs, Dkp, 1, kt, blk.kw, s, blk.kw, nullptr);
  for (int64_t r = 0; r < blk.nq; ++r) {
    float* row = s + r * blk.kw;
    const int64_t a = blk.col_begin(r, window), e = blk.col_end(r);
    std::fill(row, row + a, -kInf);
    std::fill(row + e, row + blk.kw, -kInf);
    const int64_t pos = blk.qi[r] + off;
    const bool own_in = pos >= 0 && pos < mv && kbr[pos] == blk.bucket;  // then column e − 1
    extra[r] = own_in ? -kInf : own_s[blk.qi[r]];
  }
}

// Own-key logits (log2 units) of one head, -inf where p_i is not a valid key.
void own_logits(const AttentionInputs& in, const AttentionDims& d, int64_t b, int64_t h, int64_t nv, int64_t mv,
                float c, ThreadScratch& sc) {
  const int64_t off = d.M - d.N, hk = h / d.group();
  sc.own_s.resize(static_cast<size_t>(nv));
  for (int64_t i = 0; i < nv; ++i) {
    const int64_t pos = i + off;
    sc.own_s[static_cast<size_t>(i)] =
        pos >= 0 && pos < mv ? c * simd::dot(in.q.ptr(b, h, i), in.k.ptr(b, hk, pos), d.Dk) : -kInf;
  }
}

}  // namespace

void attn_bucket_window_fwd(const AttentionInputs& in, const AttentionDims& d, float scale, BucketWindow& bw,
                            View out, BucketWindowWorkspace& ws) {
  const int64_t D = d.Dk, Dv = d.Dv, Dkp = round_up(D, mk::kLanes), Dvp = round_up(Dv, mk::kLanes);
  const int64_t R = bw.rounds, W = bw.window, KW = max_keys(W);
  const float c = scale * kLog2e;
  bw.lse2.resize(Shape{d.B, d.H, d.N});
  if (ws.threads.size() < static_cast<size_t>(max_threads())) ws.threads.resize(static_cast<size_t>(max_threads()));
  parallel_for(d.B * d.H, [&](int64_t t, int thread) {
    const int64_t b = t / d.H, h = t % d.H, hk = h / d.group(), off = d.M - d.N;
    const int64_t nv = valid_queries(in, d, b), mv = valid_keys(in, d, b);
    ThreadScratch& sc = ws.threads[static_cast<size_t>(thread)];
    float* L = bw.lse2.data() + t * d.N;
    for (int64_t i = nv; i < d.N; ++i) std::memset(out.ptr(b, h, i), 0, sizeof(float) * static_cast<size_t>(Dv));
    std::fill(L + nv, L + d.N, 0.f);
    if (nv == 0) return;
    own_logits(in, d, b, h, nv, mv, c, sc);
    sc.own_w.assign(static_cast<size_t>(nv), 0.f);
    const float* qbase = in.q.ptr(b, h, 0);
    const float* kbase = in.k.ptr(b, hk, 0);
    const float* vbase = in.v.ptr(b, hk, 0);
    float* qs = sc.qs.floats(static_cast<size_t>(kRows * Dkp));  // (nq, Dkp) c·Q
    float* kt = sc.kt.floats(static_cast<size_t>(Dkp * KW));     // (Dk, kw) keys transposed
    float* vr = sc.vr.floats(static_cast<size_t>(KW * Dvp));     // (nk, Dvp) values
    float* s = sc.s.floats(static_cast<size_t>(kRows * KW));     // (nq, kw) scores, then P
    float* o = sc.o.floats(static_cast<size_t>(kRows * Dvp));    // (nq, Dvp) this round's output
    for (int64_t r = 0; r < R; ++r) {
      const int32_t* qbr = bw.qb.data() + (t * R + r) * d.N;
      const int32_t* kbr = bw.kb.data() + (t * R + r) * d.M;
      for_blocks(qbr, kbr, nv, mv, off, W, sc, [&](const Block& blk) {
        gather::rows(qbase, in.q.stride(2), blk.qi, blk.nq, D, qs, Dkp, blk.nq, c);
        gather::transposed(kbase, in.k.stride(2), blk.kj, blk.nk, D, kt, blk.kw);
        gather::rows(vbase, in.v.stride(2), blk.kj, blk.nk, Dv, vr, Dvp, blk.nk);
        float extra[kRows], lse_r[kRows], po[kRows];
        block_scores(blk, W, qs, Dkp, D, kt, kbr, sc.own_s.data(), off, mv, s, extra);
        for (int64_t q = 0; q < blk.nq; ++q) lse_r[q] = tile::softmax_row_extra(s + q * blk.kw, blk.kw, extra[q], po[q]);
        std::memset(o, 0, sizeof(float) * static_cast<size_t>(blk.nq * Dvp));
        mk::gemm_ab(blk.nq, Dvp, blk.nk, s, blk.kw, 1, vr, Dvp, o, Dvp, nullptr);
        for (int64_t q = 0; q < blk.nq; ++q) {
          const int64_t i = blk.qi[q];
          tile::blend_round(out.ptr(b, h, i), o + q * Dvp, Dv, L[i], lse_r[q], r == 0, sc.own_w.data() + i, po[q]);
        }
      });
    }
    simd::store_fence();  // the first round streamed its rows: fence before reading them back
    for (int64_t i = 0; i < nv; ++i) {
      if (L[i] == -kInf) L[i] = kInf;  // no key in any round: output 0, backward adds 0
      const float w = sc.own_w[static_cast<size_t>(i)];
      if (w > 0.f) simd::axpy_row(out.ptr(b, h, i), vbase + (i + off) * in.v.stride(2), Dv, w);
    }
  });
}

void attn_bucket_window_bwd(const AttentionInputs& in, const AttentionDims& d, float scale, const BucketWindow& bw,
                            ConstView out, ConstView dout, View dq, View dk, View dv, BucketWindowWorkspace& ws) {
  const int64_t D = d.Dk, Dv = d.Dv, Dkp = round_up(D, mk::kLanes), Dvp = round_up(Dv, mk::kLanes);
  const int64_t R = bw.rounds, W = bw.window, KW = max_keys(W), G = d.group();
  const float c = scale * kLog2e;
  if (ws.threads.size() < static_cast<size_t>(max_threads())) ws.threads.resize(static_cast<size_t>(max_threads()));
  float* part = G > 1 ? ws.part.floats(static_cast<size_t>(d.B * d.H * d.M * (Dkp + Dvp))) : nullptr;
  parallel_for(d.B * d.H, [&](int64_t t, int thread) {
    const int64_t b = t / d.H, h = t % d.H, hk = h / G, off = d.M - d.N;
    const int64_t nv = valid_queries(in, d, b), mv = valid_keys(in, d, b);
    ThreadScratch& sc = ws.threads[static_cast<size_t>(thread)];
    float* pk = part ? part + t * d.M * (Dkp + Dvp) : nullptr;  // (M, Dkp + Dvp)
    if (pk) std::memset(pk, 0, sizeof(float) * static_cast<size_t>(d.M * (Dkp + Dvp)));
    auto gk = [&](int64_t j) { return pk ? pk + j * (Dkp + Dvp) : dk.ptr(b, hk, j); };
    auto gv = [&](int64_t j) { return pk ? pk + j * (Dkp + Dvp) + Dkp : dv.ptr(b, hk, j); };
    if (nv == 0) return;
    const float* L = bw.lse2.data() + t * d.N;
    const float* qbase = in.q.ptr(b, h, 0);
    const float* kbase = in.k.ptr(b, hk, 0);
    const float* vbase = in.v.ptr(b, hk, 0);
    const int64_t qrs = in.q.stride(2), krs = in.k.stride(2), vrs = in.v.stride(2);
    own_logits(in, d, b, h, nv, mv, c, sc);
    sc.own_w.assign(static_cast<size_t>(nv), 0.f);  // Σ over rounds of the own key's P
    float* qs = sc.qs.floats(static_cast<size_t>(kRows * Dkp));   // (nq, Dkp) c·Q
    float* qr = sc.qr.floats(static_cast<size_t>(kRows * Dkp));   // (nq, Dkp) Q
    float* kt = sc.kt.floats(static_cast<size_t>(Dkp * KW));      // (Dk, kw) K transposed
    float* kr = sc.kr.floats(static_cast<size_t>(KW * Dkp));      // (kw, Dkp) K rows
    float* vt = sc.vt.floats(static_cast<size_t>(Dvp * KW));      // (Dv, kw) V transposed
    float* s = sc.s.floats(static_cast<size_t>(kRows * KW));      // (nq, kw) P
    float* dp = sc.dp.floats(static_cast<size_t>(kRows * KW));    // (nq, kw) dP, then dS
    float* go = sc.go.floats(static_cast<size_t>(kRows * Dvp));   // (nq, Dvp) dO rows
    float* dqb = sc.dqb.floats(static_cast<size_t>(kRows * Dkp)); // (nq, Dkp) dS·K
    float* dkb = sc.dkb.floats(static_cast<size_t>(KW * Dkp));    // (kw, Dkp) dSᵀ·Q
    float* dvb = sc.dvb.floats(static_cast<size_t>(KW * Dvp));    // (kw, Dvp) Pᵀ·dO
    float di[kRows], extra[kRows];
    for (int64_t r = 0; r < R; ++r) {
      const int32_t* qbr = bw.qb.data() + (t * R + r) * d.N;
      const int32_t* kbr = bw.kb.data() + (t * R + r) * d.M;
      for_blocks(qbr, kbr, nv, mv, off, W, sc, [&](const Block& blk) {
        gather::rows(qbase, qrs, blk.qi, blk.nq, D, qs, Dkp, blk.nq, c);
        gather::rows(qbase, qrs, blk.qi, blk.nq, D, qr, Dkp, blk.nq);
        gather::rows(dout.ptr(b, h, 0), dout.stride(2), blk.qi, blk.nq, Dv, go, Dvp, blk.nq);
        gather::transposed(kbase, krs, blk.kj, blk.nk, D, kt, blk.kw);
        gather::rows(kbase, krs, blk.kj, blk.nk, D, kr, Dkp, blk.kw);
        gather::transposed(vbase, vrs, blk.kj, blk.nk, Dv, vt, blk.kw);
        // P = 2^(S − L) against every round's log-sum-exp (the forward's softmax over all rounds)
        block_scores(blk, W, qs, Dkp, D, kt, kbr, sc.own_s.data(), off, mv, s, extra);
        for (int64_t q = 0; q < blk.nq; ++q) {
          const int64_t i = blk.qi[q];
          tile::exp2_row(s + q * blk.kw, blk.kw, L[i]);
          if (extra[q] != -kInf) sc.own_w[static_cast<size_t>(i)] += std::exp2(extra[q] - L[i]);
          di[q] = simd::dot(dout.ptr(b, h, i), out.ptr(b, h, i), Dv);
        }
        // dP = dO·Vᵀ ; dS = P ∘ (dP − D_i) · s
        std::memset(dp, 0, sizeof(float) * static_cast<size_t>(blk.nq * blk.kw));
        mk::gemm_ab(blk.nq, blk.kw, Dv, go, Dvp, 1, vt, blk.kw, dp, blk.kw, nullptr);
        for (int64_t q = 0; q < blk.nq; ++q) {
          const simd::vf dv_ = simd::splat(di[q]), sv = simd::splat(scale);
          float* dr = dp + q * blk.kw;
          const float* pr = s + q * blk.kw;
          for (int64_t x = 0; x < blk.kw; x += simd::kLanes)
            simd::store(dr + x, simd::load(pr + x) * (simd::load(dr + x) - dv_) * sv);
        }
        // dQ += dS·K ; dK += dSᵀ·Q ; dV += Pᵀ·dO
        std::memset(dqb, 0, sizeof(float) * static_cast<size_t>(blk.nq * Dkp));
        mk::gemm_ab(blk.nq, Dkp, blk.nk, dp, blk.kw, 1, kr, Dkp, dqb, Dkp, nullptr);
        std::memset(dkb, 0, sizeof(float) * static_cast<size_t>(blk.nk * Dkp));
        mk::gemm_ab(blk.nk, Dkp, blk.nq, dp, 1, blk.kw, qr, Dkp, dkb, Dkp, nullptr);
        std::memset(dvb, 0, sizeof(float) * static_cast<size_t>(blk.nk * Dvp));
        mk::gemm_ab(blk.nk, Dvp, blk.nq, s, 1, blk.kw, go, Dvp, dvb, Dvp, nullptr);
        for (int64_t q = 0; q < blk.nq; ++q) simd::axpy_row(dq.ptr(b, h, blk.qi[q]), dqb + q * Dkp, D);
        for (int64_t x = 0; x < blk.nk; ++x) {
          simd::axpy_row(gk(blk.kj[x]), dkb + x * Dkp, D);
          simd::axpy_row(gv(blk.kj[x]), dvb + x * Dvp, Dv);
        }
      });
    }
    // The own keys met as extra keys, by their summed probability.
    for (int64_t i = 0; i < nv; ++i) {
      const float p = sc.own_w[static_cast<size_t>(i)];
      if (!(p > 0.f)) continue;
      const int64_t pos = i + off;
      const float* g = dout.ptr(b, h, i);
      tile::own_key_backward(p, simd::dot(g, vbase + pos * vrs, Dv), simd::dot(g, out.ptr(b, h, i), Dv), scale,
                             qbase + i * qrs, kbase + pos * krs, g, dq.ptr(b, h, i), gk(pos), gv(pos), D, Dv);
    }
  });
  if (part) reduce_group_partials(in, d, part, d.M, Dkp + Dvp, Dkp, dk, dv);
}

void attn_bucket_window_ref(const RefProblem& pr, const BucketWindow& bw, std::vector<double>& out) {
  const AttentionDims& d = pr.d;
  const int64_t off = d.M - d.N, R = bw.rounds;
  out.assign(static_cast<size_t>(d.B * d.H * d.N * d.Dv), 0.0);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t t = b * d.H + h, nv = pr.nq(b), mv = pr.nk(b);
      for (int64_t i = 0; i < nv; ++i) {
        const int64_t pos = i + off;
        std::vector<int64_t> keys;
        for (int64_t r = 0; r < R; ++r) {
          const int32_t* qbr = bw.qb.data() + (t * R + r) * d.N;
          const int32_t* kbr = bw.kb.data() + (t * R + r) * d.M;
          std::vector<int64_t> mine;  // the bucket's keys at positions <= pos
          for (int64_t j = 0; j <= std::min(pos, mv - 1); ++j)
            if (kbr[j] == qbr[i]) mine.push_back(j);
          const size_t from = mine.size() > static_cast<size_t>(bw.window) ? mine.size() - static_cast<size_t>(bw.window) : 0;
          bool own = false;
          for (size_t x = from; x < mine.size(); ++x) {
            keys.push_back(mine[x]);
            own |= mine[x] == pos;
          }
          if (!own && pos >= 0 && pos < mv) keys.push_back(pos);
        }
        std::vector<double> s;
        for (int64_t j : keys) s.push_back(pr.logit(b, h, i, j));
        pr.softmax_add(b, h, keys, std::move(s), 1.0, out.data() + (t * d.N + i) * d.Dv);
      }
    }
}

size_t bucket_window_bytes(const AttentionDims& d, int64_t rounds, int64_t window, Mode mode, int threads) {
  const int64_t Dkp = round_up(d.Dk, mk::kLanes), Dvp = round_up(d.Dv, mk::kLanes), KW = max_keys(window);
  constexpr int64_t f = sizeof(float), i32 = sizeof(int32_t);
  int64_t per = i32 * (2 * (d.N + d.M) + 2 * (d.N + d.M + 2) + d.N) + f * 2 * d.N +
                f * (kRows * Dkp + Dkp * KW + KW * Dvp + kRows * KW + kRows * Dvp);
  int64_t shared = i32 * d.B * d.H * rounds * (d.N + d.M) + f * d.B * d.H * d.N;  // buckets, lse2
  if (mode == Mode::training) {
    per += f * (kRows * Dkp + KW * Dkp + Dvp * KW + kRows * KW + kRows * Dvp + kRows * Dkp + KW * Dkp + KW * Dvp);
    if (d.group() > 1) shared += f * d.B * d.H * d.M * (Dkp + Dvp);
  }
  return static_cast<size_t>(threads * (per + static_cast<int64_t>(sizeof(ThreadScratch))) + shared);
}

}  // namespace clattn
