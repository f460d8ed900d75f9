// Token sampling for generation (model.h): penalties, greedy, temperature, top-k, top-p, min-p,
// reproducible draws; and the generation loop with its context shift.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "clattn/error.h"
#include "clattn/model.h"
#include "clattn/rng.h"
#include "core/ascii.h"
#include "model/weights.h"

namespace clattn {

void check_sampling(const SamplingOptions& opt) {
  check(opt.temperature >= 0 && std::isfinite(opt.temperature), "sample: temperature must be >= 0, got ", opt.temperature);
  check(opt.top_k >= 0, "sample: top_k must be >= 0, got ", opt.top_k);
  check(opt.top_p > 0 && opt.top_p <= 1, "sample: top_p must be in (0, 1], got ", opt.top_p);
  check(opt.min_p >= 0 && opt.min_p <= 1, "sample: min_p must be in [0, 1], got ", opt.min_p);
  check(opt.repeat_penalty > 0 && std::isfinite(opt.repeat_penalty), "sample: repeat_penalty must be > 0 (1: off), got ",
        opt.repeat_penalty);
  check(std::isfinite(opt.frequency_penalty), "sample: frequency_penalty must be finite, got ", opt.frequency_penalty);
  check(std::isfinite(opt.presence_penalty), "sample: presence_penalty must be finite, got ", opt.presence_penalty);
  check(opt.repeat_last_n >= -1, "sample: repeat_last_n must be >= -1 (-1: the whole history, 0: off), got ",
        opt.repeat_last_n);
}

namespace {

bool penalises(const SamplingOptions& opt) {
  return opt.repeat_last_n != 0 && (opt.repeat_penalty != 1.f || opt.frequency_penalty != 0.f || opt.presence_penalty != 0.f);
}

// Step 1 of SamplingOptions: the penalised logits (vocab).
std::vector<float> penalised(std::span<const float> logits, const SamplingOptions& opt, std::span<const int32_t> history) {
  const int64_t V = static_cast<int64_t>(logits.size());
  std::vector<float> l(logits.begin(), logits.end());
  const size_t n = opt.repeat_last_n < 0 ? history.size() : std::min(history.size(), static_cast<size_t>(opt.repeat_last_n));
  std::vector<int32_t> seen(history.end() - static_cast<std::ptrdiff_t>(n), history.end());
  for (const int32_t t : seen)
    check(t >= 0 && t < V, "sample: the history holds token ", t, ", outside the vocabulary of ", V);
  std::sort(seen.begin(), seen.end());
  for (size_t i = 0; i < seen.size();) {
    size_t j = i;
    while (j < seen.size() && seen[j] == seen[i]) ++j;
    float& x = l[static_cast<size_t>(seen[i])];
    x = x > 0 ? x / opt.repeat_penalty : x * opt.repeat_penalty;
    x -= static_cast<float>(j - i) * opt.frequency_penalty + opt.presence_penalty;
    i = j;
  }
  return l;
}

}  // namespace

int32_t sample_token(std::span<const float> logits_in, const SamplingOptions& opt, uint64_t step,
                     std::span<const int32_t> history) {
  const int64_t V = static_cast<int64_t>(logits_in.size());
  check(V >= 1, "sample: no logits");
  check_sampling(opt);
  // A NaN breaks the strict weak order std::sort needs (undefined behaviour, garbage tokens) and
  // max_element's answer; an Inf makes every probability NaN. Either means the forward failed.
  const int64_t bad = first_non_finite(logits_in.data(), V);
  check(bad == V, "sample: the logits must be finite, got ", logits_in[static_cast<size_t>(bad == V ? 0 : bad)],
        " for token ", bad, " of ", V, " (the model's forward overflowed or its inputs hold NaN)");
  std::vector<float> own;
  if (penalises(opt)) own = penalised(logits_in, opt, history);
  const std::span<const float> logits = own.empty() ? logits_in : std::span<const float>(own);
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
  for (int64_t i = 0; i < k; ++i)
    sum += p[static_cast<size_t>(i)] = std::exp((logits[static_cast<size_t>(idx[static_cast<size_t>(i)])] - mx) / opt.temperature);
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
  // min-p: p is sorted, p[0] = 1 is the largest, so the kept set stays a prefix.
  while (keep > 1 && p[static_cast<size_t>(keep - 1)] < opt.min_p * p[0]) --keep;
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
                              GenerateStats* stats, const GenerateControl& control) {
  using Clock = std::chrono::steady_clock;
  check(!prompt.empty(), "generate: the prompt holds no token");
  check(max_tokens >= 0, "generate: max_tokens must be >= 0, got ", max_tokens);
  check_sampling(opt);
  const int64_t P = static_cast<int64_t>(prompt.size());
  const int64_t cap = P + max_tokens;
  const int64_t ctx = dec.config().max_positions;
  const bool on = control.context_shift != ContextShift::off;
  const bool shifts = on && ctx > 0 && cap > ctx;
  if (on && ctx > 0) {
    check(control.keep >= 0 && control.keep <= ctx - 2, "generate: the context shift keeps ", control.keep,
          " tokens, but a model of ", ctx, " positions leaves room for at most ", ctx - 2);
    check(P <= ctx, "generate: the prompt (", P, " tokens) exceeds the model's context of ", ctx,
          " (a context shift drops generated tokens, not the prompt's)");
  }
  check(shifts || ctx <= 0 || cap <= ctx, "generate: the prompt (", P, " tokens) and ", max_tokens,
        " new tokens exceed the model's context of ", ctx, " (a context shift continues past it: --context-shift)");
  const ContextShift how = control.context_shift == ContextShift::automatic
                               ? (dec.can_shift() ? ContextShift::rotate : ContextShift::reencode)
                               : control.context_shift;
  check(!shifts || how != ContextShift::rotate || dec.can_shift(), "generate: ", dec.config().model_type,
        "'s learned absolute positions are in every cached key and value, so a rotate context shift cannot move them: "
        "use the reencode shift (it encodes the window again)");
  dec.start(shifts ? ctx : cap);
  const auto t0 = Clock::now();
  std::vector<float> logits = dec.prefill(prompt);
  const auto t1 = Clock::now();
  std::vector<int32_t> seq(prompt.begin(), prompt.end());  // the prompt and every new token: the history
  seq.reserve(static_cast<size_t>(cap));
  std::vector<int32_t> out;
  int64_t steps = 0, shifted = 0;
  double context = 0;  // sum over the steps of the positions cached before each
  for (int64_t made = 0; made < max_tokens; ++made) {
    const int32_t next = sample_token(logits, opt, static_cast<uint64_t>(made), seq);
    if (next == eos && eos >= 0) break;
    out.push_back(next);
    seq.push_back(next);
    if (on_token) on_token(next);
    if (control.stop && control.stop(out)) break;
    if (made + 1 == max_tokens) break;
    if (shifts && dec.position() == ctx) {
      // The cache is full: keep [0, keep), drop the oldest half of the rest, and go on from the
      // window (ending in `next`).
      const int64_t discard = (ctx - control.keep) / 2;
      ++shifted;
      if (how == ContextShift::rotate) {
        dec.shift(control.keep, discard);
      } else {
        std::vector<int32_t> window(seq.begin(), seq.begin() + control.keep);
        window.insert(window.end(), seq.end() - (ctx + 1 - control.keep - discard), seq.end());
        dec.start(ctx);
        logits = dec.prefill(window);
        continue;
      }
    }
    context += static_cast<double>(dec.position());
    logits = dec.step(next);
    ++steps;
  }
  if (stats) {
    stats->prefill_s = std::chrono::duration<double>(t1 - t0).count();
    stats->decode_s = std::chrono::duration<double>(Clock::now() - t1).count();
    stats->steps = steps;
    stats->mean_context = steps > 0 ? context / static_cast<double>(steps) : 0;
    stats->shifts = shifted;
    stats->shifted_by = shifted > 0 ? how : ContextShift::off;
  }
  return out;
}

const char* context_shift_name(ContextShift s) {
  switch (s) {
    case ContextShift::automatic: return "auto";
    case ContextShift::rotate: return "rotate";
    case ContextShift::reencode: return "reencode";
    default: return "off";
  }
}

ContextShift parse_context_shift(std::string_view s) {
  const std::string low = detail::ascii_lower(s);
  for (ContextShift c : {ContextShift::off, ContextShift::automatic, ContextShift::rotate, ContextShift::reencode})
    if (low == context_shift_name(c)) return c;
  throw Error(detail::concat("context shift must be off, auto, rotate or reencode, got \"", s, "\""));
}

StopStrings::StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const std::string& x : stops_) check(!x.empty(), "generate: a stop string must not be empty");
}

bool StopStrings::feed(std::string_view piece) {
  if (stopped_) return true;
  const size_t from = text_.size();
  text_ += piece;
  // The earliest stop string that ends in the new piece (none ended before it).
  size_t cut = std::string::npos;
  for (const std::string& x : stops_) {
    const size_t start = from >= x.size() - 1 ? from - (x.size() - 1) : 0;
    const size_t at = text_.find(x, start);
    if (at != std::string::npos) cut = std::min(cut, at);
  }
  if (cut != std::string::npos) {
    text_.resize(cut);
    safe_ = cut;
    return stopped_ = true;
  }
  // Hold back the longest tail that is a proper prefix of a stop string.
  size_t hold = 0;
  for (const std::string& x : stops_)
    for (size_t n = std::min(x.size() - 1, text_.size()); n > hold; --n)
      if (text_.compare(text_.size() - n, n, x, 0, n) == 0) {
        hold = n;
        break;
      }
  safe_ = text_.size() - hold;
  return false;
}

}  // namespace clattn
