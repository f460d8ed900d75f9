// Models with 16-bit linear weights (LoadOptions::weights f16 / bf16): the same logits as the f32
// model whose weights were rounded beforehand (decoders and encoders), a 16-bit checkpoint taken
// bit for bit, the refusals (training, saving, f16 overflow), stories260k's greedy continuation
// and KWT-1's labels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "clattn/error.h"
#include "clattn/model.h"
#include "clattn/safetensors.h"
#include "common/data.h"
#include "core/half.h"

namespace clattn {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("clattn_w16_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p.string();
}

// Untied output layer (held in 16 bits too), sizes that are not multiples of the vector width.
ModelConfig small_llama() {
  ModelConfig c;
  c.kind = ModelKind::llama;
  c.model_type = "llama";
  c.hidden = 40;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 10;
  c.ffn = 100;
  c.vocab = 77;
  c.max_positions = 64;
  return c;
}

ModelConfig small_gpt2() {  // Conv1D matrices stored (in, out): held transposed
  ModelConfig c = small_llama();
  c.model_type = "gpt2";
  c.kv_heads = 4;
  c.tie_embeddings = true;
  c.gelu_tanh = true;
  return c;
}

bool ends_with(const std::string& name, const char* s) {
  return name.size() >= std::strlen(s) && name.compare(name.size() - std::strlen(s), std::string::npos, s) == 0;
}

// The tensors a model holds in 16 bits: decoders' linear layers and an untied output layer,
// encoders' layer matrices (not the pooler, classifier or embeddings).
bool is_linear(const std::string& name) {
  for (const char* s : {"_proj.weight", "lm_head.weight", "c_attn.weight", "c_fc.weight"})
    if (ends_with(name, s)) return true;
  return name.find("encoder.layer.") != std::string::npos && ends_with(name, ".weight") &&
         name.find("LayerNorm") == std::string::npos;
}

ModelConfig small_bert() {
  ModelConfig c;
  c.kind = ModelKind::bert;
  c.model_type = "bert";
  c.hidden = 40;
  c.layers = 2;
  c.heads = 4;
  c.ffn = 100;
  c.vocab = 77;
  c.max_positions = 64;
  c.type_vocab = 2;
  c.num_labels = 3;
  return c;
}

// dst: src's checkpoint with its linear weights stored as F16 or BF16 (rounded), the rest F32.
void write_16bit_checkpoint(const std::string& src, const std::string& dst, WeightType t) {
  fs::create_directories(dst);
  fs::copy_file(fs::path(src) / "config.json", fs::path(dst) / "config.json", fs::copy_options::overwrite_existing);
  const SafetensorsFile f = SafetensorsFile::open((fs::path(src) / "model.safetensors").string());
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const std::string& name : f.names()) {
    const Tensor x = f.get_f32(name);
    const bool narrow = is_linear(name);
    const size_t begin = data.size();
    for (int64_t i = 0; i < x.numel(); ++i) {
      if (narrow) {
        const uint16_t h = t == WeightType::f16 ? half::f32_to_f16(x.data()[i]) : half::f32_to_bf16(x.data()[i]);
        data.append(reinterpret_cast<const char*>(&h), 2);
      } else {
        data.append(reinterpret_cast<const char*>(x.data() + i), 4);
      }
    }
    header[name] = {{"dtype", narrow ? (t == WeightType::f16 ? "F16" : "BF16") : "F32"},
                    {"shape", f.info(name).shape},
                    {"data_offsets", {begin, data.size()}}};
  }
  const std::string h = header.dump();
  const uint64_t n = h.size();
  std::ofstream out(fs::path(dst) / "model.safetensors", std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << h << data;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, static_cast<double>(std::fabs(a[i] - b[i])));
  return d;
}

// Logits of a forward over `ids`, then of a prefill of 5 and steps through the rest.
struct Logits {
  std::vector<float> forward, decode;
};
Logits run(Decoder& d, const std::vector<int32_t>& ids) {
  Logits r;
  const Tensor f = d.forward(ids, 1, static_cast<int64_t>(ids.size()));
  r.forward.assign(f.data(), f.data() + f.numel());
  d.start(static_cast<int64_t>(ids.size()));
  r.decode = d.prefill(std::span<const int32_t>(ids.data(), 5));
  for (size_t t = 5; t < ids.size(); ++t) {
    const std::vector<float> l = d.step(ids[t]);
    r.decode.insert(r.decode.end(), l.begin(), l.end());
  }
  return r;
}

