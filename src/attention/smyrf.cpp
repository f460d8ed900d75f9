// SMYRF attention. Per round, queries and keys are projected on one Gaussian direction after the
// asymmetric transform F(q) = [q, 0, sqrt(MQ² + MK² − |q|²)], G(k) = [k, sqrt(MQ² + MK² − |k|²), 0]
// (F(q)·G(k) = q·k, and |F(q)| = |G(k)|, so close projections mean large inner products); both
// are sorted independently and cut into consecutive clusters; cluster c of queries attends
// cluster c of keys with the real logits s·q·k. Rounds combine by log-sum-exp, i.e. one softmax
// over the keys of all rounds (a key met in two rounds counts twice, as in the reference).
//
// Choices where the reference is silent or stricter:
// - Sizes need not divide: nc = max(ceil(N_valid/q_cluster), ceil(M_valid/k_cluster)) clusters;
//   the last ones may be short, and with N != M a cluster may be empty on one side (its queries
//   then see nothing in that round).
// - Padded keys and queries are left out of the sort (equivalent to sorting them last, masked).
// - Causal (not in the reference): inside a cluster keys after the query's position i + M − N
//   are masked, and a query always sees the key at its own position: when that key is not among
//   its cluster's keys it joins the query's softmax as one extra key in that round.
// Work is parallel over (batch, head); each (round, cluster) is three small products on gathered
// blocks. Memory O((N + M)·rounds) for the partition.
#include "attention/smyrf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "attention/full.h"
#include "attention/tile_ops.h"
#include "attention/grad_util.h"
#include "attention/variants.h"
#include "clattn/parallel.h"
#include "clattn/rng.h"
#include "cluster/cluster.h"
#include "core/microkernel.h"
#include "core/simd.h"

