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

#include "clattn/cpu.h"
#include "clattn/parallel.h"

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

// The vector kernels of k-means are compiled once per ISA (kmeans_isa.cpp), like the tiles.
namespace avx2 {
void assign_nearest_isa(const uint64_t*, int64_t, const uint64_t*, int64_t, int32_t*, uint32_t*);
void count_bits_isa(const uint64_t*, const int32_t*, int64_t, uint32_t*, int64_t*);
}  // namespace avx2
namespace avx512 {
void assign_nearest_isa(const uint64_t*, int64_t, const uint64_t*, int64_t, int32_t*, uint32_t*);
void count_bits_isa(const uint64_t*, const int32_t*, int64_t, uint32_t*, int64_t*);
}  // namespace avx512

namespace {
bool use_avx512() {
#if defined(CLATTN_HAVE_AVX512_KERNELS)
  static const bool on = active_isa() == Isa::avx512;
  return on;
#else
  return false;
#endif
}
}  // namespace

void assign_nearest(const uint64_t* codes, int64_t n, const uint64_t* centroids, int64_t C,
                    int32_t* assign, uint32_t* dist) {
#if defined(CLATTN_HAVE_AVX512_KERNELS)
  if (use_avx512()) return avx512::assign_nearest_isa(codes, n, centroids, C, assign, dist);
  avx2::assign_nearest_isa(codes, n, centroids, C, assign, dist);
#else
  assign_nearest_ref(codes, n, centroids, C, assign, dist);
#endif
}

namespace {

// counts (C, 64) += bits of each member's code.
void count_bits(const uint64_t* codes, const int32_t* assign, int64_t n, uint32_t* counts,
                int64_t* sizes) {
#if defined(CLATTN_HAVE_AVX512_KERNELS)
  if (use_avx512()) return avx512::count_bits_isa(codes, assign, n, counts, sizes);
  avx2::count_bits_isa(codes, assign, n, counts, sizes);
#else
  for (int64_t i = 0; i < n; ++i) {
    uint32_t* cnt = counts + static_cast<int64_t>(assign[i]) * 64;
    ++sizes[assign[i]];
    for (uint64_t x = codes[i]; x; x &= x - 1) ++cnt[std::countr_zero(x)];
  }
#endif
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

  // Called outside a parallel region (one head on the whole team), each round's assignment and
  // vote count run over blocks of codes on every thread: rows are independent and the votes are
  // integers summed after, so the clusters equal the single-thread ones exactly.
  const int64_t T = n * C >= (int64_t{1} << 18) && team_size() == 1 ? std::min<int64_t>(max_threads(), n / 256 + 1) : 1;
  ws.counts.resize(static_cast<size_t>(T * C * 64));
  ws.sizes.resize(static_cast<size_t>(T * C));
  ws.dist.resize(static_cast<size_t>(n));
  ws.prev.assign(static_cast<size_t>(n), -1);
  // fn(x, first row, rows) for the T blocks of codes: over the team, or inline when T is 1.
  auto blocks = [&](auto&& fn) {
    auto one = [&](int64_t x, int) { fn(x, x * n / T, (x + 1) * n / T - x * n / T); };
    split_for(T > 1, T, thread_id(), one);
  };
  for (int it = 0; it < iterations; ++it) {
    blocks([&](int64_t, int64_t i0, int64_t rows) {
      assign_nearest(codes + i0, rows, centroids, C, assign + i0, ws.dist.data() + i0);
    });
    // Same assignment as the round before: the update would reproduce the same centroids (same
    // votes, same ties, same re-seeding), so every later round is identical. Stop early.
    if (std::equal(assign, assign + n, ws.prev.begin())) return C;
    std::copy(assign, assign + n, ws.prev.begin());
    std::fill(ws.counts.begin(), ws.counts.end(), 0u);
    std::fill(ws.sizes.begin(), ws.sizes.end(), int64_t{0});
    blocks([&](int64_t x, int64_t i0, int64_t rows) {
      count_bits(codes + i0, assign + i0, rows, ws.counts.data() + x * C * 64, ws.sizes.data() + x * C);
    });
    for (int64_t x = 1; x < T; ++x) {
      for (int64_t i = 0; i < C * 64; ++i) ws.counts[static_cast<size_t>(i)] += ws.counts[static_cast<size_t>(x * C * 64 + i)];
      for (int64_t i = 0; i < C; ++i) ws.sizes[static_cast<size_t>(i)] += ws.sizes[static_cast<size_t>(x * C + i)];
    }
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
  blocks([&](int64_t, int64_t i0, int64_t rows) { assign_nearest(codes + i0, rows, centroids, C, assign + i0, nullptr); });
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
