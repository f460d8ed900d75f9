// Improved clustered attention's member stage (docs/design.md): each cluster's k best keys T_j are
// gathered once into contiguous blocks, and all members of the cluster are multiplied at once as
// one small GEMM (64 members per block), instead of per-query dot products.
//   O_i = m_j · Σ_{l∈T_j} softmax_T(s q_i·k_l) v_l + R_j,   R_j = Vc_j − Σ_{l∈T_j} A_jl v_l.
// The backward is exact with clusters and T_j held fixed, including the path through the mass
// m_j = Σ_{l∈T_j} A_jl (the reference implementation detaches it).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "attention/clustered/clustered_internal.h"
#include "attention/tile/tile_ops.h"
#include "core/microkernel.h"
#include "core/simd.h"

namespace clattn {

using mk::round_up;
using tile::kLn2;
using tile::kLog2e;

namespace {

// Gathers rows idx[0, k) of a (M, cols) head into (rows_pad, cols_pad) zero-padded rows.
void gather_rows(ConstView t, int64_t b, int64_t hk, const int32_t* idx, int64_t k, int64_t cols,
                 float* dst, int64_t rows_pad, int64_t cols_pad) {
  for (int64_t x = 0; x < k; ++x) simd::copy_row(dst + x * cols_pad, t.ptr(b, hk, idx[x]), cols, cols_pad);
  if (rows_pad > k)
    std::memset(dst + k * cols_pad, 0, sizeof(float) * static_cast<size_t>((rows_pad - k) * cols_pad));
}

// Gathers member rows order[m0, m0 + rows) of a (N, cols) head, times s, zero-padded to cols_pad.
void gather_members(ConstView t, int64_t b, int64_t h, const int32_t* order, int64_t rows,
                    int64_t cols, int64_t cols_pad, float s, float* dst) {
  for (int64_t r = 0; r < rows; ++r) simd::prefetch_row(t.ptr(b, h, order[r]), cols, false);
  for (int64_t r = 0; r < rows; ++r) simd::copy_row(dst + r * cols_pad, t.ptr(b, h, order[r]), cols, cols_pad, s);
}

}  // namespace

void improved_members_fwd(const AttentionInputs& in, const AttentionDims& d, int64_t b, int64_t h,
                          float scale, ClusteredState& st, View out, ThreadScratch& sc, int64_t j_begin,
                          int64_t j_end) {
  const int64_t t = b * d.H + h, hk = h / d.group(), D = d.Dk, Dv = d.Dv;
  const int64_t ce = st.nclusters[static_cast<size_t>(t)], k = st.ksel[static_cast<size_t>(t)];
  const int64_t kw = round_up(k, mk::kLanes), Dvp = round_up(Dv, mk::kLanes);
  const float c = scale * kLog2e;
  const int32_t* order = st.order.data() + t * d.N;
  const int32_t* off = st.offsets.data() + t * (st.cmax + 1);
  float* kt = sc.kt.floats(static_cast<size_t>(k * D));        // (k, D) gathered K_T
  float* ktt = sc.ktp.floats(static_cast<size_t>(D * kw));     // (D, kw) its transpose
  float* vt = sc.vt.floats(static_cast<size_t>(kw * Dvp));     // (kw, Dvp) gathered V_T
  float* qm = sc.qm.floats(static_cast<size_t>(kMb * D));      // (Mb, D) members · c
  float* s = sc.sm.floats(static_cast<size_t>(kMb * kw));      // (Mb, kw) scores, then P
  float* u = sc.um.floats(static_cast<size_t>(kMb * Dvp));     // (Mb, Dvp) P·V_T
  float* lse_m = st.lse_m.data() + t * d.N;
  for (int64_t j = j_begin; j < std::min(j_end, ce); ++j) {
    if (off[j + 1] == off[j]) continue;
    const int32_t* tk = st.topk_idx.data() + (t * st.cmax + j) * st.kmax;
    gather_rows(in.k, b, hk, tk, k, D, kt, k, D);
    mk::pack_transposed(kt, k, D, D, ktt, kw);
    gather_rows(in.v, b, hk, tk, k, Dv, vt, kw, Dvp);
    const float mj = st.mass.data()[t * st.cmax + j];
    const float* rj = st.resid.data() + (t * st.cmax + j) * Dv;
    for (int64_t m0 = off[j]; m0 < off[j + 1]; m0 += kMb) {
      const int64_t rows = std::min(kMb, off[j + 1] - m0);
      gather_members(in.q, b, h, order + m0, rows, D, D, c, qm);
      std::memset(s, 0, sizeof(float) * static_cast<size_t>(rows * kw));
      mk::gemm_ab(rows, kw, D, qm, D, 1, ktt, kw, s, kw, nullptr);
      float l2[kMb];
      tile::softmax_rows(s, rows, kw, k, l2);
      for (int64_t r = 0; r < rows; ++r) lse_m[order[m0 + r]] = l2[r] * kLn2;
      std::memset(u, 0, sizeof(float) * static_cast<size_t>(rows * Dvp));
      mk::gemm_ab(rows, Dvp, kw, s, kw, 1, vt, Dvp, u, Dvp, nullptr);
      for (int64_t r = 0; r < rows; ++r) simd::prefetch_row(out.ptr(b, h, order[m0 + r]), Dv, true);
      for (int64_t r = 0; r < rows; ++r) simd::axpby_row(out.ptr(b, h, order[m0 + r]), mj, u + r * Dvp, rj, Dv);
    }
  }
}

void improved_members_bwd(const AttentionInputs& in, const AttentionDims& d, int64_t b, int64_t h,
                          float scale, const ClusteredState& st, ConstView dout, View dq,
                          const KeyGrads& kg, float* dm, ThreadScratch& sc, int64_t j_begin, int64_t j_end,
                          float* kv_out) {
  const int64_t t = b * d.H + h, hk = h / d.group(), D = d.Dk, Dv = d.Dv;
  const int64_t ce = st.nclusters[static_cast<size_t>(t)], k = st.ksel[static_cast<size_t>(t)];
  const int64_t kw = round_up(k, mk::kLanes);
  const int64_t Dkp = round_up(D, mk::kLanes), Dvp = round_up(Dv, mk::kLanes);
  const float c = scale * kLog2e;
  const int32_t* order = st.order.data() + t * d.N;
  const int32_t* off = st.offsets.data() + t * (st.cmax + 1);
  float* ktr = sc.ktr.floats(static_cast<size_t>(kw * Dkp));    // (kw, Dkp) K_T rows
  float* ktt = sc.ktp.floats(static_cast<size_t>(D * kw));      // (D, kw) K_Tᵀ
  float* vtr = sc.vtr.floats(static_cast<size_t>(kw * Dvp));    // (kw, Dvp) V_T rows
  float* vtt = sc.vtp.floats(static_cast<size_t>(Dv * kw));     // (Dv, kw) V_Tᵀ
  float* qm = sc.qm.floats(static_cast<size_t>(kMb * Dkp));     // (Mb, Dkp) members · c
  float* gm = sc.gm.floats(static_cast<size_t>(kMb * Dvp));     // (Mb, Dvp) dO of members
  float* p = sc.sm.floats(static_cast<size_t>(kMb * kw));       // (Mb, kw) P
  float* dp = sc.dp.floats(static_cast<size_t>(kMb * kw));      // (Mb, kw) dP, then dS
  float* u = sc.um.floats(static_cast<size_t>(kMb * std::max(Dvp, Dkp)));  // (Mb, Dvp) P·V_T, then dQ
  float* dkt_own = sc.dkt.floats(static_cast<size_t>(kw * Dkp));  // (kw, Dkp)
  float* dvt_own = sc.dvt.floats(static_cast<size_t>(kw * Dvp));  // (kw, Dvp)
  for (int64_t j = j_begin; j < std::min(j_end, ce); ++j) {
    if (off[j + 1] == off[j]) continue;
    float* dkt = kv_out ? kv_out + (j - j_begin) * kw * (Dkp + Dvp) : dkt_own;
    float* dvt = kv_out ? dkt + kw * Dkp : dvt_own;
    const int32_t* tk = st.topk_idx.data() + (t * st.cmax + j) * st.kmax;
    gather_rows(in.k, b, hk, tk, k, D, ktr, kw, Dkp);
    mk::pack_transposed(ktr, k, D, Dkp, ktt, kw);
    gather_rows(in.v, b, hk, tk, k, Dv, vtr, kw, Dvp);
    mk::pack_transposed(vtr, k, Dv, Dvp, vtt, kw);
    std::memset(dkt, 0, sizeof(float) * static_cast<size_t>(kw * Dkp));
    std::memset(dvt, 0, sizeof(float) * static_cast<size_t>(kw * Dvp));
    const float mj = st.mass.data()[t * st.cmax + j];
    double dmj = 0;
    for (int64_t m0 = off[j]; m0 < off[j + 1]; m0 += kMb) {
      const int64_t rows = std::min(kMb, off[j + 1] - m0);
      gather_members(in.q, b, h, order + m0, rows, D, Dkp, c, qm);
      gather_members(dout, b, h, order + m0, rows, Dv, Dvp, 1.f, gm);
      // P = softmax_T(s q·k), recomputed and normalised again here: the k scores fit one row, and
      // a P that sums to 1 in this pass keeps dS = P∘(dP − D) accurate when the softmax is
      // saturated (large logits), where exp(s − saved lse) drifts from 1 by the lse's rounding.
      std::memset(p, 0, sizeof(float) * static_cast<size_t>(rows * kw));
      mk::gemm_ab(rows, kw, D, qm, Dkp, 1, ktt, kw, p, kw, nullptr);
      float l2[kMb];  // not needed here
      tile::softmax_rows(p, rows, kw, k, l2);
      // O_i = m_j u_i + R_j, u = P·V_T  ->  dm_j += Σ_i dO_i·u_i ; dV_T += m_j Pᵀ·dO
      std::memset(u, 0, sizeof(float) * static_cast<size_t>(rows * Dvp));
      mk::gemm_ab(rows, Dvp, kw, p, kw, 1, vtr, Dvp, u, Dvp, nullptr);
      float gu[kMb];
      for (int64_t r = 0; r < rows; ++r) {
        float x = 0.f;
        for (int64_t e = 0; e < Dv; ++e) x += gm[r * Dvp + e] * u[r * Dvp + e];
        gu[r] = x;
        dmj += x;
      }
      mk::gemm_ab(kw, Dvp, rows, p, 1, kw, gm, Dvp, dvt, Dvp, nullptr);
      // dP = m_j dO·V_Tᵀ ; dS = s·P∘(dP − m_j dO_i·u_i)
      std::memset(dp, 0, sizeof(float) * static_cast<size_t>(rows * kw));
      mk::gemm_ab(rows, kw, Dv, gm, Dvp, 1, vtt, kw, dp, kw, nullptr);
      for (int64_t r = 0; r < rows; ++r) {
        const simd::vf g = simd::splat(gu[r]), sm = simd::splat(scale * mj);
        float* dr = dp + r * kw;
        const float* pr = p + r * kw;
        for (int64_t x = 0; x < kw; x += simd::kLanes)
          simd::store(dr + x, simd::load(pr + x) * (simd::load(dr + x) - g) * sm);
      }
      // S = s q·k_T -> dq_i += dS·K_T ; dK_T += dSᵀ·(c q), undone by 1/c below
      std::memset(u, 0, sizeof(float) * static_cast<size_t>(rows * Dkp));
      mk::gemm_ab(rows, Dkp, kw, dp, kw, 1, ktr, Dkp, u, Dkp, nullptr);
      for (int64_t r = 0; r < rows; ++r) simd::axpy_row(dq.ptr(b, h, order[m0 + r]), u + r * Dkp, D);
      mk::gemm_ab(kw, Dkp, rows, dp, 1, kw, qm, Dkp, dkt, Dkp, nullptr);
    }
    if (!kv_out)
      for (int64_t x = 0; x < k; ++x) {
        kg.add_k(tk[x], dkt + x * Dkp, D, 1.f / c);
        kg.add_v(tk[x], dvt + x * Dvp, Dv, mj);
      }
    dm[j] = static_cast<float>(dmj);
  }
}

}  // namespace clattn
