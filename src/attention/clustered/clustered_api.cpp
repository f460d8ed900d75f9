// The registered faces of the clustered family: `clustered` and `improved-clustered`.
// The planes and initial centroids are drawn from (seed, AttentionInputs::step): the same step
// gives the same clusters, training advances the step to see new hashes, and backward reuses the
// partition saved in the context.
#include <algorithm>
#include <cmath>
#include <string>

#include "attention/validate.h"
#include "attention/clustered/clustered.h"
#include "attention/clustered/clustered_internal.h"
#include "attention/query_groups.h"
#include "attention/registry.h"
#include "clattn/kv_cache.h"
#include "attention/clustered/split.h"
#include "sequence_split/split_attention.h"

namespace clattn {
namespace {

// Causal defaults (causal_clustered.cpp, "Defaults"): blocks of 512 positions attended exactly,
// clusters rebuilt every 8 blocks.
constexpr int64_t kDefaultBlock = 512;
constexpr int64_t kSegmentBlocks = 8;

// Clustered and improved-clustered attention over a contiguous split (split.cpp): one Hamming
// k-means over every rank's queries, then each rank's queries attend the shared centroids.
class ClusteredSplit final : public SplitAttention {
 public:
  explicit ClusteredSplit(const ClusteredParams& p) : p_(p) {}
  bool holds_state(const Context& ctx) const override { return ctx.holds<sp::ClusteredSplitState>(); }
  float scale_at(int64_t Dk) const override { return softmax_scale(p_.scale, Dk); }
  bool sums_queries() const override { return true; }
  void forward(Communicator& comm, const SeqSplit& split, const AttentionInputs& in, View out,
               Context& ctx) const override {
    sp::clustered_forward(comm, split, p_, in.step, in, out, ctx.state<sp::ClusteredSplitState>(), ctx.scratch());
  }
  void backward(Communicator& comm, const SeqSplit& split, const AttentionInputs& in, ConstView out, Context& ctx,
                ConstView dout, View dq, View dk, View dv) const override {
    sp::clustered_backward(comm, split, p_, in, out, ctx.saved<sp::ClusteredSplitState>(), dout, dq, dk, dv,
                           ctx.scratch());
  }

 private:
  const ClusteredParams& p_;  // the owning ClusteredAttention's
};

class ClusteredAttention final : public Attention {
 public:
  ClusteredAttention(std::string kind, const ClusteredParams& p) : kind_(std::move(kind)), p_(p), split_(p_) {
    // LSH clustering splits the sequence (the k-means votes add up over the ranks); positional
    // clustering and the causal form (segments of the whole prefix) do not.
    caps_ = Capabilities{.causal = true, .query_lengths = true, .key_lengths = true, .bias = false,
                         .cross = true, .gqa = true, .trainable = true, .shared_qk = false,
                         .stochastic = !p.positional, .stateful = false, .decode_queries = true,
                         .splits_sequence = !p.positional, .splits_sequence_causal = false,
                         .half_cache = true, .torch_ops = true};
  }
  ClusteredAttention(const ClusteredAttention&) = delete;
  ClusteredAttention& operator=(const ClusteredAttention&) = delete;
  const SplitAttention* split() const override { return p_.positional ? nullptr : &split_; }
  std::string name() const override {
    std::string s = detail::concat(kind_, ":clusters=", p_.clusters);
    if (p_.topk > 0) s += detail::concat(",topk=", p_.topk);
    s += detail::concat(",block=", p_.block, ",segment=", p_.segment);
    if (p_.positional) return s + detail::concat(",clustering=positional,seed=", p_.seed);
    return s + detail::concat(",bits=", p_.bits, ",iterations=", p_.iterations,
                              ",hash_bias=", p_.hash_bias ? "true" : "false", ",seed=", p_.seed,
                              p_.scale > 0 ? detail::concat(",scale=", p_.scale) : std::string());
  }
  const Capabilities& capabilities() const override { return caps_; }
  const ClusteredParams& params() const { return p_; }

  void check_magnitudes(const AttentionDims& d, const Magnitudes& m) const override {
    check_softmax_range(d, m, softmax_scale(p_.scale, d.Dk), kind_);
    check_member_range(d, m, false, kind_);  // centroids sum their member queries
  }

