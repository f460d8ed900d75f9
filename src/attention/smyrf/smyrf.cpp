// SMYRF attention. Per round, queries and keys are projected on one Gaussian direction after the
// asymmetric transform F(q) = [q, 0, sqrt(MQ² + MK² − |q|²)], G(k) = [k, sqrt(MQ² + MK² − |k|²), 0]
// (F(q)·G(k) = q·k, and |F(q)| = |G(k)|, so close projections mean large inner products); both
// are sorted independently and cut into consecutive clusters; cluster c of queries attends
// cluster c of keys with the real logits s·q·k. Rounds combine by log-sum-exp, i.e. one softmax
// over the keys of all rounds (a key met in two rounds counts twice, as in the reference).
//
// Choices where the reference is silent or stricter:
// - Sizes need not divide: nc = max(ceil(N_valid/q_cluster), ceil(M_valid/k_cluster)) clusters,
//   each side cut into nc balanced consecutive clusters (sizes differ by at most one, never above
//   q_cluster / k_cluster). A key cluster is never empty while a key exists (with fewer keys than
//   clusters, neighbouring clusters share one), so every query sees keys in every round. (Cutting
//   by fixed sizes left query clusters without keys: rows of exact zeros.)
// - Padded keys and queries are left out of the sort (equivalent to sorting them last, masked).
// - Causal (not in the reference, which has no causal form): sorting the whole sequence makes
//   every cluster depend on every position, and so would the transform's maximum norms. Under a
//   causal mask the clusters become buckets of one row each, and the attention is the causal
//   bucket-window attention of tile/bucket_window.h with window = k_cluster: query i attends the
//   k_cluster most recent keys j <= p_i of its bucket, and always its own key. A row's bucket in
//   round r uses the transform with the maximum norms up to its own position,
//     R(p)² = MQ(p)² + MK(p)², MQ(p) = max |q_i'| over queries at positions <= p, MK(p) likewise,
//     F(q_i) = [q_i, 0, sqrt(R(p_i)² − |q_i|²)], G(k_j) = [k_j, sqrt(R(j)² − |k_j|²), 0],
//   projected on the round's direction a_r and normalised, h = a_r·x / R. SMYRF pairs the two
//   sides by rank (its sorted queries and keys are cut into clusters separately: the extra
//   coordinates shift every query's projection by about a_(D+1)·t and every key's by a_D·t), so the
//   causal bucket is a rank too, among the row's own side at earlier positions: with u the share
//   of earlier queries (keys) whose h is below this one's (ties: earlier ones count as below),
//   u = (rank + 1/2) / (rows so far), bucket = min(nb − 1, floor(u·nb)), nb = ceil(N_valid /
//   q_cluster). So a bucket holds about
//   q_cluster queries, as a SMYRF cluster does, and every choice for row i reads rows <= p_i.
// Work is parallel over (batch, head). One pass over q and k gives every round's projections;
// each (round, cluster) gathers its rows (gather.h: the next cluster's rows requested while
// copying, the one four ahead into L2 — at long N they come from DRAM in random order) and is
// three small products. Rounds blend online into the output (tile::blend_round), the first
// streamed. Memory O((N + M)·rounds) for the partition.
#include "attention/validate.h"
#include "attention/smyrf/smyrf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "attention/tile/gather.h"
#include "attention/tile/tile_ops.h"
#include "attention/tile/grad_util.h"
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
using tile::kInf;
using tile::kLog2e;

namespace {

// Per-thread scratch; sized on first use, reused by every later call on the same Scratch.
struct ThreadScratch {
  std::vector<float> qproj, kproj;  // (R, nv), (R, mv) projections of every round
  std::vector<float> qsq, ksq;      // (nv), (mv) squared norms
  std::vector<double> rowmax;       // max squared norm per block of rows
  cluster::RadixScratch radix;
  Workspace qs, kr, kt, vr, vt, s, o, go, dp, dqc, dkc, dvc, misc;
  size_t bytes() const {
    return held_bytes(qproj, kproj, qsq, ksq, rowmax, radix.keys, radix.keys2, radix.count,
                      radix.idx2, radix.idx3, qs, kr, kt, vr, vt, s, o, go, dp, dqc, dkc, dvc,
                      misc);
  }
};

}  // namespace

struct SmyrfWorkspace {
  Workspace part;  // (B, H, M, Dkp + Dvp) backward with GQA: per-query-head partial dK, dV
  std::vector<ThreadScratch> threads;

  void ensure_threads() {
    if (threads.size() < static_cast<size_t>(max_threads()))
      threads.resize(static_cast<size_t>(max_threads()));
  }
  size_t bytes() const {
    size_t n = held_bytes(part, threads);
    for (const ThreadScratch& t : threads) n += t.bytes();
    return n;
  }
};

