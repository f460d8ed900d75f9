// KVCache decoding: attention over a cache appended one position at a time gives what the same
// rows give as plain tensors, for full (which reads the cache's panels) and for variants that read
// its strided views; bad appends and misuse are refused and leave the cache unchanged.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "clattn/attention.h"
#include "clattn/kv_cache.h"
#include "common/test_util.h"
#include "core/half.h"

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

// A 16-bit cache (f16 or bf16) gives, bit for bit, what an f32 cache holding the same rows
// rounded to 16 bits gives: the kernels widen the stored bits and run the f32 arithmetic in the
// same order. Full and local, N = 1 and 3, causal or not, grouped heads, odd head sizes, appends of
// a prompt then single positions, and the sizes around the 64-key panels up to 1000.
TEST(ApiKVCache, HalfCacheEqualsF32CacheOfRoundedRows) {
  constexpr int64_t B = 2, Hkv = 2, H = 4, steps = 1000;
  for (const KVCacheType type : {KVCacheType::f16, KVCacheType::bf16})
    for (const auto& [Dk, Dv] : {std::pair<int64_t, int64_t>{64, 64}, {20, 33}}) {
      SCOPED_TRACE(::testing::Message() << kv_cache_type_name(type) << " Dk " << Dk << " Dv " << Dv);
      KVCache c16(B, Hkv, steps, Dk, Dv, 0, type), c32(B, Hkv, steps, Dk, Dv);
      EXPECT_EQ(c16.type(), type);
      EXPECT_LT(c16.bytes(), c32.bytes() / 2);  // K once (panels) and V, two bytes each
      const Tensor K = randn(Shape{B, Hkv, steps, Dk}, 61, 1, 3.f), V = randn(Shape{B, Hkv, steps, Dv}, 61, 2, 3.f);
      Tensor Kr = Tensor::from(K.view()), Vr = Tensor::from(V.view());  // the rows rounded to 16 bits
      for (Tensor* t : {&Kr, &Vr})
        for (int64_t i = 0; i < t->numel(); ++i) {
          float& x = t->data()[i];
          x = type == KVCacheType::f16 ? half::f16_to_f32(half::f32_to_f16(x)) : half::bf16_to_f32(half::f32_to_bf16(x));
        }
      auto full = make_attention("full"), local = make_attention("local:window=16");
      const Tensor q1 = randn(Shape{B, H, 1, Dk}, 61, 3), q3 = randn(Shape{B, H, 3, Dk}, 61, 4);
      const std::vector<int64_t> checks = {1, 3, 63, 64, 65, 129, 1000};
      int64_t s = 0;
      while (s < steps) {
        const int64_t T = s == 0 ? 3 : s == 3 ? 60 : 1;  // a prompt, a longer one, then single steps
        const int64_t t = std::min(T, steps - s);
        c16.append(rows(K, s, t), rows(V, s, t));
        c32.append(rows(Kr, s, t), rows(Vr, s, t));
        s += t;
        if (std::find(checks.begin(), checks.end(), s) == checks.end()) continue;
        ASSERT_EQ(c16.size(), s);
        EXPECT_EQ(c16.keys().data, nullptr);  // shape and strides only: the rows are 16-bit
        EXPECT_EQ(c16.keys().shape, c32.keys().shape);
        for (const Attention* att : {full.get(), local.get()})
          for (int which = 0; which < 3; ++which) {
            const Tensor& q = which == 0 ? q1 : q3;
            if (q.dim(2) > s) continue;
            SCOPED_TRACE(::testing::Message() << att->name() << " size " << s << " N " << q.dim(2) << " causal " << (which == 2));
            Tensor got(Shape{B, H, q.dim(2), Dv}), want(Shape{B, H, q.dim(2), Dv}), exact(Shape{B, H, q.dim(2), Dv});
            for (int run = 0; run < 3; ++run) {
              AttentionInputs in;
              in.q = q.view();
              in.causal = which == 2;
              const KVCache* c = run == 0 ? &c16 : &c32;
              in.k = run == 2 ? rows(K, 0, s) : c->keys();
              in.v = run == 2 ? rows(V, 0, s) : c->values();
              in.cache = run == 2 ? nullptr : c;
              Context ctx = Context::for_inference();
              ASSERT_NO_THROW(att->forward(in, (run == 0 ? got : run == 1 ? want : exact).view(), ctx));
            }
            ASSERT_TRUE(bitwise_equal(got, want)) << "max abs diff " << max_abs_diff(got.view(), want.view());
            // And against the unrounded rows: the storage's rounding, scaled by |v| ~ 3.
            EXPECT_LE(max_abs_diff(got.view(), exact.view()), type == KVCacheType::f16 ? 0.03 : 0.3);
          }
      }
    }
}

