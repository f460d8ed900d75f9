// The layers of nn.h against plain double-precision loops: awkward sizes (1, 3, 17, 64, 65, 255,
// 1000), strided rows framed by sentinels, in-place calls, extreme inputs and bad arguments.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "clattn/error.h"
#include "clattn/nn.h"
#include "clattn/rng.h"
#include "common/test_util.h"

namespace clattn::nn {
namespace {

constexpr float kSentinel = -12345.f;
constexpr float kInf = std::numeric_limits<float>::infinity();
const int64_t kRows[] = {1, 3, 65, 1000};
const int64_t kDims[] = {1, 3, 17, 64, 255};

inline size_t sz(int64_t n) { return static_cast<size_t>(n); }

// n entries of N(mu, sigma²) from a fixed (seed, stream).
std::vector<float> randn(int64_t n, uint64_t stream, float sigma = 1.f, float mu = 0.f) {
  Rng rng(2024);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = mu + sigma * rng.normal(stream, static_cast<uint64_t>(i));
  return v;
}

// ---------------------------------------------------------------------------------------------
// Linear

// y (rows, out) = x (rows, in) · Wᵀ + b, in double.
std::vector<double> linear_ref(const std::vector<float>& x, int64_t ldx, const std::vector<float>& w,
                               const float* b, int64_t rows, int64_t in, int64_t out) {
  std::vector<double> y(static_cast<size_t>(rows * out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = b ? b[o] : 0.0;
      for (int64_t i = 0; i < in; ++i) s += double(x[sz(r * ldx + i)]) * w[sz(o * in + i)];
      y[sz(r * out + o)] = s;
    }
  return y;
}

using clattn::testing::for_each_isa;

TEST(Linear, MatchesReferenceWithStridesAndBias) {
  for (int64_t rows : kRows)
    for (int64_t in : kDims)
      for (int64_t out : kDims) {
        SCOPED_TRACE("rows=" + std::to_string(rows) + " in=" + std::to_string(in) + " out=" + std::to_string(out));
        const int64_t ldx = in + 5, ldy = out + 3;
        const bool with_bias = (in + out + rows) % 2 == 0 || rows == 1;
        const std::vector<float> x = randn(rows * ldx, 1), w = randn(out * in, 2), b = randn(out, 3);
        const int64_t guard = 32;
        std::vector<float> ybuf(sz(rows * ldy + 2 * guard), kSentinel);
        float* y = ybuf.data() + guard;
        linear_fwd(y, ldy, x.data(), ldx, w.data(), with_bias ? b.data() : nullptr, rows, in, out);
        const std::vector<double> ref = linear_ref(x, ldx, w, with_bias ? b.data() : nullptr, rows, in, out);
        double worst = 0;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t o = 0; o < out; ++o) {
            double mag = with_bias ? std::fabs(b[sz(o)]) : 0.0;  // Σ|terms|: the scale of rounding
            for (int64_t i = 0; i < in; ++i) mag += std::fabs(double(x[sz(r * ldx + i)]) * w[sz(o * in + i)]);
            worst = std::max(worst, std::fabs(y[r * ldy + o] - ref[sz(r * out + o)]) / (mag + 1e-30));
          }
        EXPECT_LT(worst, 1e-5);
        for (size_t i = 0; i < ybuf.size(); ++i) {
          const int64_t o = int64_t(i) - guard;
          if (o < 0 || o >= rows * ldy || o % ldy >= out) {
            ASSERT_EQ(ybuf[i], kSentinel) << "write outside y at " << o;
          }
        }
      }
}

TEST(Linear, RejectsBadArguments) {
  std::vector<float> x(64), w(64), y(64);
  EXPECT_THROW(linear_fwd(y.data(), 4, x.data(), 3, w.data(), nullptr, 2, 4, 4), Error);  // ldx < in
  EXPECT_THROW(linear_fwd(y.data(), 3, x.data(), 4, w.data(), nullptr, 2, 4, 4), Error);  // ldy < out
  EXPECT_THROW(linear_fwd(y.data(), 4, x.data(), 4, w.data(), nullptr, -1, 4, 4), Error);
  EXPECT_THROW(linear_fwd(y.data(), 4, x.data(), 4, w.data(), nullptr, 2, 0, 4), Error);
  EXPECT_NO_THROW(linear_fwd(y.data(), 4, x.data(), 4, w.data(), nullptr, 0, 4, 4));
}

// ---------------------------------------------------------------------------------------------
// LayerNorm and RMSNorm

TEST(LayerNorm, MatchesReferenceAndInPlace) {
  for_each_isa([&] {
    for (int64_t rows : kRows)
      for (int64_t dim : kDims) {
        SCOPED_TRACE("rows=" + std::to_string(rows) + " dim=" + std::to_string(dim));
        const float eps = 1e-5f;
        const std::vector<float> x = randn(rows * dim, 10, 2.f, 3.f), g = randn(dim, 11), b = randn(dim, 12);
        std::vector<float> y(sz(rows * dim)), mean(sz(rows)), rstd(sz(rows));
        layernorm_fwd(y.data(), x.data(), g.data(), b.data(), rows, dim, eps, mean.data(), rstd.data());
        std::vector<float> yi = x;
        layernorm_fwd(yi.data(), yi.data(), g.data(), b.data(), rows, dim, eps);
        for (int64_t r = 0; r < rows; ++r) {
          double m = 0, v = 0;
          for (int64_t e = 0; e < dim; ++e) m += x[sz(r * dim + e)];
          m /= double(dim);
          for (int64_t e = 0; e < dim; ++e) v += (x[sz(r * dim + e)] - m) * (x[sz(r * dim + e)] - m);
          v /= double(dim);
          const double s = 1 / std::sqrt(v + eps);
          ASSERT_NEAR(mean[sz(r)], m, 1e-5 * (std::fabs(m) + 1));
          ASSERT_NEAR(rstd[sz(r)], s, 1e-5 * s);
          for (int64_t e = 0; e < dim; ++e) {
            const double ref = (x[sz(r * dim + e)] - m) * s * g[sz(e)] + b[sz(e)];
            const double tol = 1e-5 * std::max(1.0, std::fabs(ref));
            ASSERT_NEAR(y[sz(r * dim + e)], ref, tol) << "r=" << r << " e=" << e;
            ASSERT_EQ(yi[sz(r * dim + e)], y[sz(r * dim + e)]) << "in place differs, r=" << r << " e=" << e;
          }
        }
      }
  });
}

TEST(RmsNorm, MatchesReferenceAndInPlace) {
  for_each_isa([&] {
    for (int64_t rows : kRows)
      for (int64_t dim : kDims) {
        SCOPED_TRACE("rows=" + std::to_string(rows) + " dim=" + std::to_string(dim));
        const float eps = 1e-6f;
        const std::vector<float> x = randn(rows * dim, 20, 2.f, 0.5f), w = randn(dim, 21);
        std::vector<float> y(sz(rows * dim)), rstd(sz(rows));
        rmsnorm_fwd(y.data(), x.data(), w.data(), rows, dim, eps, rstd.data());
        std::vector<float> yi = x;
        rmsnorm_fwd(yi.data(), yi.data(), w.data(), rows, dim, eps);
        for (int64_t r = 0; r < rows; ++r) {
          double ms = 0;
          for (int64_t e = 0; e < dim; ++e) ms += double(x[sz(r * dim + e)]) * x[sz(r * dim + e)];
          const double s = 1 / std::sqrt(ms / double(dim) + eps);
          ASSERT_NEAR(rstd[sz(r)], s, 1e-5 * s);
          for (int64_t e = 0; e < dim; ++e) {
            const double ref = x[sz(r * dim + e)] * s * w[sz(e)];
            ASSERT_NEAR(y[sz(r * dim + e)], ref, 1e-5 * std::max(1.0, std::fabs(ref))) << "r=" << r << " e=" << e;
            ASSERT_EQ(yi[sz(r * dim + e)], y[sz(r * dim + e)]);
          }
        }
      }
  });
}

TEST(Norms, RejectBadArguments) {
  std::vector<float> x(16, 1.f), w(16, 1.f), y(16);
  EXPECT_THROW(layernorm_fwd(y.data(), x.data(), w.data(), w.data(), 2, 0, 1e-5f), Error);
  EXPECT_THROW(layernorm_fwd(y.data(), x.data(), w.data(), w.data(), 2, 4, -1.f), Error);
  EXPECT_THROW(rmsnorm_fwd(y.data(), x.data(), w.data(), -1, 4, 1e-5f), Error);
  EXPECT_THROW(rmsnorm_fwd(y.data(), x.data(), nullptr, 2, 4, 1e-5f), Error);
}

// Norms are scale invariant: rows of |x| ~ 1e20 .. 1e37, whose float Σx² overflows to inf, give
// the outputs of the same rows at scale 1 (not 0 or NaN), and input gradients scaled by 1/s.
TEST(Norms, HugeRowsAreScaleInvariant) {
  for_each_isa([&] {
    const int64_t rows = 3;
    for (const int64_t dim : {3, 17, 64}) {
      const size_t n = sz(rows * dim);
      const std::vector<float> x = randn(rows * dim, 40), w = randn(dim, 41, 0.5f, 1.f), b = randn(dim, 42),
                               dy = randn(rows * dim, 43);
      // Scale 1, eps 0: the reference (eps is negligible beside the huge rows' variance).
      std::vector<float> y1(n), m1(sz(rows)), r1(sz(rows)), dx1(n), z1(n), q1(sz(rows)), dz1(n);
      layernorm_fwd(y1.data(), x.data(), w.data(), b.data(), rows, dim, 0.f, m1.data(), r1.data());
      layernorm_bwd(dx1.data(), nullptr, nullptr, dy.data(), x.data(), w.data(), m1.data(), r1.data(), rows, dim);
      rmsnorm_fwd(z1.data(), x.data(), w.data(), rows, dim, 0.f, q1.data());
      rmsnorm_bwd(dz1.data(), nullptr, dy.data(), x.data(), w.data(), q1.data(), rows, dim);
      for (const float s : {1e20f, 1e30f, 1e37f}) {
        SCOPED_TRACE(::testing::Message() << "dim " << dim << ", scale " << s);
        std::vector<float> xs(n);
        for (size_t i = 0; i < n; ++i) xs[i] = x[i] * s;
        std::vector<float> y(n), m(sz(rows)), r(sz(rows)), dx(n), z(n), q(sz(rows)), dz(n);
        layernorm_fwd(y.data(), xs.data(), w.data(), b.data(), rows, dim, 1e-5f, m.data(), r.data());
        layernorm_bwd(dx.data(), nullptr, nullptr, dy.data(), xs.data(), w.data(), m.data(), r.data(), rows, dim);
        rmsnorm_fwd(z.data(), xs.data(), w.data(), rows, dim, 1e-6f, q.data());
        rmsnorm_bwd(dz.data(), nullptr, dy.data(), xs.data(), w.data(), q.data(), rows, dim);
        for (size_t i = 0; i < n; ++i) {
          EXPECT_NEAR(y[i], y1[i], 1e-4 * (1 + std::fabs(y1[i]))) << "layernorm at " << i;
          EXPECT_NEAR(z[i], z1[i], 1e-4 * (1 + std::fabs(z1[i]))) << "rmsnorm at " << i;
          EXPECT_NEAR(static_cast<double>(dx[i]) * s, dx1[i], 1e-3 * (1 + std::fabs(dx1[i]))) << "layernorm dx at " << i;
          EXPECT_NEAR(static_cast<double>(dz[i]) * s, dz1[i], 1e-3 * (1 + std::fabs(dz1[i]))) << "rmsnorm dx at " << i;
        }
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Elementwise: residual add, GELU, SwiGLU

// Sizes around the vector width, the 4096-float chunk and the parallel threshold.
const int64_t kLengths[] = {1, 3, 17, 64, 255, 4097, 65 * 1000 + 3};

TEST(AddInplace, MatchesReference) {
  for (int64_t n : kLengths) {
    std::vector<float> x = randn(n, 30), r = randn(n, 31);
    const std::vector<float> x0 = x;
    add_inplace(x.data(), r.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(x[sz(i)], x0[sz(i)] + r[sz(i)]) << "n=" << n << " i=" << i;
  }
}

double gelu_ref(double x, Gelu kind) {
  if (kind == Gelu::erf) return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
  return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

// Inputs: N(0, 3²) plus zeros, tiny and huge values.
std::vector<float> gelu_inputs(int64_t n, uint64_t stream) {
  std::vector<float> x = randn(n, stream, 3.f);
  const float special[] = {0.f, -0.f, 1e-20f, -1e-20f, 1e-3f, -1e-3f, 5.f, -5.f, 8.f, -8.f, 30.f, -30.f, 100.f, -100.f};
  for (size_t i = 0; i < std::size(special) && i < x.size(); ++i) x[i * 7 % x.size()] = special[i];
  return x;
}

TEST(Gelu, BothKindsMatchReferenceAndInPlace) {
  for_each_isa([&] {
    for (Gelu kind : {Gelu::erf, Gelu::tanh})
      for (int64_t n : kLengths) {
        SCOPED_TRACE(std::string(kind == Gelu::erf ? "erf" : "tanh") + " n=" + std::to_string(n));
        const std::vector<float> x = gelu_inputs(n, 40);
        std::vector<float> y(sz(n)), yi = x;
        gelu_fwd(y.data(), x.data(), n, kind);
        gelu_fwd(yi.data(), yi.data(), n, kind);
        for (int64_t i = 0; i < n; ++i) {
          const double xi = x[sz(i)], ref = gelu_ref(xi, kind);
          // Relative 2e-6, widened by GELU's own condition number (~x² for x << 0, where the result
          // is a Gaussian tail), plus 1e-9 absolute for the cancellation of the double reference.
          const double tol = 2e-6 * std::fabs(ref) * (1 + xi * xi) + 1e-9;
          ASSERT_TRUE(std::isfinite(y[sz(i)])) << "x=" << xi;
          ASSERT_NEAR(y[sz(i)], ref, tol) << "x=" << xi;
          ASSERT_EQ(yi[sz(i)], y[sz(i)]);
        }
      }
  });
}

TEST(Gelu, RelativeAccuracyOnAGrid) {
  for_each_isa([&] {
    // Dense grid over [−10, 10]: the worst relative error against the erfc form of the exact GELU
    // (no cancellation in the reference), scaled by the condition number max(1, x²).
    const int64_t n = 200001;
    std::vector<float> x(sz(n)), y(sz(n));
    for (int64_t i = 0; i < n; ++i) x[sz(i)] = -10.f + 20.f * float(i) / float(n - 1);
    gelu_fwd(y.data(), x.data(), n, Gelu::erf);
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double xi = x[sz(i)], ref = 0.5 * xi * std::erfc(-xi / std::sqrt(2.0));
      if (ref != 0) worst = std::max(worst, std::fabs(y[sz(i)] - ref) / std::fabs(ref) / std::max(1.0, xi * xi));
    }
    EXPECT_LT(worst, 1e-6);
  });
}

// The far tails give no denormal results (each one costs a microcode assist on x86): every output
// over x in [−1e4, −10] and [10, 1e4], and every gradient, is 0 or a normal float, within 1.5e−34
// (absolute) of the exact value where that is smaller.
TEST(Gelu, TailsGiveNoDenormals) {
  for_each_isa([&] {
    std::vector<float> x;
    for (float v = 10.f; v < 1e4f; v *= 1.003f) {
      x.push_back(v);
      x.push_back(-v);
    }
    const int64_t n = static_cast<int64_t>(x.size());
    const std::vector<float> dy(sz(n), 1.f);
    for (Gelu kind : {Gelu::erf, Gelu::tanh}) {
      std::vector<float> y(sz(n)), dx(sz(n));
      gelu_fwd(y.data(), x.data(), n, kind);
      gelu_bwd(dx.data(), dy.data(), x.data(), n, kind);
      for (int64_t i = 0; i < n; ++i) {
        const double xi = x[sz(i)], dref = xi > 0 ? 1.0 : 0.0;
        const double ref = kind == Gelu::erf ? 0.5 * xi * std::erfc(-xi / std::sqrt(2.0)) : gelu_ref(xi, kind);
        ASSERT_NE(std::fpclassify(y[sz(i)]), FP_SUBNORMAL) << "x=" << xi;
        ASSERT_NE(std::fpclassify(dx[sz(i)]), FP_SUBNORMAL) << "x=" << xi;
        ASSERT_NEAR(y[sz(i)], ref, 1.5e-34 + 2e-6 * std::fabs(ref) * (1 + xi * xi)) << "x=" << xi;
        ASSERT_NEAR(dx[sz(i)], dref, 1e-6) << "x=" << xi;  // the exact gradient is within 1e-20 of dref
      }
    }
  });
}

TEST(SwiGlu, MatchesReferenceAndExtremeGates) {
  for_each_isa([&] {
    for (int64_t n : kLengths) {
      SCOPED_TRACE("n=" + std::to_string(n));
      std::vector<float> gate = randn(n, 50, 3.f), up = randn(n, 51);
      const float special[] = {0.f, 100.f, -100.f, 88.f, -88.f, 89.f, -89.f, 1e4f, -1e4f};
      for (size_t i = 0; i < std::size(special) && i < gate.size(); ++i) gate[i * 5 % gate.size()] = special[i];
      std::vector<float> y(sz(n)), yi = gate;
      swiglu_fwd(y.data(), gate.data(), up.data(), n);
      swiglu_fwd(yi.data(), yi.data(), up.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const double g = gate[sz(i)], u = up[sz(i)], ref = g / (1 + std::exp(-g)) * u;
        ASSERT_TRUE(std::isfinite(y[sz(i)])) << "gate=" << g;
        ASSERT_NEAR(y[sz(i)], ref, 2e-6 * std::fabs(ref) * (1 + std::fabs(g)) + 1e-30) << "gate=" << g;
        ASSERT_EQ(yi[sz(i)], y[sz(i)]);
      }
    }
    const float gate[] = {100.f, -100.f, 0.f}, up[] = {2.f, 2.f, 2.f};
    float y[3];
    swiglu_fwd(y, gate, up, 3);
    EXPECT_EQ(y[0], 200.f);
    EXPECT_EQ(y[1], 0.f);
    EXPECT_EQ(y[2], 0.f);
  });
}

// The fused-rows forms equal the flat functions row by row, bit for bit, with odd widths and
// padded row strides; the backward's dgate may overwrite its dy in place.
TEST(SwiGlu, FusedRowsEqualTheFlatFunctions) {
  for_each_isa([&] {
    for (int64_t n : {1, 17, 64, 172}) {
      SCOPED_TRACE("n=" + std::to_string(n));
      const int64_t rows = 37, ldgu = 2 * n + 3, ldy = n + 5;
      const std::vector<float> gu = randn(rows * ldgu, 60, 2.f), dyv = randn(rows * ldy, 61);
      std::vector<float> y(sz(rows * ldy), 0.f), want(sz(n));
      swiglu_rows_fwd(y.data(), ldy, gu.data(), ldgu, rows, n);
      std::vector<float> dgu(sz(rows * ldgu), 0.f);
      for (int64_t r = 0; r < rows; ++r) std::copy(dyv.begin() + r * ldy, dyv.begin() + r * ldy + n, dgu.begin() + r * ldgu);
      swiglu_rows_bwd(dgu.data(), ldgu, dgu.data(), ldgu, gu.data(), ldgu, rows, n);
      for (int64_t r = 0; r < rows; ++r) {
        const float* g = gu.data() + r * ldgu;
        swiglu_fwd(want.data(), g, g + n, n);
        ASSERT_TRUE(std::equal(want.begin(), want.end(), y.begin() + r * ldy)) << "row " << r;
        std::vector<float> dg(sz(n)), du(sz(n));
        swiglu_bwd(dg.data(), du.data(), dyv.data() + r * ldy, g, g + n, n);
        ASSERT_TRUE(std::equal(dg.begin(), dg.end(), dgu.begin() + r * ldgu)) << "row " << r;
        ASSERT_TRUE(std::equal(du.begin(), du.end(), dgu.begin() + r * ldgu + n)) << "row " << r;
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// RoPE

struct RopeCase {
  int64_t rows, heads, head_dim, head_stride, ld;
  float theta;
};

// x (rows, heads, head_dim) at strides (ld, head_stride), framed by sentinels in the gaps.
std::vector<float> rope_input(const RopeCase& c, uint64_t stream) {
  std::vector<float> x(sz(c.rows * c.ld), kSentinel);
  const std::vector<float> v = randn(c.rows * c.heads * c.head_dim, stream);
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t e = 0; e < c.head_dim; ++e)
        x[sz(r * c.ld + h * c.head_stride + e)] = v[sz((r * c.heads + h) * c.head_dim + e)];
  return x;
}

TEST(Rope, MatchesReferenceUpToPosition60000) {
  const RopeCase cases[] = {{1, 1, 2, 2, 2, 10000.f},        {3, 3, 6, 9, 30, 10000.f},
                            {65, 2, 34, 40, 85, 10000.f},    {65, 4, 64, 64, 256, 500000.f},
                            {17, 2, 128, 130, 270, 10000.f}, {5, 2, 256, 256, 512, 10000.f},
                            {7, 3, 300, 301, 905, 1e6f},     {1000, 2, 64, 64, 131, 10000.f}};
  for (const RopeCase& c : cases) {
    SCOPED_TRACE("rows=" + std::to_string(c.rows) + " heads=" + std::to_string(c.heads) +
                 " head_dim=" + std::to_string(c.head_dim));
    std::vector<int32_t> pos(sz(c.rows));
    Rng rng(7);
    for (int64_t r = 0; r < c.rows; ++r) pos[sz(r)] = int32_t(rng.below(60001, 60, uint64_t(r)));
    pos[0] = 60000;
    if (c.rows > 1) pos[1] = 0;
    const std::vector<float> x0 = rope_input(c, 61);
    std::vector<float> x = x0;
    rope_fwd(x.data(), c.ld, c.head_stride, pos.data(), c.rows, c.heads, c.head_dim, c.theta);
    const int64_t h = c.head_dim / 2;
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t hd = 0; hd < c.heads; ++hd) {
        const size_t o = sz(r * c.ld + hd * c.head_stride);
        for (int64_t i = 0; i < h; ++i) {
          const double a = x0[o + sz(i)], b = x0[o + sz(i + h)];
          const double t = pos[sz(r)] * std::pow(double(c.theta), -2.0 * double(i) / double(c.head_dim));
          const double ra = a * std::cos(t) - b * std::sin(t), rb = b * std::cos(t) + a * std::sin(t);
          const double tol = 1e-6 * (std::fabs(a) + std::fabs(b)) + 1e-7;
          ASSERT_NEAR(x[o + sz(i)], ra, tol) << "r=" << r << " pos=" << pos[sz(r)] << " i=" << i;
          ASSERT_NEAR(x[o + sz(i + h)], rb, tol) << "r=" << r << " pos=" << pos[sz(r)] << " i=" << i;
          // A rotation: each pair keeps its norm.
          const double n0 = a * a + b * b, n1 = double(x[o + sz(i)]) * x[o + sz(i)] +
                                                    double(x[o + sz(i + h)]) * x[o + sz(i + h)];
          ASSERT_NEAR(n1, n0, 1e-6 * n0 + 1e-12);
        }
      }
    for (size_t i = 0; i < x.size(); ++i)
      if (x0[i] == kSentinel) {
        ASSERT_EQ(x[i], kSentinel) << "write outside the heads at " << i;
      }
  }
}

TEST(Rope, PositionZeroIsIdentity) {
  const RopeCase c{9, 3, 64, 70, 220, 10000.f};
  const std::vector<int32_t> pos(sz(c.rows), 0);
  const std::vector<float> x0 = rope_input(c, 62);
  std::vector<float> x = x0;
  rope_fwd(x.data(), c.ld, c.head_stride, pos.data(), c.rows, c.heads, c.head_dim, c.theta);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], x0[i]) << i;
}

TEST(Rope, RejectsOddHeadDimAndShortStrides) {
  std::vector<float> x(64);
  const int32_t pos[2] = {0, 1};
  EXPECT_THROW(rope_fwd(x.data(), 16, 7, pos, 2, 2, 7, 10000.f), Error);
  EXPECT_THROW(rope_fwd(x.data(), 16, 0, pos, 2, 1, 0, 10000.f), Error);
  EXPECT_THROW(rope_fwd(x.data(), 16, 6, pos, 2, 2, 8, 10000.f), Error);   // head_stride < head_dim
  EXPECT_THROW(rope_fwd(x.data(), 15, 8, pos, 2, 2, 8, 10000.f), Error);   // ld < 2 heads
  EXPECT_THROW(rope_fwd(x.data(), 16, 8, pos, 2, 2, 8, 0.f), Error);
  EXPECT_NO_THROW(rope_fwd(x.data(), 16, 8, pos, 2, 2, 8, 10000.f));
}

// ---------------------------------------------------------------------------------------------
// Embedding

TEST(Embedding, CopiesRows) {
  for (int64_t n : kRows)
    for (int64_t dim : kDims) {
      const int64_t vocab = 37;
      const std::vector<float> table = randn(vocab * dim, 70);
      std::vector<int32_t> ids(sz(n));
      Rng rng(8);
      for (int64_t i = 0; i < n; ++i) ids[sz(i)] = int32_t(rng.below(uint64_t(vocab), 71, uint64_t(i)));
      ids[0] = int32_t(vocab - 1);
      std::vector<float> y(sz(n * dim), kSentinel);
      embedding_fwd(y.data(), ids.data(), table.data(), n, dim, vocab);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t e = 0; e < dim; ++e)
          ASSERT_EQ(y[sz(i * dim + e)], table[sz(ids[sz(i)] * dim + e)]) << "n=" << n << " i=" << i;
    }
}

TEST(Embedding, RejectsOutOfRangeIdsNamingThem) {
  const int64_t vocab = 10, dim = 4;
  const std::vector<float> table = randn(vocab * dim, 72);
  for (int32_t bad : {-1, int32_t(vocab)}) {
    const int32_t ids[4] = {0, 9, bad, 3};
    std::vector<float> y(16, kSentinel);
    try {
      embedding_fwd(y.data(), ids, table.data(), 4, dim, vocab);
      FAIL() << "id " << bad << " accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("ids[2] = " + std::to_string(bad)), std::string::npos) << msg;
      EXPECT_NE(msg.find("vocab = 10"), std::string::npos) << msg;
    }
    for (float v : y) EXPECT_EQ(v, kSentinel);  // checked before anything is written
  }
}

// ---------------------------------------------------------------------------------------------
// Softmax

TEST(Softmax, MatchesReferenceAndSumsToOne) {
  for (int64_t rows : kRows)
    for (int64_t cols : kDims) {
      SCOPED_TRACE("rows=" + std::to_string(rows) + " cols=" + std::to_string(cols));
      std::vector<float> x = randn(rows * cols, 80, 5.f, 100.f);
      const std::vector<float> x0 = x;
      softmax_rows(x.data(), rows, cols);
      for (int64_t r = 0; r < rows; ++r) {
        const float* in = x0.data() + r * cols;
        double m = -1e300, s = 0, sum = 0;
        for (int64_t c = 0; c < cols; ++c) m = std::max(m, double(in[c]));
        for (int64_t c = 0; c < cols; ++c) s += std::exp(in[c] - m);
        for (int64_t c = 0; c < cols; ++c) {
          const double ref = std::exp(in[c] - m) / s;
          ASSERT_NEAR(x[sz(r * cols + c)], ref, 1e-5 * ref + 1e-30) << "r=" << r << " c=" << c;
          sum += x[sz(r * cols + c)];
        }
        ASSERT_NEAR(sum, 1.0, 1e-5);
      }
    }
}

TEST(Softmax, InfEntriesEqualRowsAndMaskedRows) {
  const int64_t cols = 19;
  std::vector<float> x(sz(3 * cols));
  for (int64_t c = 0; c < cols; ++c) {
    x[sz(c)] = c % 3 == 0 ? -kInf : float(c);  // row 0: some −inf
    x[sz(cols + c)] = 7.5f;                    // row 1: all equal
    x[sz(2 * cols + c)] = -kInf;               // row 2: fully masked
  }
  x[sz(cols - 1)] = -kInf;  // the vector tail too
  softmax_rows(x.data(), 3, cols);
  double sum0 = 0;
  for (int64_t c = 0; c < cols; ++c) {
    if (c % 3 == 0 || c == cols - 1) {
      EXPECT_EQ(x[sz(c)], 0.f) << c;
    }
    EXPECT_TRUE(std::isfinite(x[sz(c)]));
    sum0 += x[sz(c)];
    EXPECT_NEAR(x[sz(cols + c)], 1.0 / cols, 1e-7);
    EXPECT_EQ(x[sz(2 * cols + c)], 0.f);
  }
  EXPECT_NEAR(sum0, 1.0, 1e-6);
  EXPECT_NEAR(x[sz(cols - 2)], std::exp(0.0) / (1 + std::exp(-1.0) + std::exp(-3.0) + std::exp(-4.0) + std::exp(-6.0) +
                                                     std::exp(-7.0) + std::exp(-9.0) + std::exp(-10.0) + std::exp(-12.0) +
                                                     std::exp(-13.0) + std::exp(-15.0) + std::exp(-16.0)),
              1e-6);
}

}  // namespace
}  // namespace clattn::nn