namespace {

// One Gaussian direction of the transformed space (D + 2) per round, shared by all heads: (R, D + 2).
std::vector<float> directions(const SmyrfParams& p, uint64_t step, int64_t D) {
  const Rng rng(p.seed);
  std::vector<float> dirs(static_cast<size_t>(p.hashes * (D + 2)));
  for (size_t i = 0; i < dirs.size(); ++i) dirs[i] = rng.normal(step, i);
  return dirs;
}

int64_t num_clusters(const SmyrfState& st, int64_t nv, int64_t mv) {
  return std::max((nv + st.qc - 1) / st.qc, (mv + st.kc - 1) / st.kc);
}

// The rows of one (batch, head): base pointers and row strides of q, k, v.
struct HeadRows {
  const float *q, *k, *v;
  int64_t qrs, krs, vrs;
  HeadRows(const AttentionInputs& in, int64_t b, int64_t h, int64_t hk)
      : q(in.q.ptr(b, h, 0)), k(in.k.ptr(b, hk, 0)), v(in.v.ptr(b, hk, 0)),
        qrs(in.q.stride(2)), krs(in.k.stride(2)), vrs(in.v.stride(2)) {}
};

// One (round, cluster) of one head: query positions qi[0, nq), key positions kj[0, nk), score
// width kw = nk rounded up to 16.
struct Block {
  int64_t nq = 0, nk = 0, kw = 0;
  const int32_t* qi = nullptr;
  const int32_t* kj = nullptr;
};

Block make_block(const SmyrfState& st, const int32_t* qp, const int32_t* kp, int64_t nv,
                 int64_t mv, int64_t cl) {
  Block blk;
  const int64_t nc = num_clusters(st, nv, mv);
  const auto [q0, q1] = smyrf_cluster_range(nv, nc, cl, false);
  const auto [k0, k1] = smyrf_cluster_range(mv, nc, cl, true);
  blk.qi = qp + q0;
  blk.nq = q1 - q0;
  blk.kj = kp + k0;
  blk.nk = k1 - k0;
  blk.kw = round_up(std::max<int64_t>(blk.nk, 1), mk::kLanes);
  return blk;
}

// S (nq, kw) = qs · kt in log2 units, key columns past nk masked. (A causal mask never reaches the
// clusters: it takes the bucket-window path.)
void block_scores(const AttentionDims& d, const float* qs, int64_t Dkp, const float* kt, const Block& blk, float* s) {
  std::memset(s, 0, sizeof(float) * static_cast<size_t>(blk.nq * blk.kw));
  mk::gemm_ab(blk.nq, blk.kw, d.Dk, qs, Dkp, 1, kt, blk.kw, s, blk.kw, nullptr);
  for (int64_t r = 0; r < blk.nq; ++r) tile::mask_tail(s + r * blk.kw, blk.kw, blk.nk);
}

// Requests into L2 the rows of cluster cl + gather::kFarBlocks: its keys and values, its queries,
// and `x` rows by query position (the output read back by later rounds, or dO; null for none).
void request_far(const SmyrfState& st, const int32_t* qp, const int32_t* kp, int64_t nv, int64_t mv,
                 int64_t cl, int64_t nc, const HeadRows& hr, int64_t D, int64_t Dv, const float* x,
                 int64_t xrs) {
  if (cl + gather::kFarBlocks >= nc) return;
  const Block far = make_block(st, qp, kp, nv, mv, cl + gather::kFarBlocks);
  gather::prefetch_l2(hr.q, hr.qrs, far.qi, far.nq, D);
  if (x) gather::prefetch_l2(x, xrs, far.qi, far.nq, Dv);
  gather::prefetch_l2(hr.k, hr.krs, far.kj, far.nk, D);
  gather::prefetch_l2(hr.v, hr.vrs, far.kj, far.nk, Dv);
}

// proj (R, n) row i = a_r[0, D)·x_i (the transform's last coordinates are added by
// finish_projections once the maximum norm is known); sq (n) = |x_i|². One pass over the rows
// serves every round. Returns max |x_i|². Rows [i0, i1) only (any split gives the same values).
double project_rows(const float* base, int64_t rs, int64_t n, int64_t D, const float* dirs,
                    int64_t R, float* proj, float* sq, int64_t i0, int64_t i1) {
  double mx = 0;
  for (int64_t i = i0; i < i1; ++i) {
    const float* row = base + i * rs;
    sq[i] = simd::dot(row, row, D);
    mx = std::max(mx, static_cast<double>(sq[i]));
    for (int64_t r = 0; r < R; ++r) proj[r * n + i] = simd::dot(dirs + r * (D + 2), row, D);
  }
  return mx;
}

// Adds a_r[extra]·sqrt(MQ² + MK² − |x_i|²), the coordinate that makes |F(q)| = |G(k)|.
void finish_projections(int64_t n, int64_t D, const float* dirs, int64_t R, int64_t extra,
                        double total, float* proj, const float* sq, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    const float t = static_cast<float>(std::sqrt(std::max(0.0, total - static_cast<double>(sq[i]))));
    for (int64_t r = 0; r < R; ++r) proj[r * n + i] += dirs[r * (D + 2) + extra] * t;
  }
}

}  // namespace

