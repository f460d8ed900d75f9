// What a tokenizer.json puts around the tokens, read into Tokenizer::Impl: the post-processor's
// templates (TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel, Sequence), the
// padding and truncation sections, and tokenizer_config.json's BOS / EOS policy
// (include/clattn/tokenizer.h says what each means).
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "clattn/error.h"
#include "clattn/tokenizer.h"
#include "text/tokenizer_impl.h"
#include "text/tokenizer_parts.h"

namespace clattn {

using namespace tok;  // NOLINT: this file loads tok's types into Impl

// tokenizers' padding section: {"strategy": "BatchLongest" | {"Fixed": n}, "direction": "Right" |
// "Left", "pad_to_multiple_of": n | null, "pad_id", "pad_type_id", "pad_token"}.
void Tokenizer::Impl::load_padding(const json& p) {
  if (!p.is_object()) bad("padding must be an object or null");
  Padding pd;
  if (const json* s = opt(p, "strategy")) {
    if (s->is_object() && s->contains("Fixed") && (*s)["Fixed"].is_number_integer() && (*s)["Fixed"].get<int64_t>() >= 1)
      pd.length = (*s)["Fixed"].get<int64_t>();
    else if (!(s->is_string() && s->get<std::string>() == "BatchLongest"))
      bad("padding.strategy must be \"BatchLongest\" or {\"Fixed\": n >= 1}, got ", s->dump());
  }
  if (const json* d = opt(p, "direction")) {
    if (!d->is_string() || (*d != "Right" && *d != "Left")) bad("padding.direction must be \"Right\" or \"Left\"");
    pd.left = *d == "Left";
  }
  if (const json* m = opt(p, "pad_to_multiple_of")) {
    if (!m->is_number_integer() || m->get<int64_t>() < 0) bad("padding.pad_to_multiple_of must be an integer >= 0");
    pd.multiple_of = m->get<int64_t>();
  }
  for (auto [key, field] : {std::pair{"pad_id", &pd.pad_id}, {"pad_type_id", &pd.pad_type_id}})
    if (const json* v = opt(p, key)) {
      if (!v->is_number_integer() || v->get<int64_t>() < 0 || v->get<int64_t>() >= int64_t{1} << 31)
        bad("padding.", key, " must be an integer id >= 0");
      *field = static_cast<int32_t>(v->get<int64_t>());
    }
  if (pd.pad_id >= static_cast<int32_t>(tokens.size()))
    bad("padding.pad_id ", pd.pad_id, " is outside the vocabulary of ", tokens.size());
  padding = pd;
}

void Tokenizer::Impl::load_truncation(const json& t) {
  if (!t.is_object()) bad("truncation must be an object or null");
  Truncation tr;
  const json* m = opt(t, "max_length");
  if (!m || !m->is_number_integer() || m->get<int64_t>() < 1 || m->get<int64_t>() >= int64_t{1} << 31)
    bad("truncation.max_length must be an integer >= 1");
  tr.max_length = m->get<int64_t>();
  if (const json* s = opt(t, "strategy")) {
    if (*s == "LongestFirst") tr.strategy = TruncationStrategy::longest_first;
    else if (*s == "OnlyFirst") tr.strategy = TruncationStrategy::only_first;
    else if (*s == "OnlySecond") tr.strategy = TruncationStrategy::only_second;
    else bad("truncation.strategy must be \"LongestFirst\", \"OnlyFirst\" or \"OnlySecond\", got ", s->dump());
  }
  if (const json* d = opt(t, "direction")) {
    if (!d->is_string() || (*d != "Right" && *d != "Left")) bad("truncation.direction must be \"Right\" or \"Left\"");
    tr.left = *d == "Left";
  }
  if (const json* st = opt(t, "stride")) {
    if (!st->is_number_integer() || st->get<int64_t>() < 0 || st->get<int64_t>() >= tr.max_length)
      bad("truncation.stride must be an integer in [0, max_length)");
    tr.stride = st->get<int64_t>();
  }
  truncation = tr;
}

std::vector<TemplatePiece> Tokenizer::Impl::load_template(const json& list, const json* specials,
                                                         const std::string& field, bool pair) {
  if (!list.is_array()) bad(field, " must be an array");
  std::vector<TemplatePiece> out;
  bool seen[2] = {false, false};
  for (size_t i = 0; i < list.size(); ++i) {
    const json& piece = list[i];
    const std::string f = field + "[" + std::to_string(i) + "]";
    const json* body = piece.is_object() ? opt(piece, "Sequence") : nullptr;
    const bool is_seq = body != nullptr;
    if (!body) body = piece.is_object() ? opt(piece, "SpecialToken") : nullptr;
    const json* nm = body && body->is_object() ? opt(*body, "id") : nullptr;
    if (!nm || !nm->is_string()) bad(f, " must be {\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": ...}");
    const json* tj = opt(*body, "type_id");
    if (tj && !tj->is_number_unsigned()) bad(f, ".type_id must be a non-negative integer, not ", tj->dump());
    // Type ids index a token-type embedding (2 rows in BERT): one past int32 is a damaged file, and
    // refused rather than clamped into some other row.
    if (tj && tj->get<uint64_t>() > static_cast<uint64_t>(INT32_MAX))
      bad(f, ".type_id ", tj->get<uint64_t>(), " is past the largest token type id, ", INT32_MAX);
    const int32_t type_id = tj ? static_cast<int32_t>(tj->get<uint64_t>()) : 0;
    const std::string& tok = nm->get_ref<const std::string&>();
    if (is_seq) {
      const int which = tok == "A" ? 0 : tok == "B" ? 1 : -1;
      if (which < 0 || (which == 1 && !pair)) bad(f, ": sequence ", quoted(tok), " (", pair ? "A or B" : "only A", ")");
      if (seen[which]) bad(f, ": a second sequence ", tok, " in a ", pair ? "pair" : "single-sequence", " template");
      seen[which] = true;
      out.push_back({which, {}, type_id});
      continue;
    }
    std::vector<int32_t> got;
    const json* entry = specials && specials->is_object() ? opt(*specials, tok.c_str()) : nullptr;
    if (entry) {
      const json* idl = entry->is_object() ? opt(*entry, "ids") : nullptr;
      if (!idl || !idl->is_array()) bad("post_processor.special_tokens[", quoted(tok), "].ids must be an array");
      for (const json& v : *idl) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= static_cast<int64_t>(tokens.size()))
          bad("post_processor.special_tokens[", quoted(tok), "].ids holds ", v.dump(), ", not an id in [0, ",
              tokens.size(), ")");
        got.push_back(v.get<int32_t>());
      }
    } else {
      auto it = ids.find(tok);
      if (it == ids.end()) bad(f, " names ", quoted(tok), ", which is neither in special_tokens nor a token");
      got.push_back(it->second);
    }
    out.push_back({-1, std::move(got), type_id});
  }
  if (!seen[0]) bad(field, " has no {\"Sequence\": {\"id\": \"A\"}} entry");
  if (pair && !seen[1]) bad(field, " has no {\"Sequence\": {\"id\": \"B\"}} entry");
  return out;
}

