// The table-lookup layers of nn.h: the linear layer as one sgemm (two for its backward), and the
// embedding gather and its scatter-add.
#include <climits>
#include <cstring>

#include "clattn/error.h"
#include "clattn/gemm.h"
#include "clattn/nn.h"
#include "nn/nn_internal.h"

namespace clattn::nn {

using namespace detail;  // nn_internal.h: SIMD names, kParallelMin, for_column_ranges

// y (rows, out) = x (rows, in) · Wᵀ (in, out) + b, through clattn::linear_product: narrow layers
// in the register tiles with the bias folded in, others as a bias fill then one sgemm with
// beta = 1 (measured at rows = 16384, in = 256, out = 1024 on 2 threads, best of 30, before the
// tiles: bias fill + beta = 1 at 190 GFLOP/s, beta = 0 then a bias pass at 170).
void linear_fwd(float* y, int64_t ldy, const float* x, int64_t ldx, const float* w, const float* b,
                int64_t rows, int64_t in, int64_t out) {
  check(rows >= 0 && in >= 1 && out >= 1, "linear_fwd: need rows >= 0, in >= 1 and out >= 1, got rows=",
        rows, " in=", in, " out=", out);
  check(ldx >= in && ldy >= out, "linear_fwd: row strides must cover a row: ldx=", ldx, " (in=", in,
        "), ldy=", ldy, " (out=", out, ")");
  check(rows <= INT_MAX && ldx <= INT_MAX && ldy <= INT_MAX && in <= INT_MAX && out <= INT_MAX,
        "linear_fwd: sizes and strides must fit the BLAS int: rows=", rows, " in=", in, " out=", out,
        " ldx=", ldx, " ldy=", ldy);
  if (rows == 0) return;
  check(y != nullptr && x != nullptr && w != nullptr, "linear_fwd: y, x and w must not be null");
  linear_product(rows, out, in, x, ldx, w, in, b, false, y, ldy);
}

void embedding_fwd(float* y, const int32_t* ids, const float* table, int64_t n, int64_t dim,
                   int64_t vocab) {
  check(n >= 0 && dim >= 0 && vocab >= 0, "embedding_fwd: sizes must be >= 0, got n=", n, " dim=", dim,
        " vocab=", vocab);
  if (n == 0) return;
  check(ids != nullptr, "embedding_fwd: ids must not be null");
  for (int64_t i = 0; i < n; ++i)
    check(ids[i] >= 0 && ids[i] < vocab, "embedding_fwd: every id must lie in [0, vocab): ids[", i, "] = ",
          ids[i], ", vocab = ", vocab);
  if (dim == 0) return;
  check(y != nullptr && table != nullptr, "embedding_fwd: y and table must not be null");
#pragma omp parallel for schedule(static) if (n * dim > kParallelMin)
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(y + i * dim, table + static_cast<int64_t>(ids[i]) * dim, sizeof(float) * static_cast<size_t>(dim));
}

// Backward of y = x · Wᵀ + b:
//   dx (rows, in)  = dy (rows, out) · W (out, in)        one sgemm, beta 0 (write) or 1 (accumulate)
//   dW (out, in)  += dyᵀ (out, rows) · x (rows, in)      one sgemm, beta 1
//   db (out)      += Σ_rows dy                           a column sum, columns split over threads
// Measured (bench/nn_bwd.cpp; a machine at load ~15 on 2 cores, so rates from CPU time, not wall):
// rows = 16384, in = 256, out = 1024 on one thread 89 GFLOP/s against the forward's 87 (dx 90, dW
// 90, db 4.3 ms of 194); on 2 threads, per main-thread CPU second, 142 against the forward's 150.
void linear_bwd(float* dx, int64_t lddx, float* dw, float* db, const float* dy, int64_t lddy,
                const float* x, int64_t ldx, const float* w, int64_t rows, int64_t in, int64_t out,
                bool accumulate) {
  check(rows >= 0 && in >= 1 && out >= 1, "linear_bwd: need rows >= 0, in >= 1 and out >= 1, got rows=", rows,
        " in=", in, " out=", out);
  check(lddy >= out && (dx == nullptr || lddx >= in) && (dw == nullptr || ldx >= in),
        "linear_bwd: row strides must cover a row: lddy=", lddy, " (out=", out, "), lddx=", lddx, ", ldx=", ldx,
        " (in=", in, ")");
  check(rows <= INT_MAX && lddx <= INT_MAX && lddy <= INT_MAX && ldx <= INT_MAX && in <= INT_MAX && out <= INT_MAX,
        "linear_bwd: sizes and strides must fit the BLAS int: rows=", rows, " in=", in, " out=", out,
        " lddx=", lddx, " lddy=", lddy, " ldx=", ldx);
  if (rows == 0) return;
  check(dy != nullptr, "linear_bwd: dy must not be null");
  check(dx == nullptr || w != nullptr, "linear_bwd: w must not be null when dx is wanted");
  check(dw == nullptr || x != nullptr, "linear_bwd: x must not be null when dw is wanted");
  if (dx) gemm(false, false, rows, in, out, 1.f, dy, lddy, w, in, accumulate ? 1.f : 0.f, dx, lddx);
  if (dw) gemm(true, false, out, in, rows, 1.f, dy, lddy, x, ldx, 1.f, dw, in);
  if (db) {
    for_column_ranges(out, rows * out > kParallelMin, [&](int64_t c0, int64_t c1) {
      for (int64_t p0 = c0; p0 < c1; p0 += kColPiece) {
        const int64_t width = std::min(kColPiece, c1 - p0);
        alignas(64) float acc[kColPiece] = {};  // (width) Σ over rows so far, in row order
        for (int64_t r = 0; r < rows; ++r) add_row(acc, dy + r * lddy + p0, width);
        add_row(db + p0, acc, width);
      }
    });
  }
}

// dtable[ids[i]] += dy[i] for i = 0..n−1 in that order, each thread owning a range of columns:
// a table row hit by many ids (a frequent token) sums them in the same order for any thread count.
void embedding_bwd(float* dtable, const int32_t* ids, const float* dy, int64_t n, int64_t dim,
                   int64_t vocab) {
  check(n >= 0 && dim >= 0 && vocab >= 0, "embedding_bwd: sizes must be >= 0, got n=", n, " dim=", dim,
        " vocab=", vocab);
  if (n == 0) return;
  check(ids != nullptr, "embedding_bwd: ids must not be null");
  for (int64_t i = 0; i < n; ++i)
    check(ids[i] >= 0 && ids[i] < vocab, "embedding_bwd: every id must lie in [0, vocab): ids[", i, "] = ",
          ids[i], ", vocab = ", vocab);
  if (dim == 0 || dtable == nullptr) return;
  check(dy != nullptr, "embedding_bwd: dy must not be null");
  for_column_ranges(dim, n * dim > kParallelMin, [&](int64_t c0, int64_t c1) {
    for (int64_t i = 0; i < n; ++i)
      add_row(dtable + static_cast<int64_t>(ids[i]) * dim + c0, dy + i * dim + c0, c1 - c0);
  });
}

}  // namespace clattn::nn
