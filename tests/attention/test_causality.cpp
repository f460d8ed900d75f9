// Strict causality of every registered variant that accepts a causal mask: the output at position
// i is bit-identical when any query, key or value after i changes, and the gradient of a loss on
// rows <= i is exactly 0 on everything after i. The list is the registry's (as the registry suite),
// so a newly registered causal variant is tested without an edit here.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "clattn/attention.h"
#include "clattn/spec.h"
#include "common/test_util.h"

namespace clattn {
namespace {

using testing::make_problem;
using testing::Problem;
using testing::ProblemData;

// The registry's example of every variant, plus settings that exercise what the example might not
// reach at these lengths (small blocks and clusters, few top-k keys, the length limit crossed).
std::vector<std::string> specs() {
  std::vector<std::string> out;
  for (const VariantInfo& v : registered_attentions()) out.push_back(v.example);
  for (const char* s : {"clustered:clusters=3,block=16,segment=32", "improved-clustered:clusters=3,topk=4,block=8,segment=24",
                        "improved-clustered:clusters=5,topk=2,block=25,segment=50,clustering=positional",
                        "topk:topk=3", "local:window=7", "smyrf:hashes=2,q_cluster=8,k_cluster=8",
                        "routing:clusters=4", "routing:clusters=4,window=8,centroids=ema",
                        "routing:clusters=3,centroids=ema,seed=2", "smyrf:hashes=3,q_cluster=4,k_cluster=5",
                        "reformer:rounds=2,chunk=8",
                        "conditional-full:length_limit=64,improved-clustered:clusters=3,topk=4,block=16,segment=32"})
    out.emplace_back(s);
  return out;
}

// Rows [r0, end) of every (b, h) replaced by fresh random values.
void perturb_rows(Tensor& t, int64_t r0, uint64_t seed) {
  const Tensor fresh = testing::randn(t.shape(), seed, 9);
  for (int64_t b = 0; b < t.dim(0); ++b)
    for (int64_t h = 0; h < t.dim(1); ++h)
      for (int64_t i = std::max<int64_t>(r0, 0); i < t.dim(2); ++i)
        for (int64_t e = 0; e < t.dim(3); ++e) t.view().ptr(b, h, i)[e] = fresh.view().ptr(b, h, i)[e];
}

class Causality : public ::testing::TestWithParam<std::string> {};

TEST_P(Causality, TheFutureNeverChangesThePast) {
  auto att = make_attention(GetParam());
  const Capabilities& caps = att->capabilities();
  if (!caps.causal) GTEST_SKIP() << GetParam() << " refuses causal masks";
  for (auto [n, m] : {std::pair<int64_t, int64_t>{200, 200}, {150, 230}}) {
    if (n != m && !caps.cross) continue;
    const Problem p{.B = 2, .H = 4, .Hkv = caps.gqa && !caps.shared_qk ? 2 : 4, .N = n, .M = m, .Dk = 16,
                    .Dv = 16, .causal = true, .qlen = {static_cast<int32_t>(n), static_cast<int32_t>(n - 31)}};
    const int64_t off = m - n;
    ProblemData base = make_problem(p);
    base.causal = true;
    base.shared_qk = caps.shared_qk;
    AttentionState state;  // routing's EMA centroids: made once from the seed, read by every call
    Tensor out0(Shape{p.B, p.H, n, p.Dv});
    Context c0;
    att->forward(base.inputs(&state), out0.view(), c0);
    for (int64_t cut : {0, 15, 64, 127, 149}) {
      SCOPED_TRACE(GetParam() + " N=" + std::to_string(n) + " M=" + std::to_string(m) + " last unchanged row " + std::to_string(cut));
      ProblemData pd = make_problem(p);
      pd.causal = true;
      pd.shared_qk = caps.shared_qk;
      perturb_rows(pd.q, cut + 1, 100 + static_cast<uint64_t>(cut));
      perturb_rows(pd.k, cut + 1 + off, 200 + static_cast<uint64_t>(cut));
      perturb_rows(pd.v, cut + 1 + off, 300 + static_cast<uint64_t>(cut));
      Tensor out1(out0.shape());
      Context c1;
      att->forward(pd.inputs(&state), out1.view(), c1);
      for (int64_t b = 0; b < p.B; ++b)
        for (int64_t h = 0; h < p.H; ++h)
          for (int64_t i = 0; i <= cut; ++i)
            for (int64_t e = 0; e < p.Dv; ++e)
              ASSERT_EQ(out0.view().ptr(b, h, i)[e], out1.view().ptr(b, h, i)[e]) << "b=" << b << " h=" << h << " i=" << i;
      if (!caps.trainable) continue;
      // A loss on rows <= cut: no gradient may reach a query after cut or a key after cut + off.
      for (int64_t b = 0; b < p.B; ++b)
        for (int64_t h = 0; h < p.H; ++h)
          for (int64_t i = cut + 1; i < n; ++i)
            for (int64_t e = 0; e < p.Dv; ++e) pd.dout.view().ptr(b, h, i)[e] = 0.f;
      Tensor dq(pd.q.shape()), dk(pd.k.shape()), dv(pd.v.shape());
      att->backward(pd.inputs(&state), out1.view(), c1, pd.dout.view(), dq.view(), dk.view(), dv.view());
      for (int64_t b = 0; b < p.B; ++b)
        for (int64_t h = 0; h < p.H; ++h)
          for (int64_t i = cut + 1; i < n; ++i)
            for (int64_t e = 0; e < p.Dk; ++e) ASSERT_EQ(dq.view().ptr(b, h, i)[e], 0.f) << "dq b=" << b << " i=" << i;
      for (int64_t b = 0; b < p.B; ++b)
        for (int64_t h = 0; h < dk.dim(1); ++h)
          for (int64_t j = std::max<int64_t>(0, cut + 1 + off); j < m; ++j) {
            for (int64_t e = 0; e < p.Dk; ++e) ASSERT_EQ(dk.view().ptr(b, h, j)[e], 0.f) << "dk b=" << b << " j=" << j;
            for (int64_t e = 0; e < p.Dv; ++e) ASSERT_EQ(dv.view().ptr(b, h, j)[e], 0.f) << "dv b=" << b << " j=" << j;
          }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, Causality, ::testing::ValuesIn(specs()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string s;
                           for (char ch : info.param) s += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return s;
                         });

}  // namespace
}  // namespace clattn