void attn_smyrf_fwd(const AttentionInputs& in, const AttentionDims& d, const SmyrfParams& p,
                    uint64_t step, View out, SmyrfState& st, SmyrfWorkspace& ws) {
  const int64_t D = d.Dk, Dv = d.Dv, Dkp = round_up(D, mk::kLanes), Dvp = round_up(Dv, mk::kLanes);
  const int64_t R = p.hashes;
  const float scale = softmax_scale(p.scale, D);
  const float c = scale * kLog2e;
  st.rounds = R;
  st.qc = p.q_cluster;
  st.kc = p.k_cluster;
  st.qperm.resize(static_cast<size_t>(d.B * d.H * R * d.N));
  st.kperm.resize(static_cast<size_t>(d.B * d.H * R * d.M));
  st.lse2.resize(Shape{d.B, d.H, d.N});
  const std::vector<float> dirs = directions(p, step, D);
  ws.ensure_threads();
  // B·H below the thread count: heads one after another, each round's clusters over the team.
  const bool split = split_tasks(d.B * d.H);

  auto head = [&](int64_t t, int thread) {
    const int64_t b = t / d.H, h = t % d.H;
    const int64_t nv = valid_queries(in, d, b), mv = valid_keys(in, d, b);
    const HeadRows hr(in, b, h, h / d.group());
    ThreadScratch& sc = ws.threads[static_cast<size_t>(thread)];
    float* L = st.lse2.data() + t * d.N;  // running log2-sum-exp2 of the rounds (blend_round)
    float* ob = out.ptr(b, h, 0);
    const int64_t ors = out.stride(2);
    for (int64_t i = nv; i < d.N; ++i) std::memset(ob + i * ors, 0, sizeof(float) * static_cast<size_t>(Dv));
    std::fill(L + nv, L + d.N, 0.f);
    if (nv == 0) return;
    sc.qproj.resize(static_cast<size_t>(R * nv));
    sc.kproj.resize(static_cast<size_t>(R * mv));
    sc.qsq.resize(static_cast<size_t>(nv));
    sc.ksq.resize(static_cast<size_t>(mv));
    // Row blocks over the team when split (max and per-row values: the same whatever the split).
    constexpr int64_t kRowsPer = 4096;
    auto rows = [&](int64_t n, auto&& fn) {
      if (!split) return fn(int64_t{0}, n);
      const int64_t nb = (n + kRowsPer - 1) / kRowsPer;
      parallel_for(nb, [&](int64_t x) { fn(x * kRowsPer, std::min(n, (x + 1) * kRowsPer)); });
    };
    std::vector<double>& mx = sc.rowmax;  // per row block: max |x|²
    mx.assign(static_cast<size_t>((nv + kRowsPer - 1) / kRowsPer + (mv + kRowsPer - 1) / kRowsPer + 2), 0.0);
    const size_t kbase = static_cast<size_t>((nv + kRowsPer - 1) / kRowsPer) + 1;
    rows(nv, [&](int64_t i0, int64_t i1) {
      mx[static_cast<size_t>(i0 / kRowsPer)] = project_rows(hr.q, hr.qrs, nv, D, dirs.data(), R, sc.qproj.data(), sc.qsq.data(), i0, i1);
    });
    rows(mv, [&](int64_t i0, int64_t i1) {
      mx[kbase + static_cast<size_t>(i0 / kRowsPer)] = project_rows(hr.k, hr.krs, mv, D, dirs.data(), R, sc.kproj.data(), sc.ksq.data(), i0, i1);
    });
    const double total = *std::max_element(mx.begin(), mx.begin() + static_cast<std::ptrdiff_t>(kbase)) +
                         *std::max_element(mx.begin() + static_cast<std::ptrdiff_t>(kbase), mx.end());
    rows(nv, [&](int64_t i0, int64_t i1) {  // F(q) = [q, 0, ·]
      finish_projections(nv, D, dirs.data(), R, D + 1, total, sc.qproj.data(), sc.qsq.data(), i0, i1);
    });
    rows(mv, [&](int64_t i0, int64_t i1) {  // G(k) = [k, ·, 0]
      finish_projections(mv, D, dirs.data(), R, D, total, sc.kproj.data(), sc.ksq.data(), i0, i1);
    });
    const int64_t kwm = round_up(st.kc, mk::kLanes);
    for (int64_t r = 0; r < R; ++r) {
      int32_t* qp = st.qperm.data() + (t * R + r) * d.N;
      int32_t* kp = st.kperm.data() + (t * R + r) * d.M;
      cluster::sort_by_key(sc.qproj.data() + r * nv, nv, qp, sc.radix);  // stable: ties keep index order
      cluster::sort_by_key(sc.kproj.data() + r * mv, mv, kp, sc.radix);
      const int64_t nc = num_clusters(st, nv, mv);
      // Clusters [c0, c1) of this round on one thread: within a round every query is in one
      // cluster, so ranges write disjoint output rows.
      auto clusters = [&](int64_t c0, int64_t c1, ThreadScratch& own) {
        float* qs = own.qs.floats(static_cast<size_t>(64 * Dkp));   // (nq, Dkp) q · c
        float* kt = own.kt.floats(static_cast<size_t>(Dkp * kwm));  // (Dk, kw) keys transposed
        float* vr = own.vr.floats(static_cast<size_t>(st.kc * Dvp)); // (nk, Dvp)
        float* s = own.s.floats(static_cast<size_t>(64 * kwm));     // (nq, kw)
        float* o = own.o.floats(static_cast<size_t>(64 * Dvp));     // (nq, Dvp) this round's output
        for (int64_t cl = c0; cl < c1; ++cl) {
          Block blk = make_block(st, qp, kp, nv, mv, cl);
          if (blk.nq == 0) continue;  // fewer queries than clusters: some clusters have none
          const Block next = cl + 1 < c1 ? make_block(st, qp, kp, nv, mv, cl + 1) : Block{};
          const gather::Ahead qa{next.qi, next.nq}, ka{next.kj, next.nk};
          request_far(st, qp, kp, nv, mv, cl, c1, hr, D, Dv, r > 0 ? ob : nullptr, ors);
          gather::rows(hr.q, hr.qrs, blk.qi, blk.nq, D, qs, Dkp, blk.nq, c, qa);
          gather::transposed(hr.k, hr.krs, blk.kj, blk.nk, D, kt, blk.kw, ka);
          gather::rows(hr.v, hr.vrs, blk.kj, blk.nk, Dv, vr, Dvp, blk.nk, 1.f, ka);
          block_scores(d, qs, Dkp, kt, blk, s);
          std::memset(o, 0, sizeof(float) * static_cast<size_t>(blk.nq * Dvp));
          float lse_r[64];
          for (int64_t q = 0; q < blk.nq; ++q) lse_r[q] = tile::softmax_row(s + q * blk.kw, blk.kw);
          mk::gemm_ab(blk.nq, Dvp, blk.nk, s, blk.kw, 1, vr, Dvp, o, Dvp, nullptr);
          for (int64_t q = 0; q < blk.nq; ++q) {
            if (r > 0) gather::prefetch_one(ob, ors, qa, q, Dv, true);  // round 0 only writes
            const int64_t i = blk.qi[q];
            tile::blend_round(ob + i * ors, o + q * Dvp, Dv, L[i], lse_r[q], r == 0);
          }
        }
        simd::store_fence();  // round 0 streamed its rows: fence before any thread reads them back
      };
      if (split) {
        const int64_t T = std::min<int64_t>(nc, max_threads());
        parallel_for(T, [&](int64_t x, int thread) {
          clusters(x * nc / T, (x + 1) * nc / T, ws.threads[static_cast<size_t>(thread)]);
        });
      } else {
        clusters(0, nc, sc);
      }
    }
    // A query that saw no key in any round keeps output 0 and gets lse2 = +inf (backward adds 0).
    for (int64_t i = 0; i < nv; ++i)
      if (L[i] == -kInf) L[i] = kInf;
  };
  if (split) {
    for (int64_t t = 0; t < d.B * d.H; ++t) head(t, thread_id());
  } else {
    parallel_for(d.B * d.H, [&](int64_t t, int thread) { head(t, thread); });
  }
}

