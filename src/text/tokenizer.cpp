// Hugging Face tokenizer.json: loading the model, its added tokens, normalizer, pre-tokenizer and
// decoder chains, decoding, and the byte-level file (see include/clattn/tokenizer.h for the
// semantics and where we differ from `tokenizers`; what goes around the tokens — post-processor,
// padding, truncation, tokenizer_config.json — is read in tokenizer_post.cpp, and the encode
// pipeline and the BPE merge loop are in tokenizer_encode.cpp).
#include "clattn/tokenizer.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "clattn/error.h"
#include "clattn/input_file.h"
#include "text/tokenizer_impl.h"
#include "text/tokenizer_parts.h"
#include "text/unicode.h"

namespace clattn {

using namespace tok;  // NOLINT: this file loads tok's types into Impl

namespace {

using unicode::utf8_len;
using unicode::valid_utf8;

// The byte of a "<0xNN>" token, or -1: the test of tokenizers' ByteFallback decoder.
int byte_of_token(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  int v = 0;
  for (char c : t.substr(3, 2)) {
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return -1;
    v = 16 * v + d;
  }
  return v;
}


// Strip decoder: at most `start` leading and `stop` trailing copies of the character c.
void strip(std::string& s, std::string_view c, int64_t start, int64_t stop) {
  size_t b = 0, e = s.size();
  for (int64_t k = 0; k < start && e - b >= c.size() && s.compare(b, c.size(), c) == 0; ++k) b += c.size();
  for (int64_t k = 0; k < stop && e - b >= c.size() && s.compare(e - c.size(), c.size(), c) == 0; ++k) e -= c.size();
  s = s.substr(b, e - b);
}


std::string read_file(const std::string& path) {
  return read_input_file(path, "tokenizer", kMaxJsonBytes);
}

}  // namespace


void Tokenizer::Impl::load(const json& root) {
  if (!root.is_object()) bad("the top level must be a JSON object, not ", root.type_name());
  const json* model = opt(root, "model");
  if (!model) bad("field \"model\" is missing");
  if (!model->is_object()) bad("field \"model\" must be an object, not ", model->type_name());
  load_model(*model);
  if (const json* a = opt(root, "added_tokens")) load_added(*a);
  if (const json* p = opt(root, "pre_tokenizer")) load_pre(*p);
  if (const json* n = opt(root, "normalizer")) load_steps(*n, "normalizer", true);
  if (const json* d = opt(root, "decoder")) {
    load_steps(*d, "decoder", false);
    has_decoder = true;
  }
  if (const json* p = opt(root, "post_processor")) load_post(*p);
  if (const json* p = opt(root, "padding")) load_padding(*p);
  if (const json* t = opt(root, "truncation")) load_truncation(*t);
  check_growth(normalizer, "normalizer");
  check_growth(decoder, "decoder");

  ascii.fill(-1);
  for (int c = 0; c < 128; ++c) ascii[static_cast<size_t>(c)] = model_id(std::string(1, static_cast<char>(c)));
  can_start.assign(tokens.size(), 0);
  for (int32_t id = 0; id < n_model; ++id) {
    const std::string& t = tokens[static_cast<size_t>(id)];
    can_start[static_cast<size_t>(id)] = !t.empty() && utf8_len(t, 0) == t.size();
  }
  for (const auto& [pair, r] : merges) {
    const std::string& right = tokens[static_cast<size_t>(pair & 0xFFFFFFFFu)];
    if (right.empty()) continue;
    const int32_t c = model_id(std::string_view(right).substr(0, utf8_len(right, 0)));
    if (c >= 0) can_start[static_cast<size_t>(c)] = 0;
  }
  byte_token.fill(-1);
  for (int b = 0; b < 256; ++b) {
    char t[8];
    std::snprintf(t, sizeof t, "<0x%02X>", b);
    byte_token[static_cast<size_t>(b)] = model_id(t);
  }
  // The trie gives the longest content first at a position, as tokenizers' leftmost-longest
  // automaton does.
  std::vector<std::string> contents;
  for (const AddedToken& t : added) contents.push_back(t.content);
  added_trie.build(contents);
}

void Tokenizer::Impl::load_pre(const json& p) {
  const json* tj = p.is_object() ? opt(p, "type") : nullptr;
  if (!tj || !tj->is_string()) bad("pre_tokenizer.type is missing");
  const std::string& type = tj->get_ref<const std::string&>();
  const auto flag = [&](const char* k, bool dflt) {
    const json* v = opt(p, k);
    if (v && !v->is_boolean()) bad("pre_tokenizer.", k, " must be true or false, not ", v->dump());
    return v ? v->get<bool>() : dflt;
  };
  if (type == "BertPreTokenizer") {
    pre = PreTokenizer::Bert;
  } else if (type == "ByteLevel") {
    pre = PreTokenizer::ByteLevel;
    bl_prefix_space = flag("add_prefix_space", true);  // tokenizers' defaults
    bl_regex = flag("use_regex", true);
    flag("trim_offsets", true);  // offsets only: no effect on ids
  } else {
    bad("pre_tokenizer ", tj->dump(), " is not supported (only null, \"BertPreTokenizer\" or \"ByteLevel\")");
  }
}

void Tokenizer::Impl::load_vocab(const json& model) {
  const json* vocab = opt(model, "vocab");
  if (!vocab) bad("model.vocab is missing");
  if (!vocab->is_object()) bad("model.vocab must be an object {token: id}, not ", vocab->type_name());
  if (vocab->empty()) bad("model.vocab is empty");
  if (vocab->size() > static_cast<size_t>(INT32_MAX)) bad("model.vocab has too many entries: ", vocab->size());
  n_model = static_cast<int32_t>(vocab->size());
  tokens.assign(static_cast<size_t>(n_model), {});
  std::vector<uint8_t> seen(static_cast<size_t>(n_model), 0);
  for (const auto& [tok, idj] : vocab->items()) {
    if (!idj.is_number_integer()) bad("model.vocab[", quoted(tok), "] must be an integer id, not ", idj.dump());
    const int64_t id = idj.get<int64_t>();
    // Ids must be exactly 0..n-1: a hole or a stray large id means a damaged or mismatched file.
    if (id < 0 || id >= n_model)
      bad("model.vocab[", quoted(tok), "] = ", id, " is out of range [0, ", n_model, ") (ids must be 0..size-1)");
    if (seen[static_cast<size_t>(id)])
      bad("model.vocab ids must be unique: ", quoted(tokens[static_cast<size_t>(id)]), " and ", quoted(tok),
          " both have id ", id);
    seen[static_cast<size_t>(id)] = 1;
    tokens[static_cast<size_t>(id)] = tok;
    ids.emplace(tok, static_cast<int32_t>(id));
  }
  special.assign(tokens.size(), 0);
}

void Tokenizer::Impl::load_wordpiece(const json& model) {
  model_kind = ModelKind::WordPiece;
  load_vocab(model);
  const json* u = opt(model, "unk_token");
  if (!u || !u->is_string()) bad("model.unk_token must be a string: WordPiece needs it for unknown words");
  unk = model_id(u->get<std::string>());
  if (unk < 0) bad("model.unk_token ", u->dump(), " is not in model.vocab");
  wp_prefix = "##";
  if (const json* v = opt(model, "continuing_subword_prefix")) {
    if (!v->is_string()) bad("model.continuing_subword_prefix must be a string, not ", v->dump());
    wp_prefix = v->get<std::string>();
  }
  if (const json* v = opt(model, "max_input_chars_per_word")) {
    if (!v->is_number_unsigned()) bad("model.max_input_chars_per_word must be a non-negative integer, not ", v->dump());
    wp_max_chars = static_cast<int64_t>(std::min<uint64_t>(v->get<uint64_t>(), INT64_MAX));
  }
  wp_longest = 0;
  for (const std::string& t : tokens) wp_longest = std::max(wp_longest, t.size());
}

void Tokenizer::Impl::load_model(const json& model) {
  if (const json* t = opt(model, "type"); t && *t != "BPE" && *t != "WordPiece")
    bad("model.type is ", t->dump(), "; only \"BPE\" and \"WordPiece\" are supported");
  if (const json* t = opt(model, "type"); t && *t == "WordPiece") return load_wordpiece(model);
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const json* v = opt(model, k); v && *v != "") bad("model.", k, " = ", v->dump(), " is not supported (only null)");
  if (const json* d = opt(model, "dropout"); d && !(d->is_number() && d->get<double>() == 0.0))
    bad("model.dropout = ", d->dump(), " is not supported (only null or 0): encoding must be deterministic");
  const auto flag = [&](const char* k) {
    const json* v = opt(model, k);
    if (v && !v->is_boolean()) bad("model.", k, " must be true or false, not ", v->dump());
    return v && v->get<bool>();
  };
  byte_fallback = flag("byte_fallback");
  fuse_unk = flag("fuse_unk");
  ignore_merges = flag("ignore_merges");

