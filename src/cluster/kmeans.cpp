// Hamming k-means on LSH codes and the counting sort by cluster.
// Differences from the reference (fast-transformers): initial centroids are distinct code values
// (it draws positions, which on real models duplicated centroids and left up to half the
// clusters empty); empty clusters are re-seeded; every draw is seeded; C > n is allowed.
#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <numeric>

#include "clattn/error.h"
#include "cluster/cluster.h"

#if defined(__AVX512F__) && defined(__AVX512VPOPCNTDQ__)
#include <immintrin.h>
#define CLATTN_VPOPCNT 1
#endif
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace clattn::cluster {

void assign_nearest_ref(const uint64_t* codes, int64_t n, const uint64_t* centroids, int64_t C,
                        int32_t* assign, uint32_t* dist) {
  for (int64_t i = 0; i < n; ++i) {
    int best = std::numeric_limits<int>::max();
    int32_t arg = 0;
    for (int64_t c = 0; c < C; ++c) {
      const int d = std::popcount(codes[i] ^ centroids[c]);
      if (d < best) {
        best = d;
        arg = static_cast<int32_t>(c);
      }
    }
    assign[i] = arg;
    if (dist) dist[i] = static_cast<uint32_t>(best);
  }
}

#if defined(CLATTN_VPOPCNT)
typedef unsigned long long u64x8 __attribute__((vector_size(64)));
typedef unsigned long long u64x4 __attribute__((vector_size(32)));
typedef unsigned long long u64x2 __attribute__((vector_size(16)));
// Horizontal unsigned min in registers (storing the lanes to an array made GCC spill the
// accumulators of the hot loop to the stack on every iteration).
inline uint64_t hmin_u64(u64x8 v) {
  const u64x4 a = __builtin_shufflevector(v, v, 0, 1, 2, 3), b = __builtin_shufflevector(v, v, 4, 5, 6, 7);
  const u64x4 m = a < b ? a : b;
  const u64x2 c = __builtin_shufflevector(m, m, 0, 1), d = __builtin_shufflevector(m, m, 2, 3);
  const u64x2 e = c < d ? c : d;
  return e[0] < e[1] ? e[0] : e[1];
}
#endif

void assign_nearest(const uint64_t* codes, int64_t n, const uint64_t* centroids, int64_t C,
                    int32_t* assign, uint32_t* dist) {
#if defined(CLATTN_VPOPCNT)
  // Key = distance << 32 | centroid index: one unsigned min keeps the nearest centroid and, among
  // equally near ones, the first. Several codes per pass share each centroid load.
  constexpr int kCodes = 8;
  const __m512i lane = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  for (int64_t i = 0; i < n; i += kCodes) {
    const int cnt = static_cast<int>(std::min<int64_t>(kCodes, n - i));
    __m512i x[kCodes], best[kCodes];
#pragma GCC unroll 8
    for (int u = 0; u < kCodes; ++u) {
      x[u] = _mm512_set1_epi64(static_cast<long long>(codes[i + std::min(u, cnt - 1)]));
      best[u] = _mm512_set1_epi64(-1);
    }
    for (int64_t c0 = 0; c0 < C; c0 += 8) {
      const __mmask8 m = C - c0 >= 8 ? static_cast<__mmask8>(0xFF)
                                     : static_cast<__mmask8>((1u << (C - c0)) - 1u);
      const __m512i cv = _mm512_maskz_loadu_epi64(m, centroids + c0);
      const u64x8 idx = (u64x8)lane + static_cast<unsigned long long>(c0);
#pragma GCC unroll 8
      for (int u = 0; u < kCodes; ++u) {
        // Vector-extension shift and or: the unmasked shift intrinsic trips GCC 12's
        // -Wmaybe-uninitialized.
        const __m512i key = (__m512i)(((u64x8)_mm512_popcnt_epi64(cv ^ x[u]) << 32) | idx);
        best[u] = _mm512_mask_min_epu64(best[u], m, best[u], key);
      }
    }
    uint64_t res[kCodes];
#pragma GCC unroll 8
    for (int u = 0; u < kCodes; ++u) res[u] = hmin_u64((u64x8)best[u]);  // constant trip count keeps best[] in registers
    for (int u = 0; u < cnt; ++u) {
      const uint64_t b = res[u];
      assign[i + u] = static_cast<int32_t>(b & 0xFFFFFFFFu);
      if (dist) dist[i + u] = static_cast<uint32_t>(b >> 32);
    }
  }
#else
  assign_nearest_ref(codes, n, centroids, C, assign, dist);
#endif
}

namespace {

// counts (C, 64) += bits of each member's code.
void count_bits(const uint64_t* codes, const int32_t* assign, int64_t n, uint32_t* counts,
                int64_t* sizes) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t* cnt = counts + static_cast<int64_t>(assign[i]) * 64;
    ++sizes[assign[i]];
#if defined(__AVX512F__)
    const __m512i one = _mm512_set1_epi32(1);
    for (int q = 0; q < 4; ++q) {
      const __mmask16 m = static_cast<__mmask16>(codes[i] >> (16 * q));
      __m512i v = _mm512_loadu_si512(cnt + 16 * q);
      _mm512_storeu_si512(cnt + 16 * q, _mm512_mask_add_epi32(v, m, v, one));
    }
#else
    for (uint64_t x = codes[i]; x; x &= x - 1) ++cnt[std::countr_zero(x)];
#endif
  }
}

}  // namespace

