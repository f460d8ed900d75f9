// Full attention: gradients against central finite differences of an independent double-precision
// forward, the tile boundaries of the fast kernel, and the reference's own sanity.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <limits>
#include <vector>

#include "attention/full/full.h"
#include "clattn/attention.h"
#include "common/fd.h"
#include "common/test_util.h"

namespace clattn {
namespace {

using testing::make_problem;
using testing::Problem;
using testing::ProblemData;

// L = Σ dO ∘ O with O from a direct double evaluation of masked softmax attention.
// window > 0: the `local` band (query at key position i + M − N).
double loss_double(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                   const std::vector<double>& v, const ProblemData& pd, double scale,
                   int64_t window) {
  const int64_t G = p.H / p.Hkv;
  double loss = 0;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H; ++h) {
      const int64_t nq = p.qlen.empty() ? p.N : p.qlen[static_cast<size_t>(b)];
      const int64_t nk = p.klen.empty() ? p.M : p.klen[static_cast<size_t>(b)];
      for (int64_t i = 0; i < nq; ++i) {
        std::vector<double> s(static_cast<size_t>(p.M), -std::numeric_limits<double>::infinity());
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < nk; ++j) {
          const int64_t pos = i + p.M - p.N;
          if (p.causal && j > pos) continue;
          if (window > 0 && (p.causal ? j <= pos - window : std::abs(pos - j) > window / 2)) continue;
          double x = 0;
          for (int64_t e = 0; e < p.Dk; ++e)
            x += q[static_cast<size_t>(((b * p.H + h) * p.N + i) * p.Dk + e)] *
                 k[static_cast<size_t>(((b * p.Hkv + h / G) * p.M + j) * p.Dk + e)];
          x *= scale;
          if (p.bias) x += pd.bias.data()[i * p.M + j];
          s[static_cast<size_t>(j)] = x;
          mx = std::max(mx, x);
        }
        if (std::isinf(mx)) continue;
        double z = 0;
        for (auto& x : s) z += (x = std::exp(x - mx));
        for (int64_t e = 0; e < p.Dv; ++e) {
          double o = 0;
          for (int64_t j = 0; j < p.M; ++j)
            o += s[static_cast<size_t>(j)] / z *
                 v[static_cast<size_t>(((b * p.Hkv + h / G) * p.M + j) * p.Dv + e)];
          loss += o * pd.dout.data()[((b * p.H + h) * p.N + i) * p.Dv + e];
        }
      }
    }
  return loss;
}

void check_gradients(const Problem& p, const std::string& spec = "full", int64_t window = 0) {
  SCOPED_TRACE(::testing::Message() << "N=" << p.N << " M=" << p.M << " causal=" << p.causal
                                    << " bias=" << p.bias << " H=" << p.H << " Hkv=" << p.Hkv);
  ProblemData pd = make_problem(p);
  auto att = make_attention(spec);
  Tensor out(Shape{p.B, p.H, p.N, p.Dv});
  Context ctx;
  att->forward(pd.inputs(), out.view(), ctx);
  Tensor dq(pd.q.shape()), dk(pd.k.shape()), dv(pd.v.shape());
  att->backward(pd.inputs(), out.view(), ctx, pd.dout.view(), dq.view(), dk.view(), dv.view());

  auto to_d = [](const Tensor& t) { return std::vector<double>(t.data(), t.data() + t.numel()); };
  std::vector<double> q = to_d(pd.q), k = to_d(pd.k), v = to_d(pd.v);
  const double scale = 1.0 / std::sqrt(static_cast<double>(p.Dk));
  auto loss = [&]() { return loss_double(p, q, k, v, pd, scale, window); };
  testing::expect_fd_match(q, dq, loss, "dq");
  testing::expect_fd_match(k, dk, loss, "dk");
  testing::expect_fd_match(v, dv, loss, "dv");
}

TEST(FullGradients, FiniteDifferencesInDouble) {
  check_gradients(Problem{.B = 1, .H = 2, .Hkv = 2, .N = 5, .M = 7, .Dk = 3, .Dv = 4});
  check_gradients(Problem{.B = 1, .H = 4, .Hkv = 2, .N = 6, .M = 6, .Dk = 5, .Dv = 3, .causal = true});
  check_gradients(Problem{.B = 2, .H = 2, .Hkv = 1, .N = 4, .M = 9, .Dk = 4, .Dv = 4, .qlen = {4, 2}, .klen = {5, 9}});
  check_gradients(Problem{.B = 1, .H = 1, .Hkv = 1, .N = 8, .M = 5, .Dk = 4, .Dv = 2, .causal = true, .bias = true});
  // Across tile boundaries of both passes (64-query and 256/512-key tiles).
  check_gradients(Problem{.B = 1, .H = 1, .Hkv = 1, .N = 70, .M = 300, .Dk = 2, .Dv = 2, .causal = true});
}

TEST(LocalGradients, FiniteDifferencesInDouble) {
  check_gradients(Problem{.B = 1, .H = 2, .Hkv = 1, .N = 9, .M = 7, .Dk = 3, .Dv = 4}, "local:window=4", 4);
  check_gradients(Problem{.B = 2, .H = 2, .Hkv = 2, .N = 8, .M = 8, .Dk = 4, .Dv = 3, .causal = true, .qlen = {8, 5}, .klen = {6, 8}}, "local:window=3", 3);
  check_gradients(Problem{.B = 1, .H = 1, .Hkv = 1, .N = 80, .M = 300, .Dk = 2, .Dv = 2}, "local:window=200", 200);
}