  load_vocab(model);

  if (const json* u = opt(model, "unk_token")) {
    if (!u->is_string()) bad("model.unk_token must be a string or null, not ", u->dump());
    unk = model_id(u->get<std::string>());
    if (unk < 0) bad("model.unk_token ", u->dump(), " is not in model.vocab");
  }

  const json* mj = opt(model, "merges");
  if (!mj) bad("model.merges is missing");
  if (!mj->is_array()) bad("model.merges must be an array, not ", mj->type_name());
  merges.reserve(mj->size());
  int32_t rank = 0;
  for (size_t i = 0; i < mj->size(); ++i) {
    const json& m = (*mj)[i];
    std::string left, right;
    if (m.is_string()) {
      // Legacy "left right": exactly one space; "#version" lines are skipped (tokenizers' rules).
      const std::string& s = m.get_ref<const std::string&>();
      if (s.rfind("#version", 0) == 0) continue;
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        bad("model.merges[", i, "] = ", m.dump(), " must hold exactly one space between the two tokens");
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      bad("model.merges[", i, "] = ", m.dump(), " must be \"left right\" or [\"left\", \"right\"]");
    }
    const int32_t a = model_id(left), b = model_id(right), c = model_id(left + right);
    for (const auto& [id, t] : {std::pair{a, left}, std::pair{b, right}, std::pair{c, left + right}})
      if (id < 0) bad("model.merges[", i, "] = ", m.dump(), " refers to ", quoted(t), ", which is not in model.vocab");
    // A repeated pair keeps its last rank, as tokenizers' HashMap collect does.
    merges.insert_or_assign(static_cast<uint64_t>(a) << 32 | static_cast<uint32_t>(b), MergeRule{rank++, c});
  }
}

