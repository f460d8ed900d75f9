// `clattn approx`: run a pretrained model with full attention and with each given attention plan,
// and report how far each plan's predictions move from full attention's (the paper's Table 4).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "clattn/atomic_file.h"
#include "clattn/comm.h"
#include "clattn/attention.h"
#include "clattn/cpu.h"
#include "clattn/error.h"
#include "clattn/gemm.h"
#include "clattn/input_file.h"
#include "clattn/model.h"
#include "clattn/threads.h"
#include "clattn/plan_search.h"
#include "clattn/safetensors.h"
#include "clattn/spec.h"
#include "clattn/tokenizer.h"
#include "bench_util.h"
#include "commands.h"
#include "progress.h"
#include "result_table.h"
#include "version.h"

namespace clattn::cli {
namespace {

struct ApproxOptions {
  std::string model, features, tokens, text, json_out, format = "text";
  std::vector<std::string> attention, plan_files;
  int64_t seeds = 1;
  int64_t repeat = 3;
  int threads = 0;
  bool verbose = false;
  // Plan search (--target): the metric and its target, the deployment length (0: the data's),
  // the candidate specs ("" : the defaults for the model), the plan file to write, and for a
  // decoder's text the sequences to cut it into (half calibrate, half are held out).
  std::optional<double> target;
  std::string metric = "agreement", candidates, plan_out = "plan.json", cost = "timed";
  int64_t length = 0, sequences = 8;
  std::string weights = "f32";
};

// The model's outputs on one input set: logits (rows, classes) compared row by row; for a decoder
// each position is a row and its class is the next token.
struct Outputs {
  Tensor logits;  // (rows, classes)
  double ms = 0;
};

// `plan` with every stochastic layer's seed set to s (appended, or replaced when given).
std::string with_seed(const std::string& plan_in, int64_t s, bool& stochastic) {
  // A trailing ';' (a plan naming every layer) is kept as it is.
  const bool exact = plan_in.size() > 1 && plan_in.back() == ';';
  const std::string plan = exact ? plan_in.substr(0, plan_in.size() - 1) : plan_in;
  std::string out;
  size_t start = 0;
  while (true) {
    const size_t e = plan.find(';', start);
    std::string spec = plan.substr(start, e == std::string::npos ? std::string::npos : e - start);
    if (make_attention(spec)->capabilities().stochastic) {
      stochastic = true;
      const size_t at = spec.rfind("seed=");
      if (at != std::string::npos && (at == 0 || spec[at - 1] == ',' || spec[at - 1] == ':')) {
        const size_t end = spec.find(',', at);
        spec = spec.substr(0, at) + "seed=" + std::to_string(s) + (end == std::string::npos ? "" : spec.substr(end));
      } else {
        spec += (spec.find(':') == std::string::npos ? ":seed=" : ",seed=") + std::to_string(s);
      }
    }
    out += (out.empty() ? "" : ";") + spec;
    if (e == std::string::npos) break;
    start = e + 1;
  }
  return exact ? out + ";" : out;
}

// Causal clustered attention attends the positions of its first block exactly, so a plan whose
// block covers the whole sequence computes causal full attention (more slowly) and approximates
// nothing. Said once per plan, naming the layers' spec and the block.
void note_inactive_causal(const std::string& plan, int64_t T) {
  size_t start = 0;
  while (true) {
    const size_t e = plan.find(';', start);
    const std::string spec = plan.substr(start, e == std::string::npos ? std::string::npos : e - start);
    if (spec.empty()) break;  // the trailing ';' of a plan naming every layer
    const Spec canonical = parse_spec(make_attention(spec)->name());
    if (canonical.name == "clustered" || canonical.name == "improved-clustered")
      for (const auto& [key, value] : canonical.params)
        if (key == "block" && std::stoll(value) >= T) {
          std::fprintf(stderr,
                       "approx: note: %s: its block of %s positions covers the whole sequence of %lld, so every "
                       "position is attended exactly (causal full attention): the approximation is inactive; "
                       "give block= below %lld to cluster\n",
                       spec.c_str(), value.c_str(), static_cast<long long>(T), static_cast<long long>(T));
          return;
        }
    if (e == std::string::npos) break;
    start = e + 1;
  }
}

// A token file: integer `tokens` [T] or [B, T], and the labels under `label_name` when present.
void read_tokens(const std::string& path, const char* label_name, std::vector<int32_t>& ids,
                 int64_t& B, int64_t& T, std::vector<int32_t>& labels) {
  const SafetensorsFile f = SafetensorsFile::open(path);
  check(f.has("tokens"), "approx: '", path, "' has no integer tensor 'tokens' ([T] or [B, T])");
  const TensorInfo& info = f.info("tokens");
  check(info.shape.size() == 1 || info.shape.size() == 2, "approx: 'tokens' must be [T] or [B, T]");
  ids = f.get_i32("tokens");
  B = info.shape.size() == 2 ? info.shape[0] : 1;
  T = info.shape.back();
  if (f.has(label_name)) labels = f.get_i32(label_name);
}

// A plan's metrics against full attention (compare_logits) and its median forward.
struct Metrics : LogitAgreement {
  double ms = 0;
};

Metrics compare(const Tensor& full, const Tensor& approx, const std::vector<int32_t>& labels) {
  return {compare_logits(full.view(), approx.view(), labels)};
}

// The model and what it runs on: B clips or sequences of T positions, labels per row of its
// logits (a clip's or sequence's class, or for a decoder each position's next token; -1 none).
struct Workload {
  std::unique_ptr<Encoder> enc;
  std::unique_ptr<Decoder> dec;
  Tensor features;              // (B, patches, dim): KWT
  std::vector<int32_t> ids;     // (B, T) tokens
  std::vector<int32_t> lengths; // (B) valid tokens of each sequence, or empty (all T)
  int64_t B = 1, T = 0;
  std::vector<int32_t> labels;  // (rows) or empty
  int64_t rows_per_item() const { return dec ? T : 1; }
  int64_t length() const { return enc && enc->config().kind == ModelKind::kwt ? enc->config().num_patches + 1 : T; }
  Model& model() { return enc ? static_cast<Model&>(*enc) : static_cast<Model&>(*dec); }
  // Logits (rows, classes) of items [begin, end).
  Tensor run(int64_t begin, int64_t end) {
    const int64_t n = end - begin;
    if (dec) {
      const Tensor l = dec->forward(std::span<const int32_t>(ids).subspan(static_cast<size_t>(begin * T), static_cast<size_t>(n * T)), n, T);
      Tensor r(Shape{n * T, dec->config().vocab});  // (rows, vocab): each position a row
      std::copy(l.data(), l.data() + l.numel(), r.data());
      return r;
    }
    if (enc->config().kind == ModelKind::kwt) {
      const int64_t per = features.numel() / features.dim(0);
      const Shape s{n, features.dim(1), features.dim(2)};
      return enc->forward_features(make_view(features.data() + begin * per, s));
    }
    const std::span<const int32_t> len =
        lengths.empty() ? std::span<const int32_t>{} : std::span<const int32_t>(lengths).subspan(static_cast<size_t>(begin), static_cast<size_t>(n));
    return enc->forward_tokens(std::span<const int32_t>(ids).subspan(static_cast<size_t>(begin * T), static_cast<size_t>(n * T)), n, T, len);
  }
  Tensor run() { return run(0, B); }
  std::vector<int32_t> labels_of(int64_t begin, int64_t end) const {
    if (labels.empty()) return {};
    return {labels.begin() + begin * rows_per_item(), labels.begin() + end * rows_per_item()};
  }
};

// Loads the model and the input the options name. A text for a decoder becomes `sequences`
// sequences of up to the model's context (1: the text's first context of tokens).
Workload load_workload(const ApproxOptions& o, int64_t sequences) {
  const ModelKind kind = model_kind(o.model);
  LoadOptions lo;
  lo.verbose = o.verbose;
  lo.weights = parse_weight_type(o.weights);
  Workload w;
  if (kind == ModelKind::llama) {
    check(o.features.empty(), "approx: --features is for KWT encoders; this model is a decoder");
    w.dec = Decoder::load(o.model, lo);
    if (!o.tokens.empty()) {
      read_tokens(o.tokens, "targets", w.ids, w.B, w.T, w.labels);
      check_context(w.T, w.dec->config().max_positions, "approx: '" + o.tokens + "'", positions_field(w.dec->config()));
    } else {
      // Bounded (a text is tokenized whole) and never blocking on a FIFO or device.
      const std::string text = read_input_file(o.text, "approx: --text", kMaxTextBytes);
      const Tokenizer tok = Tokenizer::from_file((std::filesystem::path(o.model) / "tokenizer.json").string());
      std::vector<int32_t> all = tok.encode(text);
      const int64_t context = w.dec->config().max_positions > 0 ? w.dec->config().max_positions : 512;
      const int64_t n = static_cast<int64_t>(all.size());
      // An empty or blank text is the begin-of-text token alone: one position, whose output every
      // attention computes exactly, would report a perfect agreement that means nothing.
      check(n >= 2, "approx: --text '", o.text, "' gives ", n, n == 1 ? " token" : " tokens",
            " (an empty or blank text); comparing attentions needs at least 2");
      w.T = std::min(n, context);
      w.B = w.T > 0 ? std::max<int64_t>(1, std::min(sequences, n / w.T)) : 1;
      if (n > w.B * w.T)
        std::fprintf(stderr, "approx: note: '%s' has %lld tokens; the first %lld (%s) are used\n", o.text.c_str(),
                     static_cast<long long>(n), static_cast<long long>(w.B * w.T),
                     w.B == 1 ? "the model's context" : detail::concat(w.B, " sequences of the model's context").c_str());
      w.ids.assign(all.begin(), all.begin() + w.B * w.T);
      // Next-token targets: position t predicts token t + 1 of its sequence (the last one has none).
      w.labels.assign(static_cast<size_t>(w.B * w.T), -1);
      for (int64_t s = 0; s < w.B; ++s)
        for (int64_t t = 0; t + 1 < w.T; ++t) w.labels[static_cast<size_t>(s * w.T + t)] = w.ids[static_cast<size_t>(s * w.T + t + 1)];
    }
    check(w.T >= 1 && static_cast<int64_t>(w.ids.size()) == w.B * w.T, "approx: no tokens to run");
    return w;
  }
  w.enc = Encoder::load(o.model, lo);
  if (kind == ModelKind::kwt) {
    check(!o.features.empty(), "approx: a KWT model takes --features");
    const SafetensorsFile f = SafetensorsFile::open(o.features);
    check(f.has("features"), "approx: '", o.features, "' has no tensor 'features' [n, patches, dim]");
    w.features = f.get_f32("features");
    check(w.features.rank() == 3 && w.features.dim(0) >= 1, "approx: 'features' must be [n >= 1, patches, dim]");
    w.B = w.features.dim(0);
    if (f.has("labels")) w.labels = f.get_i32("labels");
    return w;
  }
  check(w.enc->config().num_labels >= 1, "approx: this encoder has no classifier to compare predictions of");
  if (!o.text.empty()) {
    // One example per non-empty line, through the model's tokenizer.json as classify and embed
    // read texts (encode_texts: its template's [CLS] / [SEP] or <s> / </s>, cut at the context
    // keeping the closing one, padded on the right).
    const std::vector<std::string> lines = non_empty_lines(o.text, "approx");
    const Tokenizer tok = Tokenizer::from_file((std::filesystem::path(o.model) / "tokenizer.json").string());
    const int64_t context = w.enc->config().max_positions;
    BatchEncoding e = encode_texts(*w.enc, tok, lines);
    if (e.truncated)
      std::fprintf(stderr, "approx: note: %lld of %zu lines were longer than the model's context of %lld tokens and were cut\n",
                   static_cast<long long>(e.truncated), lines.size(), static_cast<long long>(context));
    w.B = e.B;
    w.T = e.T;
    w.ids = std::move(e.ids);
    w.lengths = std::move(e.lengths);
    return w;
  }
  // BERT-style classifier: --token-file holds ids [T] or [B, T] (and optional 'labels' [B]).
  check(!o.tokens.empty(), "approx: a BERT-style encoder takes --token-file or --text");
  read_tokens(o.tokens, "labels", w.ids, w.B, w.T, w.labels);
  check_context(w.T, w.enc->config().max_positions, "approx: '" + o.tokens + "'");
  return w;
}

void run_search(const ApproxOptions& o, Workload& w);

void run_approx(const ApproxOptions& o) {
  set_threads(checked_threads(o.threads, "approx"));
  check_size(o.seeds, 1, kMaxCount, "approx: --seeds");
  check_size(o.repeat, 1, 1000, "approx: --repeat");
  const int given = !o.features.empty() + !o.tokens.empty() + !o.text.empty();
  usage_check(given == 1, "approx: give exactly one of --features, --token-file, --text");
  std::vector<PathArg> inputs{{"--model", o.model, true}, {"--features", o.features},
                              {"--token-file", o.tokens}, {"--text", o.text}};
  for (const PathArg& p : path_args("--plan", o.plan_files)) inputs.push_back(p);
  check_outputs("approx", {{"--json", o.json_out}, {"--plan-out", o.target ? o.plan_out : ""}}, inputs);
  if (o.target) {
    usage_check(o.attention.empty(), "approx: --target searches for a plan; --attention and --plan measure given ones");
    usage_check(o.format == "text", "approx: --target prints its search as text (the plan goes to --plan-out); -o '",
                o.format, "' is for measuring given plans");
    Workload w = load_workload(o, o.sequences);
    run_search(o, w);
    return;
  }
  usage_check(!o.attention.empty(), "approx: give at least one --attention plan (or --plan FILE, or --target)");
  Workload w = load_workload(o, 1);
  std::unique_ptr<Encoder>& enc = w.enc;
  std::unique_ptr<Decoder>& dec = w.dec;
  const std::vector<int32_t>& labels = w.labels;
  const Tensor& features = w.features;
  const int64_t B = w.B, T = w.T;
  std::function<Tensor()> run = [&] { return w.run(); };  // the model on the input, logits (rows, classes)
  auto set_plan = [&](const std::string& plan) {
    if (enc) enc->set_attention(plan);
    else dec->set_attention(plan);
  };
  // ms: the median of --repeat timed forwards (the caller runs one warm-up before).
  auto timed = [&](Outputs& out) {
    std::vector<double> t;
    for (int64_t r = 0; r < o.repeat; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      out.logits = run();
      t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    out.ms = t.size() % 2 ? t[t.size() / 2] : (t[t.size() / 2 - 1] + t[t.size() / 2]) / 2;
  };
  auto warm_up = [&](Outputs& out) { out.logits = run(); };
  // Memory before allocation: the largest plan's forward on the whole input.
  {
    double need = 0;
    for (const std::string& plan : o.attention) {
      set_plan(plan);
      need = std::max(need, enc ? enc->forward_bytes(enc->config().kind == ModelKind::kwt ? features.dim(0) : B,
                                                     enc->config().kind == ModelKind::kwt ? enc->config().num_patches + 1 : T)
                                : dec->forward_bytes(B, T));
    }
    check_memory(2 * need, "approx: " + o.model);  // full's outputs are kept beside each plan's
  }
  // Units: full attention, then each plan at each of its seeds.
  std::vector<int64_t> seeds_of;
  int64_t units = 1;
  for (const std::string& plan : o.attention) {
    bool stochastic = false;
    (void)with_seed(plan, 0, stochastic);
    seeds_of.push_back(stochastic ? o.seeds : 1);
    units += seeds_of.back();
  }
  Progress progress("approx", units);
  int64_t done = 0;
  set_plan("full");
  Outputs full;
  progress.set(done, "full attention (reference), warm-up");
  warm_up(full);  // first touch of activations and workspace
  progress.set(done, "full attention (reference)");
  timed(full);
  ++done;
  if (!labels.empty())
    check(static_cast<int64_t>(labels.size()) == full.logits.dim(0), "approx: ", labels.size(), " labels for ",
          full.logits.dim(0), " predictions");

  // Rows: full attention's own figures (the baseline), then each plan (over its seeds: the means,
  // agreement's range, the largest logit difference).
  const ResultTable table(o.format, {{"attention", "spec", "", 60, true, false, true, false, "label"},
                                     {"seeds", "seeds", "", 6},
                                     {"agreement", "agreement", "%.4f", 20, false, false, false, false, "agreement_range"},
                                     {"accuracy", "accuracy", "%.4f", 10},
                                     {"KL", "kl", "%.3e", 12},
                                     {"max|dlogit|", "max_abs_logit_diff", "%.4f", 10},
                                     {"ms", "ms", "%.1f", 10},
                                     {"x full", "ratio_to_full", "%.3f", 8},
                                     {"agreement_min", "agreement_min", "%.4f", 0, false, false, false, true},
                                     {"agreement_max", "agreement_max", "%.4f", 0, false, false, false, true}});
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  std::fprintf(table.preamble(), "model %s, %lld predictions, full attention %.1f ms\n", o.model.c_str(),
               static_cast<long long>(full.logits.dim(0)), full.ms);
  table.header();
  auto or_null = [](double v) { return v < 0 ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(v); };
  auto row = [&](const std::string& plan, int64_t seeds, const std::vector<Metrics>& ms) {
    auto mean = [&](auto f) { double s = 0; for (const auto& m : ms) s += f(m); return s / static_cast<double>(ms.size()); };
    auto lo_ = [&](auto f) { double s = 1e300; for (const auto& m : ms) s = std::min(s, f(m)); return s; };
    auto hi = [&](auto f) { double s = -1e300; for (const auto& m : ms) s = std::max(s, f(m)); return s; };
    const auto agreement = [](const Metrics& m) { return m.agreement; };
    const double agr = mean(agreement), t = mean([](const Metrics& m) { return m.ms; });
    const double acc = ms[0].accuracy < 0 ? -1 : mean([](const Metrics& m) { return m.accuracy; });
    nlohmann::ordered_json r = {{"spec", plan}, {"seeds", seeds}, {"agreement", agr}, {"accuracy", or_null(acc)},
                                {"kl", mean([](const Metrics& m) { return m.kl; })},
                                {"max_abs_logit_diff", hi([](const Metrics& m) { return m.max_diff; })}, {"ms", t},
                                {"ratio_to_full", t / full.ms}};
    if (seeds > 1) {
      r["agreement_min"] = lo_(agreement);
      r["agreement_max"] = hi(agreement);
      char range[64];
      std::snprintf(range, sizeof range, "%.4f [%.4f-%.4f]", agr, lo_(agreement), hi(agreement));
      r["agreement_range"] = range;
    }
    table.row(r);
    r.erase("agreement_range");
    results.push_back(r);
  };
  // Full attention's own figures first: the baseline every row is measured against (its accuracy
  // is the one the approximations should keep).
  const double full_acc = compare(full.logits, full.logits, labels).accuracy;
  progress.above([&] {
    table.row({{"spec", "full"}, {"label", "full (baseline)"}, {"seeds", 1}, {"agreement", 1.0},
               {"accuracy", or_null(full_acc)}, {"kl", 0.0}, {"max_abs_logit_diff", 0.0}, {"ms", full.ms},
               {"ratio_to_full", 1.0}, {"baseline", true}});
  });
  for (size_t pi = 0; pi < o.attention.size(); ++pi) {
    const std::string& plan = o.attention[pi];
    if (dec) progress.above([&] { note_inactive_causal(plan, T); });
    const int64_t seeds = seeds_of[pi];
    std::vector<Metrics> ms;
    for (int64_t s = 0; s < seeds; ++s) {
      bool st = false;
      set_plan(seeds > 1 ? with_seed(plan, s, st) : plan);
      Outputs out;
      progress.set(done, seeds > 1 ? detail::concat(plan, ", seed ", s, "/", seeds) : plan);
      warm_up(out);
      timed(out);
      ++done;
      Metrics m = compare(full.logits, out.logits, labels);
      m.ms = out.ms;
      ms.push_back(m);
    }
    progress.above([&] { row(plan, seeds, ms); });
  }
  progress.finish();
  const nlohmann::ordered_json doc = {
      {"model", o.model}, {"baseline", {{"spec", "full"}, {"accuracy", or_null(full_acc)}, {"ms", full.ms}}},
      {"results", results}};
  table.end(doc);
  if (!o.json_out.empty()) write_file_atomic(o.json_out, doc.dump(2) + "\n");
}

// The default candidates of the plan search at the data's length n: clustered and improved-
// clustered with fewer clusters and keys than n (at or above it they attend every key, a costlier
// full attention); for a decoder their causal forms with blocks shorter than n (a block covering
// the sequence is exact) and segments of 8 blocks, the cheapest at long lengths (at N = 16384,
// 8 heads of 8: 0.11-0.22x causal full, against 0.6-2.8x for segments of one block), and local
// windows.
std::vector<std::string> default_candidates(bool causal, int64_t n) {
  std::vector<std::string> out;
  auto add = [&](int64_t clusters, int64_t topk, int64_t block) {
    if (clusters >= n || topk >= n || block >= n) return;
    const std::string blk = block ? detail::concat(",block=", block) : "";
    out.push_back(topk ? detail::concat("improved-clustered:clusters=", clusters, ",topk=", topk, blk)
                       : detail::concat("clustered:clusters=", clusters, blk));
  };
  if (causal) {
    add(8, 16, 64);
    add(25, 32, 64);
    add(25, 32, 128);
    add(25, 64, 128);
    for (int64_t wdw : {64, 128})
      if (wdw < n) out.push_back(detail::concat("local:window=", wdw));
    return out;
  }
  for (int64_t c : {25, 50}) add(c, 0, 0);
  for (const auto& [c, k] : std::vector<std::pair<int64_t, int64_t>>{{10, 16}, {25, 32}, {50, 32}, {25, 64}, {50, 64}})
    add(c, k, 0);
  return out;
}

// ms of one layer's attention with `spec` at length n (batch 1, the model's heads), on the
// structured inputs of `clattn bench`: the median of three calls after a warm-up.
constexpr int kCostCalls = 7;  // timed calls per candidate, after one warm-up

double layer_attention_ms(const std::string& spec, const ModelConfig& c, int64_t n, bool causal) {
  const bench::Inputs in = bench::make_inputs({1, c.heads, c.kv_heads, n, c.head_dim}, 1);
  std::unique_ptr<Attention> att = make_attention(spec);
  AttentionInputs ai;
  ai.q = in.q.view();
  ai.k = in.k.view();
  ai.v = in.v.view();
  ai.causal = causal;
  AttentionState state;
  ai.state = &state;
  Tensor out(Shape{1, c.heads, n, c.head_dim});  // (1, H, n, D)
  Context ctx = Context::for_inference();
  att->forward(ai, out.view(), ctx);
  // The least of kCostCalls: contention only ever adds time (plan_search.h). The median of 3 moved
  // with a busy machine enough to reorder candidates from run to run.
  double best = 0;
  for (int r = 0; r < kCostCalls; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    att->forward(ai, out.view(), ctx);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    best = r == 0 ? ms : std::min(best, ms);
  }
  return best;
}

// One layer's attention by its work model at length n: floating-point and integer operations of
// the forward, in GOP (deterministic: the same on every machine).
double layer_attention_gop(const std::string& spec, const ModelConfig& c, int64_t n, bool causal) {
  const AttentionDims d{.B = 1, .H = c.heads, .Hkv = c.kv_heads, .N = n, .M = n, .Dk = c.head_dim, .Dv = c.head_dim};
  const WorkModel w = make_attention(spec)->work(d, causal, Mode::inference);
  return (w.flops() + w.int_ops()) * 1e-9;
}

// What timing every candidate (and full) at length n will cost, before any is timed: one call's
// memory (q, k, v, out and the workspace) against what is available, and the time of the
// kCostCalls + 1 calls of layer_attention_ms from the work models at half this machine's sgemm rate. A search
// that would time for more than an hour is refused with the estimate; one past a minute says so.
// (--length 10^6 timed full attention for hours without a word; 6e7 ended in bad_alloc.)
void check_cost_length(const std::vector<std::string>& specs, const ModelConfig& c, int64_t n, bool causal) {
  const AttentionDims d{.B = 1, .H = c.heads, .Hkv = c.kv_heads, .N = n, .M = n, .Dk = c.head_dim, .Dv = c.head_dim};
  const double inputs = 4.0 * static_cast<double>(n * c.head_dim) * static_cast<double>(2 * c.heads + 2 * c.kv_heads);
  const double rate = 0.5e9 * measure_sgemm_gflops(512, 2);  // flop/s
  double secs = 0;
  std::vector<std::string> all = specs;
  all.push_back("full");
  for (const std::string& s : all) {
    const std::unique_ptr<Attention> a = make_attention(s);
    check_memory(inputs + static_cast<double>(a->workspace_bytes(d, Mode::inference, max_threads())),
                 detail::concat("approx: timing '", s, "' at --length ", n));
    secs += (kCostCalls + 1.0) * a->work(d, causal, Mode::inference).flops() / rate;
  }
  check(secs <= 3600, "approx: timing the candidates and full attention at --length ", n, " would take about ",
        static_cast<int64_t>(secs / 60), " minutes (their work models at half this machine's sgemm rate); give a "
        "smaller --length");
  if (secs > 60)
    std::fprintf(stderr, "approx: timing the candidates at --length %lld takes about %.0f s (work models)\n",
                 static_cast<long long>(n), secs);
}

void run_search(const ApproxOptions& o, Workload& w) {
  const double target = *o.target;
  usage_check(o.metric == "agreement" || o.metric == "kl" || o.metric == "accuracy",
              "approx: --metric must be agreement, kl or accuracy, got '", o.metric, "'");
  usage_check(std::isfinite(target) && (o.metric == "kl" ? target >= 0 : target > 0 && target <= 1),
              "approx: --target must be in (0, 1] for ", o.metric, " (a KL bound >= 0 for kl), got ", target);
  check(w.B >= 2, "approx: the search calibrates on half of the input and reports the other half, so it needs at ",
        "least 2 ", w.dec ? "sequences (a longer --text, or --sequences)" : "clips or sequences", "; got 1");
  usage_check(o.length >= 0 && o.length <= kMaxCount, "approx: --length must be in [1, ", kMaxCount, "]");
  usage_check(o.cost == "timed" || o.cost == "work", "approx: --cost must be timed or work, got '", o.cost, "'");
  const bool timed = o.cost == "timed";
  const ModelConfig& cfg = w.model().config();
  const bool causal = w.dec != nullptr;
  const int64_t n_data = w.length(), n_cost = o.length > 0 ? o.length : n_data;
  std::vector<std::string> cands = o.candidates.empty() ? default_candidates(causal, n_data)
                                                        : bench::split_specs(o.candidates);
  check(!cands.empty(), "approx: no candidate attention approximates at the data's length ", n_data,
        " (give --candidates)");
  for (const std::string& c : cands) {
    const std::unique_ptr<Attention> a = make_attention(c);
    check(!causal || a->capabilities().causal, "approx: candidate '", c, "' cannot honour the causal mask of a decoder");
  }
  check_memory(2.0 * w.model().forward_bytes(w.B, w.T > 0 ? w.T : n_data), "approx: " + o.model);
  if (timed) check_cost_length(cands, cfg, n_cost, causal);
  const int64_t half = (w.B + 1) / 2;
  w.model().set_attention("full");
  const Tensor full_cal = w.run(0, half), full_held = w.run(half, w.B);
  const std::vector<int32_t> lab_cal = w.labels_of(0, half), lab_held = w.labels_of(half, w.B);
  const Metrics self = compare(full_cal, full_cal, lab_cal);
  double absolute = target;
  if (o.metric == "accuracy") {
    check(self.accuracy >= 0, "approx: --metric accuracy needs labels in the input");
    absolute = target * self.accuracy;  // a share of full attention's own accuracy
  }
  std::printf("search: %s, %lld calibration %s (%lld predictions), %lld held out; %s >= %g%s; cost at N = %lld\n",
              o.model.c_str(), static_cast<long long>(half), w.dec ? "sequences" : "items",
              static_cast<long long>(full_cal.dim(0)), static_cast<long long>(w.B - half), o.metric.c_str(), target,
              o.metric == "accuracy" ? detail::concat(" x full's ", self.accuracy).c_str() : "",
              static_cast<long long>(n_cost));
  if (o.metric == "kl") std::printf("search: (kl: the plan's mean KL(full || plan) must stay <= the target)\n");
  std::fflush(stdout);
  PlanSearch ps;
  ps.layers = cfg.layers;
  ps.candidates = cands;
  ps.target = absolute;
  ps.higher_better = o.metric != "kl";
  ps.evaluate = [&](const std::string& plan) {
    w.model().set_attention(plan);
    const Metrics m = compare(full_cal, w.run(0, half), lab_cal);
    return o.metric == "agreement" ? m.agreement : o.metric == "kl" ? m.kl : m.accuracy;
  };
  ps.unit = timed ? "ms" : "GOP";
  ps.cost = [&](const std::string& spec) {
    return timed ? layer_attention_ms(spec, cfg, n_cost, causal) : layer_attention_gop(spec, cfg, n_cost, causal);
  };
  // Units are evaluations; the search plans at most 1 + L (sensitivities) + L·K (a layer stops at
  // the first candidate that keeps the target), so [done/planned] and the ETA are upper bounds.
  Progress progress("approx", 1 + cfg.layers * (1 + static_cast<int64_t>(cands.size())));
  ps.on_step = [&](int64_t done, const std::string& what) { progress.set(done, what); };
  ps.on_note = [&](const std::string& line) {
    progress.above([&] {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    });
  };
  const PlanFound f = search_plan(ps);
  progress.finish();
  const std::string plan = f.plan();
  w.model().set_attention(plan);
  const Metrics held = compare(full_held, w.run(half, w.B), lab_held);
  const double ratio = f.attention_cost / f.full_cost;
  const bool approximated = std::any_of(f.layers.begin(), f.layers.end(), [](const std::string& l) { return l != "full"; });
  std::printf("plan: %s\n", plan.c_str());
  // Full attention's own accuracy on the held-out half beside the plan's: what the plan gives up.
  const double full_acc = held.accuracy >= 0 ? compare(full_held, full_held, lab_held).accuracy : -1;
  std::printf("calibration (%lld): %s %.4f; held out (%lld): agreement %.4f, KL %.3e%s\n", static_cast<long long>(half),
              o.metric.c_str(), f.value, static_cast<long long>(w.B - half), held.agreement, held.kl,
              held.accuracy >= 0 ? detail::concat(", accuracy ", held.accuracy, " (full attention ", full_acc, ")").c_str() : "");
  std::printf("attention at N = %lld: %.1f %s per forward, %.3fx full attention's %.1f %s (%s; %lld evaluations)\n",
              static_cast<long long>(n_cost), f.attention_cost, ps.unit.c_str(), ratio, f.full_cost, ps.unit.c_str(),
              timed ? "timed here" : "work models", static_cast<long long>(f.evaluations));
  if (!approximated)
    std::printf("search: the target cannot be met with any layer approximated by these candidates: the best plan "
                "is full attention (give a lower --target or other --candidates)\n");
  const bool held_ok = o.metric == "agreement" ? held.agreement >= target
                     : o.metric == "kl"        ? held.kl <= target
                                               : held.accuracy >= target * full_acc;
  if (!held_ok) std::printf("search: note: on the held-out half the plan misses the target\n");
  nlohmann::json layers = nlohmann::json::array();
  for (const std::string& l : f.layers) layers.push_back(l);
  nlohmann::json evaluated = nlohmann::json::array();
  for (const PlanFound::Evaluated& e : f.evaluated)
    evaluated.push_back({{"plan", e.plan}, {"cost", e.cost}, {"value", e.value}});
  // What the search was calibrated on: the input file and a hash of what was read from it (every
  // item: the calibration half and the held-out one).
  const std::string input = !o.features.empty() ? o.features : !o.tokens.empty() ? o.tokens : o.text;
  const std::string data_hash = w.features.numel() > 0
      ? bytes_fingerprint(w.features.data(), static_cast<size_t>(w.features.numel()) * sizeof(float))
      : bytes_fingerprint(w.ids.data(), w.ids.size() * sizeof(int32_t));
  const nlohmann::json doc = {
      {"plan", plan}, {"layers", layers}, {"model", o.model}, {"metric", o.metric}, {"target", target},
      {"calibration", {{"items", half}, {"value", f.value}, {"data", input}, {"data_hash", data_hash}}},
      {"evaluations", evaluated},
      {"held_out", {{"items", w.B - half}, {"agreement", held.agreement}, {"kl", held.kl},
                    {"accuracy", held.accuracy < 0 ? nlohmann::json(nullptr) : nlohmann::json(held.accuracy)},
                    {"full_accuracy", full_acc < 0 ? nlohmann::json(nullptr) : nlohmann::json(full_acc)}}},
      {"cost", o.cost}, {"cost_unit", ps.unit}, {"costs", f.costs},
      {"length", n_cost}, {"attention_cost", f.attention_cost}, {"full_attention_cost", f.full_cost},
      {"attention_cost_ratio", ratio}, {"target_met", approximated}, {"threads", max_threads()},
      {"cpu", bench::cpu_model()}, {"isa", isa_name(active_isa())}, {"gemm_kernel", gemm_backend().kernel},
      {"clattn", {{"version", kVersion}, {"commit", kCommit}}}};
  write_file_atomic(o.plan_out, doc.dump(2) + "\n");
  std::printf("wrote %s (use it with --plan)\n", o.plan_out.c_str());
}

}  // namespace

void add_approx(CLI::App& app) {
  auto o = std::make_shared<ApproxOptions>();
  CLI::App* sub = app.add_subcommand(
      "approx",
      "Run a pretrained model with full attention and with each attention plan; report agreement "
      "with full attention, accuracy, KL(full || approx), max |dlogit| and time");
  sub->add_option("--model", o->model, "model folder (config.json + safetensors)")->required();
  sub->add_option("--features", o->features, "KWT feature set (.safetensors with features [n, 98, 40], labels)");
  sub->add_option("--token-file", o->tokens,
                  "token input: .safetensors with integer 'tokens' [T] or [B, T] (and 'targets' for a decoder, "
                  "'labels' for a classifier)");
  sub->add_option("--text", o->text,
                  "a UTF-8 text file through the model's tokenizer.json: for a decoder one stream of next-token "
                  "predictions, for a classifier one example per non-empty line");
  sub->add_option("--attention", o->attention,
                  "attention plan, repeatable: one spec for every layer, or 'spec0;spec1;...' per layer "
                  "(the last repeats)")->check(spec_validator());
  add_plan_file_option(sub, o->attention, &o->plan_files);
  sub->add_option("--target", o->target,
                  "search the cheapest per-layer plan whose --metric on half of the input reaches this "
                  "(e.g. 0.99), report it on the other half and write it to --plan-out");
  sub->add_option("--metric", o->metric,
                  "what --target bounds: agreement (top-1 with full), kl (mean KL(full || plan), at most), "
                  "accuracy (a share of full's accuracy on the labels)")->capture_default_str();
  sub->add_option("--length", o->length,
                  "sequence length the plan's cost is measured at (default: the input's)");
  sub->add_option("--cost", o->cost,
                  "how --target prices a candidate: timed (one layer's attention timed here, ms) or work (its "
                  "work model, GOP: the same plan on any machine)")->capture_default_str();
  sub->add_option("--candidates", o->candidates,
                  "';'-separated specs a layer may take (default: clustered and improved-clustered settings "
                  "that approximate at the input's length; causal forms and local windows for a decoder)");
  sub->add_option("--plan-out", o->plan_out, "where --target writes the plan it found")->capture_default_str();
  sub->add_option("--sequences", o->sequences,
                  "with --target and --text: sequences of the model's context cut from the text")->capture_default_str();
  sub->add_option("--seeds", o->seeds, "run randomized variants with seeds 0..S-1; report mean [min-max]")
      ->capture_default_str();
  sub->add_option("--repeat", o->repeat, "timed forwards per plan after one warm-up; ms is their median")
      ->capture_default_str();
  sub->add_option("--json", o->json_out, "also write {\"model\", \"results\": [...]} to this file");
  add_format_option(sub, o->format);
  add_weights_option(sub, o->weights);
  add_threads_option(sub, o->threads, "approx");
  sub->add_flag("--verbose", o->verbose, "list checkpoint tensors the model does not use");
  sub->callback([o] { run_approx(*o); });
}

}  // namespace clattn::cli
