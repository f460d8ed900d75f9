// `clattn generate`: stream text from a decoder with any causal attention.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_util.h"
#include "clattn/cpu.h"
#include "clattn/error.h"
#include "clattn/model.h"
#include "clattn/threads.h"
#include "clattn/tokenizer.h"
#include "bench_util.h"
#include "commands.h"

namespace clattn::cli {
namespace {

struct GenerateOptions {
  std::string model, prompt, attention;  // empty: the plan the model was saved with
  std::string kv_cache = "f32", weights = "f32";
  int64_t tokens = 128;
  SamplingOptions sampling;
  std::vector<std::string> stop;
  std::string context_shift = "off";  // off, auto, rotate, reencode
  int64_t keep = -1;  // -1: the BOS when the prompt starts with one, else 0
  int threads = 0;
};

void run_generate(const GenerateOptions& o) {
  set_threads(checked_threads(o.threads, "generate"));
  check_size(o.tokens, 0, kMaxCount, "generate: --tokens");
  check_size(o.sampling.top_k, 0, kMaxCount, "generate: --top-k (0: all)");
  try {
    check_sampling(o.sampling);
  } catch (const Error& e) {
    // "sample: min_p must be ..." names the option as C++ and Python spell it: give the flag's name.
    std::string m = e.what();
    const size_t name = m.find(": ") + 2, end = m.find(' ', name);
    std::string flag = m.substr(name, end - name);
    std::replace(flag.begin(), flag.end(), '_', '-');
    usage_check(false, "generate: --", flag, m.substr(end));
  }
  for (const std::string& x : o.stop) usage_check(!x.empty(), "generate: --stop must not be empty");
  usage_check(o.keep >= -1, "generate: --keep must be >= 0, got ", o.keep);
  // The loader restores the plan a checkpoint was trained with (as Python's load_model does);
  // --attention replaces it.
  LoadOptions lo;
  lo.weights = parse_weight_type(o.weights);
  auto dec = Decoder::load(o.model, lo);
  if (!o.attention.empty()) dec->set_attention(o.attention);
  dec->set_kv_cache(parse_kv_cache_type(o.kv_cache));
  const Tokenizer tok = Tokenizer::from_file((std::filesystem::path(o.model) / "tokenizer.json").string());
  std::vector<int32_t> prompt = tok.encode(o.prompt);
  if (prompt.empty()) {
    usage_check(tok.bos_id() >= 0, "generate: the tokenizer of '", o.model,
                "' has no BOS token to start from (a byte-level model): give --prompt TEXT");
    prompt.push_back(tok.bos_id());
  }
  const int64_t ctx = dec->config().max_positions;
  const int64_t cap = static_cast<int64_t>(prompt.size()) + o.tokens;
  GenerateControl control;
  control.context_shift = parse_context_shift(o.context_shift);
  check(control.context_shift != ContextShift::off || ctx <= 0 || cap <= ctx, "generate: prompt (", prompt.size(),
        " tokens) + --tokens ", o.tokens, " exceed the model's context of ", ctx, " (--context-shift continues past it)");
  control.keep = o.keep >= 0 ? o.keep : (tok.bos_id() >= 0 && prompt.front() == tok.bos_id() ? 1 : 0);
  check_memory(dec->forward_bytes(1, static_cast<int64_t>(prompt.size()), ctx > 0 ? std::min(cap, ctx) : cap),
               "generate: " + o.model);
  for (size_t i = 0; i < prompt.size(); ++i)
    std::fputs(tok.decode_piece(i ? prompt[i - 1] : -1, prompt[i]).c_str(), stdout);
  std::fflush(stdout);
  int32_t prev = prompt.back();
  GenerateStats st;
  // With stop strings the text is shown as far as no stop string can still claim it.
  StopStrings stops(o.stop);
  size_t shown = 0;
  auto show = [&](size_t upto) {
    std::fwrite(stops.text().data() + shown, 1, upto - shown, stdout);
    std::fflush(stdout);
    shown = upto;
  };
  if (!o.stop.empty())
    control.stop = [&](std::span<const int32_t> made) {
      const bool hit = stops.feed(tok.decode_piece(prev, made.back()));
      prev = made.back();
      show(stops.safe());
      return hit;
    };
  const std::vector<int32_t> made = generate(*dec, prompt, o.tokens, o.sampling, tok.eos_id(), [&](int32_t next) {
    if (!o.stop.empty()) return;
    std::fputs(tok.decode_piece(prev, next).c_str(), stdout);
    std::fflush(stdout);
    prev = next;
  }, &st, control);
  if (!o.stop.empty()) show(stops.text().size());
  std::fputs("\n", stdout);
  std::fprintf(stderr, "generate: %s; prefill %zu tokens at %.0f tokens/s, decode %zu tokens at %.0f tokens/s%s\n",
               dec->attention_plan().c_str(), prompt.size(), static_cast<double>(prompt.size()) / std::max(st.prefill_s, 1e-9),
               made.size(), static_cast<double>(made.size()) / std::max(st.decode_s, 1e-9),
               st.shifts > 0 ? detail::concat(" (", st.shifts, " context shifts by ", context_shift_name(st.shifted_by),
                                              ", keeping ", control.keep, ")").c_str() : "");
  if (stops.stopped()) std::fprintf(stderr, "generate: stopped at a --stop string\n");
  if (st.steps > 0 && st.shifted_by != ContextShift::reencode) {
    // Each step reads the weights and the cache (at the mean context of the run); a 64 MB read
    // pass (~10 ms) gives the machine's rate. A reencode shift's prefill is in decode_s: no rate.
    const double steps = static_cast<double>(st.steps);
    const double step_s = st.decode_s / steps;
    const double gbs = dec->step_bytes(st.mean_context) / step_s * 1e-9;
    const double peak = measure_read_gbs(int64_t{64} << 20, 3);
    std::fprintf(stderr, "generate: decode step %.2f ms, %.1f GB/s read = %.0f%% of this machine's %.1f GB/s\n",
                 step_s * 1e3, gbs, 100 * gbs / peak, peak);
  }
}

}  // namespace

void add_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* sub = app.add_subcommand("generate", "Stream text from a decoder model (LLaMA family)");
  sub->add_option("--model", o->model, "model folder (config.json, safetensors, tokenizer.json)")->required();
  sub->add_option("--prompt", o->prompt, "prompt text (empty: start from BOS)");
  sub->add_option("--tokens", o->tokens, "tokens to generate")->capture_default_str();
  sub->add_option("--attention", o->attention,
                  "attention plan; must honour a causal mask (default: the plan the model was saved with, "
                  "full for a Hugging Face checkpoint)")
      ->check(spec_validator())
      ->capture_default_str();
  add_plan_file_option(sub, o->attention);
  SamplingOptions& so = o->sampling;
  sub->add_option("--temperature", so.temperature, "0 = greedy")->capture_default_str();
  sub->add_option("--top-k", so.top_k, "keep the k most likely tokens (0 = all)")->capture_default_str();
  sub->add_option("--top-p", so.top_p, "nucleus: keep the smallest set with this mass (1 = all)")->capture_default_str();
  sub->add_option("--min-p", so.min_p, "keep tokens at least this share of the most likely one's probability (0 = all)")
      ->capture_default_str();
  sub->add_option("--repeat-penalty", so.repeat_penalty,
                  "divide a recent token's positive logit by this, multiply a negative one (1 = off)")->capture_default_str();
  sub->add_option("--frequency-penalty", so.frequency_penalty, "subtract this times a recent token's count")
      ->capture_default_str();
  sub->add_option("--presence-penalty", so.presence_penalty, "subtract this from every recent token's logit")
      ->capture_default_str();
  sub->add_option("--repeat-last-n", so.repeat_last_n,
                  "tokens the penalties look back over, prompt included (-1: all, 0: off)")->capture_default_str();
  sub->add_option("--seed", so.seed, "sampling seed")->capture_default_str();
  sub->add_option("--stop", o->stop, "stop when the text holds this string (not shown); repeatable");
  sub->add_flag("--context-shift{auto}", o->context_shift,
                "past the model's context, drop the oldest half of the tokens after --keep (else refused): "
                "--context-shift=rotate keeps the cache and rotates its keys (RoPE models, as llama.cpp), "
                "=reencode encodes the window again (any model); alone: rotate where the model can, else reencode")
      ->check(CLI::IsMember({"off", "auto", "rotate", "reencode"}, CLI::ignore_case));
  sub->add_option("--keep", o->keep, "tokens at the start a context shift keeps (default: the BOS, if any)");
  add_kv_cache_option(sub, o->kv_cache);
  add_weights_option(sub, o->weights);
  add_threads_option(sub, o->threads, "generate");
  sub->callback([o] { run_generate(*o); });
}

}  // namespace clattn::cli
