// The backward passes of nn.h against central finite differences of double-precision reference
// forwards written here: every gradient of every layer, on awkward sizes (rows 1, 3, 63, 64, 65,
// 1000; dims not a multiple of 16; in != out), with the contract's accumulate / write semantics,
// aliasing, nullptr skips, strided rows framed by sentinels, and the same bits for 1 and 2 threads
// where nn.h promises it. Then cross-entropy (ignored rows, bad targets, non-finite logits) and
// dropout (the documented mask, reproducibility, mean preservation).
//
// Tolerances. Each check is normwise over the probed entries: max |float − fd| / max |fd| <= tol.
// The finite differences use h = 1e-4·(1 + |v|) on double forwards (truncation ~h²·|f'''| ~ 1e-8,
// rounding ~1e-16/h ~ 1e-12), so the measured error is the float backward's own rounding: sums of
// up to ~1000 float products (√1000 · 6e-8 ~ 2e-6 relative) for the linear layer, the norms'
// two row means and the polynomial exp/erfc (~3e-7 relative). tol = 1e-4 leaves ~50x slack over
// that and still catches any wrong term (a missing term or wrong factor is an O(1) error).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "clattn/error.h"
#include "clattn/nn.h"
#include "clattn/threads.h"
#include "clattn/rng.h"
#include "common/test_util.h"

namespace clattn::nn {
namespace {

constexpr float kSentinel = -12345.f;
constexpr double kTol = 1e-4;
const int64_t kRowsSet[] = {1, 3, 63, 64, 65, 1000};

inline size_t sz(int64_t n) { return static_cast<size_t>(n); }

std::vector<float> randn(int64_t n, uint64_t stream, float sigma = 1.f, float mu = 0.f) {
  Rng rng(777);
  std::vector<float> v(sz(n));
  for (int64_t i = 0; i < n; ++i) v[sz(i)] = mu + sigma * rng.normal(stream, static_cast<uint64_t>(i));
  return v;
}

std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// Up to k indices of [0, n): the first, the last and a fixed pseudo-random sample between.
std::vector<int64_t> probes(int64_t n, int k, uint64_t stream) {
  std::vector<int64_t> p;
  if (n <= k) {
    for (int64_t i = 0; i < n; ++i) p.push_back(i);
    return p;
  }
  Rng rng(99);
  p.push_back(0);
  p.push_back(n - 1);
  for (int i = 2; i < k; ++i) p.push_back(static_cast<int64_t>(rng.below(static_cast<uint64_t>(n), stream, static_cast<uint64_t>(i))));
  return p;
}

// d loss / d v[j] by central differences (v restored afterwards).
double central_diff(std::vector<double>& v, int64_t j, const std::function<double()>& loss) {
  const double x0 = v[sz(j)], h = 1e-4 * (1.0 + std::fabs(x0));
  v[sz(j)] = x0 + h;
  const double lp = loss();
  v[sz(j)] = x0 - h;
  const double lm = loss();
  v[sz(j)] = x0;
  return (lp - lm) / (2 * h);
}

// Compares got(j) (the float backward's gradient of entry j, minus any value it was accumulated
// onto) with the finite difference over the probed entries: max |got − fd| / max(max |fd|, floor).
// `floor` is the size of terms that cancel in a gradient that is itself near 0 (RMSNorm of one
// element: s·g·(1 − xhat²) with xhat² = 1 − eps·s²), whose float rounding is relative to them.
double fd_error(std::vector<double>& v, const std::vector<int64_t>& at, const std::function<double()>& loss,
                const std::function<double(int64_t)>& got, double floor = 0) {
  double worst = 0, scale = floor;
  for (int64_t j : at) {
    const double fd = central_diff(v, j, loss);
    worst = std::max(worst, std::fabs(got(j) - fd));
    scale = std::max(scale, std::fabs(fd));
  }
  return scale == 0 ? worst : worst / scale;
}

// Runs f with 1 and then 2 OpenMP threads (restoring the count) and returns both results.
template <class F>
auto with_1_and_2_threads(F f) {
  const int saved = max_threads();
  set_threads(1);
  auto a = f();
  set_threads(2);
  auto b = f();
  set_threads(saved);
  return std::make_pair(a, b);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

// ---------------------------------------------------------------------------------------------
// Linear

using clattn::testing::for_each_isa;

TEST(LinearBwd, FiniteDifferencesStridesAccumulateAndSentinels) {
  const int64_t shapes[][2] = {{17, 33}, {33, 17}, {1, 5}, {64, 64}};
  for (int64_t rows : kRowsSet)
    for (const auto& io : shapes) {
      const int64_t in = io[0], out = io[1];
      if (rows == 1000 && in == 64) continue;  // the double finite differences would take seconds
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE("rows=" + std::to_string(rows) + " in=" + std::to_string(in) + " out=" + std::to_string(out) +
                     " accumulate=" + std::to_string(accumulate));
        const int64_t ldx = in + 2, lddx = in + 3, lddy = out + 5, guard = 16;
        const std::vector<float> xf = randn(rows * ldx, 1), wf = randn(out * in, 2, 0.5f), bf = randn(out, 3);
        const std::vector<float> dyf = randn(rows * lddy, 4);
        // dx framed by sentinels; its starting values (7 + e) must be overwritten or added to.
        std::vector<float> dxbuf(sz(rows * lddx + 2 * guard), kSentinel);
        float* dx = dxbuf.data() + guard;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < in; ++i) dx[r * lddx + i] = 7.f + float(i % 5);
        const std::vector<float> dx0(dxbuf), dw0 = randn(out * in, 5), db0 = randn(out, 6);
        std::vector<float> dw = dw0, db = db0;
        linear_bwd(dx, lddx, dw.data(), db.data(), dyf.data(), lddy, xf.data(), ldx, wf.data(), rows, in, out,
                   accumulate);
        for (size_t i = 0; i < dxbuf.size(); ++i) {
          const int64_t o = int64_t(i) - guard;
          if (o < 0 || o >= rows * lddx || o % lddx >= in) {
            ASSERT_EQ(dxbuf[i], kSentinel) << "write outside dx at " << o;
          }
        }
        // L = Σ dy · (x Wᵀ + b) over the valid entries, in double.
        std::vector<double> x = to_double(xf), w = to_double(wf), b = to_double(bf);
        const auto loss = [&] {
          double l = 0;
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t o = 0; o < out; ++o) {
              double y = b[sz(o)];
              for (int64_t i = 0; i < in; ++i) y += x[sz(r * ldx + i)] * w[sz(o * in + i)];
              l += dyf[sz(r * lddy + o)] * y;
            }
          return l;
        };
        const int k = rows * in * out > 200000 ? 10 : 24;  // each loss costs rows·in·out: keep ASan runs short
        std::vector<int64_t> xs;  // probes of x inside rows
        for (int64_t j : probes(rows * in, k, 1)) xs.push_back(j / in * ldx + j % in);
        EXPECT_LT(fd_error(x, xs, loss, [&](int64_t j) {
                    const int64_t r = j / ldx, i = j % ldx;
                    return double(dx[r * lddx + i]) - (accumulate ? dx0[sz(guard + r * lddx + i)] : 0.0);
                  }), kTol);
        EXPECT_LT(fd_error(w, probes(out * in, k, 2), loss, [&](int64_t j) { return double(dw[sz(j)]) - dw0[sz(j)]; }),
                  kTol);
        EXPECT_LT(fd_error(b, probes(out, k, 3), loss, [&](int64_t j) { return double(db[sz(j)]) - db0[sz(j)]; }),
                  kTol);
      }
    }
}