namespace clattn {

using mk::round_up;
using tile::kInf;
using tile::kLog2e;

namespace {

struct Scratch {
  std::vector<float> proj;            // (N) projections of one round
  cluster::RadixScratch radix;
  tile::RoundMix mix;             // rounds combined by log-sum-exp
  Workspace qs, qr, kr, kt, vr, vt, s, o, go, dp, dqc, dkc, dvc, misc;
};

}  // namespace

struct SmyrfWorkspace {
  Workspace part;  // (B, H, M, Dk + Dv) backward with GQA
  std::vector<Scratch> threads;
};
void SmyrfWorkspaceDeleter::operator()(SmyrfWorkspace* w) const { delete w; }
SmyrfWorkspacePtr make_smyrf_workspace() { return SmyrfWorkspacePtr(new SmyrfWorkspace); }

namespace {

int64_t num_clusters(const SmyrfState& st, int64_t nv, int64_t mv) {
  return std::max((nv + st.qc - 1) / st.qc, (mv + st.kc - 1) / st.kc);
}

// One (round, cluster) of one head, gathered: scaled query rows, key rows, their transposes, and
// the scores S (nq, kw) in log2 units with the masks applied; own[r] is the causal self-key
// logit of row r (-inf when not needed), own_j[r] its key index.
struct Block {
  int64_t nq = 0, nk = 0, kw = 0;
  const int32_t* qi = nullptr;
  const int32_t* kj = nullptr;
  float* qs;   // (nq, Dkp) q · c
  float* kr;   // (kw, Dkp) key rows
  float* vr;   // (kw, Dvp) value rows
  float* s;    // (nq, kw)
  float own[64];
  int32_t own_j[64];
};

void build_block(const AttentionInputs& in, const AttentionDims& d, int64_t b, int64_t h, float c,
                 int64_t mv, Block& blk, Scratch& sc) {
  const int64_t D = d.Dk, Dv = d.Dv, Dkp = round_up(D, mk::kLanes), Dvp = round_up(Dv, mk::kLanes);
  const int64_t hk = h / d.group(), kw = round_up(std::max<int64_t>(blk.nk, 1), mk::kLanes);
  blk.kw = kw;
  blk.qs = sc.qs.floats(static_cast<size_t>(64 * Dkp));
  blk.kr = sc.kr.floats(static_cast<size_t>(kw * Dkp));
  blk.vr = sc.vr.floats(static_cast<size_t>(kw * Dvp));
  blk.s = sc.s.floats(static_cast<size_t>(64 * kw));
  float* kt = sc.kt.floats(static_cast<size_t>(Dkp * kw));  // (D, kw)
  for (int64_t r = 0; r < blk.nq; ++r) simd::copy_row(blk.qs + r * Dkp, in.q.ptr(b, h, blk.qi[r]), D, Dkp, c);
  for (int64_t x = 0; x < kw; ++x) {
    if (x < blk.nk) {
      simd::copy_row(blk.kr + x * Dkp, in.k.ptr(b, hk, blk.kj[x]), D, Dkp);
      simd::copy_row(blk.vr + x * Dvp, in.v.ptr(b, hk, blk.kj[x]), Dv, Dvp);
    } else {
      std::memset(blk.kr + x * Dkp, 0, sizeof(float) * static_cast<size_t>(Dkp));
      std::memset(blk.vr + x * Dvp, 0, sizeof(float) * static_cast<size_t>(Dvp));
    }
  }
  mk::pack_transposed(blk.kr, kw, D, Dkp, kt, kw);
  std::memset(blk.s, 0, sizeof(float) * static_cast<size_t>(blk.nq * kw));
  mk::gemm_ab(blk.nq, kw, D, blk.qs, Dkp, 1, kt, kw, blk.s, kw, nullptr);
  const int64_t off = d.M - d.N;
  for (int64_t r = 0; r < blk.nq; ++r) {
    float* row = blk.s + r * kw;
    tile::mask_tail(row, kw, blk.nk);
    blk.own[r] = -kInf;
    blk.own_j[r] = -1;
    if (!in.causal) continue;
    const int64_t pos = blk.qi[r] + off;
    bool self_in = false;
    for (int64_t x = 0; x < blk.nk; ++x) {
      if (blk.kj[x] > pos) row[x] = -kInf;
      self_in |= blk.kj[x] == pos;
    }
    if (!self_in && pos >= 0 && pos < mv) {
      blk.own_j[r] = static_cast<int32_t>(pos);
      blk.own[r] = simd::dot(blk.qs + r * Dkp, in.k.ptr(b, hk, pos), D);
    }
  }
}

// Requests the rows block `cl` will gather (sorted order means random rows; at long N they are
// out of cache, and fetching them one block ahead hides the latency).
void prefetch_block(const AttentionInputs& in, const AttentionDims& d, int64_t b, int64_t h,
                    const int32_t* qp, const int32_t* kp, int64_t nv, int64_t mv, int64_t qc,
                    int64_t kc, int64_t cl, ConstView extra) {
  const int64_t hk = h / d.group();
  for (int64_t x = cl * qc; x < std::min(nv, (cl + 1) * qc); ++x) {
    simd::prefetch_row(in.q.ptr(b, h, qp[x]), d.Dk, false);
    if (!extra.empty()) simd::prefetch_row(extra.ptr(b, h, qp[x]), d.Dv, true);
  }
  for (int64_t x = cl * kc; x < std::min(mv, (cl + 1) * kc); ++x) {
    simd::prefetch_row(in.k.ptr(b, hk, kp[x]), d.Dk, false);
    simd::prefetch_row(in.v.ptr(b, hk, kp[x]), d.Dv, false);
  }
}

}  // namespace

void attn_smyrf_fwd(const AttentionInputs& in, const AttentionDims& d, const SmyrfParams& p,
                    uint64_t call, View out, SmyrfState& st, SmyrfWorkspace& ws) {
  const int64_t D = d.Dk, Dv = d.Dv, Dvp = round_up(Dv, mk::kLanes), R = p.hashes;
  const float scale = p.scale > 0 ? p.scale : 1.f / std::sqrt(static_cast<float>(D));
  const float c = scale * kLog2e;
  st.rounds = R;
  st.qc = p.q_cluster;
  st.kc = p.k_cluster;
  st.qperm.assign(static_cast<size_t>(d.B * d.H * R * d.N), 0);
  st.kperm.assign(static_cast<size_t>(d.B * d.H * R * d.M), 0);
  st.lse2.resize(Shape{d.B, d.H, d.N});
  // One Gaussian direction of the transformed space (D + 2) per round, shared by all heads.
  const Rng rng(p.seed);
  std::vector<float> dirs(static_cast<size_t>(R * (D + 2)));
  for (int64_t i = 0; i < R * (D + 2); ++i) dirs[static_cast<size_t>(i)] = rng.normal(call, static_cast<uint64_t>(i));
  ws.threads.resize(std::max(ws.threads.size(), static_cast<size_t>(max_threads())));

  parallel_for(d.B * d.H, [&](int64_t t) {
    const int64_t b = t / d.H, h = t % d.H, hk = h / d.group();
    const int64_t nv = valid_queries(in, d, b), mv = valid_keys(in, d, b);
    Scratch& sc = ws.threads[static_cast<size_t>(thread_id())];
    float* lse2 = st.lse2.data() + t * d.N;
    for (int64_t i = 0; i < d.N; ++i) std::memset(out.ptr(b, h, i), 0, sizeof(float) * static_cast<size_t>(Dv));
    std::fill(lse2, lse2 + d.N, 0.f);
    if (nv == 0) return;
    // Norms for the asymmetric transform.
    double mq = 0, mk2 = 0;
    for (int64_t i = 0; i < nv; ++i) mq = std::max(mq, static_cast<double>(simd::dot(in.q.ptr(b, h, i), in.q.ptr(b, h, i), D)));
    for (int64_t j = 0; j < mv; ++j) mk2 = std::max(mk2, static_cast<double>(simd::dot(in.k.ptr(b, hk, j), in.k.ptr(b, hk, j), D)));
    const double total = mq + mk2;
    sc.mix.reset(nv);
    for (int64_t r = 0; r < R; ++r) {
      const float* a = dirs.data() + r * (D + 2);
      int32_t* qp = st.qperm.data() + (t * R + r) * d.N;
      int32_t* kp = st.kperm.data() + (t * R + r) * d.M;
      auto sort_by_projection = [&](ConstView x, int64_t head, int64_t n, int64_t extra, int32_t* perm) {
        sc.proj.resize(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) {
          const float* row = x.ptr(b, head, i);
          const double sq = simd::dot(row, row, D);
          sc.proj[static_cast<size_t>(i)] =
              simd::dot(a, row, D) + a[extra] * static_cast<float>(std::sqrt(std::max(0.0, total - sq)));
        }
        cluster::sort_by_key(sc.proj.data(), n, perm, sc.radix);  // stable: ties keep index order
      };
      sort_by_projection(in.q, h, nv, D + 1, qp);   // F(q) = [q, 0, ·]
      sort_by_projection(in.k, hk, mv, D, kp);      // G(k) = [k, ·, 0]
      const int64_t nc = num_clusters(st, nv, mv);
      float* o = sc.o.floats(static_cast<size_t>(64 * Dvp));  // (nq, Dvp) this round's output
      for (int64_t cl = 0; cl < nc; ++cl) {
        prefetch_block(in, d, b, h, qp, kp, nv, mv, st.qc, st.kc, cl + 3, out);
        Block blk;
        blk.qi = qp + std::min(cl * st.qc, nv);
        blk.nq = std::clamp(nv - cl * st.qc, int64_t{0}, st.qc);
        blk.kj = kp + std::min(cl * st.kc, mv);
        blk.nk = std::clamp(mv - cl * st.kc, int64_t{0}, st.kc);
        if (blk.nq == 0) continue;
        build_block(in, d, b, h, c, mv, blk, sc);
        std::memset(o, 0, sizeof(float) * static_cast<size_t>(blk.nq * Dvp));
        float lse_r[64];
        for (int64_t q = 0; q < blk.nq; ++q) {
          float po;
          lse_r[q] = tile::softmax_row_extra(blk.s + q * blk.kw, blk.kw, blk.own[q], po);
          if (blk.own_j[q] >= 0 && po > 0.f) simd::axpy_row(o + q * Dvp, in.v.ptr(b, hk, blk.own_j[q]), Dv, po);
        }
        mk::gemm_ab(blk.nq, Dvp, blk.nk, blk.s, blk.kw, 1, blk.vr, Dvp, o, Dvp, nullptr);
        for (int64_t q = 0; q < blk.nq; ++q) sc.mix.add(out.ptr(b, h, blk.qi[q]), o + q * Dvp, Dv, blk.qi[q], lse_r[q]);
      }
    }
    // A query that saw no key in any round keeps output 0 and lse2 = +inf (backward adds 0).
    for (int64_t i = 0; i < nv; ++i) lse2[i] = sc.mix.finish(out.ptr(b, h, i), Dv, i);
  });
}

void attn_smyrf_bwd(const AttentionInputs& in, const AttentionDims& d, const SmyrfParams& p,
                    const SmyrfState& st, ConstView dout, View dq, View dk, View dv,
                    SmyrfWorkspace& ws) {
  const int64_t D = d.Dk, Dv = d.Dv, Dkp = round_up(D, mk::kLanes), Dvp = round_up(Dv, mk::kLanes);
  const int64_t R = st.rounds, G = d.group();
  const float scale = p.scale > 0 ? p.scale : 1.f / std::sqrt(static_cast<float>(D));
  const float c = scale * kLog2e;
  ws.threads.resize(std::max(ws.threads.size(), static_cast<size_t>(max_threads())));
  float* part = G > 1 ? ws.part.floats(static_cast<size_t>(d.B * d.H * d.M * (Dkp + Dvp))) : nullptr;
  parallel_for(d.B * d.H, [&](int64_t t) {
    const int64_t b = t / d.H, h = t % d.H, hk = h / G;
    const int64_t nv = valid_queries(in, d, b), mv = valid_keys(in, d, b);
    float* pk = part ? part + t * d.M * (Dkp + Dvp) : nullptr;  // (M, Dkp + Dvp)
    if (pk) std::memset(pk, 0, sizeof(float) * static_cast<size_t>(d.M * (Dkp + Dvp)));
    auto gk = [&](int64_t j) { return pk ? pk + j * (Dkp + Dvp) : dk.ptr(b, hk, j); };
    auto gv = [&](int64_t j) { return pk ? pk + j * (Dkp + Dvp) + Dkp : dv.ptr(b, hk, j); };
    if (nv == 0) return;
    Scratch& sc = ws.threads[static_cast<size_t>(thread_id())];
    const float* lse2 = st.lse2.data() + t * d.N;
    float* di = sc.misc.floats(static_cast<size_t>(nv));  // (nv) D_i = dO_i · O_i
    for (int64_t i = 0; i < nv; ++i) di[i] = simd::dot(dout.ptr(b, h, i), st.out.view().ptr(b, h, i), Dv);
    float* go = sc.go.floats(static_cast<size_t>(64 * Dvp));
    for (int64_t r = 0; r < R; ++r) {
      const int32_t* qp = st.qperm.data() + (t * R + r) * d.N;
      const int32_t* kp = st.kperm.data() + (t * R + r) * d.M;
      const int64_t nc = num_clusters(st, nv, mv);
      for (int64_t cl = 0; cl < nc; ++cl) {
        prefetch_block(in, d, b, h, qp, kp, nv, mv, st.qc, st.kc, cl + 3, dout);
        Block blk;
        blk.qi = qp + std::min(cl * st.qc, nv);
        blk.nq = std::clamp(nv - cl * st.qc, int64_t{0}, st.qc);
        blk.kj = kp + std::min(cl * st.kc, mv);
        blk.nk = std::clamp(mv - cl * st.kc, int64_t{0}, st.kc);
        if (blk.nq == 0) continue;
        build_block(in, d, b, h, c, mv, blk, sc);
        const int64_t kw = blk.kw;
        float* vt = sc.vt.floats(static_cast<size_t>(Dvp * kw));    // (Dv, kw) V_cᵀ
        float* dp = sc.dp.floats(static_cast<size_t>(64 * kw));     // (nq, kw) dP, then dS
        float* dqc = sc.dqc.floats(static_cast<size_t>(64 * Dkp));  // (nq, Dkp)
        float* dkc = sc.dkc.floats(static_cast<size_t>(kw * Dkp));  // (kw, Dkp)
        float* dvc = sc.dvc.floats(static_cast<size_t>(kw * Dvp));  // (kw, Dvp)
        for (int64_t q = 0; q < blk.nq; ++q)
          simd::copy_row(go + q * Dvp, dout.ptr(b, h, blk.qi[q]), Dv, Dvp);
        // P = 2^(S − lse2) against the all-round log-sum-exp: one softmax over every round's keys
        float po[64];
        for (int64_t q = 0; q < blk.nq; ++q) {
          const float l2 = lse2[blk.qi[q]];
          tile::exp2_row(blk.s + q * kw, kw, l2);
          po[q] = std::exp2(blk.own[q] - l2);
        }
        mk::pack_transposed(blk.vr, kw, Dv, Dvp, vt, kw);
        std::memset(dp, 0, sizeof(float) * static_cast<size_t>(blk.nq * kw));
        mk::gemm_ab(blk.nq, kw, Dv, go, Dvp, 1, vt, kw, dp, kw, nullptr);
        std::memset(dqc, 0, sizeof(float) * static_cast<size_t>(blk.nq * Dkp));
        for (int64_t q = 0; q < blk.nq; ++q) {
          const int64_t i = blk.qi[q];
          const float* prow = blk.s + q * kw;
          float* drow = dp + q * kw;
          for (int64_t x = 0; x < kw; ++x) drow[x] = prow[x] * (drow[x] - di[i]) * scale;
          if (blk.own_j[q] >= 0) {  // the causal self key of this round
            const int64_t j = blk.own_j[q];
            const float dso = po[q] * (simd::dot(go + q * Dvp, in.v.ptr(b, hk, j), Dv) - di[i]) * scale;
            simd::axpy_row(dqc + q * Dkp, in.k.ptr(b, hk, j), D, dso);
            simd::axpy_row(gk(j), in.q.ptr(b, h, i), D, dso);
            simd::axpy_row(gv(j), go + q * Dvp, Dv, po[q]);
          }
        }
        // dQ += dS·K_c ; dK_c += dSᵀ·(c Q)/c ; dV_c += Pᵀ·dO
        mk::gemm_ab(blk.nq, Dkp, blk.nk, dp, kw, 1, blk.kr, Dkp, dqc, Dkp, nullptr);
        std::memset(dkc, 0, sizeof(float) * static_cast<size_t>(kw * Dkp));
        std::memset(dvc, 0, sizeof(float) * static_cast<size_t>(kw * Dvp));
        mk::gemm_ab(blk.nk, Dkp, blk.nq, dp, 1, kw, blk.qs, Dkp, dkc, Dkp, nullptr);
        mk::gemm_ab(blk.nk, Dvp, blk.nq, blk.s, 1, kw, go, Dvp, dvc, Dvp, nullptr);
        for (int64_t q = 0; q < blk.nq; ++q) simd::axpy_row(dq.ptr(b, h, blk.qi[q]), dqc + q * Dkp, D);
        for (int64_t x = 0; x < blk.nk; ++x) {
          simd::axpy_row(gk(blk.kj[x]), dkc + x * Dkp, D, 1.f / c);
          simd::axpy_row(gv(blk.kj[x]), dvc + x * Dvp, Dv);
        }
      }
    }
  });
  if (part) reduce_group_partials(in, d, part, d.M, Dkp + Dvp, Dkp, dk, dv);
}

void attn_smyrf_ref(const RefProblem& pr, const SmyrfState& st, std::vector<double>& out) {
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
          for (int64_t x = cl * st.qc; x < std::min(nv, (cl + 1) * st.qc); ++x) {
            const int64_t i = qp[x], pos = i + d.M - d.N;
            bool self_in = false;
            for (int64_t y = cl * st.kc; y < std::min(mv, (cl + 1) * st.kc); ++y) {
              if (pr.causal && kp[y] > pos) continue;
              self_in |= kp[y] == pos;
              seen[static_cast<size_t>(i)].push_back(kp[y]);
            }
            if (pr.causal && !self_in && pos >= 0 && pos < mv) seen[static_cast<size_t>(i)].push_back(pos);
          }
      }
      for (int64_t i = 0; i < nv; ++i) {
        const auto& keys = seen[static_cast<size_t>(i)];
        if (keys.empty()) continue;
        std::vector<double> s(keys.size());
        double mx = -INFINITY, z = 0;
        for (size_t x = 0; x < keys.size(); ++x) {
          double a = 0;
          for (int64_t e = 0; e < d.Dk; ++e) a += pr.qe(b, h, i, e) * pr.ke(b, h, keys[x], e);
          s[x] = a * pr.scale;
          mx = std::max(mx, s[x]);
        }
        for (auto& a : s) z += (a = std::exp(a - mx));
        double* o = out.data() + (t * d.N + i) * d.Dv;
        for (size_t x = 0; x < keys.size(); ++x)
          for (int64_t e = 0; e < d.Dv; ++e) o[e] += s[x] / z * pr.ve(b, h, keys[x], e);
      }
    }
}

