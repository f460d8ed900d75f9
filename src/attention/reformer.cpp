// Reformer LSH attention with shared QK. Keys are the queries normalised to unit length; per round
// a random rotation hashes each position to the argmax of [x·R, −x·R] (factorised into two
// rotations above 128 buckets, bucket = b1 + f1·b2, as in the original); positions are sorted by
// (bucket, position) with a counting sort and cut into chunks; each chunk's queries attend the
// keys of the chunk and of the one before it (the first wraps to the last; with a single chunk it
// attends only itself, never a key twice). Logits are q · k_unit with no scaling. A query never
// attends to itself unless nothing else in its round is visible; causal and key-padding masks
// apply by original position. Rounds combine by log-sum-exp (one softmax over every round's keys).
// The K input must be Q itself (same shape and values): all gradient flows into dq, through both
// the query and the normalised-key role; dk is left unchanged.
#include "attention/reformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "attention/full.h"
#include "attention/tile_ops.h"
#include "attention/variants.h"
#include "clattn/parallel.h"
#include "clattn/rng.h"
#include "cluster/cluster.h"
#include "core/microkernel.h"
#include "core/simd.h"

namespace clattn {

using mk::round_up;
using tile::kInf;
using tile::kLn2;
using tile::kLog2e;

namespace {

constexpr int64_t kMaxChunk = 64;

struct Scratch {
  std::vector<int32_t> bucket, keys;
  std::vector<float> invn;  // (N) 1 / |q|
  tile::RoundMix mix;       // rounds combined by log-sum-exp
  Workspace khat, proj, qs, kr, kt, vr, vt, s, o, go, dp, dqc, dkc, dvc, dkhat, misc;
};

}  // namespace

struct ReformerWorkspace {
  std::vector<Scratch> threads;
};
void ReformerWorkspaceDeleter::operator()(ReformerWorkspace* w) const { delete w; }
ReformerWorkspacePtr make_reformer_workspace() { return ReformerWorkspacePtr(new ReformerWorkspace); }

namespace {

// (f1, f2) with f1·f2 = buckets, both even, f1 the even divisor nearest sqrt(buckets); (b, 1)
// at or below 128 buckets (no factorisation).
std::pair<int64_t, int64_t> factorise(int64_t buckets) {
  if (buckets <= 128) return {buckets, 1};
  int64_t best = 0;
  for (int64_t f = 2; f * f <= buckets; f += 2)
    if (buckets % f == 0 && (buckets / f) % 2 == 0) best = f;
  return {best, best ? buckets / best : 0};
}

}  // namespace

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

// Keys of chunk c (positions), in perm order: chunk c then chunk c − 1 (wrapping; not repeated
// when there is a single chunk).
int64_t chunk_keys(const int32_t* perm, int64_t n, int64_t ch, int64_t c, std::vector<int32_t>& keys) {
  const int64_t nch = (n + ch - 1) / ch;
  keys.clear();
  for (int64_t x = c * ch; x < std::min(n, (c + 1) * ch); ++x) keys.push_back(perm[x]);
  if (nch > 1) {
    const int64_t pc = c == 0 ? nch - 1 : c - 1;
    for (int64_t x = pc * ch; x < std::min(n, (pc + 1) * ch); ++x) keys.push_back(perm[x]);
  }
  return static_cast<int64_t>(keys.size());
}

// Masks row r (query position i) over keys kj[0, nk) of width kw: invisible keys and the query's
// own position get -inf; returns true when the self key must be used instead (nothing else seen).
bool mask_reformer_row(float* row, int64_t kw, const int32_t* kj, int64_t nk, int64_t i,
                       int64_t mv, bool causal) {
  bool any = false;
  for (int64_t x = 0; x < kw; ++x) {
    const bool vis = x < nk && kj[x] < mv && kj[x] != i && (!causal || kj[x] <= i);
    if (!vis) row[x] = -kInf;
    any |= vis;
  }
  return !any && i < mv;
}

struct Dims {
  int64_t N, D, Dv, Dkp, Dvp;
};

// Scores of one chunk: qs (nq, Dkp) = q·log2 e, key rows, values, S (nq, kw) masked; self[r] says
// row r falls back to its own key (logit in self_s[r]).
struct ChunkBlock {
  int64_t nq, nk, kw;
  const int32_t* qi;
  const int32_t* kj;
  float *qs, *kr, *vr, *s;
  bool self[kMaxChunk];
  float self_s[kMaxChunk];
};

void build_chunk(const AttentionInputs& in, int64_t b, int64_t h, const Dims& dm, int64_t mv,
                 const float* khat, ChunkBlock& blk, Scratch& sc) {
  const int64_t kw = round_up(std::max<int64_t>(blk.nk, 1), mk::kLanes);
  blk.kw = kw;
  blk.qs = sc.qs.floats(static_cast<size_t>(kMaxChunk * dm.Dkp));
  blk.kr = sc.kr.floats(static_cast<size_t>(kw * dm.Dkp));
  blk.vr = sc.vr.floats(static_cast<size_t>(kw * dm.Dvp));
  blk.s = sc.s.floats(static_cast<size_t>(kMaxChunk * kw));
  float* kt = sc.kt.floats(static_cast<size_t>(dm.Dkp * kw));  // (D, kw)
  for (int64_t r = 0; r < blk.nq; ++r) simd::copy_row(blk.qs + r * dm.Dkp, in.q.ptr(b, h, blk.qi[r]), dm.D, dm.Dkp, kLog2e);
  for (int64_t x = 0; x < kw; ++x) {
    if (x < blk.nk) {
      simd::copy_row(blk.kr + x * dm.Dkp, khat + blk.kj[x] * dm.Dkp, dm.Dkp, dm.Dkp);
      simd::copy_row(blk.vr + x * dm.Dvp, in.v.ptr(b, h, blk.kj[x]), dm.Dv, dm.Dvp);
    } else {
      std::memset(blk.kr + x * dm.Dkp, 0, sizeof(float) * static_cast<size_t>(dm.Dkp));
      std::memset(blk.vr + x * dm.Dvp, 0, sizeof(float) * static_cast<size_t>(dm.Dvp));
    }
  }
  mk::pack_transposed(blk.kr, kw, dm.D, dm.Dkp, kt, kw);
  std::memset(blk.s, 0, sizeof(float) * static_cast<size_t>(blk.nq * kw));
  mk::gemm_ab(blk.nq, kw, dm.D, blk.qs, dm.Dkp, 1, kt, kw, blk.s, kw, nullptr);
  for (int64_t r = 0; r < blk.nq; ++r) {
    const int64_t i = blk.qi[r];
    blk.self[r] = mask_reformer_row(blk.s + r * kw, kw, blk.kj, blk.nk, i, mv, in.causal);
    blk.self_s[r] = blk.self[r] ? simd::dot(blk.qs + r * dm.Dkp, khat + i * dm.Dkp, dm.D) : -kInf;
  }
}

// k̂ rows (N, Dkp) and 1/|q| of one head.
void normalise(const AttentionInputs& in, int64_t b, int64_t h, const Dims& dm, float* khat,
               float* invn) {
  for (int64_t j = 0; j < dm.N; ++j) {
    const float* q = in.q.ptr(b, h, j);
    const float nrm = std::sqrt(simd::dot(q, q, dm.D));
    invn[j] = nrm > 0.f ? 1.f / nrm : 0.f;
    simd::copy_row(khat + j * dm.Dkp, q, dm.D, dm.Dkp, invn[j]);
  }
}

}  // namespace

