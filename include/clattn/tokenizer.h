// A Hugging Face `tokenizer.json` tokenizer, reproducing the ids the `tokenizers` library gives for
// three families of files:
//
// - Llama / SentencePiece-converted BPE (e.g. ../shared/data/stories260k): normalizer steps
//   (Prepend, Replace with a String pattern), no pre-tokenizer, BPE over the code points of the
//   whole normalized text (merges applied lowest rank first, leftmost on ties; a code point absent
//   from the vocab becomes its UTF-8 bytes as "<0xNN>" tokens when byte_fallback is on, else <unk>
//   fused as HF does); decoder steps Replace, ByteFallback, Fuse, Strip.
// - WordPiece (BERT, e.g. ../shared/data/tokenizers/bert-base-uncased): the BertNormalizer
//   (clean_text, handle_chinese_chars, strip_accents, lowercase; strip_accents null follows
//   lowercase), the BertPreTokenizer (split on White_Space, each punctuation code point a word:
//   Unicode P* and ASCII 33-47, 58-64, 91-96, 123-126), greedy longest-match-first WordPiece with
//   the continuing_subword_prefix ("##"), a word over max_input_chars_per_word code points being
//   unk_token; the WordPiece decoder (prefix removed, else a space; its cleanup replacements).
// - Byte-level BPE (GPT-2, RoBERTa, e.g. ../shared/data/tokenizers/gpt2): the ByteLevel
//   pre-tokenizer (add_prefix_space, use_regex with GPT-2's pattern 's|'t|'re|'ve|'m|'ll|'d|
//   ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+, then each byte as its bytes_to_unicode()
//   character), BPE by rank over each piece, the ByteLevel post-processor (ids unchanged) and
//   decoder (bytes back, read as lossy UTF-8).
//
// encoding(text, pair, add_special_tokens) is tokenizers' encode(): added tokens are split out of
// the text first (leftmost-longest; those with normalized = false in the raw text, the others in
// each normalized piece; single_word, lstrip and rstrip honoured), each remaining piece goes
// through normalizer, pre-tokenizer and model, and the post-processor puts its template around:
// TemplateProcessing (single and pair, with type ids), RobertaProcessing (<s> A </s> and <s> A
// </s></s> B </s>, type ids 0), BertProcessing ([CLS] A [SEP] B [SEP], B's part type 1), ByteLevel
// (nothing added), or a Sequence of ByteLevel and at most one of the others. decode() skips special
// tokens (skip_special_tokens=True, the `tokenizers` default) and runs the decoder chain.
//
// Added tokens in the text: HF parity by default in encoding(); encoding(..., literal = true) and
// encode(text, add_bos) take the text literally ("<s>" is three characters, never the BOS token).
// The literal form is what the CLI and the text tasks use: prompts and training text are data, and
// only the flag adds control tokens. Python's Tokenizer.encode follows encoding() (literal=False)
// unless given add_bos.
//
// Unicode: categories (L, N, P, Mn, C), White_Space, full lowercase and canonical decomposition
// come from tables generated from Python's unicodedata (src/text/unicode_tables.inc, Unicode
// 14.0.0). GPT-2's pattern runs on Oniguruma in HF; its \s is the White_Space property there (and
// here): U+00A0, U+0085, U+2028, U+3000 are spaces, U+001C..U+001F and U+200B are not.
//
// Where we differ from `tokenizers`:
// - On purpose: a character that byte_fallback cannot cover because a "<0xNN>" token is missing
//   is an Error, not a silent <unk>: such a file cannot round-trip and should be fixed.
// - On purpose: invalid UTF-8 input is an Error naming the byte and its offset (HF only accepts a
//   valid str, so there is nothing to match).
// - On purpose: out-of-range ids are an Error in decode (HF drops them silently).
// - On purpose: BOS / EOS policy: tokenizer_config.json beside the file wins when present
//   (add_bos_token default true, add_eos_token default false, bos_token / eos_token), as
//   transformers' LlamaTokenizerFast rebuilds its post-processor from it (pair: prefix A suffix
//   prefix B suffix, B's part type 1); otherwise the post-processor; a file with neither gets
//   BOS only (HF would add nothing).
// - Not settled: HF's Rust tables (the unicode_categories crate for BertNormalizer /
//   BertPreTokenizer, Oniguruma's for \p{L} / \p{N}, Rust's std for lowercase) may be of other
//   Unicode versions than 14.0.0, so characters assigned or changed since can differ. NFD here
//   decomposes each code point without reordering combining marks, which only matters for marks
//   that strip_accents keeps (not Mn). single_word's word characters are L, N, Mn and '_' (the
//   regex crate's \w also has other marks and connector punctuation), and where a single_word
//   token is refused a shorter added token may still match at that position. Truncation is encode(text, add_bos, max_length), and encoding()'s and
//   encode_batch's (Truncation: the file's section, or BatchOptions'), encode_batch also giving
//   the overflowing windows; padding is encode_batch's, the file's padding section its default.
//
// Offsets (Encoding::offsets, BatchOptions::offsets) are tokenizers' alignments: every byte of the
// normalized text maps to the original character it came from (a Prepend's or a ByteLevel prefix
// space's characters to the first character, a Replace's to the last character it replaced, each
// output of BertNormalizer to its input character), and a token's offsets run from the start of its
// first byte's character to the end of its last's. So a byte-fallback or byte-level token inside a
// multi-byte character covers the whole character, and every offset falls on a character boundary.
// An added token covers its match (with the whitespace lstrip / rstrip took); the template's tokens
// are (0, 0). A post-processor with trim_offsets (RobertaProcessing, ByteLevel; true unless the
// file says false) moves a token's offsets past its leading and trailing spaces ("Ġ" or White_Space),
// keeping the one add_prefix_space put before the first token. Offsets are bytes of the UTF-8 text
// (Rust tokenizers' unit); OffsetUnit::chars gives code points (Python str indices, the unit of
// tokenizers' Python bindings and of transformers' offset_mapping).
//
// Byte-level models (`clattn train --task lm` or `mlm` on a text file: include/clattn/data.h) save
// byte_tokenizer_json() beside their weights: a BPE model without merges whose vocabulary is the
// 256 byte tokens "<0x00>".."<0xFF>" at ids 0..255 (id = byte value) with byte_fallback, plus
// "<pad>" (256) and "<mask>" (257) as special added tokens; a post-processor of "$A" alone, so
// neither BOS nor EOS is added (the tasks train on raw bytes); a ByteFallback + Fuse decoder. So
// encode() of any UTF-8 text gives exactly its bytes, decode() gives them back, and the
// `tokenizers` library reads the file the same way (encoding() without literal, like HF, reads
// "<pad>" and "<mask>" in a text as those two tokens). is_bytes() recognises such a tokenizer, so
// the text tasks keep their byte mode (bits per character, any bytes) for it.
// Unsupported pipeline parts (other pre-tokenizers, normalizers, post-processors or decoders, Regex
// patterns, other models, dropout, BPE subword prefixes) are refused at load with an Error naming
// the file and the field, rather than half-honoured.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace clattn {