void attn_smyrf_bwd(const AttentionInputs& in, const AttentionDims& d, const SmyrfParams& p,
                    const SmyrfState& st, ConstView out, ConstView dout, View dq, View dk, View dv,
                    SmyrfWorkspace& ws) {
  const int64_t D = d.Dk, Dv = d.Dv, Dkp = round_up(D, mk::kLanes), Dvp = round_up(Dv, mk::kLanes);
  const int64_t R = st.rounds, G = d.group();
  const float scale = softmax_scale(p.scale, D);
  const float c = scale * kLog2e;
  ws.ensure_threads();
  float* part = G > 1 ? ws.part.floats(static_cast<size_t>(d.B * d.H * d.M * (Dkp + Dvp))) : nullptr;
  const bool split = split_tasks(d.B * d.H);  // as in the forward
  auto head = [&](int64_t t, int thread) {
    const int64_t b = t / d.H, h = t % d.H, hk = h / G;
    const int64_t nv = valid_queries(in, d, b), mv = valid_keys(in, d, b);
    const HeadRows hr(in, b, h, hk);
    float* pk = part ? part + t * d.M * (Dkp + Dvp) : nullptr;  // (M, Dkp + Dvp)
    if (pk) std::memset(pk, 0, sizeof(float) * static_cast<size_t>(d.M * (Dkp + Dvp)));
    auto gk = [&](int64_t j) { return pk ? pk + j * (Dkp + Dvp) : dk.ptr(b, hk, j); };
    auto gv = [&](int64_t j) { return pk ? pk + j * (Dkp + Dvp) + Dkp : dv.ptr(b, hk, j); };
    if (nv == 0) return;
    ThreadScratch& sc = ws.threads[static_cast<size_t>(thread)];
    const float* lse2 = st.lse2.data() + t * d.N;
    float* di = sc.misc.floats(static_cast<size_t>(nv));  // (nv) D_i = dO_i · O_i
    for (int64_t i = 0; i < nv; ++i) di[i] = simd::dot(dout.ptr(b, h, i), out.ptr(b, h, i), Dv);
    const int64_t kwm = round_up(st.kc, mk::kLanes);
    const float* gob = dout.ptr(b, h, 0);
    const int64_t grs = dout.stride(2);
    for (int64_t r = 0; r < R; ++r) {
      const int32_t* qp = st.qperm.data() + (t * R + r) * d.N;
      const int32_t* kp = st.kperm.data() + (t * R + r) * d.M;
      const int64_t nc = num_clusters(st, nv, mv);
      // Clusters [c0, c1) of this round on one thread. With mv >= nc every cluster has keys of its
      // own, so ranges write disjoint dq, dk and dv rows (each row once per round, in round order
      // either way); with fewer keys than clusters some share a key and the round stays serial.
      auto clusters = [&](int64_t c0, int64_t c1, ThreadScratch& own) {
        float* qs = own.qs.floats(static_cast<size_t>(64 * Dkp));     // (nq, Dkp) q · c
        float* kr = own.kr.floats(static_cast<size_t>(kwm * Dkp));    // (nk, Dkp) key rows
        float* kt = own.kt.floats(static_cast<size_t>(Dkp * kwm));    // (Dk, kw) their transpose
        float* vt = own.vt.floats(static_cast<size_t>(Dvp * kwm));    // (Dv, kw) V_cᵀ
        float* s = own.s.floats(static_cast<size_t>(64 * kwm));       // (nq, kw) S, then P
        float* go = own.go.floats(static_cast<size_t>(64 * Dvp));     // (nq, Dvp) dO rows
        float* dp = own.dp.floats(static_cast<size_t>(64 * kwm));     // (nq, kw) dP, then dS
        float* dqc = own.dqc.floats(static_cast<size_t>(64 * Dkp));   // (nq, Dkp)
        float* dkc = own.dkc.floats(static_cast<size_t>(kwm * Dkp));  // (kw, Dkp)
        float* dvc = own.dvc.floats(static_cast<size_t>(kwm * Dvp));  // (kw, Dvp)
        for (int64_t cl = c0; cl < c1; ++cl) {
          Block blk = make_block(st, qp, kp, nv, mv, cl);
          if (blk.nq == 0) continue;  // fewer queries than clusters: some clusters have none
          const Block next = cl + 1 < c1 ? make_block(st, qp, kp, nv, mv, cl + 1) : Block{};
          const gather::Ahead qa{next.qi, next.nq}, ka{next.kj, next.nk};
          request_far(st, qp, kp, nv, mv, cl, c1, hr, D, Dv, gob, grs);
          const int64_t kw = blk.kw;
          gather::rows(hr.q, hr.qrs, blk.qi, blk.nq, D, qs, Dkp, blk.nq, c, qa);
          gather::rows(hr.k, hr.krs, blk.kj, blk.nk, D, kr, Dkp, blk.nk, 1.f, ka);
          gather::transpose(kr, Dkp, blk.nk, D, kt, kw);
          gather::transposed(hr.v, hr.vrs, blk.kj, blk.nk, Dv, vt, kw, ka);
          gather::rows(gob, grs, blk.qi, blk.nq, Dv, go, Dvp, blk.nq, 1.f, qa);
          block_scores(d, qs, Dkp, kt, blk, s);
          // P = 2^(S − lse2) against the all-round log-sum-exp: one softmax over every round's keys
          for (int64_t q = 0; q < blk.nq; ++q) tile::exp2_row(s + q * kw, kw, lse2[blk.qi[q]]);
          std::memset(dp, 0, sizeof(float) * static_cast<size_t>(blk.nq * kw));
          mk::gemm_ab(blk.nq, kw, Dv, go, Dvp, 1, vt, kw, dp, kw, nullptr);
          std::memset(dqc, 0, sizeof(float) * static_cast<size_t>(blk.nq * Dkp));
          for (int64_t q = 0; q < blk.nq; ++q) {
            const int64_t i = blk.qi[q];
            const float* prow = s + q * kw;
            float* drow = dp + q * kw;
            for (int64_t x = 0; x < kw; ++x) drow[x] = prow[x] * (drow[x] - di[i]) * scale;
          }
          // dQ += dS·K_c ; dK_c += dSᵀ·(c Q)/c ; dV_c += Pᵀ·dO
          mk::gemm_ab(blk.nq, Dkp, blk.nk, dp, kw, 1, kr, Dkp, dqc, Dkp, nullptr);
          std::memset(dkc, 0, sizeof(float) * static_cast<size_t>(kw * Dkp));
          std::memset(dvc, 0, sizeof(float) * static_cast<size_t>(kw * Dvp));
          mk::gemm_ab(blk.nk, Dkp, blk.nq, dp, 1, kw, qs, Dkp, dkc, Dkp, nullptr);
          mk::gemm_ab(blk.nk, Dvp, blk.nq, s, 1, kw, go, Dvp, dvc, Dvp, nullptr);
          for (int64_t q = 0; q < blk.nq; ++q) {
            if (q < next.nq) simd::prefetch_row(dq.ptr(b, h, next.qi[q]), D, true);
            simd::axpy_row(dq.ptr(b, h, blk.qi[q]), dqc + q * Dkp, D);
          }
          for (int64_t x = 0; x < blk.nk; ++x) {
            if (x < next.nk) {
              simd::prefetch_row(gk(next.kj[x]), D, true);
              simd::prefetch_row(gv(next.kj[x]), Dv, true);
            }
            simd::axpy_row(gk(blk.kj[x]), dkc + x * Dkp, D, 1.f / c);
            simd::axpy_row(gv(blk.kj[x]), dvc + x * Dvp, Dv);
          }
        }
      };
      if (split && mv >= nc) {
        const int64_t T = std::min<int64_t>(nc, max_threads());
        parallel_for(T, [&](int64_t x, int th) { clusters(x * nc / T, (x + 1) * nc / T, ws.threads[static_cast<size_t>(th)]); });
      } else {
        clusters(0, nc, sc);
      }
    }
  };
  if (split) {
    for (int64_t t = 0; t < d.B * d.H; ++t) head(t, thread_id());
  } else {
    parallel_for(d.B * d.H, [&](int64_t t, int thread) { head(t, thread); });
  }
  if (part) reduce_group_partials(in, d, part, d.M, Dkp + Dvp, Dkp, dk, dv);
}

