// Backward of causal clustered attention's prefix parts (definition: causal_clustered.cpp).
//
// Per segment σ of a head, with blocks x = 0 .. S−1 of σ and prefixes P_0 <= P_1 <= ...:
//   members (block by block): the gradient through O_pre and log Z_pre gives per cluster j and block
//     x the sums G_xj = Σ_i a_i (a_i = α_i dO_i, α_i = Z_pre / e^L the prefix's share), dz_xj (the
//     derivative by log-sum-exp lse_c (clustered) or by m_j (improved)) and the members' own dq
//     and T_j rows' dK, dV;
//   centroid attention: block x's A_x,jl = e^(s_jl − lse_xj) over keys l < P_x gives
//     dS_jl = Σ_x A_x,jl (dA_x,jl − δ_xj), dV_l = Σ_{x, l∉T_xj} A_x,jl G_xj, with
//     dA_x,jl = G_xj·v_l (l ∉ T_xj) or dz_xj (l ∈ T_xj) and δ_xj = Σ_l A_x,jl dA_x,jl.
//     For a key l in region r = [P_{r−1}, P_r) (blocks r.. see it), A_x,jl = A_r,jl · e^(lse_rj − lse_xj),
//     so the dense part (every l as if l ∉ T) is one pass over the prefix with
//     G̃_rj = Σ_{x>=r} e^(lse_rj − lse_xj) G_xj and δ̃_rj likewise (suffix sums, weights <= 1);
//     the k entries of each T_xj then get their difference (dz − G·v_l, and no dV) as corrections.
//   definers: dqc_j / |definers of j| to each query that defines centroid j.
// The dense pass costs what one forward stream of the segment costs: C·P·(Dk + Dv), once per
// segment, not once per block.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "attention/clustered/causal_internal.h"
#include "attention/tile/gather.h"
#include "attention/tile/tile_ops.h"
#include "attention/validate.h"
#include "clattn/threads.h"
#include "core/simd.h"

