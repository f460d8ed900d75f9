// What a variant implements to run with one sequence split across ranks (seq_parallel.h): the
// object Attention::split() returns. sequence_parallel_forward / _backward check the call on every
// rank (shapes, global lengths, the whole sequence's magnitudes against this variant's softmax
// scale) and then hand it here. Ring attention (full, attention/full/ring.cpp) and split
// clustered attention (attention/clustered/split.cpp) are the two.
#pragma once

#include <cstdint>

#include "clattn/attention.h"
#include "clattn/comm.h"
#include "clattn/seq_parallel.h"
#include "parallel/sp_internal.h"

namespace clattn {

class SplitAttention {
 public:
  virtual ~SplitAttention() = default;
  // The name its saved state carries, so a backward refuses another variant's forward.
  virtual const char* kind() const = 0;
  // The softmax scale at head dim Dk, for the overflow rule over the whole sequence.
  virtual float scale_at(int64_t Dk) const = 0;
  // Whether centroids sum member queries (clustered): their range is checked too.
  virtual bool sums_queries() const = 0;
  virtual void forward(Communicator& comm, const SeqSplit& split, const AttentionInputs& in, View out,
                       sp::SpState& st, Scratch& scratch) const = 0;
  virtual void backward(Communicator& comm, const SeqSplit& split, const AttentionInputs& in, ConstView out,
                        const sp::SpState& st, ConstView dout, View dq, View dk, View dv, Scratch& scratch) const = 0;
};

}  // namespace clattn
