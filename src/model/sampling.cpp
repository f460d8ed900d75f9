// Token sampling for generation (model.h): greedy, temperature, top-k, top-p, reproducible draws.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "clattn/error.h"
#include "clattn/model.h"
#include "clattn/rng.h"

namespace clattn {

int32_t sample_token(std::span<const float> logits, const SamplingOptions& opt, uint64_t step) {
  const int64_t V = static_cast<int64_t>(logits.size());
  check(V >= 1, "sample: no logits");
  check(opt.temperature >= 0 && std::isfinite(opt.temperature), "sample: temperature must be >= 0, got ", opt.temperature);
  check(opt.top_k >= 0, "sample: top_k must be >= 0, got ", opt.top_k);
  check(opt.top_p > 0 && opt.top_p <= 1, "sample: top_p must be in (0, 1], got ", opt.top_p);
  if (opt.temperature == 0.f)
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int32_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  // Candidates by decreasing logit (ties to the lower id), cut by top-k.
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
           (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
  });
  const int64_t k = opt.top_k > 0 ? std::min(opt.top_k, V) : V;
  std::vector<double> p(static_cast<size_t>(k));
  const double mx = logits[static_cast<size_t>(idx[0])];
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) sum += p[static_cast<size_t>(i)] = std::exp((logits[static_cast<size_t>(idx[static_cast<size_t>(i)])] - mx) / opt.temperature);
  // Nucleus: the smallest prefix whose mass reaches top_p.
  int64_t keep = k;
  double mass = 0;
  for (int64_t i = 0; i < k; ++i) {
    mass += p[static_cast<size_t>(i)] / sum;
    if (mass >= opt.top_p) {
      keep = i + 1;
      break;
    }
  }
  double kept = 0;
  for (int64_t i = 0; i < keep; ++i) kept += p[static_cast<size_t>(i)];
  const double r = Rng(opt.seed).uniform(step, 0) * kept;
  double acc = 0;
  for (int64_t i = 0; i < keep; ++i) {
    acc += p[static_cast<size_t>(i)];
    if (r < acc) return idx[static_cast<size_t>(i)];
  }
  return idx[static_cast<size_t>(keep - 1)];
}
}  // namespace clattn
