// Pieces the architectures share inside src/model: timing, row loops, the arena carver, views.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>

#include "clattn/threads.h"
#include "clattn/tensor.h"

namespace clattn::model {

inline double ms_now() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// fn(i) for i in [0, n), each of about `work` floats: serially when the whole is small (an OpenMP
// region costs a few µs), else over the team in blocks of ~4096 floats.
template <class F>
void for_rows(int64_t n, int64_t work, F&& fn) {
  if (n * work < 32768) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  const int64_t blk = std::max<int64_t>(1, 4096 / std::max<int64_t>(work, 1));
  parallel_for((n + blk - 1) / blk, [&](int64_t b) {
    for (int64_t i = b * blk; i < std::min(n, (b + 1) * blk); ++i) fn(i);
  });
}

// Bump allocator over one buffer, each piece 64-byte aligned. Carving runs twice: with no base to
// measure (used()), then over the arena of that size.
class Carver {
 public:
  explicit Carver(float* base) : base_(base) {}
  float* take(int64_t n) {
    float* p = base_ ? base_ + used_ : nullptr;
    used_ += (n + 15) / 16 * 16;
    return p;
  }
  int64_t used() const { return used_; }

 private:
  float* base_ = nullptr;
  int64_t used_ = 0;
};

// Strided (B, heads, T, hd) view over token-major rows of stride ld: no transpose is ever made.
inline View heads_view(float* base, int64_t B, int64_t heads, int64_t T, int64_t hd, int64_t ld) {
  View v{base, Shape{B, heads, T, hd}, {}};
  v.strides = {T * ld, hd, ld, 1};
  return v;
}

// The lengths to hand attention: none when every sequence is full (so variants without key
// padding support run on unpadded batches).
inline std::span<const int32_t> padding_lengths(std::span<const int32_t> lengths, int64_t T) {
  for (int32_t len : lengths)
    if (len != T) return lengths;
  return {};
}


}  // namespace clattn::model