void Tokenizer::Impl::load_trim(const json& post, const std::string& field) {
  // trim_offsets and add_prefix_space are true when absent, as tokenizers' defaults.
  const auto flag = [&](const char* k) {
    const json* v = opt(post, k);
    if (v && !v->is_boolean()) bad(field, ".", k, " must be true or false, not ", v->dump());
    return !v || v->get<bool>();
  };
  if (flag("trim_offsets")) {
    trim_offsets = true;
    trim_prefix_space = flag("add_prefix_space");
  }
}

void Tokenizer::Impl::load_processor(const json& post, const std::string& field, bool top) {
  const json* tj = post.is_object() ? opt(post, "type") : nullptr;
  const auto token_of = [&](const char* k) {  // RobertaProcessing's and BertProcessing's ["<s>", 0]
    const json* v = opt(post, k);
    if (!v || !v->is_array() || v->size() != 2 || !(*v)[0].is_string() || !(*v)[1].is_number_integer())
      bad(field, ".", k, " must be [token, id], not ", v ? v->dump() : "missing");
    const int64_t id = (*v)[1].get<int64_t>();
    if (id < 0 || id >= static_cast<int64_t>(tokens.size()))
      bad(field, ".", k, " id ", id, " is out of range [0, ", tokens.size(), ")");
    return static_cast<int32_t>(id);
  };
  if (tj && *tj == "TemplateProcessing") {
    const json* single = opt(post, "single");
    if (!single || !single->is_array()) bad(field, ".single must be an array");
    const json* specials = opt(post, "special_tokens");
    single_tpl = load_template(*single, specials, field + ".single", false);
    pair_tpl.clear();
    if (const json* pair = opt(post, "pair")) pair_tpl = load_template(*pair, specials, field + ".pair", true);
  } else if (tj && *tj == "RobertaProcessing") {
    // <s> A </s> and <s> A </s></s> B </s>, every type id 0 (RoBERTa has one token type).
    const int32_t cls = token_of("cls"), sep = token_of("sep");
    single_tpl = {{-1, {cls}, 0}, {0, {}, 0}, {-1, {sep}, 0}};
    pair_tpl = {{-1, {cls}, 0}, {0, {}, 0}, {-1, {sep, sep}, 0}, {1, {}, 0}, {-1, {sep}, 0}};
    load_trim(post, field);
  } else if (tj && *tj == "BertProcessing") {
    // [CLS] A [SEP] and [CLS] A [SEP] B [SEP], B's part type 1: what TemplateProcessing files say.
    const int32_t cls = token_of("cls"), sep = token_of("sep");
    single_tpl = {{-1, {cls}, 0}, {0, {}, 0}, {-1, {sep}, 0}};
    pair_tpl = {{-1, {cls}, 0}, {0, {}, 0}, {-1, {sep}, 0}, {1, {}, 1}, {-1, {sep}, 1}};
  } else if (tj && *tj == "ByteLevel") {
    // Only offsets change (trim_offsets): ids pass through, a pair is A then B.
    single_tpl = {{0, {}, 0}};
    pair_tpl = {{0, {}, 0}, {1, {}, 1}};
    load_trim(post, field);
  } else if (tj && *tj == "Sequence" && top) {
    // Llama 3 style: ByteLevel (ids unchanged) and at most one processor that adds tokens, which
    // then decides alone. One level deep: tokenizers writes no deeper nesting.
    const json* list = opt(post, "processors");
    if (!list || !list->is_array()) bad(field, ".processors must be an array");
    single_tpl = {{0, {}, 0}};
    pair_tpl = {{0, {}, 0}, {1, {}, 1}};
    bool adds = false;
    for (size_t i = 0; i < list->size(); ++i) {
      const json& p = (*list)[i];
      const std::string f = field + ".processors[" + std::to_string(i) + "]";
      const json* pt = p.is_object() ? opt(p, "type") : nullptr;
      if (pt && *pt == "ByteLevel") {
        load_trim(p, f);
        continue;
      }
      if (adds) bad(f, ": a second processor that adds tokens (only one besides ByteLevel is supported)");
      adds = true;
      load_processor(p, f, false);
    }
  } else {
    bad(field, " ", tj ? tj->dump() : post.dump(), " is not supported (TemplateProcessing, RobertaProcessing, "
        "BertProcessing, ByteLevel", top ? ", Sequence of those" : "", " or null)");
  }
}

