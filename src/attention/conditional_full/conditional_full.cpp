// `conditional-full:length_limit=L,<inner spec>` (fast-transformers' conditional-full): exact
// attention for N <= L queries, the inner variant beyond. It advertises the inner variant's
// capabilities, so a mask the inner one cannot honour is refused at every length rather than
// only at long ones, and a backward (or query_groups) always reads the variant its forward ran
// (all pick by N). It does not run with the sequence split: which variant runs depends on N.
#include <algorithm>

#include "attention/full/full.h"
#include "attention/registry.h"
#include "attention/validate.h"

namespace clattn {
namespace {

class ConditionalFull final : public Attention {
 public:
  ConditionalFull(int64_t limit, std::unique_ptr<Attention> inner)
      : limit_(limit), full_(make_full_attention(0.f, 0)), inner_(std::move(inner)), caps_(inner_->capabilities()) {
    // Which variant runs depends on the length, which a split sequence's ranks see only in part.
    caps_.splits_sequence = caps_.splits_sequence_causal = false;
    caps_.torch_ops = false;  // the tensor-op form has the two variants, not the switch between them
  }
  std::string name() const override {
    return detail::concat("conditional-full:length_limit=", limit_, ",", inner_->name());
  }
  const Capabilities& capabilities() const override { return caps_; }
  void forward(const AttentionInputs& in, View out, Context& ctx) const override {
    pick(in).forward(in, out, ctx);
  }
  void check_magnitudes(const AttentionDims& d, const Magnitudes& m) const override {
    (d.N <= limit_ ? *full_ : *inner_).check_magnitudes(d, m);
  }
  void backward(const AttentionInputs& in, ConstView out, Context& ctx, ConstView dout, View dq,
                View dk, View dv) const override {
    pick(in).backward(in, out, ctx, dout, dq, dk, dv);
  }
  size_t workspace_bytes(const AttentionDims& d, Mode mode, int threads) const override {
    return (d.N <= limit_ ? *full_ : *inner_).workspace_bytes(d, mode, threads);
  }
  WorkModel work(const AttentionDims& d, bool causal, Mode mode) const override {
    return (d.N <= limit_ ? *full_ : *inner_).work(d, causal, mode);
  }
  std::vector<StateBuffer> state_buffers(int64_t H, int64_t Dk) const override {
    return inner_->state_buffers(H, Dk);
  }
  QueryGroups query_groups(const AttentionInputs& in, const Context& ctx, int64_t b, int64_t h) const override {
    return pick(in).query_groups(in, ctx, b, h);
  }

 private:
  const Attention& pick(const AttentionInputs& in) const {
    validate_inputs(in, inner_->capabilities(), "conditional-full");
    return in.q.dim(2) <= limit_ ? *full_ : *inner_;
  }
  int64_t limit_;
  std::unique_ptr<Attention> full_, inner_;
  Capabilities caps_;  // the inner variant's, without the sequence split
};

}  // namespace

std::unique_ptr<Attention> make_conditional_full(const Spec& spec) {
  SpecReader r(spec);
  const int64_t limit = r.get_int("length_limit", 512, 0, int64_t{1} << 40);
  r.finish();
  check(!spec.inner.empty(), "spec '", spec.text,
        "': conditional-full needs an inner attention, e.g. "
        "conditional-full:length_limit=512,improved-clustered:clusters=100");
  // One wrapper level: a nested conditional-full adds nothing, and refusing it bounds the
  // recursion of make_attention (a spec nesting it thousands of times overflowed the stack).
  check(parse_spec(spec.inner).name != "conditional-full", "spec '", spec.text.substr(0, 200),
        spec.text.size() > 200 ? "...'" : "'", ": conditional-full cannot wrap another conditional-full");
  return std::make_unique<ConditionalFull>(limit, make_attention(spec.inner));
}

}  // namespace clattn