namespace clattn::causal {

using mk::kPanel;
using mk::round_up;
using tile::kInf;
using tile::kLog2e;

namespace {

// Members of block rows [ra, rb): G (ce, Dvp) and dz (ce) accumulate, has (ce) marks the clusters
// with members; dq of the members and the T_j rows' dK, dV are written. O_i = α O_pre +
// (1 − α) O_in with α = Z_pre / (Z_pre + Z_in): ∂L/∂O_pre = α dO = a_i and ∂L/∂ log Z_pre = a_i · (O_pre − O_i)
// = z_i. Improved runs up to 64 members at once against T_j's gathered rows, as tile products.
void members_bwd(const AttentionInputs& in, const AttentionDims& d, bool improved, int64_t t,
                 int64_t ra, int64_t rb, int64_t ce, int64_t k, const float* mass, const float* resid,
                 const int32_t* topk, int64_t kmax, float scale, const CausalClusters& cz,
                 ConstView out, ConstView dout, View dq, const KeyGrads& kg, float* G, float* dz,
                 char* has, CausalThread& sc) {
  const int64_t b = t / d.H, h = t % d.H, hk = h / d.group(), D = d.Dk, Dv = d.Dv;
  const int64_t Dkp = round_up(D, mk::kLanes), Dvp = round_up(Dv, mk::kLanes), n = rb - ra;
  const int64_t kw = round_up(std::max<int64_t>(k, 1), mk::kLanes);
  const float c = scale * kLog2e;
  const float* alpha = cz.alpha.data() + t * d.N;
  sc.morder.resize(static_cast<size_t>(n));
  sc.moff.resize(static_cast<size_t>(ce + 1));
  cluster::counting_sort(cz.member.data() + t * d.N + ra, n, ce, sc.morder.data(), sc.moff.data());
  float* krw = sc.kgt.floats(static_cast<size_t>(kw * Dkp));   // (kw, Dkp) K_T rows
  float* vrw = sc.vgt.floats(static_cast<size_t>(kw * Dvp));   // (kw, Dvp) V_T rows
  float* ktt = sc.am.floats(static_cast<size_t>(D * kw));      // (D, kw) K_Tᵀ
  float* vtt = sc.da.floats(static_cast<size_t>(Dv * kw));     // (Dv, kw) V_Tᵀ
  float* dkt = sc.dkt.floats(static_cast<size_t>(kw * Dkp));   // (kw, Dkp) dK_T
  float* dvt = sc.dvt.floats(static_cast<size_t>(kw * Dvp));   // (kw, Dvp) Pᵀ·A (dV_T / m)
  float* w = sc.tmp.floats(static_cast<size_t>(kMb * (Dkp + 2 * Dvp + 3 * kw + Dkp) + 2 * kMb));
  float* qm = w;                 // (Mb, Dkp) Q rows
  float* am = qm + kMb * Dkp;    // (Mb, Dvp) A = α dO
  float* um = am + kMb * Dvp;    // (Mb, Dvp) U = P·V_T
  float* pm = um + kMb * Dvp;    // (Mb, kw) S, then P
  float* dp = pm + kMb * kw;     // (Mb, kw) dP = A·V_Tᵀ, then dS
  float* dqm = dp + kMb * kw;    // (Mb, Dkp) dS·K_T
  float* zr = dqm + kMb * Dkp;   // (Mb) z_i
  float* aur = zr + kMb;         // (Mb) a_i·u_i
  for (int64_t j = 0; j < ce; ++j) {
    const int32_t y0 = sc.moff[static_cast<size_t>(j)], y1 = sc.moff[static_cast<size_t>(j + 1)];
    has[j] = y0 < y1;
    if (y0 == y1) continue;
    const float* rj = resid + j * Dv;
    float* Gj = G + j * Dvp;
    if (!improved) {
      for (int64_t y = y0; y < y1; ++y) {
        const int64_t i = ra + sc.morder[static_cast<size_t>(y)];
        const float al = alpha[i];
        const float* go = dout.ptr(b, h, i);
        const float* oi = out.ptr(b, h, i);
        float z = 0.f;
        for (int64_t e = 0; e < Dv; ++e) {
          Gj[e] += al * go[e];
          z += al * go[e] * (rj[e] - oi[e]);
        }
        dz[j] += z;  // ∂/∂lse_c
      }
      continue;
    }
    const int32_t* tk = topk + j * kmax;
    const float* kb = in.k.ptr(b, hk, 0);
    const float* vb = in.v.ptr(b, hk, 0);
    gather::rows(kb, in.k.stride(2), tk, k, D, krw, Dkp, kw);
    gather::rows(vb, in.v.stride(2), tk, k, Dv, vrw, Dvp, kw);
    gather::transposed(kb, in.k.stride(2), tk, k, D, ktt, kw);
    gather::transposed(vb, in.v.stride(2), tk, k, Dv, vtt, kw);
    std::memset(dkt, 0, sizeof(float) * static_cast<size_t>(kw * Dkp));
    std::memset(dvt, 0, sizeof(float) * static_cast<size_t>(kw * Dvp));
    const float mj = mass[j];
    for (int64_t m0 = y0; m0 < y1; m0 += kMb) {
      const int64_t rows = std::min<int64_t>(kMb, y1 - m0);
      const int32_t* mi = sc.morder.data() + m0;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = ra + mi[r];
        simd::copy_row(qm + r * Dkp, in.q.ptr(b, h, i), D, Dkp);
        simd::copy_row(am + r * Dvp, dout.ptr(b, h, i), Dv, Dvp, alpha[i]);
      }
      // P = softmax_T(c·Q·K_Tᵀ), recomputed ; U = P·V_T
      std::memset(pm, 0, sizeof(float) * static_cast<size_t>(rows * kw));
      mk::gemm_ab(rows, kw, D, qm, Dkp, 1, ktt, kw, pm, kw, nullptr);
      const simd::vf cv = simd::splat(c);
      for (int64_t x = 0; x < rows * kw; x += simd::kLanes) simd::store(pm + x, simd::load(pm + x) * cv);
      float l2[kMb];
      tile::softmax_rows(pm, rows, kw, k, l2);
      std::memset(um, 0, sizeof(float) * static_cast<size_t>(rows * Dvp));
      mk::gemm_ab(rows, Dvp, kw, pm, kw, 1, vrw, Dvp, um, Dvp, nullptr);
      // O_pre = m U + R: z_i = a_i·(O_pre − O_i); log Z_pre = lse_T − log m gives ∂/∂m_j = a·u − z/m.
      for (int64_t r = 0; r < rows; ++r) {
        const float* ar = am + r * Dvp;
        const float* ur = um + r * Dvp;
        const float* oi = out.ptr(b, h, ra + mi[r]);
        float z = 0.f, au = 0.f;
        for (int64_t e = 0; e < Dv; ++e) {
          z += ar[e] * (mj * ur[e] + rj[e] - oi[e]);
          au += ar[e] * ur[e];
        }
        zr[r] = z;
        aur[r] = au;
        dz[j] += au - z / mj;
        simd::axpy_row(Gj, ar, Dv);
      }
      // The T softmax's logits: dS_x = s P_x (m (a·v_x − a·u) + z).
      std::memset(dp, 0, sizeof(float) * static_cast<size_t>(rows * kw));
      mk::gemm_ab(rows, kw, Dv, am, Dvp, 1, vtt, kw, dp, kw, nullptr);
      for (int64_t r = 0; r < rows; ++r) {
        const float* pr = pm + r * kw;
        float* dr = dp + r * kw;
        const simd::vf mv = simd::splat(mj), au = simd::splat(aur[r]), z = simd::splat(zr[r]), sv = simd::splat(scale);
        for (int64_t x = 0; x < kw; x += simd::kLanes)
          simd::store(dr + x, sv * simd::load(pr + x) * (mv * (simd::load(dr + x) - au) + z));
      }
      // dQ += dS·K_T ; dK_T += dSᵀ·Q ; dV_T += m Pᵀ·A
      std::memset(dqm, 0, sizeof(float) * static_cast<size_t>(rows * Dkp));
      mk::gemm_ab(rows, Dkp, kw, dp, kw, 1, krw, Dkp, dqm, Dkp, nullptr);
      for (int64_t r = 0; r < rows; ++r) simd::axpy_row(dq.ptr(b, h, ra + mi[r]), dqm + r * Dkp, D);
      mk::gemm_ab(kw, Dkp, rows, dp, 1, kw, qm, Dkp, dkt, Dkp, nullptr);
      mk::gemm_ab(kw, Dvp, rows, pm, 1, kw, am, Dvp, dvt, Dvp, nullptr);
    }
    for (int64_t x = 0; x < k; ++x) {
      kg.add_k(tk[x], dkt + x * Dkp, D, 1.f);
      kg.add_v(tk[x], dvt + x * Dvp, Dv, mj);
    }
  }
}

}  // namespace

