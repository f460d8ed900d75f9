// Clustered and improved-clustered attention over a sequence split in contiguous slices across
// ranks (include/clattn/seq_parallel.h): the pipeline of clustered.cpp, stage by stage, with the
// communication between stages batched over every (batch, head):
//   1. codes of the local queries, from the same planes on every rank (seed, step);
//   2. Hamming k-means over all ranks (split_kmeans.cpp): the clusters of one process;
//   3. centroids Qc_j: member sums in position order, rank after rank (the sum of one process, to
//      the bit), divided by the global sizes on the last rank and broadcast;
//   4. each centroid's attention over the local keys (running max, sum, Σ p·v, and its local
//      top-k candidates), merged across ranks by log-sum-exp;
//   5. improved: each centroid's top-k merged from the per-rank top-k by recursive doubling
//      (merge_candidates: log2 R exchanges; the total order value,
//      then key index: the sets of one process), and the T_j rows gathered from their owners;
//   6. members get their centroid's output (improved: recomputed on the gathered T_j rows by the
//      member stage of improved_clustered.cpp).
// Communication per layer and head: O(C·64) integers per k-means round, O(C·D) floats for the
// centroids and their attention, and for improved O(C·k·(D + Dv)) — none of it grows with N.
// The backward mirrors it: Σ_members dO_i and the member stage's ∂/∂m_j added across ranks, the
// centroid attention's backward over the local keys, ∂Qc added across ranks, and the T_j rows'
// gradients added across ranks and kept by their owners.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <numeric>

#include "attention/clustered/clustered_internal.h"
#include "attention/clustered/split.h"
#include "attention/tile/tile_ops.h"
#include "attention/tile/topk_select.h"
#include "attention/validate.h"
#include "clattn/error.h"
#include "clattn/threads.h"
#include "core/microkernel.h"
#include "sequence_split/sp_internal.h"
#include "attention/clustered/split_kmeans.h"

