// The tile kernels' ISA copies (core/microkernel.h, core/rows_isa.cpp) and the 16-bit conversions
// against plain loops in double: the products, the softmax row passes, the few-row products and
// their 16-bit forms, in every ISA copy this CPU runs.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "clattn/cpu.h"
#include "clattn/rng.h"
#include "core/half.h"
#include "core/isa.h"
#include "core/microkernel.h"

namespace clattn {
namespace {

// The active table (through the dispatching entry points) and every ISA copy this CPU runs.
std::vector<const mk::Kernels*> table_copies() {
  std::vector<const mk::Kernels*> copies = {&mk::kernels()};
  for (const char* isa : {"avx2", "avx512"})
    if (supported_isas().find(isa) != std::string::npos && mk::kernels_for(isa)) copies.push_back(mk::kernels_for(isa));
  return copies;
}

// Both microkernel shapes over awkward sizes, against plain loops, in every ISA copy this CPU runs
// (the active one through the dispatching entry points, every one through its own table).
TEST(Microkernel, MatchesLoops) {
  const std::vector<const mk::Kernels*> copies = table_copies();
  for (const mk::Kernels* K : copies) {
  SCOPED_TRACE(K == &mk::kernels() ? std::string("active ISA ") + isa_name(active_isa()) : "table");
  Rng r(3);
  for (int64_t m : {1, 5, 6, 7, 64})
    for (int64_t depth : {1, 3, 64})
      for (int64_t cols : {1, 63, 64, 130}) {
        const int64_t np = (cols + 63) / 64;
        std::vector<float> a(static_cast<size_t>(m * depth)), bt(static_cast<size_t>(cols * depth)),
            panels(static_cast<size_t>(np * 64 * depth)), c(static_cast<size_t>(m * np * 64));
        for (size_t i = 0; i < a.size(); ++i) a[i] = r.normal(0, i);
        for (size_t i = 0; i < bt.size(); ++i) bt[i] = r.normal(1, i);
        K->pack_panels(bt.data(), cols, depth, depth, panels.data());
        K->gemm_abt(m, np, depth, a.data(), depth, panels.data(), c.data(), np * 64);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < np * 64; ++j) {
            double s = 0;
            for (int64_t e = 0; e < depth && j < cols; ++e)
              s += static_cast<double>(a[static_cast<size_t>(i * depth + e)]) * bt[static_cast<size_t>(j * depth + e)];
            ASSERT_NEAR(c[static_cast<size_t>(i * np * 64 + j)], s, 1e-4) << m << " " << depth << " " << cols;
          }
        // gemm_ab with A read transposed and a row scale: C = diag(s)·C + Aᵀ·B.
        const int64_t n = mk::round_up(cols, 16);
        std::vector<float> b(static_cast<size_t>(depth * n)), c2(static_cast<size_t>(m * n)), sc(static_cast<size_t>(m));
        for (size_t i = 0; i < b.size(); ++i) b[i] = r.normal(2, i);
        for (size_t i = 0; i < c2.size(); ++i) c2[i] = r.normal(3, i);
        for (size_t i = 0; i < sc.size(); ++i) sc[i] = r.normal(4, i);
        std::vector<float> at(static_cast<size_t>(depth * m));  // (depth, m): A transposed
        for (int64_t i = 0; i < m; ++i)
          for (int64_t e = 0; e < depth; ++e) at[static_cast<size_t>(e * m + i)] = a[static_cast<size_t>(i * depth + e)];
        std::vector<float> want = c2;
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double s = static_cast<double>(want[static_cast<size_t>(i * n + j)]) * sc[static_cast<size_t>(i)];
            for (int64_t e = 0; e < depth; ++e)
              s += static_cast<double>(a[static_cast<size_t>(i * depth + e)]) * b[static_cast<size_t>(e * n + j)];
            want[static_cast<size_t>(i * n + j)] = static_cast<float>(s);
          }
        K->gemm_ab(m, n, depth, at.data(), 1, m, b.data(), n, c2.data(), n, sc.data());
        for (size_t i = 0; i < c2.size(); ++i) ASSERT_NEAR(c2[i], want[i], 1e-4);
      }
  }
}