void Tokenizer::Impl::load_added(const json& list) {
  if (!list.is_array()) bad("added_tokens must be an array, not ", list.type_name());
  for (size_t i = 0; i < list.size(); ++i) {
    const json& a = list[i];
    const json* idj = a.is_object() ? opt(a, "id") : nullptr;
    const json* cj = a.is_object() ? opt(a, "content") : nullptr;
    if (!idj || !idj->is_number_integer() || !cj || !cj->is_string())
      bad("added_tokens[", i, "] must be an object with an integer \"id\" and a string \"content\": ", a.dump());
    const int64_t id = idj->get<int64_t>();
    const std::string& content = cj->get_ref<const std::string&>();
    const json* sp = opt(a, "special");
    if (sp && !sp->is_boolean()) bad("added_tokens[", i, "].special must be true or false, not ", sp->dump());
    if (id >= 0 && id < static_cast<int64_t>(tokens.size())) {
      if (tokens[static_cast<size_t>(id)] != content)
        bad("added_tokens[", i, "] gives id ", id, " to ", quoted(content), " but that id is ",
            quoted(tokens[static_cast<size_t>(id)]));
    } else {
      // Tokens beyond the model vocab must extend it without holes, so token(id) is total.
      if (id != static_cast<int64_t>(tokens.size()))
        bad("added_tokens[", i, "] id ", id, " is out of range: the next free id is ", tokens.size());
      if (ids.count(content)) bad("added_tokens[", i, "] ", quoted(content), " already has id ", ids.at(content));
      tokens.push_back(content);
      special.push_back(0);
      ids.emplace(content, static_cast<int32_t>(id));
    }
    special[static_cast<size_t>(id)] = sp && sp->get<bool>();
    const auto flag = [&](const char* k, bool dflt) {
      const json* v = opt(a, k);
      if (v && !v->is_boolean()) bad("added_tokens[", i, "].", k, " must be true or false, not ", v->dump());
      return v ? v->get<bool>() : dflt;
    };
    // tokenizers' AddedToken defaults: normalized unless special.
    AddedToken t{content, static_cast<int32_t>(id), flag("single_word", false), flag("lstrip", false),
                 flag("rstrip", false), flag("normalized", !(sp && sp->get<bool>()))};
    if (!content.empty()) added.push_back(std::move(t));  // an empty token never matches
  }
}

