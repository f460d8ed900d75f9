// Sequence-parallel attention against one process. Run alone (one rank, then 2, 3 and 4 ranks as
// threads: parallel/ranks.h) and under `mpirun -np R` (CTest: parallel_mpi2, 3, 4): every rank
// builds the same inputs, computes the whole attention and its gradients with the ordinary kernels,
// then its own slice split across the ranks, and the two must agree — outputs and gradients to 1e-5
// relative over the whole sequence, and for clustered attention the same cluster of every query and
// the same top-k sets. Assertions never change the control flow between collectives (a rank that
// stopped early would leave the others waiting).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attention/clustered/clustered.h"
#include "attention/clustered/split.h"
#include "clattn/attention.h"
#include "clattn/comm.h"
#include "clattn/seq_parallel.h"
#include "common/test_util.h"
#include "parallel/ranks.h"

namespace clattn::testing {
namespace {

struct Case {
  std::string spec;
  int64_t N, B, H, Hkv, D;
  bool causal, lengths;
};

// Rows of the split's pieces of rank r, in local order, copied out of a (B, Hx, N, D) tensor.
Tensor local_rows(const Tensor& t, const SeqSplit& s, int r) {
  const int64_t n = s.local_rows(r);
  Tensor out(Shape{t.dim(0), t.dim(1), n, t.dim(3)});
  for (int64_t b = 0; b < t.dim(0); ++b)
    for (int64_t h = 0; h < t.dim(1); ++h)
      for (int64_t i = 0; i < n; ++i)
        std::copy(t.data() + ((b * t.dim(1) + h) * t.dim(2) + s.global(r, i)) * t.dim(3),
                  t.data() + ((b * t.dim(1) + h) * t.dim(2) + s.global(r, i) + 1) * t.dim(3),
                  out.data() + ((b * t.dim(1) + h) * n + i) * t.dim(3));
  return out;
}

// Σ (local − reference rows)² and Σ reference², added over the ranks: the relative error of the
// whole sequence.
double split_error(Communicator& comm, const Tensor& local, const Tensor& ref, const SeqSplit& s) {
  const Tensor want = local_rows(ref, s, comm.rank());
  double e[2] = {0, 0};
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double d = static_cast<double>(local.data()[i]) - want.data()[i];
    e[0] += d * d;
    e[1] += static_cast<double>(want.data()[i]) * want.data()[i];
  }
  comm.all_reduce_sum(e, 2);
  return e[1] > 0 ? std::sqrt(e[0] / e[1]) : std::sqrt(e[0]);
}

void run_case(Communicator& comm, const Case& c) {
  const int R = comm.size(), r = comm.rank();
  SCOPED_TRACE(c.spec + " N=" + std::to_string(c.N) + (c.causal ? " causal" : "") + (c.lengths ? " lengths" : "") +
               " ranks=" + std::to_string(R));
  const SeqSplit split = c.causal ? SeqSplit::zig_zag(c.N, R) : SeqSplit::contiguous(c.N, R);
  const std::unique_ptr<Attention> att = make_attention(c.spec);
  const Tensor q = randn(Shape{c.B, c.H, c.N, c.D}, 3, 1), k = randn(Shape{c.B, c.Hkv, c.N, c.D}, 3, 2),
               v = randn(Shape{c.B, c.Hkv, c.N, c.D}, 3, 3), go = randn(Shape{c.B, c.H, c.N, c.D}, 3, 4);
  std::vector<int32_t> lens;
  if (c.lengths)
    for (int64_t b = 0; b < c.B; ++b) lens.push_back(static_cast<int32_t>(std::max<int64_t>(1, c.N - 7 * b - b * c.N / 3)));
  // One process: the whole sequence.
  AttentionInputs full;
  full.q = q.view();
  full.k = k.view();
  full.v = v.view();
  full.query_lengths = lens;
  full.key_lengths = lens;
  full.causal = c.causal;
  full.step = 5;
  Tensor o_ref(q.shape()), dq_ref(q.shape()), dk_ref(k.shape()), dv_ref(v.shape());
  Context ctx_ref(Mode::training);
  att->forward(full, o_ref.view(), ctx_ref);
  att->backward(full, o_ref.view(), ctx_ref, go.view(), dq_ref.view(), dk_ref.view(), dv_ref.view());
  // Split across the ranks.
  const Tensor ql = local_rows(q, split, r), kl = local_rows(k, split, r), vl = local_rows(v, split, r),
               gl = local_rows(go, split, r);
  AttentionInputs part = full;
  part.q = ql.view();
  part.k = kl.view();
  part.v = vl.view();
  Tensor o(ql.shape()), dq(ql.shape()), dk(kl.shape()), dv(vl.shape());
  Context ctx(Mode::training);
  sequence_parallel_forward(comm, split, *att, part, o.view(), ctx);
  sequence_parallel_backward(comm, split, *att, part, o.view(), ctx, gl.view(), dq.view(), dk.view(), dv.view());
  EXPECT_LE(split_error(comm, o, o_ref, split), 1e-5) << "output";
  EXPECT_LE(split_error(comm, dq, dq_ref, split), 1e-5) << "dq";
  EXPECT_LE(split_error(comm, dk, dk_ref, split), 1e-5) << "dk";
  EXPECT_LE(split_error(comm, dv, dv_ref, split), 1e-5) << "dv";
  const ClusteredParams* cp = clustered_attention_params(*att);
  if (!cp) return;
  // The same clusters and top-k sets as one process.
  const auto& st = ctx.saved<sp::ClusteredSplitState>();
  const auto& ref = ctx_ref.saved<ClusteredState>();
  int64_t wrong = 0, topk_wrong = 0;
  for (int64_t t = 0; t < c.B * c.H; ++t) {
    std::vector<int32_t> want(static_cast<size_t>(c.N), -1);
    const int32_t* off = ref.offsets.data() + t * (ref.cmax + 1);
    for (int32_t j = 0; j < ref.nclusters[static_cast<size_t>(t)]; ++j)
      for (int32_t x = off[j]; x < off[j + 1]; ++x) want[static_cast<size_t>(ref.order[static_cast<size_t>(t * c.N + x)])] = j;
    for (int64_t i = 0; i < split.local_rows(r); ++i) {
      const int64_t g = split.global(r, i);
      const int32_t got = st.assign[static_cast<size_t>(t * split.local_rows(r) + i)];
      wrong += got != want[static_cast<size_t>(g)] && want[static_cast<size_t>(g)] >= 0;
    }
    if (cp->topk == 0) continue;
    for (int32_t j = 0; j < ref.nclusters[static_cast<size_t>(t)]; ++j)
      for (int32_t x = 0; x < ref.ksel[static_cast<size_t>(t)]; ++x)
        topk_wrong += st.topk[static_cast<size_t>((t * st.cmax + j) * st.kmax + x)] !=
                      ref.topk_idx[static_cast<size_t>((t * ref.cmax + j) * ref.kmax + x)];
  }
  EXPECT_EQ(wrong, 0) << "queries in another cluster than one process puts them";
  EXPECT_EQ(topk_wrong, 0) << "top-k entries that differ from one process's";
}

TEST(SeqParallel, FullRingAttention) {
  on_each_job([](Communicator& comm) {
      for (int64_t N : {4, 63, 64, 65, 1000})
        for (bool lengths : {false, true}) run_case(comm, {"full", N, 2, 4, 2, 16, false, lengths});
      run_case(comm, {"full:scale=0.3", 130, 1, 2, 2, 17, false, false});
  });
}

TEST(SeqParallel, CausalRingAttentionZigZag) {
  on_each_job([](Communicator& comm) {
      for (int64_t N : {8, 63, 64, 65, 1000})
        for (bool lengths : {false, true}) run_case(comm, {"full", N, 2, 4, 2, 16, true, lengths});
  });
}

TEST(SeqParallel, ClusteredAndImproved) {
  on_each_job([](Communicator& comm) {
      for (int64_t N : {4, 63, 64, 65, 1000})
        for (bool lengths : {false, true}) {
          run_case(comm, {"clustered:clusters=5,bits=16", N, 2, 4, 2, 16, false, lengths});
          run_case(comm, {"improved-clustered:clusters=5,topk=4,bits=16", N, 2, 4, 2, 16, false, lengths});
        }
      // 63 bits and 10 rounds (empty clusters re-seeded), more clusters than some sequences' queries.
      run_case(comm, {"improved-clustered:clusters=30,topk=8", 300, 2, 2, 1, 32, false, true});
      run_case(comm, {"clustered:clusters=40", 40, 1, 2, 2, 8, false, false});
  });
}

TEST(SeqParallel, RefusalsNameWhatRuns) {
  on_each_job([](Communicator& comm) {
    std::string why;
    EXPECT_FALSE(sequence_parallel_supported(*make_attention("smyrf"), false, &why));
    // The list comes from the registry's capabilities.
    EXPECT_NE(why.find("full (causal or not), clustered (not causal), improved-clustered (not causal)"),
              std::string::npos)
        << why;
    EXPECT_FALSE(sequence_parallel_supported(*make_attention("clustered:clusters=4"), true, &why));
    EXPECT_FALSE(sequence_parallel_supported(*make_attention("local:window=8"), false, &why));
    EXPECT_TRUE(sequence_parallel_supported(*make_attention("full"), true, &why));
    const SeqSplit s = SeqSplit::contiguous(16 * comm.size(), comm.size());
    const Tensor q = randn(Shape{1, 1, 16, 8}, 1, 1);
    AttentionInputs in;
    in.q = in.k = in.v = q.view();
    Tensor o(q.shape());
    Context ctx;
    in.causal = true;
    EXPECT_THROW(sequence_parallel_forward(comm, s, *make_attention("full"), in, o.view(), ctx), Error);  // needs zig-zag
  });
}

}  // namespace
}  // namespace clattn::testing
