// Row operations on score tiles shared by the flash-style kernels (full, clustered, ...).
// Scores are kept in log2 units (queries pre-scaled by scale·log2 e) so probabilities are exp2.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

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

// Softmax of a row of kw scores (log2 units) and one optional extra logit (a causal self key;
// -inf when none): normalises the row in place, sets p_extra, and returns the log2-sum-exp2 —
// or -inf, with the row zeroed, when nothing is visible.
inline float softmax_row_extra(float* row, int64_t kw, float extra, float& p_extra) {
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

// Rounds (hashes) combined by log-sum-exp, online: dst accumulates Σ_r 2^(lse_r − M) O_r with a
// running maximum M and sum per query, as the flash-attention accumulator does across tiles.
struct RoundMix {
  std::vector<float> m, l;  // (n) running log2 maximum and sum
  void reset(int64_t n) {
    m.assign(static_cast<size_t>(n), -kInf);
    l.assign(static_cast<size_t>(n), 0.f);
  }
  void add(float* dst, const float* o, int64_t dv, int64_t i, float lse2) {
    if (lse2 == -kInf) return;
    float& mr = m[static_cast<size_t>(i)];
    const float mn = std::max(mr, lse2), keep = std::exp2(mr - mn), add = std::exp2(lse2 - mn);
    for (int64_t e = 0; e < dv; ++e) dst[e] = dst[e] * keep + o[e] * add;
    l[static_cast<size_t>(i)] = l[static_cast<size_t>(i)] * keep + add;
    mr = mn;
  }
  // Normalises dst; returns the combined log2-sum-exp2, +inf when no round saw a key (dst is 0
  // then, and a backward's exp2(s − lse) vanishes).
  float finish(float* dst, int64_t dv, int64_t i) const {
    const float lr = l[static_cast<size_t>(i)];
    if (!(lr > 0.f)) return kInf;
    for (int64_t e = 0; e < dv; ++e) dst[e] /= lr;
    return m[static_cast<size_t>(i)] + std::log2(lr);
  }
};

}  // namespace clattn::tile
