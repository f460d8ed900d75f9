// Row operations on score tiles shared by the flash-style kernels (full, clustered, ...).
// Scores are kept in log2 units (queries pre-scaled by scale·log2 e) so probabilities are exp2.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/simd.h"

namespace clattn::tile {

inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2 = 0.693147180559945309f;
inline constexpr float kInf = std::numeric_limits<float>::infinity();

// Writes -inf over row[lim, width): keys past the visible limit.
inline void mask_tail(float* row, int64_t width, int64_t lim) {
  for (int64_t j = std::clamp(lim, int64_t{0}, width); j < width; ++j) row[j] = -kInf;
}

// Max of a row of `width` scores, width a multiple of 16.
inline float row_max(const float* row, int64_t width) {
  simd::vf m = simd::splat(-kInf);
  for (int64_t j = 0; j < width; j += simd::kLanes) m = simd::vmax(m, simd::load(row + j));
  return simd::hmax(m);
}

// row <- 2^(row - sub); returns the sum. width is a multiple of 16.
inline float exp2_row(float* row, int64_t width, float sub) {
  const simd::vf s = simd::splat(sub);
  simd::vf acc = simd::vf{};
  for (int64_t j = 0; j < width; j += simd::kLanes) {
    const simd::vf p = simd::exp2(simd::load(row + j) - s);
    simd::store(row + j, p);
    acc += p;
  }
  return simd::hsum(acc);
}

// Online-softmax step for one row of a new tile (FlashAttention): updates the running max m
// (log2 units) and sum l, turns the row into unnormalised probabilities and returns the factor
// alpha by which the row's earlier accumulator must be rescaled.
inline float online_softmax_row(float* row, int64_t width, float& m, float& l) {
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

}  // namespace clattn::tile
