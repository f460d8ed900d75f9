// The table-lookup layers of nn.h: the linear layer as one sgemm, and the embedding gather.
#include <climits>
#include <cstring>

#include "clattn/error.h"
#include "clattn/gemm.h"
#include "clattn/nn.h"

namespace clattn::nn {

namespace {

// Below this many output floats a layer runs on one thread (an OpenMP region costs a few µs).
constexpr int64_t kParallelMin = 32768;

}  // namespace

// y (rows, out) = x (rows, in) · Wᵀ (in, out) + b: y is first filled with the bias rows (or
// zeros) over the OpenMP threads, then one sgemm adds the product with beta = 1. Measured at
// rows = 16384, in = 256, out = 1024 on 2 threads (best of 30): bias fill + beta = 1 at 190
// GFLOP/s, beta = 0 then a bias pass over y at 170, and without a bias zero fill + beta = 1 at
// 194 against 186 for beta = 0 (OpenBLAS scales C in its own pass when beta != 1).
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
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(out);
#pragma omp parallel for schedule(static) if (rows * out > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    if (b != nullptr) std::memcpy(y + r * ldy, b, row_bytes);
    else std::memset(y + r * ldy, 0, row_bytes);
  }
  gemm(false, true, rows, out, in, 1.f, x, ldx, w, in, 1.f, y, ldy);
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

}  // namespace clattn::nn
