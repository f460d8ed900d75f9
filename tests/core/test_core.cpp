// Core: tensors and views, the counter-based rng, the vectorised exp, the ISA tables, the GEMM
// wrapper against plain loops (the tile kernels' own tests: test_microkernel.cpp).
#include <gtest/gtest.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <limits>
#include <new>
#include <set>
#include <vector>

#include "clattn/cpu.h"
#include "clattn/error.h"
#include "clattn/gemm.h"
#include "clattn/threads.h"
#include "clattn/rng.h"
#include "clattn/tensor.h"
#include "core/half.h"
#include "core/isa.h"
#include "core/microkernel.h"
#include "core/simd.h"

namespace clattn {
namespace {

TEST(Tensor, ShapeStridesAndViews) {
  Tensor t(Shape{2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.view().stride(0), 12);
  EXPECT_EQ(t.view().stride(2), 1);
  EXPECT_TRUE(t.view().contiguous());
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(t.data()[i], 0.f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  t.data()[1 * 12 + 2 * 4 + 3] = 5.f;
  EXPECT_EQ(*t.view().ptr(1, 2, 3), 5.f);
  EXPECT_EQ(Shape({2, 3, 4}).str(), "(2, 3, 4)");
  // A transposed view copies into the right order.
  View v = t.view();
  std::swap(v.shape.dims[0], v.shape.dims[1]);
  std::swap(v.strides[0], v.strides[1]);
  EXPECT_FALSE(v.contiguous());
  Tensor c = Tensor::from(v);
  EXPECT_EQ(c.shape(), (Shape{3, 2, 4}));
  EXPECT_EQ(*c.view().ptr(2, 1, 3), 5.f);
  EXPECT_THROW(Tensor(Shape{2, -1}), Error);
  EXPECT_THROW(Shape({1, 2, 3, 4, 5, 6, 7}), Error);
}

TEST(Tensor, ResizeReusesStorage) {
  Tensor t(Shape{100});
  const float* p = t.data();
  t.resize(Shape{10, 10});
  EXPECT_EQ(t.data(), p);
  t.resize(Shape{5});
  EXPECT_EQ(t.data(), p);
}

TEST(Rng, ReproducibleAndIndependent) {
  Rng a(7), b(7), c(8);
  EXPECT_EQ(a.u64(0, 5), b.u64(0, 5));
  EXPECT_NE(a.u64(0, 5), c.u64(0, 5));
  EXPECT_NE(a.u64(0, 5), a.u64(1, 5));
  EXPECT_NE(a.u64(0, 5), a.u64(0, 6));
  // Moments of the normal draws and range of the uniform ones.
  double s = 0, s2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double x = a.normal(3, static_cast<uint64_t>(i));
    s += x;
    s2 += x * x;
    const float u = a.uniform(4, static_cast<uint64_t>(i));
    ASSERT_GE(u, 0.f);
    ASSERT_LT(u, 1.f);
  }
  EXPECT_NEAR(s / n, 0.0, 0.01);
  EXPECT_NEAR(s2 / n, 1.0, 0.01);
  std::set<uint64_t> seen;
  for (int i = 0; i < 1000; ++i) seen.insert(a.below(10, 9, static_cast<uint64_t>(i)));
  EXPECT_EQ(seen.size(), 10u);
}

TEST(Simd, ExpIsAccurate) {
  double worst = 0, worst2 = 0;
  for (float x = -87.f; x < 88.f; x += 0.00731f) {
    float buf[16];
    for (int l = 0; l < 16; ++l) buf[l] = x + 0.0004f * static_cast<float>(l);
    const simd::vf e = simd::exp(simd::load(buf)), e2 = simd::exp2(simd::load(buf) * 0.125f);
    for (int l = 0; l < 16; ++l) {
      const double ref = std::exp(static_cast<double>(buf[l]));
      worst = std::max(worst, std::abs(e[l] - ref) / ref);
      const double ref2 = std::exp2(static_cast<double>(buf[l] * 0.125f));
      worst2 = std::max(worst2, std::abs(e2[l] - ref2) / ref2);
    }
  }
  EXPECT_LT(worst, 3e-7);   // ~2.5 ulp
  EXPECT_LT(worst2, 3e-7);
  float special[16] = {-INFINITY, -1000.f, -104.f, 0.f, 89.f, 1000.f, INFINITY, 1.f};
  const simd::vf e = simd::exp(simd::load(special));
  EXPECT_EQ(e[0], 0.f);
  EXPECT_EQ(e[1], 0.f);
  EXPECT_GE(e[2], 0.f);
  EXPECT_EQ(e[3], 1.f);
  EXPECT_EQ(e[4], INFINITY);
  EXPECT_EQ(e[5], INFINITY);
  EXPECT_EQ(e[6], INFINITY);
  EXPECT_EQ(simd::exp2(simd::splat(-INFINITY))[0], 0.f);
  float v[16];
  for (int l = 0; l < 16; ++l) v[l] = static_cast<float>((l * 7) % 16) - 3.f;
  EXPECT_EQ(simd::hmax(simd::load(v)), 12.f);
  EXPECT_EQ(simd::hsum(simd::load(v)), 72.f);
}

TEST(Gemm, MatchesLoops) {
  const int64_t m = 37, n = 23, k = 19;
  std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n)), c(static_cast<size_t>(m * n), 1.f);
  Rng r(1);
  for (size_t i = 0; i < a.size(); ++i) a[i] = r.normal(0, i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = r.normal(1, i);
  gemm(false, false, m, n, k, 2.f, a.data(), k, b.data(), n, 0.5f, c.data(), n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t e = 0; e < k; ++e) s += static_cast<double>(a[static_cast<size_t>(i * k + e)]) * b[static_cast<size_t>(e * n + j)];
      EXPECT_NEAR(c[static_cast<size_t>(i * n + j)], 2 * s + 0.5, 1e-4);
    }
}

// One table per ISA, chosen in one place: ScopedIsa switches every dispatched entry point (the
// tiles' and k-means') and the reported ISA, and gives the chosen one back; an ISA this build has
// no copy of, or this CPU cannot run, is refused by name.
TEST(IsaTables, ScopedIsaSwitchesEveryEntryPoint) {
  const Isa chosen = active_isa();
  const std::vector<Isa> isas = runnable_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_NE(std::find(isas.begin(), isas.end(), chosen), isas.end());
  for (const Isa isa : isas) {
    const IsaKernels* k = isa_kernels_for(isa);
    ASSERT_NE(k, nullptr);
    EXPECT_EQ(k->isa, isa);
    {
      const ScopedIsa scoped(isa);
      EXPECT_EQ(active_isa(), isa);
      EXPECT_EQ(&isa_kernels(), k);
      EXPECT_EQ(&mk::kernels(), k->tiles);
      EXPECT_EQ(mk::kernels_for(isa_name(isa)), k->tiles);
    }
    EXPECT_EQ(active_isa(), chosen);
  }
  EXPECT_EQ(isa_kernels_for(Isa::generic), nullptr);  // an x86-64 build names its copies
  EXPECT_THROW(ScopedIsa{Isa::generic}, Error);
  EXPECT_STREQ(isa_name(Isa::generic), "generic");
  if (!cpu_features().has_avx512()) {
    EXPECT_THROW(ScopedIsa{Isa::avx512}, Error);
  }
}

// linear_gemm over a 16-bit W: few rows (rows_dot16, m <= 8) and many (blocks of widened rows,
// several blocks at k = 300, n = 2000) equal the f32 product of the widened weights; beta and row strides.
TEST(Gemm, LinearGemm16EqualsF32OfRoundedWeights) {
  Rng r(29);
  uint64_t ctr = 0;
  for (const WeightType t : {WeightType::f16, WeightType::bf16})
    for (int64_t m : {1, 4, 5, 8, 9, 64, 130})
      for (auto [n, k] : {std::pair<int64_t, int64_t>{65, 17}, {300, 1000}, {2000, 300}}) {
        const int64_t ldw = k + 5, ldy = n + 1;
        std::vector<float> x(static_cast<size_t>(m * k)), w32(static_cast<size_t>(n * ldw)), y(static_cast<size_t>(m * ldy));
        std::vector<uint16_t> w16(w32.size());
        for (float& v : x) v = r.normal(0, ctr++);
        for (size_t i = 0; i < w16.size(); ++i) {
          const float v = r.normal(1, ctr++);
          w16[i] = t == WeightType::f16 ? half::f32_to_f16(v) : half::f32_to_bf16(v);
          w32[i] = t == WeightType::f16 ? half::f16_to_f32(w16[i]) : half::bf16_to_f32(w16[i]);
        }
        for (float& v : y) v = r.normal(2, ctr++);
        std::vector<float> want = y;
        gemm(false, true, m, n, k, 0.5f, x.data(), k, w32.data(), ldw, 1.f, want.data(), ldy);
        std::vector<float> ws(static_cast<size_t>(linear_gemm_workspace(t, n, k)));
        EXPECT_EQ(linear_gemm_workspace(WeightType::f32, n, k), 0);
        linear_gemm(m, n, k, 0.5f, x.data(), k, WeightMatrix{w16.data(), ldw, t}, 1.f, y.data(), ldy, ws.data());
        double worst = 0, scale = 0;
        for (size_t i = 0; i < y.size(); ++i) {
          worst = std::max(worst, static_cast<double>(std::fabs(y[i] - want[i])));
          scale = std::max(scale, static_cast<double>(std::fabs(want[i])));
        }
        EXPECT_LE(worst, 1e-6 * scale) << weight_type_name(t) << " m " << m << " n " << n << " k " << k;
      }
  EXPECT_THROW(parse_weight_type("half"), Error);
}

// gemm's few-rows path split over the threads: slices that end inside W, and a team larger than
// the slices, give what one thread gives.
TEST(Gemm, FewRowsOverThreadsMatchOneThread) {
  Rng r(9);
  uint64_t ctr = 0;
  for (int64_t m : {1, 4})
    for (int64_t n : {33, 1000, 1409})
      for (int64_t k : {40, 512}) {
        std::vector<float> x(static_cast<size_t>(m * k)), w(static_cast<size_t>(n * k)), y1(static_cast<size_t>(m * n)), y2;
        for (float& v : x) v = r.normal(0, ctr++);
        for (float& v : w) v = r.normal(1, ctr++);
        for (float& v : y1) v = r.normal(2, ctr++);
        y2 = y1;
        {
          const ThreadLimit one(1);
          gemm(false, true, m, n, k, 1.f, x.data(), k, w.data(), k, 1.f, y1.data(), n);
        }
        const ThreadLimit most(max_threads());
        gemm(false, true, m, n, k, 1.f, x.data(), k, w.data(), k, 1.f, y2.data(), n);
        ASSERT_EQ(y1, y2) << m << "x" << n << "x" << k;
      }
}

// Every transposition over awkward sizes (1, 3, 63, 64, 65 and a product past OpenBLAS's small-matrix
// path) with alpha and beta, against double loops; bound relative to Σ|a·b|.
TEST(Gemm, EveryTranspositionAndAwkwardSize) {
  Rng r(11);
  uint64_t ctr = 0;
  for (int64_t m : {1, 2, 3, 4, 5, 63, 64, 65, 300})
    for (int64_t n : {1, 3, 64, 65, 257})
      for (int64_t k : {1, 63, 65, 300})
        for (int t = 0; t < 4; ++t) {
          const bool ta = t & 1, tb = t & 2;
          const int64_t lda = (ta ? m : k) + 1, ldb = (tb ? k : n) + 2, ldc = n + 3;  // padded strides
          std::vector<float> a(static_cast<size_t>((ta ? k : m) * lda)), b(static_cast<size_t>((tb ? n : k) * ldb)),
              c(static_cast<size_t>(m * ldc));
          for (float& x : a) x = r.normal(0, ctr++);
          for (float& x : b) x = r.normal(1, ctr++);
          for (float& x : c) x = r.normal(2, ctr++);
          const std::vector<float> c0 = c;
          gemm(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, -2.f, c.data(), ldc);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < ldc; ++j) {
              const size_t at = static_cast<size_t>(i * ldc + j);
              if (j >= n) {  // the padding of C is never written
                ASSERT_EQ(c[at], c0[at]);
                continue;
              }
              double s = 0, mag = 0;
              for (int64_t e = 0; e < k; ++e) {
                const double x = ta ? a[static_cast<size_t>(e * lda + i)] : a[static_cast<size_t>(i * lda + e)];
                const double y = tb ? b[static_cast<size_t>(j * ldb + e)] : b[static_cast<size_t>(e * ldb + j)];
                s += x * y;
                mag += std::fabs(x * y);
              }
              ASSERT_NEAR(c[at], 0.5 * s - 2.0 * c0[at], 1e-5 * (mag + std::fabs(c0[at])) + 1e-6)
                  << m << "x" << n << "x" << k << " ta " << ta << " tb " << tb;
            }
        }
}