void attn_reformer_fwd(const AttentionInputs& in, const AttentionDims& d, const ReformerParams& p,
                       uint64_t call, View out, ReformerState& st, ReformerWorkspace& ws) {
  const Dims dm{d.N, d.Dk, d.Dv, round_up(d.Dk, mk::kLanes), round_up(d.Dv, mk::kLanes)};
  const int64_t R = p.rounds, nb = reformer_buckets(p, d.N);
  const auto [f1, f2] = factorise(nb);
  st.rounds = R;
  st.chunk = p.chunk;
  st.buckets = nb;
  st.perm.assign(static_cast<size_t>(d.B * d.H * R * d.N), 0);
  st.lse2.resize(Shape{d.B, d.H, d.N});
  // Rotations per round, shared by all heads: (D, f1/2) and, factorised, (D, f2/2).
  const int64_t nrot = f1 / 2 + (f2 > 1 ? f2 / 2 : 0);
  const Rng rng(p.seed);
  std::vector<float> rot(static_cast<size_t>(R * d.Dk * nrot));  // (R, D, nrot)
  for (size_t i = 0; i < rot.size(); ++i) rot[i] = rng.normal(call, i);
  ws.threads.resize(std::max(ws.threads.size(), static_cast<size_t>(max_threads())));

  parallel_for(d.B * d.H, [&](int64_t t) {
    const int64_t b = t / d.H, h = t % d.H;
    const int64_t nv = valid_queries(in, d, b), mv = valid_keys(in, d, b);
    Scratch& sc = ws.threads[static_cast<size_t>(thread_id())];
    float* lse2 = st.lse2.data() + t * d.N;
    for (int64_t i = 0; i < d.N; ++i) std::memset(out.ptr(b, h, i), 0, sizeof(float) * static_cast<size_t>(dm.Dv));
    std::fill(lse2, lse2 + d.N, 0.f);
    if (nv == 0 || d.N == 0) return;
    float* khat = sc.khat.floats(static_cast<size_t>(d.N * dm.Dkp));  // (N, Dkp) unit keys
    sc.invn.resize(static_cast<size_t>(d.N));
    normalise(in, b, h, dm, khat, sc.invn.data());
    sc.mix.reset(d.N);
    sc.bucket.resize(static_cast<size_t>(d.N));
    float* proj = sc.proj.floats(static_cast<size_t>(nrot));
    std::vector<int32_t> offsets(static_cast<size_t>(nb + 1));
    for (int64_t r = 0; r < R; ++r) {
      const float* rr = rot.data() + r * d.Dk * nrot;
      for (int64_t j = 0; j < d.N; ++j) {
        std::fill(proj, proj + nrot, 0.f);
        for (int64_t e = 0; e < d.Dk; ++e) simd::axpy_row(proj, rr + e * nrot, nrot, khat[j * dm.Dkp + e]);
        auto argmax2 = [&](const float* x, int64_t half) {  // argmax over [x, −x]
          int64_t best = 0;
          float bv = -kInf;
          for (int64_t u = 0; u < half; ++u) {
            if (x[u] > bv) bv = x[u], best = u;
            if (-x[u] > bv) bv = -x[u], best = u + half;
          }
          return best;
        };
        int64_t bk = argmax2(proj, f1 / 2);
        if (f2 > 1) bk += f1 * argmax2(proj + f1 / 2, f2 / 2);
        sc.bucket[static_cast<size_t>(j)] = static_cast<int32_t>(bk);
      }
      int32_t* perm = st.perm.data() + (t * R + r) * d.N;
      cluster::counting_sort(sc.bucket.data(), d.N, nb, perm, offsets.data());
      const int64_t nch = (d.N + p.chunk - 1) / p.chunk;
      float* o = sc.o.floats(static_cast<size_t>(kMaxChunk * dm.Dvp));
      for (int64_t c = 0; c < nch; ++c) {
        ChunkBlock blk;
        blk.qi = perm + c * p.chunk;
        blk.nq = std::min(p.chunk, d.N - c * p.chunk);
        blk.nk = chunk_keys(perm, d.N, p.chunk, c, sc.keys);
        blk.kj = sc.keys.data();
        build_chunk(in, b, h, dm, mv, khat, blk, sc);
        std::memset(o, 0, sizeof(float) * static_cast<size_t>(blk.nq * dm.Dvp));
        float lse_r[kMaxChunk];
        for (int64_t q = 0; q < blk.nq; ++q) {
          float ps;
          lse_r[q] = tile::softmax_row_extra(blk.s + q * blk.kw, blk.kw, blk.self_s[q], ps);
          if (blk.self[q] && ps > 0.f) simd::axpy_row(o + q * dm.Dvp, in.v.ptr(b, h, blk.qi[q]), dm.Dv, ps);
        }
        mk::gemm_ab(blk.nq, dm.Dvp, blk.nk, blk.s, blk.kw, 1, blk.vr, dm.Dvp, o, dm.Dvp, nullptr);
        for (int64_t q = 0; q < blk.nq; ++q)  // rounds combine online by log-sum-exp
          if (blk.qi[q] < nv) sc.mix.add(out.ptr(b, h, blk.qi[q]), o + q * dm.Dvp, dm.Dv, blk.qi[q], lse_r[q]);
      }
    }
    // Nothing visible in any round (e.g. a padded own key): output 0, lse2 = +inf.
    for (int64_t i = 0; i < nv; ++i) lse2[i] = sc.mix.finish(out.ptr(b, h, i), dm.Dv, i);
  });
}

