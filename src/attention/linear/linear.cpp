// Linear attention, forward and backward in chunks of 64 queries so every product is a small
// GEMM (tile microkernels): the keys every query of a chunk sees enter a running state
// S (Dk, Dv), z (Dk); the keys only some of them see (the causal diagonal) are handled by a masked
// 64 x 64 product. Without a causal mask the state holds all valid keys from the first chunk on,
// so one code path serves both. Work is parallel over (batch, kv head); the query heads of a
// group run inside the task, so their key gradients never race. Time O(N·Dk·Dv), memory O(N·D).
#include "attention/validate.h"
#include "attention/linear/linear.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "attention/registry.h"
#include "clattn/parallel.h"
#include "core/microkernel.h"
#include "core/simd.h"

namespace clattn {

using mk::round_up;

namespace {

constexpr int64_t kChunk = 64;   // queries per chunk
constexpr int64_t kKeyStep = 256;  // keys per step when the state absorbs a range of keys

struct ThreadScratch {
  Workspace phq, phk, phkt, vrow, a, num, dnum, s, st, g, gt, dkacc, dvacc, rowbuf, dphq;
  size_t bytes() const {
    return held_bytes(phq, phk, phkt, vrow, a, num, dnum, s, st, g, gt, dkacc, dvacc, rowbuf, dphq);
  }
};

}  // namespace

struct LinearWorkspace {
  std::vector<ThreadScratch> threads;
  size_t bytes() const {
    size_t n = held_bytes(threads);
    for (const ThreadScratch& t : threads) n += t.bytes();
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

struct Dims {
  int64_t D, Dv, Dkp, Dvp;
};

// The per-head walk shared by forward and backward: for chunk c of queries, keys [0, kp) are
// visible to all its rows and keys [kp, kend) to some (i sees j <= i + off).
struct ChunkPlan {
  int64_t nv, mv, off;
  bool causal;
  int64_t chunks() const { return (nv + kChunk - 1) / kChunk; }
  int64_t i0(int64_t c) const { return c * kChunk; }
  int64_t i1(int64_t c) const { return std::min(nv, (c + 1) * kChunk); }
  int64_t kp(int64_t c) const { return causal ? std::clamp(i0(c) + off, int64_t{0}, mv) : mv; }
  int64_t kend(int64_t c) const { return causal ? std::clamp(i1(c) + off, int64_t{0}, mv) : mv; }
};

// S += φ(K)ᵀ V and z += Σ φ(k) over keys [k0, k1).
void absorb_keys(const AttentionInputs& in, int64_t b, int64_t hk, int64_t k0, int64_t k1,
                 const Dims& dm, float* s, float* z, ThreadScratch& sc) {
  for (int64_t j0 = k0; j0 < k1; j0 += kKeyStep) {
    const int64_t n = std::min(kKeyStep, k1 - j0);
    float* phk = sc.phk.floats(static_cast<size_t>(kKeyStep * dm.Dkp));  // (n, Dkp)
    phi_rows(in.k, b, hk, j0, n, dm.D, dm.Dkp, phk);
    const mk::RowsOperand v = mk::rows_operand(in.v.ptr(b, hk, j0), n, dm.Dv, in.v.stride(2),
                                               sc.vrow.floats(static_cast<size_t>(kKeyStep * dm.Dvp)));
    mk::gemm_ab(dm.D, dm.Dvp, n, phk, 1, dm.Dkp, v.data, v.ld, s, dm.Dvp, nullptr);
    for (int64_t r = 0; r < n; ++r) simd::axpy_row(z, phk + r * dm.Dkp, dm.D);
  }
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

}  // namespace

void attn_linear_fwd(const AttentionInputs& in, const AttentionDims& d, View out, LinearWorkspace& ws) {
  const Dims dm{d.Dk, d.Dv, round_up(d.Dk, mk::kLanes), round_up(d.Dv, mk::kLanes)};
  ws.threads.resize(std::max(ws.threads.size(), static_cast<size_t>(max_threads())));
  parallel_for(d.B * d.Hkv, [&](int64_t t, int thread) {
    const int64_t b = t / d.Hkv, hk = t % d.Hkv;
    const ChunkPlan pl{valid_queries(in, d, b), valid_keys(in, d, b), d.M - d.N, in.causal};
    ThreadScratch& sc = ws.threads[static_cast<size_t>(thread)];
    float* s = sc.s.floats(static_cast<size_t>(dm.Dkp * dm.Dvp));     // (Dkp, Dvp) state S
    float* z = sc.st.floats(static_cast<size_t>(dm.Dkp));             // (Dkp) state z
    float* phq = sc.phq.floats(static_cast<size_t>(kChunk * dm.Dkp));  // (64, Dkp)
    float* num = sc.num.floats(static_cast<size_t>(kChunk * dm.Dvp));  // (64, Dvp)
    float* a = sc.a.floats(static_cast<size_t>(kChunk * kChunk));      // (64, 64) intra scores
    for (int64_t h = hk * d.group(); h < (hk + 1) * d.group(); ++h) {
      for (int64_t i = pl.nv; i < d.N; ++i)
        std::memset(out.ptr(b, h, i), 0, sizeof(float) * static_cast<size_t>(d.Dv));
      std::memset(s, 0, sizeof(float) * static_cast<size_t>(dm.Dkp * dm.Dvp));
      std::memset(z, 0, sizeof(float) * static_cast<size_t>(dm.Dkp));
      int64_t absorbed = 0;
      for (int64_t c = 0; c < pl.chunks(); ++c) {
        const int64_t i0 = pl.i0(c), rows = pl.i1(c) - i0, kp = pl.kp(c), nin = pl.kend(c) - kp;
        absorb_keys(in, b, hk, absorbed, kp, dm, s, z, sc);
        absorbed = std::max(absorbed, kp);
        phi_rows(in.q, b, h, i0, rows, dm.D, dm.Dkp, phq);
        // num = φ(Q)·S + A·V_in ; den = φ(Q)·z + rowsum(A) + eps
        std::memset(num, 0, sizeof(float) * static_cast<size_t>(rows * dm.Dvp));
        mk::gemm_ab(rows, dm.Dvp, dm.D, phq, dm.Dkp, 1, s, dm.Dvp, num, dm.Dvp, nullptr);
        float den[kChunk];
        for (int64_t r = 0; r < rows; ++r) den[r] = kLinearEps + simd::dot(phq + r * dm.Dkp, z, dm.D);
        if (nin > 0) {
          const int64_t nkw = round_up(nin, mk::kLanes);
          intra_scores(in, b, hk, pl, c, dm, phq, rows, a, nkw, sc);
          const mk::RowsOperand v = mk::rows_operand(in.v.ptr(b, hk, kp), nin, dm.Dv, in.v.stride(2),
                                                     sc.vrow.floats(static_cast<size_t>(kKeyStep * dm.Dvp)));
          mk::gemm_ab(rows, dm.Dvp, nin, a, nkw, 1, v.data, v.ld, num, dm.Dvp, nullptr);
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < nin; ++j) den[r] += a[r * nkw + j];
        }
        for (int64_t r = 0; r < rows; ++r) simd::copy_row(out.ptr(b, h, i0 + r), num + r * dm.Dvp, dm.Dv, dm.Dv, 1.f / den[r]);
      }
    }
  });
}

void attn_linear_bwd(const AttentionInputs& in, const AttentionDims& d, ConstView dout, View dq,
                     View dk, View dv, LinearWorkspace& ws) {
  const Dims dm{d.Dk, d.Dv, round_up(d.Dk, mk::kLanes), round_up(d.Dv, mk::kLanes)};
  ws.threads.resize(std::max(ws.threads.size(), static_cast<size_t>(max_threads())));
  parallel_for(d.B * d.Hkv, [&](int64_t t, int thread) {
    const int64_t b = t / d.Hkv, hk = t % d.Hkv;
    const ChunkPlan pl{valid_queries(in, d, b), valid_keys(in, d, b), d.M - d.N, in.causal};
    ThreadScratch& sc = ws.threads[static_cast<size_t>(thread)];
    float* s = sc.s.floats(static_cast<size_t>(dm.Dkp * dm.Dvp));      // (Dkp, Dvp) state S
    float* z = sc.st.floats(static_cast<size_t>(2 * dm.Dkp));          // (Dkp) state z, then gz
    float* gz = z + dm.Dkp;                                            // (Dkp) Σ φ(q) dden
    float* st = sc.rowbuf.floats(static_cast<size_t>(dm.Dvp * dm.Dkp)); // (Dvp, Dkp) Sᵀ
    float* phq = sc.phq.floats(static_cast<size_t>(kChunk * dm.Dkp));   // (64, Dkp)
    float* num = sc.num.floats(static_cast<size_t>(kChunk * dm.Dvp));   // (64, Dvp)
    float* a = sc.a.floats(static_cast<size_t>(2 * kChunk * kChunk));   // (64, 64) A, then dA
    float* da = a + kChunk * kChunk;
    // Per query: dnum = dO / den (nv, Dvp) and dden = −dO·O / den (nv), kept for the key pass.
    float* dnum = sc.dnum.floats(static_cast<size_t>(std::max<int64_t>(1, pl.nv) * (dm.Dvp + 1)));
    float* dden = dnum + pl.nv * dm.Dvp;
    float* g = sc.g.floats(static_cast<size_t>(dm.Dkp * dm.Dvp));    // (Dkp, Dvp) Σ φ(q) dnumᵀ
    float* gt = sc.gt.floats(static_cast<size_t>(dm.Dvp * dm.Dkp));  // (Dvp, Dkp) its transpose
    float* dka = sc.dkacc.floats(static_cast<size_t>(std::max<int64_t>(1, pl.mv) * dm.Dkp));  // (mv, Dkp) ∂L/∂φ(k)
    float* dva = sc.dvacc.floats(static_cast<size_t>(std::max<int64_t>(1, pl.mv) * dm.Dvp));  // (mv, Dvp)
    std::memset(dka, 0, sizeof(float) * static_cast<size_t>(pl.mv * dm.Dkp));
    std::memset(dva, 0, sizeof(float) * static_cast<size_t>(pl.mv * dm.Dvp));
    float* dq_c = sc.dphq.floats(static_cast<size_t>(kChunk * dm.Dkp));  // (64, Dkp) ∂L/∂φ(q)

    for (int64_t h = hk * d.group(); h < (hk + 1) * d.group(); ++h) {
      std::memset(s, 0, sizeof(float) * static_cast<size_t>(dm.Dkp * dm.Dvp));
      std::memset(z, 0, sizeof(float) * static_cast<size_t>(dm.Dkp));
      int64_t absorbed = 0;
      // Pass 1, in query order: recompute O, then dφ(q) and the intra-chunk key gradients.
      for (int64_t c = 0; c < pl.chunks(); ++c) {
        const int64_t i0 = pl.i0(c), rows = pl.i1(c) - i0, kp = pl.kp(c), nin = pl.kend(c) - kp;
        absorb_keys(in, b, hk, absorbed, kp, dm, s, z, sc);
        absorbed = std::max(absorbed, kp);
        mk::pack_transposed(s, dm.D, dm.Dvp, dm.Dvp, st, dm.Dkp);  // Sᵀ (Dvp, Dkp)
        phi_rows(in.q, b, h, i0, rows, dm.D, dm.Dkp, phq);
        std::memset(num, 0, sizeof(float) * static_cast<size_t>(rows * dm.Dvp));
        mk::gemm_ab(rows, dm.Dvp, dm.D, phq, dm.Dkp, 1, s, dm.Dvp, num, dm.Dvp, nullptr);
        float den[kChunk];
        for (int64_t r = 0; r < rows; ++r) den[r] = kLinearEps + simd::dot(phq + r * dm.Dkp, z, dm.D);
        const int64_t nkw = round_up(std::max<int64_t>(nin, 1), mk::kLanes);
        mk::RowsOperand vin{nullptr, 0};
        if (nin > 0) {
          intra_scores(in, b, hk, pl, c, dm, phq, rows, a, nkw, sc);
          vin = mk::rows_operand(in.v.ptr(b, hk, kp), nin, dm.Dv, in.v.stride(2),
                                 sc.vrow.floats(static_cast<size_t>(kKeyStep * dm.Dvp)));
          mk::gemm_ab(rows, dm.Dvp, nin, a, nkw, 1, vin.data, vin.ld, num, dm.Dvp, nullptr);
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < nin; ++j) den[r] += a[r * nkw + j];
        }
        // O = num / den  ->  dnum = dO / den ; dden = −dO·O / den = −dO·num / den²
        for (int64_t r = 0; r < rows; ++r) {
          const float* go = dout.ptr(b, h, i0 + r);
          float* dn = dnum + (i0 + r) * dm.Dvp;
          float gdot = 0.f;
          for (int64_t e = 0; e < dm.Dv; ++e) {
            dn[e] = go[e] / den[r];
            gdot += go[e] * num[r * dm.Dvp + e];
          }
          for (int64_t e = dm.Dv; e < dm.Dvp; ++e) dn[e] = 0.f;
          dden[i0 + r] = -gdot / (den[r] * den[r]);
        }
        // dφ(Q) = dnum·Sᵀ + dden zᵀ (+ intra: dA·φ(K_in), dA = dnum·V_inᵀ + dden, masked like A)
        std::memset(dq_c, 0, sizeof(float) * static_cast<size_t>(rows * dm.Dkp));
        mk::gemm_ab(rows, dm.Dkp, dm.Dv, dnum + i0 * dm.Dvp, dm.Dvp, 1, st, dm.Dkp, dq_c, dm.Dkp, nullptr);
        for (int64_t r = 0; r < rows; ++r) simd::axpy_row(dq_c + r * dm.Dkp, z, dm.D, dden[i0 + r]);
        if (nin > 0) {
          float* vint = sc.phkt.floats(static_cast<size_t>(std::max(dm.Dkp, dm.Dvp) * kKeyStep));  // (Dv, nkw) V_inᵀ
          mk::pack_transposed(vin.data, nin, dm.Dv, vin.ld, vint, nkw);
          std::memset(da, 0, sizeof(float) * static_cast<size_t>(rows * nkw));
          mk::gemm_ab(rows, nkw, dm.Dv, dnum + i0 * dm.Dvp, dm.Dvp, 1, vint, nkw, da, nkw, nullptr);
          for (int64_t r = 0; r < rows; ++r) {  // keys kp + j with j < vis are visible to row r
            const int64_t vis = std::clamp<int64_t>(i0 + r + pl.off + 1 - kp, 0, nin);
            for (int64_t j = 0; j < nkw; ++j) da[r * nkw + j] = j < vis ? da[r * nkw + j] + dden[i0 + r] : 0.f;
          }
          // φ(K_in) rows are in sc.phk (left by intra_scores)
          mk::gemm_ab(rows, dm.Dkp, nin, da, nkw, 1, sc.phk.floats(0), dm.Dkp, dq_c, dm.Dkp, nullptr);
          // ∂φ(k_j) += Σ_i dA_ij φ(q_i) ; ∂v_j += Σ_i A_ij dnum_i
          mk::gemm_ab(nin, dm.Dkp, rows, da, 1, nkw, phq, dm.Dkp, dka + kp * dm.Dkp, dm.Dkp, nullptr);
          mk::gemm_ab(nin, dm.Dvp, rows, a, 1, nkw, dnum + i0 * dm.Dvp, dm.Dvp, dva + kp * dm.Dvp, dm.Dvp, nullptr);
        }
        for (int64_t r = 0; r < rows; ++r) add_dphi(dq.ptr(b, h, i0 + r), dq_c + r * dm.Dkp, in.q.ptr(b, h, i0 + r), dm.D);
      }
      // Pass 2, in reverse: key j is in the state of every chunk c with kp(c) > j; G, gz sum
      // φ(q) dnumᵀ and φ(q) dden over those chunks. ∂φ(k_j) += G·v_j + gz ; ∂v_j += Gᵀ φ(k_j).
      std::memset(g, 0, sizeof(float) * static_cast<size_t>(dm.Dkp * dm.Dvp));
      std::memset(gt, 0, sizeof(float) * static_cast<size_t>(dm.Dvp * dm.Dkp));
      std::memset(gz, 0, sizeof(float) * static_cast<size_t>(dm.Dkp));
      auto apply_state = [&](int64_t k0, int64_t k1) {
        for (int64_t j0 = k0; j0 < k1; j0 += kKeyStep) {
          const int64_t n = std::min(kKeyStep, k1 - j0);
          float* phk = sc.phk.floats(static_cast<size_t>(kKeyStep * dm.Dkp));
          phi_rows(in.k, b, hk, j0, n, dm.D, dm.Dkp, phk);
          const mk::RowsOperand v = mk::rows_operand(in.v.ptr(b, hk, j0), n, dm.Dv, in.v.stride(2),
                                                     sc.vrow.floats(static_cast<size_t>(kKeyStep * dm.Dvp)));
          mk::gemm_ab(n, dm.Dkp, dm.Dv, v.data, v.ld, 1, gt, dm.Dkp, dka + j0 * dm.Dkp, dm.Dkp, nullptr);
          for (int64_t r = 0; r < n; ++r) simd::axpy_row(dka + (j0 + r) * dm.Dkp, gz, dm.D);
          mk::gemm_ab(n, dm.Dvp, dm.D, phk, dm.Dkp, 1, g, dm.Dvp, dva + j0 * dm.Dvp, dm.Dvp, nullptr);
        }
      };
      for (int64_t c = pl.chunks() - 1; c >= 0; --c) {
        const int64_t next = c + 1 < pl.chunks() ? pl.kp(c + 1) : pl.kp(c);
        apply_state(pl.kp(c), next);
        const int64_t i0 = pl.i0(c), rows = pl.i1(c) - i0;
        phi_rows(in.q, b, h, i0, rows, dm.D, dm.Dkp, phq);
        mk::gemm_ab(dm.D, dm.Dvp, rows, phq, 1, dm.Dkp, dnum + i0 * dm.Dvp, dm.Dvp, g, dm.Dvp, nullptr);
        mk::gemm_ab(dm.Dv, dm.Dkp, rows, dnum + i0 * dm.Dvp, 1, dm.Dvp, phq, dm.Dkp, gt, dm.Dkp, nullptr);
        for (int64_t r = 0; r < rows; ++r) simd::axpy_row(gz, phq + r * dm.Dkp, dm.D, dden[i0 + r]);
      }
      apply_state(0, pl.chunks() > 0 ? pl.kp(0) : 0);
    }
    for (int64_t j = 0; j < pl.mv; ++j) {
      add_dphi(dk.ptr(b, hk, j), dka + j * dm.Dkp, in.k.ptr(b, hk, j), dm.D);
      simd::axpy_row(dv.ptr(b, hk, j), dva + j * dm.Dvp, dm.Dv);
    }
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
  void forward(const AttentionInputs& in, View out, Context& ctx) const override {
    Magnitudes mag;
    const AttentionDims d = validate_inputs(in, caps_, "linear", mag);
    validate_output(out, Shape{d.B, d.H, d.N, d.Dv}, "out", "linear");
    check_linear_range(d, mag, "linear");
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
    const int64_t Dkp = round_up(d.Dk, mk::kLanes), Dvp = round_up(d.Dv, mk::kLanes);
    int64_t per = kChunk * Dkp + kKeyStep * Dkp + kKeyStep * Dvp + kChunk * kChunk +
                  kChunk * Dvp + Dkp * Dvp + Dkp + std::max(Dkp, Dvp) * kKeyStep;
    if (mode == Mode::training)
      per += kChunk * kChunk + std::max<int64_t>(1, d.N) * (Dvp + 1) + Dkp + 2 * Dkp * Dvp +
             std::max<int64_t>(1, d.M) * (Dkp + Dvp) + Dvp * Dkp + kChunk * Dkp;
    return static_cast<size_t>(threads) * (sizeof(float) * static_cast<size_t>(per) + sizeof(ThreadScratch));
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
