// `clattn tokenize`: a tokenizer.json over the lines of a text file, as Hugging Face tokenizers'
// encode_batch gives them — ids, token strings, type ids, the special-tokens mask and character
// offsets — one JSON object per line, so a pipeline (or a diff against `tokenizers`) can read them.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "clattn/atomic_file.h"
#include "clattn/error.h"
#include "clattn/threads.h"
#include "clattn/tokenizer.h"
#include "commands.h"

namespace clattn::cli {
namespace {

struct TokenizeOptions {
  std::string tokenizer, text, pair, output, offsets = "chars";
  int64_t max_length = 0;
  bool no_special = false, literal = false;
  int threads = 0;
};

void run_tokenize(const TokenizeOptions& o) {
  set_threads(checked_threads(o.threads, "tokenize"));
  usage_check(o.offsets == "chars" || o.offsets == "bytes" || o.offsets == "none",
              "tokenize: --offsets must be chars, bytes or none, got '", o.offsets, "'");
  usage_check(o.max_length >= 0, "tokenize: --max-length must be >= 0 (0: the file's truncation, if any), got ",
              o.max_length);
  std::error_code ec;
  const bool folder = std::filesystem::is_directory(o.tokenizer, ec);
  const std::filesystem::path file = folder ? std::filesystem::path(o.tokenizer) / "tokenizer.json"
                                            : std::filesystem::path(o.tokenizer);
  check_outputs("tokenize", {{"--output", o.output}},
                {{"--tokenizer", o.tokenizer, folder}, {"--text", o.text}, {"--pair", o.pair}});
  const Tokenizer tok = Tokenizer::from_file(file.string());
  const std::vector<std::string> texts = non_empty_lines(o.text, "tokenize");
  std::vector<std::string> pairs;
  if (!o.pair.empty()) {
    pairs = non_empty_lines(o.pair, "tokenize");
    usage_check(pairs.size() == texts.size(), "tokenize: --text has ", texts.size(), " lines and --pair ",
                pairs.size(), " (one pair line per text line)");
  }
  BatchOptions opt;
  opt.add_special_tokens = !o.no_special;
  opt.literal = o.literal;
  opt.max_length = o.max_length;
  opt.padding = Padding{};  // rows are cut back to their lengths below: the file's padding is moot
  opt.offsets = o.offsets == "chars" ? OffsetUnit::chars : o.offsets == "bytes" ? OffsetUnit::bytes : OffsetUnit::none;
  const BatchEncoding b = tok.encode_batch(texts, pairs, opt);
  std::string out;
  for (int64_t r = 0; r < b.B; ++r) {
    const size_t at = static_cast<size_t>(r * b.T), n = static_cast<size_t>(b.lengths[static_cast<size_t>(r)]);
    const auto row = [&](const std::vector<int32_t>& v) {
      return std::vector<int32_t>(v.begin() + static_cast<std::ptrdiff_t>(at), v.begin() + static_cast<std::ptrdiff_t>(at + n));
    };
    nlohmann::ordered_json j;  // keys in the order a reader wants them
    j["item"] = b.sample[static_cast<size_t>(r)];
    j["ids"] = row(b.ids);
    std::vector<std::string> strings;
    for (const int32_t id : row(b.ids)) strings.push_back(tok.token(id));
    j["tokens"] = strings;
    j["type_ids"] = row(b.type_ids);
    j["special_tokens_mask"] = row(b.special_tokens_mask);
    if (opt.offsets != OffsetUnit::none) {
      nlohmann::ordered_json offs = nlohmann::ordered_json::array();
      for (size_t k = 0; k < n; ++k) offs.push_back({b.offsets[2 * (at + k)], b.offsets[2 * (at + k) + 1]});
      j["offsets"] = offs;
    }
    out += j.dump() + "\n";
  }
  if (o.output.empty()) std::fputs(out.c_str(), stdout);
  else write_file_atomic(o.output, out);
  std::fprintf(stderr, "tokenize: %zu lines, %lld sequences%s (%s)\n", texts.size(), static_cast<long long>(b.B),
               b.truncated ? detail::concat(", ", b.truncated, " truncated").c_str() : "", tok.name().c_str());
}

}  // namespace

void add_tokenize(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  CLI::App* sub = app.add_subcommand(
      "tokenize", "Tokenize each line of a text: ids, tokens, type ids, special-tokens mask and offsets as JSONL");
  sub->add_option("--tokenizer", o->tokenizer, "a tokenizer.json, or a model folder holding one")->required();
  sub->add_option("--text", o->text, "one text per non-empty line")->required();
  sub->add_option("--pair", o->pair, "the second text of each pair, line for line with --text");
  sub->add_option("--offsets", o->offsets, "chars (code points, as transformers' offset_mapping), bytes or none")
      ->capture_default_str();
  sub->add_option("--max-length", o->max_length, "truncate to this many ids, special tokens kept (0: the file's truncation)")
      ->capture_default_str();
  sub->add_flag("--no-special", o->no_special, "leave out the template's special tokens ([CLS] ... [SEP], <s> ... </s>)");
  sub->add_flag("--literal", o->literal, "read added tokens in the text ('[MASK]', '<|endoftext|>') as plain characters");
  sub->add_option("--output", o->output, "write the JSONL to this file (default: stdout)");
  add_threads_option(sub, o->threads, "tokenize");
  sub->callback([o] { run_tokenize(*o); });
}

}  // namespace clattn::cli
