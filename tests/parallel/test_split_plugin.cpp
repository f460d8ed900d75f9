// A variant that splits, defined here and nowhere else: the sequence split is a plug-in
// (sequence_split/split_attention.h), so a third splitting variant needs no edit in src/sequence_split or in
// another variant's folder. The variant is the mean of the values — out_i = (1/M) Σ_j v_j, a
// softmax whose scores are all equal — whose split forward all-reduces each head's value sum and
// whose backward all-reduces the heads' summed dout. It keeps its own state in the Context, its
// traffic is counted by the dispatcher's counting communicator, and it runs at 1-4 ranks against
// its own one-process forward and backward; registered from here, it is one of the registry's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attention/registry.h"
#include "clattn/attention.h"
#include "clattn/comm.h"
#include "clattn/error.h"
#include "clattn/seq_parallel.h"
#include "clattn/validate.h"
#include "common/test_util.h"
#include "parallel/ranks.h"
#include "sequence_split/split_attention.h"

namespace clattn::testing {
namespace {

// What the split forward leaves its backward: the whole sequence's length.
struct MeanState : ContextState {
  int64_t M = 0;
  size_t bytes() const override { return 0; }
};

// Σ over rows [0, n) of x (B, Hx, n, D) into sums (B, Hx, D), per group of G heads when G > 1
// (sums (B, Hx / G, D)).
std::vector<float> row_sums(ConstView x, int64_t G) {
  const int64_t B = x.dim(0), Hx = x.dim(1), n = x.dim(2), D = x.dim(3);
  std::vector<float> s(static_cast<size_t>(B * (Hx / G) * D), 0.f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hx; ++h)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t d = 0; d < D; ++d) s[static_cast<size_t>((b * (Hx / G) + h / G) * D + d)] += x.ptr(b, h, i)[d];
  return s;
}

// out (B, H, n, Dv) rows = the value sums (B, Hkv, Dv) of each query head's group, / M.
void write_means(const std::vector<float>& vsum, int64_t M, View out, int64_t G) {
  for (int64_t b = 0; b < out.dim(0); ++b)
    for (int64_t h = 0; h < out.dim(1); ++h)
      for (int64_t i = 0; i < out.dim(2); ++i)
        for (int64_t d = 0; d < out.dim(3); ++d)
          out.ptr(b, h, i)[d] = vsum[static_cast<size_t>((b * (out.dim(1) / G) + h / G) * out.dim(3) + d)] /
                                static_cast<float>(M);
}

// dv (B, Hkv, m, Dv) rows += the summed dout (B, Hkv, Dv) of the group, / M.
void add_dv(const std::vector<float>& gsum, int64_t M, View dv) {
  for (int64_t b = 0; b < dv.dim(0); ++b)
    for (int64_t h = 0; h < dv.dim(1); ++h)
      for (int64_t j = 0; j < dv.dim(2); ++j)
        for (int64_t d = 0; d < dv.dim(3); ++d)
          dv.ptr(b, h, j)[d] += gsum[static_cast<size_t>((b * dv.dim(1) + h) * dv.dim(3) + d)] / static_cast<float>(M);
}

class MeanSplit final : public SplitAttention {
 public:
  bool holds_state(const Context& ctx) const override { return ctx.holds<MeanState>(); }
  float scale_at(int64_t Dk) const override { return 1.f / std::sqrt(static_cast<float>(Dk)); }
  bool sums_queries() const override { return false; }
  void forward(Communicator& comm, const SeqSplit& split, const AttentionInputs& in, View out,
               Context& ctx) const override {
    const int64_t G = in.q.dim(1) / in.v.dim(1);
    std::vector<float> vsum = row_sums(in.v, 1);
    comm.all_reduce_sum(vsum.data(), vsum.size());
    write_means(vsum, split.N, out, G);
    ctx.state<MeanState>().M = split.N;
  }
  void backward(Communicator& comm, const SeqSplit&, const AttentionInputs& in, ConstView, Context& ctx,
                ConstView dout, View, View, View dv) const override {
    std::vector<float> gsum = row_sums(dout, in.q.dim(1) / in.v.dim(1));
    comm.all_reduce_sum(gsum.data(), gsum.size());
    add_dv(gsum, ctx.saved<MeanState>().M, dv);
  }
};

class MeanAttention final : public Attention {
 public:
  MeanAttention() {
    caps_ = Capabilities{.causal = false, .query_lengths = false, .key_lengths = false, .bias = false,
                         .cross = true, .gqa = true, .trainable = true, .splits_sequence = true};
  }
  std::string name() const override { return "mean-of-values"; }
  const Capabilities& capabilities() const override { return caps_; }
  void forward(const AttentionInputs& in, View out, Context& ctx) const override {
    const int64_t M = in.v.dim(2);
    write_means(row_sums(in.v, 1), M, out, in.q.dim(1) / in.v.dim(1));
    ctx.state<MeanState>().M = M;
  }
  void backward(const AttentionInputs& in, ConstView, Context& ctx, ConstView dout, View, View,
                View dv) const override {
    add_dv(row_sums(dout, in.q.dim(1) / in.v.dim(1)), ctx.saved<MeanState>().M, dv);
  }
  void check_magnitudes(const AttentionDims&, const Magnitudes&) const override {}
  size_t workspace_bytes(const AttentionDims&, Mode, int) const override { return 0; }
  WorkModel work(const AttentionDims& d, bool, Mode) const override {
    WorkModel w;
    w.add("mean", false, static_cast<double>(d.B * d.Hkv * d.M * d.Dv));
    return w;
  }
  const SplitAttention* split() const override { return &split_; }

