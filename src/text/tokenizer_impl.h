// Internal: the parsed form of a tokenizer.json (Tokenizer::Impl) and the types it holds, shared by
// src/text/tokenizer.cpp (loading, decoding) and src/text/tokenizer_encode.cpp (the encode
// pipeline and the BPE merge loop).
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "clattn/error.h"
#include "clattn/tokenizer.h"
#include "text/tokenizer_parts.h"

namespace clattn::tok {

using json = nlohmann::json;

// Heterogeneous lookup, so code points and merge halves are looked up as string_views.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// One step of the normalizer or decoder chains, flattened out of nested Sequences.
enum class StepKind { Prepend, Replace, Bert, ByteFallback, Fuse, Strip, ByteLevel, WordPiece };
struct Step {
  StepKind kind;
  std::string from, to;   // Prepend: to = prefix; Replace: from -> to; Strip: from = the character;
                          // WordPiece: from = the continuing-subword prefix
  int64_t start = 0, stop = 0;  // Strip: at most this many characters from each end
  tok::BertNormalizer bert{};   // Bert: the normalizer's switches
  bool cleanup = false;         // WordPiece: tokenizers' cleanup replacements
};

// One entry of a post-processor template: a special token's ids, or the A / B sequence.
struct TemplatePiece {
  int seq;                      // -1: the ids below; 0: sequence A; 1: sequence B
  std::vector<int32_t> ids;
  int32_t type_id;
};

// An added token as the added-vocabulary split sees it (tokenizers' AddedToken).
struct AddedToken {
  std::string content;
  int32_t id;
  bool single_word, lstrip, rstrip, normalized;
};

enum class ModelKind { Bpe, WordPiece };
enum class PreTokenizer { None, Bert, ByteLevel };

struct MergeRule {
  int32_t rank;    // position in model.merges: lower merges first
  int32_t new_id;  // id of left + right
};

inline void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (s.find(from) == std::string::npos) return;
  std::string out;
  out.reserve(s.size() + s.size() / 4);
  size_t i = 0;
  for (size_t j; (j = s.find(from, i)) != std::string::npos; i = j + from.size()) {
    out.append(s, i, j - i);
    out.append(to);
  }
  out.append(s, i, std::string::npos);
  s = std::move(out);
}

inline std::string quoted(std::string_view s) { return json(std::string(s)).dump(); }

// A field of obj, nullptr when it is absent or null.
inline const json* opt(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

}  // namespace clattn::tok

namespace clattn {

struct Tokenizer::Impl {
  using json = tok::json;
  using TokenMap = tok::TokenMap;
  using MergeRule = tok::MergeRule;
  using ModelKind = tok::ModelKind;
  using PreTokenizer = tok::PreTokenizer;
  using Step = tok::Step;
  using TemplatePiece = tok::TemplatePiece;
  using AddedToken = tok::AddedToken;
  std::string name;
  std::vector<std::string> tokens;  // id -> string, model vocab then added tokens beyond it
  std::vector<uint8_t> special;     // id -> skipped by decode
  int32_t n_model = 0;              // ids below this are the BPE model's
  TokenMap ids;                     // string -> id, over all of tokens
  std::array<int32_t, 128> ascii;   // model id of each one-byte character, -1 if none
  std::array<int32_t, 256> byte_token;  // model id of "<0xNN>", -1 if none
  std::unordered_map<uint64_t, MergeRule> merges;  // (left << 32 | right) -> rule
  // id -> the token is one code point c and no merge has a right half starting with c. Then no
  // merge can ever join c to what precedes it: the first merge across that boundary would need a
  // right symbol starting with c. In Llama-style vocabularies this holds for "▁", so the text falls
  // into words exactly as a Metaspace pre-tokenizer would cut it, without assuming so.
  std::vector<uint8_t> can_start;
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;
  int32_t unk = -1;
  ModelKind model_kind = ModelKind::Bpe;
  std::string wp_prefix;           // WordPiece: continuing_subword_prefix ("##")
  int64_t wp_max_chars = 100;      // WordPiece: longer words (in code points) are unk
  size_t wp_longest = 0;           // WordPiece: bytes of the longest vocab entry
  PreTokenizer pre = PreTokenizer::None;
  bool bl_prefix_space = false, bl_regex = true;  // ByteLevel pre-tokenizer switches
  std::vector<Step> normalizer, decoder;
  bool has_decoder = false;
  std::vector<int32_t> prefix, suffix;  // around the legacy encode's result: single_tpl's specials
  std::vector<TemplatePiece> single_tpl, pair_tpl;  // pair_tpl empty: the file has no pair template
  // Added tokens split out of the text before normalization (normalized = false) or after it
  // (normalized = true), longest first among those starting with the same byte.
  std::vector<AddedToken> added;
  tok::AddedTrie added_trie;  // over added[k].content
  int32_t bos = -1, eos = -1;
  std::optional<Padding> padding;  // the file's padding section
  void load_padding(const json& p);
  std::optional<Truncation> truncation;  // the file's truncation section
  void load_truncation(const json& t);
  // The texts' tokens (seq[1] only with `pair`) cut to fit `tr` beside `special` template ids:
  // the kept pair first, with `overflowing` then the windows the cut leaves (Truncation's
  // stride); one entry, the texts themselves, when nothing is cut.
  std::vector<std::array<std::vector<int32_t>, 2>> truncate(const std::vector<int32_t> (&seq)[2], bool pair,
                                                            const Truncation& tr, int64_t special,
                                                            bool overflowing) const;
  // The template around already tokenized texts (seq[1] when pair), with the special-tokens mask.
  Encoding assemble(const std::vector<int32_t> (&seq)[2], bool pair, bool add_special_tokens) const;
  int64_t special_count(bool pair) const;  // ids the template adds

