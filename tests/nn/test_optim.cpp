// The optimisation functions of nn.h: AdamW against a scalar double reference over several steps
// (with and without decay), sum_squares against a double sum and its same bits for any thread
// count, scale_inplace, and lr_schedule at known steps and its edge cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "clattn/error.h"
#include "clattn/nn.h"
#include "clattn/threads.h"
#include "clattn/rng.h"

namespace clattn::nn {
namespace {

inline size_t sz(int64_t n) { return static_cast<size_t>(n); }

std::vector<float> randn(int64_t n, uint64_t stream, float sigma = 1.f) {
  Rng rng(4242);
  std::vector<float> v(sz(n));
  for (int64_t i = 0; i < n; ++i) v[sz(i)] = sigma * rng.normal(stream, static_cast<uint64_t>(i));
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

// ---------------------------------------------------------------------------------------------
// AdamW

TEST(AdamW, MatchesScalarDoubleReferenceOverSteps) {
  for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{100003}})
    for (bool decay : {false, true}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " decay=" + std::to_string(decay));
      AdamWOptions opt;
      opt.weight_decay = 0.1f;
      std::vector<float> p = randn(n, 1), m(sz(n), 0.f), v(sz(n), 0.f);
      std::vector<double> pd(p.begin(), p.end()), md(sz(n), 0.0), vd(sz(n), 0.0);
      for (int64_t t = 1; t <= 6; ++t) {
        std::vector<float> g = randn(n, 10 + static_cast<uint64_t>(t), 0.5f);
        if (n > 1) g[1] = 0.f;  // a zero gradient from the start of a step: v may be 0
        const float lr = 1e-2f * static_cast<float>(t);
        adamw_step(p.data(), g.data(), m.data(), v.data(), n, t, lr, opt, decay);
        const double c1 = 1 - std::pow(double(opt.beta1), double(t)), c2 = 1 - std::pow(double(opt.beta2), double(t));
        for (int64_t i = 0; i < n; ++i) {
          const size_t k = sz(i);
          md[k] = opt.beta1 * md[k] + (1 - double(opt.beta1)) * g[k];
          vd[k] = opt.beta2 * vd[k] + (1 - double(opt.beta2)) * double(g[k]) * g[k];
          const double upd = (md[k] / c1) / (std::sqrt(vd[k] / c2) + opt.eps);
          pd[k] -= lr * (upd + (decay ? opt.weight_decay * pd[k] : 0.0));
        }
      }
      // Float rounding: m, v ~1e-7 relative per step; the update m̂/(√v̂ + eps) is O(1) and enters
      // the parameter times lr (<= 0.06): after 6 steps the parameters are off by < 1e-6 absolute,
      // plus their own float rounding (~6e-8·|p| per step).
      double worst_p = 0, worst_m = 0, worst_v = 0;
      for (int64_t i = 0; i < n; ++i) {
        const size_t k = sz(i);
        worst_p = std::max(worst_p, std::fabs(p[k] - pd[k]) / (1e-6 + 1e-6 * std::fabs(pd[k])));
        // m sums gradients of both signs, so it can cancel to ~0: its rounding is relative to the
        // gradients (|g| ~ 0.5, m's terms 0.1·g); v sums squares and stays relative.
        worst_m = std::max(worst_m, std::fabs(m[k] - md[k]) / (1e-2 + std::fabs(md[k])));
        worst_v = std::max(worst_v, std::fabs(v[k] - vd[k]) / (1e-20 + std::fabs(vd[k])));
      }
      EXPECT_LT(worst_p, 1.0);
      EXPECT_LT(worst_m, 1e-5);  // a few roundings (6e-8 each) per step over 6 steps
      EXPECT_LT(worst_v, 1e-5);
      if (n > 1) {
        EXPECT_EQ(m[1], 0.f);  // g = 0 throughout: no update but the decay
        if (!decay) {
          EXPECT_EQ(p[1], randn(n, 1)[1]);
        }
      }
    }
}

TEST(AdamW, FirstStepMovesEachParameterByAboutLr) {
  // At t = 1, m̂ = g and v̂ = g², so the update is lr · g / (|g| + eps) ≈ lr · sign(g).
  std::vector<float> p = {1.f, 1.f, 1.f}, g = {3.f, -0.25f, 1e-3f}, m(3), v(3);
  adamw_step(p.data(), g.data(), m.data(), v.data(), 3, 1, 0.1f, AdamWOptions{}, false);
  EXPECT_NEAR(p[0], 0.9f, 1e-6);
  EXPECT_NEAR(p[1], 1.1f, 1e-6);
  EXPECT_NEAR(p[2], 0.9f, 1e-5);
  // Decay alone (g = 0): p ← p − lr·wd·p.
  std::vector<float> q = {2.f}, z = {0.f}, mq(1), vq(1);
  AdamWOptions o;
  o.weight_decay = 0.5f;
  adamw_step(q.data(), z.data(), mq.data(), vq.data(), 1, 1, 0.1f, o, true);
  EXPECT_FLOAT_EQ(q[0], 2.f - 0.1f * 0.5f * 2.f);
}

