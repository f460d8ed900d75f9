// config.json of Hugging Face checkpoints: the fields each architecture needs, checked up front
// (a missing or wrong-typed field is an error naming the file and the field), and attention plans.
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "clattn/error.h"
#include "clattn/input_file.h"
#include "clattn/model.h"

namespace clattn {
namespace {

using nlohmann::json;

struct Fields {
  const json& j;
  const std::string& path;
  int64_t integer(const char* key) const {
    check(j.contains(key), "config '", path, "': field \"", key, "\" is missing");
    check(j[key].is_number_integer(), "config '", path, "': field \"", key, "\" must be an integer, got ", j[key].dump());
    const int64_t v = j[key].get<int64_t>();
    check(v >= 0 && v <= (int64_t{1} << 31), "config '", path, "': field \"", key, "\" = ", v, " is out of range");
    return v;
  }
  int64_t integer_or(const char* key, int64_t dflt) const {
    return j.contains(key) && !j[key].is_null() ? integer(key) : dflt;
  }
  double number_or(const char* key, double dflt) const {
    if (!j.contains(key) || j[key].is_null()) return dflt;
    check(j[key].is_number(), "config '", path, "': field \"", key, "\" must be a number, got ", j[key].dump());
    const double v = j[key].get<double>();
    check(std::isfinite(v), "config '", path, "': field \"", key, "\" must be finite");
    return v;
  }
  // A number in [lo, hi] (a float field: a value float cannot hold, or one a layer would turn
  // into inf or NaN, is refused here rather than reported later as a non-finite activation).
  double number_in(const char* key, double dflt, double lo, double hi, const char* meaning) const {
    const double v = number_or(key, dflt);
    check(v >= lo && v <= hi, "config '", path, "': field \"", key, "\" = ", v, " is out of range: ",
          meaning, " must be in [", lo, ", ", hi, "]");
    return v;
  }
  bool boolean_or(const char* key, bool dflt) const {
    if (!j.contains(key) || j[key].is_null()) return dflt;
    check(j[key].is_boolean(), "config '", path, "': field \"", key, "\" must be true or false, got ", j[key].dump());
    return j[key].get<bool>();
  }
  std::string string_or(const char* key, const std::string& dflt) const {
    if (!j.contains(key) || j[key].is_null()) return dflt;
    check(j[key].is_string(), "config '", path, "': field \"", key, "\" must be a string, got ", j[key].dump());
    return j[key].get<std::string>();
  }
};

// id2label: {"0": "neg", "1": "pos"} into c.labels.
void read_labels(const json& j, const std::string& path, ModelConfig& c) {
  c.labels.resize(j["id2label"].size());
  for (const auto& [k, v] : j["id2label"].items()) {
    size_t idx = 0;
    try {
      idx = std::stoul(k);
    } catch (...) {
      throw Error(detail::concat("config '", path, "': id2label key \"", k, "\" is not an index"));
    }
    check(idx < c.labels.size() && v.is_string(), "config '", path, "': id2label entry \"", k, "\" is out of range or not a string");
    c.labels[idx] = v.get<std::string>();
  }
}

// DistilBERT's config.json names its sizes differently (dim, n_layers, n_heads, hidden_dim,
// activation) and fixes the rest: post-LN with eps 1e-12, no token types, a ReLU pre_classifier.
ModelConfig read_distilbert(const json& j, const Fields& f, const std::string& path, ModelConfig c) {
  c.hidden = f.integer("dim");
  c.layers = f.integer("n_layers");
  c.heads = f.integer("n_heads");
  c.ffn = f.integer("hidden_dim");
  c.vocab = f.integer("vocab_size");
  c.max_positions = f.integer("max_position_embeddings");
  check(c.hidden >= 1 && c.layers >= 1 && c.heads >= 1 && c.ffn >= 1 && c.vocab >= 1 && c.max_positions >= 1,
        "config '", path, "': dim, n_layers, n_heads, hidden_dim, vocab_size and max_position_embeddings must be >= 1");
  check(c.hidden % c.heads == 0, "config '", path, "': dim (", c.hidden, ") must be a multiple of n_heads (", c.heads, ")");
  c.kv_heads = c.heads;
  c.head_dim = c.hidden / c.heads;
  const std::string act = f.string_or("activation", "gelu");
  check(act == "gelu", "config '", path, "': activation \"", act, "\" is not supported for distilbert (gelu)");
  c.gelu_tanh = false;
  c.eps = 1e-12f;
  c.type_vocab = 0;
  c.pooler_relu = true;
  c.tie_embeddings = f.boolean_or("tie_word_embeddings", true);  // a masked-LM head checks it (encoder.cpp)
  if (j.contains("id2label") && j["id2label"].is_object()) read_labels(j, path, c);
  c.num_labels = f.integer_or("num_labels", static_cast<int64_t>(c.labels.size()));
  return c;
}

// GPT-2's config.json (n_embd, n_layer, n_head, n_inner, n_positions, layer_norm_epsilon,
// activation_function): a decoder with LayerNorm, learned positions and a tied output layer.
ModelConfig read_gpt2(const Fields& f, const std::string& path, ModelConfig c) {
  c.hidden = f.integer("n_embd");
  c.layers = f.integer("n_layer");
  c.heads = f.integer("n_head");
  c.max_positions = f.integer("n_positions");
  c.vocab = f.integer("vocab_size");
  check(c.hidden >= 1 && c.layers >= 1 && c.heads >= 1 && c.max_positions >= 1 && c.vocab >= 1, "config '", path,
        "': n_embd, n_layer, n_head, n_positions and vocab_size must be >= 1");
  check(c.hidden % c.heads == 0, "config '", path, "': n_embd (", c.hidden, ") must be a multiple of n_head (", c.heads, ")");
  c.ffn = f.integer_or("n_inner", 4 * c.hidden);  // null: 4 x n_embd, as transformers
  check(c.ffn >= 1, "config '", path, "': n_inner must be >= 1");
  c.kv_heads = c.heads;
  c.head_dim = c.hidden / c.heads;
  c.eps = static_cast<float>(f.number_in("layer_norm_epsilon", 1e-5, 0, 1, "the LayerNorm epsilon"));
  const std::string act = f.string_or("activation_function", "gelu_new");
  check(act == "gelu_new" || act == "gelu_pytorch_tanh", "config '", path, "': activation_function \"", act,
        "\" is not supported for gpt2 (gelu_new, gelu_pytorch_tanh)");
  c.gelu_tanh = true;
  c.tie_embeddings = f.boolean_or("tie_word_embeddings", true);
  check(c.tie_embeddings, "config '", path, "': tie_word_embeddings false is not supported for gpt2");
  check(f.boolean_or("scale_attn_weights", true), "config '", path, "': scale_attn_weights false is not supported");
  check(!f.boolean_or("scale_attn_by_inverse_layer_idx", false), "config '", path,
        "': scale_attn_by_inverse_layer_idx is not supported (one attention scale for every layer)");
  check(!f.boolean_or("add_cross_attention", false), "config '", path, "': add_cross_attention is not supported");
  c.bos = static_cast<int32_t>(f.integer_or("bos_token_id", -1));
  c.eos = static_cast<int32_t>(f.integer_or("eos_token_id", -1));
  return c;
}

}  // namespace

ModelConfig read_model_config(const std::string& path) {
  // Never blocks on a FIFO, never reads without bound; the error gives the system's reason.
  const std::string text = read_input_file(path, "config", kMaxJsonBytes);
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    throw Error(detail::concat("config '", path, "': not valid JSON: ", e.what()));
  }
  check(j.is_object(), "config '", path, "': must be a JSON object");
  const Fields f{j, path};
  ModelConfig c;
  c.model_type = f.string_or("model_type", "");
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    c.architecture = j["architectures"][0].get<std::string>();
  const bool roberta = c.model_type == "roberta", distil = c.model_type == "distilbert";
  if (c.model_type == "bert" || roberta || distil) c.kind = ModelKind::bert;
  else if (c.model_type == "kwt") c.kind = ModelKind::kwt;
  else if (c.model_type == "llama" || c.model_type == "gpt2") c.kind = ModelKind::llama;
  else
    throw Error(detail::concat("config '", path, "': model_type \"", c.model_type,
                               "\" is not supported (supported: bert, roberta, distilbert, kwt, llama, gpt2)"));
  // The heads each family's checkpoints can carry here (a token-classification or question-
  // answering head would be silently dropped, so they are refused).
  static const std::vector<std::string> kArch = {
      "BertModel", "BertForSequenceClassification", "BertForMaskedLM", "RobertaModel",
      "RobertaForSequenceClassification", "RobertaForMaskedLM", "DistilBertModel",
      "DistilBertForSequenceClassification", "DistilBertForMaskedLM", "KWTForKeywordSpotting", "LlamaForCausalLM",
      "GPT2LMHeadModel", "GPT2Model", ""};
  bool known = false;
  for (const auto& a : kArch) known |= a == c.architecture;
  check(known, "config '", path, "': architectures entry \"", c.architecture,
        "\" is not supported (supported: BertModel, BertForSequenceClassification, BertForMaskedLM, "
        "RobertaModel, RobertaForSequenceClassification, RobertaForMaskedLM, DistilBertModel, "
        "DistilBertForSequenceClassification, DistilBertForMaskedLM, KWTForKeywordSpotting, LlamaForCausalLM, "
        "GPT2LMHeadModel, GPT2Model)");
  if (j.contains("clattn_head") && j["clattn_head"].is_string())
    c.saved_head = task_kind_from_name(j["clattn_head"].get<std::string>());
  if (j.contains("clattn_attention") && j["clattn_attention"].is_string())
    c.saved_plan = j["clattn_attention"].get<std::string>();
  if (distil) return read_distilbert(j, f, path, c);
  if (c.model_type == "gpt2") return read_gpt2(f, path, c);