void Tokenizer::Impl::load_steps(const json& j, const std::string& field, bool normalizer_chain, int depth) {
  std::vector<Step>& out = normalizer_chain ? normalizer : decoder;
  if (depth > kMaxNesting)
    bad(normalizer_chain ? "normalizer" : "decoder", ": Sequence nested more than ", kMaxNesting,
        " deep (a real tokenizer.json nests one or two)");
  if (!j.is_object()) bad(field, " must be an object, not ", j.type_name());
  const json* tj = opt(j, "type");
  if (!tj || !tj->is_string()) bad(field, ".type is missing");
  const std::string& type = tj->get_ref<const std::string&>();
  const auto str = [&](const char* k) -> const std::string& {
    const json* v = opt(j, k);
    if (!v || !v->is_string()) bad(field, ".", k, " must be a string (", type, ")");
    return v->get_ref<const std::string&>();
  };
  if (type == "Sequence") {
    const json* list = opt(j, normalizer_chain ? "normalizers" : "decoders");
    if (!list || !list->is_array()) bad(field, ".", normalizer_chain ? "normalizers" : "decoders", " must be an array");
    for (size_t i = 0; i < list->size(); ++i)
      load_steps((*list)[i], field + "[" + std::to_string(i) + "]", normalizer_chain, depth + 1);
  } else if (type == "Replace") {
    const json* p = opt(j, "pattern");
    if (!p || !p->is_object() || !p->contains("String") || !(*p)["String"].is_string())
      bad(field, ".pattern must be {\"String\": ...}; Regex patterns are not supported");
    Step s{StepKind::Replace, (*p)["String"].get<std::string>(), str("content")};
    if (s.from.empty()) bad(field, ".pattern is the empty string");
    out.push_back(std::move(s));
  } else if (normalizer_chain && type == "BertNormalizer") {
    Step s{StepKind::Bert, "", ""};
    const auto flag = [&](const char* k, bool dflt) {
      const json* v = opt(j, k);
      if (v && !v->is_boolean()) bad(field, ".", k, " must be true or false, not ", v->dump());
      return v ? v->get<bool>() : dflt;
    };
    s.bert.clean_text = flag("clean_text", true);
    s.bert.handle_chinese_chars = flag("handle_chinese_chars", true);
    s.bert.lowercase = flag("lowercase", true);
    s.bert.strip_accents = flag("strip_accents", s.bert.lowercase);  // null: follow lowercase
    out.push_back(std::move(s));
  } else if (!normalizer_chain && type == "ByteLevel") {
    out.push_back(Step{StepKind::ByteLevel, "", ""});
  } else if (!normalizer_chain && type == "WordPiece") {
    Step s{StepKind::WordPiece, "##", ""};
    if (const json* v = opt(j, "prefix")) {
      if (!v->is_string()) bad(field, ".prefix must be a string, not ", v->dump());
      s.from = v->get<std::string>();
    }
    const json* c = opt(j, "cleanup");
    if (c && !c->is_boolean()) bad(field, ".cleanup must be true or false, not ", c->dump());
    s.cleanup = !c || c->get<bool>();
    out.push_back(std::move(s));
  } else if (normalizer_chain && type == "Prepend") {
    out.push_back(Step{StepKind::Prepend, "", str("prepend")});
  } else if (!normalizer_chain && (type == "ByteFallback" || type == "Fuse")) {
    out.push_back(Step{type == "Fuse" ? StepKind::Fuse : StepKind::ByteFallback, "", ""});
  } else if (!normalizer_chain && type == "Strip") {
    Step s{StepKind::Strip, str("content"), ""};
    if (s.from.empty() || utf8_len(s.from, 0) != s.from.size()) bad(field, ".content must be one character");
    for (auto [k, dst] : {std::pair{"start", &s.start}, std::pair{"stop", &s.stop}}) {
      const json* v = opt(j, k);
      if (!v || !v->is_number_unsigned()) bad(field, ".", k, " must be a non-negative integer");
      *dst = static_cast<int64_t>(std::min<uint64_t>(v->get<uint64_t>(), INT64_MAX));
    }
    out.push_back(std::move(s));
  } else {
    bad(field, ".type ", quoted(type), " is not supported (", normalizer_chain ? "Sequence, Prepend, Replace, BertNormalizer" :
        "Sequence, Replace, ByteFallback, Fuse, Strip, ByteLevel, WordPiece", ")");
  }
}