namespace {

class SmyrfAttention final : public Attention {
 public:
  explicit SmyrfAttention(const SmyrfParams& p) : p_(p), ws_(make_smyrf_workspace()) {
    caps_ = Capabilities{.causal = true, .query_lengths = true, .key_lengths = true, .bias = false,
                         .cross = true, .gqa = true, .trainable = true};
  }
  std::string name() const override {
    return detail::concat("smyrf:hashes=", p_.hashes, ",q_cluster=", p_.q_cluster, ",k_cluster=",
                          p_.k_cluster, ",seed=", p_.seed,
                          p_.scale > 0 ? detail::concat(",scale=", p_.scale) : std::string());
  }
  const Capabilities& capabilities() const override { return caps_; }
  void forward(const AttentionInputs& in, View out, Context& ctx) override {
    const AttentionDims d = validate_inputs(in, caps_, "smyrf");
    validate_output(out, Shape{d.B, d.H, d.N, d.Dv}, "out", "smyrf");
    SmyrfState& st = ctx.state<SmyrfState>();
    attn_smyrf_fwd(in, d, p_, calls_++, out, st, *ws_);
    save_output(out, st.out);
  }
  void backward(const AttentionInputs& in, const Context& ctx, ConstView dout, View dq, View dk,
                View dv) override {
    const AttentionDims d = validate_inputs(in, caps_, "smyrf");
    const SmyrfState& st = ctx.state<SmyrfState>();
    check(st.out.shape() == Shape{d.B, d.H, d.N, d.Dv}, "smyrf: backward inputs have shapes ",
          "other than the forward's (q is now ", in.q.shape.str(), ")");
    validate_backward(in, d, dout, dq, dk, dv, "smyrf");
    attn_smyrf_bwd(in, d, p_, st, dout, dq, dk, dv, *ws_);
  }

 private:
  SmyrfParams p_;
  Capabilities caps_;
  uint64_t calls_ = 0;
  SmyrfWorkspacePtr ws_;
};

}  // namespace

std::unique_ptr<Attention> make_smyrf(const Spec& spec) {
  SpecReader r(spec);
  SmyrfParams p;
  p.hashes = r.get_int("hashes", 2, 1, 64);
  p.q_cluster = r.get_int("q_cluster", 32, 1, 64);
  p.k_cluster = r.get_int("k_cluster", 32, 1, int64_t{1} << 20);
  p.scale = static_cast<float>(r.get_float("scale", 0.0, 1e-6, 1e6));
  p.seed = static_cast<uint64_t>(r.get_int("seed", 0, 0, int64_t{1} << 62));
  r.finish();
  return std::make_unique<SmyrfAttention>(p);
}

}  // namespace clattn
