// `clattn classify` and `clattn embed`: an encoder's everyday jobs on lines of text (or KWT's
// feature clips), batched, under any attention plan.
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "clattn/atomic_file.h"
#include "clattn/error.h"
#include "clattn/input_file.h"
#include "clattn/model.h"
#include "clattn/threads.h"
#include "clattn/safetensors.h"
#include "clattn/tokenizer.h"
#include "commands.h"

namespace clattn::cli {
namespace {

struct EncoderJobOptions {
  std::string model, text, features, attention, output, format = "text", pooling = "mean", weights = "f32";
  std::vector<std::string> plan_files;
  int64_t batch = 32;
  int threads = 0;
};

std::unique_ptr<Encoder> load_encoder(const EncoderJobOptions& o, const char* cmd) {
  usage_check(model_kind(o.model) != ModelKind::llama, cmd, ": '", o.model, "' is a decoder; ", cmd,
              " takes an encoder (BERT, RoBERTa, DistilBERT, KWT)");
  LoadOptions lo;
  lo.weights = parse_weight_type(o.weights);
  auto enc = Encoder::load(o.model, lo);
  if (!o.attention.empty()) enc->set_attention(o.attention);
  return enc;
}

void note_truncated(const char* cmd, int64_t cut, size_t n, int64_t context) {
  if (cut > 0)
    std::fprintf(stderr, "%s: note: %lld of %zu lines were longer than the model's context of %lld tokens and were cut "
                 "(keeping the closing special token)\n", cmd, static_cast<long long>(cut), n, static_cast<long long>(context));
}

void check_common(const EncoderJobOptions& o, const char* cmd) {
  set_threads(checked_threads(o.threads, cmd));
  check_size(o.batch, 1, int64_t{1} << 20, detail::concat(cmd, ": --batch").c_str());
}

void run_classify(const EncoderJobOptions& o) {
  check_common(o, "classify");
  usage_check(!o.text.empty() + !o.features.empty() == 1, "classify: give exactly one of --text and --features");
  usage_check(o.format == "text" || o.format == "jsonl", "classify: -o must be text or jsonl, got '", o.format, "'");
  std::vector<PathArg> inputs = {{"--model", o.model, true}, {"--text", o.text}, {"--features", o.features}};
  for (const PathArg& p : path_args("--plan", o.plan_files)) inputs.push_back(p);
  check_outputs("classify", {{"--output", o.output}}, inputs);
  auto enc = load_encoder(o, "classify");
  const ModelConfig& c = enc->config();
  check(c.num_labels >= 1, "classify: '", o.model, "' has no classifier (num_labels is 0); `clattn embed` gives its "
        "pooled hidden states");
  std::vector<Classification> got;
  if (!o.features.empty()) {
    const SafetensorsFile f = SafetensorsFile::open(o.features);
    check(f.has("features"), "classify: '", o.features, "' has no tensor 'features' [n, patches, dim]");
    const Tensor x = f.get_f32("features");
    check(x.rank() == 3 && x.dim(0) >= 1, "classify: 'features' must be [n >= 1, patches, dim], got ", x.shape());
    for (int64_t b0 = 0; b0 < x.dim(0); b0 += o.batch) {
      const int64_t n = std::min(o.batch, x.dim(0) - b0);
      ConstView part = x.view();
      part.data = x.data() + b0 * x.dim(1) * x.dim(2);
      part.shape = Shape{n, x.dim(1), x.dim(2)};
      const Tensor logits = enc->forward_features(part);
      for (const Classification& k : classify_logits(logits.view())) got.push_back(k);
    }
  } else {
    const Tokenizer tok = Tokenizer::from_file((std::filesystem::path(o.model) / "tokenizer.json").string());
    const std::vector<std::string> lines = non_empty_lines(o.text, "classify");
    int64_t cut = 0;
    got = classify_texts(*enc, tok, lines, o.batch, &cut);
    note_truncated("classify", cut, lines.size(), c.max_positions);
  }
  auto name = [&](int32_t id) {
    return static_cast<size_t>(id) < c.labels.size() && !c.labels[static_cast<size_t>(id)].empty()
               ? c.labels[static_cast<size_t>(id)] : std::to_string(id);
  };
  std::string out;
  for (size_t i = 0; i < got.size(); ++i) {
    if (o.format == "jsonl") {
      out += nlohmann::json{{"item", i}, {"label", name(got[i].label)}, {"id", got[i].label}, {"score", got[i].score}}.dump();
    } else {
      char score[32];
      std::snprintf(score, sizeof score, "%.4f", got[i].score);
      out += name(got[i].label) + "\t" + score;
    }
    out += "\n";
  }
  if (o.output.empty()) std::fputs(out.c_str(), stdout);
  else write_file_atomic(o.output, out);
  std::fprintf(stderr, "classify: %zu items, attention %s\n", got.size(), enc->attention_plan().c_str());
}

void run_embed(const EncoderJobOptions& o) {
  check_common(o, "embed");
  usage_check(!o.text.empty(), "embed: --text FILE is required (one text per non-empty line)");
  usage_check(!o.output.empty(), "embed: --output FILE is required (.safetensors or .jsonl)");
  const std::string ext = std::filesystem::path(o.output).extension().string();
  usage_check(ext == ".safetensors" || ext == ".jsonl", "embed: --output must end in .safetensors or .jsonl, got '",
              o.output, "'");
  const Pooling pooling = [&] {
    try {
      return parse_pooling(o.pooling);
    } catch (const Error& e) {
      usage_check(false, e.what());
      return Pooling::mean;
    }
  }();
  std::vector<PathArg> inputs = {{"--model", o.model, true}, {"--text", o.text}};
  for (const PathArg& p : path_args("--plan", o.plan_files)) inputs.push_back(p);
  check_outputs("embed", {{"--output", o.output}}, inputs);
  auto enc = load_encoder(o, "embed");
  usage_check(model_kind(o.model) != ModelKind::kwt, "embed: --text needs a text encoder; '", o.model, "' is KWT");
  const Tokenizer tok = Tokenizer::from_file((std::filesystem::path(o.model) / "tokenizer.json").string());
  const std::vector<std::string> lines = non_empty_lines(o.text, "embed");
  int64_t cut = 0;
  const Tensor e = embed_texts(*enc, tok, lines, pooling, o.batch, &cut);  // (lines, hidden)
  note_truncated("embed", cut, lines.size(), enc->config().max_positions);
  if (ext == ".safetensors") {
    SafetensorsWriter w;
    w.add("embeddings", e.view());
    w.write(o.output);
  } else {
    std::string out;
    for (int64_t i = 0; i < e.dim(0); ++i) {
      std::vector<float> row(e.data() + i * e.dim(1), e.data() + (i + 1) * e.dim(1));
      out += nlohmann::json{{"item", i}, {"embedding", row}}.dump() + "\n";
    }
    write_file_atomic(o.output, out);
  }
  std::fprintf(stderr, "embed: %lld texts, %lld dims (%s pooling), attention %s; wrote %s\n",
               static_cast<long long>(e.dim(0)), static_cast<long long>(e.dim(1)), o.pooling.c_str(),
               enc->attention_plan().c_str(), o.output.c_str());
}

void add_encoder_options(CLI::App* sub, EncoderJobOptions& o, const char* cmd) {
  sub->add_option("--model", o.model, "encoder folder (config.json, safetensors, tokenizer.json)")->required();
  sub->add_option("--text", o.text, "one text per non-empty line, through the folder's tokenizer.json");
  sub->add_option("--attention", o.attention, "attention plan: one spec for every layer, or 'spec0;spec1;...'")
      ->check(spec_validator());
  add_plan_file_option(sub, o.attention, &o.plan_files);
  sub->add_option("--batch", o.batch, "texts per forward, padded to the longest of them")->capture_default_str();
  add_weights_option(sub, o.weights);
  add_threads_option(sub, o.threads, cmd);
}

}  // namespace

void add_classify(CLI::App& app) {
  auto o = std::make_shared<EncoderJobOptions>();
  CLI::App* sub = app.add_subcommand(
      "classify", "Classify each line of a text (or each KWT clip): the label and its probability, one per line");
  add_encoder_options(sub, *o, "classify");
  sub->add_option("--features", o->features, "KWT clips: .safetensors with 'features' [n, patches, dim]");
  sub->add_option("-o,--format", o->format, "text (label TAB score) or jsonl")->capture_default_str();
  sub->add_option("--output", o->output, "write the results to this file (default: stdout)");
  sub->callback([o] { run_classify(*o); });
}

void add_embed(CLI::App& app) {
  auto o = std::make_shared<EncoderJobOptions>();
  CLI::App* sub = app.add_subcommand(
      "embed", "Pooled final hidden states of each line of a text: one vector per line, to safetensors or JSONL");
  add_encoder_options(sub, *o, "embed");
  sub->add_option("--pooling", o->pooling, "mean (over the text's positions) or cls (its first position)")
      ->capture_default_str();
  sub->add_option("--output", o->output, ".safetensors (tensor 'embeddings' [lines, hidden]) or .jsonl file")
      ->required();
  sub->callback([o] { run_embed(*o); });
}

}  // namespace clattn::cli