// The fast kernel agrees with the reference at sizes spanning many tiles, including a scale
// that makes the softmax nearly one-hot (large logits exercise the running max).
TEST(FullKernel, LargeLogitsAndManyTiles) {
  Problem p{.B = 1, .H = 2, .Hkv = 2, .N = 700, .M = 1500, .Dk = 32, .Dv = 32};
  ProblemData pd = make_problem(p);
  for (int64_t i = 0; i < pd.q.numel(); ++i) pd.q.data()[i] *= 8.f;
  auto att = make_attention("full");
  Tensor out(Shape{1, 2, 700, 32}), ref(Shape{1, 2, 700, 32});
  Context ctx;
  att->forward(pd.inputs(), out.view(), ctx);
  attn_full_ref_fwd(pd.inputs(), 0.f, ref.view(), nullptr);
  EXPECT_LE(testing::nmse(ref.view(), out.view()), 1e-10);
}

// The saved log-sum-exp is the reference's, and +inf for a row that sees no key.
TEST(FullKernel, LogSumExp) {
  Problem p{.B = 2, .H = 1, .Hkv = 1, .N = 9, .M = 600, .Dk = 8, .Dv = 8, .klen = {600, 0}};
  ProblemData pd = make_problem(p);
  Tensor out(Shape{2, 1, 9, 8}), ref(Shape{2, 1, 9, 8});
  std::vector<float> lse_ref(18);
  Context ctx;
  make_attention("full:scale=0.25")->forward(pd.inputs(), out.view(), ctx);
  const float* lse_p = ctx.saved<FullState>().lse.data();
  const std::vector<float> lse(lse_p, lse_p + 18);
  attn_full_ref_fwd(pd.inputs(), 0.25f, ref.view(), lse_ref.data());
  for (int i = 0; i < 9; ++i) EXPECT_NEAR(lse[static_cast<size_t>(i)], lse_ref[static_cast<size_t>(i)], 1e-5);
  for (int i = 9; i < 18; ++i) EXPECT_EQ(lse[static_cast<size_t>(i)], std::numeric_limits<float>::infinity());
}

// Inputs with arbitrary batch/head/row strides (views into bigger buffers) give the same result.
TEST(FullKernel, StridedInputs) {
  Problem p{.B = 2, .H = 2, .Hkv = 2, .N = 70, .M = 70, .Dk = 8, .Dv = 8};
  ProblemData pd = make_problem(p);
  Tensor big = testing::randn(Shape{2, 2, 70, 20}, 9, 9);
  ConstView qs{big.data() + 3, Shape{2, 2, 70, 8}, {2 * 70 * 20, 70 * 20, 20, 1}};
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 70; ++i)
        for (int64_t e = 0; e < 8; ++e) pd.q.view().ptr(b, h, i)[e] = qs.ptr(b, h, i)[e];
  AttentionInputs a = pd.inputs();
  AttentionInputs s = a;
  s.q = qs;
  auto att = make_attention("full");
  Tensor o1(Shape{2, 2, 70, 8}), o2(Shape{2, 2, 70, 8});
  Context c1, c2;
  att->forward(a, o1.view(), c1);
  att->forward(s, o2.view(), c2);
  for (int64_t i = 0; i < o1.numel(); ++i) ASSERT_EQ(o1.data()[i], o2.data()[i]);
}

// The finite check scans blocks of rows and names the first bad element in (b, h, row, col)
// order, whatever the block, the strides or how many bad values follow it.
TEST(InputCheck, NamesTheFirstNonFiniteElement) {
  Problem p{.B = 2, .H = 3, .Hkv = 3, .N = 100, .M = 100, .Dk = 20, .Dv = 8};
  Tensor big = testing::randn(Shape{2, 3, 100, 24}, 9, 9);
  ConstView qs{big.data() + 2, Shape{2, 3, 100, 20}, {3 * 100 * 24, 100 * 24, 24, 1}};
  ProblemData pd = make_problem(p);
  AttentionInputs in = pd.inputs();
  in.q = qs;
  auto att = make_attention("full");
  Tensor o(Shape{2, 3, 100, 8});
  auto message = [&] {
    try {
      Context c;
      att->forward(in, o.view(), c);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(), "no error");
  big.data()[2 + ((1 * 3 + 2) * 100 + 99) * 24 + 19] = std::numeric_limits<float>::infinity();
  EXPECT_NE(message().find("q must be finite, found inf at index (1, 2, 99, 19)"), std::string::npos) << message();
  big.data()[2 + ((1 * 3 + 1) * 100 + 70) * 24 + 5] = std::nanf("");
  big.data()[2 + ((1 * 3 + 1) * 100 + 71) * 24 + 0] = -std::numeric_limits<float>::infinity();
  EXPECT_NE(message().find("at index (1, 1, 70, 5)"), std::string::npos) << message();
  big.data()[2 + ((0 * 3 + 0) * 100 + 33) * 24 + 3] = std::nanf("");
  EXPECT_NE(message().find("at index (0, 0, 33, 3)"), std::string::npos) << message();
  // Outside the view (the padding columns of each row) is not looked at.
  big.data()[22] = std::nanf("");
  EXPECT_NE(message().find("at index (0, 0, 33, 3)"), std::string::npos) << message();
}

}  // namespace
}  // namespace clattn
