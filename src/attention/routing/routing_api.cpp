// Routing attention's registered form and its double reference (the algorithm: routing.cpp):
// the spec, the capabilities, the input and overflow checks around the kernels, and the routing
// state saved for the backward.
#include <algorithm>
#include <string>
#include <vector>

#include "attention/query_groups.h"
#include "attention/registry.h"
#include "attention/routing/routing.h"
#include "attention/validate.h"
#include "attention/work.h"
#include "clattn/rng.h"

namespace clattn {

void attn_routing_ref(const RefProblem& pr, const RoutingState& st, std::vector<double>& out) {
  if (st.causal) {
    attn_bucket_window_ref(pr, st.bw, out);
    return;
  }
  const AttentionDims& d = pr.d;
  out.assign(static_cast<size_t>(d.B * d.H * d.N * d.Dv), 0.0);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t t = b * d.H + h, mv = pr.nk(b);
      if (pr.nq(b) == 0 || mv == 0) continue;
      const int32_t* moff = st.mem_off.data() + t * (st.C + 1);
      for (int64_t k = 0; k < st.C; ++k) {
        const int32_t* keys = st.keys.data() + (t * st.C + k) * st.wk;
        const int64_t nk = st.nkeys[static_cast<size_t>(t * st.C + k)];
        for (int64_t m = moff[k]; m < moff[k + 1]; ++m) {
          const int64_t i = st.mem[static_cast<size_t>(t * st.cap + m)];
          const std::vector<int64_t> ks(keys, keys + nk);
          std::vector<double> s;
          for (int64_t j : ks) s.push_back(pr.logit(b, h, i, j));
          pr.softmax_add(b, h, ks, std::move(s), st.weight[static_cast<size_t>(t * st.cap + m)],
                         out.data() + (t * d.N + i) * d.Dv);
        }
      }
    }
}