// The row passes of the flash-style kernels (the softmax of every score tile) in every ISA copy,
// against double-precision loops: exp2 to 3e-7 relative over the range scores take, -inf rows,
// the online step's rescale factor and running sums, and the softmax of a row's first k columns.
TEST(Microkernel, RowPassesMatchLoops) {
  const std::vector<const mk::Kernels*> copies = table_copies();
  for (const mk::Kernels* K : copies) {
    SCOPED_TRACE(K == &mk::kernels() ? std::string("active ISA ") + isa_name(active_isa()) : "table");
    // exp2 over arguments [-153, 97) and up to 126 in steps that hit integers, halves and everything between
    // (the row passes' arguments are scores minus their row's max: at most a rounding above 0).
    std::vector<float> x;
    for (float v = -150.f; v < 100.f; v += 0.0137f) x.push_back(v);
    for (float v : {0.f, -0.f, 1.f, -1.f, 0.5f, -0.5f, 3.5f, 2.5f, 129.f, -122.f, -123.f, -200.f}) x.push_back(v);
    x.resize(static_cast<size_t>(mk::round_up(static_cast<int64_t>(x.size()), 16)), -INFINITY);
    std::vector<float> e = x;
    const float sum = K->exp2_row(e.data(), static_cast<int64_t>(e.size()), 3.f);
    double want_sum = 0, worst = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const float arg = x[i] - 3.f;  // the kernel's argument, rounded as it rounds it
      const double ref = std::exp2(static_cast<double>(arg));
      want_sum += ref;
      if (ref == 0.0) EXPECT_EQ(e[i], 0.f) << x[i];
      else if (ref < 0x1p-125) EXPECT_TRUE(e[i] == 0.f || std::abs(e[i] - ref) < 1e-44) << x[i];  // subnormal: may flush
      else worst = std::max(worst, std::abs(e[i] - ref) / ref);
    }
    EXPECT_LT(worst, 3e-7);
    EXPECT_NEAR(sum, want_sum, 1e-6 * want_sum);
    {
      std::vector<float> ints = {0.f, 1.f, 2.f, -1.f, -24.f, 10.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      K->exp2_row(ints.data(), 16, 0.f);
      EXPECT_EQ(ints[0], 1.f);  // integral powers are exact
      EXPECT_EQ(ints[1], 2.f);
      EXPECT_EQ(ints[2], 4.f);
      EXPECT_EQ(ints[3], 0.5f);
      EXPECT_EQ(ints[4], std::ldexp(1.f, -24));
      EXPECT_EQ(ints[5], 1024.f);
    }
    Rng r(11);
    const int64_t rows = 5, width = 48;
    std::vector<float> s(static_cast<size_t>(rows * width));
    for (size_t i = 0; i < s.size(); ++i) s[i] = 4.f * r.normal(0, i);
    for (int64_t j = 0; j < width; ++j) s[static_cast<size_t>(2 * width + j)] = -INFINITY;  // row 2 sees nothing
    for (int64_t q = 0; q < rows; ++q) {
      const float* row = s.data() + q * width;
      EXPECT_EQ(K->row_max(row, width), *std::max_element(row, row + width));
    }
    // online_softmax_row from a running (m, l) against the closed form.
    for (int64_t q = 0; q < rows; ++q) {
      std::vector<float> row(s.begin() + q * width, s.begin() + (q + 1) * width);
      float m = q == 2 ? -INFINITY : 1.5f, l = q == 2 ? 0.f : 2.f;
      const float m0 = m, l0 = l;
      const float alpha = K->online_softmax_row(row.data(), width, m, l);
      const float mx = std::max(m0, *std::max_element(s.begin() + q * width, s.begin() + (q + 1) * width));
      if (q == 2) {
        EXPECT_EQ(alpha, 1.f);
        EXPECT_EQ(m, -INFINITY);
        EXPECT_EQ(l, 0.f);
        for (float v : row) EXPECT_EQ(v, 0.f);
        continue;
      }
      EXPECT_EQ(m, mx);
      EXPECT_NEAR(alpha, std::exp2(static_cast<double>(m0) - mx), 1e-6);
      double lw = l0 * std::exp2(static_cast<double>(m0) - mx);
      for (int64_t j = 0; j < width; ++j) {
        const double p = std::exp2(static_cast<double>(s[static_cast<size_t>(q * width + j)] - mx));
        EXPECT_NEAR(row[static_cast<size_t>(j)], p, 3e-7 * p + 1e-30);
        lw += p;
      }
      EXPECT_NEAR(l, lw, 1e-6 * lw);
    }
    // softmax_rows over the first k columns, and prob_row against the log2-sum-exp2 it returns.
    for (int64_t k : {1, 17, 48}) {
      std::vector<float> sm = s, lse2(static_cast<size_t>(rows));
      for (int64_t j = 0; j < width; ++j) sm[static_cast<size_t>(2 * width + j)] = 0.25f * static_cast<float>(j);
      std::vector<float> orig = sm;
      K->softmax_rows(sm.data(), rows, width, k, lse2.data());
      for (int64_t q = 0; q < rows; ++q) {
        double mx = -INFINITY, z = 0;
        for (int64_t j = 0; j < k; ++j) mx = std::max(mx, static_cast<double>(orig[static_cast<size_t>(q * width + j)]));
        for (int64_t j = 0; j < k; ++j) z += std::exp2(orig[static_cast<size_t>(q * width + j)] - mx);
        EXPECT_NEAR(lse2[static_cast<size_t>(q)], mx + std::log2(z), 1e-5);
        for (int64_t j = 0; j < width; ++j) {
          const double want = j < k ? std::exp2(orig[static_cast<size_t>(q * width + j)] - mx) / z : 0.0;
          EXPECT_NEAR(sm[static_cast<size_t>(q * width + j)], want, 1e-6) << q << " " << j;
        }
        std::vector<float> pr(orig.begin() + q * width, orig.begin() + (q + 1) * width);
        K->prob_row(pr.data(), width, lse2[static_cast<size_t>(q)]);
        for (int64_t j = 0; j < k; ++j) {
          EXPECT_LE(pr[static_cast<size_t>(j)], 1.f);
          EXPECT_NEAR(pr[static_cast<size_t>(j)], sm[static_cast<size_t>(q * width + j)], 1e-6);
        }
      }
    }
    // exp2_rows_shifted and grad_scores_rows, row by row against loops.
    std::vector<float> m(static_cast<size_t>(rows)), l2(static_cast<size_t>(rows)), di(static_cast<size_t>(rows));
    for (int64_t q = 0; q < rows; ++q) {
      m[static_cast<size_t>(q)] = 3.f + static_cast<float>(q);
      l2[static_cast<size_t>(q)] = 0.5f * static_cast<float>(q);
      di[static_cast<size_t>(q)] = r.normal(5, static_cast<uint64_t>(q));
    }
    std::vector<float> p = s;
    K->exp2_rows_shifted(p.data(), rows, width, width, m.data(), l2.data());
    std::vector<float> ds(s.size());
    for (size_t i = 0; i < ds.size(); ++i) ds[i] = r.normal(6, i);
    std::vector<float> ds0 = ds;
    K->grad_scores_rows(ds.data(), p.data(), rows, width, width, di.data(), 0.125f);
    for (int64_t q = 0; q < rows; ++q)
      for (int64_t j = 0; j < width; ++j) {
        const size_t i = static_cast<size_t>(q * width + j);
        const double want = std::exp2(static_cast<double>((s[i] - m[static_cast<size_t>(q)]) - l2[static_cast<size_t>(q)]));
        EXPECT_NEAR(p[i], want, 3e-7 * want + 1e-30);
        EXPECT_NEAR(ds[i], static_cast<double>(p[i]) * (ds0[i] - di[static_cast<size_t>(q)]) * 0.125, 1e-6);
      }
    // softmax_row_extra: a row with its own extra logit; nothing visible gives -inf and zeros.
    std::vector<float> row(s.begin(), s.begin() + width), orig(row);
    float pe = -1.f;
    const float lse = K->softmax_row_extra(row.data(), width, 2.f, pe);
    double mx = 2.0, z = 0;
    for (float v : orig) mx = std::max(mx, static_cast<double>(v));
    for (float v : orig) z += std::exp2(v - mx);
    z += std::exp2(2.0 - mx);
    EXPECT_NEAR(lse, mx + std::log2(z), 1e-5);
    EXPECT_NEAR(pe, std::exp2(2.0 - mx) / z, 1e-6);
    std::vector<float> none(static_cast<size_t>(width), -INFINITY);
    EXPECT_EQ(K->softmax_row_extra(none.data(), width, -INFINITY, pe), -INFINITY);
    EXPECT_EQ(pe, 0.f);
    for (float v : none) EXPECT_EQ(v, 0.f);
  }
}

