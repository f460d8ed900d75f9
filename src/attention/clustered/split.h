// Clustered and improved-clustered attention over a sequence split across ranks (split.cpp; the
// algorithm in include/clattn/seq_parallel.h): the state a split forward leaves its backward.
#pragma once

#include <cstdint>
#include <vector>

#include "attention/clustered/clustered.h"
#include "clattn/attention.h"
#include "clattn/comm.h"
#include "clattn/seq_parallel.h"
#include "clattn/tensor.h"

namespace clattn::sp {

// What the backward reads, per (b, h): assignment, centroids, centroid log-sum-exp, outputs, and
// for improved the top-k rows gathered from their owners.
struct ClusteredSplitState : ContextState {
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
    return held_bytes(ncl, assign, count, ksel, topk) + qc.bytes() + lse_c.bytes() + vc.bytes() + mass.bytes() +
           krows.bytes() + vrows.bytes() + members.bytes();
  }
};

// Over a contiguous split; comm counts the traffic (seq_parallel.cpp wraps the caller's).
void clustered_forward(Communicator& comm, const SeqSplit& split, const ClusteredParams& p, uint64_t step,
                       const AttentionInputs& in, View out, ClusteredSplitState& st, Scratch& scratch);
void clustered_backward(Communicator& comm, const SeqSplit& split, const ClusteredParams& p,
                        const AttentionInputs& in, ConstView out, const ClusteredSplitState& st, ConstView dout,
                        View dq, View dk, View dv, Scratch& scratch);

}  // namespace clattn::sp
