// Streaming top-k selection over rows of scores that arrive tile by tile: a candidate buffer of
// 2k entries per row and a threshold (the k-th best so far) that filters whole vectors at once, so
// after the first few tiles almost nothing is inserted. Used by improved-clustered (each
// centroid's keys) and topk (each query's keys). Ties go to the lower key index.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>

#include "core/simd.h"

namespace clattn {

struct Cand {  // a top-k candidate: score (log2 units) and key index
  float v;
  int32_t i;
};

inline bool cand_before(const Cand& a, const Cand& b) { return a.v > b.v || (a.v == b.v && a.i < b.i); }

// cand_before as one unsigned key, larger = better: the value's bits in unsigned order (-0 mapped
// to +0, so the two tie as in cand_before), then the complemented index (the lower index wins a
// tie). Candidates never hold NaN: top_scan only admits values above a threshold.
inline uint64_t cand_key(Cand c) {
  const uint32_t b = std::bit_cast<uint32_t>(c.v + 0.f);
  const uint32_t o = b ^ (static_cast<uint32_t>(static_cast<int32_t>(b) >> 31) | 0x80000000u);
  return (static_cast<uint64_t>(o) << 32) | static_cast<uint32_t>(~c.i);
}
inline Cand key_cand(uint64_t key) {
  const uint32_t o = static_cast<uint32_t>(key >> 32);
  const uint32_t b = o ^ ((o >> 31) ? 0x80000000u : 0xFFFFFFFFu);
  return Cand{std::bit_cast<float>(b), static_cast<int32_t>(~static_cast<uint32_t>(key))};
}

// Moves the k largest of a[0, n) (distinct keys) to a[0, k), in no particular order. Quickselect
// with a median-of-3 pivot and a branch-free partition into two streams (above the pivot in
// place, the rest into tmp (n)): such a pivot splits about half the time either way, so a
// branchy partition mispredicts about every other comparison, and an in-place branch-free one
// waits on a store-to-load forwarding per element.
inline void select_largest(uint64_t* a, int64_t n, int64_t k, uint64_t* tmp) {
  while (n > k) {
    if (n <= 8) {  // a partial selection sort: k passes over at most 8
      for (int64_t p = 0; p < k; ++p) {
        int64_t best = p;
        for (int64_t i = p + 1; i < n; ++i) best = a[i] > a[best] ? i : best;
        std::swap(a[p], a[best]);
      }
      return;
    }
    const uint64_t x = a[0], y = a[n / 2], z = a[n - 1];
    const uint64_t pivot = std::max(std::min(x, y), std::min(std::max(x, y), z));
    // The pivot is one of the keys and the largest of the three lies above it: each round
    // removes at least one key.
    int64_t g = 0, l = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t v = a[i];
      const bool above = v > pivot;
      a[g] = v;  // g <= i: never a slot still to be read
      tmp[l] = v;
      g += above;
      l += !above;
    }
    if (g >= k) {
      n = g;
    } else {  // keep a[0, g); the k - g largest of the rest remain to be found
      std::copy(tmp, tmp + l, a + g);
      a += g;
      n -= g;
      k -= g;
    }
  }
}

// Moves the k best of a[0, n) (cand_before's order) to a[0, k), in no particular order.
inline void select_best(Cand* a, int64_t n, int64_t k) {
  constexpr int64_t kStack = 256;  // 2k for k <= 128 on the stack; larger k through nth_element
  if (n > kStack) {
    std::nth_element(a, a + (k - 1), a + n, cand_before);
    return;
  }
  uint64_t key[kStack], tmp[kStack];
  for (int64_t i = 0; i < n; ++i) key[i] = cand_key(a[i]);
  select_largest(key, n, k, tmp);
  for (int64_t i = 0; i < k; ++i) a[i] = key_cand(key[i]);
}

// Keeps the k best of buf[0, n) (by value, lower key index on ties); returns the worst kept value
// once k are held (the filter threshold), else -inf.
inline float top_compact(Cand* buf, int64_t& n, int64_t k) {
  if (n > k) {
    select_best(buf, n, k);
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
