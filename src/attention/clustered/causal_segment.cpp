// The stages of causal clustered attention that a prefill and a decoding cache share
// (causal_internal.h): a segment's clusters, the running centroid attention with its snapshots at
// block ends, and the member stage of one block.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "attention/clustered/causal_internal.h"
#include "attention/tile/gather.h"
#include "attention/tile/tile_ops.h"
#include "core/simd.h"

namespace clattn::causal {

using mk::kPanel;
using mk::round_up;
using tile::kInf;
using tile::kLn2;

KeyOperands cache_operands(const KVCache& kc, int64_t b, int64_t hk) {
  if (kc.type() == KVCacheType::f32) return KeyOperands{kc.key_panels(b, hk), kc.value_rows(b, hk), kc.value_ld()};
  KeyOperands ko;
  ko.vld = kc.value_ld();
  ko.kpan16 = kc.key_panels16(b, hk);
  ko.vrow16 = kc.value_rows16(b, hk);
  ko.krow16 = kc.keeps_queries() ? kc.key_rows16(b, hk) : nullptr;
  ko.kld = kc.key_ld();
  ko.half = kc.type() == KVCacheType::bf16 ? mk::Half::bf16 : mk::Half::f16;
  return ko;
}

int64_t segment_clusters(const float* qdef, int64_t np, int64_t ldq, int64_t D,
                         const ClusteredParams& p, const cluster::LshPlanes& planes, const Rng& rng,
                         uint64_t kstream, int32_t* assign, float* qc, ClusterScratch& cs) {
  const int64_t ce0 = assign_clusters(qdef, np, ldq, p, planes, rng, kstream, assign, cs);
  // Two centroid codes can meet in the last round and leave one without members: drop such
  // clusters (renumbered in order), so every centroid is the mean of at least one query.
  std::vector<int32_t>& remap = cs.assign;
  remap.assign(static_cast<size_t>(ce0), -1);
  for (int64_t x = 0; x < np; ++x) remap[static_cast<size_t>(assign[x])] = 0;
  int64_t ce = 0;
  for (int32_t& r : remap)
    if (r == 0) r = static_cast<int32_t>(ce++);
  std::vector<float>& count = cs.proj;
  count.assign(static_cast<size_t>(ce), 0.f);
  std::fill(qc, qc + ce * D, 0.f);
  for (int64_t x = 0; x < np; ++x) {
    const int32_t j = remap[static_cast<size_t>(assign[x])];
    assign[x] = j;
    simd::axpy_row(qc + j * D, qdef + x * ldq, D);
    count[static_cast<size_t>(j)] += 1.f;
  }
  for (int64_t j = 0; j < ce; ++j) {
    const float inv = 1.f / count[static_cast<size_t>(j)];
    for (int64_t e = 0; e < D; ++e) qc[j * D + e] *= inv;
  }
  return ce;
}

void pack_centroids(const float* qc, int64_t ce, int64_t D, std::vector<float>& norms, Workspace& pan) {
  norms.resize(static_cast<size_t>(ce));
  for (int64_t j = 0; j < ce; ++j) norms[static_cast<size_t>(j)] = simd::dot(qc + j * D, qc + j * D, D);
  mk::pack_panels(qc, ce, D, D, pan.floats(static_cast<size_t>(round_up(ce, kPanel) * D)));
}

void nearest_centroids(const float* q, int64_t n, int64_t ldq, int64_t D, const float* qcpan,
                       const float* norms, int64_t ce, int32_t* out, Workspace& ws) {
  const int64_t npan = (ce + kPanel - 1) / kPanel, w = npan * kPanel;
  float* scratch = ws.floats(static_cast<size_t>(kPanel * w));  // (64, w) q·qcᵀ
  for (int64_t r0 = 0; r0 < n; r0 += kPanel) {
    const int64_t rows = std::min<int64_t>(kPanel, n - r0);
    mk::gemm_abt(rows, npan, D, q + r0 * ldq, ldq, qcpan, scratch, w);
    for (int64_t r = 0; r < rows; ++r) {
      const float* s = scratch + r * w;
      int64_t best = 0;
      float bd = kInf;
      for (int64_t j = 0; j < ce; ++j) {
        const float dist = norms[j] - 2.f * s[j];
        if (dist < bd) bd = dist, best = j;
      }
      out[r0 + r] = static_cast<int32_t>(best);
    }
  }
}

void Stream::reset(const float* qc, int64_t ce_, int64_t D_, int64_t Dv_, int64_t topk_, float c) {
  ce = ce_, D = D_, Dv = Dv_, topk = topk_, pos = 0;
  qcs.resize(static_cast<size_t>(ce * D));
  for (int64_t x = 0; x < ce * D; ++x) qcs[static_cast<size_t>(x)] = qc[x] * c;
  m.assign(static_cast<size_t>(ce), -kInf);
  l.assign(static_cast<size_t>(ce), 0.f);
  const int64_t Dvp = round_up(Dv, mk::kLanes);
  std::memset(acc.floats(static_cast<size_t>(std::max<int64_t>(1, ce * Dvp))), 0,
              sizeof(float) * static_cast<size_t>(ce * Dvp));
  if (topk > 0) {
    cand.resize(static_cast<size_t>(ce * 2 * topk));
    ncand.assign(static_cast<size_t>(ce), 0);
    thr.assign(static_cast<size_t>(ce), -kInf);
  }
}

void Stream::advance_rows(int64_t j0, int64_t to, const KeyOperands& ko, float* accp, float* sc /* (Cb, Bc) scores, then P */) {
  const int64_t Dvp = round_up(Dv, mk::kLanes), rows = std::min(kCb, ce - j0);
  float* a = accp + j0 * Dvp;  // (rows, Dvp)
  float alpha[kCb];
  for (int64_t k0 = pos; k0 < to;) {
    // Keys [k0, k1) in the panels from a0 (a multiple of 64); keys before k0 are masked.
    const int64_t k1 = std::min(to, (k0 / kBc + 1) * kBc), a0 = k0 / kPanel * kPanel;
    const int64_t npan = (k1 - a0 + kPanel - 1) / kPanel, width = npan * kPanel;
    if (ko.is16()) mk::gemm_abt16(ko.half, rows, npan, D, qcs.data() + j0 * D, D, ko.kpan16 + a0 * D, sc, kBc);
    else mk::gemm_abt(rows, npan, D, qcs.data() + j0 * D, D, ko.kpan + a0 * D, sc, kBc);
    for (int64_t x = 0; x < rows; ++x) {
      const int64_t j = j0 + x;
      float* row = sc + x * kBc;
      std::fill(row, row + (k0 - a0), -kInf);
      tile::mask_tail(row, width, k1 - a0);
      if (topk > 0)
        top_scan(row, width, a0, cand.data() + j * 2 * topk, ncand[static_cast<size_t>(j)], thr[static_cast<size_t>(j)],
                 topk);
      alpha[x] = tile::online_softmax_row(row, width, m[static_cast<size_t>(j)], l[static_cast<size_t>(j)]);
    }
    // Acc = diag(alpha)·Acc + P·V
    if (ko.is16()) mk::gemm_ab16(ko.half, rows, Dvp, k1 - a0, sc, kBc, 1, ko.vrow16 + a0 * ko.vld, ko.vld, a, Dvp, alpha);
    else mk::gemm_ab(rows, Dvp, k1 - a0, sc, kBc, 1, ko.vrow + a0 * ko.vld, ko.vld, a, Dvp, alpha);
    k0 = k1;
  }
}

void Stream::advance(int64_t to, const KeyOperands& ko, float* tile) {
  if (to <= pos) return;
  float* a = acc.floats(static_cast<size_t>(std::max<int64_t>(1, ce * round_up(Dv, mk::kLanes))));  // (ce, Dvp)
  for (int64_t j0 = 0; j0 < ce; j0 += kCb) advance_rows(j0, to, ko, a, tile);
  pos = to;
}

void Stream::advance_over_team(int64_t to, const KeyOperands& ko, std::vector<CausalThread>& team) {
  if (to <= pos) return;
  float* a = acc.floats(static_cast<size_t>(std::max<int64_t>(1, ce * round_up(Dv, mk::kLanes))));  // (ce, Dvp)
  // A centroid's state depends on its own row only, and the blocks are those of advance().
  parallel_for((ce + kCb - 1) / kCb, [&](int64_t blk, int thread) {
    advance_rows(blk * kCb, to, ko, a, team[static_cast<size_t>(thread)].tile.floats(static_cast<size_t>(kCb * kBc)));
  });
  pos = to;
}

int64_t snapshot_lse(const Stream& st, const Snapshot& out) {
  for (int64_t j = 0; j < st.ce; ++j)
    out.lse_c[j] = (st.m[static_cast<size_t>(j)] + std::log2(st.l[static_cast<size_t>(j)])) * kLn2;
  return st.topk > 0 ? std::min(st.topk, st.pos) : 0;
}

void select_topk(Stream& st, int64_t j, const Snapshot& out) {
  if (st.topk == 0) return;
  // Keep the topk best so far (the running threshold goes on from there), in key order.
  Cand* cd = st.cand.data() + j * 2 * st.topk;
  int64_t& n = st.ncand[static_cast<size_t>(j)];
  st.thr[static_cast<size_t>(j)] = top_compact(cd, n, st.topk);
  std::sort(cd, cd + n, [](const Cand& x, const Cand& y) { return x.i < y.i; });
  int32_t* tk = out.topk + j * out.kmax;
  for (int64_t x = 0; x < n; ++x) tk[x] = cd[x].i;
}

namespace {

// T_j's rows of a 16-bit cache, as bits: K_Tᵀ (D, kw) and V_T (kw, Dvp), padding zero. The bits
// are copied, not widened: the member products widen them in registers as the f32 path reads its
// gathered floats, so both compute on the same values.
void gather16(const KeyOperands& ko, const int32_t* tk, int64_t k, int64_t D, int64_t Dvp, int64_t kw,
              MemberScratch& sc) {
  sc.kt16.assign(static_cast<size_t>(D * kw), 0);
  sc.vt16.resize(static_cast<size_t>(kw * Dvp));
  for (int64_t x = 0; x < k; ++x) {
    const uint16_t* kr = ko.krow16 + tk[x] * ko.kld;
    for (int64_t e = 0; e < D; ++e) sc.kt16[static_cast<size_t>(e * kw + x)] = kr[e];
    std::memcpy(sc.vt16.data() + x * Dvp, ko.vrow16 + tk[x] * ko.vld, sizeof(uint16_t) * static_cast<size_t>(Dvp));
  }
  std::fill(sc.vt16.begin() + k * Dvp, sc.vt16.end(), uint16_t{0});
  sc.half = true;
  sc.hf = ko.half;
}

}  // namespace

void finish_cluster(const Stream& st, int64_t j, int64_t k, ConstView kh, ConstView vh, const KeyOperands& ko,
                    const Snapshot& out, const int32_t* next, MemberScratch& sc) {
  const int64_t P = st.pos, D = st.D, Dv = st.Dv, Dvp = round_up(Dv, mk::kLanes);
  float* res = out.resid + j * Dv;
  const float* a = st.acc.data() + j * Dvp;
  const float inv = 1.f / st.l[static_cast<size_t>(j)];
  for (int64_t e = 0; e < Dv; ++e) res[e] = a[e] * inv;  // Vc_j
  sc.half = false;
  if (st.topk == 0) return;
  const int32_t* tk = out.topk + j * out.kmax;
  const int64_t kw = round_up(k, mk::kLanes);
  if (ko.is16()) {
    gather16(ko, tk, k, D, Dvp, kw, sc);
    if (k == P) {
      out.mass[j] = 1.f;
      std::fill(res, res + Dv, 0.f);
      return;
    }
    // m_j and R_j = Vc_j − Σ_T A_jl v_l as one (1, k)·(k, Dvp) product over the 16-bit rows,
    // accumulated in key order as the f32 path's row updates.
    const Cand* cd = st.cand.data() + j * 2 * st.topk;
    const float lse2 = out.lse_c[j] * tile::kLog2e;
    float* w = sc.tmp.floats(static_cast<size_t>(k + Dvp));  // (k) −A_jl, then (Dvp) R_j
    float* r = w + k;
    double msum = 0;
    for (int64_t x = 0; x < k; ++x) {
      const float p = tile::prob(cd[x].v, lse2);
      msum += p;
      w[x] = -p;
    }
    std::copy(res, res + Dv, r);
    std::fill(r + Dv, r + Dvp, 0.f);
    mk::gemm_ab16(ko.half, 1, Dvp, k, w, k, 1, sc.vt16.data(), Dvp, r, Dvp, nullptr);
    std::copy(r, r + Dv, res);
    out.mass[j] = static_cast<float>(msum);
    return;
  }
  float* ktt = sc.kt.floats(static_cast<size_t>(D * kw));   // (D, kw) K_Tᵀ
  float* vt = sc.vt.floats(static_cast<size_t>(kw * Dvp));  // (kw, Dvp) V_T
  const gather::Ahead ahead{next, next ? k : 0};
  gather::transposed(kh.data, kh.stride(2), tk, k, D, ktt, kw, ahead);
  gather::rows(vh.data, vh.stride(2), tk, k, Dv, vt, Dvp, kw, 1.f, ahead);
  if (k == P) {  // T_j is the whole prefix: m_j = 1, R_j = 0 exactly
    out.mass[j] = 1.f;
    std::fill(res, res + Dv, 0.f);
    return;
  }
  // m_j = Σ_T A_jl ; R_j = Vc_j − Σ_T A_jl v_l, from the rows just gathered (candidates in key
  // order, as tk).
  const Cand* cd = st.cand.data() + j * 2 * st.topk;
  const float lse2 = out.lse_c[j] * tile::kLog2e;
  double msum = 0;
  for (int64_t x = 0; x < k; ++x) {
    const float w = tile::prob(cd[x].v, lse2);
    msum += w;
    simd::axpy_row(res, vt + x * Dvp, Dv, -w);
  }
  out.mass[j] = static_cast<float>(msum);
}

void cluster_members_fwd(const AttentionInputs& in, int64_t b, int64_t h, int64_t ra, const int32_t* mi,
                         int64_t n, int64_t j, int64_t k, bool improved, const Snapshot& snap,
                         const float* inl, float c, View out, float* lzp, float* alpha, MemberScratch& sc) {
  const int64_t D = in.q.dim(3), Dv = in.v.dim(3), Dvp = round_up(Dv, mk::kLanes);
  // Improved: up to 64 members at once against T_j's rows (S = Q_m·K_Tᵀ, U = P·V_T as small tile
  // products). A member's row of each product depends only on its own query (the products
  // accumulate over depth in a fixed order), so later members change nothing before them.
  const int64_t kw = round_up(std::max<int64_t>(k, 1), mk::kLanes);
  const float* ktt = sc.kt.data();                         // (D, kw) K_Tᵀ
  const float* vt = sc.vt.data();                          // (kw, Dvp) V_T
  float* qm = sc.qm.floats(static_cast<size_t>(kMb * D));     // (Mb, D) c·Q
  float* sm = sc.sm.floats(static_cast<size_t>(kMb * kw));    // (Mb, kw) S, then P
  float* um = sc.um.floats(static_cast<size_t>(kMb * Dvp));   // (Mb, Dvp) P·V_T
  float* lzr = sc.tmp.floats(static_cast<size_t>(kMb));       // (Mb) log Z_pre
  const float mj = snap.mass[j], lm = improved ? std::log(mj) : 0.f;
  const float* rj = snap.resid + j * Dv;
  for (int64_t y0 = 0; y0 < n; y0 += kMb) {
    const int64_t rows = std::min<int64_t>(kMb, n - y0);
    if (improved) {
      for (int64_t r = 0; r < rows; ++r) simd::copy_row(qm + r * D, in.q.ptr(b, h, ra + mi[y0 + r]), D, D, c);
      std::memset(sm, 0, sizeof(float) * static_cast<size_t>(rows * kw));
      if (sc.half) mk::gemm_ab16(sc.hf, rows, kw, D, qm, D, 1, sc.kt16.data(), kw, sm, kw, nullptr);
      else mk::gemm_ab(rows, kw, D, qm, D, 1, ktt, kw, sm, kw, nullptr);
      tile::softmax_rows(sm, rows, kw, k, lzr);
      for (int64_t r = 0; r < rows; ++r) lzr[r] = lzr[r] * kLn2 - lm;  // log Z_pre = lse_T − log m_j
      std::memset(um, 0, sizeof(float) * static_cast<size_t>(rows * Dvp));
      if (sc.half) mk::gemm_ab16(sc.hf, rows, Dvp, kw, sm, kw, 1, sc.vt16.data(), Dvp, um, Dvp, nullptr);
      else mk::gemm_ab(rows, Dvp, kw, sm, kw, 1, vt, Dvp, um, Dvp, nullptr);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = ra + mi[y0 + r];
      // O_pre = m_j·u + R_j (improved) or Vc_j; blended with the in-block part by log-sum-exp.
      // The shares of the two parts, wp = Z_pre / (Z_pre + Z_in) and wi = 1 − wp, from one
      // exponential of their log-ratio (each from its own formula, so neither loses digits).
      const float lz = improved ? lzr[r] : snap.lse_c[j], li = inl[i];
      float wp = 1.f, wi = 0.f;
      if (li != -kInf) {
        const float dl = lz - li, e = std::exp(-std::abs(dl)), inv = 1.f / (1.f + e);
        wp = dl >= 0.f ? inv : e * inv;
        wi = dl >= 0.f ? e * inv : inv;
      }
      float* o = out.ptr(b, h, i);
      if (improved) {
        const float* u = um + r * Dvp;
        const float wm = wp * mj;
        for (int64_t e = 0; e < Dv; ++e) o[e] = wm * u[e] + wp * rj[e] + wi * o[e];
      } else {
        for (int64_t e = 0; e < Dv; ++e) o[e] = wp * rj[e] + wi * o[e];
      }
      lzp[i] = lz;
      alpha[i] = wp;
    }
  }
}

void block_fwd(Stream& st, const AttentionInputs& in, const KeyOperands& ko, int64_t b, int64_t h, int64_t hk, int64_t ra,
               int64_t rb, const int32_t* mem, const Snapshot& snap, int64_t& k, const float* inl,
               float c, View out, float* lzp, float* alpha, MemberScratch& sc) {
  const int64_t n = rb - ra, ce = st.ce, Dv = st.Dv;
  k = snapshot_lse(st, snap);
  std::fill(snap.mass, snap.mass + ce, 0.f);
  std::fill(snap.resid, snap.resid + ce * Dv, 0.f);
  sc.order.resize(static_cast<size_t>(n));
  sc.off.resize(static_cast<size_t>(ce + 1));
  cluster::counting_sort(mem, n, ce, sc.order.data(), sc.off.data());
  ConstView kh = in.k, vh = in.v;  // (1, 1, M, D) views of this kv head (no data: a 16-bit cache)
  kh.data = in.k.data ? in.k.ptr(b, hk, 0) : nullptr;
  vh.data = in.v.data ? in.v.ptr(b, hk, 0) : nullptr;
  // The clusters this block's queries join: their T_j first, so that each gather can request
  // the next cluster's rows. Members are numbered from ra (cluster_members_fwd adds it).
  std::vector<int32_t>& used = sc.used;
  used.clear();
  for (int64_t j = 0; j < ce; ++j)
    if (sc.off[static_cast<size_t>(j)] < sc.off[static_cast<size_t>(j + 1)]) {
      used.push_back(static_cast<int32_t>(j));
      select_topk(st, j, snap);
    }
  for (size_t u = 0; u < used.size(); ++u) {
    const int64_t j = used[u];
    const int32_t m0 = sc.off[static_cast<size_t>(j)], m1 = sc.off[static_cast<size_t>(j + 1)];
    const int32_t* next = u + 1 < used.size() && st.topk > 0 ? snap.topk + used[u + 1] * snap.kmax : nullptr;
    finish_cluster(st, j, k, kh, vh, ko, snap, next, sc);
    cluster_members_fwd(in, b, h, ra, sc.order.data() + m0, m1 - m0, j, k, st.topk > 0, snap, inl, c, out,
                        lzp, alpha, sc);
  }
}

}  // namespace clattn::causal
