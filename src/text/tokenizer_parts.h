// The pipeline steps of the WordPiece (BERT) and byte-level BPE (GPT-2, RoBERTa) tokenizer families,
// as free functions over text so that src/text/tokenizer.cpp only wires them to tokenizer.json.
// Semantics are those of Hugging Face `tokenizers` (see include/clattn/tokenizer.h). Text is valid
// UTF-8 throughout: Tokenizer::encode checks it first.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace clattn::tok {

// The added tokens' contents as a byte trie: the tokens that start at a position of the text are
// found by one walk from it, as long as the longest content that matches there, instead of one
// comparison per token that shares the first byte (10^5 such tokens cost 0.42 ms per byte of text).
class AddedTrie {
 public:
  void build(const std::vector<std::string>& contents);
  // The first k (an index into contents) of the contents that text[i..] starts with, longest first
  // and in the order of contents within a length, for which accept(k) is true; -1 if none.
  // steps (if given) gets the trie nodes visited: at most the longest content's length.
  template <class Accept>
  int64_t match(std::string_view text, size_t i, Accept&& accept, int64_t* steps = nullptr) const {
    path_.clear();
    int32_t node = 0;
    for (size_t j = i; j < text.size(); ++j) {
      const auto it = edges_.find(key(node, static_cast<unsigned char>(text[j])));
      if (it == edges_.end()) break;
      node = it->second;
      path_.push_back(node);
    }
    if (steps) *steps += static_cast<int64_t>(path_.size());
    for (size_t d = path_.size(); d-- > 0;)
      for (uint32_t k : ends_[static_cast<size_t>(path_[d])])
        if (accept(k)) return k;
    return -1;
  }
  bool empty() const { return ends_.size() <= 1; }

 private:
  static uint64_t key(int32_t node, unsigned char b) { return static_cast<uint64_t>(node) << 8 | b; }
  std::unordered_map<uint64_t, int32_t> edges_;  // (node, byte) -> child
  std::vector<std::vector<uint32_t>> ends_;      // per node: the contents that end there
  // The walk's nodes, reused: a Tokenizer is const and shared, so each thread has its own.
  static thread_local std::vector<int32_t> path_;
};

// tokenizers' BertNormalizer: clean_text drops NUL, U+FFFD and Cc/Cf/Co/Cs other than \t \n \r, and
// turns White_Space into ' '; handle_chinese_chars puts spaces around CJK ideographs; strip_accents
// is NFD then dropping Mn; lowercase is the full lowercase of each code point. In this order.
struct BertNormalizer {
  bool clean_text = true, handle_chinese_chars = true, strip_accents = true, lowercase = true;
};
std::string bert_normalize(std::string_view text, const BertNormalizer& n);

// BertPreTokenizer: words are the runs between White_Space, and each punctuation code point
// (Unicode P* or ASCII 33-47, 58-64, 91-96, 123-126) is a word of its own. Views into text.
void bert_pre_tokenize(std::string_view text, std::vector<std::string_view>& words);

// WordPiece over one word: greedy longest match first, pieces after the first looked up with
// `prefix` in front; a word of more than max_chars code points, or one with a part no vocab
// entry matches, is the single id `unk`. id_of gives a vocab id or -1; longest is the byte length
// of the longest vocab entry: no candidate longer is looked up, so a word costs
// O(length · longest) lookups whatever max_chars allows (greedy from the word's end, a word of
// 8000 characters took 8000² / 2 lookups of up to 8000 bytes each).
using IdOf = std::function<int32_t(std::string_view)>;
// starts (if given) gets the byte of word where each id appended to out begins.
void wordpiece(std::string_view word, std::string_view prefix, int64_t max_chars, int32_t unk, size_t longest,
               const IdOf& id_of, std::vector<int32_t>& out, std::vector<uint32_t>* starts = nullptr);

// The WordPiece decoder: tokens after the first lose `prefix` when they start with it and get a
// space in front otherwise; with cleanup, tokenizers' cleanup replacements on each token.
std::string wordpiece_decode(std::vector<std::string> tokens, std::string_view prefix, bool cleanup);

// The ByteLevel pre-tokenizer: a space in front when add_prefix_space and the text does not start
// with one, GPT-2's pattern when use_regex, then each byte as its bytes_to_unicode() character.
// Each piece is appended to `pieces` in that byte-character form, ready for the BPE model; starts
// (if given) gets the byte where each begins in text (with the prefix space, in " " + text).
// An empty text stays empty (tokenizers' prepend does nothing there).
void byte_level_split(std::string_view text, bool add_prefix_space, bool use_regex, std::vector<std::string>& pieces,
                      std::vector<size_t>* starts = nullptr);
// The byte-level characters' byte for the space (U+0120 'Ġ'), which trim_offsets counts as a space.
inline constexpr char32_t kByteLevelSpace = 0x120;
// The bytes a ByteLevel token stands for: its byte characters back to bytes, or its own UTF-8
// bytes when it holds any other character (an added token such as "<|endoftext|>").
std::string byte_level_bytes(std::string_view token);
// The ByteLevel decoder: the byte characters of all tokens back to bytes (a token holding any other
// character keeps its own UTF-8 bytes), read as lossy UTF-8.
std::string byte_level_decode(const std::vector<std::string>& tokens);

}  // namespace clattn::tok
