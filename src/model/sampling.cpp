// Token sampling for generation (model.h): greedy, temperature, top-k, top-p, reproducible draws.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <vector>

#include "clattn/error.h"
#include "clattn/model.h"
#include "clattn/rng.h"
#include "model/weights.h"

namespace clattn {

int32_t sample_token(std::span<const float> logits, const SamplingOptions& opt, uint64_t step) {
  const int64_t V = static_cast<int64_t>(logits.size());
  check(V >= 1, "sample: no logits");
  check(opt.temperature >= 0 && std::isfinite(opt.temperature), "sample: temperature must be >= 0, got ", opt.temperature);
  check(opt.top_k >= 0, "sample: top_k must be >= 0, got ", opt.top_k);
  check(opt.top_p > 0 && opt.top_p <= 1, "sample: top_p must be in (0, 1], got ", opt.top_p);
  // A NaN breaks the strict weak order std::sort needs (undefined behaviour, garbage tokens) and
  // max_element's answer; an Inf makes every probability NaN. Either means the forward failed.
  const int64_t bad = first_non_finite(logits.data(), V);
  check(bad == V, "sample: the logits must be finite, got ", logits[static_cast<size_t>(bad == V ? 0 : bad)],
        " for token ", bad, " of ", V, " (the model's forward overflowed or its inputs hold NaN)");
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
std::vector<int32_t> generate(Decoder& dec, std::span<const int32_t> prompt, int64_t max_tokens,
                              const SamplingOptions& opt, int32_t eos, const std::function<void(int32_t)>& on_token,
                              GenerateStats* stats) {
  using Clock = std::chrono::steady_clock;
  check(!prompt.empty(), "generate: the prompt holds no token");
  check(max_tokens >= 0, "generate: max_tokens must be >= 0, got ", max_tokens);
  const int64_t cap = static_cast<int64_t>(prompt.size()) + max_tokens;
  const int64_t ctx = dec.config().max_positions;
  check(ctx <= 0 || cap <= ctx, "generate: the prompt (", prompt.size(), " tokens) and ", max_tokens,
        " new tokens exceed the model's context of ", ctx);
  dec.start(cap);
  const auto t0 = Clock::now();
  std::vector<float> logits = dec.prefill(prompt);
  const auto t1 = Clock::now();
  std::vector<int32_t> out;
  int64_t steps = 0;
  for (int64_t made = 0; made < max_tokens; ++made) {
    const int32_t next = sample_token(logits, opt, static_cast<uint64_t>(made));
    if (next == eos && eos >= 0) break;
    out.push_back(next);
    if (on_token) on_token(next);
    if (made + 1 < max_tokens) {
      logits = dec.step(next);
      ++steps;
    }
  }
  if (stats) {
    stats->prefill_s = std::chrono::duration<double>(t1 - t0).count();
    stats->decode_s = std::chrono::duration<double>(Clock::now() - t1).count();
    stats->steps = steps;
  }
  return out;
}

}  // namespace clattn
