// Grouping of queries for the approximate attentions: LSH bit codes, Hamming k-means on them,
// and a counting sort that turns an assignment into contiguous cluster segments.
// All randomness comes from a counter-based Rng, so every result is a pure function of
// (seed, stream, inputs).
#pragma once

#include <cstdint>
#include <vector>

#include "clattn/tensor.h"

#include "clattn/rng.h"

namespace clattn::cluster {

inline constexpr int kMaxBits = 64;

// Random hyperplanes for LSH: planes a_b ~ N(0, I_D) and thresholds t_b ~ N(0, 1) (0 when
// !hash_bias), b < bits, drawn from (stream, 0 ..) of rng. Stored as one (D, 64) panel for the
// tile microkernel, unused columns zero with threshold +inf so their bits stay 0.
struct LshPlanes {
  int bits = 0;
  int64_t D = 0;
  std::vector<float> panel;       // (D, 64): panel[e * 64 + b] = a_b[e]
  std::vector<float> thresholds;  // (64)
};
LshPlanes draw_planes(const Rng& rng, uint64_t stream, int bits, int64_t D, bool hash_bias);

// codes[i] bit b = (x_i · a_b > t_b) for rows x (n, D) with row stride ld: one tile product per
// block of rows, then the comparisons packed into uint64. scratch holds kHashBlock · 64 floats.
inline constexpr int64_t kHashBlock = 256;
void hash_codes(const float* x, int64_t n, int64_t ld, const LshPlanes& planes, uint64_t* codes,
                float* scratch);

// Hamming k-means (docs/design.md, clustered step 2). Returns the number of clusters used, C_eff =
// min(C, distinct codes); assign (n) gets ids in [0, C_eff), centroids (C_eff) the final centroid
// codes. Initial centroids are C_eff distinct code values drawn with rng(stream, ..); each round
// assigns to the nearest centroid (popcount of XOR, first minimum wins) and re-votes each bit by
// majority of the members (a tie keeps the old bit); an empty cluster takes the code of the
// member farthest from its centroid. A final assignment follows the last round.
struct KMeansScratch {
  std::vector<uint64_t> sorted;   // distinct-code hash set (values)
  std::vector<char> used;         // distinct-code hash set (occupied)
  std::vector<int32_t> prev;      // (n) previous round's assignment
  std::vector<uint32_t> counts;   // (C, 64) bit votes; (T, C, 64) when the rounds are split over T threads
  std::vector<int64_t> sizes;     // (C); (T, C) when split
  std::vector<uint32_t> dist;     // (n) distance to own centroid
  std::vector<int64_t> pick;      // (n) init draw
  size_t bytes() const { return held_bytes(sorted, used, prev, counts, sizes, dist, pick); }
};
int64_t hamming_kmeans(const uint64_t* codes, int64_t n, int64_t C, int iterations,
                       const Rng& rng, uint64_t stream, int32_t* assign, uint64_t* centroids,
                       KMeansScratch& ws);

// The same k-means written plainly (every round scans every centroid, no early stop): the tests
// hold hamming_kmeans to it.
int64_t hamming_kmeans_ref(const uint64_t* codes, int64_t n, int64_t C, int iterations,
                           const Rng& rng, uint64_t stream, int32_t* assign, uint64_t* centroids);

// Nearest centroid for each code (first minimum wins); AVX-512 VPOPCNTDQ when the target has it.
// dist (n) may be null.
void assign_nearest(const uint64_t* codes, int64_t n, const uint64_t* centroids, int64_t C,
                    int32_t* assign, uint32_t* dist);
// Plain loop version of assign_nearest for the tests.
void assign_nearest_ref(const uint64_t* codes, int64_t n, const uint64_t* centroids, int64_t C,
                        int32_t* assign, uint32_t* dist);

// Counting sort by cluster: order (n) lists the members of cluster 0, then 1, ...(each in
// increasing index); offsets (C + 1) delimit the segments. O(n + C).
void counting_sort(const int32_t* assign, int64_t n, int64_t C, int32_t* order, int32_t* offsets);

// Stable sort of indices 0..n-1 by a float key (LSD radix, 3 passes of 11 bits): O(n), so sorting
// every round of SMYRF grows linearly with the sequence. order (n) gets the indices; equal keys
// keep increasing index order. scratch is resized as needed.
struct RadixScratch {
  std::vector<uint32_t> keys, keys2, count;
  std::vector<int32_t> idx2, idx3;
};
void sort_by_key(const float* key, int64_t n, int32_t* order, RadixScratch& ws);

}  // namespace clattn::cluster