void attn_reformer_bwd(const AttentionInputs& in, const AttentionDims& d, const ReformerState& st,
                       ConstView dout, View dq, View dv, ReformerWorkspace& ws) {
  const Dims dm{d.N, d.Dk, d.Dv, round_up(d.Dk, mk::kLanes), round_up(d.Dv, mk::kLanes)};
  const int64_t R = st.rounds;
  ws.threads.resize(std::max(ws.threads.size(), static_cast<size_t>(max_threads())));
  parallel_for(d.B * d.H, [&](int64_t t) {
    const int64_t b = t / d.H, h = t % d.H;
    const int64_t nv = valid_queries(in, d, b), mv = valid_keys(in, d, b);
    if (nv == 0 || d.N == 0) return;
    Scratch& sc = ws.threads[static_cast<size_t>(thread_id())];
    float* khat = sc.khat.floats(static_cast<size_t>(d.N * dm.Dkp));   // (N, Dkp)
    float* dkhat = sc.dkhat.floats(static_cast<size_t>(d.N * dm.Dkp)); // (N, Dkp) ∂L/∂k̂
    sc.invn.resize(static_cast<size_t>(d.N));
    normalise(in, b, h, dm, khat, sc.invn.data());
    std::memset(dkhat, 0, sizeof(float) * static_cast<size_t>(d.N * dm.Dkp));
    const float* lse2 = st.lse2.data() + t * d.N;
    float* di = sc.misc.floats(static_cast<size_t>(d.N));  // D_i = dO_i · O_i
    for (int64_t i = 0; i < nv; ++i) di[i] = simd::dot(dout.ptr(b, h, i), st.out.view().ptr(b, h, i), dm.Dv);
    float* go = sc.go.floats(static_cast<size_t>(kMaxChunk * dm.Dvp));
    for (int64_t r = 0; r < R; ++r) {
      const int32_t* perm = st.perm.data() + (t * R + r) * d.N;
      const int64_t nch = (d.N + st.chunk - 1) / st.chunk;
      for (int64_t c = 0; c < nch; ++c) {
        ChunkBlock blk;
        blk.qi = perm + c * st.chunk;
        blk.nq = std::min(st.chunk, d.N - c * st.chunk);
        blk.nk = chunk_keys(perm, d.N, st.chunk, c, sc.keys);
        blk.kj = sc.keys.data();
        build_chunk(in, b, h, dm, mv, khat, blk, sc);
        const int64_t kw = blk.kw;
        float* vt = sc.vt.floats(static_cast<size_t>(dm.Dvp * kw));          // (Dv, kw)
        float* dp = sc.dp.floats(static_cast<size_t>(kMaxChunk * kw));       // (nq, kw) dP, then dS
        float* dqc = sc.dqc.floats(static_cast<size_t>(kMaxChunk * dm.Dkp)); // (nq, Dkp)
        float* dkc = sc.dkc.floats(static_cast<size_t>(kw * dm.Dkp));        // (kw, Dkp)
        float* dvc = sc.dvc.floats(static_cast<size_t>(kw * dm.Dvp));        // (kw, Dvp)
        float ps[kMaxChunk];
        for (int64_t q = 0; q < blk.nq; ++q) {
          const int64_t i = blk.qi[q];
          if (i < nv) {
            simd::copy_row(go + q * dm.Dvp, dout.ptr(b, h, i), dm.Dv, dm.Dvp);
            tile::exp2_row(blk.s + q * kw, kw, lse2[i]);  // P against the all-round log-sum-exp
            ps[q] = std::exp2(blk.self_s[q] - lse2[i]);
          } else {  // padded query: no output, no gradient
            std::memset(go + q * dm.Dvp, 0, sizeof(float) * static_cast<size_t>(dm.Dvp));
            std::fill(blk.s + q * kw, blk.s + (q + 1) * kw, 0.f);
            ps[q] = 0.f;
          }
        }
        mk::pack_transposed(blk.vr, kw, dm.Dv, dm.Dvp, vt, kw);
        std::memset(dp, 0, sizeof(float) * static_cast<size_t>(blk.nq * kw));
        mk::gemm_ab(blk.nq, kw, dm.Dv, go, dm.Dvp, 1, vt, kw, dp, kw, nullptr);
        std::memset(dqc, 0, sizeof(float) * static_cast<size_t>(blk.nq * dm.Dkp));
        for (int64_t q = 0; q < blk.nq; ++q) {
          const int64_t i = blk.qi[q];
          if (i >= nv) {
            std::fill(dp + q * kw, dp + (q + 1) * kw, 0.f);
            continue;
          }
          const float* prow = blk.s + q * kw;
          float* drow = dp + q * kw;
          for (int64_t x = 0; x < kw; ++x) drow[x] = prow[x] * (drow[x] - di[i]);
          if (blk.self[q]) {  // the self-key fallback: s_ii = q_i · k̂_i
            const float dss = ps[q] * (simd::dot(go + q * dm.Dvp, in.v.ptr(b, h, i), dm.Dv) - di[i]);
            simd::axpy_row(dqc + q * dm.Dkp, khat + i * dm.Dkp, dm.D, dss);
            simd::axpy_row(dkhat + i * dm.Dkp, in.q.ptr(b, h, i), dm.D, dss);
            simd::axpy_row(dv.ptr(b, h, i), go + q * dm.Dvp, dm.Dv, ps[q]);
          }
        }
        // s = q·k̂ -> dq += dS·K̂ ; dk̂ += dSᵀ·q (against q·log2 e, undone by ln 2) ; dv += Pᵀ·dO
        mk::gemm_ab(blk.nq, dm.Dkp, blk.nk, dp, kw, 1, blk.kr, dm.Dkp, dqc, dm.Dkp, nullptr);
        std::memset(dkc, 0, sizeof(float) * static_cast<size_t>(kw * dm.Dkp));
        std::memset(dvc, 0, sizeof(float) * static_cast<size_t>(kw * dm.Dvp));
        mk::gemm_ab(blk.nk, dm.Dkp, blk.nq, dp, 1, kw, blk.qs, dm.Dkp, dkc, dm.Dkp, nullptr);
        mk::gemm_ab(blk.nk, dm.Dvp, blk.nq, blk.s, 1, kw, go, dm.Dvp, dvc, dm.Dvp, nullptr);
        for (int64_t q = 0; q < blk.nq; ++q)
          if (blk.qi[q] < nv) simd::axpy_row(dq.ptr(b, h, blk.qi[q]), dqc + q * dm.Dkp, dm.D);
        for (int64_t x = 0; x < blk.nk; ++x) {
          simd::axpy_row(dkhat + blk.kj[x] * dm.Dkp, dkc + x * dm.Dkp, dm.D, kLn2);
          simd::axpy_row(dv.ptr(b, h, blk.kj[x]), dvc + x * dm.Dvp, dm.Dv);
        }
      }
    }
    // k̂ = q/|q| -> dq += (dk̂ − (k̂·dk̂) k̂) / |q|
    for (int64_t j = 0; j < d.N; ++j) {
      const float* kh = khat + j * dm.Dkp;
      const float* g = dkhat + j * dm.Dkp;
      const float proj = simd::dot(kh, g, dm.D), inv = sc.invn[static_cast<size_t>(j)];
      float* gq = dq.ptr(b, h, j);
      for (int64_t e = 0; e < dm.D; ++e) gq[e] += (g[e] - proj * kh[e]) * inv;
    }
  });
}

