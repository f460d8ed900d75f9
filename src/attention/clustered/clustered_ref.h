// Double-precision reference of (improved-)clustered attention, also used by the tests' finite
// differences (which perturb q, k, v in double with the clusters fixed).
#pragma once

#include <vector>

#include "attention/clustered/clustered.h"
#include "attention/tile/ref_problem.h"

namespace clattn {

// out (B, H, N, Dv) with the clusters (order, offsets) and top-k sets of st.
void attn_clustered_ref(const RefProblem& pr, const ClusteredState& st, std::vector<double>& out);

}  // namespace clattn
