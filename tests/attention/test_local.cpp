// Local attention: the band rule itself, its limit (a window covering everything is full
// attention), and gradients by finite differences in double.
#include <gtest/gtest.h>

#include <cmath>

#include "attention/full/full.h"
#include "clattn/attention.h"
#include "common/test_util.h"

namespace clattn {
namespace {

using testing::make_problem;
using testing::nmse;
using testing::Problem;
using testing::ProblemData;

TEST(Local, WideWindowIsFullAttention) {
  for (bool causal : {false, true})
    for (auto [n, m] : {std::pair<int32_t, int32_t>{65, 65}, {100, 300}, {300, 100}, {1000, 1000}}) {
      Problem p{.B = 2, .H = 2, .Hkv = 1, .N = n, .M = m, .Dk = 16, .Dv = 8, .causal = causal, .qlen = {n, n / 2}, .klen = {m, m / 3}};
      ProblemData pd = make_problem(p);
      const int64_t w = 2 * std::max(n, m) + 2;
      auto att = make_attention("local:window=" + std::to_string(w));
      Tensor out(Shape{2, 2, n, 8}), ref(Shape{2, 2, n, 8});
      Context ctx;
      att->forward(pd.inputs(), out.view(), ctx);
      attn_full_ref_fwd(pd.inputs(), 0.f, ref.view(), nullptr);
      EXPECT_LE(nmse(ref.view(), out.view()), 1e-10) << n << " " << m << " causal " << causal;
    }
}

// Each output row is the softmax over exactly its band: with v = one-hot positions the output is
// the attention row, zero outside the band.
TEST(Local, AttendsOnlyItsBand) {
  for (bool causal : {false, true}) {
    const int64_t n = 200, w = 20;
    Problem p{.B = 1, .H = 1, .Hkv = 1, .N = n, .M = n, .Dk = 8, .Dv = n, .causal = causal};
    ProblemData pd = make_problem(p);
    pd.v = Tensor(Shape{1, 1, n, n});
    for (int64_t j = 0; j < n; ++j) pd.v.data()[j * n + j] = 1.f;
    auto att = make_attention("local:window=" + std::to_string(w));
    Tensor out(Shape{1, 1, n, n});
    Context ctx;
    att->forward(pd.inputs(), out.view(), ctx);
    for (int64_t i = 0; i < n; ++i) {
      double sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        const bool in_band = causal ? (j <= i && j > i - w) : std::abs(i - j) <= w / 2;
        const float x = out.data()[i * n + j];
        if (!in_band) ASSERT_EQ(x, 0.f) << i << " " << j;
        else ASSERT_GT(x, 0.f) << i << " " << j;
        sum += x;
      }
      EXPECT_NEAR(sum, 1.0, 1e-5);
    }
  }
}

TEST(Local, GradientsMatchReference) {
  // The reference backward is the closed form in double; the registry suite covers it at many
  // shapes. Here: long sequences whose bands cross many key tiles of the backward.
  for (bool causal : {false, true}) {
    Problem p{.B = 1, .H = 2, .Hkv = 1, .N = 1500, .M = 1300, .Dk = 8, .Dv = 8, .causal = causal};
    ProblemData pd = make_problem(p);
    auto att = make_attention("local:window=300");
    Tensor out(Shape{1, 2, 1500, 8});
    Context ctx;
    att->forward(pd.inputs(), out.view(), ctx);
    Tensor dq(pd.q.shape()), dk(pd.k.shape()), dv(pd.v.shape()), rq(pd.q.shape()), rk(pd.k.shape()), rv(pd.v.shape());
    att->backward(pd.inputs(), out.view(), ctx, pd.dout.view(), dq.view(), dk.view(), dv.view());
    attn_full_ref_bwd(pd.inputs(), 0.f, pd.dout.view(), rq.view(), rk.view(), rv.view(), 300);
    EXPECT_LE(nmse(rq.view(), dq.view()), 1e-9);
    EXPECT_LE(nmse(rk.view(), dk.view()), 1e-9);
    EXPECT_LE(nmse(rv.view(), dv.view()), 1e-9);
  }
}

TEST(Local, SpecErrors) {
  EXPECT_THROW(make_attention("local"), Error);
  EXPECT_THROW(make_attention("local:window=0"), Error);
  EXPECT_THROW(make_attention("local:window=8,topk=3"), Error);
  EXPECT_NO_THROW(make_attention("local:window=8,scale=0.5"));
}

}  // namespace
}  // namespace clattn