TEST(LinearBwd, NullptrSkipsAndZeroRows) {
  const int64_t rows = 5, in = 7, out = 9;
  const std::vector<float> x = randn(rows * in, 1), w = randn(out * in, 2), dy = randn(rows * out, 3);
  std::vector<float> dx(sz(rows * in)), dw(sz(out * in)), db(sz(out));
  linear_bwd(dx.data(), in, dw.data(), db.data(), dy.data(), out, x.data(), in, w.data(), rows, in, out);
  // Each gradient alone equals the same gradient computed with the others.
  std::vector<float> dx1(sz(rows * in), 1.f), dw1(sz(out * in)), db1(sz(out));
  linear_bwd(dx1.data(), in, nullptr, nullptr, dy.data(), out, nullptr, in, w.data(), rows, in, out);
  linear_bwd(nullptr, 0, dw1.data(), nullptr, dy.data(), out, x.data(), in, nullptr, rows, in, out);
  linear_bwd(nullptr, 0, nullptr, db1.data(), dy.data(), out, nullptr, 0, nullptr, rows, in, out);
  EXPECT_TRUE(same_bits(dx, dx1));
  EXPECT_TRUE(same_bits(dw, dw1));
  EXPECT_TRUE(same_bits(db, db1));
  // rows = 0 leaves the parameter gradients alone.
  linear_bwd(dx.data(), in, dw.data(), db.data(), nullptr, out, nullptr, in, nullptr, 0, in, out);
  EXPECT_TRUE(same_bits(dw, dw1));
  EXPECT_THROW(linear_bwd(dx.data(), in - 1, nullptr, nullptr, dy.data(), out, x.data(), in, w.data(), rows, in, out),
               Error);
  EXPECT_THROW(linear_bwd(nullptr, 0, dw.data(), nullptr, dy.data(), out, nullptr, in, w.data(), rows, in, out), Error);
  EXPECT_THROW(linear_bwd(dx.data(), in, nullptr, nullptr, nullptr, out, x.data(), in, w.data(), rows, in, out), Error);
}

TEST(LinearBwd, BiasGradientSameBitsOnOneAndTwoThreads) {
  const int64_t rows = 3001, in = 8, out = 77;  // rows · out above the parallel threshold
  const std::vector<float> dy = randn(rows * out, 7, 3.f);
  const auto [a, b] = with_1_and_2_threads([&] {
    std::vector<float> db = randn(out, 8);
    linear_bwd(nullptr, 0, nullptr, db.data(), dy.data(), out, nullptr, in, nullptr, rows, in, out);
    return db;
  });
  EXPECT_TRUE(same_bits(a, b));
}