void smyrf_projections_ref(const RefProblem& pr, const SmyrfParams& p, uint64_t step, int64_t b,
                           int64_t h, int64_t round, std::vector<double>& qproj,
                           std::vector<double>& kproj) {
  const AttentionDims& d = pr.d;
  const std::vector<float> dirs = directions(p, step, d.Dk);
  const float* a = dirs.data() + round * (d.Dk + 2);
  const int64_t nv = pr.nq(b), mv = pr.nk(b);
  auto sq = [&](auto elem, int64_t i) {
    double s = 0;
    for (int64_t e = 0; e < d.Dk; ++e) s += elem(i, e) * elem(i, e);
    return s;
  };
  auto qe = [&](int64_t i, int64_t e) { return pr.qe(b, h, i, e); };
  auto ke = [&](int64_t j, int64_t e) { return pr.ke(b, h, j, e); };
  double mq = 0, mk2 = 0;
  for (int64_t i = 0; i < nv; ++i) mq = std::max(mq, sq(qe, i));
  for (int64_t j = 0; j < mv; ++j) mk2 = std::max(mk2, sq(ke, j));
  auto project = [&](auto elem, int64_t i, int64_t extra) {  // [x, ·, ·] · a, the norm term at `extra`
    double s = 0;
    for (int64_t e = 0; e < d.Dk; ++e) s += a[e] * elem(i, e);
    return s + a[extra] * std::sqrt(std::max(0.0, mq + mk2 - sq(elem, i)));
  };
  qproj.resize(static_cast<size_t>(nv));
  kproj.resize(static_cast<size_t>(mv));
  for (int64_t i = 0; i < nv; ++i) qproj[static_cast<size_t>(i)] = project(qe, i, d.Dk + 1);  // F(q) = [q, 0, ·]
  for (int64_t j = 0; j < mv; ++j) kproj[static_cast<size_t>(j)] = project(ke, j, d.Dk);      // G(k) = [k, ·, 0]
}