  c.hidden = f.integer("hidden_size");
  c.layers = f.integer("num_hidden_layers");
  c.heads = f.integer("num_attention_heads");
  c.ffn = f.integer("intermediate_size");
  check(c.hidden >= 1 && c.layers >= 1 && c.heads >= 1 && c.ffn >= 1, "config '", path,
        "': hidden_size, num_hidden_layers, num_attention_heads and intermediate_size must be >= 1");
  c.kv_heads = f.integer_or("num_key_value_heads", c.heads);
  c.head_dim = f.integer_or("head_dim", c.hidden / c.heads);
  check(c.kv_heads >= 1 && c.heads % c.kv_heads == 0, "config '", path,
        "': num_attention_heads (", c.heads, ") must be a multiple of num_key_value_heads (", c.kv_heads, ")");
  check(c.head_dim >= 1, "config '", path, "': head_dim must be >= 1");
  c.max_positions = f.integer_or("max_position_embeddings", 0);
  // 0 or absent: 1/sqrt(head_dim); otherwise the range of the spec's scale= (attention.h).
  // Checked as a double: 1e300 or 1e-50 would otherwise turn into inf or 0 on the way to float.
  if (f.number_or("attention_scale", 0.0) != 0.0)
    c.attention_scale = static_cast<float>(
        f.number_in("attention_scale", 0.0, 1e-6, 1e6, "the attention scale (0 or absent: 1/sqrt(head_dim))"));
  if (j.contains("id2label") && j["id2label"].is_object()) read_labels(j, path, c);
  c.num_labels = f.integer_or("num_labels", static_cast<int64_t>(c.labels.size()));