// ---------------------------------------------------------------------------------------------
// Embedding

TEST(EmbeddingBwd, ScatterAddMatchesFiniteDifferencesAndIsDeterministic) {
  const int64_t dims[] = {1, 17, 64, 130};
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{65}, int64_t{1000}})
    for (int64_t dim : dims) {
      SCOPED_TRACE("n=" + std::to_string(n) + " dim=" + std::to_string(dim));
      const int64_t vocab = 7;  // many repeated ids: the scatter must add, not overwrite
      std::vector<int32_t> ids(sz(n));
      for (int64_t i = 0; i < n; ++i) ids[sz(i)] = static_cast<int32_t>((i * 5 + i / 3) % vocab);
      const std::vector<float> tf = randn(vocab * dim, 1), dy = randn(n * dim, 2);
      const std::vector<float> d0 = randn(vocab * dim, 3);
      std::vector<float> dt = d0;
      embedding_bwd(dt.data(), ids.data(), dy.data(), n, dim, vocab);
      std::vector<double> table = to_double(tf);
      const auto loss = [&] {
        double l = 0;
        for (int64_t i = 0; i < n; ++i)
          for (int64_t e = 0; e < dim; ++e) l += dy[sz(i * dim + e)] * table[sz(ids[sz(i)] * dim + e)];
        return l;
      };
      EXPECT_LT(fd_error(table, probes(vocab * dim, 40, 4), loss,
                         [&](int64_t j) { return double(dt[sz(j)]) - d0[sz(j)]; }),
                kTol);
      const auto [a, b] = with_1_and_2_threads([&] {
        std::vector<float> t = d0;
        embedding_bwd(t.data(), ids.data(), dy.data(), n, dim, vocab);
        return t;
      });
      EXPECT_TRUE(same_bits(a, b));
      EXPECT_TRUE(same_bits(a, dt));
    }
}

TEST(EmbeddingBwd, RejectsOutOfRangeIdsAndSkipsNull) {
  const std::vector<int32_t> ids = {0, 2, 5};
  const std::vector<float> dy(9, 1.f);
  std::vector<float> dt(15, 0.f);
  try {
    embedding_bwd(dt.data(), ids.data(), dy.data(), 3, 3, 5);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ids[2] = 5"), std::string::npos) << e.what();
  }
  EXPECT_THROW(embedding_bwd(nullptr, ids.data(), dy.data(), 3, 3, 5), Error);  // ids still checked
  EXPECT_NO_THROW(embedding_bwd(nullptr, ids.data(), dy.data(), 3, 3, 6));
  for (float v : dt) EXPECT_EQ(v, 0.f);
}

// ---------------------------------------------------------------------------------------------
// LayerNorm and RMSNorm

// L = Σ dy · norm(x) in double (centre = LayerNorm with beta, else RMSNorm).
double norm_loss(bool centre, const std::vector<double>& x, const std::vector<double>& g, const std::vector<double>& b,
                 const std::vector<float>& dy, int64_t rows, int64_t dim, double eps) {
  double l = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x.data() + r * dim;
    double m = 0, v = 0;
    if (centre) {
      for (int64_t e = 0; e < dim; ++e) m += xr[e];
      m /= double(dim);
    }
    for (int64_t e = 0; e < dim; ++e) v += (xr[e] - m) * (xr[e] - m);
    const double s = 1 / std::sqrt(v / double(dim) + eps);
    for (int64_t e = 0; e < dim; ++e)
      l += dy[sz(r * dim + e)] * ((xr[e] - m) * s * g[sz(e)] + (centre ? b[sz(e)] : 0.0));
  }
  return l;
}

