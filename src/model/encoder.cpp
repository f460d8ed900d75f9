// The encoder: BERT family (post-LN, or pre-LN) and the KWT input path, for inference. One
// forward reads as the list of calls of a step, top to bottom; activations are token-major
// (rows = B·T) and attention reads and writes them through strided (B, H, T, D) views, so no
// transpose is ever made.
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "clattn/error.h"
#include "clattn/model.h"
#include "clattn/nn.h"
#include "clattn/parallel.h"
#include "clattn/rng.h"
#include "model/weights.h"

namespace clattn {

struct Encoder::Params {
  struct Layer {
    const float *wq, *wk, *wv, *bq = nullptr, *bk = nullptr, *bv = nullptr;  // (H, H), (H)
    const float *wqkv = nullptr, *bqkv = nullptr;  // (3H, H), (3H): q, k, v stacked for one GEMM
    const float *wo, *bo, *ln1g, *ln1b;                                     // attention output
    const float *w1, *b1, *w2, *b2, *ln2g, *ln2b;                           // feed-forward
  };
  std::vector<Layer> layers;
  // BERT embeddings
  const float *word = nullptr, *pos = nullptr, *type = nullptr, *eln_g = nullptr, *eln_b = nullptr;
  // KWT input path
  const float *patch_w = nullptr, *patch_b = nullptr, *cls = nullptr;
  // heads
  const float *pool_w = nullptr, *pool_b = nullptr, *cls_w = nullptr, *cls_b = nullptr;
  const float *fln_g = nullptr, *fln_b = nullptr;
  std::vector<Tensor> fused;  // the stacked q/k/v weights and biases (a copy, 3·H² floats a layer)
};

Encoder::Encoder() = default;
Encoder::~Encoder() = default;

std::unique_ptr<Encoder> Encoder::load(const std::string& dir, const LoadOptions& opt) {
  ModelConfig cfg = read_model_config((std::filesystem::path(dir) / "config.json").string());
  check(cfg.kind != ModelKind::llama, "model '", dir, "' is a decoder (model_type llama), not an encoder");
  return build(std::move(cfg), Weights::open(dir), opt);
}

std::unique_ptr<Encoder> Encoder::random_bert(const ModelConfig& cfg_in, uint64_t seed) {
  ModelConfig c = cfg_in;
  c.kind = ModelKind::bert;
  c.model_type = "bert";
  check(c.hidden >= 1 && c.layers >= 1 && c.heads >= 1 && c.hidden % c.heads == 0 && c.ffn >= 1 &&
            c.vocab >= 1 && c.max_positions >= 1,
        "random_bert: sizes must be >= 1 with hidden a multiple of heads");
  c.head_dim = c.hidden / c.heads;
  c.kv_heads = c.heads;
  c.type_vocab = 2;
  const int64_t H = c.hidden, F = c.ffn;
  std::map<std::string, Tensor> t;
  const Rng rng(seed);
  uint64_t stream = 0;
  auto normal = [&](const std::string& n, Shape s) {
    Tensor x = Tensor::empty_like_shape(s);
    const uint64_t st = stream++;
    float* d = x.data();
    parallel_for((x.numel() + 4095) / 4096, [&](int64_t blk) {
      for (int64_t i = blk * 4096; i < std::min(x.numel(), (blk + 1) * 4096); ++i) d[i] = 0.02f * rng.normal(st, static_cast<uint64_t>(i));
    });
    t.emplace(n, std::move(x));
  };
  auto constant = [&](const std::string& n, int64_t len, float v) {
    Tensor x(Shape{len});
    x.fill(v);
    t.emplace(n, std::move(x));
  };
  normal("embeddings.word_embeddings.weight", Shape{c.vocab, H});
  normal("embeddings.position_embeddings.weight", Shape{c.max_positions, H});
  normal("embeddings.token_type_embeddings.weight", Shape{2, H});
  constant("embeddings.LayerNorm.weight", H, 1.f);
  constant("embeddings.LayerNorm.bias", H, 0.f);
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string L = "encoder.layer." + std::to_string(l) + ".";
    for (const char* n : {"query", "key", "value"}) {
      normal(L + "attention.self." + n + ".weight", Shape{H, H});
      constant(L + "attention.self." + n + ".bias", H, 0.f);
    }
    normal(L + "attention.output.dense.weight", Shape{H, H});
    constant(L + "attention.output.dense.bias", H, 0.f);
    constant(L + "attention.output.LayerNorm.weight", H, 1.f);
    constant(L + "attention.output.LayerNorm.bias", H, 0.f);
    normal(L + "intermediate.dense.weight", Shape{F, H});
    constant(L + "intermediate.dense.bias", F, 0.f);
    normal(L + "output.dense.weight", Shape{H, F});
    constant(L + "output.dense.bias", H, 0.f);
    constant(L + "output.LayerNorm.weight", H, 1.f);
    constant(L + "output.LayerNorm.bias", H, 0.f);
  }
  return build(std::move(c), Weights::from_tensors(std::move(t), "random-bert"), {});
}

