// Elementwise layers of nn.h: the residual add, GELU (exact and tanh forms) and SwiGLU and their
// backward passes, each one vectorised pass over the data in chunks spread over the OpenMP threads.
// The activations' passes are the active ISA's (nn/elementwise_isa.cpp, through nn_isa.h).
#include <algorithm>
#include <cstring>

#include "clattn/error.h"
#include "clattn/nn.h"
#include "core/simd.h"
#include "nn/nn_internal.h"
#include "nn/nn_isa.h"

namespace clattn::nn {

namespace {

using namespace detail;  // nn_internal.h: SIMD names, kParallelMin

constexpr int64_t kChunk = 4096;          // floats per OpenMP work item (16 KB)

// y[e] = op(a[e], b[e]) for e in [e, end), lane by lane (so y may equal a or b). b may be null
// when op ignores it.
template <class Op>
void map2_range(float* y, const float* a, const float* b, int64_t e, int64_t end, Op op) {
  for (; e + kLanes <= end; e += kLanes) store(y + e, op(load(a + e), b ? load(b + e) : vf{}));
  if (e < end) {
    const int r = static_cast<int>(end - e);
    store_partial(y + e, op(load_partial(a + e, r), b ? load_partial(b + e, r) : vf{}), r);
  }
}

// The same over n floats, in chunks spread over the threads. Callers pass a lambda, whose own
// type makes op inline here (a function pointer made every 16 floats an indirect call).
template <class Op>
void map2(float* y, const float* a, const float* b, int64_t n, Op op) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) map2_range(y, a, b, c * kChunk, std::min(n, (c + 1) * kChunk), op);
}

// Runs fn(begin, end) over [0, n) in chunks of kChunk spread over the threads.
template <class Fn>
void over_chunks(int64_t n, Fn fn) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) fn(c * kChunk, std::min(n, (c + 1) * kChunk));
}

}  // namespace

void add_inplace(float* x, const float* r, int64_t n) {
  check(n >= 0, "add_inplace: n must be >= 0, got ", n);
  if (n == 0) return;
  check(x != nullptr && r != nullptr, "add_inplace: x and r must not be null");
  map2(x, x, r, n, [](vf a, vf b) { return a + b; });
}

void gelu_fwd(float* y, const float* x, int64_t n, Gelu kind) {
  check(n >= 0, "gelu_fwd: n must be >= 0, got ", n);
  if (n == 0) return;
  check(y != nullptr && x != nullptr, "gelu_fwd: y and x must not be null");
  const NnKernels& k = isa_nn_kernels();
  over_chunks(n, [&](int64_t e, int64_t end) { k.gelu(y + e, x + e, end - e, kind); });
}

void swiglu_fwd(float* y, const float* gate, const float* up, int64_t n) {
  check(n >= 0, "swiglu_fwd: n must be >= 0, got ", n);
  if (n == 0) return;
  check(y != nullptr && gate != nullptr && up != nullptr, "swiglu_fwd: y, gate and up must not be null");
  const NnKernels& k = isa_nn_kernels();
  over_chunks(n, [&](int64_t e, int64_t end) { k.swiglu(y + e, gate + e, up + e, end - e); });
}

void swiglu_rows_fwd(float* y, int64_t ldy, const float* gu, int64_t ldgu, int64_t rows, int64_t n) {
  check(rows >= 0 && n >= 0 && ldy >= n && ldgu >= 2 * n, "swiglu_rows_fwd: need rows, n >= 0, ldy >= n and ldgu >= 2n, got rows=",
        rows, " n=", n, " ldy=", ldy, " ldgu=", ldgu);
  if (rows == 0 || n == 0) return;
  check(y != nullptr && gu != nullptr, "swiglu_rows_fwd: y and gu must not be null");
  const NnKernels& k = isa_nn_kernels();
#pragma omp parallel for schedule(static) if (rows * n > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) k.swiglu(y + r * ldy, gu + r * ldgu, gu + r * ldgu + n, n);
}

void gelu_bwd(float* dx, const float* dy, const float* x, int64_t n, Gelu kind) {
  check(n >= 0, "gelu_bwd: n must be >= 0, got ", n);
  if (n == 0) return;
  check(dx != nullptr && dy != nullptr && x != nullptr, "gelu_bwd: dx, dy and x must not be null");
  const NnKernels& k = isa_nn_kernels();
  over_chunks(n, [&](int64_t e, int64_t end) { k.gelu_grad(dx + e, dy + e, x + e, end - e, kind); });
}

// y = silu(gate) ∘ up, silu(g) = g·σ(g), silu'(g) = σ(g)·(1 + g·(1 − σ(g))):
//   dgate = dy ∘ up ∘ silu'(gate),  dup = dy ∘ silu(gate).
// Lane by lane, every input is loaded before either output is stored, so dgate or dup may alias dy.
void swiglu_bwd(float* dgate, float* dup, const float* dy, const float* gate, const float* up,
                int64_t n) {
  check(n >= 0, "swiglu_bwd: n must be >= 0, got ", n);
  if (n == 0 || (dgate == nullptr && dup == nullptr)) return;
  check(dy != nullptr && gate != nullptr, "swiglu_bwd: dy and gate must not be null");
  check(dgate == nullptr || up != nullptr, "swiglu_bwd: up must not be null when dgate is wanted");
  check(dgate == nullptr || dgate != dup, "swiglu_bwd: dgate and dup must be different buffers");
  const NnKernels& k = isa_nn_kernels();
  over_chunks(n, [&](int64_t e, int64_t end) {
    k.swiglu_grad(dgate ? dgate + e : nullptr, dup ? dup + e : nullptr, dy + e, gate + e, up ? up + e : nullptr, end - e);
  });
}

void swiglu_rows_bwd(float* dgu, int64_t lddgu, const float* dy, int64_t lddy, const float* gu, int64_t ldgu, int64_t rows,
                     int64_t n) {
  check(rows >= 0 && n >= 0 && lddy >= n && ldgu >= 2 * n && lddgu >= 2 * n,
        "swiglu_rows_bwd: need rows, n >= 0, lddy >= n, ldgu and lddgu >= 2n, got rows=", rows, " n=", n);
  if (rows == 0 || n == 0) return;
  check(dgu != nullptr && dy != nullptr && gu != nullptr, "swiglu_rows_bwd: dgu, dy and gu must not be null");
  const NnKernels& k = isa_nn_kernels();
#pragma omp parallel for schedule(static) if (rows * n > kParallelMin)
  for (int64_t r = 0; r < rows; ++r)
    k.swiglu_grad(dgu + r * lddgu, dgu + r * lddgu + n, dy + r * lddy, gu + r * ldgu, gu + r * ldgu + n, n);
}

}  // namespace clattn::nn