TEST(NormBwd, FiniteDifferencesAccumulateAliasAndThreads) {
  for_each_isa([&] {
    const int64_t dims[] = {1, 3, 17, 64, 255};
    for (bool centre : {true, false})
      for (int64_t rows : kRowsSet)
        for (int64_t dim : dims) {
          SCOPED_TRACE(std::string(centre ? "layernorm" : "rmsnorm") + " rows=" + std::to_string(rows) +
                       " dim=" + std::to_string(dim));
          const float eps = 1e-5f;
          const std::vector<float> xf = randn(rows * dim, 10, 2.f, 0.7f), gf = randn(dim, 11), bf = randn(dim, 12);
          const std::vector<float> dy = randn(rows * dim, 13);
          std::vector<float> y(sz(rows * dim)), mean(sz(rows)), rstd(sz(rows));
          if (centre) layernorm_fwd(y.data(), xf.data(), gf.data(), bf.data(), rows, dim, eps, mean.data(), rstd.data());
          else rmsnorm_fwd(y.data(), xf.data(), gf.data(), rows, dim, eps, rstd.data());
          const std::vector<float> dx0 = randn(rows * dim, 14), dg0 = randn(dim, 15), db0 = randn(dim, 16);
          const auto run = [&](std::vector<float>& dx, std::vector<float>& dg, std::vector<float>& db, const float* dyp,
                               bool acc) {
            if (centre)
              layernorm_bwd(dx.data(), dg.data(), db.data(), dyp, xf.data(), gf.data(), mean.data(), rstd.data(), rows,
                            dim, acc);
            else rmsnorm_bwd(dx.data(), dg.data(), dyp, xf.data(), gf.data(), rstd.data(), rows, dim, acc);
          };
          std::vector<float> dx = dx0, dg = dg0, db = db0;
          run(dx, dg, db, dy.data(), false);
          std::vector<double> x = to_double(xf), g = to_double(gf), b = to_double(bf);
          const auto loss = [&] { return norm_loss(centre, x, g, b, dy, rows, dim, eps); };
          // The saved statistics are float: their rounding (~1e-7 relative) is part of the error.
          const std::vector<int64_t> xs = probes(rows * dim, 24, 5);
          double terms = 0;  // max |dy ∘ gamma| · rstd over the probed entries: what dx's formula cancels
          for (int64_t j : xs) terms = std::max(terms, std::fabs(double(dy[sz(j)]) * gf[sz(j % dim)]) * rstd[sz(j / dim)]);
          EXPECT_LT(fd_error(x, xs, loss, [&](int64_t j) { return double(dx[sz(j)]); }, terms), kTol);
          EXPECT_LT(fd_error(g, probes(dim, 24, 6), loss, [&](int64_t j) { return double(dg[sz(j)]) - dg0[sz(j)]; }),
                    kTol);
          if (centre) {
            EXPECT_LT(fd_error(b, probes(dim, 24, 7), loss, [&](int64_t j) { return double(db[sz(j)]) - db0[sz(j)]; }),
                      kTol);
          } else {
            EXPECT_TRUE(same_bits(db, db0));  // rmsnorm has no bias
          }
          // accumulate adds the same dx onto the old values.
          std::vector<float> dxa = dx0, dga = dg0, dba = db0;
          run(dxa, dga, dba, dy.data(), true);
          for (int64_t i = 0; i < rows * dim; ++i)
            ASSERT_NEAR(dxa[sz(i)], dx0[sz(i)] + dx[sz(i)], 1e-5 * (std::fabs(dx0[sz(i)]) + std::fabs(dx[sz(i)]) + 1e-3));
          // dx may alias dy: the same bits as separate buffers.
          std::vector<float> al = dy, dgl = dg0, dbl = db0;
          run(al, dgl, dbl, al.data(), false);
          EXPECT_TRUE(same_bits(al, dx));
          EXPECT_TRUE(same_bits(dgl, dg));
          // Parameter gradients (and dx) have the same bits on 1 and 2 threads.
          const auto [t1, t2] = with_1_and_2_threads([&] {
            std::vector<float> a = dx0, c = dg0, d = db0;
            run(a, c, d, dy.data(), false);
            a.insert(a.end(), c.begin(), c.end());
            a.insert(a.end(), d.begin(), d.end());
            return a;
          });
          EXPECT_TRUE(same_bits(t1, t2));
        }
  });
}

TEST(NormBwd, NullptrSkipsAndBadArguments) {
  const int64_t rows = 4, dim = 20;
  const std::vector<float> x = randn(rows * dim, 1), g = randn(dim, 2), b = randn(dim, 3), dy = randn(rows * dim, 4);
  std::vector<float> y(sz(rows * dim)), mean(sz(rows)), rstd(sz(rows));
  layernorm_fwd(y.data(), x.data(), g.data(), b.data(), rows, dim, 1e-5f, mean.data(), rstd.data());
  std::vector<float> dx(sz(rows * dim)), dg(sz(dim)), db(sz(dim));
  layernorm_bwd(dx.data(), dg.data(), db.data(), dy.data(), x.data(), g.data(), mean.data(), rstd.data(), rows, dim);
  std::vector<float> dx1(sz(rows * dim)), dg1(sz(dim)), db1(sz(dim));
  layernorm_bwd(dx1.data(), nullptr, nullptr, dy.data(), x.data(), g.data(), mean.data(), rstd.data(), rows, dim);
  layernorm_bwd(nullptr, dg1.data(), nullptr, dy.data(), x.data(), nullptr, mean.data(), rstd.data(), rows, dim);
  layernorm_bwd(nullptr, nullptr, db1.data(), dy.data(), x.data(), nullptr, mean.data(), rstd.data(), rows, dim);
  EXPECT_TRUE(same_bits(dx, dx1));
  EXPECT_TRUE(same_bits(dg, dg1));
  EXPECT_TRUE(same_bits(db, db1));
  std::vector<float> al = dy;
  EXPECT_THROW(layernorm_bwd(al.data(), nullptr, nullptr, al.data(), x.data(), g.data(), mean.data(), rstd.data(),
                             rows, dim, true), Error);  // alias only when writing
  EXPECT_THROW(rmsnorm_bwd(al.data(), nullptr, al.data(), x.data(), g.data(), rstd.data(), rows, dim, true), Error);
  EXPECT_THROW(layernorm_bwd(dx.data(), nullptr, nullptr, dy.data(), x.data(), g.data(), nullptr, rstd.data(), rows,
                             dim), Error);
  EXPECT_THROW(rmsnorm_bwd(dx.data(), nullptr, dy.data(), x.data(), nullptr, rstd.data(), rows, dim), Error);
  EXPECT_THROW(rmsnorm_bwd(dx.data(), nullptr, dy.data(), x.data(), g.data(), rstd.data(), rows, 0), Error);
}

