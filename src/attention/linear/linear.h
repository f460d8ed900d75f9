// Linear attention (Katharopoulos et al. 2020): φ(x) = elu(x) + 1,
//   O_i = φ(q_i)ᵀ S_i / (φ(q_i) · z_i + eps),  S_i = Σ_{j visible} φ(k_j) v_jᵀ,  z_i = Σ φ(k_j).
// Without a causal mask every query sees every valid key (S_i = S); with it, query i sees keys
// j <= i + (M − N), by running prefix sums. eps = 1e-6 as in fast-transformers; `scale` does not
// apply (the kernel has no temperature).
#pragma once

#include <vector>

#include "attention/tile/ref_problem.h"
#include "clattn/attention.h"

namespace clattn {

inline constexpr float kLinearEps = 1e-6f;

struct LinearWorkspace;  // per-thread tiles, kept in the caller's Scratch

void attn_linear_fwd(const AttentionInputs& in, const AttentionDims& d, View out,
                     LinearWorkspace& ws);
void attn_linear_bwd(const AttentionInputs& in, const AttentionDims& d, ConstView dout, View dq,
                     View dk, View dv, LinearWorkspace& ws);

// The direct O(N·M) evaluation of the same kernelised attention, in double.
void attn_linear_ref(const RefProblem& pr, std::vector<double>& out);  // out (B, H, N, Dv)

}  // namespace clattn
