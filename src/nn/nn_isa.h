// The elementwise and row kernels of the nn layers (activations and their gradients, the norms'
// forward rows), compiled once per ISA (elementwise_isa.cpp; CMakeLists.txt) and reached through
// the active ISA's table (core/isa.h). activation.cpp and norm.cpp keep the checks and the split
// over the threads; a table entry is one pass over its range, with no allocation and no throw.
#pragma once

#include <cstdint>

#include "clattn/nn.h"

namespace clattn::nn {

struct NnKernels {
  // y[0, n) = gelu(x[0, n)); y may equal x.
  void (*gelu)(float* y, const float* x, int64_t n, Gelu kind);
  // dx[0, n) = dy · gelu'(x); dx may equal dy.
  void (*gelu_grad)(float* dx, const float* dy, const float* x, int64_t n, Gelu kind);
  // y[0, n) = silu(gate) · up; y may equal either input.
  void (*swiglu)(float* y, const float* gate, const float* up, int64_t n);
  // dgate = dy · up · silu'(gate), dup = dy · silu(gate) (either may be null, or alias dy).
  void (*swiglu_grad)(float* dgate, float* dup, const float* dy, const float* gate, const float* up, int64_t n);
  // Rows [r0, r1) of layernorm_fwd / rmsnorm_fwd (nn.h), rows of `dim` floats.
  void (*layernorm_rows)(float* y, const float* x, const float* gamma, const float* beta, int64_t r0, int64_t r1,
                         int64_t dim, float eps, float* mean, float* rstd);
  void (*rmsnorm_rows)(float* y, const float* x, const float* w, int64_t r0, int64_t r1, int64_t dim, float eps,
                       float* rstd);
};

// The active ISA's table.
const NnKernels& isa_nn_kernels();

}  // namespace clattn::nn
