// Top-k attention: scores in tiles with the tile microkernel on K packed once per head (as in
// full.cpp), a streaming top-k per query row, then the softmax and the weighted sum over the k
// kept keys. The backward recomputes the k scores of each query from its saved keys and
// log-sum-exp. Queries that see fewer than k keys keep all of them, so k >= valid keys is exactly
// full attention.
#include "attention/validate.h"
#include "attention/topk/topk.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "attention/tile/tile_ops.h"
#include "attention/tile/topk_select.h"
#include "attention/tile/grad_util.h"
#include "attention/registry.h"
#include "attention/work.h"
#include "clattn/threads.h"
#include "core/microkernel.h"
#include "core/simd.h"

namespace clattn {

using mk::kPanel;
using tile::kInf;
using tile::kLn2;
using tile::kLog2e;

namespace {

constexpr int64_t kBr = 64;   // queries per tile
constexpr int64_t kBc = 512;  // keys per tile

struct ThreadScratch {
  Workspace qs, s;
  std::vector<Cand> cand;
  std::vector<int64_t> ncand;
  std::vector<float> thr, p;
  size_t bytes() const { return held_bytes(qs, s, cand, ncand, thr, p); }
};

}  // namespace

struct TopkWorkspace {
  Workspace kpan;   // (B, Hkv, np, Dk, 64)
  Workspace part;   // (B, H, M, Dk + Dv) backward with GQA: per-query-head partial dK, dV
  // Backward of a head split over the team: (2, N, k) dS·scale and P of each kept key; the kept
  // keys as key-major lists of i·k + x (N·k), and per thread and key the list counts (T, M).
  Workspace coef;
  std::vector<int64_t> lists, counts, starts;  // starts (M + 1): each key's list
  std::vector<ThreadScratch> threads;
  size_t bytes() const {
    size_t n = held_bytes(kpan, part, coef, lists, counts, starts, threads);
    for (const ThreadScratch& t : threads) n += t.bytes();
    return n;
  }
};

size_t topk_workspace_bytes(const AttentionDims& d, int64_t k, Mode mode, int threads) {
  const int64_t Mp = mk::round_up(d.M, kPanel), BH = d.B * d.H;
  int64_t bytes = static_cast<int64_t>(sizeof(float)) * std::max<int64_t>(1, d.B * d.Hkv * Mp * d.Dk) +
                  BH * d.N * (k * 4 + 4 + 4) +
                  threads * (static_cast<int64_t>(sizeof(ThreadScratch)) + 4 * (kBr * d.Dk + kBr * kBc) +
                             kBr * 2 * k * static_cast<int64_t>(sizeof(Cand)) + kBr * 12 + 2 * k * 4);
  if (mode == Mode::training && d.group() > 1) bytes += 4 * BH * d.M * (d.Dk + d.Dv);
  if (mode == Mode::training) bytes += d.N * k * (2 * 4 + 8) + 8 * (threads + 1) * (d.M + 1);
  return static_cast<size_t>(bytes);
}

void attn_topk_fwd(const AttentionInputs& in, const AttentionDims& d, int64_t k, float scale,
                   View out, TopkState& st, TopkWorkspace& ws) {
  const int64_t D = d.Dk, Dv = d.Dv, np = (d.M + kPanel - 1) / kPanel, Mp = np * kPanel;
  const float c = scale * kLog2e;
  st.k = k;
  st.idx.assign(static_cast<size_t>(d.B * d.H * d.N * k), -1);
  st.cnt.assign(static_cast<size_t>(d.B * d.H * d.N), 0);
  st.lse.resize(Shape{d.B, d.H, d.N});
  ws.threads.resize(std::max(ws.threads.size(), static_cast<size_t>(max_threads())));
  float* kpan = ws.kpan.floats(static_cast<size_t>(std::max<int64_t>(1, d.B * d.Hkv * Mp * D)));
  parallel_for(d.B * d.Hkv, [&](int64_t t) {
    mk::pack_panels(in.k.ptr(t / d.Hkv, t % d.Hkv, 0), d.M, D, in.k.stride(2), kpan + t * Mp * D);
  });
  const int64_t ntiles = (d.N + kBr - 1) / kBr;
  parallel_for(d.B * d.H * ntiles, [&](int64_t task, int thread) {
    const int64_t t = task / ntiles, q0 = (in.causal ? ntiles - 1 - task % ntiles : task % ntiles) * kBr;
    const int64_t b = t / d.H, h = t % d.H, hk = h / d.group();
    const int64_t nv = valid_queries(in, d, b), mv = valid_keys(in, d, b), off = d.M - d.N;
    auto key_end = [&](int64_t i) { return in.causal ? std::clamp(i + off + 1, int64_t{0}, mv) : mv; };
    for (int64_t i = std::max(q0, nv); i < std::min(q0 + kBr, d.N); ++i) {  // padded rows
      std::memset(out.ptr(b, h, i), 0, sizeof(float) * static_cast<size_t>(Dv));
      st.lse.data()[t * d.N + i] = 0.f;
    }
    const int64_t rows = std::min(kBr, nv - q0);
    if (rows <= 0) return;
    ThreadScratch& sc = ws.threads[static_cast<size_t>(thread)];
    float* qs = sc.qs.floats(static_cast<size_t>(kBr * D));   // (Br, D) q·c
    float* s = sc.s.floats(static_cast<size_t>(kBr * kBc));   // (Br, Bc) scores
    sc.cand.resize(static_cast<size_t>(kBr * 2 * k));
    sc.ncand.assign(static_cast<size_t>(rows), 0);
    sc.thr.assign(static_cast<size_t>(rows), -kInf);
    sc.p.resize(static_cast<size_t>(k));
    mk::pack_rows(in.q.ptr(b, h, q0), rows, D, in.q.stride(2), qs, rows, D, c);
    const float* kp = kpan + (b * d.Hkv + hk) * Mp * D;
    const int64_t kend = key_end(q0 + rows - 1);
    for (int64_t k0 = 0; k0 < kend; k0 += kBc) {
      const int64_t npan = (std::min(kBc, kend - k0) + kPanel - 1) / kPanel, width = npan * kPanel;
      mk::gemm_abt(rows, npan, D, qs, D, kp + k0 * D, s, kBc);
      for (int64_t r = 0; r < rows; ++r) {
        float* row = s + r * kBc;
        tile::mask_tail(row, width, key_end(q0 + r) - k0);
        top_scan(row, width, k0, sc.cand.data() + r * 2 * k, sc.ncand[static_cast<size_t>(r)],
                 sc.thr[static_cast<size_t>(r)], k);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = q0 + r;
      Cand* cand = sc.cand.data() + r * 2 * k;
      int64_t n = sc.ncand[static_cast<size_t>(r)];
      top_compact(cand, n, k);
      float* o = out.ptr(b, h, i);
      std::memset(o, 0, sizeof(float) * static_cast<size_t>(Dv));
      if (n == 0) {  // no visible key
        st.lse.data()[t * d.N + i] = kInf;
        continue;
      }
      float mx = -kInf;
      for (int64_t x = 0; x < n; ++x) mx = std::max(mx, cand[x].v);
      float sum = 0.f;
      for (int64_t x = 0; x < n; ++x) sum += (sc.p[static_cast<size_t>(x)] = std::exp2(cand[x].v - mx));
      int32_t* idx = st.idx.data() + (t * d.N + i) * k;
      for (int64_t x = 0; x < n; ++x) {
        idx[x] = cand[x].i;
        simd::axpy_row(o, in.v.ptr(b, hk, cand[x].i), Dv, sc.p[static_cast<size_t>(x)] / sum);
      }
      st.cnt[static_cast<size_t>(t * d.N + i)] = static_cast<int32_t>(n);
      st.lse.data()[t * d.N + i] = (mx + std::log2(sum)) * kLn2;
    }
  });
}

void attn_topk_bwd(const AttentionInputs& in, const AttentionDims& d, float scale,
                   const TopkState& st, ConstView dout, View dq, View dk, View dv,
                   TopkWorkspace& ws) {
  const int64_t D = d.Dk, Dv = d.Dv, G = d.group(), k = st.k, BH = d.B * d.H;
  ws.threads.resize(std::max(ws.threads.size(), static_cast<size_t>(max_threads())));
  // With GQA several query heads write the same key rows: each gets its own partial dK, dV.
  float* part = G > 1 ? ws.part.floats(static_cast<size_t>(BH * d.M * (D + Dv))) : nullptr;
  // Query i of head t: adds its dq and hands each kept key x its coefficients, key(x, dS·s, P).
  auto row = [&](int64_t t, int64_t i, ThreadScratch& sc, auto&& key) {
    const int64_t b = t / d.H, h = t % d.H, hk = h / G;
    const int64_t n = st.cnt[static_cast<size_t>(t * d.N + i)];
    if (n == 0) return;
    sc.p.resize(static_cast<size_t>(2 * k));
    float* p = sc.p.data();
    float* ds = p + k;
    const int32_t* idx = st.idx.data() + (t * d.N + i) * k;
    const float* q = in.q.ptr(b, h, i);
    const float* g = dout.ptr(b, h, i);
    // P = softmax over the kept keys of s q·k, normalised again here rather than through the
    // saved log-sum-exp: with large logits the softmax saturates and exp(s − lse) drifts from
    // a sum of 1 by the lse's rounding, which dS = P ∘ (dP − Σ P dP) then amplifies.
    // dP = dO·v ; dS = P ∘ (dP − Σ P dP) · s
    float mx = -kInf;
    for (int64_t x = 0; x < n; ++x) mx = std::max(mx, p[x] = scale * simd::dot(q, in.k.ptr(b, hk, idx[x]), D));
    double sum = 0;
    for (int64_t x = 0; x < n; ++x) sum += p[x] = std::exp(p[x] - mx);
    float di = 0.f;
    for (int64_t x = 0; x < n; ++x) {
      p[x] = static_cast<float>(p[x] / sum);
      ds[x] = simd::dot(g, in.v.ptr(b, hk, idx[x]), Dv);
      di += p[x] * ds[x];
    }
    float* gq = dq.ptr(b, h, i);
    for (int64_t x = 0; x < n; ++x) {
      const float sx = p[x] * (ds[x] - di) * scale;
      simd::axpy_row(gq, in.k.ptr(b, hk, idx[x]), D, sx);
      key(x, sx, p[x]);
    }
  };
  auto key_grads = [&](int64_t t, int64_t j) {  // dK row, dV row of key j of head t
    const int64_t b = t / d.H, hk = t % d.H / G;
    float* pk = part ? part + (t * d.M + j) * (D + Dv) : nullptr;
    return std::pair<float*, float*>{pk ? pk : dk.ptr(b, hk, j), pk ? pk + D : dv.ptr(b, hk, j)};
  };
  if (!split_tasks(BH)) {
    parallel_for(BH, [&](int64_t t, int thread) {
      const int64_t b = t / d.H, h = t % d.H, nv = valid_queries(in, d, b);
      if (part) std::memset(part + t * d.M * (D + Dv), 0, sizeof(float) * static_cast<size_t>(d.M * (D + Dv)));
      ThreadScratch& sc = ws.threads[static_cast<size_t>(thread)];
      for (int64_t i = 0; i < nv; ++i) {
        const int32_t* idx = st.idx.data() + (t * d.N + i) * k;
        row(t, i, sc, [&](int64_t x, float sx, float px) {
          const auto [gk, gv] = key_grads(t, idx[x]);
          simd::axpy_row(gk, in.q.ptr(b, h, i), D, sx);
          simd::axpy_row(gv, dout.ptr(b, h, i), Dv, px);
        });
      }
    });
  } else {
    // One head at a time, split: the rows' coefficients over query blocks, then each key's
    // contributions gathered over key blocks from key-major lists in query order: the additions
    // the unsplit scatter makes, in its order.
    const int T = max_threads();
    constexpr int64_t kRows = 1024;
    for (int64_t t = 0; t < BH; ++t) {
      const int64_t b = t / d.H, h = t % d.H, nv = valid_queries(in, d, b), M = d.M;
      if (part) std::memset(part + t * M * (D + Dv), 0, sizeof(float) * static_cast<size_t>(M * (D + Dv)));
      float* coef = ws.coef.floats(static_cast<size_t>(std::max<int64_t>(1, 2 * nv * k)));  // (2, nv, k)
      const int32_t* idx = st.idx.data() + t * d.N * k;                                   // (nv, k)
      const int32_t* cnt = st.cnt.data() + t * d.N;                                       // (nv)
      parallel_for((nv + kRows - 1) / kRows, [&](int64_t x, int thread) {
        for (int64_t i = x * kRows; i < std::min(nv, (x + 1) * kRows); ++i)
          row(t, i, ws.threads[static_cast<size_t>(thread)], [&](int64_t y, float sx, float px) {
            coef[i * k + y] = sx;
            coef[(nv + i) * k + y] = px;
          });
      });
      // Counting sort of (i, x) by key: counts per (thread's row range, key), offsets in (key,
      // range) order, then each range fills its slots in row order.
      ws.counts.assign(static_cast<size_t>(T * (M + 1)), 0);
      int64_t* counts = ws.counts.data();  // (T, M + 1)
      auto rows_of = [&](int64_t x) { return std::pair<int64_t, int64_t>{x * nv / T, (x + 1) * nv / T}; };
      parallel_for(T, [&](int64_t x) {
        const auto [i0, i1] = rows_of(x);
        for (int64_t i = i0; i < i1; ++i)
          for (int64_t y = 0; y < cnt[i]; ++y) ++counts[x * (M + 1) + idx[i * k + y]];
      });
      ws.starts.resize(static_cast<size_t>(M + 1));
      int64_t* start = ws.starts.data();
      int64_t total = 0;
      for (int64_t j = 0; j < M; ++j) {
        start[j] = total;
        for (int64_t x = 0; x < T; ++x) {
          const int64_t c = counts[x * (M + 1) + j];
          counts[x * (M + 1) + j] = total;
          total += c;
        }
      }
      start[M] = total;
      ws.lists.resize(static_cast<size_t>(std::max<int64_t>(1, total)));
      int64_t* lists = ws.lists.data();
      parallel_for(T, [&](int64_t x) {
        const auto [i0, i1] = rows_of(x);
        for (int64_t i = i0; i < i1; ++i)
          for (int64_t y = 0; y < cnt[i]; ++y) lists[counts[x * (M + 1) + idx[i * k + y]]++] = i * k + y;
      });
      parallel_for((M + kRows - 1) / kRows, [&](int64_t x) {
        for (int64_t j = x * kRows; j < std::min(M, (x + 1) * kRows); ++j) {
          const auto [gk, gv] = key_grads(t, j);
          for (int64_t e = start[j]; e < start[j + 1]; ++e) {
            const int64_t i = lists[e] / k;
            simd::axpy_row(gk, in.q.ptr(b, h, i), D, coef[lists[e]]);
            simd::axpy_row(gv, dout.ptr(b, h, i), Dv, coef[nv * k + lists[e]]);
          }
        }
      });
    }
  }
  if (part) reduce_group_partials(in, d, part, d.M, D + Dv, D, dk, dv);
}

namespace {

class TopkAttention final : public Attention {
 public:
  TopkAttention(int64_t k, float scale) : k_(k), scale_(scale) {
    caps_ = Capabilities{.causal = true, .query_lengths = true, .key_lengths = true, .bias = false,
                         .cross = true, .gqa = true, .trainable = true};
  }
  std::string name() const override {
    return detail::concat("topk:topk=", k_, scale_ > 0 ? detail::concat(",scale=", scale_) : std::string());
  }
  const Capabilities& capabilities() const override { return caps_; }
  void check_magnitudes(const AttentionDims& d, const Magnitudes& m) const override {
    check_softmax_range(d, m, scale_for(d), "topk");
  }
  void forward(const AttentionInputs& in, View out, Context& ctx) const override {
    Magnitudes mag;
    const AttentionDims d = validate_inputs(in, caps_, "topk", mag);
    validate_output(out, Shape{d.B, d.H, d.N, d.Dv}, "out", "topk");
    check_magnitudes(d, mag);
    attn_topk_fwd(in, d, k_for(d), scale_for(d), out, ctx.state<TopkState>(),
                  ctx.scratch().get<TopkWorkspace>());
  }
  void backward(const AttentionInputs& in, ConstView out, Context& ctx, ConstView dout, View dq,
                View dk, View dv) const override {
    Magnitudes mag;
    const AttentionDims d = validate_inputs(in, caps_, "topk", mag);
    const TopkState& st = ctx.saved<TopkState>();
    check(st.lse.shape() == Shape{d.B, d.H, d.N}, "topk: backward inputs have shapes other than ",
          "the forward's (q is now ", in.q.shape, ")");
    validate_softmax_backward(in, d, mag, scale_for(d), out, dout, dq, dk, dv, "topk");
    attn_topk_bwd(in, d, scale_for(d), st, dout, dq, dk, dv, ctx.scratch().get<TopkWorkspace>());
  }
  size_t workspace_bytes(const AttentionDims& d, Mode mode, int threads) const override {
    return topk_workspace_bytes(d, k_for(d), mode, threads);
  }
  // Every visible score is computed exactly (the oracle's defining cost); the softmax and the
  // weighted sum, and the backward, run over the k kept keys only.
  WorkModel work(const AttentionDims& d, bool causal, Mode mode) const override {
    const double bh = static_cast<double>(d.B * d.H);
    const double kept = work::capped_pairs(d.N, d.M, k_for(d), causal);
    WorkModel w;
    w.add("scores", false, 2.0 * work::visible_pairs(d.N, d.M, causal) * static_cast<double>(d.Dk) * bh, 0,
          work::io_bytes(d, false));
    w.add("top-k attention", false, 2.0 * kept * static_cast<double>(d.Dv) * bh);
    if (mode == Mode::training) w.add("top-k attention", true, work::softmax_bwd_flops(d, kept), 0, work::io_bytes(d, true));
    return w;
  }

 private:
  float scale_for(const AttentionDims& d) const {
    return softmax_scale(scale_, d.Dk);
  }
  // k beyond the keys that exist changes nothing (every visible key is kept) but would size the
  // (B, H, N, k) index buffer by the parameter: clamp it to M.
  int64_t k_for(const AttentionDims& d) const { return std::max<int64_t>(1, std::min(k_, d.M)); }
  int64_t k_;
  float scale_;
  Capabilities caps_;
};

}  // namespace

void attn_topk_ref(const RefProblem& pr, const TopkState& st, std::vector<double>& out) {
  const AttentionDims& d = pr.d;
  out.assign(static_cast<size_t>(d.B * d.H * d.N * d.Dv), 0.0);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h)
      for (int64_t i = 0; i < pr.nq(b); ++i) {
        const int64_t t = b * d.H + h, n = st.cnt[static_cast<size_t>(t * d.N + i)];
        const int32_t* idx = st.idx.data() + (t * d.N + i) * st.k;
        const std::vector<int64_t> keys(idx, idx + n);
        std::vector<double> s;
        for (int64_t j : keys) s.push_back(pr.logit(b, h, i, j));
        pr.softmax_add(b, h, keys, std::move(s), 1.0, out.data() + (t * d.N + i) * d.Dv);
      }
}

std::unique_ptr<Attention> make_topk(const Spec& spec) {
  SpecReader r(spec);
  const int64_t k = r.get_int("topk", 32, 1, int64_t{1} << 30);
  const double scale = r.get_float("scale", 0.0, 1e-6, 1e6, "1/sqrt(Dk)");
  r.finish();
  return std::make_unique<TopkAttention>(k, static_cast<float>(scale));
}

}  // namespace clattn
