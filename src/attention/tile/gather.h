// Gathers of rows by index for the sort-based attentions (smyrf, reformer, routing), whose
// blocks are sets of positions scattered over the sequence. At long N those rows come from DRAM
// in random order, so every gather here is one tight loop of independent row loads (the core
// keeps several rows in flight), and callers prefetch the next block's rows while they compute.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "clattn/threads.h"

#include "core/microkernel.h"
#include "core/simd.h"

namespace clattn::gather {

// Rows of the same array that the next block will gather: each gather loop requests one of them
// per row it copies, so the next block's misses overlap this block's work in a steady stream
// (a burst of requests at the start of a block measured slower: it stalls on the miss queue).
struct Ahead {
  const int32_t* idx = nullptr;
  int64_t n = 0;
};

inline void prefetch_one(const float* base, int64_t rs, const Ahead& a, int64_t x, int64_t cols,
                         bool for_write = false) {
  if (x < a.n) simd::prefetch_row(base + a.idx[x] * rs, cols, for_write);
}

// dst (n_pad, ld) = rows idx[0, n) of base (row stride rs) times s, columns [cols, ld) and rows
// [n, n_pad) zero.
inline void rows(const float* base, int64_t rs, const int32_t* idx, int64_t n, int64_t cols,
                 float* dst, int64_t ld, int64_t n_pad, float s = 1.f, const Ahead& ahead = {}) {
  for (int64_t x = 0; x < n; ++x) {
    prefetch_one(base, rs, ahead, x, cols);
    simd::copy_row(dst + x * ld, base + idx[x] * rs, cols, ld, s);
  }
  for (int64_t x = n; x < ahead.n; ++x) prefetch_one(base, rs, ahead, x, cols);
  if (n_pad > n) std::memset(dst + n * ld, 0, sizeof(float) * static_cast<size_t>((n_pad - n) * ld));
}

// dst (cols, ldt) = the transpose of rows idx[0, n) of base: column x is row idx[x]; columns
// [n, ldt) are zero (ldt a multiple of 16, at least n). 16 rows at a time go through a register
// transpose, so the keys of a block come out ready for S = Q·Kᵀ without a second pass.
inline void transposed(const float* base, int64_t rs, const int32_t* idx, int64_t n, int64_t cols,
                       float* dst, int64_t ldt, const Ahead& ahead = {}) {
  constexpr int L = simd::kLanes;
  for (int64_t x = ldt; x < ahead.n; ++x) prefetch_one(base, rs, ahead, x, cols);
  for (int64_t x0 = 0; x0 < ldt; x0 += L) {
    const int nr = static_cast<int>(n - x0 < L ? (n - x0 > 0 ? n - x0 : 0) : L);
    for (int j = 0; j < L; ++j) prefetch_one(base, rs, ahead, x0 + j, cols);
    for (int64_t e = 0; e < cols; e += L) {
      const int ne = static_cast<int>(cols - e < L ? cols - e : L);
      simd::vf r[L];
      for (int j = 0; j < L; ++j)
        r[j] = j < nr ? (ne == L ? simd::load(base + idx[x0 + j] * rs + e)
                                 : simd::load_partial(base + idx[x0 + j] * rs + e, ne))
                      : simd::vf{};
      simd::transpose16(r);
      for (int j = 0; j < ne; ++j) simd::store(dst + (e + j) * ldt + x0, r[j]);
    }
  }
}

// dst (cols, ldt) = the transpose of src (n, cols) with row stride ld, columns [n, ldt) zero:
// the register-transpose counterpart of mk::pack_transposed for rows already in cache.
inline void transpose(const float* src, int64_t ld, int64_t n, int64_t cols, float* dst,
                      int64_t ldt) {
  constexpr int L = simd::kLanes;
  for (int64_t x0 = 0; x0 < ldt; x0 += L) {
    const int nr = static_cast<int>(n - x0 < L ? (n - x0 > 0 ? n - x0 : 0) : L);
    for (int64_t e = 0; e < cols; e += L) {
      const int ne = static_cast<int>(cols - e < L ? cols - e : L);
      simd::vf r[L];
      for (int j = 0; j < L; ++j)
        r[j] = j < nr ? (ne == L ? simd::load(src + (x0 + j) * ld + e)
                                 : simd::load_partial(src + (x0 + j) * ld + e, ne))
                      : simd::vf{};
      simd::transpose16(r);
      for (int j = 0; j < ne; ++j) simd::store(dst + (e + j) * ldt + x0, r[j]);
    }
  }
}

// Blocks ahead that the sort-based loops request into L2 (prefetcht1) besides the next block's
// rows into L1: the L2's deeper miss queue keeps more DRAM requests in flight. Measured on the
// smyrf forward (2 threads, N = 16384 / 65536, three A/B rounds): no L2 requests 45-53 /
// 199-261 ms (min), 4 blocks ahead 34-39 / 165-230 ms.
inline constexpr int64_t kFarBlocks = 4;

// Requests rows idx[0, n) of base into L2.
inline void prefetch_l2(const float* base, int64_t rs, const int32_t* idx, int64_t n, int64_t cols) {
  for (int64_t x = 0; x < n; ++x) simd::prefetch_row_l2(base + idx[x] * rs, cols);
}

// Asks for the cache lines of rows idx[0, n) of base (cols floats each).
inline void prefetch(const float* base, int64_t rs, const int32_t* idx, int64_t n, int64_t cols,
                     bool for_write = false) {
  for (int64_t x = 0; x < n; ++x) simd::prefetch_row(base + idx[x] * rs, cols, for_write);
}

// Entries e in [0, n) each belong to one row, row(e) in [0, rows). Calls add(r, e) for every
// entry of every row, a row's entries in increasing e, rows in blocks over the team: what one
// loop over e adding into its row does, in the same order per row, without two threads writing
// one row. off (rows + 2) and list (n) are the caller's reusable buffers.
template <class Row, class Add>
void by_row(int64_t n, int64_t rows, Row&& row, Add&& add, std::vector<int64_t>& off, std::vector<int64_t>& list) {
  off.assign(static_cast<size_t>(rows + 2), 0);
  for (int64_t e = 0; e < n; ++e) ++off[static_cast<size_t>(row(e) + 2)];
  for (int64_t r = 0; r < rows; ++r) off[static_cast<size_t>(r + 2)] += off[static_cast<size_t>(r + 1)];
  list.resize(static_cast<size_t>(std::max<int64_t>(n, 1)));
  for (int64_t e = 0; e < n; ++e) list[static_cast<size_t>(off[static_cast<size_t>(row(e) + 1)]++)] = e;
  // off[r] .. off[r + 1] now bound row r's entries
  constexpr int64_t kRowBlock = 512;
  parallel_for((rows + kRowBlock - 1) / kRowBlock, [&](int64_t x) {
    for (int64_t r = x * kRowBlock; r < std::min(rows, (x + 1) * kRowBlock); ++r)
      for (int64_t i = off[static_cast<size_t>(r)]; i < off[static_cast<size_t>(r + 1)]; ++i)
        add(r, list[static_cast<size_t>(i)]);
  });
}

}  // namespace clattn::gather