// One element of a (B, H, T, D) tensor.
float& el(Tensor& t, int64_t b, int64_t h, int64_t i, int64_t e) { return *t.view().ptr(b, h, i, e); }
float el(const Tensor& t, int64_t b, int64_t h, int64_t i, int64_t e) { return *t.view().ptr(b, h, i, e); }

// drop(first, count, rotate) leaves the cache that appending the kept rows (the moved ones
// through `rotate`) gives: the same attention outputs bit for bit (full reads the panels, local
// and causal clustered the rows, clustered its kept queries and the 16-bit K rows), the key and
// query magnitudes of the rows now held, and a refused range changes nothing.
TEST(ApiKVCache, DropEqualsACacheOfTheKeptRows) {
  constexpr int64_t B = 1, Hkv = 2, H = 4, n = 300;
  // Not a rotation: any change of the moved rows shows whether each was transformed exactly once.
  const KVCache::RowRotation twist = [](float* r, int64_t rows_n, int64_t ld) {
    for (int64_t t = 0; t < rows_n; ++t) {
      r[t * ld] = 0.5f * r[t * ld] + 1.f;
      r[t * ld + 1] *= -2.f;
    }
  };
  for (const KVCacheType type : {KVCacheType::f32, KVCacheType::f16, KVCacheType::bf16})
    for (const int64_t Hq : {int64_t{0}, H})
      for (const auto& [first, count] : {std::pair<int64_t, int64_t>{1, 149}, {0, 64}, {70, 1}, {3, 297}, {64, 65}}) {
        const int64_t Dk = 20, Dv = 33;
        SCOPED_TRACE(::testing::Message() << kv_cache_type_name(type) << " queries " << Hq << " drop [" << first << ", "
                                          << first + count << ")");
        const Tensor K = randn(Shape{B, Hkv, n, Dk}, 63, 1), V = randn(Shape{B, Hkv, n, Dv}, 63, 2);
        const Tensor Q = randn(Shape{B, H, n, Dk}, 63, 3);
        auto round = [&](float x) {
          return type == KVCacheType::f16 ? half::f16_to_f32(half::f32_to_f16(x))
                 : type == KVCacheType::bf16 ? half::bf16_to_f32(half::f32_to_bf16(x)) : x;
        };
        // The rows the dropped cache must hold: kept as they are, moved ones (16-bit keys rounded
        // first, as stored) through the twist.
        const int64_t now = n - count;
        Tensor Kw(Shape{B, Hkv, now, Dk}), Vw(Shape{B, Hkv, now, Dv}), Qw(Shape{B, H, now, Dk});
        for (int64_t t = 0; t < now; ++t) {
          const int64_t src = t < first ? t : t + count;
          for (int64_t h = 0; h < Hkv; ++h) {
            for (int64_t e = 0; e < Dk; ++e) el(Kw, 0, h, t, e) = t < first ? el(K, 0, h, src, e) : round(el(K, 0, h, src, e));
            for (int64_t e = 0; e < Dv; ++e) el(Vw, 0, h, t, e) = el(V, 0, h, src, e);
            if (t >= first) twist(&el(Kw, 0, h, t, 0), 1, Dk);
          }
          for (int64_t h = 0; h < H; ++h) {
            for (int64_t e = 0; e < Dk; ++e) el(Qw, 0, h, t, e) = el(Q, 0, h, src, e);
            if (t >= first) twist(&el(Qw, 0, h, t, 0), 1, Dk);
          }
        }
        KVCache dropped(B, Hkv, n, Dk, Dv, Hq, type), direct(B, Hkv, n, Dk, Dv, Hq, type);
        // A position at a time, so the magnitudes of the kept rows are their own (an append's
        // bound covers all its rows).
        for (int64_t t = 0; t < n; ++t) dropped.append(rows(K, t, 1), rows(V, t, 1), Hq ? rows(Q, t, 1) : ConstView{});
        for (int64_t t = 0; t < now; ++t) direct.append(rows(Kw, t, 1), rows(Vw, t, 1), Hq ? rows(Qw, t, 1) : ConstView{});
        EXPECT_THROW(dropped.drop(first, n - first + 1, twist), Error);
        EXPECT_THROW(dropped.drop(-1, 2, twist), Error);
        EXPECT_EQ(dropped.size(), n);
        dropped.drop(first, count, twist);
        ASSERT_EQ(dropped.size(), now);
        float kmax = 0, qmax = 0;
        for (int64_t i = 0; i < Kw.numel(); ++i) kmax = std::max(kmax, std::fabs(Kw.data()[i]));  // as append measures: before its rounding
        for (int64_t i = 0; i < Qw.numel(); ++i) qmax = std::max(qmax, std::fabs(Qw.data()[i]));
        EXPECT_EQ(dropped.max_abs_key(), kmax);
        if (Hq) {
          EXPECT_EQ(dropped.max_abs_query(), qmax);
        }
        EXPECT_GE(dropped.max_abs_value(), direct.max_abs_value());  // a bound over the rows it held
        std::vector<std::string> specs = {"full", "local:window=40"};
        if (Hq) specs.push_back("improved-clustered:clusters=6,topk=12,block=32,segment=64");
        const Tensor q = randn(Shape{B, H, 1, Dk}, 63, 4);
        for (const std::string& spec : specs) {
          auto att = make_attention(spec);
          Tensor got(Shape{B, H, 1, Dv}), want(Shape{B, H, 1, Dv});
          for (KVCache* c : {&dropped, &direct}) {
            // One more position, as a decode step appends before it attends.
            const Tensor k1 = randn(Shape{B, Hkv, 1, Dk}, 63, 5), v1 = randn(Shape{B, Hkv, 1, Dv}, 63, 6);
            c->append(k1.view(), v1.view(), Hq ? q.view() : ConstView{});
            AttentionInputs in;
            in.q = q.view();
            in.k = c->keys();
            in.v = c->values();
            in.cache = c;
            in.causal = true;
            Context ctx = Context::for_inference();
            ASSERT_NO_THROW(att->forward(in, (c == &dropped ? got : want).view(), ctx)) << spec;
            c->truncate(now);
          }
          EXPECT_TRUE(bitwise_equal(got, want)) << spec << ": max abs diff " << max_abs_diff(got.view(), want.view());
        }
      }
}