namespace {

// Whether st is the routing of a non-causal forward with these sizes (its capacities follow N, M).
bool routing_state_fits(const RoutingState& st, const AttentionDims& d, const RoutingParams& p) {
  const int64_t C = p.clusters, wq_max = p.window > 0 ? std::min(p.window, d.N) : (d.N + C - 1) / C;
  const int64_t wk = std::max<int64_t>(1, p.window > 0 ? std::min(p.window, d.M) : (d.M + C - 1) / C);
  return !st.causal && st.C == C && st.cap == C * wq_max + d.N && st.wk == wk &&
         st.mem_off.size() == static_cast<size_t>(d.B * d.H * (C + 1)) &&
         st.mem.size() == static_cast<size_t>(d.B * d.H * st.cap);
}

class RoutingAttention final : public Attention {
 public:
  explicit RoutingAttention(const RoutingParams& p) : p_(p) {
    caps_ = Capabilities{.causal = p.train, .query_lengths = true, .key_lengths = true, .bias = false,
                         .cross = true, .gqa = true, .trainable = true, .shared_qk = false,
                         .stochastic = true, .stateful = p.train};
  }
  std::string name() const override {
    return detail::concat("routing:clusters=", p_.clusters,
                          p_.window > 0 ? detail::concat(",window=", p_.window) : std::string(),
                          ",iterations=", p_.iterations, ",centroids=", p_.train ? "ema" : "kmeans",
                          p_.train ? detail::concat(",decay=", p_.decay) : std::string(),
                          ",seed=", p_.seed,
                          p_.scale > 0 ? detail::concat(",scale=", p_.scale) : std::string());
  }
  const Capabilities& capabilities() const override { return caps_; }
  std::vector<StateBuffer> state_buffers(int64_t H, int64_t Dk) const override {
    if (!p_.train) return {};
    return {{"centroids", Shape{H, p_.clusters, Dk},
             "unit EMA centroids per head, shared by queries and keys (updated by training calls)"}};
  }
  void check_magnitudes(const AttentionDims& d, const Magnitudes& m) const override {
    check_softmax_range(d, m, softmax_scale(p_.scale, d.Dk), "routing");
    check_member_range(d, m, true, "routing");  // k-means: centroid sums and squared distances
  }
  void forward(const AttentionInputs& in, View out, Context& ctx) const override {
    check(!in.causal || p_.train, "routing: a causal mask needs fixed centroids (centroids=ema, layer state): ",
          "k-means over the sequence would let later positions move earlier positions' clusters");
    Magnitudes mag;
    const AttentionDims d = validate_inputs(in, caps_, "routing", mag);
    validate_output(out, Shape{d.B, d.H, d.N, d.Dv}, "out", "routing");
    check_magnitudes(d, mag);
    float* ema = p_.train ? centroids(*in.state, d).data() : nullptr;
    RoutingState& st = ctx.state<RoutingState>();
    st.causal = in.causal;
    if (in.causal) {
      routing_causal_buckets(in, d, p_, ema, in.train, st.bw, routing_workspace(ctx.scratch()));
      attn_bucket_window_fwd(in, d, softmax_scale(p_.scale, d.Dk), st.bw, out, bucket_window_workspace(ctx.scratch()));
      return;
    }
    attn_routing_fwd(in, d, p_, in.step, ema, in.train, out, st, routing_workspace(ctx.scratch()));
  }
  void backward(const AttentionInputs& in, ConstView out, Context& ctx, ConstView dout, View dq,
                View dk, View dv) const override {
    Magnitudes mag;
    const AttentionDims d = validate_inputs(in, caps_, "routing", mag);
    check_member_range(d, mag, true, "routing");
    const RoutingState& st = ctx.saved<RoutingState>();
    check(st.causal == in.causal, "routing: backward's causal flag differs from the forward's");
    if (in.causal) {
      check(st.bw.lse2.shape() == Shape{d.B, d.H, d.N} && st.bw.kb.size() == static_cast<size_t>(d.B * d.H * d.M),
            "routing: backward inputs have shapes other than the forward's (q is now ", in.q.shape, ")");
      validate_softmax_backward(in, d, mag, softmax_scale(p_.scale, d.Dk), out, dout, dq, dk, dv, "routing");
      attn_bucket_window_bwd(in, d, softmax_scale(p_.scale, d.Dk), st.bw, out, dout, dq, dk, dv, bucket_window_workspace(ctx.scratch()));
      return;
    }
    check(routing_state_fits(st, d, p_),
          "routing: backward inputs have shapes other than the forward's (q is now ", in.q.shape, ")");
    validate_softmax_backward(in, d, mag, softmax_scale(p_.scale, d.Dk), out, dout, dq, dk, dv, "routing");
    attn_routing_bwd(in, d, p_, st, dout, dq, dk, dv, routing_workspace(ctx.scratch()));
  }
  // A cluster each query is a member of (the lowest index); causal: its bucket (nearest centroid).
  QueryGroups query_groups(const AttentionInputs& in, const Context& ctx, int64_t b, int64_t h) const override {
    const AttentionDims d = query_groups_dims(in, caps_, b, h, "routing");
    const RoutingState& st = query_groups_state<RoutingState>(ctx, "routing");
    const int64_t t = b * d.H + h, nv = valid_queries(in, d, b);
    QueryGroups g{std::vector<int32_t>(static_cast<size_t>(d.N), -1), "cluster"};
    if (in.causal) {
      check_query_groups_shapes(st.causal && st.bw.lse2.shape() == Shape{d.B, d.H, d.N} &&
                                    st.bw.qb.size() == static_cast<size_t>(d.B * d.H * st.bw.rounds * d.N),
                                in, "routing");
      const int32_t* qb = st.bw.qb.data() + t * st.bw.rounds * d.N;  // (N) round 0
      std::copy(qb, qb + nv, g.ids.begin());
      return g;
    }
    check_query_groups_shapes(routing_state_fits(st, d, p_), in, "routing");
    const int32_t* off = st.mem_off.data() + t * (st.C + 1);  // (C + 1)
    const int32_t* mem = st.mem.data() + t * st.cap;          // (cap) members by cluster
    for (int64_t c = st.C - 1; c >= 0; --c)  // backwards: a query in several keeps the first
      for (int32_t x = off[c]; x < off[c + 1]; ++x)
        if (mem[x] < nv) g.ids[static_cast<size_t>(mem[x])] = static_cast<int32_t>(c);
    return g;
  }
  size_t workspace_bytes(const AttentionDims& d, Mode mode, int threads) const override {
    // The mask is not among the sizes: the bound covers both the causal and the plain pipeline.
    const int64_t window = std::max<int64_t>(1, p_.window > 0 ? p_.window : (d.M + p_.clusters - 1) / p_.clusters);
    return std::max(routing_workspace_bytes(d, p_, mode, threads), bucket_window_bytes(d, 1, window, mode, threads) +
                    static_cast<size_t>(4 * d.B * d.H * p_.clusters * (d.Dk + 1)));
  }
  // Spherical k-means over the unit queries and keys (each round scores every one against the C
  // centroids; EMA centroids need only the final scoring), then each cluster's window of queries
  // attends its window of keys. Causal: each query attends the keys before it in its nearest
  // centroid's window, about half of them.
  WorkModel work(const AttentionDims& d, bool causal, Mode mode) const override {
    const int64_t C = std::min(p_.clusters, std::max(d.N, d.M));  // more centroids than points add nothing
    const double wq = static_cast<double>(std::min(d.N, p_.window > 0 ? p_.window : (d.N + C - 1) / C));
    const double wk = static_cast<double>(std::max<int64_t>(1, std::min(d.M, p_.window > 0 ? p_.window : (d.M + C - 1) / C)));
    const double rounds = (p_.train ? 0 : p_.iterations) + 1;
    const double bh = static_cast<double>(d.B * d.H);
    WorkModel w;
    w.add("clustering", false, rounds * 2.0 * static_cast<double>((d.N + d.M) * C * d.Dk) * bh);
    const double pairs = causal ? static_cast<double>(d.N) * wk / 2 : static_cast<double>(C) * wq * wk;
    w += work::softmax_attention(d, pairs, mode, "cluster attention");
    return w;
  }