int64_t hamming_kmeans(const uint64_t* codes, int64_t n, int64_t C, int iterations,
                       const Rng& rng, uint64_t stream, int32_t* assign, uint64_t* centroids,
                       KMeansScratch& ws) {
  check(C >= 1, "hamming k-means: clusters must be >= 1, got ", C);
  check(iterations >= 0, "hamming k-means: iterations must be >= 0, got ", iterations);
  if (n == 0) return 0;
  // Distinct code values: with no more of them than C, each is its own cluster. An open-address
  // set counts them and stops as soon as C + 1 are seen (the usual case, after a few hundred).
  {
    size_t cap = 16;
    while (cap < static_cast<size_t>(4 * std::min<int64_t>(C + 1, n))) cap *= 2;
    ws.sorted.assign(cap, 0);
    std::vector<char>& used = ws.used;
    used.assign(cap, 0);
    int64_t distinct = 0;
    for (int64_t i = 0; i < n && distinct <= C; ++i) {
      size_t h = static_cast<size_t>((codes[i] * 0x9E3779B97F4A7C15ull) >> 32) & (cap - 1);
      while (used[h] && ws.sorted[h] != codes[i]) h = (h + 1) & (cap - 1);
      if (!used[h]) {
        used[h] = 1;
        ws.sorted[h] = codes[i];
        ++distinct;
      }
    }
    if (distinct <= C) {
      int64_t u = 0;
      for (size_t h = 0; h < cap; ++h)
        if (used[h]) centroids[u++] = ws.sorted[h];
      std::sort(centroids, centroids + u);
      for (int64_t i = 0; i < n; ++i)
        assign[i] = static_cast<int32_t>(std::lower_bound(centroids, centroids + u, codes[i]) - centroids);
      return distinct;
    }
  }
  // C distinct code values, drawn by a seeded partial Fisher-Yates over the positions.
  ws.pick.resize(static_cast<size_t>(n));
  std::iota(ws.pick.begin(), ws.pick.end(), int64_t{0});
  int64_t chosen = 0;
  for (int64_t t = 0; t < n && chosen < C; ++t) {
    const int64_t j = t + static_cast<int64_t>(rng.below(static_cast<uint64_t>(n - t), stream,
                                                         static_cast<uint64_t>(t)));
    std::swap(ws.pick[static_cast<size_t>(t)], ws.pick[static_cast<size_t>(j)]);
    const uint64_t code = codes[ws.pick[static_cast<size_t>(t)]];
    if (std::find(centroids, centroids + chosen, code) == centroids + chosen) centroids[chosen++] = code;
  }

  ws.counts.resize(static_cast<size_t>(C * 64));
  ws.sizes.resize(static_cast<size_t>(C));
  ws.dist.resize(static_cast<size_t>(n));
  ws.prev.assign(static_cast<size_t>(n), -1);
  for (int it = 0; it < iterations; ++it) {
    assign_nearest(codes, n, centroids, C, assign, ws.dist.data());
    // Same assignment as the round before: the update would reproduce the same centroids (same
    // votes, same ties, same re-seeding), so every later round is identical. Stop early.
    if (std::equal(assign, assign + n, ws.prev.begin())) return C;
    std::copy(assign, assign + n, ws.prev.begin());
    std::fill(ws.counts.begin(), ws.counts.end(), 0u);
    std::fill(ws.sizes.begin(), ws.sizes.end(), int64_t{0});
    count_bits(codes, assign, n, ws.counts.data(), ws.sizes.data());
    int64_t empty = 0;
    for (int64_t c = 0; c < C; ++c) {
      const int64_t size = ws.sizes[static_cast<size_t>(c)];
      if (size == 0) {
        ++empty;
        continue;
      }
      uint64_t code = centroids[c];
      for (int b = 0; b < 64; ++b) {
        const int64_t twice = 2 * static_cast<int64_t>(ws.counts[static_cast<size_t>(c * 64 + b)]);
        if (twice > size) code |= uint64_t{1} << b;
        else if (twice < size) code &= ~(uint64_t{1} << b);
      }
      centroids[c] = code;
    }
    if (empty == 0) continue;
    // Empty clusters take the codes of the members farthest from their centroids (farthest
    // first, lower index on ties), skipping codes some centroid already holds.
    ws.pick.resize(static_cast<size_t>(n));
    std::iota(ws.pick.begin(), ws.pick.end(), int64_t{0});
    std::stable_sort(ws.pick.begin(), ws.pick.end(), [&](int64_t a, int64_t b) {
      return ws.dist[static_cast<size_t>(a)] > ws.dist[static_cast<size_t>(b)];
    });
    size_t next = 0;
    for (int64_t c = 0; c < C; ++c) {
      if (ws.sizes[static_cast<size_t>(c)] != 0) continue;
      while (next < ws.pick.size() &&
             std::find(centroids, centroids + C, codes[ws.pick[next]]) != centroids + C)
        ++next;
      if (next < ws.pick.size()) centroids[c] = codes[ws.pick[next++]];
    }
  }
  assign_nearest(codes, n, centroids, C, assign, nullptr);
  return C;
}

