// The row passes of the flash-style kernels (max, exp2, online and plain softmax over a score
// row), compiled once per ISA beside the tile products (microkernel_isa.cpp puts them in the same
// table). Compiled once at x86-64-v3, their 16-lane vectors ran as pairs of 8-lane halves on
// AVX-512 CPUs too: `full`'s exp2 pass then took a quarter of a 64 x 512 tile's time on an
// AVX-512 Xeon (clattn_kernel_bench BM_OnlineSoftmax: 1.36 G scores/s per thread before, 3.16 after).
// Scores are in log2 units (queries pre-scaled by scale·log2 e), so probabilities are exp2. Widths
// are multiples of 16 (rows padded with -inf).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/microkernel.h"
#include "core/simd.h"

#if !defined(CLATTN_ISA_NS)
#error "rows_isa.cpp is compiled once per ISA with CLATTN_ISA_NS set (CMakeLists.txt)"
#endif

namespace clattn::mk::CLATTN_ISA_NS {

namespace {
constexpr float kInf = std::numeric_limits<float>::infinity();
}

float row_max(const float* row, int64_t width) {
  simd::vn m = simd::splat_n(-kInf);
  for (int64_t j = 0; j < width; j += simd::kNative) {
    const simd::vn x = simd::load_n(row + j);
    m = x > m ? x : m;
  }
  return simd::hmax_n(m);
}

float exp2_row(float* row, int64_t width, float sub) {
  const simd::vn s = simd::splat_n(sub);
  simd::vn acc{};
  for (int64_t j = 0; j < width; j += simd::kNative) {
    const simd::vn p = simd::exp2_n(simd::load_n(row + j) - s);
    simd::store_n(row + j, p);
    acc += p;
  }
  return simd::hsum_n(acc);
}

void exp2_rows_shifted(float* s, int64_t rows, int64_t ld, int64_t width, const float* m, const float* l2) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * ld;
    const simd::vn mv = simd::splat_n(m[r]), lv = simd::splat_n(l2[r]);
    for (int64_t j = 0; j < width; j += simd::kNative)
      simd::store_n(row + j, simd::exp2_n((simd::load_n(row + j) - mv) - lv));
  }
}

void prob_row(float* row, int64_t width, float lse2) {
  const simd::vn s = simd::splat_n(lse2), zero{};
  for (int64_t j = 0; j < width; j += simd::kNative) {
    const simd::vn x = simd::load_n(row + j) - s;
    simd::store_n(row + j, simd::exp2_n(x > zero ? zero : x));
  }
}

void grad_scores_rows(float* ds, const float* p, int64_t rows, int64_t ld, int64_t width, const float* di,
                      float scale) {
  const simd::vn sv = simd::splat_n(scale);
  for (int64_t r = 0; r < rows; ++r) {
    const simd::vn dv = simd::splat_n(di[r]);
    float* dr = ds + r * ld;
    const float* pr = p + r * ld;
    for (int64_t j = 0; j < width; j += simd::kNative)
      simd::store_n(dr + j, simd::load_n(pr + j) * (simd::load_n(dr + j) - dv) * sv);
  }
}

float online_softmax_row(float* row, int64_t width, float& m, float& l) {
  const float mnew = std::max(m, row_max(row, width));
  if (mnew == -kInf) {  // nothing visible yet: P = 0, accumulator untouched
    std::fill(row, row + width, 0.f);
    return 1.f;
  }
  const float alpha = std::exp2(m - mnew);
  l = l * alpha + exp2_row(row, width, mnew);
  m = mnew;
  return alpha;
}

void softmax_rows(float* s, int64_t rows, int64_t kw, int64_t k, float* lse2) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * kw;
    for (int64_t j = std::clamp(k, int64_t{0}, kw); j < kw; ++j) row[j] = -kInf;
    const float mx = row_max(row, kw);
    const float sum = exp2_row(row, kw, mx);
    lse2[r] = mx + std::log2(sum);
    const simd::vn inv = simd::splat_n(1.f / sum);
    for (int64_t x = 0; x < kw; x += simd::kNative) simd::store_n(row + x, simd::load_n(row + x) * inv);
  }
}

float softmax_row_extra(float* row, int64_t kw, float extra, float& p_extra) {
  const float m = std::max(row_max(row, kw), extra);
  p_extra = 0.f;
  if (m == -kInf) {
    std::fill(row, row + kw, 0.f);
    return -kInf;
  }
  const float pe = std::exp2(extra - m);
  const float l = exp2_row(row, kw, m) + pe;
  const float inv = 1.f / l;
  for (int64_t x = 0; x < kw; ++x) row[x] *= inv;
  p_extra = pe * inv;
  return m + std::log2(l);
}

}  // namespace clattn::mk::CLATTN_ISA_NS