void attn_reformer_ref(const RefProblem& pr, const ReformerState& st, std::vector<double>& out) {
  const AttentionDims& d = pr.d;
  out.assign(static_cast<size_t>(d.B * d.H * d.N * d.Dv), 0.0);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t t = b * d.H + h, nv = pr.nq(b), mv = pr.nk(b);
      auto logit = [&](int64_t i, int64_t j) {
        double nj = 0, s = 0;
        for (int64_t e = 0; e < d.Dk; ++e) nj += pr.qe(b, h, j, e) * pr.qe(b, h, j, e);
        for (int64_t e = 0; e < d.Dk; ++e) s += pr.qe(b, h, i, e) * pr.qe(b, h, j, e);
        return nj > 0 ? s / std::sqrt(nj) : 0.0;
      };
      std::vector<std::vector<int64_t>> seen(static_cast<size_t>(d.N));
      std::vector<int32_t> keys;
      for (int64_t r = 0; r < st.rounds; ++r) {
        const int32_t* perm = st.perm.data() + (t * st.rounds + r) * d.N;
        const int64_t nch = (d.N + st.chunk - 1) / st.chunk;
        for (int64_t c = 0; c < nch; ++c) {
          chunk_keys(perm, d.N, st.chunk, c, keys);
          for (int64_t x = c * st.chunk; x < std::min(d.N, (c + 1) * st.chunk); ++x) {
            const int64_t i = perm[x];
            bool any = false;
            for (int32_t j : keys)
              if (j < mv && j != i && (!pr.causal || j <= i)) {
                seen[static_cast<size_t>(i)].push_back(j);
                any = true;
              }
            if (!any && i < mv) seen[static_cast<size_t>(i)].push_back(i);
          }
        }
      }
      for (int64_t i = 0; i < nv; ++i) {
        const auto& ks = seen[static_cast<size_t>(i)];
        if (ks.empty()) continue;
        std::vector<double> s(ks.size());
        double mx = -INFINITY, z = 0;
        for (size_t x = 0; x < ks.size(); ++x) mx = std::max(mx, s[x] = logit(i, ks[x]));
        for (auto& a : s) z += (a = std::exp(a - mx));
        double* o = out.data() + (t * d.N + i) * d.Dv;
        for (size_t x = 0; x < ks.size(); ++x)
          for (int64_t e = 0; e < d.Dv; ++e) o[e] += s[x] / z * pr.ve(b, h, ks[x], e);
      }
    }
}