// ---------------------------------------------------------------------------------------------
// GELU and SwiGLU (elementwise: the finite difference of the scalar function per element)

double gelu_ref(double x, Gelu kind) {
  if (kind == Gelu::erf) return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

double scalar_diff(double x, const std::function<double(double)>& f) {
  const double h = 1e-5 * (1 + std::fabs(x));
  return (f(x + h) - f(x - h)) / (2 * h);
}

TEST(GeluBwd, FiniteDifferencesAliasExtremesAndThreads) {
  for_each_isa([&] {
    for (Gelu kind : {Gelu::erf, Gelu::tanh})
      for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{17}, int64_t{1000}, int64_t{70001}}) {
        SCOPED_TRACE(std::string(kind == Gelu::erf ? "erf" : "tanh") + " n=" + std::to_string(n));
        std::vector<float> x = randn(n, 20, 3.f), dy = randn(n, 21);
        std::vector<float> dx(sz(n), kSentinel);
        gelu_bwd(dx.data(), dy.data(), x.data(), n, kind);
        // gelu' is bounded by ~1.13 and evaluated in float from φ, Φ (~3e-7 relative): 1e-5 absolute.
        for (int64_t i = 0; i < n; ++i) {
          const double ref = dy[sz(i)] * scalar_diff(x[sz(i)], [&](double v) { return gelu_ref(v, kind); });
          ASSERT_NEAR(dx[sz(i)], ref, 1e-5 * (std::fabs(dy[sz(i)]) + 1e-3)) << "x=" << x[sz(i)];
        }
        std::vector<float> al = dy;
        gelu_bwd(al.data(), al.data(), x.data(), n, kind);
        EXPECT_TRUE(same_bits(al, dx));
        const auto [a, b] = with_1_and_2_threads([&] {
          std::vector<float> d(sz(n));
          gelu_bwd(d.data(), dy.data(), x.data(), n, kind);
          return d;
        });
        EXPECT_TRUE(same_bits(a, b));
      }
    // Extremes: gelu' -> 1 above, -> 0 below, finite everywhere.
    const std::vector<float> xs = {30.f, 1e4f, 3e38f, -30.f, -1e4f, -3e38f, 0.f, -0.f};
    const std::vector<float> ones(xs.size(), 1.f);
    for (Gelu kind : {Gelu::erf, Gelu::tanh}) {
      std::vector<float> d(xs.size());
      gelu_bwd(d.data(), ones.data(), xs.data(), int64_t(xs.size()), kind);
      for (size_t i = 0; i < 3; ++i) EXPECT_EQ(d[i], 1.f) << xs[i];
      for (size_t i = 3; i < 6; ++i) EXPECT_NEAR(d[i], 0.f, 1e-30) << xs[i];
      EXPECT_FLOAT_EQ(d[6], 0.5f);
      EXPECT_FLOAT_EQ(d[7], 0.5f);
    }
    EXPECT_THROW(gelu_bwd(nullptr, ones.data(), xs.data(), 3, Gelu::erf), Error);
  });
}