// A chain of Replace steps can grow a text exponentially ("a" -> "aa" forty times turns one byte
// into a terabyte). Its worst case is linear, len <= a·n + c for a text of n bytes (Replace
// multiplies both by |to| / |from|, Prepend adds its prefix to c), so it is bounded at load.
void Tokenizer::Impl::check_growth(const std::vector<Step>& chain, const char* field) const {
  constexpr double kMaxFactor = 64, kMaxConstant = 1 << 20;
  double a = 1, c = 0;
  for (const Step& st : chain) {
    if (st.kind == StepKind::Replace) {
      const double r = std::max(1.0, static_cast<double>(st.to.size()) / static_cast<double>(st.from.size()));
      a *= r;
      c *= r;
    } else if (st.kind == StepKind::Prepend) {
      c += static_cast<double>(st.to.size());
    }
  }
  if (a > kMaxFactor || c > kMaxConstant)
    bad(field, ": its steps can grow a text of n bytes to ", a, "·n + ", c, " bytes; at most ", kMaxFactor,
        "·n + ", kMaxConstant, " is accepted (Replace and Prepend steps whose output outgrows their input)");
}

namespace {

// Both loaders end here: cfg_text empty means there is no tokenizer_config.json.
std::shared_ptr<const Tokenizer::Impl> build(std::string_view text, const std::string& name, std::string_view cfg_text,
                                             const std::string& cfg_name) {
  auto impl = std::make_shared<Tokenizer::Impl>();
  impl->name = name;
  json root;
  try {
    root = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    impl->bad("not valid JSON (", e.what(), ")");
  }
  impl->load(root);
  // Without a config, BOS / EOS are the template's, else the usual Llama names.
  const auto named = [&](std::string_view t) {
    auto it = impl->ids.find(t);
    return it == impl->ids.end() ? -1 : it->second;
  };
  impl->bos = !impl->prefix.empty() ? impl->prefix.front() : named("<s>");
  impl->eos = !impl->suffix.empty() ? impl->suffix.back() : named("</s>");
  const json* post = opt(root, "post_processor");
  if (!post && impl->bos >= 0) impl->prefix = {impl->bos};  // the documented default: BOS yes, EOS no
  if (!post) impl->set_templates_from_prefix_suffix();
  if (!cfg_text.empty()) {
    json cfg;
    try {
      cfg = json::parse(cfg_text.begin(), cfg_text.end());
    } catch (const json::exception& e) {
      fail("tokenizer config ", cfg_name, ": not valid JSON (", e.what(), ")");
    }
    impl->load_config(cfg, cfg_name);
  }
  return impl;
}

}  // namespace

