// Row operations on score tiles shared by the flash-style kernels (full, clustered, ...).
// Scores are kept in log2 units (queries pre-scaled by scale·log2 e) so probabilities are exp2.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/microkernel.h"
#include "core/simd.h"

namespace clattn::tile {

inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2 = 0.693147180559945309f;
inline constexpr float kInf = std::numeric_limits<float>::infinity();

// Writes -inf over row[lim, width): keys past the visible limit.
inline void mask_tail(float* row, int64_t width, int64_t lim) {
  for (int64_t j = std::clamp(lim, int64_t{0}, width); j < width; ++j) row[j] = -kInf;
}

// The row passes run the active ISA's copy (core/rows_isa.cpp, through mk::kernels()).
// Max of a row of `width` scores, width a multiple of 16.
inline float row_max(const float* row, int64_t width) { return mk::row_max(row, width); }

// row <- 2^(row - sub); returns the sum. width is a multiple of 16.
inline float exp2_row(float* row, int64_t width, float sub) { return mk::exp2_row(row, width, sub); }

// row <- 2^min(row − lse2, 0): probabilities of scores (log2 units) recomputed against a saved
// log2-sum-exp2. Exactly min is a no-op (no score exceeds the log-sum-exp of its row), but a score
// recomputed by another product, or a logit near 1e10 where one ulp is 1024, can round above the
// saved value; a probability above 1 would then break the bound |dV| <= Σ|G| of the backward.
inline void prob_row(float* row, int64_t width, float lse2) { mk::prob_row(row, width, lse2); }
// The same for one score.
inline float prob(float score2, float lse2) { return std::exp2(std::min(score2 - lse2, 0.f)); }

// Softmax of each of `rows` rows of kw scores (log2 units) over their first k columns (the rest
// masked; k >= 1): normalises the rows in place and writes each row's log2-sum-exp2 into lse2.
// The member stage of improved-clustered attention (each member against its cluster's top-k).
inline void softmax_rows(float* s, int64_t rows, int64_t kw, int64_t k, float* lse2) {
  mk::softmax_rows(s, rows, kw, k, lse2);
}

// Online-softmax step for one row of a new tile (FlashAttention): updates the running max m
// (log2 units) and sum l, turns the row into unnormalised probabilities and returns the factor
// alpha by which the row's earlier accumulator must be rescaled.
inline float online_softmax_row(float* row, int64_t width, float& m, float& l) {
  return mk::online_softmax_row(row, width, m, l);
}

// Softmax of a row of kw scores (log2 units) and one optional extra logit (a causal self key;
// -inf when none): normalises the row in place, sets p_extra, and returns the log2-sum-exp2 —
// or -inf, with the row zeroed, when nothing is visible.
inline float softmax_row_extra(float* row, int64_t kw, float extra, float& p_extra) {
  return mk::softmax_row_extra(row, kw, extra, p_extra);
}

// The same without an extra logit: a row's softmax and log2-sum-exp2 (-inf, row zeroed: none).
inline float softmax_row(float* row, int64_t kw) {
  float unused;
  return softmax_row_extra(row, kw, -kInf, unused);
}

// Backward through a causal own-key term of probability p (logit scale·q·k, bucket_window.cpp):
// dS = p·(dP − D_i)·scale with dP = dO·v; adds dS·k to dq, dS·q to dk and p·dO to dv.
inline void own_key_backward(float p, float dp, float di, float scale, const float* q,
                             const float* k, const float* go, float* dq, float* dk, float* dv,
                             int64_t D, int64_t Dv) {
  const float ds = p * (dp - di) * scale;
  simd::axpy_row(dq, k, D, ds);
  simd::axpy_row(dk, q, D, ds);
  simd::axpy_row(dv, go, Dv, p);
}

// Rounds (hashes) combined by log-sum-exp, online, each round visiting every query once: dst
// always holds the normalised mix of the rounds seen so far and L their combined log2-sum-exp2,
//   dst <- a·dst + (1 − a)·o,  a = 2^L / (2^L + 2^lse),  L <- log2(2^L + 2^lse),
// so the first round stores (no zeroing pass before) and the last leaves the final output (no
// normalising pass after). o is one round's normalised output; lse = -inf means the round saw no
// key (o is 0 then). A query no round let see a key ends with dst 0 and L = -inf. The first
// round's rows are streamed (simd::stream_row): fence before the output is read.
// extra (optional) is one more coordinate of dst blended the same way, with `o`'s value x: the
// weight of a term the caller adds to every row after the rounds (smyrf's causal own key).
inline void blend_round(float* dst, const float* o, int64_t dv, float& L, float lse, bool first,
                        float* extra = nullptr, float x = 0.f) {
  if (first) {  // every query's first visit: nothing to read back
    simd::stream_row(dst, o, dv);
    L = lse;
    if (extra) *extra = x;
    return;
  }
  if (L == -kInf && lse != -kInf) {
    std::copy(o, o + dv, dst);
    L = lse;
    if (extra) *extra = x;
    return;
  }
  if (lse == -kInf) return;
  const float mx = std::max(L, lse), a = std::exp2(L - mx), c = std::exp2(lse - mx);
  const float inv = 1.f / (a + c);
  simd::blend_row(dst, a * inv, o, c * inv, dv);
  if (extra) *extra = a * inv * *extra + c * inv * x;
  L = mx + std::log2(a + c);
}

}  // namespace clattn::tile