// The few-rows product (a decode step's linear layers) in every ISA copy: every row count the
// kernel pairs, W row counts around its groups of 4, depths around the vector width, padded
// strides, alpha and beta; beta = 0 overwrites a NaN in Y, as BLAS does.
TEST(Microkernel, RowsDotMatchesLoops) {
  const std::vector<const mk::Kernels*> copies = table_copies();
  Rng r(5);
  uint64_t ctr = 0;
  for (const mk::Kernels* K : copies)
    for (int64_t m : {1, 2, 3, 5})
      for (int64_t n : {1, 3, 4, 5, 17, 64})
        for (int64_t k : {1, 7, 8, 9, 16, 63, 65, 300})
          for (float beta : {0.f, 1.f, -0.5f}) {
            const int64_t ldx = k + 1, ldw = k + 3, ldy = n + 2;
            std::vector<float> x(static_cast<size_t>(m * ldx)), w(static_cast<size_t>(n * ldw)), y(static_cast<size_t>(m * ldy));
            for (float& v : x) v = r.normal(0, ctr++);
            for (float& v : w) v = r.normal(1, ctr++);
            for (float& v : y) v = beta == 0.f ? NAN : r.normal(2, ctr++);
            const std::vector<float> y0 = y;
            K->rows_dot(m, n, k, 1.5f, x.data(), ldx, w.data(), ldw, beta, y.data(), ldy);
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < ldy; ++j) {
                const size_t at = static_cast<size_t>(i * ldy + j);
                if (j >= n) {
                  ASSERT_TRUE(std::isnan(y[at]) ? std::isnan(y0[at]) : y[at] == y0[at]);
                  continue;
                }
                double s = 0, mag = 0;
                for (int64_t e = 0; e < k; ++e) {
                  const double p = static_cast<double>(x[static_cast<size_t>(i * ldx + e)]) * w[static_cast<size_t>(j * ldw + e)];
                  s += p;
                  mag += std::fabs(p);
                }
                const double base = beta == 0.f ? 0.0 : beta * static_cast<double>(y0[at]);
                ASSERT_NEAR(y[at], 1.5 * s + base, 1e-5 * (mag + std::fabs(base)) + 1e-6)
                    << "m " << m << " n " << n << " k " << k << " beta " << beta;
              }
          }
}

