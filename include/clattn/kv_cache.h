// KVCache: keys and values of the positions decoded so far, kept in the layouts the kernels read,
// so a decode step appends one row per (batch, kv head) and reads the cache without repacking it.
//
//   krow (B, Hkv, capacity, Dkp)          K rows, Dkp = Dk rounded up to 16 (zero padding)
//   kpan (B, Hkv, capacity/64, Dk, 64)    K again, transposed in panels of 64 keys: the operand
//                                         of full attention's S = Q·Kᵀ microkernel
//   vrow (B, Hkv, capacity, Dvp)          V rows: the operand of O += P·V
//
// keys() and values() are strided views (B, Hkv, size, Dk) / (B, Hkv, size, Dv) over krow and
// vrow that every variant reads as ordinary inputs; full (and conditional-full's full path) reads
// kpan and vrow directly, so its decode step costs O(M·D) reads and no copy. K is held twice
// (rows and panels): 1.5x the memory of a plain cache, for a decode step with no O(M·D) repack.
//
// Use: set in.k = cache.keys(), in.v = cache.values(), in.cache = &cache. A cache is for
// inference: backward refuses inputs that name one.
#pragma once

#include <cstdint>

#include "clattn/tensor.h"

namespace clattn {

class KVCache {
 public:
  KVCache() = default;
  // Allocates (and zero-fills) room for `capacity` positions, rounded up to a multiple of 64.
  KVCache(int64_t batch, int64_t kv_heads, int64_t capacity, int64_t dk, int64_t dv);

  // Appends T positions for every batch row: k (B, Hkv, T, Dk), v (B, Hkv, T, Dv), any strides
  // with a unit last one. Throws (naming the sizes) when they do not match or would overflow the
  // capacity, or when a value is not finite; the cache is unchanged then.
  void append(ConstView k, ConstView v);
  // Forgets every position (keeps the memory): the next append starts at position 0.
  void clear() { size_ = 0; }
  // Keeps the first n positions (n <= size()): rewinds a speculative or beam step.
  void truncate(int64_t n);

  int64_t size() const { return size_; }
  int64_t capacity() const { return cap_; }
  int64_t batch() const { return B_; }
  int64_t kv_heads() const { return Hkv_; }
  int64_t dk() const { return Dk_; }
  int64_t dv() const { return Dv_; }
  size_t bytes() const;

  ConstView keys() const;    // (B, Hkv, size, Dk)
  ConstView values() const;  // (B, Hkv, size, Dv)
  // Panels of (b, hk): ceil(size/64) panels of (Dk, 64); columns past size are zero.
  const float* key_panels(int64_t b, int64_t hk) const;
  // Rows of (b, hk): (size, value_ld()), columns past Dv zero.
  const float* value_rows(int64_t b, int64_t hk) const;
  int64_t value_ld() const { return Dvp_; }

 private:
  int64_t B_ = 0, Hkv_ = 0, cap_ = 0, Dk_ = 0, Dv_ = 0, Dkp_ = 0, Dvp_ = 0, size_ = 0;
  Tensor krow_, kpan_, vrow_;
};

}  // namespace clattn
