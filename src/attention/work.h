// Building blocks of the variants' work models (clattn/attention.h, WorkModel): the products of
// softmax attention over a set of (query, key) pairs, the bytes of a call's inputs and outputs,
// and the pairs a causal or banded mask leaves visible. Every count is for the whole call
// (all batches and heads); a variant's work() composes them stage by stage.
#pragma once

#include <cstdint>

#include "clattn/attention.h"

namespace clattn::work {

// (query, key) pairs of one head that a query of N sees among M keys: all of them, or with the
// causal mask key j <= i + (M - N).
double visible_pairs(int64_t N, int64_t M, bool causal);
// Pairs of one head when each query keeps at most k of the keys it sees (top-k sets).
double capped_pairs(int64_t N, int64_t M, int64_t k, bool causal);
// Pairs of one head under the `local` band of width w (|i - j| <= w/2, causal: i - w < j <= i).
double band_pairs(int64_t N, int64_t M, int64_t w, bool causal);

// Softmax attention over `pairs` (query, key) pairs per query head, for B·H heads:
// forward S = Q·Kᵀ and O = P·V; backward S again, dV, dP, dQ and dK.
double softmax_fwd_flops(const AttentionDims& d, double pairs);
double softmax_bwd_flops(const AttentionDims& d, double pairs);

// The call's own inputs and outputs: q, k, v read and out written; backward also reads out and
// dO and writes dq, dk and dv.
double io_bytes(const AttentionDims& d, bool backward);

// The stage every exact variant has: softmax attention over `pairs` per head, with the call's
// input and output bytes, forward (and backward with Mode::training).
WorkModel softmax_attention(const AttentionDims& d, double pairs, Mode mode, const char* name = "attention");

}  // namespace clattn::work