void Tokenizer::Impl::load_post(const json& post) {
  trim_offsets = trim_prefix_space = false;
  load_processor(post, "post_processor", true);
  prefix.clear();
  suffix.clear();
  bool after = false;
  for (const TemplatePiece& t : single_tpl) {
    if (t.seq == 0) after = true;
    (after ? suffix : prefix).insert((after ? suffix : prefix).end(), t.ids.begin(), t.ids.end());
  }
}

// The templates of a prefix / suffix policy (tokenizer_config.json's or the BOS-only default), as
// transformers' LlamaTokenizerFast writes them: prefix A suffix, then prefix B suffix with type 1.
void Tokenizer::Impl::set_templates_from_prefix_suffix() {
  single_tpl = {{-1, prefix, 0}, {0, {}, 0}, {-1, suffix, 0}};
  pair_tpl = {{-1, prefix, 0}, {0, {}, 0}, {-1, suffix, 0}, {-1, prefix, 1}, {1, {}, 1}, {-1, suffix, 1}};
}

// tokenizer_config.json: bos_token / eos_token name the tokens; add_bos_token / add_eos_token, when
// either is given, rebuild the template as LlamaTokenizerFast does ([bos] $A [eos]).
void Tokenizer::Impl::load_config(const json& cfg, const std::string& cfg_name) {
  const auto cbad = [&](const auto&... a) { fail("tokenizer config ", cfg_name, ": ", a...); };
  if (!cfg.is_object()) cbad("the top level must be a JSON object, not ", cfg.type_name());
  const auto token_id = [&](const char* key, int32_t fallback) -> int32_t {
    auto it = cfg.find(key);
    if (it == cfg.end()) return fallback;
    if (it->is_null()) return -1;
    const json* c = it->is_object() ? opt(*it, "content") : &*it;
    if (!c || !c->is_string()) cbad(key, " must be a string, {\"content\": string} or null, not ", it->dump());
    auto f = ids.find(c->get<std::string>());
    if (f == ids.end()) cbad(key, " ", c->dump(), " is not a token of ", name);
    return f->second;
  };
  bos = token_id("bos_token", bos);
  eos = token_id("eos_token", eos);
  const auto flag = [&](const char* key, bool dflt) -> std::optional<bool> {
    auto it = cfg.find(key);
    if (it == cfg.end()) return std::nullopt;
    if (it->is_null()) return dflt;
    if (!it->is_boolean()) cbad(key, " must be true or false, not ", it->dump());
    return it->get<bool>();
  };
  const std::optional<bool> add_bos = flag("add_bos_token", true), add_eos = flag("add_eos_token", false);
  if (!add_bos && !add_eos) return;
  prefix.clear();
  suffix.clear();
  if (add_bos.value_or(true)) {
    if (bos < 0) cbad("add_bos_token is true but there is no bos_token");
    prefix.push_back(bos);
  }
  if (add_eos.value_or(false)) {
    if (eos < 0) cbad("add_eos_token is true but there is no eos_token");
    suffix.push_back(eos);
  }
  set_templates_from_prefix_suffix();
}

}  // namespace clattn