TEST(SwiGluBwd, FiniteDifferencesAliasSkipsAndExtremes) {
  for_each_isa([&] {
    for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{17}, int64_t{1000}, int64_t{70001}}) {
      SCOPED_TRACE("n=" + std::to_string(n));
      const std::vector<float> gate = randn(n, 30, 4.f), up = randn(n, 31), dy = randn(n, 32);
      std::vector<float> dg(sz(n), kSentinel), du(sz(n), kSentinel);
      swiglu_bwd(dg.data(), du.data(), dy.data(), gate.data(), up.data(), n);
      const auto silu = [](double g) { return g / (1 + std::exp(-g)); };
      // silu' lies in [−0.1, 1.1]: errors ~1e-7·|dy·up| from the float σ, bounded by 1e-5 absolute.
      for (int64_t i = 0; i < n; ++i) {
        const double g = gate[sz(i)], u = up[sz(i)], d = dy[sz(i)];
        const double ref_g = d * u * scalar_diff(g, silu);
        const double ref_u = d * silu(g);
        ASSERT_NEAR(dg[sz(i)], ref_g, 1e-5 * (std::fabs(d * u) + 1e-3)) << "gate=" << g;
        ASSERT_NEAR(du[sz(i)], ref_u, 1e-5 * (std::fabs(ref_u) + 1e-3)) << "gate=" << g;
      }
      // dgate may alias dy; dup may too; either may be skipped.
      std::vector<float> a1 = dy, o1(sz(n));
      swiglu_bwd(a1.data(), o1.data(), a1.data(), gate.data(), up.data(), n);
      EXPECT_TRUE(same_bits(a1, dg));
      EXPECT_TRUE(same_bits(o1, du));
      std::vector<float> a2 = dy, o2(sz(n));
      swiglu_bwd(o2.data(), a2.data(), a2.data(), gate.data(), up.data(), n);
      EXPECT_TRUE(same_bits(o2, dg));
      EXPECT_TRUE(same_bits(a2, du));
      std::vector<float> s1(sz(n)), s2(sz(n));
      swiglu_bwd(s1.data(), nullptr, dy.data(), gate.data(), up.data(), n);
      swiglu_bwd(nullptr, s2.data(), dy.data(), gate.data(), nullptr, n);
      EXPECT_TRUE(same_bits(s1, dg));
      EXPECT_TRUE(same_bits(s2, du));
      const auto [t1, t2] = with_1_and_2_threads([&] {
        std::vector<float> x(sz(n)), y(sz(n));
        swiglu_bwd(x.data(), y.data(), dy.data(), gate.data(), up.data(), n);
        x.insert(x.end(), y.begin(), y.end());
        return x;
      });
      EXPECT_TRUE(same_bits(t1, t2));
    }
    const std::vector<float> g = {100.f, 1e30f, -100.f, -1e30f}, ones(4, 1.f);
    std::vector<float> dg(4), du(4);
    swiglu_bwd(dg.data(), du.data(), ones.data(), g.data(), ones.data(), 4);
    EXPECT_EQ(dg[0], 1.f);
    EXPECT_EQ(dg[1], 1.f);
    EXPECT_EQ(du[0], 100.f);
    EXPECT_EQ(du[1], 1e30f);
    for (int i = 2; i < 4; ++i) {  // silu'(−100) = −99·e^−100: a denormal, not quite 0
      EXPECT_NEAR(dg[sz(i)], 0.f, 1e-30);
      EXPECT_NEAR(du[sz(i)], 0.f, 1e-30);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// RoPE

TEST(RopeBwd, FiniteDifferencesAndInverseOfForward) {
  for (int64_t rows : {int64_t{1}, int64_t{3}, int64_t{65}})
    for (int64_t hd : {int64_t{2}, int64_t{6}, int64_t{34}, int64_t{64}}) {
      SCOPED_TRACE("rows=" + std::to_string(rows) + " head_dim=" + std::to_string(hd));
      const int64_t heads = 3, hs = hd + 3, ld = heads * hs + 5;
      const float theta = 10000.f;
      std::vector<int32_t> pos(sz(rows));
      for (int64_t r = 0; r < rows; ++r) pos[sz(r)] = static_cast<int32_t>((r * 977) % 5003);
      const std::vector<float> xf = randn(rows * ld, 40), dyf = randn(rows * ld, 41);
      std::vector<float> dx = dyf;
      rope_bwd(dx.data(), ld, hs, pos.data(), rows, heads, hd, theta);
      std::vector<double> x = to_double(xf);
      const int64_t h = hd / 2;
      const auto loss = [&] {
        double l = 0;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t k = 0; k < heads; ++k)
            for (int64_t i = 0; i < h; ++i) {
              const double a = pos[sz(r)] * std::pow(double(theta), -2.0 * double(i) / double(hd));
              const int64_t o = r * ld + k * hs;
              const double x1 = x[sz(o + i)], x2 = x[sz(o + i + h)];
              l += dyf[sz(o + i)] * (x1 * std::cos(a) - x2 * std::sin(a)) +
                   dyf[sz(o + i + h)] * (x2 * std::cos(a) + x1 * std::sin(a));
            }
        return l;
      };
      std::vector<int64_t> at;
      for (int64_t j : probes(rows * heads * hd, 30, 8)) at.push_back(j / (heads * hd) * ld + (j % (heads * hd)) / hd * hs + j % hd);
      EXPECT_LT(fd_error(x, at, loss, [&](int64_t j) { return double(dx[sz(j)]); }), kTol);
      // Entries outside the heads (the row and head padding) are untouched.
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t e = 0; e < ld; ++e)
          if (e >= heads * hs || e % hs >= hd) {
            ASSERT_EQ(dx[sz(r * ld + e)], dyf[sz(r * ld + e)]);
          }
      // bwd ∘ fwd is the identity up to float rounding.
      std::vector<float> y = xf;
      rope_fwd(y.data(), ld, hs, pos.data(), rows, heads, hd, theta);
      rope_bwd(y.data(), ld, hs, pos.data(), rows, heads, hd, theta);
      for (int64_t i = 0; i < rows * ld; ++i) ASSERT_NEAR(y[sz(i)], xf[sz(i)], 2e-6 * (1 + std::fabs(xf[sz(i)])));
    }
  std::vector<float> x(8);
  const int32_t p = 0;
  EXPECT_THROW(rope_bwd(x.data(), 8, 3, &p, 1, 1, 3, 10000.f), Error);
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy

// Σ over counted rows of log Σ exp(x) − x[t], in double.
double ce_ref(const std::vector<double>& x, const std::vector<int32_t>& t, int64_t rows, int64_t classes) {
  double l = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (t[sz(r)] < 0) continue;
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < classes; ++c) m = std::max(m, x[sz(r * classes + c)]);
    for (int64_t c = 0; c < classes; ++c) s += std::exp(x[sz(r * classes + c)] - m);
    l += m + std::log(s) - x[sz(r * classes + t[sz(r)])];
  }
  return l;
}