// Ids of one text or a text pair with what the post-processor adds, as tokenizers' Encoding.
struct Encoding {
  std::vector<int32_t> ids;
  // (ids.size()) the segment of each id, from the template's type_id (BERT: 0 for [CLS] A [SEP],
  // 1 for B [SEP]); the model's token-type embedding reads it.
  std::vector<int32_t> type_ids;
  // (ids.size()) 1 where the template added the id ([CLS], [SEP], <s>), 0 for the texts' tokens.
  std::vector<int32_t> special_tokens_mask;
  // (ids.size()) the text each id comes from: 0 the text, 1 the pair, -1 the template.
  std::vector<int32_t> sequence_ids;
  // (ids.size()) [start, end) of each id in its own text (sequence_ids says which), bytes unless
  // converted by offsets_to_chars; (0, 0) for the template's ids. See the header comment.
  std::vector<std::pair<int64_t, int64_t>> offsets;
};

// e.offsets from bytes to code points of their texts (Python str indices); `pair` when e encodes one.
void offsets_to_chars(Encoding& e, std::string_view text, std::optional<std::string_view> pair = std::nullopt);
enum class OffsetUnit { none, bytes, chars };

// Padding of a batch, as tokenizers' padding section: to the longest sequence of the batch (or to
// `length`), rounded up to a multiple of `multiple_of`, on the right (or the left).
struct Padding {
  int64_t length = 0;       // {"Fixed": n}: every sequence to n; 0: BatchLongest
  int64_t multiple_of = 0;  // pad_to_multiple_of; 0: none
  bool left = false;        // direction "Left"
  int32_t pad_id = 0, pad_type_id = 0;
};
// How sequences longer than max_length are cut (tokenizers' TruncationParams; the file's
// "truncation" section, or BatchOptions'). max_length counts the template's special tokens, which
// are always kept; the texts' tokens are cut. Strategies for a pair: longest_first shortens only
// the longer text when the shorter fits in half, else gives each half (the odd one to the text
// that was longer, to the second on ties); only_first / only_second cut that text alone (an Error
// when it is too short to make room, or when only_second meets a single text). Direction: the
// tokens cut from the end (right), or from the start (left). stride only shapes tokenizers'
// overflowing windows (BatchOptions::overflowing): neighbouring windows share `stride` tokens.
enum class TruncationStrategy { longest_first, only_first, only_second };
struct Truncation {
  int64_t max_length = 0;  // > 0
  TruncationStrategy strategy = TruncationStrategy::longest_first;
  bool left = false;       // direction "Left"
  int64_t stride = 0;
};
// A batch of encodings, padded: (B, T) row-major each, T the padded length.
struct BatchEncoding {
  int64_t B = 0, T = 0;
  std::vector<int32_t> ids, type_ids, attention_mask, special_tokens_mask;
  std::vector<int32_t> lengths;  // (B) each sequence's length before padding
  std::vector<int32_t> sample;   // (B) the text each row encodes (several rows with overflowing)
  // (B, T, 2) each cell's [start, end) in its text (Encoding::offsets), (0, 0) for padding and
  // special tokens; empty unless BatchOptions::offsets asks for it.
  std::vector<int64_t> offsets;
  int64_t truncated = 0;         // texts that truncation cut
};
struct BatchOptions {
  bool add_special_tokens = true, literal = false;
  // How sequences are cut: unset, the file's truncation section (none without one); max_length > 0
  // sets the length over it (over longest_first, right, when neither is given).
  std::optional<Truncation> truncation;
  int64_t max_length = 0;
  // Also the rest of a cut text, as tokenizers' overflowing encodings (transformers'
  // return_overflowing_tokens): each text's rows are the truncated sequence, then windows of the
  // same length, each sharing Truncation::stride tokens with the one before and wrapped in the
  // template's special tokens, until the text's other end; for a pair whose
  // texts are both cut, every combination of their windows, in tokenizers' order. sample maps
  // the rows to the texts.
  bool overflowing = false;
  std::optional<Padding> padding;  // unset: the file's padding section, else the longest, right, id 0
  int threads = 0;                 // 0: every OpenMP thread (texts are split over them)
  OffsetUnit offsets = OffsetUnit::none;  // BatchEncoding::offsets in bytes or code points
};