// linear_product (and gemm's X·Wᵀ and X·B with alpha 1, beta 0 or 1, which take the same register tiles)
// over the shapes around its panels, rows per task and depth limit, with and without a bias and a
// residual, padded strides, in every ISA copy; beta 0 overwrites a NaN; one thread and the team give
// the same bits.
TEST(Gemm, LinearProductMatchesLoopsAndThreads) {
  Rng r(13);
  uint64_t ctr = 0;
  for (const Isa isa : runnable_isas()) {
    const ScopedIsa scoped(isa);
    SCOPED_TRACE(isa_name(isa));
    for (int64_t m : {5, 7, 96, 97, 200})
      for (int64_t n : {1, 63, 64, 65, 130, 256})
        for (int64_t k : {1, 3, 64, 100, 1024, 1025}) {
          if (m * n * k > 20'000'000) continue;
          const int64_t ldx = k + 1, ldw = k + 3, ldy = n + 2;
          std::vector<float> x(static_cast<size_t>(m * ldx)), w(static_cast<size_t>(n * ldw)), b(static_cast<size_t>(n)),
              y0(static_cast<size_t>(m * ldy));
          for (float& v : x) v = r.normal(0, ctr++);
          for (float& v : w) v = r.normal(1, ctr++);
          for (float& v : b) v = r.normal(2, ctr++);
          for (float& v : y0) v = r.normal(3, ctr++);
          for (int mode = 0; mode < 4; ++mode) {
            const bool with_bias = mode & 1, acc = mode & 2;
            std::vector<float> y1 = y0, y2 = y0;
            {
              const ThreadLimit one(1);
              linear_product(m, n, k, x.data(), ldx, w.data(), ldw, with_bias ? b.data() : nullptr, acc, y1.data(), ldy);
            }
            linear_product(m, n, k, x.data(), ldx, w.data(), ldw, with_bias ? b.data() : nullptr, acc, y2.data(), ldy);
            if (k <= 1024) {  // the tiles' shapes (sgemm's split over threads may round otherwise)
              ASSERT_EQ(y1, y2) << m << "x" << n << "x" << k << " mode " << mode;
            }
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < ldy; ++j) {
                const size_t at = static_cast<size_t>(i * ldy + j);
                if (j >= n) {
                  ASSERT_EQ(y2[at], y0[at]);  // the padding of Y is never written
                  continue;
                }
                double s = (with_bias ? b[static_cast<size_t>(j)] : 0.0) + (acc ? y0[at] : 0.0), mag = std::fabs(s);
                for (int64_t e = 0; e < k; ++e) {
                  const double p = static_cast<double>(x[static_cast<size_t>(i * ldx + e)]) * w[static_cast<size_t>(j * ldw + e)];
                  s += p;
                  mag += std::fabs(p);
                }
                ASSERT_NEAR(y2[at], s, 1e-5 * mag + 1e-6) << m << "x" << n << "x" << k << " mode " << mode;
              }
          }
          // gemm with beta 0 through the same tiles: C's NaN is not read.
          std::vector<float> c(static_cast<size_t>(m * ldy), NAN), want(static_cast<size_t>(m * ldy), NAN);
          linear_product(m, n, k, x.data(), ldx, w.data(), ldw, nullptr, false, want.data(), ldy);
          gemm(false, true, m, n, k, 1.f, x.data(), ldx, w.data(), ldw, 0.f, c.data(), ldy);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) ASSERT_EQ(c[static_cast<size_t>(i * ldy + j)], want[static_cast<size_t>(i * ldy + j)]);
          // gemm(false, false): B (k, n) = Wᵀ written out with a padded stride, beta 0 (NaN in C) and
          // 1: the same bits as through W's rows (the same sums in the same order), on 1 and 2 threads.
          const int64_t ldb = n + 5;
          std::vector<float> bt(static_cast<size_t>(k * ldb), NAN);
          for (int64_t e = 0; e < k; ++e)
            for (int64_t j = 0; j < n; ++j) bt[static_cast<size_t>(e * ldb + j)] = w[static_cast<size_t>(j * ldw + e)];
          std::vector<float> c2(static_cast<size_t>(m * ldy), NAN);
          gemm(false, false, m, n, k, 1.f, x.data(), ldx, bt.data(), ldb, 0.f, c2.data(), ldy);
          std::vector<float> c3 = y0, want3 = y0;
          {
            const ThreadLimit one(1);
            gemm(false, false, m, n, k, 1.f, x.data(), ldx, bt.data(), ldb, 1.f, c3.data(), ldy);
          }
          linear_product(m, n, k, x.data(), ldx, w.data(), ldw, nullptr, true, want3.data(), ldy);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              const size_t at = static_cast<size_t>(i * ldy + j);
              if (k <= 1024) {
                ASSERT_EQ(c2[at], want[at]) << m << "x" << n << "x" << k;
                ASSERT_EQ(c3[at], want3[at]) << m << "x" << n << "x" << k;
              } else {
                ASSERT_NEAR(c2[at], want[at], 1e-3);
                ASSERT_NEAR(c3[at], want3[at], 1e-3);
              }
            }
        }
  }
  EXPECT_THROW(linear_product(2, 3, 4, nullptr, 3, nullptr, 4, nullptr, false, nullptr, 3), Error);  // ldx < k
}

