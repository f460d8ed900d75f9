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
// The same over rows of a fused gate | up buffer (one GEMM makes both): row r of gu (row stride
// ldgu) holds the gate in [0, n) and up in [n, 2n); y (rows, n) has row stride ldy.
void swiglu_rows_fwd(float* y, int64_t ldy, const float* gu, int64_t ldgu, int64_t rows, int64_t n);

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

// ---- Backward passes (training). Conventions, the same for every function below:
//   * parameter gradients (dw, db, dgamma, dbeta, dtable) are ACCUMULATED (+=): the trainer zeroes
//     them once per optimiser step, and a tied weight (embedding = output layer) sums both uses;
//   * input gradients (dx, dgate, dup) are WRITTEN (=) unless the function takes `accumulate`,
//     in which case `accumulate = true` adds into dx (the residual stream's gradient);
//   * a gradient pointer may be nullptr to skip that gradient; dx may alias dy where stated;
//   * sizes and strides as in the matching forward; no allocation; OpenMP over rows, except the
//     sums over rows into a parameter gradient (db, dgamma, dbeta, dw of RMSNorm, dtable): those
//     split columns over the threads and add rows in order, so their bits do not depend on the
//     thread count (dW of linear is OpenBLAS's: deterministic for a fixed thread count).

// Linear: dx (rows, in) = dy · W, dW (out, in) += dyᵀ · x, db (out) += Σ_rows dy. One sgemm each
// (dx with beta 0 or 1), db a column sum with the same bits for any thread count. x may be null
// when dw is, w when dx is. lddx / ldx are only read for the gradient that uses them.
void linear_bwd(float* dx, int64_t lddx, float* dw, float* db, const float* dy, int64_t lddy,
                const float* x, int64_t ldx, const float* w, int64_t rows, int64_t in, int64_t out,
                bool accumulate = false);

// LayerNorm from the mean and rstd its forward saved. dx may alias dy (not with accumulate: an
// error). dgamma, dbeta have the same bits for any thread count (each column summed in row order).
void layernorm_bwd(float* dx, float* dgamma, float* dbeta, const float* dy, const float* x,
                   const float* gamma, const float* mean, const float* rstd, int64_t rows,
                   int64_t dim, bool accumulate = false);

// RMSNorm from the rstd its forward saved. dx may alias dy (not with accumulate).
void rmsnorm_bwd(float* dx, float* dw, const float* dy, const float* x, const float* w,
                 const float* rstd, int64_t rows, int64_t dim, bool accumulate = false);

// dx = dy ∘ gelu'(x) over n floats (x the forward's input); dx may alias dy.
void gelu_bwd(float* dx, const float* dy, const float* x, int64_t n, Gelu kind);

// SwiGLU: dgate = dy ∘ up ∘ silu'(gate), dup = dy ∘ silu(gate). dgate or dup may alias dy (not
// both: they must differ); up may be null when dgate is.
void swiglu_bwd(float* dgate, float* dup, const float* dy, const float* gate, const float* up,
                int64_t n);

// Its backward over fused rows: dgu row r gets dgate in [0, n) and dup in [n, 2n) from dy (rows,
// n, row stride lddy); dy may be the first n columns of dgu's own rows (lddy = lddgu).
void swiglu_rows_bwd(float* dgu, int64_t lddgu, const float* dy, int64_t lddy, const float* gu, int64_t ldgu,
                     int64_t rows, int64_t n);

// RoPE is a rotation: its backward rotates the gradient by −θ, in place, same layout as rope_fwd.
void rope_bwd(float* dx, int64_t ld, int64_t head_stride, const int32_t* pos, int64_t rows,
              int64_t heads, int64_t head_dim, float theta);

// dtable (vocab, dim) += scatter of dy (n, dim) by ids (n). Deterministic (same sums, same order,
// any thread count).
void embedding_bwd(float* dtable, const int32_t* ids, const float* dy, int64_t n, int64_t dim,
                   int64_t vocab);

// Softmax cross-entropy over rows of logits (rows, classes) with targets (rows); a target of −1
// is ignored (padding, unmasked MLM positions). Returns the SUM of −log p[target] over counted
// rows (in double) and writes *counted. When dlogits is not nullptr it receives
// scale · (softmax − onehot) for counted rows and 0 for ignored ones (dlogits may alias logits;
// pass scale = 1 / counted for the mean loss; with nothing counted any scale, even inf, gives
// zeros). Targets outside [−1, classes) are an error naming the row and value; a NaN or ±Inf logit
// in a counted row is an error naming it (ignored rows are not read). The loss has the same bits
// for any thread count. counted may be null.
double cross_entropy(float* dlogits, const float* logits, const int32_t* targets, int64_t rows,
                     int64_t classes, float scale, int64_t* counted);

// Inverted dropout with probability p in [0, 1) (else an error): y = x · keep / (1 − p). Element i
// is kept when the top 24 bits k of word i mod 4 of Rng(seed).bits(stream, i / 4) satisfy
// k / 2^24 >= p (one Philox block per four elements) — nothing stored: backward redraws the same
// mask. y may alias x; p = 0 copies.
void dropout_fwd(float* y, const float* x, int64_t n, float p, uint64_t seed, uint64_t stream);
void dropout_bwd(float* dx, const float* dy, int64_t n, float p, uint64_t seed, uint64_t stream);

// ---- Optimisation.
struct AdamWOptions {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.01f;
};
// One AdamW step (Loshchilov & Hutter, decoupled weight decay) over n parameters at step t >= 1
// (bias correction uses t): m, v updated in place; decay = false for biases and norm gains.
// param −= lr · (m̂ / (√v̂ + eps) + weight_decay · param), the decay on the pre-step param (as
// PyTorch). An error unless t >= 1, lr >= 0, β1, β2 in [0, 1), eps > 0, weight_decay >= 0.
void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, int64_t t, float lr,
                const AdamWOptions& opt, bool decay);
// Σ g² over n floats, in double (for the global gradient-norm clip): a fixed partition of n into
// blocks summed in order, so the same bits for any thread count.
double sum_squares(const float* g, int64_t n);
// The fixed partition sum_squares uses: blocks = sum_squares_blocks(n), block b covers
// [n·b/blocks, n·(b+1)/blocks) and sums (in double) to sum_squares_block(g + start, length); the
// blocks add in order. Callers holding parts of a vector (data-parallel shards made of whole
// blocks) get the same bits as sum_squares of the whole.
int64_t sum_squares_blocks(int64_t n);
double sum_squares_block(const float* g, int64_t n);
// x *= a over n floats.
void scale_inplace(float* x, float a, int64_t n);
// Learning rate at `step` (0-based): warm-up base · (step + 1) / warmup for step < warmup (never
// 0; base at the last warm-up step), then cosine from base at step = warmup down to min_lr at step
// = total, min_lr after. warmup = 0: cosine from step 0. total <= warmup: no decay phase, base
// after the warm-up (total = 0 with warmup = 0 is a constant base). Negative steps are an error.
float lr_schedule(int64_t step, int64_t warmup, int64_t total, float base, float min_lr);

}  // namespace clattn::nn