std::unique_ptr<Encoder> Encoder::build(ModelConfig cfg, std::unique_ptr<Weights> wts, const LoadOptions& opt) {
  std::unique_ptr<Encoder> e(new Encoder());
  e->cfg_ = std::move(cfg);
  const ModelConfig& c = e->cfg_;
  const std::string& dir = wts->dir();
  e->w_ = std::move(wts);
  Weights& w = *e->w_;
  e->p_ = std::make_unique<Params>();
  Params& p = *e->p_;
  const int64_t H = c.hidden, F = c.ffn;
  const std::string pre = w.has("bert.embeddings.word_embeddings.weight") || w.has("bert.encoder.layer.0.attention.self.query.weight") ? "bert." : "";
  if (c.kind == ModelKind::kwt) {
    p.patch_w = w.get("embeddings.patch_projection.weight", {H, c.input_dim});
    p.patch_b = w.get("embeddings.patch_projection.bias", {H});
    p.cls = w.get("embeddings.cls_token", {H});
    p.pos = w.get("embeddings.position_embeddings", {c.max_positions, H});
  } else {
    p.word = w.get(pre + "embeddings.word_embeddings.weight", {c.vocab, H});
    p.pos = w.get(pre + "embeddings.position_embeddings.weight", {c.max_positions, H});
    if (c.type_vocab > 0) p.type = w.get(pre + "embeddings.token_type_embeddings.weight", {c.type_vocab, H});
    p.eln_g = w.get(pre + "embeddings.LayerNorm.weight", {H});
    p.eln_b = w.get(pre + "embeddings.LayerNorm.bias", {H});
  }
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string L = pre + "encoder.layer." + std::to_string(l) + ".";
    Params::Layer y;
    y.wq = w.get(L + "attention.self.query.weight", {H, H});
    y.wk = w.get(L + "attention.self.key.weight", {H, H});
    y.wv = w.get(L + "attention.self.value.weight", {H, H});
    if (c.qkv_bias) {
      y.bq = w.get(L + "attention.self.query.bias", {H});
      y.bk = w.get(L + "attention.self.key.bias", {H});
      y.bv = w.get(L + "attention.self.value.bias", {H});
    }
    // One (rows, 3H) GEMM instead of three (rows, H) ones: at KWT's H = 64 a narrow product runs at
    // half the sgemm rate.
    Tensor wqkv(Shape{3 * H, H}), bqkv(Shape{3 * H});
    const float* parts[3] = {y.wq, y.wk, y.wv};
    const float* bparts[3] = {y.bq, y.bk, y.bv};
    for (int i = 0; i < 3; ++i) {
      std::copy(parts[i], parts[i] + H * H, wqkv.data() + i * H * H);
      if (bparts[i]) std::copy(bparts[i], bparts[i] + H, bqkv.data() + i * H);
    }
    y.wqkv = wqkv.data();
    y.bqkv = bqkv.data();
    p.fused.push_back(std::move(wqkv));
    p.fused.push_back(std::move(bqkv));
    y.wo = w.get(L + "attention.output.dense.weight", {H, H});
    y.bo = w.get(L + "attention.output.dense.bias", {H});
    y.ln1g = w.get(L + "attention.output.LayerNorm.weight", {H});
    y.ln1b = w.get(L + "attention.output.LayerNorm.bias", {H});
    y.w1 = w.get(L + "intermediate.dense.weight", {F, H});
    y.b1 = w.get(L + "intermediate.dense.bias", {F});
    y.w2 = w.get(L + "output.dense.weight", {H, F});
    y.b2 = w.get(L + "output.dense.bias", {H});
    y.ln2g = w.get(L + "output.LayerNorm.weight", {H});
    y.ln2b = w.get(L + "output.LayerNorm.bias", {H});
    p.layers.push_back(y);
  }
  if (c.final_layer_norm) {
    p.fln_g = w.get(pre + "encoder.final_layer_norm.weight", {H});
    p.fln_b = w.get(pre + "encoder.final_layer_norm.bias", {H});
  }
  if (c.kind == ModelKind::bert && w.has(pre + "pooler.dense.weight")) {
    p.pool_w = w.get(pre + "pooler.dense.weight", {H, H});
    p.pool_b = w.get(pre + "pooler.dense.bias", {H});
  }
  if (w.has("classifier.weight")) {
    check(c.num_labels >= 1, "model '", dir, "': the checkpoint has a classifier but the config no num_labels");
    p.cls_w = w.get("classifier.weight", {c.num_labels, H});
    p.cls_b = w.get("classifier.bias", {c.num_labels});
  } else {
    check(c.kind != ModelKind::kwt, "model '", dir, "': tensor 'classifier.weight' is missing");
  }
  if (opt.verbose)
    for (const std::string& n : w.unused()) std::fprintf(stderr, "model '%s': ignoring unused tensor '%s'\n", dir.c_str(), n.c_str());
  e->set_attention("full");
  return e;
}

