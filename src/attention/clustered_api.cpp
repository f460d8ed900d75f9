// The registered faces of the clustered family: `clustered`, `improved-clustered` and
// `conditional-full:<inner>`. Each forward call draws fresh planes (the rng's call counter), so
// training sees new hashes every step while backward reuses the partition saved in the context.
#include <cmath>
#include <string>

#include "attention/clustered.h"
#include "attention/clustered_internal.h"
#include "attention/variants.h"

namespace clattn {
namespace {

class ClusteredAttention final : public Attention {
 public:
  ClusteredAttention(std::string kind, const ClusteredParams& p)
      : kind_(std::move(kind)), p_(p), ws_(make_clustered_workspace()) {
    caps_ = Capabilities{.causal = false, .query_lengths = true, .key_lengths = true, .bias = false,
                         .cross = true, .gqa = true, .trainable = true};
  }
  std::string name() const override {
    std::string s = detail::concat(kind_, ":clusters=", p_.clusters);
    if (p_.topk > 0) s += detail::concat(",topk=", p_.topk);
    if (p_.positional) return s + detail::concat(",clustering=positional,seed=", p_.seed);
    return s + detail::concat(",bits=", p_.bits, ",iterations=", p_.iterations,
                              ",hash_bias=", p_.hash_bias ? "true" : "false", ",seed=", p_.seed,
                              p_.scale > 0 ? detail::concat(",scale=", p_.scale) : std::string());
  }
  const Capabilities& capabilities() const override { return caps_; }

  void forward(const AttentionInputs& in, View out, Context& ctx) override {
    const AttentionDims d = validate_inputs(in, caps_, kind_);
    validate_output(out, Shape{d.B, d.H, d.N, d.Dv}, "out", kind_);
    ClusteredState& st = ctx.state<ClusteredState>();
    attn_clustered_fwd(in, d, p_, calls_++, out, st, *ws_);
  }

  void backward(const AttentionInputs& in, const Context& ctx, ConstView dout, View dq, View dk,
                View dv) override {
    const AttentionDims d = validate_inputs(in, caps_, kind_);
    const ClusteredState& st = ctx.state<ClusteredState>();
    check(st.order.size() == static_cast<size_t>(d.B * d.H * d.N) &&
              st.qc.shape() == Shape{d.B, d.H, st.cmax, d.Dk},
          kind_, ": backward inputs have shapes other than the forward's (q is now ",
          in.q.shape.str(), ")");
    validate_backward(in, d, dout, dq, dk, dv, kind_);
    attn_clustered_bwd(in, d, p_, st, dout, dq, dk, dv, *ws_);
  }

 private:
  std::string kind_;
  ClusteredParams p_;
  Capabilities caps_;
  uint64_t calls_ = 0;
  ClusteredWorkspacePtr ws_;
};

ClusteredParams read_clustered(SpecReader& r, const Spec& spec, bool improved) {
  ClusteredParams p;
  check(r.has("clusters"), "spec '", spec.text, "': clusters is required (e.g. ", spec.name,
        ":clusters=100)");
  p.clusters = r.get_int("clusters", 0, 1, int64_t{1} << 30);
  p.bits = static_cast<int>(r.get_int("bits", 63, 1, 64));
  p.iterations = static_cast<int>(r.get_int("iterations", 10, 0, 1000));
  p.hash_bias = r.get_bool("hash_bias", true);
  p.positional = r.get_choice("clustering", "lsh", {"lsh", "positional"}) == "positional";
  if (improved) p.topk = r.get_int("topk", 32, 1, int64_t{1} << 30);
  p.scale = static_cast<float>(r.get_float("scale", 0.0, 1e-6, 1e6));
  p.seed = static_cast<uint64_t>(r.get_int("seed", 0, 0, int64_t{1} << 62));
  r.finish();
  return p;
}

// Full attention up to length_limit queries, the inner variant beyond (fast-transformers'
// conditional-full). Advertises the inner variant's capabilities, so a mask the inner one cannot
// honour is refused at every length rather than only at long ones.
class ConditionalFull final : public Attention {
 public:
  ConditionalFull(int64_t limit, std::unique_ptr<Attention> inner)
      : limit_(limit), full_(make_attention("full")), inner_(std::move(inner)) {}
  std::string name() const override {
    return detail::concat("conditional-full:length_limit=", limit_, ",", inner_->name());
  }
  const Capabilities& capabilities() const override { return inner_->capabilities(); }
  void forward(const AttentionInputs& in, View out, Context& ctx) override {
    pick(in).forward(in, out, ctx);
  }
  void backward(const AttentionInputs& in, const Context& ctx, ConstView dout, View dq, View dk,
                View dv) override {
    pick(in).backward(in, ctx, dout, dq, dk, dv);
  }

 private:
  Attention& pick(const AttentionInputs& in) {
    validate_inputs(in, inner_->capabilities(), "conditional-full");
    return in.q.dim(2) <= limit_ ? *full_ : *inner_;
  }
  int64_t limit_;
  std::unique_ptr<Attention> full_, inner_;
};

}  // namespace

std::unique_ptr<Attention> make_clustered(const Spec& spec) {
  SpecReader r(spec);
  return std::make_unique<ClusteredAttention>("clustered", read_clustered(r, spec, false));
}

std::unique_ptr<Attention> make_improved_clustered(const Spec& spec) {
  SpecReader r(spec);
  return std::make_unique<ClusteredAttention>("improved-clustered", read_clustered(r, spec, true));
}

std::unique_ptr<Attention> make_conditional_full(const Spec& spec) {
  SpecReader r(spec);
  const int64_t limit = r.get_int("length_limit", 512, 0, int64_t{1} << 40);
  r.finish();
  check(!spec.inner.empty(), "spec '", spec.text,
        "': conditional-full needs an inner attention, e.g. "
        "conditional-full:length_limit=512,improved-clustered:clusters=100");
  return std::make_unique<ConditionalFull>(limit, make_attention(spec.inner));
}

}  // namespace clattn
