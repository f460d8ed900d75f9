// Double-precision reference of (improved-)clustered attention, also used by the tests' finite
// differences (which perturb q, k, v in double with the clusters fixed).
#pragma once

#include <vector>

#include "attention/clustered.h"

namespace clattn {

struct RefProblem {
  AttentionDims d;
  double scale = 0;
  std::vector<double> q, k, v;       // contiguous (B, H, N, Dk), (B, Hkv, M, Dk), (B, Hkv, M, Dv)
  std::vector<int32_t> qlen, klen;   // empty = full
  static RefProblem from(const AttentionInputs& in, float scale);
};

// out (B, H, N, Dv) with the clusters (order, offsets) and top-k sets of st.
void attn_clustered_ref(const RefProblem& pr, const ClusteredState& st, std::vector<double>& out);

}  // namespace clattn
