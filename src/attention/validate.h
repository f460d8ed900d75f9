// Input validation shared by every variant: the public checks of the attention contract
// (clattn/validate.h) and the internal helpers the kernels use beside them (bounds on magnitudes,
// the resolved scale, valid counts per batch).
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

#include "clattn/attention.h"
#include "clattn/validate.h"

namespace clattn {

// Largest |x| over a rank-2 or rank-4 view (finite entries; -inf of a bias mask is skipped).
double max_abs(ConstView t);

// Finite inputs whose float arithmetic would still overflow are refused with the bound they break,
// never answered with 0, NaN or inf. The bounds are worst cases from the largest magnitudes (one
// pass over q, k, v, bias), so they refuse only inputs within a few orders of magnitude of FLT_MAX:
//   softmax: logits scale·Dk·max|q|·max|k| + max|bias| <= kMaxLogit (differences of log2-unit
//            logits must stay finite: 2·1.44·1e37 << FLT_MAX), and M·max|v| <= kMaxValueSum (the
//            unnormalised Σ_j p_j v_j, p_j <= 1, of an online softmax).
//   linear:  Dk·M·(max|q| + 1)·(max|k| + 1)·(max|v| + 1) <= kMaxValueSum (φ(x) = elu(x) + 1 <= |x| + 1:
//            the key-value state, the normaliser and the numerator all stay below it).
inline constexpr double kMaxLogit = 1e37;
inline constexpr double kMaxValueSum = 1e37;
void check_softmax_range(const AttentionInputs& in, const AttentionDims& d, float scale,
                         std::string_view who);
void check_linear_range(const AttentionInputs& in, const AttentionDims& d, std::string_view who);

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