void prefix_bwd(const AttentionInputs& in, const AttentionDims& d, const ClusteredParams& p,
                const Geometry& g, const CausalClusters& cz, int64_t t, ConstView out,
                ConstView dout, View dq, const KeyGrads& kg, const float* kpan, const float* vpan,
                const float* krow, int64_t Mp, CausalWorkspace& ws, int owner, bool split) {
  CausalThread& sc = ws.threads[static_cast<size_t>(owner)];
  const int64_t b = t / d.H, h = t % d.H, hk = h / d.group(), D = d.Dk, Dv = d.Dv;
  const int64_t nv = valid_queries(in, d, b), mv = valid_keys(in, d, b);
  const int64_t Dkp = round_up(D, mk::kLanes), Dvp = round_up(Dv, mk::kLanes);
  const bool improved = p.topk > 0;
  const float c = g.log2_scale, scale = g.scale;
  const size_t hkv = static_cast<size_t>(b * d.Hkv + hk);
  const float* kh = kpan + hkv * Mp * D;           // (np, D, 64) this head's K panels
  const float* vh = vpan + hkv * Mp * Dv;          // (np, Dv, 64) V panels
  const float* kr = krow + hkv * Mp * Dkp;         // (Mp, Dkp) K rows
  for (int64_t sigma = g.s0; sigma < g.ns; ++sigma) {
    const size_t ts = static_cast<size_t>(t * g.ns + sigma);
    const int64_t ce = cz.ncl[ts];
    if (ce == 0) continue;
    const Rows seg = segment_rows(g, sigma, nv);
    const int64_t beta0 = (seg.a + g.off) / g.Lb, nblk = (seg.b - 1 + g.off) / g.Lb - beta0 + 1;
    const float* qc = cz.qc.data() + ts * static_cast<size_t>(cz.cmax * D);
    float* G = sc.g.floats(static_cast<size_t>(nblk * ce * Dvp));    // (S, C, Dvp) G_xj, then G̃
    float* dz = sc.dz.floats(static_cast<size_t>(nblk * ce));        // (S, C)
    float* delta = sc.delta.floats(static_cast<size_t>(nblk * ce));  // (S, C) δ_xj, then δ̃
    sc.has.resize(static_cast<size_t>(nblk * ce));                    // (S, C) cluster j has members in block x
    std::memset(G, 0, sizeof(float) * static_cast<size_t>(nblk * ce * Dvp));
    std::fill(dz, dz + nblk * ce, 0.f);
    auto snap = [&](int64_t x) { return static_cast<size_t>(t * g.nb + beta0 + x); };
    // 1. Members, block by block; δ_xj = clustered G·Vc − ∂/∂lse_c, improved G·R + m dm.
    for (int64_t x = 0; x < nblk; ++x) {
      const size_t tb = snap(x);
      const Rows r = block_rows(g, beta0 + x, seg);
      const float* mass = cz.mass.data() + tb * static_cast<size_t>(cz.cmax);
      const float* resid = cz.resid.data() + tb * static_cast<size_t>(cz.cmax * Dv);
      const int32_t* topk = improved ? cz.topk_idx.data() + tb * static_cast<size_t>(cz.cmax * cz.kmax) : nullptr;
      float* Gx = G + x * ce * Dvp;
      float* dzx = dz + x * ce;
      members_bwd(in, d, improved, t, r.a, r.b, ce, cz.ksel[tb], mass, resid, topk, cz.kmax, scale, cz, out,
                  dout, dq, kg, Gx, dzx, sc.has.data() + x * ce, sc);
      for (int64_t j = 0; j < ce; ++j)
        delta[x * ce + j] = (improved ? mass[j] * dzx[j] : -dzx[j]) + simd::dot(Gx + j * Dvp, resid + j * Dv, Dv);
    }
    float* qcs = sc.qcs.floats(static_cast<size_t>(ce * Dkp));  // (C, Dkp) Qc·c
    float* dqc = sc.dqc.floats(static_cast<size_t>(ce * Dkp));  // (C, Dkp)
    mk::pack_rows(qc, ce, D, D, qcs, ce, Dkp, c);
    std::memset(dqc, 0, sizeof(float) * static_cast<size_t>(ce * Dkp));
    // 2. Improved: the entries of each T_xj, where the dense pass below counts G·v_l and A·G but
    // the function has dz and no R term.
    if (improved)
      for (int64_t x = 0; x < nblk; ++x) {
        const size_t tb = snap(x);
        const int64_t k = cz.ksel[tb];
        for (int64_t j = 0; j < ce; ++j) {
          if (!sc.has[static_cast<size_t>(x * ce + j)]) continue;  // no member: G = 0, dz = 0
          const float* Gxj = G + (x * ce + j) * Dvp;
          const float dzj = dz[x * ce + j], lse2 = cz.lse_c.data()[tb * static_cast<size_t>(cz.cmax) + static_cast<size_t>(j)] * kLog2e;
          const int32_t* tk = cz.topk_idx.data() + (tb * static_cast<size_t>(cz.cmax) + static_cast<size_t>(j)) * static_cast<size_t>(cz.kmax);
          for (int64_t y = 0; y < k; ++y) {
            const float* kl = in.k.ptr(b, hk, tk[y]);
            const float A = tile::prob(simd::dot(qcs + j * Dkp, kl, D), lse2);
            const float dS = scale * A * (dzj - simd::dot(Gxj, in.v.ptr(b, hk, tk[y]), Dv));
            simd::axpy_row(dqc + j * Dkp, kl, D, dS);
            kg.add_k(tk[y], qc + j * D, D, dS);
            kg.add_v(tk[y], Gxj, Dv, -A);
          }
        }
      }
    // 3. Suffix sums: G̃_xj = G_xj + e^(lse_xj − lse_(x+1)j) G̃_(x+1)j, δ̃ likewise.
    for (int64_t x = nblk - 2; x >= 0; --x)
      for (int64_t j = 0; j < ce; ++j) {
        const float wgt = std::exp(cz.lse_c.data()[snap(x) * static_cast<size_t>(cz.cmax) + static_cast<size_t>(j)] -
                                   cz.lse_c.data()[snap(x + 1) * static_cast<size_t>(cz.cmax) + static_cast<size_t>(j)]);
        simd::axpy_row(G + (x * ce + j) * Dvp, G + ((x + 1) * ce + j) * Dvp, Dv, wgt);
        delta[x * ce + j] += wgt * delta[(x + 1) * ce + j];
      }
    // 4. The dense pass, region by region: keys [P_(x−1), P_x) with block x's softmax as reference.
    // Keys go in spans of kSpan positions, over the team when the head is split: a span's keys
    // take their dK, dV from it alone, and its dQc goes to its own partial, added in span order
    // afterwards, so the result is the same on any thread count.
    const float inv_c = 1.f / c;
    auto region_end = [&](int64_t x) { return std::min((beta0 + x) * g.Lb, mv); };
    const int64_t kend = region_end(nblk - 1), nspan = (kend + kSpan - 1) / kSpan;
    float* dqs = sc.dqspan.floats(static_cast<size_t>(std::max<int64_t>(nspan, 1) * ce * Dkp));  // (nspan, C, Dkp)
    split_for(split, nspan, owner, [&](int64_t span, int thread) {
      CausalThread& tc = ws.threads[static_cast<size_t>(thread)];
      float* am = tc.am.floats(static_cast<size_t>(kCb * kBc));        // (Cb, Bc) A
      float* da = tc.da.floats(static_cast<size_t>(kCb * kBc));        // (Cb, Bc) dA, then dS
      float* dkacc = tc.dkacc.floats(static_cast<size_t>(kBc * Dkp));  // (Bc, Dkp)
      float* dvacc = tc.dvacc.floats(static_cast<size_t>(kBc * Dvp));  // (Bc, Dvp)
      float* part = dqs + span * ce * Dkp;                               // (C, Dkp)
      std::memset(part, 0, sizeof(float) * static_cast<size_t>(ce * Dkp));
      int64_t k0 = span * kSpan, x = 0;
      const int64_t kstop = std::min(kend, k0 + kSpan);
      while (k0 < kstop) {
        while (region_end(x) <= k0) ++x;
        const int64_t e = std::min(region_end(x), kstop);
        const float* lse = cz.lse_c.data() + snap(x) * static_cast<size_t>(cz.cmax);
        const float* Gx = G + x * ce * Dvp;
        const float* dx = delta + x * ce;
        const int64_t k1 = std::min(e, (k0 / kBc + 1) * kBc), a0 = k0 / kPanel * kPanel;
        const int64_t npan = (k1 - a0 + kPanel - 1) / kPanel, width = npan * kPanel;
        std::memset(dkacc, 0, sizeof(float) * static_cast<size_t>(width * Dkp));
        std::memset(dvacc, 0, sizeof(float) * static_cast<size_t>(width * Dvp));
        for (int64_t j0 = 0; j0 < ce; j0 += kCb) {
          const int64_t rows = std::min(kCb, ce - j0);
          // A = 2^(S − lse) ; dA = G̃·Vᵀ ; dS = A ∘ (dA − δ̃) · s
          mk::gemm_abt(rows, npan, D, qcs + j0 * Dkp, Dkp, kh + a0 * D, am, kBc);
          mk::gemm_abt(rows, npan, Dv, Gx + j0 * Dvp, Dvp, vh + a0 * Dv, da, kBc);
          for (int64_t y = 0; y < rows; ++y) {
            float* ar = am + y * kBc;
            std::fill(ar, ar + (k0 - a0), -kInf);
            tile::mask_tail(ar, width, k1 - a0);
            tile::prob_row(ar, width, lse[j0 + y] * kLog2e);
            float* dr = da + y * kBc;
            const simd::vf dj = simd::splat(dx[j0 + y]), sv = simd::splat(scale);
            for (int64_t z = 0; z < width; z += simd::kLanes)
              simd::store(dr + z, simd::load(ar + z) * (simd::load(dr + z) - dj) * sv);
          }
          // dV += Aᵀ·G̃ ; dQc += dS·K ; dK += dSᵀ·(c·Qc) (c undone below)
          mk::gemm_ab(width, Dvp, rows, am, 1, kBc, Gx + j0 * Dvp, Dvp, dvacc, Dvp, nullptr);
          mk::gemm_ab(rows, Dkp, width, da, kBc, 1, kr + a0 * Dkp, Dkp, part + j0 * Dkp, Dkp, nullptr);
          mk::gemm_ab(width, Dkp, rows, da, 1, kBc, qcs + j0 * Dkp, Dkp, dkacc, Dkp, nullptr);
        }
        for (int64_t l = k0; l < k1; ++l) {
          kg.add_k(l, dkacc + (l - a0) * Dkp, D, inv_c);
          kg.add_v(l, dvacc + (l - a0) * Dvp, Dv, 1.f);
        }
        k0 = k1;
      }
    });
    for (int64_t span = 0; span < nspan; ++span) simd::axpy_row(dqc, dqs + span * ce * Dkp, ce * Dkp);
    // 5. qc_j = mean of its definers.
    const int32_t* dord = cz.def_order.data() + ts * static_cast<size_t>(g.Ls);
    const int32_t* doff = cz.def_off.data() + ts * static_cast<size_t>(cz.cmax + 1);
    for (int64_t j = 0; j < ce; ++j) {
      const float inv = 1.f / static_cast<float>(doff[j + 1] - doff[j]);
      for (int64_t x = doff[j]; x < doff[j + 1]; ++x) simd::axpy_row(dq.ptr(b, h, dord[x]), dqc + j * Dkp, D, inv);
    }
  }
}

}  // namespace clattn::causal
