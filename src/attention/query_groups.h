// What the variants' Attention::query_groups share: the checks of its arguments and the state the
// training forward left.
#pragma once

#include <cstdint>
#include <string_view>

#include "attention/validate.h"
#include "clattn/attention.h"

namespace clattn {

// The forward's inputs checked as forward checks them, and (b, h) within them; their sizes.
inline AttentionDims query_groups_dims(const AttentionInputs& in, const Capabilities& caps, int64_t b,
                                       int64_t h, std::string_view who) {
  const AttentionDims d = validate_inputs(in, caps, who);
  check(b >= 0 && b < d.B && h >= 0 && h < d.H, who, ": query_groups of batch ", b, ", head ", h,
        " is out of range: the inputs have B = ", d.B, " and H = ", d.H);
  return d;
}

// The state a training forward of `who` left in ctx.
template <class T>
const T& query_groups_state(const Context& ctx, std::string_view who) {
  check(!ctx.inference(), who, ": query_groups reads the partition a forward keeps for backward, but this ",
        "context was made by Context::for_inference(), which keeps none");
  check(ctx.holds<T>(), who, ": query_groups needs the context filled by a forward of ", who);
  return ctx.saved<T>();
}

// The message of a state whose sizes are not those of `in`.
inline void check_query_groups_shapes(bool same, const AttentionInputs& in, std::string_view who) {
  check(same, who, ": query_groups inputs have shapes or a mask other than the forward's (q is now ", in.q.shape,
        in.causal ? ", causal)" : ")");
}

}  // namespace clattn