// The features clattn reads from CPUID agree with the kernel's own reading (/proc/cpuinfo flags),
// and the GEMM kernel it chose is one this CPU runs and passed its known-answer check.
TEST(Cpu, FeaturesMatchProcCpuinfoAndGemmKernelFits) {
  std::ifstream in("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) {
      flags = line.substr(line.find(':') + 1) + " ";
      break;
    }
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags line";
  auto has = [&](const char* f) { return flags.find(std::string(" ") + f + " ") != std::string::npos; };
  const CpuFeatures& f = cpu_features();
  EXPECT_EQ(f.avx2 && f.os_avx, has("avx2"));
  EXPECT_EQ(f.fma, has("fma"));
  EXPECT_EQ(f.avx512f && f.os_avx512, has("avx512f"));
  EXPECT_EQ(f.avx512bw && f.os_avx512, has("avx512bw"));
  EXPECT_EQ(f.avx512vl && f.os_avx512, has("avx512vl"));
  EXPECT_EQ(f.avx512_bf16 && f.os_avx512, has("avx512_bf16"));
  EXPECT_EQ(f.amx_bf16, has("amx_bf16"));
  EXPECT_FALSE(f.vendor.empty());

  ASSERT_TRUE(f.has_avx2()) << "clattn's default build needs x86-64-v3 (AVX2 + FMA)";
  EXPECT_NE(supported_isas().find(isa_name(active_isa())), std::string::npos);
  if (!std::getenv("CLATTN_ISA")) {
    EXPECT_EQ(active_isa(), f.has_avx512() ? Isa::avx512 : Isa::avx2);
  }

  const GemmBackend& g = gemm_backend();
  EXPECT_TRUE(g.verified);
  EXPECT_FALSE(g.library.empty());
  if (!std::getenv("OPENBLAS_CORETYPE")) {  // clattn's own choice: the widest kernel family the CPU runs
    EXPECT_EQ(g.kernel, f.has_avx512() ? "SkylakeX" : (f.vendor == "AuthenticAMD" ? "Zen" : "Haswell")) << g.reason;
  }
}

