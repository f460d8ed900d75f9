// A problem in double for the references and the tests' finite differences (which perturb q, k,
// v in double with every discrete choice held fixed).
#pragma once

#include <cstdint>
#include <vector>

#include "clattn/attention.h"

namespace clattn {

struct RefProblem {
  AttentionDims d;
  double scale = 0;                  // resolved: 1/sqrt(Dk) when the spec gave none
  bool causal = false;
  std::vector<double> q, k, v;       // contiguous (B, H, N, Dk), (B, Hkv, M, Dk), (B, Hkv, M, Dv)
  std::vector<int32_t> qlen, klen;   // empty = full
  static RefProblem from(const AttentionInputs& in, float scale);
  int64_t nq(int64_t b) const { return qlen.empty() ? d.N : qlen[static_cast<size_t>(b)]; }
  int64_t nk(int64_t b) const { return klen.empty() ? d.M : klen[static_cast<size_t>(b)]; }
  double qe(int64_t b, int64_t h, int64_t i, int64_t e) const {
    return q[static_cast<size_t>(((b * d.H + h) * d.N + i) * d.Dk + e)];
  }
  double ke(int64_t b, int64_t h, int64_t j, int64_t e) const {  // h is the query head
    return k[static_cast<size_t>(((b * d.Hkv + h / d.group()) * d.M + j) * d.Dk + e)];
  }
  double ve(int64_t b, int64_t h, int64_t j, int64_t e) const {
    return v[static_cast<size_t>(((b * d.Hkv + h / d.group()) * d.M + j) * d.Dv + e)];
  }
  // The logit the softmax variants use: scale · q_i · k_j.
  double logit(int64_t b, int64_t h, int64_t i, int64_t j) const;
  // o (Dv) += weight · Σ_x softmax(logits)_x · v_{keys[x]}, with logits[x] the logit of keys[x]
  // (a key listed twice counts twice). The last step of every sparse reference.
  void softmax_add(int64_t b, int64_t h, const std::vector<int64_t>& keys,
                   std::vector<double> logits, double weight, double* o) const;
};

}  // namespace clattn
