// Streaming top-k selection over rows of scores that arrive tile by tile: a candidate buffer of
// 2k entries per row and a threshold (the k-th best so far) that filters whole vectors at once, so
// after the first few tiles almost nothing is inserted. Used by improved-clustered (each
// centroid's keys) and topk (each query's keys). Ties go to the lower key index.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/simd.h"

namespace clattn {

struct Cand {  // a top-k candidate: score (log2 units) and key index
  float v;
  int32_t i;
};

inline bool cand_before(const Cand& a, const Cand& b) { return a.v > b.v || (a.v == b.v && a.i < b.i); }

// Keeps the k best of buf[0, n) (by value, lower key index on ties); returns the worst kept value
// once k are held (the filter threshold), else -inf.
inline float top_compact(Cand* buf, int64_t& n, int64_t k) {
  if (n > k) {
    std::nth_element(buf, buf + (k - 1), buf + n, cand_before);
    n = k;
  }
  if (n < k) return -std::numeric_limits<float>::infinity();
  float t = std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) t = std::min(t, buf[i].v);
  return t;
}

// Adds the entries of a score row (keys k0 .. k0 + width, width a multiple of 16) above the
// running threshold to the candidate buffer (2k long); -inf (masked) entries never enter.
inline void top_scan(const float* row, int64_t width, int64_t k0, Cand* buf, int64_t& n, float& thr, int64_t k) {
  for (int64_t j = 0; j < width; j += simd::kLanes) {
    uint32_t m = simd::mask_gt(simd::load(row + j), thr);
    while (m) {
      const int l = __builtin_ctz(m);
      m &= m - 1;
      const float v = row[j + l];
      if (!(v > thr)) continue;  // the threshold rose within this vector
      buf[n++] = Cand{v, static_cast<int32_t>(k0 + j + l)};
      if (n == 2 * k) thr = top_compact(buf, n, k);
    }
  }
}

}  // namespace clattn