namespace {

class ReformerAttention final : public Attention {
 public:
  explicit ReformerAttention(const ReformerParams& p) : p_(p), ws_(make_reformer_workspace()) {
    caps_ = Capabilities{.causal = true, .query_lengths = true, .key_lengths = true, .bias = false,
                         .cross = false, .gqa = false, .trainable = true};
  }
  std::string name() const override {
    return detail::concat("reformer:rounds=", p_.rounds, ",chunk=", p_.chunk,
                          p_.buckets > 0 ? detail::concat(",buckets=", p_.buckets) : std::string(),
                          ",seed=", p_.seed);
  }
  const Capabilities& capabilities() const override { return caps_; }
  void forward(const AttentionInputs& in, View out, Context& ctx) override {
    const AttentionDims d = validate_inputs(in, caps_, "reformer");
    check_shared_qk(in);
    validate_output(out, Shape{d.B, d.H, d.N, d.Dv}, "out", "reformer");
    ReformerState& st = ctx.state<ReformerState>();
    attn_reformer_fwd(in, d, p_, calls_++, out, st, *ws_);
    save_output(out, st.out);
  }
  void backward(const AttentionInputs& in, const Context& ctx, ConstView dout, View dq, View dk,
                View dv) override {
    const AttentionDims d = validate_inputs(in, caps_, "reformer");
    check_shared_qk(in);
    const ReformerState& st = ctx.state<ReformerState>();
    check(st.out.shape() == Shape{d.B, d.H, d.N, d.Dv}, "reformer: backward inputs have shapes ",
          "other than the forward's (q is now ", in.q.shape.str(), ")");
    validate_backward(in, d, dout, dq, dk, dv, "reformer");
    attn_reformer_bwd(in, d, st, dout, dq, dv, *ws_);
  }