  void forward(const AttentionInputs& in, View out, Context& ctx) const override {
    Magnitudes mag;
    const AttentionDims d = validate_inputs(in, caps_, kind_, mag);
    validate_output(out, Shape{d.B, d.H, d.N, d.Dv}, "out", kind_);
    check_magnitudes(d, mag);
    // A 16-bit cache holds K's rows only beside the queries (kv_cache.h): the decoding pipeline
    // reads it; the plain and the prefill pipelines read K as f32 rows.
    check(!in.cache || in.cache->type() == KVCacheType::f32 || (in.causal && in.cache->keeps_queries()), kind_,
          " reads a ", in.cache ? kv_cache_type_name(in.cache->type()) : "", " KV cache only causally and from a "
          "cache that keeps the queries (query_heads = H, as a Decoder's does); use an f32 cache");
    ClusteredState& st = ctx.state<ClusteredState>();
    const float scale = softmax_scale(p_.scale, d.Dk);
    if (in.causal) {
      attn_causal_clustered_fwd(in, d, p_, in.step, out, st, ctx.scratch());
    } else {
      st.causal = false;
      attn_clustered_fwd(in, d, p_, in.step, out, st, ctx.scratch().get<ClusteredWorkspace>());
    }
    if (in.causal || p_.topk > 0) {
      check_results_finite(d, mag, scale, {out}, kind_);
      return;
    }
    // Every valid row of out is a copy of its cluster's Vc_j (the rest are 0): checking the
    // (C_eff, Dv) rows of each head is checking out, without a second pass over (N, Dv) of it.
    for (int64_t t = 0; t < d.B * d.H; ++t) {
      const int64_t ce = st.nclusters[static_cast<size_t>(t)];
      if (ce > 0)
        check_results_finite(d, mag, scale, {make_view(st.resid.data() + t * st.cmax * d.Dv, Shape{ce, d.Dv})}, kind_);
    }
  }

  void backward(const AttentionInputs& in, ConstView out, Context& ctx, ConstView dout, View dq,
                View dk, View dv) const override {
    Magnitudes mag;
    const AttentionDims d = validate_inputs(in, caps_, kind_, mag);
    check_member_range(d, mag, false, kind_);
    const ClusteredState& st = ctx.saved<ClusteredState>();
    check(st.causal == in.causal, kind_, ": backward's causal flag differs from the forward's");
    if (in.causal) {
      check(st.cz.alpha.shape() == Shape{d.B * d.H, d.N} && st.cz.nb == (d.M + p_.block - 1) / p_.block,
            kind_, ": backward inputs have shapes other than the forward's (q is now ", in.q.shape, ")");
      validate_softmax_backward(in, d, mag, softmax_scale(p_.scale, d.Dk), out, dout, dq, dk, dv, kind_);
      attn_causal_clustered_bwd(in, d, p_, st, out, dout, dq, dk, dv, ctx.scratch());
      check_results_finite(d, mag, softmax_scale(p_.scale, d.Dk), {dq, dk, dv}, kind_);
      return;
    }
    check(st.order.size() == static_cast<size_t>(d.B * d.H * d.N) &&
              st.qc.shape() == Shape{d.B, d.H, st.cmax, d.Dk},
          kind_, ": backward inputs have shapes other than the forward's (q is now ",
          in.q.shape, ")");
    validate_softmax_backward(in, d, mag, softmax_scale(p_.scale, d.Dk), out, dout, dq, dk, dv, kind_);
    attn_clustered_bwd(in, d, p_, st, dout, dq, dk, dv, ctx.scratch().get<ClusteredWorkspace>());
    check_results_finite(d, mag, softmax_scale(p_.scale, d.Dk), {dq, dk, dv}, kind_);
  }

  size_t workspace_bytes(const AttentionDims& d, Mode mode, int threads) const override {
    // The mask is not among the sizes: the bound covers both the causal and the plain pipeline.
    return std::max(clustered_workspace_bytes(d, p_, mode, threads),
                    causal_clustered_workspace_bytes(d, p_, mode, threads));
  }
  WorkModel work(const AttentionDims& d, bool causal, Mode mode) const override {
    return clustered_work(d, p_, causal, mode);
  }
  double decode_bytes(const AttentionDims& d, double context, double element_bytes) const override {
    return causal_decode_bytes(d, p_, context, element_bytes);
  }