void smyrf_causal_buckets(const AttentionInputs& in, const AttentionDims& d, const SmyrfParams& p,
                          uint64_t step, BucketWindow& bw) {
  const int64_t D = d.Dk, R = p.hashes, BH = d.B * d.H;
  bw.rounds = R;
  bw.window = p.k_cluster;
  bw.qb.assign(static_cast<size_t>(BH * R * d.N), 0);
  bw.kb.assign(static_cast<size_t>(BH * R * d.M), 0);
  const std::vector<float> dirs = directions(p, step, D);
  parallel_for(BH, [&](int64_t t) {
    const int64_t b = t / d.H, h = t % d.H, hk = h / d.group(), off = d.M - d.N;
    const int64_t nv = valid_queries(in, d, b), mv = valid_keys(in, d, b);
    // Running maxima of the squared norms in position order.
    std::vector<double> mq(static_cast<size_t>(nv)), mk(static_cast<size_t>(mv));
    for (int64_t i = 0; i < nv; ++i)
      mq[static_cast<size_t>(i)] = std::max(i ? mq[static_cast<size_t>(i - 1)] : 0.0, static_cast<double>(simd::dot(in.q.ptr(b, h, i), in.q.ptr(b, h, i), D)));
    for (int64_t j = 0; j < mv; ++j)
      mk[static_cast<size_t>(j)] = std::max(j ? mk[static_cast<size_t>(j - 1)] : 0.0, static_cast<double>(simd::dot(in.k.ptr(b, hk, j), in.k.ptr(b, hk, j), D)));
    auto r2 = [&](int64_t pos) {  // R(pos)²
      const int64_t qi = std::min(pos - off, nv - 1), kj = std::min(pos, mv - 1);
      return (qi >= 0 ? mq[static_cast<size_t>(qi)] : 0.0) + (kj >= 0 ? mk[static_cast<size_t>(kj)] : 0.0);
    };
    const int64_t nb = std::max<int64_t>(1, (nv + p.q_cluster - 1) / p.q_cluster);
    // h = a·x / R, with x's extra coordinate (index `extra`) sqrt(R² − |x|²).
    auto proj = [&](const float* x, double rr, const float* a, int64_t extra) {
      const double sq = simd::dot(x, x, D), dot = simd::dot(a, x, D);
      return static_cast<float>(rr > 0 ? (dot + a[extra] * std::sqrt(std::max(0.0, rr - sq))) / std::sqrt(rr) : 0.0);
    };
    // Online quantiles: each row's rank among the earlier rows of its side (a stable sort gives
    // the global order, ties to the earlier row; a Fenwick tree over it counts the rows inserted).
    std::vector<float> hv;
    std::vector<int32_t> order, pos_of, fen;
    cluster::RadixScratch radix;
    auto online_buckets = [&](int64_t n, int32_t* out) {
      order.resize(static_cast<size_t>(n));
      pos_of.resize(static_cast<size_t>(n));
      fen.assign(static_cast<size_t>(n + 1), 0);
      cluster::sort_by_key(hv.data(), n, order.data(), radix);
      for (int64_t x = 0; x < n; ++x) pos_of[static_cast<size_t>(order[static_cast<size_t>(x)])] = static_cast<int32_t>(x);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t g = pos_of[static_cast<size_t>(i)];
        int64_t below = 0;
        for (int64_t k = g; k > 0; k -= k & -k) below += fen[static_cast<size_t>(k)];
        for (int64_t k = g + 1; k <= n; k += k & -k) ++fen[static_cast<size_t>(k)];
        const double u = (static_cast<double>(below) + 0.5) / static_cast<double>(i + 1);
        out[i] = static_cast<int32_t>(std::min<int64_t>(nb - 1, static_cast<int64_t>(u * static_cast<double>(nb))));
      }
    };
    for (int64_t r = 0; r < R; ++r) {
      const float* a = dirs.data() + r * (D + 2);
      hv.resize(static_cast<size_t>(nv));
      for (int64_t i = 0; i < nv; ++i) hv[static_cast<size_t>(i)] = proj(in.q.ptr(b, h, i), r2(i + off), a, D + 1);  // F(q) = [q, 0, ·]
      online_buckets(nv, bw.qb.data() + (t * R + r) * d.N);
      hv.resize(static_cast<size_t>(mv));
      for (int64_t j = 0; j < mv; ++j) hv[static_cast<size_t>(j)] = proj(in.k.ptr(b, hk, j), r2(j), a, D);        // G(k) = [k, ·, 0]
      online_buckets(mv, bw.kb.data() + (t * R + r) * d.M);
    }
  });
}