// A model with 16-bit weights against the f32 model of the same rounded weights. A 16-bit
// checkpoint read bit for bit and an f32 one rounded on load give the same bits. Against f32 of
// the rounded values: decode steps (rows_dot16 against rows_dot over the widened weights: the same
// vector sums, the k % lanes tail fused), the 5-token prefill (rows_dot16 against sgemm) and the
// 24-row forward (blocks of widened rows through the same sgemm) within 1e-6 of the logits' scale;
// measured: forward 0, decode and prefill up to 1.2e-7.
TEST(Weights16, EqualsF32ModelOfRoundedWeights) {
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < 24; ++i) ids.push_back((i * 37 + 5) % 77);
  for (const ModelConfig& cfg : {small_llama(), small_gpt2()})
    for (const WeightType t : {WeightType::f16, WeightType::bf16}) {
      SCOPED_TRACE(cfg.model_type + " " + weight_type_name(t));
      const std::string src = temp_dir("src"), dst = temp_dir("dst");
      Model::create(cfg, TaskKind::lm, 3)->save(src);
      write_16bit_checkpoint(src, dst, t);
      LoadOptions o16;
      o16.weights = t;
      auto half = Decoder::load(dst, o16);       // the checkpoint's bits
      auto narrowed = Decoder::load(src, o16);   // f32 rounded on load
      auto rounded = Decoder::load(dst);         // f32 of the rounded values
      EXPECT_EQ(half->weights(), t);
      EXPECT_EQ(rounded->weights(), WeightType::f32);
      const Logits a = run(*half, ids), b = run(*narrowed, ids), c = run(*rounded, ids);
      EXPECT_EQ(a.forward, b.forward);
      EXPECT_EQ(a.decode, b.decode);
      double scale = 0;
      for (float v : c.forward) scale = std::max(scale, static_cast<double>(std::fabs(v)));
      EXPECT_LE(max_diff(a.forward, c.forward), 1e-6 * scale);
      EXPECT_LE(max_diff(a.decode, c.decode), 1e-6 * scale);
      std::printf("%s %s: max |16-bit - f32 of rounded| forward %.3g decode %.3g (logits up to %.3g)\n",
                  cfg.model_type.c_str(), weight_type_name(t), max_diff(a.forward, c.forward), max_diff(a.decode, c.decode), scale);
      // The byte model of a step: 2 bytes instead of 4 for every linear weight.
      const double linear = static_cast<double>(cfg.layers) *
                                (static_cast<double>((cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim * cfg.hidden) +
                                 static_cast<double>(cfg.heads * cfg.head_dim * cfg.hidden) +
                                 static_cast<double>((cfg.model_type == "gpt2" ? 2 : 3) * cfg.ffn * cfg.hidden)) +
                            (cfg.tie_embeddings ? 0.0 : static_cast<double>(cfg.vocab * cfg.hidden));
      EXPECT_DOUBLE_EQ(rounded->step_bytes(10) - half->step_bytes(10), 2.0 * linear);
      fs::remove_all(src);
      fs::remove_all(dst);
    }
}

// An encoder's layer matrices in 16 bits: the same bits from a 16-bit checkpoint and from rounding
// on load, and within 1e-6 of the logits' scale of f32 over the rounded weights (every product
// has 24 rows: the widened blocks and sgemm).
TEST(Weights16, EncoderEqualsF32OfRoundedWeights) {
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < 24; ++i) ids.push_back((i * 37 + 5) % 77);
  for (const WeightType t : {WeightType::f16, WeightType::bf16}) {
    SCOPED_TRACE(weight_type_name(t));
    const std::string src = temp_dir("bsrc"), dst = temp_dir("bdst");
    Model::create(small_bert(), TaskKind::classify, 5)->save(src);
    write_16bit_checkpoint(src, dst, t);
    LoadOptions o16;
    o16.weights = t;
    auto half = Encoder::load(dst, o16), narrowed = Encoder::load(src, o16), rounded = Encoder::load(dst);
    const Tensor a = half->forward_tokens(ids, 2, 12), b = narrowed->forward_tokens(ids, 2, 12),
                 c = rounded->forward_tokens(ids, 2, 12);
    ASSERT_EQ(a.numel(), c.numel());
    double d = 0, scale = 0;
    for (int64_t i = 0; i < a.numel(); ++i) {
      EXPECT_EQ(a.data()[i], b.data()[i]);
      d = std::max(d, static_cast<double>(std::fabs(a.data()[i] - c.data()[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(c.data()[i])));
    }
    EXPECT_LE(d, 1e-6 * scale);
    Batch bt;
    bt.B = 1;
    bt.T = 4;
    bt.ids = {1, 2, 3, 4};
    bt.targets = {1};
    bt.lengths = {4};
    EXPECT_THROW(half->forward_backward(bt, true, 0), Error);
    fs::remove_all(src);
    fs::remove_all(dst);
  }
}

TEST(Weights16, RefusesTrainingSavingAndF16Overflow) {
  const std::string src = temp_dir("refuse");
  auto m = Model::create(small_llama(), TaskKind::lm, 4);
  m->save(src);
  LoadOptions o16;
  o16.weights = WeightType::f16;
  auto d = Decoder::load(src, o16);
  Batch b;
  b.B = 1;
  b.T = 4;
  b.ids = {1, 2, 3, 4};
  b.targets = {2, 3, 4, 5};
  b.lengths = {4};
  EXPECT_NO_THROW(d->forward_backward(b, false, 0));  // evaluation reads the 16-bit weights
  auto refused = [](auto&& f, const char* what) {
    try {
      f();
      ADD_FAILURE() << what << " was not refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("needs f32 weights"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("f16"), std::string::npos) << e.what();
    }
  };
  refused([&] { d->forward_backward(b, true, 0); }, "training");
  refused([&] { d->save(temp_dir("refuse_save")); }, "save");
  refused([&] { (void)d->params(); }, "params()");
  // An f32 weight past f16's range: refused for f16 naming the tensor, taken by bf16.
  const std::string big = temp_dir("big");
  m->params()[static_cast<size_t>(m->param("model.layers.1.mlp.up_proj.weight").offset + 7)] = 70000.f;
  m->save(big);
  try {
    (void)Decoder::load(big, o16);
    ADD_FAILURE() << "an f16 overflow was not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.1.mlp.up_proj.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("65504"), std::string::npos) << e.what();
  }
  LoadOptions obf;
  obf.weights = WeightType::bf16;
  EXPECT_NO_THROW((void)Decoder::load(big, obf));
  // An F16 checkpoint holding inf bits (1e38 rounded): refused like a non-finite f32 weight.
  const std::string inf16 = temp_dir("inf16");
  m->params()[static_cast<size_t>(m->param("model.layers.0.self_attn.q_proj.weight").offset + 5)] = 1e38f;
  m->save(big);
  write_16bit_checkpoint(big, inf16, WeightType::f16);
  try {
    (void)Decoder::load(inf16, o16);
    ADD_FAILURE() << "inf bits were not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'model.layers.0.self_attn.q_proj.weight' holds inf at index (0, 5)"),
              std::string::npos) << e.what();
  }
  fs::remove_all(inf16);
  EXPECT_THROW((void)parse_weight_type("fp16"), Error);
  EXPECT_EQ(parse_weight_type("BF16"), WeightType::bf16);
  fs::remove_all(src);
  fs::remove_all(big);
}

