// clattn.Tokenizer: a model folder's tokenizer.json (include/clattn/tokenizer.h) — the Llama-style
// BPE, GPT-2 / RoBERTa byte-level BPE and BERT WordPiece files of pretrained models and the
// byte-level file every `clattn train --task lm/mlm` checkpoint carries — with the library's encode / decode and its errors (ValueError).
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "clattn/error.h"
#include "clattn/tokenizer.h"
#include "common.h"

namespace clattn::py {

namespace {
const char* strategy_name(TruncationStrategy s) {
  return s == TruncationStrategy::only_first ? "only_first" : s == TruncationStrategy::only_second ? "only_second" : "longest_first";
}
TruncationStrategy parse_strategy(const std::string& s) {
  for (const TruncationStrategy t : {TruncationStrategy::longest_first, TruncationStrategy::only_first, TruncationStrategy::only_second})
    if (s == strategy_name(t)) return t;
  throw pb::value_error("truncation_strategy must be 'longest_first', 'only_first' or 'only_second', got '" + s + "'");
}
}  // namespace

namespace {

// A tokenizer.json path, or a model folder holding one.
std::string tokenizer_path(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::is_directory(p, ec) ? (p / "tokenizer.json").string() : p.string();
}

}  // namespace

pb::object tokenizer_of_folder(const std::string& dir) {
  const std::filesystem::path p = std::filesystem::path(dir) / "tokenizer.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(p, ec)) return pb::none();
  return pb::cast(Tokenizer::from_file(p.string()));
}

void bind_tokenizer(pb::module_& m) {
  pb::class_<Tokenizer>(m, "Tokenizer",
                        "A Hugging Face tokenizer.json (Llama-style BPE, GPT-2 / RoBERTa byte-level BPE, BERT WordPiece) "
                        "or clattn's byte-level one")
      .def(pb::init([](const std::filesystem::path& path) {
             return value_errors([&] { return Tokenizer::from_file(tokenizer_path(path)); });
           }),
           pb::arg("path"), "From a tokenizer.json, or a model folder that holds one")
      .def_static("bytes", &Tokenizer::bytes,
                  "The byte-level tokenizer of clattn's text tasks: ids 0..255 are the bytes, 256 <pad>, "
                  "257 <mask>; nothing added around a text")
      .def("encode", [](const Tokenizer& t, const std::string& text, std::optional<std::string> pair,
                        bool add_special_tokens, bool literal, std::optional<bool> add_bos) {
             const std::vector<int32_t> ids = value_errors([&] {
               if (!add_bos) return t.encoding(text, pair, add_special_tokens, literal).ids;
               check(!pair, "Tokenizer.encode: add_bos (the literal single-text form) takes no pair");
               return t.encode(text, *add_bos);
             });
             return pb::array_t<int32_t>(static_cast<pb::ssize_t>(ids.size()), ids.data());
           }, pb::arg("text"), pb::arg("pair") = pb::none(), pb::arg("add_special_tokens") = true,
           pb::arg("literal") = false, pb::arg("add_bos") = pb::none(),
           "Token ids (int32) of a text, or of a text pair, as Hugging Face tokenizers' "
           "encode(text, pair, add_special_tokens).ids: added tokens such as '[CLS]' or '<|endoftext|>' in "
           "the text are those tokens (literal=True: plain characters), and the post-processor's template "
           "goes around. add_bos=True/False instead gives the literal form the CLI and the text tasks use "
           "(BOS only when add_bos, EOS as the configuration says)")
      .def("encoding", [](const Tokenizer& t, const std::string& text, std::optional<std::string> pair,
                          bool add_special_tokens, bool literal) {
             const Encoding e = value_errors([&] { return t.encoding(text, pair, add_special_tokens, literal); });
             return pb::make_tuple(pb::array_t<int32_t>(static_cast<pb::ssize_t>(e.ids.size()), e.ids.data()),
                                   pb::array_t<int32_t>(static_cast<pb::ssize_t>(e.type_ids.size()), e.type_ids.data()));
           }, pb::arg("text"), pb::arg("pair") = pb::none(), pb::arg("add_special_tokens") = true,
           pb::arg("literal") = false,
           "(ids, type_ids), two int32 arrays of one length: encode()'s ids and the segment of each "
           "(BERT: 0 for [CLS] A [SEP], 1 for B [SEP])")
      .def("offsets", [](const Tokenizer& t, const std::string& text, std::optional<std::string> pair,
                         bool add_special_tokens, bool literal, const std::string& unit) {
             if (unit != "chars" && unit != "bytes")
               throw pb::value_error("unit must be 'chars' or 'bytes', got '" + unit + "'");
             Encoding e = value_errors([&] {
               Encoding r = t.encoding(text, pair, add_special_tokens, literal, /*offsets=*/true);
               if (unit == "chars") offsets_to_chars(r, text, pair);
               return r;
             });
             pb::array_t<int64_t> a({static_cast<pb::ssize_t>(e.offsets.size()), pb::ssize_t{2}});
             int64_t* p = a.mutable_data();
             for (const auto& [first, second] : e.offsets) {
               *p++ = first;
               *p++ = second;
             }
             return a;
           }, pb::arg("text"), pb::arg("pair") = pb::none(), pb::arg("add_special_tokens") = true,
           pb::arg("literal") = false, pb::arg("unit") = "chars",
           "(n, 2) int64: the [start, end) of each id of encode(text, pair, ...) in its own text (a pair's "
           "ids in the pair), as Hugging Face tokenizers' Encoding.offsets: code points of the str "
           "(unit='chars', the Python bindings' unit) or bytes of its UTF-8 (unit='bytes'); (0, 0) for "
           "the template's special tokens")
      .def("decode", [](const Tokenizer& t, pb::handle ids_obj, bool skip_special_tokens) {
             pb::array_t<int32_t> ids = int_arg(ids_obj, "ids");
             return value_errors([&] { return t.decode(span_of(ids), skip_special_tokens); });
           }, pb::arg("ids"), pb::arg("skip_special_tokens") = true,
           "The text of a sequence of ids (special tokens skipped unless skip_special_tokens=False)")
      .def("decode_piece", [](const Tokenizer& t, int32_t prev, int32_t id) {
             const std::string s = value_errors([&] { return t.decode_piece(prev, id); });
             return pb::bytes(s);
           }, pb::arg("prev"), pb::arg("id"),
           "Bytes of `id` when streaming after `prev` (-1 at the start); may be part of a UTF-8 character")
      .def_property_readonly("bos_id", &Tokenizer::bos_id, "BOS id, or -1")
      .def_property_readonly("eos_id", &Tokenizer::eos_id, "EOS id, or -1")
      .def_property_readonly("vocab_size", &Tokenizer::vocab_size)
      .def_property_readonly("is_bytes", &Tokenizer::is_bytes, "ids 0..255 are the bytes, nothing added")
      .def("token", [](const Tokenizer& t, int32_t id) { return value_errors([&] { return t.token(id); }); },
           pb::arg("id"), "The vocabulary string of an id")
      .def("token_to_id", [](const Tokenizer& t, const std::string& token) -> pb::object {
             const int32_t id = t.token_to_id(token);
             return id < 0 ? pb::object(pb::none()) : pb::object(pb::int_(id));
           }, pb::arg("token"), "The id of a vocabulary or added token's string, None when there is none")
      .def("id_to_token", [](const Tokenizer& t, int32_t id) -> pb::object {
             if (id < 0 || id >= t.vocab_size()) return pb::none();
             return pb::str(t.token(id));
           }, pb::arg("id"), "The string of an id, None when out of range")
      .def("get_vocab", [](const Tokenizer& t) {
             pb::dict d;
             for (int32_t i = 0; i < t.vocab_size(); ++i) d[pb::str(t.token(i))] = i;
             return d;
           }, "{token string: id} over the vocabulary and the added tokens")
      .def_property_readonly("padding", [](const Tokenizer& t) -> pb::object {
             if (!t.padding()) return pb::none();
             const Padding& p = *t.padding();
             pb::dict d;
             d["length"] = p.length == 0 ? pb::object(pb::none()) : pb::object(pb::int_(p.length));
             d["pad_to_multiple_of"] = p.multiple_of == 0 ? pb::object(pb::none()) : pb::object(pb::int_(p.multiple_of));
             d["direction"] = p.left ? "left" : "right";
             d["pad_id"] = p.pad_id;
             d["pad_type_id"] = p.pad_type_id;
             return d;
           }, "The file's padding section as a dict, or None")
      .def_property_readonly("truncation", [](const Tokenizer& t) -> pb::object {
             if (!t.truncation()) return pb::none();
             const Truncation& r = *t.truncation();
             pb::dict d;
             d["max_length"] = r.max_length;
             d["strategy"] = strategy_name(r.strategy);
             d["direction"] = r.left ? "left" : "right";
             d["stride"] = r.stride;
             return d;
           }, "The file's truncation section as a dict, or None")
      .def("encode_batch", [](const Tokenizer& t, const std::vector<std::string>& texts,
                              std::optional<std::vector<std::string>> pairs, bool add_special_tokens, bool literal,
                              int64_t max_length, std::optional<int64_t> length, std::optional<int64_t> multiple_of,
                              std::optional<std::string> side, std::optional<int32_t> pad_id, int threads,
                              std::optional<std::string> strategy, std::optional<std::string> truncation_side,
                              std::optional<int64_t> stride, bool overflowing, bool return_offsets) {
             BatchOptions o;
             if (return_offsets) o.offsets = OffsetUnit::chars;
             o.add_special_tokens = add_special_tokens;
             o.literal = literal;
             o.max_length = max_length;
             o.threads = threads;
             o.overflowing = overflowing;
             if (strategy || truncation_side || stride) {
               Truncation r = t.truncation().value_or(Truncation{});
               if (stride) {
                 if (*stride < 0) throw pb::value_error("stride must be >= 0, got " + std::to_string(*stride));
                 r.stride = *stride;
               }
               if (strategy) r.strategy = parse_strategy(*strategy);
               if (truncation_side) {
                 if (*truncation_side != "left" && *truncation_side != "right")
                   throw pb::value_error("truncation_side must be 'left' or 'right', got '" + *truncation_side + "'");
                 r.left = *truncation_side == "left";
               }
               if (r.max_length == 0 && max_length <= 0)
                 throw pb::value_error("encode_batch: truncation_strategy, truncation_side and stride need "
                                       "max_length (the file has no truncation section)");
               o.truncation = r;
             }
             if (length || multiple_of || side || pad_id) {
               Padding p = t.padding().value_or(Padding{});
               if (length) p.length = *length;
               if (multiple_of) p.multiple_of = *multiple_of;
               if (side) {
                 if (*side != "left" && *side != "right")
                   throw pb::value_error("padding_side must be 'left' or 'right', got '" + *side + "'");
                 p.left = *side == "left";
               }
               if (pad_id) p.pad_id = *pad_id;
               if (p.length < 0 || p.multiple_of < 0 || p.pad_id < 0 || p.pad_id >= t.vocab_size())
                 throw pb::value_error("encode_batch: length and pad_to_multiple_of must be >= 0 and pad_id an id of "
                                       "the vocabulary");
               o.padding = p;
             }
             const std::vector<std::string> none;
             BatchEncoding b;
             {
               pb::gil_scoped_release nogil;
               b = value_errors([&] { return t.encode_batch(texts, pairs ? *pairs : none, o); });
             }
             // The (B, T) arrays handed over without a copy: a batch of short lines is tens of MB.
             const std::vector<pb::ssize_t> bt{static_cast<pb::ssize_t>(b.B), static_cast<pb::ssize_t>(b.T)};
             pb::dict d;
             d["input_ids"] = to_numpy(std::move(b.ids), bt);
             d["attention_mask"] = to_numpy(std::move(b.attention_mask), bt);
             d["token_type_ids"] = to_numpy(std::move(b.type_ids), bt);
             d["special_tokens_mask"] = to_numpy(std::move(b.special_tokens_mask), bt);
             d["lengths"] = pb::array_t<int32_t>(static_cast<pb::ssize_t>(b.lengths.size()), b.lengths.data());
             d["truncated"] = b.truncated;
             if (return_offsets)
               d["offset_mapping"] = to_numpy(std::move(b.offsets), {bt[0], bt[1], pb::ssize_t{2}});
             if (overflowing)
               d["overflow_to_sample_mapping"] = pb::array_t<int32_t>(static_cast<pb::ssize_t>(b.sample.size()), b.sample.data());
             return d;
           }, pb::arg("texts"), pb::arg("pairs") = pb::none(), pb::kw_only(), pb::arg("add_special_tokens") = true,
           pb::arg("literal") = false, pb::arg("max_length") = 0, pb::arg("length") = pb::none(),
           pb::arg("pad_to_multiple_of") = pb::none(), pb::arg("padding_side") = pb::none(),
           pb::arg("pad_id") = pb::none(), pb::arg("threads") = 0, pb::arg("truncation_strategy") = pb::none(),
           pb::arg("truncation_side") = pb::none(), pb::arg("stride") = pb::none(),
           pb::arg("return_overflowing_tokens") = false, pb::arg("return_offsets_mapping") = false,
           "Encode a batch as tokenizers' encode_batch, padded: {'input_ids', 'attention_mask', 'token_type_ids', "
           "'special_tokens_mask'} (B, T) int32, 'lengths' (B,), 'truncated' (a count). Truncation: the file's "
           "section, max_length > 0 setting its length (special tokens kept), truncation_strategy ('longest_first', "
           "'only_first', 'only_second'), truncation_side ('right', 'left') and stride its others; "
           "return_overflowing_tokens adds the rest of each cut text as more rows, windows sharing `stride` "
           "tokens, with 'overflow_to_sample_mapping' (the text of each row); return_offsets_mapping adds "
           "'offset_mapping' (B, T, 2) int64, each token's [start, end) in code points of its text, (0, 0) "
           "for special tokens and padding (Tokenizer.offsets). Padding: the file's padding section, overridden "
           "by length (fixed), pad_to_multiple_of, padding_side and pad_id; else to the longest, right, id 0. "
           "Texts are split over `threads` (0: clattn's thread count)")
      .def("__len__", &Tokenizer::vocab_size)
      .def("__repr__", [](const Tokenizer& t) {
        return "clattn.Tokenizer(" + t.name() + ", vocab " + std::to_string(t.vocab_size()) + ")";
      });
}

}  // namespace clattn::py
