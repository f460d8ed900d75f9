// Layers of a transformer as plain forward functions over row-major float buffers (llm.c style):
// every function reads its inputs, writes its output, and takes the sizes and strides it needs.
// Training adds the matching `_bwd` beside each one; the forwards already save what a backward
// needs (LayerNorm's mean and 1/std, RMSNorm's 1/rms) when given a buffer for it.
//
// Rows are tokens: a batch of B sequences of length T is rows = B·T. Everything runs over all
// rows at once (one GEMM per linear layer, one fused pass per elementwise op, OpenMP over rows),
// never per token. No function allocates.
#pragma once

#include <cstdint>

namespace clattn::nn {

// y (rows, out) = x (rows, in) · Wᵀ + b, W (out, in) row-major (the nn.Linear / Hugging Face
// layout), b (out) or nullptr. ldx / ldy are row strides (>= in / >= out). One sgemm.
void linear_fwd(float* y, int64_t ldy, const float* x, int64_t ldx, const float* w, const float* b,
                int64_t rows, int64_t in, int64_t out);

// y = (x − mean) / sqrt(var + eps) · gamma + beta per row (biased variance), rows of `dim`.
// y may equal x. mean, rstd (rows) receive the statistics when not nullptr.
void layernorm_fwd(float* y, const float* x, const float* gamma, const float* beta, int64_t rows,
                   int64_t dim, float eps, float* mean = nullptr, float* rstd = nullptr);

// y = x / sqrt(mean(x²) + eps) · w per row. y may equal x. rstd (rows) when not nullptr.
void rmsnorm_fwd(float* y, const float* x, const float* w, int64_t rows, int64_t dim, float eps,
                 float* rstd = nullptr);

// x += r over n floats (the residual connection).
void add_inplace(float* x, const float* r, int64_t n);

enum class Gelu { erf, tanh };  // exact 0.5·x·(1 + erf(x/√2)), or the tanh approximation
// y = gelu(x) over n floats; y may equal x.
void gelu_fwd(float* y, const float* x, int64_t n, Gelu kind);

// SwiGLU: y = silu(gate) ∘ up = gate / (1 + exp(−gate)) ∘ up over n floats; y may equal gate.
void swiglu_fwd(float* y, const float* gate, const float* up, int64_t n);

// Rotary position embedding, rotate-half convention (Hugging Face LLaMA): for each head of
// head_dim = 2h, with θ_i = pos · theta^(−2i/head_dim) for i < h,
//   x'[i] = x[i]·cos θ_i − x[i+h]·sin θ_i,  x'[i+h] = x[i+h]·cos θ_i + x[i]·sin θ_i.
// x is (rows, heads, head_dim) with row stride ld and head stride head_stride, rotated in place;
// pos (rows) is each row's position. head_dim must be even.
void rope_fwd(float* x, int64_t ld, int64_t head_stride, const int32_t* pos, int64_t rows,
              int64_t heads, int64_t head_dim, float theta);

// y (n, dim) = table rows ids (n); every id must lie in [0, vocab) (else clattn::Error naming it).
void embedding_fwd(float* y, const int32_t* ids, const float* table, int64_t n, int64_t dim,
                   int64_t vocab);

// Numerically safe softmax of each row of `cols` in place (max-subtracted, float accumulation).
void softmax_rows(float* x, int64_t rows, int64_t cols);

}  // namespace clattn::nn