namespace clattn::sp {
namespace {

using mk::kPanel;
using mk::round_up;
using tile::kInf;
using tile::kLn2;
using tile::kLog2e;

constexpr int kTagChain = 7201;
constexpr int kTagCand = 7202;

// Every rank's `lists` candidate lists of kcap (tops, (lists, kcap), unused slots {-inf,
// INT32_MAX}) become on every rank the best kcap of all ranks' lists together, by recursive
// doubling: at each of log2(R) steps a rank swaps its lists with the rank whose number differs in
// one bit and keeps the best kcap of each union, so a rank sends log2(R) copies of its lists rather
// than the R − 1 of an all-gather. cand_before is a total order and the ranks hold disjoint keys, so
// the result does not depend on the order of the merges. When R is not a power of two, the ranks
// past the largest power of two P hand their lists to rank − P first and get the result back.
void merge_candidates(Communicator& comm, std::vector<Cand>& tops, int64_t kcap) {
  const int R = comm.size(), r = comm.rank();
  if (R == 1 || kcap == 0) return;
  const size_t bytes = sizeof(Cand) * tops.size(), lists = tops.size() / static_cast<size_t>(kcap);
  std::vector<Cand> other(tops.size()), both(static_cast<size_t>(2 * kcap));
  auto merge = [&] {
    for (size_t l = 0; l < lists; ++l) {
      Cand* mine = tops.data() + l * static_cast<size_t>(kcap);
      std::copy(mine, mine + kcap, both.begin());
      std::copy(other.begin() + static_cast<int64_t>(l) * kcap, other.begin() + static_cast<int64_t>(l + 1) * kcap,
                both.begin() + kcap);
      std::partial_sort(both.begin(), both.begin() + kcap, both.end(), cand_before);
      std::copy(both.begin(), both.begin() + kcap, mine);
    }
  };
  int P = 1;
  while (2 * P <= R) P *= 2;
  if (r >= P) {
    comm.isend(tops.data(), bytes, r - P, kTagCand)->wait();
    comm.irecv(tops.data(), bytes, r - P, kTagCand)->wait();
    return;
  }
  if (r + P < R) {
    comm.irecv(other.data(), bytes, r + P, kTagCand)->wait();
    merge();
  }
  for (int s = 1; s < P; s *= 2) {
    auto recv = comm.irecv(other.data(), bytes, r ^ s, kTagCand);
    comm.isend(tops.data(), bytes, r ^ s, kTagCand)->wait();
    recv->wait();
    merge();
  }
  if (r + P < R) comm.isend(tops.data(), bytes, r + P, kTagCand)->wait();
}

// The rng streams of clustered.cpp: (step, purpose, head).
uint64_t stream_of(uint64_t step, uint64_t purpose, uint64_t head) { return ((step * 4 + purpose) << 32) + head; }

// A (1, 1, rows, D) view of a task's gathered rows that any (b, hk) reads as the same rows.
ConstView gathered(const float* base, int64_t rows, int64_t D) {
  ConstView v{base, Shape{1, 1, rows, D}, {}};
  v.strides = {0, 0, D, 1};
  return v;
}

struct Sizes {
  int64_t B, H, Hkv, G, n, Dk, Dv, a0, N, cmax, kmax;
  int64_t nloc(std::span<const int32_t> ql, int64_t b) const { return std::clamp<int64_t>(nv(ql, b) - a0, 0, n); }
  int64_t nv(std::span<const int32_t> ql, int64_t b) const { return ql.empty() ? N : ql[static_cast<size_t>(b)]; }
};

Sizes sizes_of(const Communicator& comm, const SeqSplit& split, const ClusteredParams& p, const AttentionInputs& in) {
  check(!split.zigzag && split.segments[static_cast<size_t>(comm.rank())].size() == 1,
        "sequence parallel: clustered attention takes the contiguous split");
  Sizes s{};
  s.B = in.q.dim(0);
  s.H = in.q.dim(1);
  s.Hkv = in.k.dim(1);
  s.G = s.H / s.Hkv;
  s.n = in.q.dim(2);
  s.Dk = in.q.dim(3);
  s.Dv = in.v.dim(3);
  s.a0 = split.segments[static_cast<size_t>(comm.rank())][0].first;
  s.N = split.N;
  s.cmax = std::max<int64_t>(1, std::min(p.clusters, s.N));
  s.kmax = p.topk > 0 ? std::max<int64_t>(1, std::min(p.topk, s.N)) : 0;
  return s;
}

}  // namespace

void clustered_forward(Communicator& comm, const SeqSplit& split, const ClusteredParams& p, uint64_t step,
                       const AttentionInputs& in, View out, ClusteredSplitState& st, Scratch& scratch) {
  const Sizes z = sizes_of(comm, split, p, in);
  const int R = comm.size(), r = comm.rank();
  const int64_t BH = z.B * z.H, D = z.Dk, Dv = z.Dv, cmax = z.cmax;
  const int64_t Dvp = round_up(Dv, mk::kLanes);
  const float scale = softmax_scale(p.scale, D), c = scale * kLog2e;
  const bool improved = p.topk > 0;
  ClusteredWorkspace& ws = scratch.get<ClusteredWorkspace>();
  ws.ensure_threads();
  st.cmax = cmax;
  st.kmax = z.kmax;
  st.ncl.assign(static_cast<size_t>(BH), 0);
  st.assign.assign(static_cast<size_t>(BH * z.n), -1);
  st.count.assign(static_cast<size_t>(BH * cmax), 0);
  st.ksel.assign(static_cast<size_t>(BH), 0);
  st.qc.resize(Shape{BH, cmax, D});
  st.lse_c.resize(Shape{BH, cmax});
  st.vc.resize(Shape{BH, cmax, Dv});
  st.mass.resize(Shape{BH, cmax});
  st.qc.fill(0.f);

  // 1-2. Codes of the local valid queries, then the clusters of the whole sequence.
  const Rng rng(p.seed);
  const cluster::LshPlanes planes = cluster::draw_planes(rng, stream_of(step, 0, 0), p.bits, D, p.hash_bias);
  std::vector<std::vector<uint64_t>> codes(static_cast<size_t>(BH));
  std::vector<KmTask> tasks;
  std::vector<int64_t> task_of(static_cast<size_t>(BH), -1);
  parallel_for(BH, [&](int64_t t, int thread) {
    const int64_t b = t / z.H, h = t % z.H;
    const int64_t nv = z.nv(in.query_lengths, b), mv = z.nv(in.key_lengths, b), nl = z.nloc(in.query_lengths, b);
    if (nv == 0 || mv == 0 || p.clusters >= nv) return;
    ThreadScratch& sc = ws.threads[static_cast<size_t>(thread)];
    sc.cs.proj.resize(static_cast<size_t>(cluster::kHashBlock * kPanel));
    codes[static_cast<size_t>(t)].resize(static_cast<size_t>(nl));
    if (nl > 0) cluster::hash_codes(in.q.ptr(b, h, 0), nl, in.q.stride(2), planes, codes[static_cast<size_t>(t)].data(), sc.cs.proj.data());
  });
  for (int64_t t = 0; t < BH; ++t) {
    const int64_t b = t / z.H;
    const int64_t nv = z.nv(in.query_lengths, b), mv = z.nv(in.key_lengths, b), nl = z.nloc(in.query_lengths, b);
    if (nv == 0 || mv == 0) continue;
    if (p.clusters >= nv) {  // every query its own cluster, numbered by position: exact attention
      st.ncl[static_cast<size_t>(t)] = static_cast<int32_t>(nv);
      for (int64_t i = 0; i < nl; ++i) st.assign[static_cast<size_t>(t * z.n + i)] = static_cast<int32_t>(z.a0 + i);
      std::fill(st.count.begin() + t * cmax, st.count.begin() + t * cmax + nv, 1);
      continue;
    }
    KmTask k;
    k.codes = codes[static_cast<size_t>(t)].data();
    k.nloc = nl;
    k.first = z.a0;
    k.nv = nv;
    k.stream = stream_of(step, 1, static_cast<uint64_t>(t));
    task_of[static_cast<size_t>(t)] = static_cast<int64_t>(tasks.size());
    tasks.push_back(std::move(k));
  }
  distributed_kmeans(comm, tasks, p.clusters, p.iterations, rng);
  for (int64_t t = 0; t < BH; ++t) {
    if (task_of[static_cast<size_t>(t)] < 0) continue;
    const KmTask& k = tasks[static_cast<size_t>(task_of[static_cast<size_t>(t)])];
    st.ncl[static_cast<size_t>(t)] = static_cast<int32_t>(k.ce);
    std::copy(k.assign.begin(), k.assign.end(), st.assign.begin() + t * z.n);
    std::copy(k.sizes.begin(), k.sizes.end(), st.count.begin() + t * cmax);
  }

  // 3. Centroids: member sums in position order, continued rank after rank.
  float* qc = st.qc.data();  // (BH, cmax, D)
  const size_t qcn = static_cast<size_t>(BH * cmax * D);
  if (r > 0) comm.irecv(qc, sizeof(float) * qcn, r - 1, kTagChain)->wait();
  parallel_for(BH, [&](int64_t t) {
    const int64_t b = t / z.H, h = t % z.H, nl = st.ncl[static_cast<size_t>(t)] > 0 ? z.nloc(in.query_lengths, b) : 0;
    for (int64_t i = 0; i < nl; ++i)
      simd::axpy_row(qc + (t * cmax + st.assign[static_cast<size_t>(t * z.n + i)]) * D, in.q.ptr(b, h, i), D);
  });
  if (r + 1 < R) comm.isend(qc, sizeof(float) * qcn, r + 1, kTagChain)->wait();
  if (r == R - 1)
    for (int64_t t = 0; t < BH; ++t)
      for (int64_t j = 0; j < st.ncl[static_cast<size_t>(t)]; ++j) {
        const int64_t cnt = st.count[static_cast<size_t>(t * cmax + j)];
        if (cnt > 0)
          for (int64_t e = 0; e < D; ++e) qc[(t * cmax + j) * D + e] /= static_cast<float>(cnt);
      }
  comm.broadcast(qc, sizeof(float) * qcn, R - 1);

  // 4. Each centroid's attention over the local valid keys: running max m (log2), sum l, Σ p·v,
  // and the local top-k candidates.
  std::vector<float> mloc(static_cast<size_t>(BH * cmax), -kInf), lloc(static_cast<size_t>(BH * cmax), 0.f);
  std::vector<float> vcl(static_cast<size_t>(BH * cmax * Dv), 0.f);
  const int64_t kcap = z.kmax;
  std::vector<Cand> tops(static_cast<size_t>(BH * cmax * std::max<int64_t>(kcap, 1)), Cand{-kInf, INT32_MAX});
  parallel_for(BH, [&](int64_t t, int thread) {
    const int64_t b = t / z.H, h = t % z.H, hk = h / z.G;
    const int64_t ce = st.ncl[static_cast<size_t>(t)], ml = z.nloc(in.key_lengths, b);
    if (ce == 0 || ml == 0) return;
    const int64_t k = improved ? std::min(p.topk, z.nv(in.key_lengths, b)) : 0;
    ThreadScratch& sc = ws.threads[static_cast<size_t>(thread)];
    const mk::RowsOperand vr = mk::rows_operand(in.v.ptr(b, hk, 0), ml, Dv, in.v.stride(2),
                                                sc.vr.floats(static_cast<size_t>(std::max<int64_t>(1, mk::rows_operand_size(ml, Dv)))));
    float* qcs = sc.a.floats(static_cast<size_t>(ce * D));       // (C, D) Qc·c
    float* kt = sc.kp.floats(static_cast<size_t>(kBc * D));      // (8, D, 64) a key tile, packed
    float* s = sc.b.floats(static_cast<size_t>(kCb * kBc));      // (Cb, Bc) scores, then P
    float* vc = sc.c.floats(static_cast<size_t>(ce * Dvp));      // (C, Dvp)
    float* alpha = sc.d.floats(static_cast<size_t>(ce));         // (C)
    float* m = mloc.data() + t * cmax;
    float* l = lloc.data() + t * cmax;
    if (improved) sc.cand.resize(static_cast<size_t>(ce * 2 * k));
    sc.ncand.assign(static_cast<size_t>(ce), 0);
    sc.thr.assign(static_cast<size_t>(ce), -kInf);
    mk::pack_rows(qc + t * cmax * D, ce, D, D, qcs, ce, D, c);
    std::memset(vc, 0, sizeof(float) * static_cast<size_t>(ce * Dvp));
    centroid_pass(in.k.ptr(b, hk, 0), in.k.stride(2), ml, D, vr.data, vr.ld, Dvp, qcs, 0, ce, m, l, alpha, vc, k,
                  z.a0, sc, kt, s);
    for (int64_t j = 0; j < ce; ++j) {
      std::memcpy(vcl.data() + (t * cmax + j) * Dv, vc + j * Dvp, sizeof(float) * static_cast<size_t>(Dv));
      if (!improved) continue;
      Cand* cand = sc.cand.data() + j * 2 * k;
      top_compact(cand, sc.ncand[static_cast<size_t>(j)], k);
      std::copy(cand, cand + sc.ncand[static_cast<size_t>(j)], tops.begin() + (t * cmax + j) * kcap);
    }
  });
  // ... merged across ranks by log-sum-exp.
  {
    std::vector<double> mg(mloc.begin(), mloc.end());
    comm.all_reduce_max(mg.data(), mg.size());
    for (size_t x = 0; x < mg.size(); ++x) {
      const float f = mloc[x] == -kInf ? 0.f : std::exp2(mloc[x] - static_cast<float>(mg[x]));
      lloc[x] *= f;
      for (int64_t e = 0; e < Dv; ++e) vcl[x * static_cast<size_t>(Dv) + static_cast<size_t>(e)] *= f;
      mloc[x] = static_cast<float>(mg[x]);
    }
    comm.all_reduce_sum(lloc.data(), lloc.size());
    comm.all_reduce_sum(vcl.data(), vcl.size());
  }
  float* vcg = st.vc.data();  // (BH, cmax, Dv): Vc_j, then R_j
  for (int64_t t = 0; t < BH; ++t)
    for (int64_t j = 0; j < st.ncl[static_cast<size_t>(t)]; ++j) {
      const size_t x = static_cast<size_t>(t * cmax + j);
      st.lse_c.data()[x] = (mloc[x] + std::log2(lloc[x])) * kLn2;
      const float inv = 1.f / lloc[x];
      for (int64_t e = 0; e < Dv; ++e) vcg[x * static_cast<size_t>(Dv) + static_cast<size_t>(e)] = vcl[x * static_cast<size_t>(Dv) + static_cast<size_t>(e)] * inv;
      st.mass.data()[x] = 0.f;
    }

  // 5. Improved: the global top-k of each centroid, and its rows from their owners.
  if (improved) {
    merge_candidates(comm, tops, kcap);  // (BH, cmax, kcap): every centroid's global best kcap
    st.topk.assign(static_cast<size_t>(BH * cmax * kcap), -1);
    st.krows.resize(Shape{BH, cmax * kcap, D});
    st.vrows.resize(Shape{BH, cmax * kcap, Dv});
    std::fill(st.krows.data(), st.krows.data() + st.krows.numel(), 0.f);
    std::fill(st.vrows.data(), st.vrows.data() + st.vrows.numel(), 0.f);
    std::vector<std::vector<Cand>> chosen(static_cast<size_t>(BH * cmax));
    for (int64_t t = 0; t < BH; ++t) {
      const int64_t b = t / z.H, mv = z.nv(in.key_lengths, b);
      const int64_t k = std::min(p.topk, mv);
      st.ksel[static_cast<size_t>(t)] = static_cast<int32_t>(k);
      for (int64_t j = 0; j < st.ncl[static_cast<size_t>(t)]; ++j) {
        std::vector<Cand>& ch = chosen[static_cast<size_t>(t * cmax + j)];
        const Cand* c0 = tops.data() + static_cast<size_t>((t * cmax + j) * kcap);
        for (int64_t x = 0; x < kcap; ++x)
          if (c0[x].i != INT32_MAX) ch.push_back(c0[x]);
        std::sort(ch.begin(), ch.end(), cand_before);
        ch.resize(static_cast<size_t>(k));
        int64_t* tk = st.topk.data() + (t * cmax + j) * kcap;
        for (int64_t x = 0; x < k; ++x) tk[x] = ch[static_cast<size_t>(x)].i;
        std::sort(tk, tk + k);
      }
    }
    // Each chosen row travels once, from the rank that owns it. Every rank knows every centroid's
    // top-k, so every rank knows who sends which rows and in which order: each packs its own rows
    // in (head, centroid, slot) order, one all-gather delivers them, and each unpacks in the same
    // order. (The sum of zero-filled tables over the ranks moved each table 2(R−1)/R times.)
    auto owner = [&](int64_t g) {  // the contiguous split: rank q holds [first_q, first_q + len_q)
      int q = 0;
      while (q + 1 < R && g >= split.segments[static_cast<size_t>(q + 1)][0].first) ++q;
      return q;
    };
    const size_t row = static_cast<size_t>(D + Dv);
    std::vector<size_t> counts(static_cast<size_t>(R), 0), displs(static_cast<size_t>(R), 0);
    std::vector<float> mine;  // (rows this rank owns, D + Dv) k | v
    for (int64_t t = 0; t < BH; ++t) {
      const int64_t b = t / z.H, hk = (t % z.H) / z.G, k = st.ksel[static_cast<size_t>(t)];
      for (int64_t j = 0; j < st.ncl[static_cast<size_t>(t)]; ++j) {
        const int64_t* tk = st.topk.data() + (t * cmax + j) * kcap;
        for (int64_t x = 0; x < k; ++x) {
          const int64_t g = tk[x];
          const int q = owner(g);
          counts[static_cast<size_t>(q)] += row * sizeof(float);
          if (q != comm.rank()) continue;
          mine.insert(mine.end(), in.k.ptr(b, hk, g - z.a0), in.k.ptr(b, hk, g - z.a0) + D);
          mine.insert(mine.end(), in.v.ptr(b, hk, g - z.a0), in.v.ptr(b, hk, g - z.a0) + Dv);
        }
      }
    }
    for (int q = 1; q < R; ++q) displs[static_cast<size_t>(q)] = displs[static_cast<size_t>(q - 1)] + counts[static_cast<size_t>(q - 1)];
    std::vector<float> rows((displs.back() + counts.back()) / sizeof(float));  // every owner's pack, by rank
    comm.iall_gatherv(mine.data(), sizeof(float) * mine.size(), rows.data(), counts, displs)->wait();
    std::vector<size_t> at(static_cast<size_t>(R));
    for (int q = 0; q < R; ++q) at[static_cast<size_t>(q)] = displs[static_cast<size_t>(q)] / sizeof(float);
    for (int64_t t = 0; t < BH; ++t) {
      const int64_t k = st.ksel[static_cast<size_t>(t)];
      for (int64_t j = 0; j < st.ncl[static_cast<size_t>(t)]; ++j) {
        const int64_t* tk = st.topk.data() + (t * cmax + j) * kcap;
        for (int64_t x = 0; x < k; ++x) {
          size_t& src = at[static_cast<size_t>(owner(tk[x]))];
          const int64_t slot = t * cmax * kcap + j * kcap + x;
          std::memcpy(st.krows.data() + slot * D, rows.data() + src, sizeof(float) * static_cast<size_t>(D));
          std::memcpy(st.vrows.data() + slot * Dv, rows.data() + src + static_cast<size_t>(D), sizeof(float) * static_cast<size_t>(Dv));
          src += row;
        }
      }
    }
    // m_j and R_j = Vc_j − Σ_{T_j} A_jl v_l, in the candidates' order as clustered.cpp.
    for (int64_t t = 0; t < BH; ++t) {
      const int64_t b = t / z.H, mv = z.nv(in.key_lengths, b), k = st.ksel[static_cast<size_t>(t)];
      for (int64_t j = 0; j < st.ncl[static_cast<size_t>(t)]; ++j) {
        const size_t x0 = static_cast<size_t>(t * cmax + j);
        float* res = vcg + x0 * static_cast<size_t>(Dv);
        if (k == mv) {  // T_j holds every key: m_j = 1, R_j = 0 exactly
          st.mass.data()[x0] = 1.f;
          std::fill(res, res + Dv, 0.f);
          continue;
        }
        const float lse2 = st.lse_c.data()[x0] * kLog2e;
        const int64_t* tk = st.topk.data() + (t * cmax + j) * kcap;
        double msum = 0;
        for (const Cand& cd : chosen[x0]) {
          const int64_t slot = std::lower_bound(tk, tk + k, static_cast<int64_t>(cd.i)) - tk;
          const float a = tile::prob(cd.v, lse2);  // clamped at 1, as one process
          msum += a;
          simd::axpy_row(res, st.vrows.data() + (t * cmax * kcap + j * kcap + slot) * Dv, Dv, -a);
        }
        st.mass.data()[x0] = static_cast<float>(msum);
      }
    }
  }

  // 6. The members.
  for (int64_t t = 0; t < BH; ++t) {
    const int64_t b = t / z.H, h = t % z.H, nl = st.ncl[static_cast<size_t>(t)] > 0 ? z.nloc(in.query_lengths, b) : 0;
    for (int64_t i = nl; i < z.n; ++i) std::memset(out.ptr(b, h, i), 0, sizeof(float) * static_cast<size_t>(Dv));
    if (!improved)
      for (int64_t i = 0; i < nl; ++i)
        std::memcpy(out.ptr(b, h, i), vcg + (t * cmax + st.assign[static_cast<size_t>(t * z.n + i)]) * Dv,
                    sizeof(float) * static_cast<size_t>(Dv));
  }
  if (!improved) return;
  // The member stage of improved_clustered.cpp over the local members and the gathered rows:
  // T_j's rows sit at j·kmax .. j·kmax + k − 1 of the task's gathered rows, in key order.
  ClusteredState& ms = st.members;
  ms.cmax = cmax;
  ms.kmax = kcap;
  ms.nclusters = st.ncl;
  ms.ksel = st.ksel;
  ms.order.assign(static_cast<size_t>(BH * z.n), 0);
  ms.offsets.assign(static_cast<size_t>(BH * (cmax + 1)), 0);
  ms.topk_idx.assign(static_cast<size_t>(BH * cmax * kcap), 0);
  ms.mass = Tensor::from(st.mass.view());
  ms.resid.resize(Shape{z.B, z.H, cmax, Dv});
  std::memcpy(ms.resid.data(), vcg, sizeof(float) * static_cast<size_t>(BH * cmax * Dv));
  ms.lse_m.resize(Shape{z.B, z.H, z.n});
  const AttentionDims dm{z.B, z.H, z.Hkv, z.n, cmax * kcap, D, Dv};
  parallel_for(BH, [&](int64_t t, int thread) {
    const int64_t b = t / z.H, h = t % z.H, ce = st.ncl[static_cast<size_t>(t)];
    if (ce == 0) return;
    const int64_t nl = z.nloc(in.query_lengths, b);
    cluster::counting_sort(st.assign.data() + t * z.n, nl, ce, ms.order.data() + t * z.n, ms.offsets.data() + t * (cmax + 1));
    for (int64_t j = 0; j < ce; ++j)
      for (int64_t x = 0; x < kcap; ++x) ms.topk_idx[static_cast<size_t>((t * cmax + j) * kcap + x)] = static_cast<int32_t>(j * kcap + x);
    AttentionInputs mi;
    mi.q = in.q;
    mi.k = gathered(st.krows.data() + t * cmax * kcap * D, cmax * kcap, D);
    mi.v = gathered(st.vrows.data() + t * cmax * kcap * Dv, cmax * kcap, Dv);
    improved_members_fwd(mi, dm, b, h, scale, ms, out, ws.threads[static_cast<size_t>(thread)], 0, ce);
  });
}

void clustered_backward(Communicator& comm, const SeqSplit& split, const ClusteredParams& p,
                        const AttentionInputs& in, ConstView /*out*/, const ClusteredSplitState& st, ConstView dout, View dq, View dk,
                        View dv, Scratch& scratch) {
  const Sizes z = sizes_of(comm, split, p, in);
  const int64_t BH = z.B * z.H, D = z.Dk, Dv = z.Dv, cmax = st.cmax, kcap = st.kmax;
  const int64_t Dkp = round_up(D, mk::kLanes), Dvp = round_up(Dv, mk::kLanes);
  const float scale = softmax_scale(p.scale, D), c = scale * kLog2e;
  const bool improved = p.topk > 0;
  ClusteredWorkspace& ws = scratch.get<ClusteredWorkspace>();
  ws.ensure_threads();
  // G_j = Σ_members dO_i, over all ranks.
  std::vector<float> gsum(static_cast<size_t>(BH * cmax * Dv), 0.f);
  parallel_for(BH, [&](int64_t t) {
    const int64_t b = t / z.H, h = t % z.H, nl = st.ncl[static_cast<size_t>(t)] > 0 ? z.nloc(in.query_lengths, b) : 0;
    for (int64_t i = 0; i < nl; ++i)
      simd::axpy_row(gsum.data() + (t * cmax + st.assign[static_cast<size_t>(t * z.n + i)]) * Dv, dout.ptr(b, h, i), Dv);
  });
  comm.all_reduce_sum(gsum.data(), gsum.size());
  // Improved: the member stage's exact backward on the gathered rows; its ∂/∂m_j added across ranks.
  std::vector<float> dm(static_cast<size_t>(BH * cmax), 0.f);
  std::vector<float> grows;  // (BH, cmax·kmax, Dkp + Dvp) gradients of the gathered T_j rows
  if (improved) {
    grows.assign(static_cast<size_t>(BH * cmax * kcap * (Dkp + Dvp)), 0.f);
    const AttentionDims dmm{z.B, z.H, z.Hkv, z.n, cmax * kcap, D, Dv};
    parallel_for(BH, [&](int64_t t, int thread) {
      const int64_t b = t / z.H, h = t % z.H;
      if (st.ncl[static_cast<size_t>(t)] == 0) return;
      AttentionInputs mi;
      mi.q = in.q;
      mi.k = gathered(st.krows.data() + t * cmax * kcap * D, cmax * kcap, D);
      mi.v = gathered(st.vrows.data() + t * cmax * kcap * Dv, cmax * kcap, Dv);
      const KeyGrads kg{grows.data() + t * cmax * kcap * (Dkp + Dvp), Dkp + Dvp, View{}, View{}, 0, 0, Dkp};
      improved_members_bwd(mi, dmm, b, h, scale, st.members, dout, dq, kg, dm.data() + t * cmax,
                           ws.threads[static_cast<size_t>(thread)], 0, cmax, nullptr);
    });
    comm.all_reduce_sum(dm.data(), dm.size());
    comm.all_reduce_sum(grows.data(), grows.size());
  }
  // Through Ac over the local keys (clustered.cpp's backward), ∂Qc added across ranks. Tasks of
  // one key head run in turn: they add to the same dk, dv rows.
  std::vector<float> dqc(static_cast<size_t>(BH * cmax * Dkp), 0.f);
  parallel_for(z.B * z.Hkv, [&](int64_t g, int thread) {
    const int64_t b = g / z.Hkv, hk = g % z.Hkv, ml = z.nloc(in.key_lengths, b);
    if (ml == 0) return;
    ThreadScratch& sc = ws.threads[static_cast<size_t>(thread)];
    const int64_t np = (ml + kPanel - 1) / kPanel, Mp = np * kPanel;
    float* kpan = sc.kt.floats(static_cast<size_t>(Mp * D));     // (np, D, 64)
    float* vpan = sc.vt.floats(static_cast<size_t>(Mp * Dv));    // (np, Dv, 64)
    float* krow = sc.ktr.floats(static_cast<size_t>(Mp * Dkp));  // (Mp, Dkp)
    mk::pack_panels(in.k.ptr(b, hk, 0), ml, D, in.k.stride(2), kpan);
    mk::pack_panels(in.v.ptr(b, hk, 0), ml, Dv, in.v.stride(2), vpan);
    mk::pack_rows(in.k.ptr(b, hk, 0), ml, D, in.k.stride(2), krow, Mp, Dkp);
    for (int64_t h = hk * z.G; h < (hk + 1) * z.G; ++h) {
      const int64_t t = b * z.H + h, ce = st.ncl[static_cast<size_t>(t)];
      if (ce == 0) continue;
      const float* qcg = st.qc.data() + t * cmax * D;
      const float* lse_c = st.lse_c.data() + t * cmax;
      const float* resid = st.vc.data() + t * cmax * Dv;
      const float* mass = st.mass.data() + t * cmax;
      const float* gs = gsum.data() + t * cmax * Dv;
      const int64_t k = st.ksel[static_cast<size_t>(t)];
      std::vector<float> delta(static_cast<size_t>(ce));
      for (int64_t j = 0; j < ce; ++j) {
        float x = mass[j] * dm[static_cast<size_t>(t * cmax + j)];
        for (int64_t e = 0; e < Dv; ++e) x += gs[j * Dv + e] * resid[j * Dv + e];
        delta[static_cast<size_t>(j)] = x;
      }
      float* gsp = sc.e.floats(static_cast<size_t>(ce * Dvp));       // (C, Dvp) G padded
      float* qcs = sc.a.floats(static_cast<size_t>(kCb * Dkp));      // (Cb, Dkp) Qc·c
      float* a = sc.b.floats(static_cast<size_t>(kCb * kBc));        // (Cb, Bc) A, then A off T
      float* da = sc.c.floats(static_cast<size_t>(kCb * kBc));       // (Cb, Bc) dA, then dS
      float* dkacc = sc.h.floats(static_cast<size_t>(kBc * Dkp));    // (Bc, Dkp)
      float* dvacc = sc.i.floats(static_cast<size_t>(kBc * Dvp));    // (Bc, Dvp)
      float* dq_t = dqc.data() + t * cmax * Dkp;
      mk::pack_rows(gs, ce, Dv, Dv, gsp, ce, Dvp);
      std::vector<int64_t>& cursor = sc.cursor;
      cursor.assign(static_cast<size_t>(ce), 0);
      for (int64_t k0 = 0; k0 < ml; k0 += kBc) {
        const int64_t bc = std::min(kBc, ml - k0), npan = (bc + kPanel - 1) / kPanel, width = npan * kPanel;
        std::memset(dkacc, 0, sizeof(float) * static_cast<size_t>(width * Dkp));
        std::memset(dvacc, 0, sizeof(float) * static_cast<size_t>(width * Dvp));
        for (int64_t j0 = 0; j0 < ce; j0 += kCb) {
          const int64_t rows = std::min(kCb, ce - j0);
          mk::pack_rows(qcg + j0 * D, rows, D, D, qcs, rows, Dkp, c);
          mk::gemm_abt(rows, npan, D, qcs, Dkp, kpan + k0 * D, a, kBc);
          for (int64_t x = 0; x < rows; ++x) {
            float* row = a + x * kBc;
            tile::mask_tail(row, width, bc);
            tile::prob_row(row, width, lse_c[j0 + x] * kLog2e);
          }
          mk::gemm_abt(rows, npan, Dv, gsp + j0 * Dvp, Dvp, vpan + k0 * Dv, da, kBc);
          for (int64_t x = 0; x < rows; ++x) {
            const int64_t j = j0 + x;
            float* ar = a + x * kBc;
            float* dr = da + x * kBc;
            const int64_t* tk = improved ? st.topk.data() + (t * cmax + j) * kcap : nullptr;
            // T_j keys in this tile (global positions z.a0 + k0 .. + bc): dA there is dm_j, and A
            // loses them (they reach V through the member stage).
            int64_t& cur = cursor[static_cast<size_t>(j)];
            if (improved)
              for (; cur < k && tk[cur] < z.a0 + k0 + bc; ++cur)
                if (tk[cur] >= z.a0 + k0) dr[tk[cur] - z.a0 - k0] = dm[static_cast<size_t>(t * cmax + j)];
            const simd::vf dj = simd::splat(delta[static_cast<size_t>(j)]), sv = simd::splat(scale);
            for (int64_t y = 0; y < width; y += simd::kLanes)
              simd::store(dr + y, simd::load(ar + y) * (simd::load(dr + y) - dj) * sv);
            if (improved)
              for (int64_t y = cur - 1; y >= 0 && tk[y] >= z.a0 + k0; --y)
                if (tk[y] < z.a0 + k0 + bc) ar[tk[y] - z.a0 - k0] = 0.f;
          }
          mk::gemm_ab(width, Dvp, rows, a, 1, kBc, gsp + j0 * Dvp, Dvp, dvacc, Dvp, nullptr);
          mk::gemm_ab(rows, Dkp, width, da, kBc, 1, krow + k0 * Dkp, Dkp, dq_t + j0 * Dkp, Dkp, nullptr);
          mk::gemm_ab(width, Dkp, rows, da, 1, kBc, qcs, Dkp, dkacc, Dkp, nullptr);
        }
        const float inv_c = 1.f / c;
        for (int64_t x = 0; x < bc; ++x) {
          simd::axpy_row(dk.ptr(b, hk, k0 + x), dkacc + x * Dkp, D, inv_c);
          simd::axpy_row(dv.ptr(b, hk, k0 + x), dvacc + x * Dvp, Dv);
        }
      }
    }
  });
  comm.all_reduce_sum(dqc.data(), dqc.size());
  // Qc_j = mean of its members -> dq_i += dQc_j / |j| ; the T_j rows this rank owns get theirs.
  parallel_for(BH, [&](int64_t t) {
    const int64_t b = t / z.H, h = t % z.H, nl = st.ncl[static_cast<size_t>(t)] > 0 ? z.nloc(in.query_lengths, b) : 0;
    for (int64_t i = 0; i < nl; ++i) {
      const int64_t j = st.assign[static_cast<size_t>(t * z.n + i)];
      simd::axpy_row(dq.ptr(b, h, i), dqc.data() + (t * cmax + j) * Dkp, D,
                     1.f / static_cast<float>(st.count[static_cast<size_t>(t * cmax + j)]));
    }
  });
  if (!improved) return;
  for (int64_t g = 0; g < z.B * z.Hkv; ++g) {
    const int64_t b = g / z.Hkv, hk = g % z.Hkv;
    for (int64_t h = hk * z.G; h < (hk + 1) * z.G; ++h) {
      const int64_t t = b * z.H + h;
      for (int64_t j = 0; j < st.ncl[static_cast<size_t>(t)]; ++j)
        for (int64_t x = 0; x < st.ksel[static_cast<size_t>(t)]; ++x) {
          const int64_t pos = st.topk[static_cast<size_t>((t * cmax + j) * kcap + x)];
          if (pos < z.a0 || pos >= z.a0 + z.n) continue;
          const float* gr = grows.data() + (t * cmax * kcap + j * kcap + x) * (Dkp + Dvp);
          simd::axpy_row(dk.ptr(b, hk, pos - z.a0), gr, D);
          simd::axpy_row(dv.ptr(b, hk, pos - z.a0), gr + Dkp, Dv);
        }
    }
  }
}

}  // namespace clattn::sp
