// What a variant implements to run with one sequence split across ranks (seq_parallel.h): the
// object Attention::split() returns. sequence_parallel_forward / _backward check the call on every
// rank (shapes, global lengths, the whole sequence's magnitudes against this variant's softmax
// scale), wrap the communicator in a counting one, and then hand it here. The variant keeps what
// its backward needs in the Context, as a ContextState of its own: nothing here knows its kernels,
// so a variant that splits is added in its own folder (ring attention: attention/full/ring.cpp;
// split clustered attention: attention/clustered/split.cpp).
#pragma once

#include <cstdint>

#include "clattn/attention.h"
#include "clattn/comm.h"
#include "clattn/seq_parallel.h"

namespace clattn {

class SplitAttention {
 public:
  virtual ~SplitAttention() = default;
  // Whether ctx holds what this variant's split forward leaves, so a backward refuses another's.
  virtual bool holds_state(const Context& ctx) const = 0;
  // The softmax scale at head dim Dk, for the overflow rule over the whole sequence.
  virtual float scale_at(int64_t Dk) const = 0;
  // Whether centroids sum member queries (clustered): their range is checked too.
  virtual bool sums_queries() const = 0;
  // Every rank calls these together; the scratch a call borrows is ctx.scratch().
  virtual void forward(Communicator& comm, const SeqSplit& split, const AttentionInputs& in, View out,
                       Context& ctx) const = 0;
  virtual void backward(Communicator& comm, const SeqSplit& split, const AttentionInputs& in, ConstView out,
                        Context& ctx, ConstView dout, View dq, View dk, View dv) const = 0;
};

}  // namespace clattn