  // Plain: the segments of `order`. Causal: each query's cluster in its segment, offset by the
  // segment (rows attended exactly have none).
  QueryGroups query_groups(const AttentionInputs& in, const Context& ctx, int64_t b, int64_t h) const override {
    const AttentionDims d = query_groups_dims(in, caps_, b, h, kind_);
    const ClusteredState& st = query_groups_state<ClusteredState>(ctx, kind_);
    const int64_t t = b * d.H + h, nv = valid_queries(in, d, b);
    QueryGroups g{std::vector<int32_t>(static_cast<size_t>(d.N), -1), "cluster"};
    if (in.causal) {
      const CausalClusters& cz = st.cz;
      check_query_groups_shapes(st.causal && cz.alpha.shape() == Shape{d.B * d.H, d.N} &&
                                    cz.nb == (d.M + p_.block - 1) / p_.block,
                                in, kind_);
      if (cz.member.empty()) return g;  // every row exact
      const int32_t* member = cz.member.data() + t * d.N;  // (N)
      for (int64_t i = 0; i < nv; ++i)
        if (member[i] >= 0)
          g.ids[static_cast<size_t>(i)] =
              static_cast<int32_t>(causal_segment_of(cz.seg_start, i + d.M - d.N) * cz.cmax + member[i]);
      return g;
    }
    check_query_groups_shapes(!st.causal && st.order.size() == static_cast<size_t>(d.B * d.H * d.N) &&
                                  st.offsets.size() == static_cast<size_t>(d.B * d.H * (st.cmax + 1)),
                              in, kind_);
    const int32_t* off = st.offsets.data() + t * (st.cmax + 1);  // (cmax + 1)
    const int32_t* order = st.order.data() + t * d.N;           // (N) valid queries by cluster
    for (int32_t c = 0; c < st.nclusters[static_cast<size_t>(t)]; ++c)
      for (int32_t x = off[c]; x < off[c + 1]; ++x)
        if (order[x] < nv) g.ids[static_cast<size_t>(order[x])] = c;
    return g;
  }

 private:
  std::string kind_;
  ClusteredParams p_;
  ClusteredSplit split_;  // reads p_: never copied
  Capabilities caps_;
};

ClusteredParams read_clustered(SpecReader& r, const Spec& spec, bool improved) {
  ClusteredParams p;
  r.require("clusters", spec.name + ":clusters=100");
  p.clusters = r.get_int("clusters", 0, 1, int64_t{1} << 30);
  p.bits = static_cast<int>(r.get_int("bits", 63, 1, 64));
  p.iterations = static_cast<int>(r.get_int("iterations", 10, 0, 1000));
  p.hash_bias = r.get_bool("hash_bias", true);
  p.positional = r.get_choice("clustering", "lsh", {"lsh", "positional"}) == "positional";
  if (improved) p.topk = r.get_int("topk", 32, 1, int64_t{1} << 30);
  p.block = r.get_int("block", kDefaultBlock, 1, int64_t{1} << 30);
  p.segment = r.get_int("segment", kSegmentBlocks * p.block, 1, int64_t{1} << 40, "8*block");
  p.scale = static_cast<float>(r.get_float("scale", 0.0, 1e-6, 1e6, "1/sqrt(Dk)"));
  p.seed = static_cast<uint64_t>(r.get_int("seed", 0, 0, int64_t{1} << 62));
  r.finish();
  check(p.segment % p.block == 0, "spec '", spec.text, "': segment (", p.segment,
        ") must be a multiple of block (", p.block, ")");
  return p;
}

}  // namespace

const ClusteredParams* clustered_attention_params(const Attention& a) {
  const auto* c = dynamic_cast<const ClusteredAttention*>(&a);
  return c ? &c->params() : nullptr;
}

std::unique_ptr<Attention> make_clustered(const Spec& spec) {
  SpecReader r(spec);
  return std::make_unique<ClusteredAttention>("clustered", read_clustered(r, spec, false));
}

std::unique_ptr<Attention> make_improved_clustered(const Spec& spec) {
  SpecReader r(spec);
  return std::make_unique<ClusteredAttention>("improved-clustered", read_clustered(r, spec, true));
}

}  // namespace clattn
