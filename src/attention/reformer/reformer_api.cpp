// Reformer attention's registered form (the algorithm, its workspace and its double reference:
// reformer.cpp): the spec, the capabilities and the checks around the kernels.
#include <algorithm>
#include <string>
#include <vector>

#include "attention/query_groups.h"
#include "attention/registry.h"
#include "attention/reformer/reformer.h"
#include "attention/validate.h"

namespace clattn {

namespace {

class ReformerAttention final : public Attention {
 public:
  explicit ReformerAttention(const ReformerParams& p) : p_(p) {
    caps_ = Capabilities{.causal = true, .query_lengths = true, .key_lengths = true, .bias = false,
                         .cross = false, .gqa = false, .trainable = true, .shared_qk = true,
                         .stochastic = true, .stateful = false};
  }
  std::string name() const override {
    return detail::concat("reformer:rounds=", p_.rounds, ",chunk=", p_.chunk,
                          p_.buckets > 0 ? detail::concat(",buckets=", p_.buckets) : std::string(),
                          ",seed=", p_.seed);
  }
  const Capabilities& capabilities() const override { return caps_; }

  void check_magnitudes(const AttentionDims& d, const Magnitudes& m) const override {
    check_member_range(d, m, true, "reformer");  // unit keys: |q|² in float
    // Logits q·k_unit with unit keys and no scale: |logit| <= |q| <= sqrt(Dk)·max|q|, the rule's
    // scale·Dk·max|q|·max|k| with scale 1 and max|k| 1/sqrt(Dk).
    Magnitudes unit = m;
    unit.k = 1.0 / std::sqrt(static_cast<double>(d.Dk));
    check_softmax_range(d, unit, 1.0, "reformer");
  }

  // Shared QK: validate_inputs refuses a k that is not q itself (caps_.shared_qk).
  void forward(const AttentionInputs& in, View out, Context& ctx) const override {
    Magnitudes mag;
    const AttentionDims d = validate_inputs(in, caps_, "reformer", mag);
    validate_output(out, Shape{d.B, d.H, d.N, d.Dv}, "out", "reformer");
    check_magnitudes(d, mag);
    ReformerState& st = ctx.state<ReformerState>();
    attn_reformer_fwd(in, d, p_, in.step, out, st, reformer_workspace(ctx.scratch()));
  }

  void backward(const AttentionInputs& in, ConstView out, Context& ctx, ConstView dout, View dq,
                View dk, View dv) const override {
    Magnitudes mag;
    const AttentionDims d = validate_inputs(in, caps_, "reformer", mag);
    check_member_range(d, mag, true, "reformer");
    mag.k = 1.0 / std::sqrt(static_cast<double>(d.Dk));
    const ReformerState& st = ctx.saved<ReformerState>();
    check(st.lse2.shape() == Shape{d.B, d.H, d.N} && st.causal == in.causal &&
              st.perm.size() == static_cast<size_t>(d.B * d.H * st.rounds * st.len) &&
              st.len == reformer_perm_len(d.N, st.buckets, st.chunk, in.causal),
          "reformer: backward inputs have shapes other than the forward's (q is now ",
          in.q.shape, ")");
    validate_softmax_backward(in, d, mag, 1.0, out, dout, dq, dk, dv, "reformer");
    attn_reformer_bwd(in, d, st, out, dout, dq, dv, reformer_workspace(ctx.scratch()));
  }

  // Each position's chunk of round 0: its place in the sorted order (with causal, the order of
  // bucket runs padded to whole chunks) divided by the chunk size.
  QueryGroups query_groups(const AttentionInputs& in, const Context& ctx, int64_t b, int64_t h) const override {
    const AttentionDims d = query_groups_dims(in, caps_, b, h, "reformer");
    const ReformerState& st = query_groups_state<ReformerState>(ctx, "reformer");
    check_query_groups_shapes(st.lse2.shape() == Shape{d.B, d.H, d.N} && st.causal == in.causal &&
                                  st.perm.size() == static_cast<size_t>(d.B * d.H * st.rounds * st.len) &&
                                  st.len == reformer_perm_len(d.N, st.buckets, st.chunk, in.causal),
                              in, "reformer");
    const int64_t nv = valid_queries(in, d, b);
    QueryGroups g{std::vector<int32_t>(static_cast<size_t>(d.N), -1), "chunk"};
    const ReformerState::Round r0 = st.round(b * d.H + h, 0, d.N);
    for (int64_t x = 0; x < r0.len; ++x)
      if (r0.perm[x] >= 0 && r0.perm[x] < nv) g.ids[static_cast<size_t>(r0.perm[x])] = static_cast<int32_t>(x / st.chunk);
    return g;
  }

  size_t workspace_bytes(const AttentionDims& d, Mode mode, int threads) const override {
    return reformer_workspace_bytes(d, p_, mode, threads);
  }
  WorkModel work(const AttentionDims& d, bool causal, Mode mode) const override {
    return reformer_work(d, p_, causal, mode);
  }

 private:
  ReformerParams p_;
  Capabilities caps_;
};

}  // namespace

std::unique_ptr<Attention> make_reformer(const Spec& spec) {
  SpecReader r(spec);
  ReformerParams p;
  p.rounds = r.get_int("rounds", 1, 1, 64);
  p.chunk = r.get_int("chunk", 32, 1, kReformerMaxChunk);
  p.buckets = r.get_int("buckets", 0, 2, int64_t{1} << 30, "2*N/chunk");
  p.seed = static_cast<uint64_t>(r.get_int("seed", 0, 0, int64_t{1} << 62));
  r.finish();
  if (p.buckets > 0) reformer_buckets(p, 0);  // validates an explicit count now
  return std::make_unique<ReformerAttention>(p);
}

}  // namespace clattn