// What a 16-bit cache refuses, and what refusing leaves: variants that read keys as f32 rows, f16
// values past 65504 (the cache unchanged), names that are not types.
TEST(ApiKVCache, HalfCacheRefusals) {
  constexpr int64_t B = 1, Hkv = 2, H = 2, D = 16;
  KVCache c(B, Hkv, 64, D, D, 0, KVCacheType::f16);
  const Tensor k = randn(Shape{B, Hkv, 5, D}, 62, 1), v = randn(Shape{B, Hkv, 5, D}, 62, 2);
  c.append(k.view(), v.view());
  const Tensor q = randn(Shape{B, H, 1, D}, 62, 3);
  Tensor out(Shape{B, H, 1, D});
  for (const char* spec : {"topk:topk=4", "linear", "smyrf", "conditional-full:length_limit=512,topk:topk=4"}) {
    auto att = make_attention(spec);
    AttentionInputs in;
    in.q = q.view();
    in.k = c.keys();
    in.v = c.values();
    in.cache = &c;
    Context ctx = Context::for_inference();
    try {
      att->forward(in, out.view(), ctx);
      ADD_FAILURE() << spec << " took an f16 cache";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("f16 KV cache is read by full, local and causal clustered attention only"), std::string::npos)
          << spec << ": " << e.what();
    }
  }
  Tensor big = randn(Shape{B, Hkv, 1, D}, 62, 4);
  big.data()[3] = 70000.f;
  const Tensor v1 = randn(Shape{B, Hkv, 1, D}, 62, 5);
  EXPECT_THROW(c.append(big.view(), v1.view()), Error);
  EXPECT_THROW(c.append(v1.view(), big.view()), Error);
  EXPECT_EQ(c.size(), 5);
  KVCache cb(B, Hkv, 64, D, D, 0, KVCacheType::bf16);
  EXPECT_NO_THROW(cb.append(big.view(), v1.view()));  // bf16 has f32's range
  EXPECT_NO_THROW(KVCache(B, Hkv, 64, D, D, H, KVCacheType::f16));  // queries in f32, K rows in 16 bits
  EXPECT_THROW((void)c.key_rows16(0, 0), Error);                    // no queries: no K rows
  EXPECT_THROW((void)c.key_panels(0, 0), Error);
  EXPECT_THROW((void)KVCache(B, Hkv, 64, D, D).key_panels16(0, 0), Error);
  EXPECT_EQ(parse_kv_cache_type("F16"), KVCacheType::f16);
  EXPECT_EQ(parse_kv_cache_type("bf16"), KVCacheType::bf16);
  EXPECT_THROW(parse_kv_cache_type("fp16"), Error);
  EXPECT_THROW(parse_kv_cache_type(""), Error);
}

}  // namespace
}  // namespace clattn
