// Local (sliding-window) attention: query i attends keys j with |i − j| <= window/2, or with the
// causal mask i − window < j <= i. It is exact softmax attention on a band, so it runs on the full
// attention kernels with a band limit (full.cpp): only key tiles that meet a query tile's band are
// computed, and the backward visits only the query tiles that meet a key tile's band. Time and
// memory are linear in N for a fixed window.
// With N != M, query i sits at key position i + (M − N), the same alignment as the causal mask
// (prefix caches); the band is centred (or, causal, ends) there.
#include <cmath>

#include "attention/full.h"
#include "attention/variants.h"

namespace clattn {
namespace {

class LocalAttention final : public Attention {
 public:
  LocalAttention(int64_t window, float scale)
      : window_(window), scale_(scale), ws_(make_full_workspace()) {
    caps_ = Capabilities{.causal = true, .query_lengths = true, .key_lengths = true, .bias = false,
                         .cross = true, .gqa = true, .trainable = true};
  }
  std::string name() const override {
    return detail::concat("local:window=", window_,
                          scale_ > 0 ? detail::concat(",scale=", scale_) : std::string());
  }
  const Capabilities& capabilities() const override { return caps_; }

  void forward(const AttentionInputs& in, View out, Context& ctx) override {
    const AttentionDims d = validate_inputs(in, caps_, "local");
    validate_output(out, Shape{d.B, d.H, d.N, d.Dv}, "out", "local");
    FullState& st = ctx.state<FullState>();
    st.lse.resize(Shape{d.B, d.H, d.N});
    attn_full_fwd(in, d, scale_for(d), out, st.lse.data(), *ws_, window_);
    save_output(out, st.out);
  }

  void backward(const AttentionInputs& in, const Context& ctx, ConstView dout, View dq, View dk,
                View dv) override {
    const AttentionDims d = validate_inputs(in, caps_, "local");
    const FullState& st = ctx.state<FullState>();
    check(st.out.shape() == Shape{d.B, d.H, d.N, d.Dv}, "local: backward inputs have shapes ",
          "other than the forward's: forward saved out ", st.out.shape().str(), ", q is now ",
          in.q.shape.str());
    validate_output(dout, Shape{d.B, d.H, d.N, d.Dv}, "dout", "local");
    validate_output(dq, in.q.shape, "dq", "local");
    validate_output(dk, in.k.shape, "dk", "local");
    validate_output(dv, in.v.shape, "dv", "local");
    attn_full_bwd(in, d, scale_for(d), st.out.view(), st.lse.data(), dout, dq, dk, dv, *ws_, window_);
  }

 private:
  float scale_for(const AttentionDims& d) const {
    return scale_ > 0 ? scale_ : 1.f / std::sqrt(static_cast<float>(d.Dk));
  }
  int64_t window_;
  float scale_;
  Capabilities caps_;
  FullWorkspacePtr ws_;
};

}  // namespace

std::unique_ptr<Attention> make_local(const Spec& spec) {
  SpecReader r(spec);
  check(r.has("window"), "spec '", spec.text, "': window is required (e.g. local:window=256)");
  const int64_t window = r.get_int("window", 0, 1, int64_t{1} << 40);
  const double scale = r.get_float("scale", 0.0, 1e-6, 1e6);
  r.finish();
  return std::make_unique<LocalAttention>(window, static_cast<float>(scale));
}

}  // namespace clattn
