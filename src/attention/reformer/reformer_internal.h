// The partition helpers shared by reformer.cpp (the kernels) and reformer_ref.cpp (the double
// reference): the bucket factorisation, the rotation entries, and the keys of a chunk.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "attention/reformer/reformer.h"
#include "clattn/rng.h"

namespace clattn::reformer_parts {

// (f1, f2) with f1·f2 = buckets, both even, f1 the even divisor nearest sqrt(buckets); (b, 1)
// at or below 128 buckets (no factorisation).
inline std::pair<int64_t, int64_t> factorise(int64_t buckets) {
  if (buckets <= 128) return {buckets, 1};
  int64_t best = 0;
  for (int64_t f = 2; f * f <= buckets; f += 2)
    if (buckets % f == 0 && (buckets / f) % 2 == 0) best = f;
  return {best, best ? buckets / best : 0};
}

// Members of chunk c: a prefix of perm[c·ch, (c+1)·ch) (the rest is causal padding, -1). len is
// the length of perm (N, or the padded length with causal).
inline int64_t chunk_len(const int32_t* perm, int64_t len, int64_t ch, int64_t c) {
  int64_t n = std::min(ch, len - c * ch);
  while (n > 0 && perm[c * ch + n - 1] < 0) --n;
  return n;
}

// The chunk whose keys chunk c attends besides its own, or -1: the one before it, the first
// wrapping to the last; with causal (cbucket given) the one before it only in the same bucket.
inline int64_t prev_chunk(int64_t c, int64_t nch, const int32_t* cbucket) {
  if (cbucket) return c > 0 && cbucket[c - 1] == cbucket[c] ? c - 1 : -1;
  if (nch == 1) return -1;
  return c == 0 ? nch - 1 : c - 1;
}

// Keys of chunk c (positions), in perm order: chunk c then its previous chunk (not repeated
// when there is a single chunk). The reference's statement of the partition.
inline int64_t chunk_keys(const int32_t* perm, int64_t len, int64_t nch, int64_t ch, int64_t c,
                   const int32_t* cbucket, std::vector<int32_t>& keys) {
  keys.assign(perm + c * ch, perm + c * ch + chunk_len(perm, len, ch, c));
  const int64_t pc = prev_chunk(c, nch, cbucket);
  if (pc >= 0) keys.insert(keys.end(), perm + pc * ch, perm + pc * ch + chunk_len(perm, len, ch, pc));
  return static_cast<int64_t>(keys.size());
}

// Entry (e, u) of round r's rotation (D, nrot): the first f1/2 columns hash b1, the rest b2.
inline float rotation(const ReformerParams& p, uint64_t step, int64_t D, int64_t nrot, int64_t r, int64_t e,
               int64_t u) {
  return Rng(p.seed).normal(step, static_cast<uint64_t>((r * D + e) * nrot + u));
}

}  // namespace clattn::reformer_parts