// The scalar f16 conversions against the CPU's own (F16C, in every x86-64-v3 CPU): every one of
// the 65536 f16 values widens to the same float, and floats over every exponent (subnormals,
// ties, the edge of 65504, inf and NaN) narrow to the same bits. bf16 narrowing rounds to the
// nearest value, ties to even, by its definition.
TEST(Half, ConversionsMatchF16cAndRoundToNearestEven) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = _cvtsh_ss(static_cast<unsigned short>(h)), got = half::f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << h;
    } else {
      ASSERT_EQ(half::bits(got), half::bits(want)) << "f16 bits " << h;
    }
  }
  std::vector<float> xs = {0.f, -0.f, 65504.f, 65519.f, 65520.f, 65536.f, 1e-8f, 2.9802322e-8f, 5.9604645e-8f,
                           6.1035156e-5f, 6.0975552e-5f, INFINITY, -INFINITY, NAN, 1.f + 1.f / 2048, 1.f + 3.f / 2048};
  Rng r(17);
  for (uint64_t i = 0; i < 400000; ++i) xs.push_back(half::from_bits(static_cast<uint32_t>(r.u64(0, i))));
  for (float x : xs) {
    const uint16_t want = static_cast<uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
    const uint16_t got = half::f32_to_f16(x);
    if (std::isnan(x)) {
      ASSERT_TRUE((got & 0x7c00u) == 0x7c00u && (got & 0x3ffu) != 0) << x;
    } else {
      ASSERT_EQ(got, want) << "x " << x << " bits " << half::bits(x);
    }
    const uint16_t b = half::f32_to_bf16(x);
    if (std::isnan(x) || std::isinf(x)) {
      ASSERT_EQ(std::isnan(half::bf16_to_f32(b)), std::isnan(x));
      if (std::isinf(x)) {
        ASSERT_EQ(half::bf16_to_f32(b), x);
      }
      continue;
    }
    if (std::isinf(half::bf16_to_f32(b))) {  // overflow: only past bf16's largest finite 0x7f7f
      ASSERT_GT(std::fabs(x), half::bf16_to_f32(0x7f7f)) << x;
      continue;
    }
    // The nearest bf16 (or ties to the even one), checked by the neighbours of the result.
    const double d = std::fabs(static_cast<double>(half::bf16_to_f32(b)) - x);
    for (int s : {-1, 1}) {
      const uint16_t nb = static_cast<uint16_t>(b + s);
      if (((nb ^ b) & 0x8000u) || (nb & 0x7f80u) == 0x7f80u) continue;  // sign flip, inf or NaN
      const double dn = std::fabs(static_cast<double>(half::bf16_to_f32(nb)) - x);
      ASSERT_TRUE(d < dn || (d == dn && (b & 1u) == 0)) << "x " << x << " bf16 " << b;
    }
  }
}

