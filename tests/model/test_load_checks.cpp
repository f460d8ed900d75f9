// What loading refuses before a model runs or allocates: weights holding NaN or Inf (named by file,
// tensor and index), logits that are not finite at sampling, and a config.json whose sizes or
// layer count the checkpoint's tensors contradict (named by field and tensor, checked against the
// headers before anything is allocated). A config alone (random init) is sized before allocation.
// Every checkpoint here is a few hundred floats written to a temporary folder: each case runs in
// milliseconds, and the lying configs (2^31 layers) must never allocate what they claim.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "clattn/error.h"
#include "clattn/model.h"
#include "clattn/safetensors.h"
#include "model/weights.h"

namespace clattn {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("clattn_loadcheck_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p.string();
}

ModelConfig tiny_llama() {
  ModelConfig c;
  c.kind = ModelKind::llama;
  c.model_type = "llama";
  c.hidden = 8;
  c.layers = 2;
  c.heads = 2;
  c.kv_heads = 1;
  c.head_dim = 4;
  c.ffn = 12;
  c.vocab = 16;
  c.max_positions = 32;
  return c;
}

ModelConfig tiny_gpt2() {
  ModelConfig c = tiny_llama();
  c.model_type = "gpt2";
  c.kv_heads = 2;
  c.ffn = 32;
  c.tie_embeddings = true;
  c.gelu_tanh = true;
  return c;
}

ModelConfig tiny_bert() {
  ModelConfig c;
  c.kind = ModelKind::bert;
  c.model_type = "bert";
  c.hidden = 8;
  c.layers = 2;
  c.heads = 2;
  c.ffn = 16;
  c.vocab = 16;
  c.max_positions = 32;
  c.type_vocab = 2;
  c.num_labels = 3;
  return c;
}

// A checkpoint folder of a freshly initialised model of `cfg`.
std::string write_model(const ModelConfig& cfg, const std::string& name) {
  const std::string dir = temp_dir(name);
  const TaskKind head = cfg.kind == ModelKind::llama ? TaskKind::lm : TaskKind::classify;
  Model::create(cfg, head, 1)->save(dir);
  return dir;
}

// Rewrites the folder's model.safetensors with element `flat` of `tensor` set to v.
void poison(const std::string& dir, const std::string& tensor, int64_t flat, float v) {
  const std::string path = dir + "/model.safetensors";
  std::vector<Tensor> keep;
  SafetensorsWriter w;
  {
    const SafetensorsFile f = SafetensorsFile::open(path);
    for (const std::string& n : f.names()) {
      keep.push_back(f.get_f32(n));
      if (n == tensor) keep.back().data()[flat] = v;
      w.add(n, keep.back().view());
    }
  }
  w.write(path);
}

// Replaces fields of the folder's config.json.
void lie(const std::string& dir, const nlohmann::json& fields) {
  const std::string path = dir + "/config.json";
  nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
  j.update(fields);
  std::ofstream(path) << j.dump();
}

std::string load_error(const std::string& dir) {
  try {
    Model::load(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(LoadChecks, FirstNonFiniteFindsTheFirstBadValue) {
  for (int64_t n : {0, 1, 7, 4095, 4096, 4097, 10000}) {
    std::vector<float> x(static_cast<size_t>(n), 1.f);
    if (n > 2) {
      x[0] = std::numeric_limits<float>::max();
      x[1] = std::numeric_limits<float>::denorm_min();
      x[2] = -0.f;
    }
    EXPECT_EQ(first_non_finite(x.data(), n), n) << "n=" << n;
    for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()}) {
      for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
        if (n == 0) continue;
        std::vector<float> y = x;
        y[static_cast<size_t>(at)] = bad;
        if (at + 1 < n) y[static_cast<size_t>(n - 1)] = bad;  // a later one must not be reported
        EXPECT_EQ(first_non_finite(y.data(), n), at) << "n=" << n << " at=" << at << " bad=" << bad;
      }
    }
  }
}

TEST(LoadChecks, NonFiniteWeightIsNamedWithFileTensorAndIndex) {
  {
    const std::string dir = write_model(tiny_llama(), "nan_llama");
    poison(dir, "model.embed_tokens.weight", 3 * 8 + 5, std::nanf(""));
    const std::string e = load_error(dir);
    EXPECT_NE(e.find("model '" + dir + "/model.safetensors': tensor 'model.embed_tokens.weight' holds nan at index (3, 5)"),
              std::string::npos) << e;
    poison(dir, "model.embed_tokens.weight", 3 * 8 + 5, 0.f);
    poison(dir, "model.layers.1.mlp.down_proj.weight", 12 * 7 + 11, -std::numeric_limits<float>::infinity());
    const std::string e2 = load_error(dir);
    EXPECT_NE(e2.find("'model.layers.1.mlp.down_proj.weight' holds -inf at index (7, 11)"), std::string::npos) << e2;
    fs::remove_all(dir);
  }
  {  // GPT-2's matrices are stored transposed: the index is the file's
    const std::string dir = write_model(tiny_gpt2(), "nan_gpt2");
    poison(dir, "h.0.attn.c_attn.weight", 2 * 24 + 20, std::numeric_limits<float>::infinity());
    const std::string e = load_error(dir);
    EXPECT_NE(e.find("'h.0.attn.c_attn.weight' holds inf at index (2, 20)"), std::string::npos) << e;
    fs::remove_all(dir);
  }
  {
    const std::string dir = write_model(tiny_bert(), "nan_bert");
    poison(dir, "classifier.bias", 2, std::nanf(""));
    const std::string e = load_error(dir);
    EXPECT_NE(e.find("'classifier.bias' holds nan at index (2)"), std::string::npos) << e;
    fs::remove_all(dir);
  }
}

TEST(LoadChecks, SamplingRefusesNonFiniteLogits) {
  std::vector<float> l{0.5f, 2.f, std::nanf(""), 1.f};
  for (float t : {0.f, 0.8f}) {
    try {
      sample_token(l, SamplingOptions{.temperature = t}, 0);
      ADD_FAILURE() << "no error at temperature " << t;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("logits must be finite, got nan for token 2 of 4"), std::string::npos)
          << e.what();
    }
  }
  l[2] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(sample_token(l, SamplingOptions{.temperature = 0.8f}, 0), Error);
}

