// Grouping of queries for the approximate attentions: LSH bit codes, Hamming k-means on them,
// and a counting sort that turns an assignment into contiguous cluster segments.
// All randomness comes from a counter-based Rng, so every result is a pure function of
// (seed, stream, inputs).
#pragma once

#include <cstdint>
#include <span>
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
//
// The same k-means runs on a sequence split over ranks (src/attention/clustered/split_kmeans.cpp): each rank
// holds some codes of each problem and the peers hooks below combine what the ranks computed, so
// every rank ends with the clusters one process gets on the whole sequence.

// The partial Fisher-Yates shuffle of positions 0..n-1 that draws the initial centroids: draw t
// swaps entries t and t + rng.below(n - t, stream, t) and yields entry t. Only displaced entries
// are stored (open addressing), so drawing from a sequence split over ranks costs the draws made,
// not the sequence's length.
class SparseShuffle {
 public:
  void reset(int64_t n);
  int64_t drawn() const { return t_; }
  int64_t next(const Rng& rng, uint64_t stream);  // requires drawn() < n
  size_t bytes() const { return held_bytes(keys_, vals_); }

 private:
  int64_t& entry(int64_t x);  // entry x, inserted as x when absent; never grows the table
  std::vector<int64_t> keys_, vals_;  // (cap) displaced entries; key -1: free slot
  int64_t n_ = 0, t_ = 0, filled_ = 0;
};

// One k-means problem (the valid queries of one (batch, head)): this rank holds codes at global
// positions [first, first + n) of the `total` over all ranks (first 0 and total n in one process).
// Votes are 32-bit counts, so total < 2^31 (checked).
struct KMeansProblem {
  const uint64_t* codes = nullptr;  // (n)
  int64_t n = 0, first = 0, total = 0;
  uint64_t stream = 0;              // rng stream of the initial draws
  int32_t* assign = nullptr;        // (n) out: cluster ids in [0, clusters)
  uint64_t* centroids = nullptr;    // (C) out: the first `clusters` are the final centroid codes
  int64_t clusters = 0;             // out: C_eff
};

// The ranks that hold the other codes of each problem, as k-means sees them. Every rank calls each
// hook in the same order with the same sizes. This base class is one process: nothing to combine.
class KMeansPeers {
 public:
  virtual ~KMeansPeers() = default;
  virtual int rank() const { return 0; }
  virtual int size() const { return 1; }
  // x (n): the sum over ranks, in place.
  virtual void sum(int64_t* /*x*/, size_t /*n*/) {}
  // x (n) vote counts: the sum over ranks, in place; every sum is at most a problem's total.
  virtual void sum_counts(uint32_t* /*x*/, size_t /*n*/) {}
  // A round's vote. votes (problems, C, 65): each problem's bit counts (C, 64) then sizes (C) of
  // this rank's members; codes (problems, C) the centroids. Leaves each code the majority of every
  // rank's members (majority_code) and each size the members over all ranks; the bit counts are
  // then unspecified. By default: sum_counts over all the votes, then the majority of the sums.
  virtual void vote(uint32_t* votes, uint64_t* codes, size_t problems, int64_t C);
  // all (size(), n): every rank's `mine` (n), rank r's at r·n.
  virtual void gather(const int64_t* mine, size_t n, int64_t* all);
  // Candidates each rank sends per exchange when re-seeding empty clusters (the clusters never
  // depend on it).
  virtual int64_t reseed_batch() const { return 64; }
};

// A centroid's new code from its members: bit b set when more than half of the `size` members
// have it (counts[b] of them), cleared when fewer, kept on a tie (and when the cluster is empty).
inline uint64_t majority_code(const uint32_t* counts, uint32_t size, uint64_t code) {
  for (int b = 0; b < 64; ++b) {
    const uint64_t twice = 2 * uint64_t{counts[b]};
    if (twice > size) code |= uint64_t{1} << b;
    else if (twice < size) code &= ~(uint64_t{1} << b);
  }
  return code;
}

// Rows [i0, i0 + rows) of live problem a in a k-means round; its votes go to slot `slot`.
struct KMeansBlock {
  size_t a;
  int64_t i0, rows;
  size_t slot;
};

struct KMeansScratch {
  std::vector<char> open;          // (P) past the distinct-code stage: drawn for, then in rounds
  std::vector<size_t> live;        // problems still drawing, then still in rounds
  std::vector<int64_t> flags;      // (live) draws made in a batch, then whether the assignment changed
  std::vector<int64_t> changed;    // (blocks) whether the assignment changed
  std::vector<KMeansBlock> blocks;
  std::vector<uint64_t> set;       // distinct-code hash set (values), then the union over ranks
  std::vector<char> used;          // distinct-code hash set (occupied)
  std::vector<int64_t> off;        // (P + 1) each problem's first row in prev, dist and pick
  std::vector<int32_t> prev;       // (Σn) previous round's assignment
  std::vector<uint32_t> dist;      // (Σn) distance to own centroid
  std::vector<uint32_t> votes;     // (slots, C, 65) bit counts (C, 64) then sizes (C); a slot per
                                   // live problem, then one per extra block of rows
  std::vector<uint64_t> codes;     // (live, C) the live problems' centroids, for the vote
  std::vector<int64_t> pick;       // (Σn) members farthest first, for re-seeding
  std::vector<int64_t> mine, all;  // what the peers hooks send, and (ranks, ..) what they gather
  std::vector<SparseShuffle> draws;  // (P) initial draws
  size_t bytes() const {
    size_t b = held_bytes(open, live, flags, changed, blocks, set, used, off, prev, dist, votes, codes, pick, mine, all);
    for (const SparseShuffle& d : draws) b += d.bytes();
    return b;
  }
};

// All problems at once, every round of each in one step of every rank: one exchange per round for
// all of them. With one problem and no peers, its rounds split their rows over the team when called
// outside a parallel region; the result never depends on the threads.
void hamming_kmeans(std::span<KMeansProblem> problems, int64_t C, int iterations, const Rng& rng,
                    KMeansPeers& peers, KMeansScratch& ws);
// One problem in one process; returns C_eff.
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
