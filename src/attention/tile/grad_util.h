// Key-gradient plumbing shared by the backward passes.
#pragma once

#include <cstdint>

#include "clattn/attention.h"

namespace clattn {

// With grouped-query attention several query heads write the same key rows, so their backward
// tasks write per-query-head partials instead; this adds them up: dk[b, hk, j] += Σ_g part[b,
// hk·G + g, j, 0:Dk] and dv likewise from offset voff. part is (B, H, rows, ld).
void reduce_group_partials(const AttentionInputs& in, const AttentionDims& d, const float* part,
                           int64_t rows, int64_t ld, int64_t voff, View dk, View dv);

}  // namespace clattn