TEST(LoadChecks, LayerCountPastTheCheckpointIsRefusedBeforeAllocation) {
  {
    const std::string dir = write_model(tiny_llama(), "layers_llama");
    lie(dir, {{"num_hidden_layers", int64_t{1} << 31}});
    const std::string e = load_error(dir);
    EXPECT_NE(e.find("config '" + dir + "/config.json': \"num_hidden_layers\" = 2147483648 but the checkpoint holds 2 "
                     "layers (no tensor 'model.layers.2.input_layernorm.weight')"),
              std::string::npos) << e;
    fs::remove_all(dir);
  }
  {
    const std::string dir = write_model(tiny_gpt2(), "layers_gpt2");
    lie(dir, {{"n_layer", 1000000000}});
    const std::string e = load_error(dir);
    EXPECT_NE(e.find("\"n_layer\" = 1000000000 but the checkpoint holds 2 layers (no tensor 'h.2.ln_1.weight')"),
              std::string::npos) << e;
    fs::remove_all(dir);
  }
  {
    const std::string dir = write_model(tiny_bert(), "layers_bert");
    lie(dir, {{"num_hidden_layers", 5}});
    const std::string e = load_error(dir);
    EXPECT_NE(e.find("\"num_hidden_layers\" = 5 but the checkpoint holds 2 layers (no tensor "
                     "'encoder.layer.2.attention.self.query.weight')"),
              std::string::npos) << e;
    fs::remove_all(dir);
  }
}

TEST(LoadChecks, SizesTheCheckpointContradictsNameTheField) {
  {  // GPT-2 n_embd: before the check, the model was allocated and filled with random values
    const std::string dir = write_model(tiny_gpt2(), "embd_gpt2");
    lie(dir, {{"n_embd", 256}});
    const std::string e = load_error(dir);
    EXPECT_NE(e.find("tensor 'wte.weight' of '" + dir + "/model.safetensors' has shape [16, 8] but the config "
                     "implies [16, 256] (\"n_embd\" = 256)"),
              std::string::npos) << e;
    fs::remove_all(dir);
  }
  {
    const std::string dir = write_model(tiny_llama(), "ffn_llama");
    lie(dir, {{"intermediate_size", 4096}});
    const std::string e = load_error(dir);
    EXPECT_NE(e.find("tensor 'model.layers.0.mlp.gate_proj.weight'"), std::string::npos) << e;
    EXPECT_NE(e.find("(\"intermediate_size\" = 4096)"), std::string::npos) << e;
    fs::remove_all(dir);
  }
  {
    const std::string dir = write_model(tiny_bert(), "vocab_bert");
    lie(dir, {{"vocab_size", 30522}});
    const std::string e = load_error(dir);
    EXPECT_NE(e.find("'embeddings.word_embeddings.weight'"), std::string::npos) << e;
    EXPECT_NE(e.find("(\"vocab_size\" = 30522)"), std::string::npos) << e;
    fs::remove_all(dir);
  }
}