 private:
  // The layer's EMA centroids (H, C, Dk): created on first use as unit-norm Gaussian rows from the
  // seeded rng (a stream no step uses), then only ever changed by training calls.
  Tensor& centroids(AttentionState& state, const AttentionDims& d) const {
    const Shape shape{d.H, p_.clusters, d.Dk};
    Tensor* t = state.find("centroids");
    if (t) {
      check(t->shape() == shape, "routing: state buffer 'centroids' must be (H, C, Dk) = ",
            shape.str(), ", got ", t->shape().str());
      check_finite(t->view(), "state buffer 'centroids'", "routing");
      return *t;
    }
    Tensor& c = state.add("centroids", shape);
    const Rng rng(p_.seed);
    for (int64_t r = 0; r < d.H * p_.clusters; ++r) {
      float* ce = c.data() + r * d.Dk;
      double nn = 0;
      for (int64_t e = 0; e < d.Dk; ++e) {
        ce[e] = rng.normal(~uint64_t{0}, static_cast<uint64_t>(r * d.Dk + e));
        nn += static_cast<double>(ce[e]) * ce[e];
      }
      for (int64_t e = 0; e < d.Dk; ++e) ce[e] = static_cast<float>(ce[e] / std::sqrt(nn));
    }
    return c;
  }
  RoutingParams p_;
  Capabilities caps_;
};

}  // namespace

std::unique_ptr<Attention> make_routing(const Spec& spec) {
  SpecReader r(spec);
  RoutingParams p;
  r.require("clusters", "routing:clusters=128");
  p.clusters = r.get_int("clusters", 0, 1, 1 << 16);
  p.window = r.get_int("window", 0, 1, int64_t{1} << 40, "N/clusters");
  p.iterations = static_cast<int>(r.get_int("iterations", 10, 0, 1000));
  p.train = r.get_choice("centroids", "kmeans", {"kmeans", "ema"}) == "ema";
  p.decay = static_cast<float>(r.get_float("decay", 0.999, 0.0, 1.0));
  p.scale = static_cast<float>(r.get_float("scale", 0.0, 1e-6, 1e6, "1/sqrt(Dk)"));
  p.seed = static_cast<uint64_t>(r.get_int("seed", 0, 0, int64_t{1} << 62));
  r.finish();
  return std::make_unique<RoutingAttention>(p);
}

}  // namespace clattn