 private:
  Capabilities caps_;
  MeanSplit split_;
};

// Rows of rank r's contiguous slice of a (B, Hx, N, D) tensor.
Tensor slice(const Tensor& t, const SeqSplit& s, int r) {
  const int64_t n = s.local_rows(r), a = s.global(r, 0);
  Tensor out(Shape{t.dim(0), t.dim(1), n, t.dim(3)});
  for (int64_t b = 0; b < t.dim(0); ++b)
    for (int64_t h = 0; h < t.dim(1); ++h)
      std::copy(t.view().ptr(b, h, a), t.view().ptr(b, h, a) + n * t.dim(3), out.view().ptr(b, h, 0));
  return out;
}

TEST(SplitPlugin, AVariantOfTheTestsOwnSplitsAndMatchesOneProcess) {
  on_each_job([](Communicator& comm) {
    const MeanAttention att;
    const int R = comm.size(), r = comm.rank();
    const int64_t B = 2, H = 4, Hkv = 2, N = 65, D = 8;
    SCOPED_TRACE("ranks=" + std::to_string(R));
    const Tensor q = randn(Shape{B, H, N, D}, 5, 1), k = randn(Shape{B, Hkv, N, D}, 5, 2),
                 v = randn(Shape{B, Hkv, N, D}, 5, 3), go = randn(Shape{B, H, N, D}, 5, 4);
    AttentionInputs whole;
    whole.q = q.view();
    whole.k = k.view();
    whole.v = v.view();
    Tensor o_ref(q.shape()), dq_ref(q.shape()), dk_ref(k.shape()), dv_ref(v.shape());
    Context ctx_ref;
    att.forward(whole, o_ref.view(), ctx_ref);
    att.backward(whole, o_ref.view(), ctx_ref, go.view(), dq_ref.view(), dk_ref.view(), dv_ref.view());

    std::string why;
    ASSERT_TRUE(sequence_parallel_supported(att, false, &why)) << why;
    EXPECT_FALSE(sequence_parallel_supported(att, true, &why));
    const SeqSplit split = SeqSplit::contiguous(N, R);
    const Tensor ql = slice(q, split, r), kl = slice(k, split, r), vl = slice(v, split, r), gl = slice(go, split, r);
    AttentionInputs part;
    part.q = ql.view();
    part.k = kl.view();
    part.v = vl.view();
    Tensor o(ql.shape()), dq(ql.shape()), dk(kl.shape()), dv(vl.shape());
    Context ctx;
    reset_sequence_parallel_traffic();
    sequence_parallel_forward(comm, split, att, part, o.view(), ctx);
    // One all-reduce of the (B, Hkv, D) value sums: the ring's share of it.
    const uint64_t sums = static_cast<uint64_t>(B * Hkv * D) * sizeof(float);
    EXPECT_EQ(sequence_parallel_traffic().bytes, R > 1 ? 2 * sums * static_cast<uint64_t>(R - 1) / static_cast<uint64_t>(R) : 0);
    EXPECT_EQ(sequence_parallel_traffic().messages, R > 1 ? 1u : 0u);
    sequence_parallel_backward(comm, split, att, part, o.view(), ctx, gl.view(), dq.view(), dk.view(), dv.view());
    const Tensor o_want = slice(o_ref, split, r), dv_want = slice(dv_ref, split, r);
    for (int64_t i = 0; i < o.numel(); ++i)
      ASSERT_NEAR(o.data()[i], o_want.data()[i], 1e-5f * (1.f + std::abs(o_want.data()[i]))) << "out " << i;
    for (int64_t i = 0; i < dv.numel(); ++i)
      ASSERT_NEAR(dv.data()[i], dv_want.data()[i], 1e-5f * (1.f + std::abs(dv_want.data()[i]))) << "dv " << i;
    for (int64_t i = 0; i < dq.numel(); ++i) ASSERT_EQ(dq.data()[i], 0.f);

    // A backward on a context another variant's forward filled is refused on every rank alike.
    Context other;
    sequence_parallel_forward(comm, split, *make_attention("full"), part, o.view(), other);
    try {
      sequence_parallel_backward(comm, split, att, part, o.view(), other, gl.view(), dq.view(), dk.view(), dv.view());
      ADD_FAILURE() << "a backward after another variant's forward went through";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("the forward of the same attention"), std::string::npos) << e.what();
    }
  });
}

// Registered from here, the variant is one of the registry's: made by name, listed with its
// capabilities, and named where the sequence split lists the variants that split.
TEST(SplitPlugin, RegisteredFromTheTestItIsOneOfTheRegistrys) {
  const auto make = [](const Spec& spec) -> std::unique_ptr<Attention> {
    SpecReader r(spec);
    r.finish();
    return std::make_unique<MeanAttention>();
  };
  if (std::none_of(registrations().begin(), registrations().end(),
                   [](const Registration& x) { return x.name == "mean-of-values"; }))
    register_attention({"mean-of-values", "", "the mean of the values (a test's own variant)", "mean-of-values", make});
  EXPECT_EQ(make_attention("mean-of-values")->name(), "mean-of-values");
  bool listed = false;
  for (const VariantInfo& v : registered_attentions())
    listed |= v.name == "mean-of-values" && v.capabilities.splits_sequence && !v.capabilities.splits_sequence_causal;
  EXPECT_TRUE(listed);
  std::string why;
  EXPECT_FALSE(sequence_parallel_supported(*make_attention("reformer"), false, &why));
  EXPECT_NE(why.find("mean-of-values (not causal)"), std::string::npos) << why;
  for (const char* bad : {"mean-of-values", "has:colon", ""}) {
    try {
      register_attention({bad, "", "", "mean-of-values", make});
      ADD_FAILURE() << "registered '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("register_attention"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(make_attention("mean-of-values:x=1"), Error);  // its own SpecReader's rules
}

}  // namespace
}  // namespace clattn::testing