  if (c.kind == ModelKind::llama) {
    check(c.heads * c.head_dim > 0, "config '", path, "': bad head sizes");
    c.vocab = f.integer("vocab_size");
    c.eps = static_cast<float>(f.number_in("rms_norm_eps", 1e-6, 0, 1, "the RMSNorm epsilon"));
    c.rope_theta = static_cast<float>(f.number_in("rope_theta", 10000.0, 1, 1e30, "the rotary base"));
    c.tie_embeddings = f.boolean_or("tie_word_embeddings", false);
    check(f.string_or("hidden_act", "silu") == "silu", "config '", path, "': hidden_act \"",
          f.string_or("hidden_act", ""), "\" is not supported for llama (silu)");
    check(!j.contains("rope_scaling") || j["rope_scaling"].is_null(), "config '", path,
          "': rope_scaling is not supported");
    check(!f.boolean_or("attention_bias", false) && !f.boolean_or("mlp_bias", false), "config '", path,
          "': attention_bias / mlp_bias are not supported for llama");
    check(c.head_dim % 2 == 0, "config '", path, "': head_dim must be even for rotary embeddings, got ", c.head_dim);
    c.bos = static_cast<int32_t>(f.integer_or("bos_token_id", -1));
    c.eos = static_cast<int32_t>(f.integer_or("eos_token_id", -1));
    return c;
  }
  // Encoders
  check(c.kv_heads == c.heads, "config '", path, "': encoders take num_key_value_heads = num_attention_heads");
  check(c.heads * c.head_dim == c.hidden, "config '", path, "': num_attention_heads x head_dim (",
        c.heads * c.head_dim, ") must equal hidden_size (", c.hidden, ")");
  c.eps = static_cast<float>(f.number_in("layer_norm_eps", 1e-12, 0, 1, "the LayerNorm epsilon"));
  const std::string act = f.string_or("hidden_act", "gelu");
  if (act == "gelu") c.gelu_tanh = false;
  else if (act == "gelu_tanh" || act == "gelu_new" || act == "gelu_pytorch_tanh") c.gelu_tanh = true;
  else throw Error(detail::concat("config '", path, "': hidden_act \"", act, "\" is not supported (gelu, gelu_tanh, gelu_new, gelu_pytorch_tanh)"));
  const std::string norm = f.string_or("norm_placement", "post");
  check(norm == "post" || norm == "pre", "config '", path, "': norm_placement must be \"post\" or \"pre\", got \"", norm, "\"");
  c.pre_ln = norm == "pre";
  c.final_layer_norm = f.boolean_or("final_layer_norm", false);
  c.qkv_bias = f.boolean_or("qkv_bias", true);
  if (c.kind == ModelKind::kwt) {
    c.input_dim = f.integer("input_dim");
    c.num_patches = f.integer("num_patches");
    check(c.max_positions == c.num_patches + 1, "config '", path, "': max_position_embeddings (",
          c.max_positions, ") must be num_patches + 1 (", c.num_patches + 1, ") for the class token");
    check(f.string_or("classifier_input", "cls_token") == "cls_token" && f.integer_or("cls_token_position", 0) == 0,
          "config '", path, "': only a class token at position 0 is supported");
    check(c.num_labels >= 1, "config '", path, "': num_labels (or id2label) is required");
  } else {
    c.vocab = f.integer("vocab_size");
    c.type_vocab = f.integer_or("type_vocab_size", 2);
    // Fields of transformers' BERT and RoBERTa configs that change the computation and that these
    // encoders do not implement: refused by name rather than loaded and ignored.
    const std::string pos = f.string_or("position_embedding_type", "absolute");
    check(pos == "absolute", "config '", path, "': position_embedding_type "", pos, "" is not supported for ",
          c.model_type, " (absolute only: relative_key and relative_key_query add distance embeddings to the "
          "attention scores)");
    check(!f.boolean_or("is_decoder", false), "config '", path, "': is_decoder true is not supported for ", c.model_type,
          " (these encoders attend in both directions)");
    check(!f.boolean_or("add_cross_attention", false), "config '", path, "': add_cross_attention is not supported for ",
          c.model_type);
    c.tie_embeddings = f.boolean_or("tie_word_embeddings", true);  // a masked-LM head checks it (encoder.cpp)
    const std::string pooling = f.string_or("classifier_pooling", "first");
    check(pooling == "first" || pooling == "mean", "config '", path, "': classifier_pooling must be \"first\" or \"mean\", got \"",
          pooling, "\"");
    c.mean_pooling = pooling == "mean";
    check(c.max_positions >= 1, "config '", path, "': max_position_embeddings is required");
    if (roberta) {
      // RoBERTa numbers positions from padding_idx + 1 (transformers'
      // create_position_ids_from_input_ids), so the first padding_idx + 1 rows are never used.
      const int64_t pad = f.integer_or("pad_token_id", 1);
      c.position_offset = pad + 1;
      check(c.max_positions > c.position_offset, "config '", path, "': max_position_embeddings (", c.max_positions,
            ") must exceed pad_token_id + 1 (", c.position_offset, "), where RoBERTa's positions start");
      c.max_positions -= c.position_offset;
      c.type_vocab = f.integer_or("type_vocab_size", 1);
    }
  }
  return c;
}