class Tokenizer {
 public:
  // Reads a tokenizer.json and, when present, tokenizer_config.json in the same folder.
  // Every problem with either file is an Error naming the file and the field.
  static Tokenizer from_file(const std::string& path);
  // The same from memory; config_json is a tokenizer_config.json text ("" = none).
  static Tokenizer from_json(std::string_view json, const std::string& name_for_errors,
                             std::string_view config_json = {});

  // Token ids of text (valid UTF-8, taken literally: added tokens are not split out). The BOS prefix
  // (the single template's part before $A) is added when add_bos and the configuration asks for it;
  // the EOS suffix (after $A) whenever the configuration asks for it.
  std::vector<int32_t> encode(std::string_view text, bool add_bos = true) const;
  // encode(text, add_bos) of at most max_length ids, cut as Hugging Face truncates one sequence:
  // the text's tokens are shortened from the end, the template's special tokens ([CLS] … [SEP],
  // <s> … </s>) kept. *truncated (when given) says whether anything was cut. A max_length that
  // cannot hold the special tokens and one of the text's is an Error.
  std::vector<int32_t> encode(std::string_view text, bool add_bos, int64_t max_length, bool* truncated) const;
  // What tokenizers' encode(text, pair, add_special_tokens) gives: added tokens in the text are
  // split out first (unless literal), then normalizer, pre-tokenizer and model on each piece, then
  // the post-processor's template (single, or pair when `pair` is given) when add_special_tokens.
  // literal = true takes text as plain characters, as encode(text, add_bos) does. With offsets
  // (byte offsets, see the header comment), each id's span of its text in Encoding::offsets.
  Encoding encoding(std::string_view text, std::optional<std::string_view> pair = std::nullopt,
                    bool add_special_tokens = true, bool literal = false, bool offsets = false) const;
  // encoding() of each text (with pairs[i] when pairs is not empty: one per text), truncated and
  // padded by `opt`, the texts split over threads: tokenizers' encode_batch with its attention
  // and special-tokens masks.
  BatchEncoding encode_batch(std::span<const std::string> texts, std::span<const std::string> pairs = {},
                             const BatchOptions& opt = {}) const;
  // The file's padding and truncation sections, when it has them. encoding() and encode_batch
  // apply the truncation section (as tokenizers' encode does); encode(text, ...) does not.
  const std::optional<Padding>& padding() const;
  const std::optional<Truncation>& truncation() const;
  // The id of a vocabulary or added token's string, -1 when there is none.
  int32_t token_to_id(std::string_view token) const;
  // Text of a whole sequence: special tokens skipped (unless skip_special_tokens is false), then the
  // decoder chain (this strips the space that encode's normalizer prepended). Invalid byte runs
  // decode to U+FFFD (ByteFallback: one per byte; ByteLevel: one per invalid subsequence), as HF.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = true) const;
  // Text of `id` when streaming right after `prev` (prev < 0: start of the stream). Byte-fallback
  // and byte-level tokens give their raw bytes, possibly part of a UTF-8 character, so concatenated
  // pieces are the UTF-8 text. A WordPiece token after the first loses its "##" or gets a space.
  // The leading-space Strip of decode applies to the first piece: prev < 0 or prev == BOS.
  // Concatenating the pieces of a sequence equals decode() of it, except that decode() strips only
  // once while a BOS in mid-stream strips again here (the llama2.c rule).
  std::string decode_piece(int32_t prev, int32_t id) const;

  // The byte-level tokenizer (see above), its tokenizer.json text, and whether this tokenizer maps
  // ids 0..255 to the bytes with nothing added around them (encode(text) == text's bytes).
  static Tokenizer bytes();
  static std::string byte_tokenizer_json();
  bool is_bytes() const;

  int32_t bos_id() const;  // -1 if the tokenizer has none
  int32_t eos_id() const;  // -1 if the tokenizer has none
  int64_t vocab_size() const;
  const std::string& token(int32_t id) const;  // the vocab string ("▁the", "<0x0A>"); throws when out of range
  const std::string& name() const;             // the file name used in error messages

  struct Impl;  // defined in src/text/tokenizer.cpp

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;  // immutable after loading, so copies share it and threads may too
};

}  // namespace clattn
