// Input validation shared by every variant: the public checks of the attention contract
// (clattn/validate.h) and the internal helpers the kernels use beside them (bounds on magnitudes,
// the resolved scale, valid counts per batch).
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "clattn/attention.h"
#include "clattn/validate.h"

namespace clattn {

// Largest |x| over a rank-2 or rank-4 view (finite entries; -inf of a bias mask is skipped).
double max_abs(ConstView t);

// validate_inputs (clattn/validate.h) that also returns the magnitudes (Magnitudes), found by its
// finiteness pass (one read of q, k, v; a KVCache keeps those of its rows from their append), so
// the overflow rule below costs no second pass over the data.
AttentionDims validate_inputs(const AttentionInputs& in, const Capabilities& caps, std::string_view who,
                              Magnitudes& mag);
// validate_backward that returns max |dout| (from its finiteness pass).
double validate_backward_max(const AttentionInputs& in, const AttentionDims& d, ConstView out, ConstView dout,
                             ConstView dq, ConstView dk, ConstView dv, std::string_view who);
// check_finite that returns the largest |x| (the same single pass).
double finite_max_abs(ConstView t, std::string_view what, std::string_view who);

// The one overflow rule: finite inputs whose float arithmetic could still overflow are refused with
// the bound they break, never answered with 0, NaN or inf, by every variant, forward and backward
// (the decode step over a KVCache included). The bounds are worst cases from the largest
// magnitudes, so they refuse only inputs within a few orders of magnitude of FLT_MAX:
//   softmax (every variant but linear; s the logit scale: scale=, 1/sqrt(Dk), or 1 for
//   reformer, whose keys are unit vectors):
//     forward   logits s·Dk·max|q|·max|k| + max|bias| <= kMaxLogit (differences of log2-unit logits
//               stay finite: 2·1.44·1e37 << FLT_MAX; a centroid or a sum of unit vectors is no
//               larger than its largest member), and M·max|v| <= kMaxValueSum (an unnormalised
//               Σ_j p_j v_j with p_j <= 1, the value of a centroid's attention summed over a
//               cluster);
//     backward  also L·max|dO| <= kMaxValueSum (dV and a cluster's summed dO, L = max(N, M)) and
//               2·L·Dv·max|dO|·max|v|·max(1, s·Dk·max(max|q|, max|k|)) <= kMaxValueSum (dP = dO·vᵀ
//               summed over a cluster, dS, and dQ, dK = s·Σ dS·k, s·Σ dS·q).
//   linear:  Dk·M·(max|q| + 1)·(max|k| + 1)·(max|v| + 1) <= kMaxValueSum (φ(x) = elu(x) + 1 <= |x| + 1:
//            the key-value state, the normaliser and the numerator all stay below it); backward
//            also with the factor (max|dO| + 1)·max(N, M).
//   clustering (clustered, improved-clustered, routing, smyrf, reformer; forward and backward):
//   max(N, M)·max(max|q|, max|k|) <= kMaxValueSum (a centroid is summed before it is divided);
//   with `norms` also 4·Dk·max(max|q|, max|k|)² <= kMaxValueSum (squared norms and distances in
//   float: smyrf's transform, reformer's unit keys, routing's k-means).
inline constexpr double kMaxLogit = 1e37;
inline constexpr double kMaxValueSum = 1e37;
void check_softmax_range(const AttentionDims& d, const Magnitudes& m, double scale, std::string_view who);
void check_softmax_grad_range(const AttentionDims& d, const Magnitudes& m, double max_dout, double scale,
                              std::string_view who);
// validate_backward, then the backward's rule above (its dout pass gives max|dout|).
void validate_softmax_backward(const AttentionInputs& in, const AttentionDims& d, const Magnitudes& m, double scale,
                               ConstView out, ConstView dout, ConstView dq, ConstView dk, ConstView dv,
                               std::string_view who);
void check_member_range(const AttentionDims& d, const Magnitudes& m, bool norms, std::string_view who);
// After a forward or backward whose bounds above are not tight (the clustered family, at huge
// logits): results that overflowed are refused, naming the logit magnitude, never returned.
void check_results_finite(const AttentionDims& d, const Magnitudes& m, double scale,
                          std::initializer_list<ConstView> results, std::string_view who);
void check_linear_range(const AttentionDims& d, const Magnitudes& m, std::string_view who);
void check_linear_grad_range(const AttentionDims& d, const Magnitudes& m, double max_dout, std::string_view who);

// The softmax scale of a call: the spec's scale=, or 1/sqrt(Dk) when it gave none (0).
inline float softmax_scale(float scale, int64_t Dk) {
  return scale > 0 ? scale : 1.f / std::sqrt(static_cast<float>(Dk));
}

// Valid query / key count of batch b (lengths default to the full size).
inline int64_t valid_queries(const AttentionInputs& in, const AttentionDims& d, int64_t b) {
  return in.query_lengths.empty() ? d.N : in.query_lengths[static_cast<size_t>(b)];
}
inline int64_t valid_keys(const AttentionInputs& in, const AttentionDims& d, int64_t b) {
  return in.key_lengths.empty() ? d.M : in.key_lengths[static_cast<size_t>(b)];
}

}  // namespace clattn