// stories260k with f16 and bf16 weights: the greedy 200 tokens of f32 (measured: identical), and
// logits along f32's tokens within about 3x the measured largest difference (f16 0.0107, bf16
// 0.106, on AVX-512 and AVX2 alike).
TEST(Stories260k, SixteenBitWeightsKeepGreedyTokens) {
  CLATTN_NEED_DATA("stories260k");
  const std::string dir = testing::data_dir().string() + "/stories260k";
  auto f32 = Decoder::load(dir);
  const std::vector<int32_t> prompt{1};
  const std::vector<int32_t> want = generate(*f32, prompt, 200, SamplingOptions{}, -1);
  ASSERT_EQ(want.size(), 200u);
  for (const WeightType t : {WeightType::f16, WeightType::bf16}) {
    SCOPED_TRACE(weight_type_name(t));
    LoadOptions o;
    o.weights = t;
    auto d = Decoder::load(dir, o);
    EXPECT_EQ(generate(*d, prompt, 200, SamplingOptions{}, -1), want);
    // Along f32's tokens: the largest logit difference of any step.
    f32->start(201);
    d->start(201);
    double worst = max_diff(f32->prefill(prompt), d->prefill(prompt));
    for (size_t i = 0; i + 1 < want.size(); ++i) worst = std::max(worst, max_diff(f32->step(want[i]), d->step(want[i])));
    std::printf("stories260k %s weights: max |logit - f32 logit| over 200 steps %.3g\n", weight_type_name(t), worst);
    EXPECT_LT(worst, t == WeightType::f16 ? 0.03 : 0.3);
  }
}

// KWT-1 (an encoder of feature frames) with f16 and bf16 layer weights: the same predicted labels
// as f32 on its 4 clips, logits within about 4x the measured largest difference (f16 0.00133, bf16
// 0.00677).
TEST(Kwt1, SixteenBitWeightsKeepPredictions) {
  CLATTN_NEED_DATA("kwt1");
  const std::string dir = testing::data_dir().string() + "/kwt1";
  const SafetensorsFile f = SafetensorsFile::open(dir + "/features_speech_commands.safetensors");
  const Tensor x = f.get_f32("features");
  const Tensor want = Encoder::load(dir)->forward_features(x.view());
  const int64_t C = want.dim(1);
  for (const WeightType t : {WeightType::f16, WeightType::bf16}) {
    SCOPED_TRACE(weight_type_name(t));
    LoadOptions o;
    o.weights = t;
    const Tensor got = Encoder::load(dir, o)->forward_features(x.view());
    double worst = 0;
    int64_t same = 0;
    for (int64_t r = 0; r < want.dim(0); ++r) {
      const float* a = want.data() + r * C;
      const float* b = got.data() + r * C;
      same += std::max_element(a, a + C) - a == std::max_element(b, b + C) - b;
      for (int64_t j = 0; j < C; ++j) worst = std::max(worst, static_cast<double>(std::fabs(a[j] - b[j])));
    }
    std::printf("kwt1 %s weights: %lld of %lld labels as f32, max |logit - f32 logit| %.3g\n", weight_type_name(t),
                static_cast<long long>(same), static_cast<long long>(want.dim(0)), worst);
    EXPECT_EQ(same, want.dim(0));
    EXPECT_LT(worst, t == WeightType::f16 ? 0.005 : 0.03);
  }
}

}  // namespace
}  // namespace clattn