TEST(LoadChecks, RandomModelTooLargeForMemoryIsRefusedBeforeAllocation) {
  ModelConfig c = tiny_llama();
  c.layers = int64_t{1} << 31;
  try {
    Model::create(c, TaskKind::lm, 0);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("model: the parameters of a llama model of 2147483648 layers"), std::string::npos) << m;
    EXPECT_NE(m.find(" GB of memory"), std::string::npos) << m;
  }
  // Sizes whose product passes 2^63 (each is at most 2^31): refused, never wrapped around.
  ModelConfig g = tiny_gpt2();
  g.hidden = int64_t{1} << 31;
  g.heads = 1;
  g.kv_heads = 1;
  g.head_dim = g.hidden;
  g.ffn = 4 * g.hidden;
  EXPECT_THROW(Model::create(g, TaskKind::lm, 0), Error);
  ModelConfig b = tiny_bert();
  b.layers = int64_t{1} << 30;
  try {
    Encoder::random_bert(b, 0);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs about"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace clattn

namespace clattn {
namespace {

// The decoder families are recipes (src/model/decoder.cpp): each lays out the tensors its
// Hugging Face checkpoints hold, in their order and shapes, and an unknown family is named with
// the ones there are.
TEST(DecoderRecipes, ParametersAreTheFamilysTensors) {
  const auto names = [](const ModelConfig& c) {
    std::vector<std::string> out;
    const std::unique_ptr<Model> m = Model::create(c, TaskKind::lm, 1);
    for (const ParamInfo& p : m->param_info())
      out.push_back(p.shape.size() == 2 ? detail::concat(p.name, "(", p.shape[0], ",", p.shape[1], ")")
                                        : detail::concat(p.name, "(", p.shape[0], ")"));
    return out;
  };
  const std::vector<std::string> llama = names(tiny_llama());
  ASSERT_EQ(llama.size(), 1 + 2 * 9 + 2u);
  const std::vector<std::string> layer1(llama.begin() + 10, llama.begin() + 19);
  EXPECT_EQ(layer1, (std::vector<std::string>{
                        "model.layers.1.input_layernorm.weight(8)", "model.layers.1.self_attn.q_proj.weight(8,8)",
                        "model.layers.1.self_attn.k_proj.weight(4,8)", "model.layers.1.self_attn.v_proj.weight(4,8)",
                        "model.layers.1.self_attn.o_proj.weight(8,8)", "model.layers.1.post_attention_layernorm.weight(8)",
                        "model.layers.1.mlp.gate_proj.weight(12,8)", "model.layers.1.mlp.up_proj.weight(12,8)",
                        "model.layers.1.mlp.down_proj.weight(8,12)"}));
  EXPECT_EQ(llama.front(), "model.embed_tokens.weight(16,8)");
  EXPECT_EQ(llama.back(), "lm_head.weight(16,8)");  // untied
  const std::vector<std::string> gpt2 = names(tiny_gpt2());
  ASSERT_EQ(gpt2.size(), 2 + 2 * 12 + 2u);
  // Conv1D matrices are named as stored and held (out, in); shapes here are as held.
  EXPECT_EQ(std::vector<std::string>(gpt2.begin() + 2, gpt2.begin() + 14),
            (std::vector<std::string>{"h.0.ln_1.weight(8)", "h.0.ln_1.bias(8)", "h.0.attn.c_attn.weight(24,8)",
                                      "h.0.attn.c_attn.bias(24)", "h.0.attn.c_proj.weight(8,8)", "h.0.attn.c_proj.bias(8)",
                                      "h.0.ln_2.weight(8)", "h.0.ln_2.bias(8)", "h.0.mlp.c_fc.weight(32,8)",
                                      "h.0.mlp.c_fc.bias(32)", "h.0.mlp.c_proj.weight(8,32)", "h.0.mlp.c_proj.bias(8)"}));
  EXPECT_EQ(gpt2[0], "wte.weight(16,8)");
  EXPECT_EQ(gpt2[1], "wpe.weight(32,8)");
  EXPECT_EQ(gpt2.back(), "ln_f.bias(8)");  // tied: no lm_head
  ModelConfig other = tiny_llama();
  other.model_type = "mistral";
  try {
    Model::create(other, TaskKind::lm, 1);
    ADD_FAILURE() << "an unknown decoder family was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model_type must be llama or gpt2, got \"mistral\""), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace clattn