void Encoder::set_attention(const std::string& plan) {
  std::vector<std::string> specs = parse_attention_plan(plan, cfg_.layers);
  std::vector<std::unique_ptr<Attention>> att = make_plan_attentions(specs, false, false);
  specs_ = std::move(specs);
  att_ = std::move(att);
  states_.clear();
  states_.resize(att_.size());
  ctx_.clear();
  for (size_t l = 0; l < att_.size(); ++l) ctx_.emplace_back(Mode::inference, &scratch_);
}

double Encoder::forward_bytes(int64_t B, int64_t T) const {
  const ModelConfig& c = cfg_;
  const double rows = static_cast<double>(B) * static_cast<double>(T);
  double ws = 0;
  const AttentionDims d{B, c.heads, c.heads, T, T, c.head_dim, c.head_dim};
  for (const auto& a : att_) ws = std::max(ws, static_cast<double>(a->workspace_bytes(d, Mode::inference, max_threads())));
  return 4.0 * rows * (7.0 * c.hidden + std::max(c.ffn, c.hidden)) + ws;
}

void Encoder::ensure(int64_t B, int64_t T) {
  if (B == B_ && T == T_) return;
  const int64_t rows = B * T, H = cfg_.hidden;
  x_.resize(Shape{rows, H});
  xn_.resize(Shape{rows, H});
  qkv_.resize(Shape{rows, 3 * H});
  ao_.resize(Shape{rows, H});
  t_.resize(Shape{rows, H});
  h_.resize(Shape{rows, std::max(cfg_.ffn, H)});
  B_ = B;
  T_ = T;
}