void attn_smyrf_ref(const RefProblem& pr, const SmyrfState& st, std::vector<double>& out) {
  if (st.causal) {
    attn_bucket_window_ref(pr, st.bw, out);
    return;
  }
  const AttentionDims& d = pr.d;
  out.assign(static_cast<size_t>(d.B * d.H * d.N * d.Dv), 0.0);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t t = b * d.H + h, nv = pr.nq(b), mv = pr.nk(b);
      // Every (round, key) pair a query meets, then one softmax over them.
      std::vector<std::vector<int64_t>> seen(static_cast<size_t>(nv));
      for (int64_t r = 0; r < st.rounds; ++r) {
        const int32_t* qp = st.qperm.data() + (t * st.rounds + r) * d.N;
        const int32_t* kp = st.kperm.data() + (t * st.rounds + r) * d.M;
        const int64_t nc = std::max((nv + st.qc - 1) / st.qc, (mv + st.kc - 1) / st.kc);
        for (int64_t cl = 0; cl < nc; ++cl)
          for (int64_t x = smyrf_cluster_range(nv, nc, cl, false).first; x < smyrf_cluster_range(nv, nc, cl, false).second; ++x) {
            const int64_t i = qp[x];
            const auto [k0, k1] = smyrf_cluster_range(mv, nc, cl, true);
            for (int64_t y = k0; y < k1; ++y) seen[static_cast<size_t>(i)].push_back(kp[y]);
          }
      }
      for (int64_t i = 0; i < nv; ++i) {
        const auto& keys = seen[static_cast<size_t>(i)];
        std::vector<double> s;
        for (int64_t j : keys) s.push_back(pr.logit(b, h, i, j));
        pr.softmax_add(b, h, keys, std::move(s), 1.0, out.data() + (t * d.N + i) * d.Dv);
      }
    }
}

size_t smyrf_workspace_bytes(const AttentionDims& d, const SmyrfParams& p, Mode mode, int threads) {
  const int64_t D = d.Dk, Dv = d.Dv, Dkp = round_up(D, mk::kLanes), Dvp = round_up(Dv, mk::kLanes);
  const int64_t R = p.hashes, N = d.N, M = d.M, BH = d.B * d.H;
  const int64_t kc = p.k_cluster, kwm = round_up(kc, mk::kLanes);
  constexpr int64_t f = sizeof(float), i32 = sizeof(int32_t);
  // Per thread, in bytes. The vectors grow by resize() to each head's valid lengths, so with
  // lengths that differ between batches std::vector's growth may leave up to twice the largest
  // size asked; own_w and the radix counts are assign()ed (exact); Workspaces hold the largest.
  int64_t per = 2 * f * (R * N + R * M + N + M) +   // qproj, kproj, qsq, ksq
                4 * 2 * i32 * std::max(N, M) +      // radix keys, keys2, idx2, idx3
                i32 * 3 * 2048;                     // radix count (3 passes of 11 bits)
  // Tiles, forward: qs, kt, vr, s, o.
  int64_t qs = 64 * Dkp, kt = Dkp * kwm, vr = kc * Dvp, s = 64 * kwm, o = 64 * Dvp;
  int64_t kr = 0, vt = 0, go = 0, dp = 0, dqc = 0, dkc = 0, dvc = 0, misc = 0, shared = 0;
  if (mode == Mode::training) {  // backward: the same qs, kt, s; its own gathers and gradients
    kr = kwm * Dkp, vt = Dvp * kwm, go = 64 * Dvp, dp = 64 * kwm, dqc = 64 * Dkp;
    dkc = kwm * Dkp, dvc = kwm * Dvp, misc = N;
    if (d.group() > 1) shared = f * BH * M * (Dkp + Dvp);  // part
  }
  per += f * (qs + kt + vr + s + o + kr + vt + go + dp + dqc + dkc + dvc + misc);
  const int64_t state = i32 * BH * R * (N + M) + f * BH * N;  // qperm, kperm, lse2
  return static_cast<size_t>(threads * (per + static_cast<int64_t>(sizeof(ThreadScratch))) +
                             shared + state);
}

namespace {

class SmyrfAttention final : public Attention {
 public:
  explicit SmyrfAttention(const SmyrfParams& p) : p_(p) {
    caps_ = Capabilities{.causal = true, .query_lengths = true, .key_lengths = true, .bias = false,
                         .cross = true, .gqa = true, .trainable = true, .shared_qk = false,
                         .stochastic = true, .stateful = false};
  }
  std::string name() const override {
    return detail::concat("smyrf:hashes=", p_.hashes, ",q_cluster=", p_.q_cluster, ",k_cluster=",
                          p_.k_cluster, ",seed=", p_.seed,
                          p_.scale > 0 ? detail::concat(",scale=", p_.scale) : std::string());
  }
  const Capabilities& capabilities() const override { return caps_; }

  void check_magnitudes(const AttentionDims& d, const Magnitudes& m) const override {
    check_softmax_range(d, m, softmax_scale(p_.scale, d.Dk), "smyrf");
    check_member_range(d, m, true, "smyrf");  // the asymmetric transform squares norms in float
  }

  void forward(const AttentionInputs& in, View out, Context& ctx) const override {
    Magnitudes mag;
    const AttentionDims d = validate_inputs(in, caps_, "smyrf", mag);
    validate_output(out, Shape{d.B, d.H, d.N, d.Dv}, "out", "smyrf");
    check_magnitudes(d, mag);
    SmyrfState& st = ctx.state<SmyrfState>();
    st.causal = in.causal;
    if (in.causal) {
      smyrf_causal_buckets(in, d, p_, in.step, st.bw);
      attn_bucket_window_fwd(in, d, softmax_scale(p_.scale, d.Dk), st.bw, out, bucket_window_workspace(ctx.scratch()));
      return;
    }
    attn_smyrf_fwd(in, d, p_, in.step, out, st, ctx.scratch().get<SmyrfWorkspace>());
  }