// The 16-bit B operands of the tiles (a KV cache's f16 or bf16 panels and value rows) in every ISA
// copy: the same products as f32 tiles over the widened values, bit for bit, and to_half the same
// bits as the scalar conversions.
TEST(Microkernel, HalfOperandsMatchWidenedF32) {
  const std::vector<const mk::Kernels*> copies = table_copies();
  Rng r(19);
  for (const mk::Kernels* K : copies)
    for (const mk::Half f : {mk::Half::f16, mk::Half::bf16}) {
      auto narrow = [&](float x) { return f == mk::Half::f16 ? half::f32_to_f16(x) : half::f32_to_bf16(x); };
      auto widen = [&](uint16_t h) { return f == mk::Half::f16 ? half::f16_to_f32(h) : half::bf16_to_f32(h); };
      for (int64_t n : {1, 7, 8, 9, 17, 300}) {
        std::vector<float> src(static_cast<size_t>(n));
        for (size_t i = 0; i < src.size(); ++i) src[i] = r.normal(0, i) * 100.f;
        std::vector<uint16_t> got(static_cast<size_t>(n));
        K->to_half(f, src.data(), n, got.data());
        for (size_t i = 0; i < src.size(); ++i) ASSERT_EQ(got[i], narrow(src[i])) << src[i];
      }
      for (int64_t m : {1, 5, 6, 7})
        for (int64_t depth : {1, 3, 64})
          for (int64_t np : {1, 2}) {
            std::vector<float> a(static_cast<size_t>(m * depth)), pan32(static_cast<size_t>(np * 64 * depth));
            std::vector<uint16_t> pan16(pan32.size());
            for (size_t i = 0; i < a.size(); ++i) a[i] = r.normal(1, i);
            for (size_t i = 0; i < pan16.size(); ++i) {
              pan16[i] = narrow(r.normal(2, i));
              pan32[i] = widen(pan16[i]);
            }
            std::vector<float> c16(static_cast<size_t>(m * np * 64)), c32(c16.size());
            K->gemm_abt16(f, m, np, depth, a.data(), depth, pan16.data(), c16.data(), np * 64);
            K->gemm_abt(m, np, depth, a.data(), depth, pan32.data(), c32.data(), np * 64);
            ASSERT_EQ(c16, c32) << "gemm_abt16 m " << m << " depth " << depth;
            const int64_t nn = 16 * np;  // gemm_ab: B (depth, nn) rows, C with a row scale
            std::vector<uint16_t> b16(static_cast<size_t>(depth * nn));
            std::vector<float> b32(b16.size()), d16(static_cast<size_t>(m * nn)), sc(static_cast<size_t>(m));
            for (size_t i = 0; i < b16.size(); ++i) {
              b16[i] = narrow(r.normal(3, i));
              b32[i] = widen(b16[i]);
            }
            for (size_t i = 0; i < d16.size(); ++i) d16[i] = r.normal(4, i);
            for (size_t i = 0; i < sc.size(); ++i) sc[i] = r.normal(5, i);
            std::vector<float> d32 = d16;
            K->gemm_ab16(f, m, nn, depth, a.data(), depth, 1, b16.data(), nn, d16.data(), nn, sc.data());
            K->gemm_ab(m, nn, depth, a.data(), depth, 1, b32.data(), nn, d32.data(), nn, sc.data());
            ASSERT_EQ(d16, d32) << "gemm_ab16 m " << m << " depth " << depth;
          }
    }
}