 private:
  // Shared QK: the K input must be Q itself (the same view, or equal values).
  static void check_shared_qk(const AttentionInputs& in) {
    check(in.k.shape == in.q.shape, "reformer: shared-QK attention needs k identical to q, but q is ",
          in.q.shape.str(), " and k is ", in.k.shape.str());
    if (in.k.data == in.q.data && in.k.strides == in.q.strides) return;
    for (int64_t b = 0; b < in.q.dim(0); ++b)
      for (int64_t h = 0; h < in.q.dim(1); ++h)
        for (int64_t i = 0; i < in.q.dim(2); ++i)
          check(std::memcmp(in.q.ptr(b, h, i), in.k.ptr(b, h, i), sizeof(float) * static_cast<size_t>(in.q.dim(3))) == 0,
                "reformer: shared-QK attention needs k identical to q; they differ at (", b, ", ", h,
                ", ", i, ")");
  }
  ReformerParams p_;
  Capabilities caps_;
  uint64_t calls_ = 0;
  ReformerWorkspacePtr ws_;
};

}  // namespace

std::unique_ptr<Attention> make_reformer(const Spec& spec) {
  SpecReader r(spec);
  ReformerParams p;
  p.rounds = r.get_int("rounds", 1, 1, 64);
  p.chunk = r.get_int("chunk", 32, 1, kMaxChunk);
  p.buckets = r.get_int("buckets", 0, 2, int64_t{1} << 30);
  p.seed = static_cast<uint64_t>(r.get_int("seed", 0, 0, int64_t{1} << 62));
  r.finish();
  if (p.buckets > 0) reformer_buckets(p, 0);  // validates an explicit count now
  return std::make_unique<ReformerAttention>(p);
}

}  // namespace clattn