ModelKind model_kind(const std::string& dir) {
  return read_model_config((std::filesystem::path(dir) / "config.json").string()).kind;
}

std::vector<std::string> parse_attention_plan(const std::string& plan_in, int64_t layers) {
  // A trailing ';' names every layer: the plan must then have exactly the model's layer count (a
  // plan file's per-layer list, read by read_plan_file, ends so).
  const bool exact = plan_in.size() > 1 && plan_in.back() == ';';
  const std::string plan = exact ? plan_in.substr(0, plan_in.size() - 1) : plan_in;
  std::vector<std::string> items;
  size_t start = 0;
  while (true) {
    const size_t e = plan.find(';', start);
    items.push_back(plan.substr(start, e == std::string::npos ? std::string::npos : e - start));
    if (e == std::string::npos) break;
    start = e + 1;
  }
  for (size_t i = 0; i < items.size(); ++i)
    check(!items[i].empty(), "attention plan '", plan, "': item ", i, " is empty (one spec per layer, ';'-separated)");
  check(!exact || static_cast<int64_t>(items.size()) == layers, "attention plan '", plan_in, "' names every layer (a ",
        "trailing ';'; a plan file's \"layers\") of a ", items.size(), "-layer model, but this model has ", layers,
        ": search a plan for this model (clattn approx --target)");
  check(static_cast<int64_t>(items.size()) <= layers, "attention plan '", plan, "' names ", items.size(),
        " layers but the model has ", layers);
  std::vector<std::string> out(static_cast<size_t>(layers));
  for (int64_t l = 0; l < layers; ++l)
    out[static_cast<size_t>(l)] = items[std::min<size_t>(static_cast<size_t>(l), items.size() - 1)];
  return out;
}

}  // namespace clattn

