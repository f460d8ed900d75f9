// Internals shared by the nn layer files: the SIMD names they use, the size below which a call
// stays on one thread (an OpenMP region costs a few µs, more than a small pass), and the column
// split the backward passes use for their parameter gradients.
#pragma once

#include <algorithm>
#include <cstdint>

#include "clattn/threads.h"
#include "core/simd.h"

namespace clattn::nn::detail {

using simd::kLanes;
using simd::load;
using simd::load_partial;
using simd::splat;
using simd::store;
using simd::store_partial;
using simd::vf;
using simd::vi;

inline constexpr int64_t kParallelMin = 32768;  // floats

// Widest column piece a thread accumulates in a stack array (8 KB, in L1) before adding it to a
// gradient: rows are read whole up to 2048 columns. linear_bwd's db at rows = 16384, out = 1024 on
// one thread (CPU time, busy machine): 4.3 ms with 2048-column pieces, 9.9 ms with 512 (each row
// then read in two 2 KB halves, one pass over dy per half).
inline constexpr int64_t kColPiece = 2048;

// Runs fn(c0, c1) on every thread of a team (one thread unless `parallel`) for its own contiguous
// range of whole 16-float vectors of [0, cols). Gradients summed over rows (dW's bias column sums,
// dgamma, the embedding scatter) are split by column, not by row: each column is then summed by
// one thread in row order, so the bits do not depend on the thread count and no per-thread partial
// buffer (an allocation) is needed. fn must not throw.
template <class F>
void for_column_ranges(int64_t cols, bool parallel, F&& fn) {
  const int64_t units = (cols + kLanes - 1) / kLanes;
#pragma omp parallel if (parallel)
  {
    const int64_t t = thread_id(), T = team_size();
    const int64_t c0 = std::min(cols, units * t / T * kLanes);
    const int64_t c1 = std::min(cols, units * (t + 1) / T * kLanes);
    if (c0 < c1) fn(c0, c1);
  }
}

// acc[0, n) += src[0, n) (acc a short stack array, src a row piece).
inline void add_row(float* acc, const float* src, int64_t n) { simd::axpy_row(acc, src, n); }

}  // namespace clattn::nn::detail