  void backward(const AttentionInputs& in, ConstView out, Context& ctx, ConstView dout, View dq,
                View dk, View dv) const override {
    Magnitudes mag;
    const AttentionDims d = validate_inputs(in, caps_, "smyrf", mag);
    check_member_range(d, mag, true, "smyrf");
    const SmyrfState& st = ctx.saved<SmyrfState>();
    check(st.causal == in.causal, "smyrf: backward's causal flag differs from the forward's");
    if (in.causal) {
      check(st.bw.lse2.shape() == Shape{d.B, d.H, d.N} &&
                st.bw.kb.size() == static_cast<size_t>(d.B * d.H * st.bw.rounds * d.M),
            "smyrf: backward inputs have shapes other than the forward's (q is now ", in.q.shape, ", k ", in.k.shape, ")");
      validate_softmax_backward(in, d, mag, softmax_scale(p_.scale, d.Dk), out, dout, dq, dk, dv, "smyrf");
      attn_bucket_window_bwd(in, d, softmax_scale(p_.scale, d.Dk), st.bw, out, dout, dq, dk, dv, bucket_window_workspace(ctx.scratch()));
      return;
    }
    const size_t heads = static_cast<size_t>(d.B * d.H * st.rounds);
    check(st.lse2.shape() == Shape{d.B, d.H, d.N} && st.qperm.size() == heads * static_cast<size_t>(d.N) &&
              st.kperm.size() == heads * static_cast<size_t>(d.M),
          "smyrf: backward inputs have shapes other than the forward's (q is now ", in.q.shape,
          ", k ", in.k.shape, ")");
    validate_softmax_backward(in, d, mag, softmax_scale(p_.scale, d.Dk), out, dout, dq, dk, dv, "smyrf");
    attn_smyrf_bwd(in, d, p_, st, out, dout, dq, dk, dv, ctx.scratch().get<SmyrfWorkspace>());
  }

  // Each query's cluster of round 0 (its run of the sorted queries); causal: its round-0 bucket.
  QueryGroups query_groups(const AttentionInputs& in, const Context& ctx, int64_t b, int64_t h) const override {
    const AttentionDims d = query_groups_dims(in, caps_, b, h, "smyrf");
    const SmyrfState& st = query_groups_state<SmyrfState>(ctx, "smyrf");
    const int64_t t = b * d.H + h, nv = valid_queries(in, d, b), mv = valid_keys(in, d, b);
    QueryGroups g{std::vector<int32_t>(static_cast<size_t>(d.N), -1), "cluster"};
    if (in.causal) {
      check_query_groups_shapes(st.causal && st.bw.lse2.shape() == Shape{d.B, d.H, d.N} &&
                                    st.bw.qb.size() == static_cast<size_t>(d.B * d.H * st.bw.rounds * d.N),
                                in, "smyrf");
      const int32_t* qb = st.bw.qb.data() + t * st.bw.rounds * d.N;  // (N) round 0
      std::copy(qb, qb + nv, g.ids.begin());
      return g;
    }
    check_query_groups_shapes(!st.causal && st.lse2.shape() == Shape{d.B, d.H, d.N} &&
                                  st.qperm.size() == static_cast<size_t>(d.B * d.H * st.rounds * d.N),
                              in, "smyrf");
    const int32_t* perm = st.qperm.data() + t * st.rounds * d.N;  // (N) round 0: valid queries first
    const int64_t nc = num_clusters(st, nv, mv);
    for (int64_t cl = 0; cl < nc; ++cl) {
      const auto [x0, x1] = smyrf_cluster_range(nv, nc, cl, false);
      for (int64_t x = x0; x < x1; ++x) g.ids[static_cast<size_t>(perm[x])] = static_cast<int32_t>(cl);
    }
    return g;
  }

  size_t workspace_bytes(const AttentionDims& d, Mode mode, int threads) const override {
    // The mask is not among the sizes: the bound covers both the causal and the plain pipeline.
    return std::max(smyrf_workspace_bytes(d, p_, mode, threads),
                    bucket_window_bytes(d, p_.hashes, p_.k_cluster, mode, threads));
  }
  // Per round: the norms and the projection of the transformed queries and keys on one direction,
  // then each query attends its cluster's k_cluster keys (causal: those before it, about half);
  // the rounds' combination.
  WorkModel work(const AttentionDims& d, bool causal, Mode mode) const override {
    const double rounds = static_cast<double>(p_.hashes), bh = static_cast<double>(d.B * d.H);
    const double keys = static_cast<double>(std::min(p_.k_cluster, d.M)) * (causal ? 0.5 : 1.0);
    WorkModel w;
    w.add("hashing", false, rounds * 4.0 * static_cast<double>((d.N + d.M) * (d.Dk + 1)) * bh);
    w += work::softmax_attention(d, rounds * static_cast<double>(d.N) * keys, mode, "cluster attention");
    if (p_.hashes > 1) {
      w.add("round combination", false, rounds * 2.0 * static_cast<double>(d.N * d.Dv) * bh);
      if (mode == Mode::training) w.add("round combination", true, rounds * 2.0 * static_cast<double>(d.N * d.Dv) * bh);
    }
    return w;
  }

 private:
  SmyrfParams p_;
  Capabilities caps_;
};

}  // namespace

std::unique_ptr<Attention> make_smyrf(const Spec& spec) {
  SpecReader r(spec);
  SmyrfParams p;
  p.hashes = r.get_int("hashes", 2, 1, 64);
  p.q_cluster = r.get_int("q_cluster", 32, 1, 64);
  p.k_cluster = r.get_int("k_cluster", 32, 1, int64_t{1} << 20);
  p.scale = static_cast<float>(r.get_float("scale", 0.0, 1e-6, 1e6, "1/sqrt(Dk)"));
  p.seed = static_cast<uint64_t>(r.get_int("seed", 0, 0, int64_t{1} << 62));
  r.finish();
  return std::make_unique<SmyrfAttention>(p);
}

}  // namespace clattn