namespace clattn {
using nlohmann::json;


std::string read_plan_file(const std::string& path) {
  const std::string text = read_input_file(path, "plan file", kMaxJsonBytes);
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    throw Error(detail::concat("plan file '", path, "': not valid JSON: ", e.what()));
  }
  check(j.is_object() && j.contains("plan") && j["plan"].is_string(), "plan file '", path,
        "': needs a string field \"plan\" (one spec, or ';'-separated specs per layer)");
  const std::string plan = j["plan"].get<std::string>();
  check(!plan.empty(), "plan file '", path, "': \"plan\" is empty");
  // "layers" (clattn approx --target writes it): the spec of every layer of the model the plan was
  // searched for. The plan is then that list, ending in ';', so a model of another depth refuses
  // it instead of repeating its last spec.
  std::string per_layer;
  if (j.contains("layers")) {
    const json& l = j["layers"];
    check(l.is_array() && !l.empty(), "plan file '", path, "': \"layers\" must be a non-empty array of specs, one per layer");
    for (size_t i = 0; i < l.size(); ++i) {
      check(l[i].is_string() && !l[i].get_ref<const std::string&>().empty() &&
                l[i].get_ref<const std::string&>().find(';') == std::string::npos,
            "plan file '", path, "': \"layers\"[", i, "] must be one spec string");
      per_layer += l[i].get_ref<const std::string&>() + ";";
    }
    const std::vector<std::string> expanded = parse_attention_plan(plan, static_cast<int64_t>(l.size()));
    for (size_t i = 0; i < l.size(); ++i)
      check(expanded[i] == l[i].get_ref<const std::string&>(), "plan file '", path, "': \"plan\" gives layer ", i,
            " '", expanded[i], "' but \"layers\"[", i, "] is '", l[i].get_ref<const std::string&>(), "'");
  }
  size_t start = 0;
  while (true) {
    const size_t e = plan.find(';', start);
    const std::string spec = plan.substr(start, e == std::string::npos ? std::string::npos : e - start);
    try {
      (void)make_attention(spec);
    } catch (const Error& err) {
      throw Error(detail::concat("plan file '", path, "': \"plan\" item '", spec, "': ", err.what()));
    }
    if (e == std::string::npos) break;
    start = e + 1;
  }
  return per_layer.empty() ? plan : per_layer;
}

std::vector<std::unique_ptr<Attention>> make_plan_attentions(const std::vector<std::string>& specs,
                                                             bool causal, bool gqa) {
  std::vector<std::unique_ptr<Attention>> att;
  for (size_t l = 0; l < specs.size(); ++l) {
    try {
      att.push_back(make_attention(specs[l]));
    } catch (const Error& e) {
      throw Error(detail::concat("attention of layer ", l, ": ", e.what()));
    }
    const Capabilities& caps = att.back()->capabilities();
    check(!causal || caps.causal, "attention of layer ", l, ": '", specs[l], "' does not support the causal mask a decoder needs");
    check(!gqa || caps.gqa, "attention of layer ", l, ": '", specs[l], "' does not support grouped-query attention");
  }
  return att;
}

