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

using Offset = std::pair<int64_t, int64_t>;
// A normalized text and, per byte of it, the [start, end) in the original text of the character it
// came from (tokenizers' NormalizedString alignments; see tokenizer.h on offsets).
struct Aligned {
  std::string text;
  std::vector<Offset> align;  // (text.size())
};

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
  using Offset = tok::Offset;
  using Aligned = tok::Aligned;
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
  // One text's tokens: ids and, when tracked, each one's offsets in the text.
  struct Tokens {
    std::vector<int32_t> ids;
    std::vector<Offset> offsets;  // (ids.size()) when tracked
    bool tracked = false;
  };
  static Tokens cut(const Tokens& t, std::pair<size_t, size_t> r);  // ids (and offsets) [first, second)
  using Window = std::array<std::pair<size_t, size_t>, 2>;  // [start, stop) of each text's tokens
  // The texts' tokens (n[1] only with `pair`) cut to fit `tr` beside `special` template ids: the
  // kept windows first, with `overflowing` then those the cut leaves (Truncation's stride); one
  // entry, the texts whole, when nothing is cut.
  std::vector<Window> truncate(const size_t (&n)[2], bool pair, const Truncation& tr, int64_t special,
                               bool overflowing) const;
  // The template around already tokenized texts (seq[1] when pair), with the special-tokens mask,
  // sequence ids and (when seq tracks them) offsets, trim_offsets applied.
  Encoding assemble(const Tokens (&seq)[2], bool pair, bool add_special_tokens) const;
  // The same into `e`, whose vectors are cleared and keep their capacity (a batch reuses one).
  void assemble(const Tokens (&seq)[2], bool pair, bool add_special_tokens, Encoding& e) const;
  // trim_offsets: post_processor's RobertaProcessing / ByteLevel asks to move offsets past spaces.
  bool trim_offsets = false, trim_prefix_space = false;
  void trim(const std::vector<int32_t>& ids, std::vector<Offset>& offsets) const;
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
  void load_trim(const json& post, const std::string& field);  // trim_offsets of one processor
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
  // starts (if given) gets the byte of text where each id appended to out begins.
  void bpe(std::string_view text, std::vector<int32_t>& out, std::vector<uint32_t>* starts = nullptr) const;
  std::string normalize(std::string_view text) const;
  // normalize() of text, which begins at byte `base` of the original, with its alignments.
  void normalize_aligned(std::string_view text, int64_t base, Aligned& out) const;
  // Pre-tokenizer then model over one normalized text with no added tokens in it. With align
  // (norm.size() entries: norm's alignments), each id's original offsets go to offsets.
  void tokenize_normalized(std::string_view norm, std::vector<int32_t>& out, const Offset* align = nullptr,
                           std::vector<Offset>* offsets = nullptr) const;
  // The whole per-sequence pipeline: added tokens split out (unless literal), normalizer,
  // pre-tokenizer and model on each piece; offsets (if given) gets each id's byte range in text.
  void tokenize(std::string_view text, bool literal, std::vector<int32_t>& out,
                std::vector<Offset>* offsets = nullptr) const;
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