TEST(CrossEntropy, LossAndGradientMatchReferenceWithIgnoredRows) {
  for (int64_t rows : kRowsSet)
    for (int64_t classes : {int64_t{1}, int64_t{3}, int64_t{17}, int64_t{65}, int64_t{300}}) {
      SCOPED_TRACE("rows=" + std::to_string(rows) + " classes=" + std::to_string(classes));
      const std::vector<float> lf = randn(rows * classes, 50, 3.f, 1.f);
      std::vector<int32_t> t(sz(rows));
      for (int64_t r = 0; r < rows; ++r) t[sz(r)] = (r % 4 == 3) ? -1 : static_cast<int32_t>((r * 7) % classes);
      int64_t counted = -5;
      std::vector<float> d(sz(rows * classes), kSentinel);
      const float scale = 0.37f;
      const double loss = cross_entropy(d.data(), lf.data(), t.data(), rows, classes, scale, &counted);
      int64_t want = 0;
      for (int32_t v : t) want += v >= 0;
      EXPECT_EQ(counted, want);
      std::vector<double> x = to_double(lf);
      const double ref = ce_ref(x, t, rows, classes);
      // Per row: float max and exp (~1e-7 relative each) then log and the sum in double.
      EXPECT_NEAR(loss, ref, 1e-6 * (std::fabs(ref) + double(rows)));
      const auto l = [&] { return scale * ce_ref(x, t, rows, classes); };
      EXPECT_LT(fd_error(x, probes(rows * classes, 30, 9), l, [&](int64_t j) { return double(d[sz(j)]); }), kTol);
      for (int64_t r = 0; r < rows; ++r)
        if (t[sz(r)] < 0) {
          for (int64_t c = 0; c < classes; ++c) ASSERT_EQ(d[sz(r * classes + c)], 0.f);
        }
      // dlogits may alias the logits; the loss alone needs no gradient buffer.
      std::vector<float> al = lf;
      EXPECT_EQ(cross_entropy(al.data(), al.data(), t.data(), rows, classes, scale, nullptr), loss);
      EXPECT_TRUE(same_bits(al, d));
      EXPECT_EQ(cross_entropy(nullptr, lf.data(), t.data(), rows, classes, scale, &counted), loss);
    }
}

TEST(CrossEntropy, SameBitsOnOneAndTwoThreadsAndLargeLogits) {
  const int64_t rows = 1000, classes = 300;
  std::vector<float> lf = randn(rows * classes, 51, 30.f);
  lf[5] = 1e4f;  // one huge logit: exp must not overflow
  lf[7] = -1e4f;
  std::vector<int32_t> t(sz(rows));
  for (int64_t r = 0; r < rows; ++r) t[sz(r)] = static_cast<int32_t>(r % classes);
  const auto [a, b] = with_1_and_2_threads([&] {
    std::vector<float> d(sz(rows * classes));
    const double l = cross_entropy(d.data(), lf.data(), t.data(), rows, classes, 1.f / rows, nullptr);
    return std::make_pair(d, l);
  });
  EXPECT_TRUE(same_bits(a.first, b.first));
  EXPECT_EQ(std::memcmp(&a.second, &b.second, sizeof(double)), 0);
  EXPECT_TRUE(std::isfinite(a.second));
  std::vector<double> x = to_double(lf);
  EXPECT_NEAR(a.second, ce_ref(x, t, rows, classes), 1e-6 * ce_ref(x, t, rows, classes));
}