std::string model_config_json(const ModelConfig& c, const std::optional<TaskKind>& head, const std::string& plan) {
  json j;
  const bool classifier = c.kind != ModelKind::llama && c.num_labels >= 1 && (!head || *head == TaskKind::classify);
  // A pretrained masked-LM head keeps its *ForMaskedLM architecture (clattn's own, without the
  // transform, is written as the bare model with "clattn_head": "mlm").
  const bool mlm_lm = c.mlm_transform && head && *head == TaskKind::mlm;
  if (classifier) {
    j["num_labels"] = c.num_labels;
    if (static_cast<int64_t>(c.labels.size()) == c.num_labels) {
      json id2label = json::object();
      for (size_t i = 0; i < c.labels.size(); ++i) id2label[std::to_string(i)] = c.labels[i];
      j["id2label"] = id2label;
    }
  }
  if (c.model_type == "gpt2") {
    j["model_type"] = "gpt2";
    j["architectures"] = {"GPT2LMHeadModel"};
    j["n_embd"] = c.hidden;
    j["n_layer"] = c.layers;
    j["n_head"] = c.heads;
    j["n_inner"] = c.ffn;
    j["n_positions"] = c.max_positions;
    j["n_ctx"] = c.max_positions;
    j["vocab_size"] = c.vocab;
    j["layer_norm_epsilon"] = c.eps;
    j["activation_function"] = "gelu_new";
    j["tie_word_embeddings"] = true;
    if (c.bos >= 0) j["bos_token_id"] = c.bos;
    if (c.eos >= 0) j["eos_token_id"] = c.eos;
  } else if (c.model_type == "distilbert") {
    // DistilBERT's own field names, so transformers reads the folder back as it wrote it.
    j["model_type"] = "distilbert";
    j["architectures"] = {classifier ? "DistilBertForSequenceClassification"
                                     : mlm_lm ? "DistilBertForMaskedLM" : "DistilBertModel"};
    j["dim"] = c.hidden;
    j["n_layers"] = c.layers;
    j["n_heads"] = c.heads;
    j["hidden_dim"] = c.ffn;
    j["vocab_size"] = c.vocab;
    j["max_position_embeddings"] = c.max_positions;
    j["activation"] = "gelu";
    j["sinusoidal_pos_embds"] = false;
  } else {
    j["hidden_size"] = c.hidden;
    j["num_hidden_layers"] = c.layers;
    j["num_attention_heads"] = c.heads;
    j["intermediate_size"] = c.ffn;
    j["max_position_embeddings"] = c.max_positions + c.position_offset;
  }
  if (c.attention_scale > 0) j["attention_scale"] = c.attention_scale;
  if (c.kind == ModelKind::llama && c.model_type != "gpt2") {
    j["model_type"] = "llama";
    j["architectures"] = {"LlamaForCausalLM"};
    j["vocab_size"] = c.vocab;
    j["num_key_value_heads"] = c.kv_heads;
    j["head_dim"] = c.head_dim;
    j["rms_norm_eps"] = c.eps;
    j["rope_theta"] = c.rope_theta;
    j["tie_word_embeddings"] = c.tie_embeddings;
    j["hidden_act"] = "silu";
    if (c.bos >= 0) j["bos_token_id"] = c.bos;
    if (c.eos >= 0) j["eos_token_id"] = c.eos;
  } else if (c.kind != ModelKind::llama && c.model_type != "distilbert") {
    if (c.kind == ModelKind::kwt) {
      j["model_type"] = "kwt";
      j["architectures"] = {"KWTForKeywordSpotting"};
      j["input_dim"] = c.input_dim;
      j["num_patches"] = c.num_patches;
    } else {
      const bool roberta = c.model_type == "roberta";
      j["model_type"] = roberta ? "roberta" : "bert";
      j["architectures"] = {roberta ? (classifier ? "RobertaForSequenceClassification" : mlm_lm ? "RobertaForMaskedLM" : "RobertaModel")
                                    : (classifier ? "BertForSequenceClassification" : mlm_lm ? "BertForMaskedLM" : "BertModel")};
      if (roberta) j["pad_token_id"] = c.position_offset - 1;
      j["vocab_size"] = c.vocab;
      j["type_vocab_size"] = c.type_vocab;
      j["classifier_pooling"] = c.mean_pooling ? "mean" : "first";
    }
    j["layer_norm_eps"] = c.eps;
    j["hidden_act"] = c.gelu_tanh ? "gelu_tanh" : "gelu";
    j["norm_placement"] = c.pre_ln ? "pre" : "post";
    j["final_layer_norm"] = c.final_layer_norm;
    j["qkv_bias"] = c.qkv_bias;
  }
  // clattn's own keys: the head the checkpoint trains, and the attention it runs with.
  if (head) j["clattn_head"] = task_kind_name(*head);
  j["clattn_attention"] = plan;
  return j.dump(2) + "\n";
}

}  // namespace clattn
