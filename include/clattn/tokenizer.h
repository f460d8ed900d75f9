// A Hugging Face `tokenizer.json` BPE tokenizer (the Llama / sentencepiece-converted family, e.g.
// ../shared/data/stories260k), reproducing what the `tokenizers` library does with such a file:
//
//   encode: normalizer steps (Prepend, Replace with a String pattern) -> no pre-tokenizer -> BPE over
//           the code points of the whole normalized text (merges applied lowest rank first, leftmost
//           on ties; a code point absent from the vocab becomes its UTF-8 bytes as "<0xNN>" tokens when
//           byte_fallback is on, else <unk> fused as HF does) -> BOS / EOS around the result.
//   decode: special added tokens skipped (skip_special_tokens=True, the `tokenizers` default) ->
//           decoder steps (Replace, ByteFallback, Fuse, Strip) -> concatenation.
//
// Where we differ from `tokenizers`, on purpose:
// - Text is always literal: "<s>" in the input is three characters, never the BOS token (HF splits
//   added tokens out first). Prompts are data; only encode()'s flag adds control tokens.
// - A character that byte_fallback cannot cover because a "<0xNN>" token is missing is an Error,
//   not a silent <unk>: such a file cannot round-trip and should be fixed, not guessed around.
// - Invalid UTF-8 input is an Error (HF only accepts valid str).
// - Out-of-range ids are an Error in decode (HF drops them silently).
// - BOS / EOS policy: tokenizer_config.json beside the file wins when present (add_bos_token default
//   true, add_eos_token default false, bos_token / eos_token), as transformers' LlamaTokenizerFast
//   rebuilds its post-processor from it; otherwise the TemplateProcessing post-processor's special
//   tokens before / after $A; otherwise BOS only.
//
// Byte-level models (`clattn train --task lm` or `mlm` on a text file: include/clattn/data.h) save
// byte_tokenizer_json() beside their weights: a BPE model without merges whose vocabulary is the
// 256 byte tokens "<0x00>".."<0xFF>" at ids 0..255 (id = byte value) with byte_fallback, plus
// "<pad>" (256) and "<mask>" (257) as special added tokens; a post-processor of "$A" alone, so
// neither BOS nor EOS is added (the tasks train on raw bytes); a ByteFallback + Fuse decoder. So
// encode() of any UTF-8 text gives exactly its bytes, decode() gives them back, and the
// `tokenizers` library reads the file the same way. is_bytes() recognises such a tokenizer, so
// the text tasks keep their byte mode (bits per character, any bytes) for it.
// Unsupported pipeline parts (pre-tokenizers, Regex patterns, other models or decoders, dropout,
// subword prefixes) are refused at load with an Error naming them, rather than half-honoured.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace clattn {

class Tokenizer {
 public:
  // Reads a tokenizer.json and, when present, tokenizer_config.json in the same folder.
  // Every problem with either file is an Error naming the file and the field.
  static Tokenizer from_file(const std::string& path);
  // The same from memory; config_json is a tokenizer_config.json text ("" = none).
  static Tokenizer from_json(std::string_view json, const std::string& name_for_errors,
                             std::string_view config_json = {});

  // Token ids of text (valid UTF-8, taken literally). The BOS prefix is added when add_bos and the
  // configuration asks for it; the EOS suffix whenever the configuration asks for it.
  std::vector<int32_t> encode(std::string_view text, bool add_bos = true) const;
  // Text of a whole sequence: special tokens skipped, then the decoder chain (this strips the space
  // that encode's normalizer prepended). Invalid byte-fallback runs decode to U+FFFD per byte, as HF.
  std::string decode(std::span<const int32_t> ids) const;
  // Text of `id` when streaming right after `prev` (prev < 0: start of the stream). Byte-fallback
  // tokens give their raw byte, possibly part of a UTF-8 character, so concatenated pieces are the
  // UTF-8 text. The leading-space Strip of decode applies to the first piece: prev < 0 or prev ==
  // BOS. Concatenating the pieces of a sequence equals decode() of it, except that decode() strips
  // only once while a BOS in mid-stream strips again here (the llama2.c rule).
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

  struct Impl;  // defined in src/model/tokenizer.cpp

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;  // immutable after loading, so copies share it and threads may too
};

}  // namespace clattn
