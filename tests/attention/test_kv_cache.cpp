// KVCache decoding: attention over a cache appended one position at a time gives what the same
// rows give as plain tensors, for full (which reads the cache's panels) and for variants that read
// its strided views; bad appends and misuse are refused and leave the cache unchanged.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "clattn/attention.h"
#include "clattn/kv_cache.h"
#include "common/test_util.h"

namespace clattn {
namespace {

using testing::bitwise_equal;
using testing::max_abs_diff;
using testing::nmse;
using testing::randn;
using testing::rows;

// ---------------------------------------------------------------------------------------------
// 7. Decoding from a KVCache gives what the same rows give as plain tensors.


TEST(ApiKVCache, KVCacheDecodeMatchesFull) {
  constexpr int64_t B = 2, Hkv = 2, H = 4, Dk = 32, Dv = 16, steps = 130;
  KVCache cache(B, Hkv, 200, Dk, Dv);
  EXPECT_GE(cache.capacity(), 200);
  EXPECT_EQ(cache.size(), 0);
  const Tensor K = randn(Shape{B, Hkv, steps, Dk}, 51, 1);
  const Tensor V = randn(Shape{B, Hkv, steps, Dv}, 51, 2);
  const Tensor q1 = randn(Shape{B, H, 1, Dk}, 51, 3);
  const Tensor q3 = randn(Shape{B, H, 3, Dk}, 51, 4);
  auto full = make_attention("full");
  auto local = make_attention("local:window=16");
  auto topk = make_attention("topk:topk=8");
  const std::vector<int64_t> checks = {1, 2, 3, 63, 64, 65, 127, 128, 129, 130};

  for (int64_t s = 1; s <= steps; ++s) {
    cache.append(rows(K, s - 1, 1), rows(V, s - 1, 1));  // T = 1, strided views
    ASSERT_EQ(cache.size(), s);
    if (std::find(checks.begin(), checks.end(), s) == checks.end()) continue;
    SCOPED_TRACE(::testing::Message() << "cache size " << s);
    const Tensor k = Tensor::from(rows(K, 0, s)), v = Tensor::from(rows(V, 0, s));
    ASSERT_EQ(cache.keys().shape, k.shape());
    ASSERT_EQ(cache.values().shape, v.shape());
    EXPECT_EQ(max_abs_diff(cache.keys(), k.view()), 0.0);
    EXPECT_EQ(max_abs_diff(cache.values(), v.view()), 0.0);
    for (const Attention* att : {full.get(), local.get(), topk.get()})
      for (int which = 0; which < 3; ++which) {
        const Tensor& q = which == 0 ? q1 : q3;
        const bool causal = which == 2;
        SCOPED_TRACE(::testing::Message() << att->name() << " N=" << q.dim(2) << " causal=" << causal);
        AttentionInputs plain;
        plain.q = q.view();
        plain.k = k.view();
        plain.v = v.view();
        plain.causal = causal;
        AttentionInputs cached = plain;
        cached.k = cache.keys();
        cached.v = cache.values();
        cached.cache = &cache;
        Tensor want(Shape{B, H, q.dim(2), Dv}), got(Shape{B, H, q.dim(2), Dv});
        {
          Context ctx = Context::for_inference();
          ASSERT_NO_THROW(att->forward(plain, want.view(), ctx));
        }
        {
          Context ctx = Context::for_inference();
          ASSERT_NO_THROW(att->forward(cached, got.view(), ctx));
        }
        ASSERT_TRUE(testing::all_finite(got.view()));
        const double diff = max_abs_diff(want.view(), got.view());
        if (att == full.get())
          EXPECT_TRUE(nmse(want.view(), got.view()) < 1e-10 || diff < 1e-5)
              << "nmse " << nmse(want.view(), got.view()) << ", max abs diff " << diff;
        else
          EXPECT_LE(diff, 1e-6);
      }
  }
  const int64_t held = cache.size();
  const Tensor keys_before = Tensor::from(cache.keys()), values_before = Tensor::from(cache.values());
  auto unchanged = [&]() {
    return cache.size() == held && bitwise_equal(Tensor::from(cache.keys()), keys_before) &&
           bitwise_equal(Tensor::from(cache.values()), values_before);
  };
  // Wrong shapes.
  {
    const Tensor k = randn(Shape{B, Hkv, 1, Dk}, 52, 1), v = randn(Shape{B, Hkv, 1, Dv}, 52, 2);
    const Tensor kd = randn(Shape{B, Hkv, 1, Dk + 1}, 52, 3), vd = randn(Shape{B, Hkv, 1, Dv - 1}, 52, 4);
    const Tensor kb = randn(Shape{B + 1, Hkv, 1, Dk}, 52, 5), kh = randn(Shape{B, Hkv + 1, 1, Dk}, 52, 6);
    const Tensor v2 = randn(Shape{B, Hkv, 2, Dv}, 52, 7), k3 = randn(Shape{B, Hkv, Dk}, 52, 8);
    EXPECT_THROW(cache.append(kd.view(), v.view()), Error);
    EXPECT_THROW(cache.append(k.view(), vd.view()), Error);
    EXPECT_THROW(cache.append(kb.view(), v.view()), Error);
    EXPECT_THROW(cache.append(kh.view(), v.view()), Error);
    EXPECT_THROW(cache.append(k.view(), v2.view()), Error);
    EXPECT_THROW(cache.append(k3.view(), v.view()), Error);
    EXPECT_TRUE(unchanged()) << "a refused append changed the cache";
  }
  // Overflow of the capacity.
  {
    const int64_t T = cache.capacity() - cache.size() + 1;
    const Tensor k = randn(Shape{B, Hkv, T, Dk}, 53, 1), v = randn(Shape{B, Hkv, T, Dv}, 53, 2);
    EXPECT_THROW(cache.append(k.view(), v.view()), Error);
    EXPECT_TRUE(unchanged()) << "an overflowing append changed the cache";
  }
  // Non-finite values.
  {
    Tensor k = randn(Shape{B, Hkv, 2, Dk}, 54, 1), v = randn(Shape{B, Hkv, 2, Dv}, 54, 2);
    k.data()[k.numel() - 3] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_THROW(cache.append(k.view(), v.view()), Error);
    EXPECT_TRUE(unchanged()) << "a NaN key changed the cache";
    Tensor k2 = randn(Shape{B, Hkv, 2, Dk}, 54, 3);
    v.data()[1] = std::numeric_limits<float>::infinity();
    EXPECT_THROW(cache.append(k2.view(), v.view()), Error);
    EXPECT_TRUE(unchanged()) << "an infinite value changed the cache";
  }
  // With a cache, k and v must be its views.
  const Tensor k = Tensor::from(cache.keys()), v = Tensor::from(cache.values());
  Tensor out(Shape{B, H, 1, Dv});
  {
    AttentionInputs in;
    in.q = q1.view();
    in.k = k.view();
    in.v = cache.values();
    in.cache = &cache;
    Context ctx = Context::for_inference();
    EXPECT_THROW(full->forward(in, out.view(), ctx), Error) << "k is not cache.keys()";
    in.k = cache.keys();
    in.v = v.view();
    EXPECT_THROW(full->forward(in, out.view(), ctx), Error) << "v is not cache.values()";
    in.k = rows(k, 0, held - 1);
    in.v = rows(v, 0, held - 1);
    EXPECT_THROW(full->forward(in, out.view(), ctx), Error) << "views of fewer positions";
  }
  // Backward refuses a cache (decoding is inference).
  {
    AttentionInputs in;
    in.q = q1.view();
    in.k = cache.keys();
    in.v = cache.values();
    Context ctx(Mode::training);
    ASSERT_NO_THROW(full->forward(in, out.view(), ctx));
    const Tensor dout = randn(Shape{B, H, 1, Dv}, 55, 1);
    Tensor dq(Shape{B, H, 1, Dk}), dk(k.shape()), dv(v.shape());
    in.cache = &cache;
    EXPECT_THROW(full->backward(in, out.view(), ctx, dout.view(), dq.view(), dk.view(), dv.view()), Error);
  }
  EXPECT_TRUE(unchanged());
}

}  // namespace
}  // namespace clattn