  template <class... A>
  [[noreturn]] void bad(const A&... a) const { fail("tokenizer ", name, ": ", a...); }

  void load(const json& root);
  void load_model(const json& model);
  void load_vocab(const json& model);
  void load_wordpiece(const json& model);
  void load_added(const json& list);
  // Sequences nest at most kMaxNesting deep: real files nest one or two, and the walk recurses.
  static constexpr int kMaxNesting = 32;
  void load_steps(const json& j, const std::string& field, bool normalizer_chain, int depth = 0);
  void load_post(const json& post);
  // One post-processor into single_tpl / pair_tpl; top: a Sequence may hold processors.
  void load_processor(const json& post, const std::string& field, bool top);
  void load_pre(const json& pre);
  std::vector<TemplatePiece> load_template(const json& list, const json* specials, const std::string& field, bool pair);
  void set_templates_from_prefix_suffix();
  void load_config(const json& cfg, const std::string& cfg_name);
  void check_growth(const std::vector<Step>& chain, const char* field) const;

  const MergeRule* rule(int32_t a, int32_t b) const {
    auto it = merges.find(static_cast<uint64_t>(a) << 32 | static_cast<uint32_t>(b));
    return it == merges.end() ? nullptr : &it->second;
  }
  int32_t model_id(std::string_view s) const {
    auto it = ids.find(s);
    return it != ids.end() && it->second < n_model ? it->second : -1;
  }
  void bpe(std::string_view text, std::vector<int32_t>& out) const;
  std::string normalize(std::string_view text) const;
  // Pre-tokenizer then model over one normalized text with no added tokens in it.
  void tokenize_normalized(std::string_view norm, std::vector<int32_t>& out) const;
  // The whole per-sequence pipeline: added tokens split out (unless literal), normalizer,
  // pre-tokenizer and model on each piece.
  void tokenize(std::string_view text, bool literal, std::vector<int32_t>& out) const;
  // Pieces of text between added tokens of the given pass: {start, end, id}, id -1 for plain text.
  struct Span {
    size_t start, end;
    int32_t id;
  };
  void split_added(std::string_view text, bool normalized_pass, std::vector<Span>& out) const;
  void check_utf8(std::string_view text, const char* what) const;
  void check_id(int32_t id, const char* what) const {
    check(id >= 0 && id < static_cast<int64_t>(tokens.size()), "tokenizer ", name, ": ", what, " id ", id,
          " is out of range [0, ", tokens.size(), ")");
  }
};

}  // namespace clattn
