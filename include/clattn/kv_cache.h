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
//   qrow (B, H, capacity, Dkp)            optional: the queries too, for attentions whose prefix
//                                         part is made of earlier queries (causal clustered: its
//                                         centroids), so decoding computes what a prefill does
//
// 16-bit storage (KVCacheType f16 or bf16) keeps kpan and vrow as f16 or bf16 floats, and the
// kernels widen them to f32 in registers (compute stays f32): a decode step reads half the bytes
// of an f32 cache's K and V. keys() and values() then carry the shape and strides with no data,
// so only an attention that reads the cache's own layouts (Capabilities::half_cache: full, local
// and the clustered pair, causal) can take such a cache; append refuses an f16 cache values past
// f16's range (65504). A 16-bit cache that keeps queries holds them in f32 (they are read at a
// segment's start, not by every step) and K's rows in 16 bits beside the panels,
//   krow16 (B, Hkv, capacity, Dkp)
// for the keys causal clustered attention gathers by index (its top-k rows).
//
// Use: set in.k = cache.keys(), in.v = cache.values(), in.cache = &cache. A cache is for
// inference: backward refuses inputs that name one.
//
// Besides the rows, an attention may keep derived state with the cache (causal clustered keeps
// each head's current centroids and their running attention over the prefix, so a decode step
// does not recompute them): a pure function of the rows held, dropped by clear(), truncate() and
// drop().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <typeinfo>
#include <vector>

#include "clattn/tensor.h"

namespace clattn {

// How a KVCache stores keys and values: f32, or 16-bit floats (half the bytes, rounded to
// nearest even; f16 keeps 11 significant bits up to 65504, bf16 8 bits over f32's range).
enum class KVCacheType : uint8_t { f32, f16, bf16 };
const char* kv_cache_type_name(KVCacheType t);  // "f32", "f16", "bf16"
// "f32", "f16" or "bf16" (any case); an Error naming the choices otherwise.
KVCacheType parse_kv_cache_type(std::string_view s);

// Base of an attention's derived state kept with a KVCache.
struct CacheState {
  virtual ~CacheState() = default;
  virtual size_t bytes() const = 0;
};

class KVCache {
 public:
  KVCache() = default;
  // Allocates (and zero-fills) room for `capacity` positions, rounded up to a multiple of 64.
  // query_heads > 0 keeps the queries too (H = query_heads; Attention::capabilities().
  // decode_queries says which attentions need them).
  KVCache(int64_t batch, int64_t kv_heads, int64_t capacity, int64_t dk, int64_t dv,
          int64_t query_heads = 0, KVCacheType type = KVCacheType::f32);
  KVCache(KVCache&&) = default;
  KVCache& operator=(KVCache&&) = default;

  // Appends T positions for every batch row: k (B, Hkv, T, Dk), v (B, Hkv, T, Dv), and q
  // (B, H, T, Dk) when the cache keeps queries (else q must be empty), any strides with a unit
  // last one. Throws (naming the sizes) when they do not match or would overflow the capacity,
  // or when a value is not finite; the cache is unchanged then.
  void append(ConstView k, ConstView v, ConstView q = {});
  // Forgets every position (keeps the memory): the next append starts at position 0.
  void clear() {
    size_ = 0;
    derived_.reset();
  }
  // Keeps the first n positions (n <= size()): rewinds a speculative or beam step.
  void truncate(int64_t n);
  // In-place rotation of n rows of one (batch row, head), row stride ld, the first dk() floats of
  // each: what drop() applies to the keys (and queries) it moves.
  using RowRotation = std::function<void(float* rows, int64_t n, int64_t ld)>;
  // Removes positions [first, first + count) and moves the later ones down by count (a context
  // shift): keys, values and queries in every layout, the magnitudes, derived state dropped (as
  // truncate() does; an attention rebuilds it from the rows). `rotate`, when given, is applied to
  // every moved key row and query row — a RoPE decoder passes the rotation by −count positions,
  // so the moved keys read as computed at their new positions. A 16-bit cache widens the moved
  // keys, rotates and rounds them again (one more rounding, as llama.cpp's shift of an f16 cache).
  // Throws, with the cache unchanged, when the range is not within [0, size()).
  void drop(int64_t first, int64_t count, const RowRotation& rotate = {});