Tokenizer Tokenizer::from_json(std::string_view json_text, const std::string& name_for_errors,
                               std::string_view config_json) {
  return Tokenizer(build(json_text, name_for_errors, config_json, name_for_errors + " (tokenizer_config.json)"));
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  const std::string text = read_file(path);
  const std::filesystem::path cfg_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  // Present as anything (a FIFO, a directory, a broken link): read, and refused when not a file.
  if (!input_exists(cfg_path.string())) return Tokenizer(build(text, path, {}, ""));
  std::string cfg = read_file(cfg_path.string());
  if (cfg.empty()) cfg = " ";  // an empty config file is malformed, not absent
  return Tokenizer(build(text, path, cfg, cfg_path.string()));
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& t = *impl_;
  for (size_t i = 0; i < ids.size(); ++i)
    check(ids[i] >= 0 && ids[i] < static_cast<int64_t>(t.tokens.size()), "tokenizer ", t.name, ": decode: ids[", i,
          "] = ", ids[i], " is out of range [0, ", t.tokens.size(), ")");
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int32_t id : ids)
    if (!skip_special_tokens || !t.special[static_cast<size_t>(id)]) toks.push_back(t.tokens[static_cast<size_t>(id)]);
  if (!t.has_decoder) {  // tokenizers without a decoder joins the tokens with spaces
    std::string s;
    for (size_t i = 0; i < toks.size(); ++i) s += (i ? " " : "") + toks[i];
    return s;
  }
  for (const Step& s : t.decoder) {
    switch (s.kind) {
      case StepKind::Replace:
        for (std::string& tok : toks) replace_all(tok, s.from, s.to);
        break;
      case StepKind::Strip:
        for (std::string& tok : toks) strip(tok, s.from, s.start, s.stop);
        break;
      case StepKind::Fuse: {
        std::string all;
        for (const std::string& tok : toks) all += tok;
        toks.assign(1, std::move(all));
        break;
      }
      case StepKind::ByteFallback: {
        // A run of byte tokens becomes its bytes if they are valid UTF-8, else one U+FFFD per byte.
        std::vector<std::string> res;
        std::string run;
        size_t run_len = 0;
        const auto flush = [&] {
          if (run_len == 0) return;
          if (valid_utf8(run)) {
            res.push_back(run);
          } else {
            for (size_t k = 0; k < run_len; ++k) res.push_back("\xEF\xBF\xBD");
          }
          run.clear();
          run_len = 0;
        };
        for (std::string& tok : toks) {
          if (const int b = byte_of_token(tok); b >= 0) {
            run.push_back(static_cast<char>(b));
            ++run_len;
          } else {
            flush();
            res.push_back(std::move(tok));
          }
        }
        flush();
        toks = std::move(res);
        break;
      }
      case StepKind::ByteLevel:
        toks.assign(1, tok::byte_level_decode(toks));
        break;
      case StepKind::WordPiece:
        toks.assign(1, tok::wordpiece_decode(std::move(toks), s.from, s.cleanup));
        break;
      case StepKind::Prepend:
      case StepKind::Bert:
        break;  // normalizer only
    }
  }
  std::string out;
  for (const std::string& tok : toks) out += tok;
  return out;
}

std::string Tokenizer::decode_piece(int32_t prev, int32_t id) const {
  const Impl& t = *impl_;
  t.check_id(id, "decode_piece:");
  check(prev < static_cast<int64_t>(t.tokens.size()), "tokenizer ", t.name, ": decode_piece: prev id ", prev,
        " is out of range [0, ", t.tokens.size(), ") (or negative for the start of a stream)");
  if (t.special[static_cast<size_t>(id)]) return "";
  std::string piece = t.tokens[static_cast<size_t>(id)];
  if (!t.has_decoder) return prev < 0 || prev == t.bos ? piece : " " + piece;
  // The decoder chain on this one token. Steps after a Fuse act on the whole text, so a Strip
  // there only touches the first piece's start (its end is unknown while streaming).
  const bool first = prev < 0 || prev == t.bos;
  bool fused = false;
  for (const Step& s : t.decoder) {
    if (s.kind == StepKind::Replace) replace_all(piece, s.from, s.to);
    if (s.kind == StepKind::Fuse) fused = true;
    if (s.kind == StepKind::Strip && (first || !fused)) strip(piece, s.from, s.start, fused ? 0 : s.stop);
    if (s.kind == StepKind::ByteFallback) {
      if (const int b = byte_of_token(piece); b >= 0) piece = std::string(1, static_cast<char>(b));
    }
    // Raw bytes, not lossy UTF-8: a character split over two tokens comes out whole once both
    // pieces are concatenated.
    if (s.kind == StepKind::ByteLevel) piece = tok::byte_level_bytes(piece);
    if (s.kind == StepKind::WordPiece) {
      // wordpiece_decode of {prev token, this one} less the previous token's text.
      piece = first ? tok::wordpiece_decode({piece}, s.from, s.cleanup)
                    : tok::wordpiece_decode({"", piece}, s.from, s.cleanup);
    }
  }
  return piece;
}

