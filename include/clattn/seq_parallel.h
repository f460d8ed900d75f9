// Sequence parallelism (docs/sequence-parallel.md): one sequence's positions split across the
// ranks of a communicator, every rank holding its positions' q, k, v rows (all heads), and
// attention computed together with communication that, for clustered attention, does not grow
// with the sequence.
//
//   full                ring attention: K/V blocks pass around the ring (non-blocking, while the
//                       tiled kernel runs on the block at hand), partial results merged by their
//                       log-sum-exp; causal with a zig-zag layout (rank r holds chunks r and 2R−1−r
//                       of 2R), so every rank does the same work. O(N·D) per layer and rank.
//   clustered,          the same LSH planes on every rank; Hamming k-means with global centroids
//   improved-clustered  (each round adds per-cluster bit counts across ranks: exact, so the
//                       clusters are those of one process); centroid queries from member sums
//                       added in position order along the ranks (the bits of one process); each
//                       centroid's attention over the local keys merged across ranks by log-sum-exp;
//                       improved: each centroid's top-k merged from the per-rank top-k (the sets
//                       of one process) and those keys' K/V rows gathered from their owners.
//                       Non-causal. O(C·(D + bits)) per layer and head for clustered, O(C·k·D)
//                       for improved — independent of N.
//   anything else       refused, naming the variants that run split.
// Backward: each rank's dq, dk, dv for its own positions; gradients of remote keys go back to
// their owners (ring: with the blocks; improved: added across ranks for the gathered rows).
//
// Outputs and gradients equal one process's to rounding (tested to 1e-5 relative for 2, 3 and 4
// ranks); cluster assignments and top-k sets are identical.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "clattn/attention.h"
#include "clattn/comm.h"

namespace clattn {

// Which global positions each rank holds: contiguous slices (rank r: positions [N·r/R, N·(r+1)/R)),
// or the zig-zag layout of causal attention (2R chunks of sizes differing by at most one; rank r
// holds chunk r then chunk 2R−1−r, in that order, as its local rows).
struct SeqSplit {
  int64_t N = 0;
  int ranks = 1;
  bool zigzag = false;
  // Per rank: (global start, length) segments in local row order.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> segments;

  static SeqSplit contiguous(int64_t N, int ranks);
  static SeqSplit zig_zag(int64_t N, int ranks);
  int64_t local_rows(int rank) const;
  // The global position of local row i of `rank`.
  int64_t global(int rank, int64_t i) const;
};

// Whether `att` runs sequence-parallel (with a causal mask when `causal`); else why not, naming
// the variants that do.
bool sequence_parallel_supported(const Attention& att, bool causal, std::string* why = nullptr);

// Forward of self-attention over a split sequence. On rank r of comm: in.q (B, H, n_r, Dk) and
// in.k, in.v (B, Hkv, n_r, D) are its local rows in split order; in.query_lengths / key_lengths
// hold each sequence's GLOBAL valid length (positions at or past it are padding); in.causal
// selects the causal mask (then split must be zig-zag); no bias, no cache. out (B, H, n_r, Dv).
// ctx keeps what the backward needs. Every rank calls it together.
void sequence_parallel_forward(Communicator& comm, const SeqSplit& split, const Attention& att,
                               const AttentionInputs& in, View out, Context& ctx);
// The backward: accumulates (+=) this rank's dq, dk, dv from dout (B, H, n_r, Dv); out as the
// forward wrote it.
void sequence_parallel_backward(Communicator& comm, const SeqSplit& split, const Attention& att,
                                const AttentionInputs& in, ConstView out, Context& ctx, ConstView dout,
                                View dq, View dk, View dv);

// What the sequence-split kernels called on this thread sent since its last reset, counted by a
// counting communicator around the caller's (CommTraffic in comm.h: bytes to other ranks, an
// all-reduce of n bytes as 2n(R−1)/R, and the milliseconds this rank was blocked; what overlapped
// compute, as ring attention's next block, is not). Per thread: a rank communicates from one
// thread, and ranks that are threads of one process (run_ranks_in_threads) count apart. The
// agreement checks every rank runs before the kernels are not counted.
using SeqParallelTraffic = CommTraffic;
SeqParallelTraffic sequence_parallel_traffic();
void reset_sequence_parallel_traffic();

// Milliseconds (the slowest rank's) to pass a block of `bytes` R − 1 hops around the ring of comm
// with nothing else running: what ring attention's transfers of one forward layer cost when not
// overlapped (every rank calls it). 1 − wait_ms / this is the share of them the compute hid.
double ring_transfer_ms(Communicator& comm, size_t bytes);

}  // namespace clattn