// x (rows, H) holds the embeddings; runs every layer in place.
void Encoder::run_layers(int64_t B, int64_t T, std::span<const int32_t> lengths) {
  const ModelConfig& c = cfg_;
  const int64_t rows = B * T, H = c.hidden, F = c.ffn, nh = c.heads, hd = c.head_dim;
  float* x = x_.data();       // (rows, H) the residual stream
  float* xn = xn_.data();     // (rows, H) pre-LN: the normalised input of a block
  float* qkv = qkv_.data();   // (rows, 3H) q | k | v, token-major
  float* ao = ao_.data();     // (rows, H) attention output, token-major
  float* t = t_.data();       // (rows, H) a block's output before the residual
  float* h = h_.data();       // (rows, F) feed-forward hidden
  // Query scaling beyond the attention's own 1/sqrt(hd) (configs with attention_scale).
  const float qmul = c.attention_scale > 0 ? c.attention_scale * std::sqrt(static_cast<float>(hd)) : 1.f;
  auto heads_view = [&](float* base, int64_t ld) {  // (B, nh, T, hd) over token-major rows
    View v{base, Shape{B, nh, T, hd}, {}};
    v.strides = {T * ld, hd, ld, 1};
    return v;
  };
  attn_ms_ = 0;
  for (size_t l = 0; l < p_->layers.size(); ++l) {
    const Params::Layer& y = p_->layers[l];
    const float* in = x;
    if (c.pre_ln) {
      nn::layernorm_fwd(xn, x, y.ln1g, y.ln1b, rows, H, c.eps);
      in = xn;
    }
    nn::linear_fwd(qkv, 3 * H, in, H, y.wqkv, y.bqkv, rows, H, 3 * H);
    if (qmul != 1.f)
      parallel_for(rows, [&](int64_t r) { for (int64_t e = 0; e < H; ++e) qkv[r * 3 * H + e] *= qmul; });
    AttentionInputs ai;
    ai.q = heads_view(qkv, 3 * H);
    ai.k = heads_view(qkv + H, 3 * H);
    ai.v = heads_view(qkv + 2 * H, 3 * H);
    ai.query_lengths = lengths;
    ai.key_lengths = lengths;
    ai.step = step_;
    if (capture_ && capture_->layer == static_cast<int64_t>(l)) {  // inspection only: copies
      capture_->q = Tensor::from(ai.q);
      capture_->k = Tensor::from(ai.k);
      capture_->v = Tensor::from(ai.v);
      capture_->step = ai.step;
      capture_->causal = ai.causal;
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (att_[l]->capabilities().stateful) ai.state = &states_[l];
    att_[l]->forward(ai, heads_view(ao, H), ctx_[l]);
    attn_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    nn::linear_fwd(t, H, ao, H, y.wo, y.bo, rows, H, H);
    nn::add_inplace(x, t, rows * H);
    if (c.pre_ln) {
      nn::layernorm_fwd(xn, x, y.ln2g, y.ln2b, rows, H, c.eps);
      in = xn;
    } else {
      nn::layernorm_fwd(x, x, y.ln1g, y.ln1b, rows, H, c.eps);
      in = x;
    }
    nn::linear_fwd(h, F, in, H, y.w1, y.b1, rows, H, F);
    nn::gelu_fwd(h, h, rows * F, c.gelu_tanh ? nn::Gelu::tanh : nn::Gelu::erf);
    nn::linear_fwd(t, H, h, F, y.w2, y.b2, rows, F, H);
    nn::add_inplace(x, t, rows * H);
    if (!c.pre_ln) nn::layernorm_fwd(x, x, y.ln2g, y.ln2b, rows, H, c.eps);
  }
  if (p_->fln_g) nn::layernorm_fwd(x, x, p_->fln_g, p_->fln_b, rows, H, c.eps);
}

// The classifier on the class token (row 0 of each sequence), through BERT's pooler when the
// checkpoint has one; without a classifier, the last hidden state (B, T, H).
Tensor Encoder::classify(int64_t B, int64_t T, std::span<const int32_t> lengths) {
  const int64_t H = cfg_.hidden;
  if (!p_->cls_w) {
    Tensor out(Shape{B, T, H});
    std::memcpy(out.data(), x_.data(), sizeof(float) * static_cast<size_t>(B * T * H));
    return out;
  }
  float* pooled = t_.data();  // (B, H)
  if (cfg_.mean_pooling) {
    // The mean over each sequence's valid tokens (padding excluded), as clattn's trainer pools.
    for (int64_t b = 0; b < B; ++b) {
      const int64_t len = lengths.empty() ? T : lengths[static_cast<size_t>(b)];
      float* o = pooled + b * H;
      std::fill(o, o + H, 0.f);
      for (int64_t t = 0; t < len; ++t)
        for (int64_t e = 0; e < H; ++e) o[e] += x_.data()[(b * T + t) * H + e];
      for (int64_t e = 0; e < H; ++e) o[e] /= static_cast<float>(len);
    }
  } else if (p_->pool_w) {
    nn::linear_fwd(pooled, H, x_.data(), T * H, p_->pool_w, p_->pool_b, B, H, H);
    for (int64_t i = 0; i < B * H; ++i) pooled[i] = std::tanh(pooled[i]);
  } else {
    for (int64_t b = 0; b < B; ++b)
      std::memcpy(pooled + b * H, x_.data() + b * T * H, sizeof(float) * static_cast<size_t>(H));
  }
  Tensor logits(Shape{B, cfg_.num_labels});
  nn::linear_fwd(logits.data(), cfg_.num_labels, pooled, H, p_->cls_w, p_->cls_b, B, H, cfg_.num_labels);
  return logits;
}

Tensor Encoder::forward_tokens(std::span<const int32_t> ids, int64_t B, int64_t T,
                               std::span<const int32_t> lengths, std::span<const int32_t> types) {
  const ModelConfig& c = cfg_;
  check(c.kind == ModelKind::bert, "encoder: forward_tokens needs a token model (bert); this is ", c.model_type,
        " (use forward_features)");
  check(B >= 1 && T >= 1 && static_cast<int64_t>(ids.size()) == B * T, "encoder: ids must hold B x T = ",
        B, " x ", T, " tokens, got ", ids.size());
  check(T <= c.max_positions, "encoder: T = ", T, " exceeds max_position_embeddings ", c.max_positions);
  check(types.empty() || static_cast<int64_t>(types.size()) == B * T, "encoder: token types must be B x T");
  check(lengths.empty() || static_cast<int64_t>(lengths.size()) == B, "encoder: lengths must have B = ", B, " entries");
  for (int32_t len : lengths) check(len >= 1 && len <= T, "encoder: every length must be in [1, T = ", T, "], got ", len);
  ensure(B, T);
  const int64_t H = c.hidden, rows = B * T;
  nn::embedding_fwd(x_.data(), ids.data(), p_->word, rows, H, c.vocab);
  std::vector<int32_t> type0;
  if (types.empty()) type0.assign(static_cast<size_t>(rows), 0);
  const std::span<const int32_t> tt = types.empty() ? std::span<const int32_t>(type0) : types;
  for (int32_t v : tt) check(v >= 0 && v < std::max<int64_t>(c.type_vocab, 1), "encoder: token type ", v, " out of range");
  float* x = x_.data();
  parallel_for(rows, [&](int64_t r) {
    const float* pe = p_->pos + (r % T) * H;
    const float* te = p_->type ? p_->type + tt[static_cast<size_t>(r)] * H : nullptr;
    for (int64_t e = 0; e < H; ++e) x[r * H + e] += pe[e] + (te ? te[e] : 0.f);
  });
  nn::layernorm_fwd(x, x, p_->eln_g, p_->eln_b, rows, H, c.eps);
  run_layers(B, T, lengths);
  return classify(B, T, lengths);
}

Tensor Encoder::forward_features(ConstView features) {
  const ModelConfig& c = cfg_;
  check(c.kind == ModelKind::kwt, "encoder: forward_features needs a KWT model; this is ", c.model_type);
  check(features.rank() == 3 && features.dim(1) == c.num_patches && features.dim(2) == c.input_dim,
        "encoder: features must be (B, ", c.num_patches, ", ", c.input_dim, "), got ", features.shape);
  check(features.contiguous(), "encoder: features must be contiguous");
  const int64_t B = features.dim(0), T = c.num_patches + 1, H = c.hidden, P = c.num_patches;
  check(B >= 1, "encoder: features hold no example");
  for (int64_t i = 0; i < features.numel(); ++i)
    check(std::isfinite(features.data[i]), "encoder: features must be finite, found ", features.data[i], " at flat index ", i);
  ensure(B, T);
  // Patches through the projection in one GEMM, then each sequence is [cls; patches] + positions.
  float* proj = h_.data();  // (B·P, H)
  nn::linear_fwd(proj, H, features.data, c.input_dim, p_->patch_w, p_->patch_b, B * P, c.input_dim, H);
  float* x = x_.data();
  parallel_for(B * T, [&](int64_t r) {
    const int64_t b = r / T, i = r % T;
    const float* src = i == 0 ? p_->cls : proj + (b * P + i - 1) * H;
    const float* pe = p_->pos + i * H;
    for (int64_t e = 0; e < H; ++e) x[r * H + e] = src[e] + pe[e];
  });
  run_layers(B, T, {});
  return classify(B, T, {});
}

}  // namespace clattn