  int64_t size() const { return size_; }
  int64_t capacity() const { return cap_; }
  int64_t batch() const { return B_; }
  int64_t kv_heads() const { return Hkv_; }
  int64_t dk() const { return Dk_; }
  int64_t dv() const { return Dv_; }
  KVCacheType type() const { return type_; }
  size_t bytes() const;

  ConstView keys() const;    // (B, Hkv, size, Dk)
  ConstView values() const;  // (B, Hkv, size, Dv)
  bool keeps_queries() const { return Hq_ > 0; }
  int64_t query_heads() const { return Hq_; }
  ConstView queries() const;  // (B, H, size, Dk); keeps_queries() only
  // The largest |x| of the keys, values and queries held (over every batch row and head),
  // found by append's finiteness pass: attentions bound their arithmetic with them (the overflow
  // rule of every variant) without reading the cache again in a decode step.
  float max_abs_key() const { return size_ ? kmax_[static_cast<size_t>(size_ - 1)] : 0.f; }
  float max_abs_value() const { return size_ ? vmax_[static_cast<size_t>(size_ - 1)] : 0.f; }
  float max_abs_query() const { return size_ && Hq_ > 0 ? qmax_[static_cast<size_t>(size_ - 1)] : 0.f; }
  // Panels of (b, hk): ceil(size/64) panels of (Dk, 64); columns past size are zero. f32 caches.
  const float* key_panels(int64_t b, int64_t hk) const;
  // Rows of (b, hk): (size, value_ld()), columns past Dv zero. f32 caches.
  const float* value_rows(int64_t b, int64_t hk) const;
  int64_t value_ld() const { return Dvp_; }
  // The same layouts in a 16-bit cache (f16 or bf16 bits, per type()).
  const uint16_t* key_panels16(int64_t b, int64_t hk) const;
  const uint16_t* value_rows16(int64_t b, int64_t hk) const;
  // K rows of (b, hk), (size, key_ld()) in 16 bits, columns past Dk zero: a 16-bit cache that
  // keeps queries only.
  const uint16_t* key_rows16(int64_t b, int64_t hk) const;
  int64_t key_ld() const { return Dkp_; }

  // The derived state of type T (made empty on first use or when another type holds the slot).
  // Attentions read it through the const cache of AttentionInputs: it caches, it never decides.
  template <class T>
  T& derived() const {
    // typeid of a plain pointer's target: clang counts dereferencing the unique_ptr as a side effect
    if (const CacheState* s = derived_.get(); !s || typeid(*s) != typeid(T)) derived_ = std::make_unique<T>();
    return static_cast<T&>(*derived_);
  }

 private:
  int64_t B_ = 0, Hkv_ = 0, Hq_ = 0, cap_ = 0, Dk_ = 0, Dv_ = 0, Dkp_ = 0, Dvp_ = 0, size_ = 0;
  KVCacheType type_ = KVCacheType::f32;
  Tensor krow_, kpan_, vrow_, qrow_;           // f32 caches
  std::vector<uint16_t> kpan16_, vrow16_;      // 16-bit caches: kpan and vrow as above
  std::vector<uint16_t> krow16_;               // 16-bit caches that keep queries: K rows
  // (capacity) largest |x| of the rows of positions 0..j (a prefix maximum, so truncate keeps it
  // exact up to the granularity of appends).
  std::vector<float> kmax_, vmax_, qmax_;
  mutable std::unique_ptr<CacheState> derived_;
  void append16(ConstView k, ConstView v, int64_t T);
};

}  // namespace clattn