// The few-rows product with 16-bit W (a decode step's f16 / bf16 linear weights) in every ISA copy:
// against a double reference over the widened weights and against the f32 kernel over them (the
// same vector sums; only the k % lanes tail may round differently, FMA against GCC's vectorised
// multiply then add), bound by f32 accumulation over k terms; padded strides, alpha and beta,
// NaN in Y overwritten when beta = 0.
TEST(Microkernel, RowsDot16MatchesReference) {
  const std::vector<const mk::Kernels*> copies = table_copies();
  Rng r(23);
  uint64_t ctr = 0;
  for (const mk::Kernels* K : copies)
    for (const mk::Half f : {mk::Half::f16, mk::Half::bf16})
      for (int64_t m : {1, 2, 3})
        for (int64_t n : {1, 63, 64, 65})
          for (int64_t k : {1, 3, 16, 17, 1000})
            for (float beta : {0.f, -0.5f}) {
              const int64_t ldx = k + 1, ldw = k + 3, ldy = n + 2;
              std::vector<float> x(static_cast<size_t>(m * ldx)), y(static_cast<size_t>(m * ldy)), w32(static_cast<size_t>(n * ldw));
              std::vector<uint16_t> w16(w32.size());
              for (float& v : x) v = r.normal(0, ctr++);
              for (size_t i = 0; i < w16.size(); ++i) {
                const float v = r.normal(1, ctr++);
                w16[i] = f == mk::Half::f16 ? half::f32_to_f16(v) : half::f32_to_bf16(v);
                w32[i] = f == mk::Half::f16 ? half::f16_to_f32(w16[i]) : half::bf16_to_f32(w16[i]);
              }
              for (float& v : y) v = beta == 0.f ? NAN : r.normal(2, ctr++);
              std::vector<float> y32 = y;
              const std::vector<float> y0 = y;
              K->rows_dot16(f, m, n, k, 1.5f, x.data(), ldx, w16.data(), ldw, beta, y.data(), ldy);
              K->rows_dot(m, n, k, 1.5f, x.data(), ldx, w32.data(), ldw, beta, y32.data(), ldy);
              for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < n; ++j) {
                  double s = 0, mag = 0;
                  for (int64_t e = 0; e < k; ++e) {
                    const double p = static_cast<double>(x[static_cast<size_t>(i * ldx + e)]) * w32[static_cast<size_t>(j * ldw + e)];
                    s += p;
                    mag += std::fabs(p);
                  }
                  const size_t at = static_cast<size_t>(i * ldy + j);
                  const double want = 1.5 * s + (beta == 0.f ? 0.0 : beta * static_cast<double>(y0[at]));
                  // f32 rounding: about 2^-24 per term summed, and per scaling.
                  const double bound = 6e-8 * static_cast<double>(k + 3) * (1.5 * mag + (beta == 0.f ? 0.0 : std::fabs(beta * y0[at])));
                  ASSERT_NEAR(y[at], want, bound)
                      << "m " << m << " n " << n << " k " << k;
                  ASSERT_NEAR(y[at], y32[at], bound) << "m " << m << " n " << n << " k " << k;
                }
              for (int64_t i = 0; i < m; ++i)  // the row padding is not written
                for (int64_t j = n; j < ldy; ++j) {
                  const size_t at = static_cast<size_t>(i * ldy + j);
                  ASSERT_TRUE(std::isnan(y0[at]) ? std::isnan(y[at]) : y[at] == y0[at]);
                }
            }
}

}  // namespace
}  // namespace clattn