TEST(Error, MessagesCarryValues) {
  try {
    check(1 + 1 == 3, "rule broken: got ", 2, " and ", 3.5);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "rule broken: got 2 and 3.5");
  }
}

}  // namespace
}  // namespace clattn

namespace clattn {
namespace {

// An exception thrown inside a parallel task reaches the caller (never std::terminate), after
// every other task ran.
TEST(Parallel, ExceptionsLeaveRegionsOnTheCallingThread) {
  std::vector<int> ran(64, 0);
  try {
    parallel_for(64, [&](int64_t i) {
      ran[static_cast<size_t>(i)] = 1;
      if (i == 17) throw Error("task 17 failed");
      if (i == 40) throw std::bad_alloc();
    });
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "task 17 failed");
  } catch (const std::bad_alloc&) {
    // Either may be first, depending on the schedule.
  }
  for (int r : ran) EXPECT_EQ(r, 1);
  EXPECT_THROW(parallel_team([](int t, int) { if (t == 0) throw Error("team"); }), Error);
}

// Small calls run on one thread (a region's fork and barriers cost more than they split, and on a
// busy machine every barrier waits for a descheduled thread); large ones on the whole team.
TEST(Parallel, ThreadsForFlopsAndThreadLimit) {
  const int saved = max_threads();
  set_threads(2);
  const double unit = serial_flops();
  ASSERT_GT(unit, 0) << "CLATTN_SERIAL_FLOPS=0 turns the rule off";
  EXPECT_EQ(threads_for_flops(0), 1);
  EXPECT_EQ(threads_for_flops(0.5 * unit), 1);
  EXPECT_EQ(threads_for_flops(1.5 * unit), 1);
  EXPECT_EQ(threads_for_flops(2.0 * unit), 2);
  EXPECT_EQ(threads_for_flops(1e6 * unit), 2);  // never above the team
  {
    const ThreadLimit one(1);
    EXPECT_EQ(max_threads(), 1);
    int team = 0;
    parallel_team([&](int, int n) { team = n; });
    EXPECT_EQ(team, 1);
    {
      const ThreadLimit more(8);  // never raises
      EXPECT_EQ(max_threads(), 1);
    }
    EXPECT_EQ(max_threads(), 1);
  }
  EXPECT_EQ(max_threads(), 2);  // restored at the end of the scope
  set_threads(saved);
}

}  // namespace
}  // namespace clattn