TEST(CrossEntropy, RejectsBadTargetsAndNonFiniteLogitsNamingThem) {
  const int64_t rows = 3, classes = 4;
  std::vector<float> l(sz(rows * classes), 0.5f);
  const auto message = [&](const std::vector<int32_t>& t) {
    try {
      cross_entropy(nullptr, l.data(), t.data(), rows, classes, 1.f, nullptr);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string m = message({0, 4, 1});
  EXPECT_NE(m.find("row 1 is 4"), std::string::npos) << m;
  m = message({0, 1, -2});
  EXPECT_NE(m.find("row 2 is -2"), std::string::npos) << m;
  l[sz(2 * classes + 3)] = std::numeric_limits<float>::quiet_NaN();
  m = message({0, 1, 2});
  EXPECT_NE(m.find("row 2"), std::string::npos) << m;
  EXPECT_NE(m.find("nan"), std::string::npos) << m;
  EXPECT_EQ(message({0, 1, -1}), "no error");  // an ignored row may hold anything
  l[sz(2 * classes + 3)] = 0.5f;
  l[sz(1 * classes + 0)] = -std::numeric_limits<float>::infinity();
  m = message({0, 1, 2});
  EXPECT_NE(m.find("row 1"), std::string::npos) << m;
  EXPECT_NE(m.find("inf"), std::string::npos) << m;
  EXPECT_THROW(cross_entropy(nullptr, l.data(), nullptr, rows, classes, 1.f, nullptr), Error);
  int64_t counted = 9;
  EXPECT_EQ(cross_entropy(nullptr, nullptr, nullptr, 0, classes, 1.f, &counted), 0.0);
  EXPECT_EQ(counted, 0);
  // Nothing counted: scale = 1 / 0 is accepted and every gradient row is 0.
  const std::vector<int32_t> none(sz(rows), -1);
  std::vector<float> d(sz(rows * classes), 1.f);
  EXPECT_EQ(cross_entropy(d.data(), l.data(), none.data(), rows, classes, std::numeric_limits<float>::infinity(), &counted), 0.0);
  EXPECT_EQ(counted, 0);
  for (float v : d) EXPECT_EQ(v, 0.f);
  const std::vector<int32_t> one = {-1, 2, -1};
  EXPECT_THROW(cross_entropy(d.data(), l.data(), one.data(), rows, classes, std::numeric_limits<float>::infinity(), &counted), Error);
}

// ---------------------------------------------------------------------------------------------
// Dropout

TEST(Dropout, MaskIsTheDocumentedDrawAndBackwardReusesIt) {
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{4097}, int64_t{100003}}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const float p = 0.3f;
    const uint64_t seed = 42, stream = 7;
    const std::vector<float> x = randn(n, 60), dy = randn(n, 61);
    std::vector<float> y(sz(n)), dx(sz(n));
    dropout_fwd(y.data(), x.data(), n, p, seed, stream);
    dropout_bwd(dx.data(), dy.data(), n, p, seed, stream);
    const Rng rng(seed);
    const float scale = static_cast<float>(1.0 / (1.0 - p));
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t w = rng.bits(stream, static_cast<uint64_t>(i / 4))[sz(i % 4)];
      const bool keep = static_cast<float>(w >> 8) * (1.f / 16777216.f) >= p;
      ASSERT_EQ(y[sz(i)], keep ? x[sz(i)] * scale : 0.f) << i;
      ASSERT_EQ(dx[sz(i)], keep ? dy[sz(i)] * scale : 0.f) << i;
    }
    std::vector<float> al = x;
    dropout_fwd(al.data(), al.data(), n, p, seed, stream);
    EXPECT_TRUE(same_bits(al, y));
    const auto [a, b] = with_1_and_2_threads([&] {
      std::vector<float> o(sz(n));
      dropout_fwd(o.data(), x.data(), n, p, seed, stream);
      return o;
    });
    EXPECT_TRUE(same_bits(a, b));
  }
}

TEST(Dropout, PreservesTheMeanAndStreamsDiffer) {
  const int64_t n = 1000000;
  const std::vector<float> ones(sz(n), 1.f);
  for (float p : {0.1f, 0.5f, 0.9f}) {
    std::vector<float> y(sz(n));
    dropout_fwd(y.data(), ones.data(), n, p, 3, 0);
    double s = 0;
    int64_t kept = 0;
    for (float v : y) {
      s += v;
      kept += v != 0.f;
    }
    // Var(y) = p/(1−p) per element: the mean's sd is √(p/(1−p)/n) <= 3e-3; bound at 6 sd.
    const double sd = std::sqrt(p / (1 - p) / double(n));
    EXPECT_NEAR(s / double(n), 1.0, 6 * sd) << p;
    EXPECT_NEAR(double(kept) / double(n), 1.0 - p, 6 * std::sqrt(p * (1 - p) / double(n))) << p;
  }
  std::vector<float> a(1000), b(1000), c(1000);
  dropout_fwd(a.data(), ones.data(), 1000, 0.5f, 3, 0);
  dropout_fwd(b.data(), ones.data(), 1000, 0.5f, 3, 1);
  dropout_fwd(c.data(), ones.data(), 1000, 0.5f, 4, 0);
  EXPECT_FALSE(same_bits(a, b));
  EXPECT_FALSE(same_bits(a, c));
}

TEST(Dropout, ZeroCopiesAndBadProbabilitiesAreErrors) {
  const std::vector<float> x = randn(100, 62);
  std::vector<float> y(100);
  dropout_fwd(y.data(), x.data(), 100, 0.f, 1, 2);
  EXPECT_TRUE(same_bits(x, y));
  for (float p : {-0.1f, 1.f, 2.f, std::numeric_limits<float>::quiet_NaN()}) {
    EXPECT_THROW(dropout_fwd(y.data(), x.data(), 100, p, 1, 2), Error) << p;
    EXPECT_THROW(dropout_bwd(y.data(), x.data(), 100, p, 1, 2), Error) << p;
  }
}

}  // namespace
}  // namespace clattn::nn