TEST(AdamW, SameBitsOnOneAndTwoThreadsAndBadArguments) {
  const int64_t n = 200001;
  const std::vector<float> g = randn(n, 3);
  std::vector<std::vector<float>> out;
  const int saved = max_threads();
  for (int threads : {1, 2}) {
    set_threads(threads);
    std::vector<float> p = randn(n, 2), m(sz(n)), v(sz(n));
    for (int64_t t = 1; t <= 3; ++t) adamw_step(p.data(), g.data(), m.data(), v.data(), n, t, 1e-3f, AdamWOptions{}, true);
    p.insert(p.end(), m.begin(), m.end());
    p.insert(p.end(), v.begin(), v.end());
    out.push_back(p);
  }
  set_threads(saved);
  EXPECT_TRUE(same_bits(out[0], out[1]));
  std::vector<float> p(4), gg(4), m(4), v(4);
  AdamWOptions bad;
  EXPECT_THROW(adamw_step(p.data(), gg.data(), m.data(), v.data(), 4, 0, 1e-3f, AdamWOptions{}, true), Error);
  EXPECT_THROW(adamw_step(p.data(), gg.data(), m.data(), v.data(), 4, 1, std::nanf(""), AdamWOptions{}, true), Error);
  bad.beta1 = 1.f;
  EXPECT_THROW(adamw_step(p.data(), gg.data(), m.data(), v.data(), 4, 1, 1e-3f, bad, true), Error);
  bad = AdamWOptions{};
  bad.eps = 0.f;
  EXPECT_THROW(adamw_step(p.data(), gg.data(), m.data(), v.data(), 4, 1, 1e-3f, bad, true), Error);
  EXPECT_THROW(adamw_step(nullptr, gg.data(), m.data(), v.data(), 4, 1, 1e-3f, AdamWOptions{}, true), Error);
  EXPECT_NO_THROW(adamw_step(nullptr, nullptr, nullptr, nullptr, 0, 1, 1e-3f, AdamWOptions{}, true));
}

// ---------------------------------------------------------------------------------------------
// sum_squares, scale_inplace

TEST(SumSquares, MatchesDoubleSumAndHasTheSameBitsForAnyThreadCount) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{4095}, int64_t{4097},
                    int64_t{1000003}}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const std::vector<float> g = randn(n, 5, 3.f);
    double ref = 0;  // each square of a float is exact in double; only the additions round
    for (float x : g) ref += double(x) * x;
    const int saved = max_threads();
    std::vector<double> got;
    for (int threads : {1, 2, 3}) {
      set_threads(threads);
      got.push_back(sum_squares(g.data(), n));
    }
    set_threads(saved);
    EXPECT_NEAR(got[0], ref, 1e-12 * ref);
    EXPECT_EQ(std::memcmp(&got[0], &got[1], sizeof(double)), 0);
    EXPECT_EQ(std::memcmp(&got[0], &got[2], sizeof(double)), 0);
  }
  std::vector<float> big = {3e38f, 3e38f};
  const double b = big[0];
  EXPECT_EQ(sum_squares(big.data(), 2), 2 * b * b);  // no float overflow
  EXPECT_THROW(sum_squares(nullptr, 3), Error);
}

TEST(ScaleInplace, MultipliesEveryEntry) {
  for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{100003}}) {
    std::vector<float> x = randn(n, 6), y = x;
    scale_inplace(y.data(), 0.37f, n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[sz(i)], x[sz(i)] * 0.37f);
  }
  EXPECT_THROW(scale_inplace(nullptr, 2.f, 3), Error);
}

// ---------------------------------------------------------------------------------------------
// lr_schedule

TEST(LrSchedule, WarmupThenCosineAndEdgeCases) {
  const float base = 1e-3f, lo = 1e-4f;
  // Warm-up: base·(step + 1)/warmup, reaching base at the last warm-up step.
  EXPECT_FLOAT_EQ(lr_schedule(0, 10, 110, base, lo), 1e-4f);
  EXPECT_FLOAT_EQ(lr_schedule(4, 10, 110, base, lo), 5e-4f);
  EXPECT_FLOAT_EQ(lr_schedule(9, 10, 110, base, lo), base);
  // Cosine from base at step = warmup to min_lr at step = total.
  EXPECT_FLOAT_EQ(lr_schedule(10, 10, 110, base, lo), base);
  EXPECT_FLOAT_EQ(lr_schedule(60, 10, 110, base, lo), 0.5f * (base + lo));
  EXPECT_FLOAT_EQ(lr_schedule(35, 10, 110, base, lo), float(lo + 0.5 * (base - lo) * (1 + std::cos(M_PI / 4))));
  EXPECT_FLOAT_EQ(lr_schedule(110, 10, 110, base, lo), lo);
  EXPECT_FLOAT_EQ(lr_schedule(100000, 10, 110, base, lo), lo);
  for (int64_t s = 10; s < 110; ++s) EXPECT_GE(lr_schedule(s, 10, 110, base, lo), lr_schedule(s + 1, 10, 110, base, lo));
  // warmup = 0: cosine from the first step.
  EXPECT_FLOAT_EQ(lr_schedule(0, 0, 100, base, lo), base);
  EXPECT_FLOAT_EQ(lr_schedule(50, 0, 100, base, lo), 0.5f * (base + lo));
  // total <= warmup: no decay phase, base after the warm-up (total = 0 is a constant schedule).
  EXPECT_FLOAT_EQ(lr_schedule(3, 10, 5, base, lo), 4e-4f);
  EXPECT_FLOAT_EQ(lr_schedule(10, 10, 5, base, lo), base);
  EXPECT_FLOAT_EQ(lr_schedule(12345, 0, 0, base, lo), base);
  EXPECT_THROW(lr_schedule(-1, 10, 100, base, lo), Error);
  EXPECT_THROW(lr_schedule(0, -1, 100, base, lo), Error);
  EXPECT_THROW(lr_schedule(0, 1, 100, std::numeric_limits<float>::infinity(), lo), Error);
}

}  // namespace
}  // namespace clattn::nn
