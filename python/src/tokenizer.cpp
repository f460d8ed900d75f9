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

template <class F>
auto value_errors(F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    throw_value_error(e.what());
  }
}

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
      .def("__len__", &Tokenizer::vocab_size)
      .def("__repr__", [](const Tokenizer& t) {
        return "clattn.Tokenizer(" + t.name() + ", vocab " + std::to_string(t.vocab_size()) + ")";
      });
}

}  // namespace clattn::py
