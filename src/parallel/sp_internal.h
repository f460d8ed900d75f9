// What the sequence-parallel attentions share (include/clattn/seq_parallel.h): traffic counters
// around the communicator, per-batch lengths of a split's pieces, and their saved states.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "attention/clustered/clustered.h"
#include "clattn/attention.h"
#include "clattn/comm.h"
#include "clattn/seq_parallel.h"
#include "clattn/tensor.h"

namespace clattn::sp {

// Counts what this rank sends (seq_parallel.cpp).
void count_bytes(uint64_t bytes);

// Traffic-counted communication.
void all_reduce(Communicator& c, double* x, size_t n);
void all_reduce(Communicator& c, int64_t* x, size_t n);
void all_reduce(Communicator& c, float* x, size_t n);
void all_reduce_max(Communicator& c, double* x, size_t n);
void all_gather(Communicator& c, const void* send, size_t bytes, void* recv);
// Each rank contributes `bytes`; rank i's counts[i] bytes land at displs[i] of recv on every rank.
void all_gatherv(Communicator& c, const void* send, size_t bytes, void* recv, std::span<const size_t> counts,
                 std::span<const size_t> displs);
// Rank r sends send_counts[j] bytes at send_displs[j] to rank j and receives recv_counts[i] bytes
// at recv_displs[i] from rank i; counted: what goes to the other ranks.
void all_to_allv(Communicator& c, const void* send, std::span<const size_t> send_counts,
                 std::span<const size_t> send_displs, void* recv, std::span<const size_t> recv_counts,
                 std::span<const size_t> recv_displs);
std::unique_ptr<CommRequest> isend(Communicator& c, const void* data, size_t bytes, int to, int tag);
std::unique_ptr<CommRequest> irecv(Communicator& c, void* data, size_t bytes, int from, int tag);

// Valid positions of each batch row inside [start, start + len) of the sequence: lengths (B)
// clamped, or len when the inputs have no lengths.
std::vector<int32_t> piece_lengths(std::span<const int32_t> global, int64_t B, int64_t start, int64_t len);

// Saved between a forward and its backward.
struct SpState : ContextState {
  const char* kind = nullptr;  // SplitAttention::kind() of the forward that filled it
  Tensor parts;  // ring: (2, B, H, n_local) merged row max (log2 units) and log2 of the row sum
  // clustered: what the backward reads, per (b, h): assignment, centroids, centroid log-sum-exp,
  // outputs, and for improved the top-k rows gathered from their owners.
  std::vector<int32_t> ncl;      // (B·H) clusters used
  std::vector<int32_t> assign;   // (B·H, n_local) cluster of each local query, -1 for padding
  std::vector<int64_t> count;    // (B·H, cmax) members of each cluster, over all ranks
  int64_t cmax = 0, kmax = 0;
  Tensor qc;                     // (B·H, cmax, Dk)
  Tensor lse_c;                  // (B·H, cmax) natural log
  Tensor vc;                     // (B·H, cmax, Dv) Vc_j (clustered) or R_j (improved)
  Tensor mass;                   // (B·H, cmax) improved: m_j
  std::vector<int32_t> ksel;     // (B·H) k used
  std::vector<int64_t> topk;     // (B·H, cmax, kmax) T_j as global key positions, ascending
  Tensor krows, vrows;           // (B·H, cmax·kmax, Dk / Dv) the T_j rows, gathered
  ClusteredState members;        // improved: the member stage's state over the gathered rows
  size_t bytes() const override {
    return parts.bytes() + held_bytes(ncl, assign, count, ksel, topk) + qc.bytes() + lse_c.bytes() + vc.bytes() +
           mass.bytes() + krows.bytes() + vrows.bytes() + members.bytes();
  }
};

// Ring attention (attention/full/ring.cpp): full softmax attention over a split sequence.
void ring_forward(Communicator& comm, const SeqSplit& split, float scale, const AttentionInputs& in, View out,
                  SpState& st, Scratch& scratch);
void ring_backward(Communicator& comm, const SeqSplit& split, float scale, const AttentionInputs& in, ConstView out,
                   const SpState& st, ConstView dout, View dq, View dk, View dv, Scratch& scratch);

// Clustered and improved-clustered attention over a contiguous split (attention/clustered/split.cpp).
void clustered_forward(Communicator& comm, const SeqSplit& split, const ClusteredParams& p, uint64_t step,
                       const AttentionInputs& in, View out, SpState& st, Scratch& scratch);
void clustered_backward(Communicator& comm, const SeqSplit& split, const ClusteredParams& p,
                        const AttentionInputs& in, ConstView out, const SpState& st, ConstView dout, View dq, View dk,
                        View dv, Scratch& scratch);

}  // namespace clattn::sp
