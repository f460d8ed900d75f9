// AttentionCapture (model.h), the hook `clattn inspect` reads a layer's q, k, v through: checked
// against the real models' first layer recomputed here in double from the checkpoint's tensors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "clattn/model.h"
#include "clattn/safetensors.h"
#include "common/data.h"
#include "common/test_util.h"

namespace clattn {
namespace {

using testing::data_dir;

TEST(AttentionCapture, KwtLayer0QueriesAreTheProjectedInputs) {
  CLATTN_NEED_DATA("kwt1");
  const std::string dir = (data_dir() / "kwt1").string();
  auto enc = Encoder::load(dir);
  const ModelConfig& c = enc->config();
  const SafetensorsFile w = SafetensorsFile::open(dir + "/model.safetensors");
  const SafetensorsFile fs = SafetensorsFile::open(dir + "/features_speech_commands.safetensors");
  const Tensor all = fs.get_f32("features");  // (n, 98, 40)
  const int64_t P = c.num_patches, I = c.input_dim, Hd = c.hidden, T = P + 1;
  Tensor one(Shape{1, P, I});
  std::copy(all.data() + P * I, all.data() + 2 * P * I, one.data());  // example 1
  const Tensor plain = enc->forward_features(one.view());

  AttentionCapture cap;
  cap.layer = 0;
  enc->set_capture(&cap);
  const Tensor logits = enc->forward_features(one.view());
  EXPECT_TRUE(testing::bitwise_equal(plain, logits)) << "capturing changed the model's output";
  ASSERT_TRUE(cap.q.defined());
  EXPECT_EQ(cap.q.shape(), (Shape{1, c.heads, T, c.head_dim}));
  EXPECT_EQ(cap.k.shape(), (Shape{1, c.heads, T, c.head_dim}));
  EXPECT_EQ(cap.v.shape(), (Shape{1, c.heads, T, c.head_dim}));
  EXPECT_FALSE(cap.causal);

  // x0 = [cls; patches · Wpᵀ + bp] + pos; q = x0 · Wqᵀ (no bias in KWT-1), k = x0 · Wkᵀ.
  const Tensor wp = w.get_f32("embeddings.patch_projection.weight"), bp = w.get_f32("embeddings.patch_projection.bias");
  const Tensor cls = w.get_f32("embeddings.cls_token"), pos = w.get_f32("embeddings.position_embeddings");
  const Tensor wq = w.get_f32("encoder.layer.0.attention.self.query.weight");
  const Tensor wk = w.get_f32("encoder.layer.0.attention.self.key.weight");
  double worst = 0, scale = 0;
  for (int64_t t : {int64_t{0}, int64_t{1}, int64_t{50}, T - 1}) {
    std::vector<double> x(static_cast<size_t>(Hd));
    for (int64_t e = 0; e < Hd; ++e) {
      double v = cls.data()[e];
      if (t > 0) {
        v = bp.data()[e];
        for (int64_t i = 0; i < I; ++i) v += static_cast<double>(wp.data()[e * I + i]) * one.data()[(t - 1) * I + i];
      }
      x[static_cast<size_t>(e)] = v + pos.data()[t * Hd + e];
    }
    for (int64_t o = 0; o < Hd; ++o) {
      double q = 0, k = 0;
      for (int64_t e = 0; e < Hd; ++e) {
        q += static_cast<double>(wq.data()[o * Hd + e]) * x[static_cast<size_t>(e)];
        k += static_cast<double>(wk.data()[o * Hd + e]) * x[static_cast<size_t>(e)];
      }
      const int64_t h = o / c.head_dim, d = o % c.head_dim;
      worst = std::max({worst, std::abs(q - *cap.q.view().ptr(0, h, t, d)), std::abs(k - *cap.k.view().ptr(0, h, t, d))});
      scale = std::max({scale, std::abs(q), std::abs(k)});
    }
  }
  EXPECT_LE(worst, 1e-4 * scale);

  // A layer past the last one copies nothing; nullptr stops capturing.
  AttentionCapture none;
  none.layer = c.layers;
  enc->set_capture(&none);
  (void)enc->forward_features(one.view());
  EXPECT_FALSE(none.q.defined());
  enc->set_capture(nullptr);
  (void)enc->forward_features(one.view());
}

TEST(AttentionCapture, Stories260kQueriesAtPositionZeroSkipRope) {
  CLATTN_NEED_DATA("stories260k");
  const std::string dir = (data_dir() / "stories260k").string();
  auto dec = Decoder::load(dir);
  const ModelConfig& c = dec->config();
  const SafetensorsFile ref = SafetensorsFile::open(dir + "/reference_logits.safetensors");
  std::vector<int32_t> tokens = ref.get_i32("tokens");
  tokens.resize(40);
  AttentionCapture cap;
  cap.layer = 0;
  dec->set_capture(&cap);
  (void)dec->forward(tokens, 1, 40);
  ASSERT_TRUE(cap.q.defined());
  EXPECT_EQ(cap.q.shape(), (Shape{1, c.heads, 40, c.head_dim}));
  EXPECT_EQ(cap.k.shape(), (Shape{1, c.kv_heads, 40, c.head_dim}));
  EXPECT_TRUE(cap.causal);
  // Position 0: RoPE is the identity, so q = rmsnorm(embed[t0]) · Wqᵀ.
  const SafetensorsFile w = SafetensorsFile::open(dir + "/model.safetensors");
  const Tensor emb = w.get_f32("model.embed_tokens.weight"), g = w.get_f32("model.layers.0.input_layernorm.weight");
  const Tensor wq = w.get_f32("model.layers.0.self_attn.q_proj.weight");
  const int64_t Hd = c.hidden, Q = c.heads * c.head_dim;
  const float* e0 = emb.data() + tokens[0] * Hd;
  double ms = 0;
  for (int64_t e = 0; e < Hd; ++e) ms += static_cast<double>(e0[e]) * e0[e];
  const double r = 1.0 / std::sqrt(ms / static_cast<double>(Hd) + c.eps);
  double worst = 0, scale = 0;
  for (int64_t o = 0; o < Q; ++o) {
    double q = 0;
    for (int64_t e = 0; e < Hd; ++e) q += static_cast<double>(wq.data()[o * Hd + e]) * e0[e] * r * g.data()[e];
    worst = std::max(worst, std::abs(q - *cap.q.view().ptr(0, o / c.head_dim, 0, o % c.head_dim)));
    scale = std::max(scale, std::abs(q));
  }
  EXPECT_LE(worst, 1e-4 * scale);
}

}  // namespace
}  // namespace clattn