int64_t hamming_kmeans_ref(const uint64_t* codes, int64_t n, int64_t C, int iterations,
                           const Rng& rng, uint64_t stream, int32_t* assign, uint64_t* centroids) {
  if (n == 0) return 0;
  std::vector<uint64_t> distinct(codes, codes + n);
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  if (static_cast<int64_t>(distinct.size()) <= C) {
    std::copy(distinct.begin(), distinct.end(), centroids);
    for (int64_t i = 0; i < n; ++i)
      assign[i] = static_cast<int32_t>(std::lower_bound(distinct.begin(), distinct.end(), codes[i]) - distinct.begin());
    return static_cast<int64_t>(distinct.size());
  }
  std::vector<int64_t> pick(static_cast<size_t>(n));
  std::iota(pick.begin(), pick.end(), int64_t{0});
  int64_t chosen = 0;
  for (int64_t t = 0; t < n && chosen < C; ++t) {
    const int64_t j = t + static_cast<int64_t>(rng.below(static_cast<uint64_t>(n - t), stream, static_cast<uint64_t>(t)));
    std::swap(pick[static_cast<size_t>(t)], pick[static_cast<size_t>(j)]);
    const uint64_t code = codes[pick[static_cast<size_t>(t)]];
    if (std::find(centroids, centroids + chosen, code) == centroids + chosen) centroids[chosen++] = code;
  }
  std::vector<uint32_t> dist(static_cast<size_t>(n));
  for (int it = 0; it < iterations; ++it) {
    assign_nearest_ref(codes, n, centroids, C, assign, dist.data());
    std::vector<int64_t> size(static_cast<size_t>(C), 0), ones(static_cast<size_t>(C * 64), 0);
    for (int64_t i = 0; i < n; ++i) {
      ++size[static_cast<size_t>(assign[i])];
      for (int b = 0; b < 64; ++b) ones[static_cast<size_t>(assign[i] * 64 + b)] += (codes[i] >> b) & 1;
    }
    for (int64_t c = 0; c < C; ++c)
      for (int b = 0; b < 64 && size[static_cast<size_t>(c)] > 0; ++b) {
        const int64_t twice = 2 * ones[static_cast<size_t>(c * 64 + b)], sz = size[static_cast<size_t>(c)];
        if (twice > sz) centroids[c] |= uint64_t{1} << b;
        if (twice < sz) centroids[c] &= ~(uint64_t{1} << b);
      }
    std::vector<int64_t> far(static_cast<size_t>(n));
    std::iota(far.begin(), far.end(), int64_t{0});
    std::stable_sort(far.begin(), far.end(), [&](int64_t a, int64_t b) { return dist[static_cast<size_t>(a)] > dist[static_cast<size_t>(b)]; });
    size_t next = 0;
    for (int64_t c = 0; c < C; ++c) {
      if (size[static_cast<size_t>(c)] != 0) continue;
      while (next < far.size() && std::find(centroids, centroids + C, codes[far[next]]) != centroids + C) ++next;
      if (next < far.size()) centroids[c] = codes[far[next++]];
    }
  }
  assign_nearest_ref(codes, n, centroids, C, assign, nullptr);
  return C;
}

void counting_sort(const int32_t* assign, int64_t n, int64_t C, int32_t* order, int32_t* offsets) {
  std::fill(offsets, offsets + C + 1, 0);
  for (int64_t i = 0; i < n; ++i) ++offsets[assign[i] + 1];
  for (int64_t c = 0; c < C; ++c) offsets[c + 1] += offsets[c];
  // Place members using a running cursor per cluster (offsets[c] advanced, then restored).
  for (int64_t i = 0; i < n; ++i) order[offsets[assign[i]]++] = static_cast<int32_t>(i);
  for (int64_t c = C; c > 0; --c) offsets[c] = offsets[c - 1];
  offsets[0] = 0;
}

}  // namespace clattn::cluster