std::string Tokenizer::byte_tokenizer_json() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    char t[8];
    std::snprintf(t, sizeof t, "<0x%02X>", b);
    vocab[t] = b;
  }
  const auto added = [](int id, const char* content) {
    return json{{"id", id},          {"content", content}, {"single_word", false}, {"lstrip", false},
                {"rstrip", false},   {"normalized", false}, {"special", true}};
  };
  const json single = json::array({json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}});
  const json pair = json::array({json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                 json{{"Sequence", {{"id", "B"}, {"type_id", 1}}}}});
  json root = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", json::array({added(256, "<pad>"), added(257, "<mask>")})},
      {"normalizer", nullptr},
      {"pre_tokenizer", nullptr},
      {"post_processor", {{"type", "TemplateProcessing"}, {"single", single}, {"pair", pair}, {"special_tokens", json::object()}}},
      {"decoder", {{"type", "Sequence"}, {"decoders", json::array({json{{"type", "ByteFallback"}}, json{{"type", "Fuse"}}})}}},
      {"model", {{"type", "BPE"},
                 {"dropout", nullptr},
                 {"unk_token", nullptr},
                 {"continuing_subword_prefix", nullptr},
                 {"end_of_word_suffix", nullptr},
                 {"fuse_unk", false},
                 {"byte_fallback", true},
                 {"ignore_merges", false},
                 {"vocab", vocab},
                 {"merges", json::array()}}},
  };
  return root.dump(2) + "\n";
}

Tokenizer Tokenizer::bytes() { return from_json(byte_tokenizer_json(), "bytes (tokenizer.json of a byte-level model)"); }

bool Tokenizer::is_bytes() const {
  const Impl& t = *impl_;
  if (t.model_kind != ModelKind::Bpe || t.pre != PreTokenizer::None || !t.byte_fallback || !t.merges.empty() ||
      !t.normalizer.empty() || !t.prefix.empty() || !t.suffix.empty() || t.n_model < 256)
    return false;
  for (int b = 0; b < 256; ++b)
    if (t.byte_token[static_cast<size_t>(b)] != b) return false;
  // No other model token may match text first (a one-character token "a" would win over <0x61>).
  for (int32_t id = 256; id < t.n_model; ++id)
    if (utf8_len(t.tokens[static_cast<size_t>(id)], 0) == t.tokens[static_cast<size_t>(id)].size()) return false;
  return true;
}

int32_t Tokenizer::bos_id() const { return impl_->bos; }
const std::optional<Padding>& Tokenizer::padding() const { return impl_->padding; }
const std::optional<Truncation>& Tokenizer::truncation() const { return impl_->truncation; }
int32_t Tokenizer::token_to_id(std::string_view token) const {
  const auto it = impl_->ids.find(token);
  return it == impl_->ids.end() ? -1 : it->second;
}
int32_t Tokenizer::eos_id() const { return impl_->eos; }
int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->tokens.size()); }
const std::string& Tokenizer::name() const { return impl_->name; }

const std::string& Tokenizer::token(int32_t id) const {
  impl_->check_id(id, "token:");
  return impl_->tokens[static_cast<size_t>(id)];
}

}  // namespace clattn
