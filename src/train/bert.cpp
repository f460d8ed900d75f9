// The trainable pre-LN encoder (kind bert): embeddings (token + learned position, LayerNorm), L
// layers of [LN -> MHA -> residual, LN -> GELU FFN -> residual], a final LayerNorm, and a head:
// classify (mean over valid tokens -> linear) or mlm (output layer tied to the word embeddings,
// plus a bias). The same function as Encoder::forward_tokens on the saved folder (no token types:
// type_vocab_size 0). Forward saves every activation its backward needs in one arena per (B, T);
// activations are token-major (rows = B·T) and attention reads them through strided head views.
#include <algorithm>
#include <cstring>

#include "clattn/error.h"
#include "clattn/nn.h"
#include "clattn/parallel.h"
#include "train/train_impl.h"

namespace clattn::train {
namespace {

class Bert final : public ModelBase {
 public:
  Bert(const ModelConfig& cfg, TaskKind head);
  StepResult forward_backward(const Batch& b, bool train, uint64_t step) override;

 private:
  bool causal() const override { return false; }
  double arena_floats(int64_t B, int64_t T) const override {
    // Per layer 8H + F + 4 floats a row, then 13H + 2F + 4 + classes (see ensure), each piece
    // rounded up to 16 floats.
    const double rows = static_cast<double>(B * T), H = static_cast<double>(cfg_.hidden), F = static_cast<double>(cfg_.ffn);
    const double pieces = 11.0 * static_cast<double>(cfg_.layers) + 17;
    return rows * (static_cast<double>(cfg_.layers) * (8 * H + F + 4) + 13 * H + 2 * F + 4 + static_cast<double>(head_out_)) + 16 * pieces;
  }
  void ensure(int64_t B, int64_t T);
  struct Layer {  // offsets into params / grads
    int64_t wqkv, bqkv, wo, bo, ln1g, ln1b, w1, b1, w2, b2, ln2g, ln2b;
  };
  struct Saved {  // per layer, what backward reads
    float *x, *xn1, *m1, *r1, *qkv, *ao, *xm, *xn2, *m2, *r2, *h;
  };
  std::vector<Layer> L_;
  int64_t word_, pos_, elng_, elnb_, flng_, flnb_;
  std::vector<Saved> S_;
  float *e_, *em_, *er_, *xl_, *fm_, *fr_;  // embeddings before LN, last residual, final LN
  float *dx_, *dt_, *dt2_, *dao_, *dqkv_, *dh_, *gbuf_;
};

Bert::Bert(const ModelConfig& cfg_in, TaskKind head) : ModelBase(cfg_in, head) {
  ModelConfig& c = cfg_;
  check(head == TaskKind::classify || head == TaskKind::mlm, "train: a bert encoder takes the classify or mlm head, not ",
        head_name(head));
  check(c.hidden >= 1 && c.layers >= 1 && c.heads >= 1 && c.hidden % c.heads == 0 && c.ffn >= 1 && c.vocab >= 1 &&
            c.max_positions >= 1,
        "train: bert sizes must be >= 1 (hidden, layers, heads, ffn, vocab, max_positions) with hidden a multiple of heads");
  check(head != TaskKind::classify || c.num_labels >= 1, "train: the classify head needs num_labels >= 1");
  check(c.attention_scale == 0, "train: attention_scale is not supported for training");
  // What this architecture is, whatever the config said: see the file comment.
  c.model_type = "bert";
  c.head_dim = c.hidden / c.heads;
  c.kv_heads = c.heads;
  c.pre_ln = true;
  c.final_layer_norm = true;
  c.qkv_bias = true;
  c.type_vocab = 0;
  if (!(c.eps > 0)) c.eps = 1e-12f;
  const int64_t H = c.hidden, F = c.ffn;
  word_ = add("embeddings.word_embeddings.weight", {c.vocab, H}, Init::normal);
  pos_ = add("embeddings.position_embeddings.weight", {c.max_positions, H}, Init::normal);
  elng_ = add("embeddings.LayerNorm.weight", {H}, Init::one);
  elnb_ = add("embeddings.LayerNorm.bias", {H}, Init::zero);
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "encoder.layer." + std::to_string(l) + ".";
    Layer y;
    // query, key and value adjacent: one (3H, H) matrix and one (3H) bias for a fused GEMM.
    y.wqkv = add(p + "attention.self.query.weight", {H, H}, Init::normal);
    add(p + "attention.self.key.weight", {H, H}, Init::normal);
    add(p + "attention.self.value.weight", {H, H}, Init::normal);
    y.bqkv = add(p + "attention.self.query.bias", {H}, Init::zero);
    add(p + "attention.self.key.bias", {H}, Init::zero);
    add(p + "attention.self.value.bias", {H}, Init::zero);
    y.wo = add(p + "attention.output.dense.weight", {H, H}, Init::normal);
    y.bo = add(p + "attention.output.dense.bias", {H}, Init::zero);
    y.ln1g = add(p + "attention.output.LayerNorm.weight", {H}, Init::one);
    y.ln1b = add(p + "attention.output.LayerNorm.bias", {H}, Init::zero);
    y.w1 = add(p + "intermediate.dense.weight", {F, H}, Init::normal);
    y.b1 = add(p + "intermediate.dense.bias", {F}, Init::zero);
    y.w2 = add(p + "output.dense.weight", {H, F}, Init::normal);
    y.b2 = add(p + "output.dense.bias", {H}, Init::zero);
    y.ln2g = add(p + "output.LayerNorm.weight", {H}, Init::one);
    y.ln2b = add(p + "output.LayerNorm.bias", {H}, Init::zero);
    L_.push_back(y);
  }
  flng_ = add("encoder.final_layer_norm.weight", {H}, Init::one);
  flnb_ = add("encoder.final_layer_norm.bias", {H}, Init::zero);
  if (head == TaskKind::mlm) {
    head_w_ = word_;  // tied
    head_b_ = add("cls.predictions.bias", {c.vocab}, Init::zero);
    head_out_ = c.vocab;
  } else {
    head_w_ = add("classifier.weight", {c.num_labels, H}, Init::normal);
    head_b_ = add("classifier.bias", {c.num_labels}, Init::zero);
    head_out_ = c.num_labels;
  }
  allocate();
  set_attention("full");
}

void Bert::ensure(int64_t B, int64_t T) {
  if (B == B_ && T == T_) return;
  const int64_t rows = B * T, H = cfg_.hidden, F = cfg_.ffn;
  Arena a;
  for (int pass = 0; pass < 2; ++pass) {
    a.begin(pass ? arena_.data() : nullptr);
    S_.assign(static_cast<size_t>(cfg_.layers), Saved{});
    for (Saved& s : S_) {
      s.x = a.take(rows * H);       // (rows, H) layer input (residual stream)
      s.xn1 = a.take(rows * H);     // (rows, H) LN1 output
      s.m1 = a.take(rows);          // (rows) LN1 mean
      s.r1 = a.take(rows);          // (rows) LN1 1/std
      s.qkv = a.take(rows * 3 * H); // (rows, 3H) q | k | v
      s.ao = a.take(rows * H);      // (rows, H) attention output
      s.xm = a.take(rows * H);      // (rows, H) residual after attention
      s.xn2 = a.take(rows * H);     // (rows, H) LN2 output
      s.m2 = a.take(rows);
      s.r2 = a.take(rows);
      s.h = a.take(rows * F);       // (rows, F) FFN hidden before GELU
    }
    e_ = a.take(rows * H);          // (rows, H) word + position embeddings
    em_ = a.take(rows);
    er_ = a.take(rows);
    xl_ = a.take(rows * H);         // (rows, H) output of the last layer
    xf_ = a.take(rows * H);         // (rows, H) final LayerNorm output
    fm_ = a.take(rows);
    fr_ = a.take(rows);
    dx_ = a.take(rows * H);         // (rows, H) gradient of the residual stream
    dt_ = a.take(rows * H);         // (rows, H) gradient of a block's output (dropout)
    dt2_ = a.take(rows * H);        // (rows, H) gradient of a normalised block input
    dao_ = a.take(rows * H);        // (rows, H) gradient of the attention output
    dqkv_ = a.take(rows * 3 * H);   // (rows, 3H)
    dh_ = a.take(rows * F);         // (rows, F)
    gbuf_ = a.take(rows * F);       // (rows, F) GELU output (recomputed in backward)
    hs_ = a.take(rows * H);         // head: gathered rows (n, H)
    dhs_ = a.take(rows * H);
    logits_ = a.take(rows * head_out_);  // (n, classes)
    if (!pass) {
      // train_bytes() promises this bound: a layout change must update arena_floats().
      check(static_cast<double>(a.used()) <= arena_floats(B, T), "train: internal: the arena (", a.used(),
            " floats) exceeds arena_floats() = ", arena_floats(B, T));
      arena_.resize(Shape{a.used()});
    }
  }
  sel_.assign(static_cast<size_t>(rows), 0);
  tsel_.assign(static_cast<size_t>(rows), 0);
  B_ = B;
  T_ = T;
}

StepResult Bert::forward_backward(const Batch& b, bool train, uint64_t step) {
  const auto t_start = Clock::now();
  check_batch(b);
  ensure(b.B, b.T);
  attn_ms_ = dense_ms_ = 0;
  const ModelConfig& c = cfg_;
  const int64_t B = b.B, T = b.T, rows = B * T, H = c.hidden, F = c.ffn, nh = c.heads, hd = c.head_dim;
  const nn::Gelu gk = c.gelu_tanh ? nn::Gelu::tanh : nn::Gelu::erf;
  const bool drop = train && dropout_ > 0;
  const uint64_t dseed = step * 0x9E3779B97F4A7C15ull + 0xD1B54A32D192ED03ull;
  auto hv = [&](float* base, int64_t ld) { return heads_view(base, B, nh, T, hd, ld); };

  // Embeddings: word + position, LayerNorm.
  nn::embedding_fwd(e_, b.ids.data(), p(word_), rows, H, c.vocab);
  const float* pe = p(pos_);
  for_rows(rows, H, [&](int64_t r) {
    for (int64_t e = 0; e < H; ++e) e_[r * H + e] += pe[(r % T) * H + e];
  });
  float* x0 = S_[0].x;
  nn::layernorm_fwd(x0, e_, p(elng_), p(elnb_), rows, H, c.eps, em_, er_);
  for (int64_t l = 0; l < c.layers; ++l) {
    const Layer& y = L_[static_cast<size_t>(l)];
    Saved& s = S_[static_cast<size_t>(l)];
    float* xnext = l + 1 < c.layers ? S_[static_cast<size_t>(l + 1)].x : xl_;
    nn::layernorm_fwd(s.xn1, s.x, p(y.ln1g), p(y.ln1b), rows, H, c.eps, s.m1, s.r1);
    lin(s.qkv, 3 * H, s.xn1, H, p(y.wqkv), p(y.bqkv), rows, H, 3 * H);
    const AttentionInputs ai = attn_inputs(l, hv(s.qkv, 3 * H), hv(s.qkv + H, 3 * H), hv(s.qkv + 2 * H, 3 * H), b, train, step);
    attn_forward(l, ai, hv(s.ao, H));
    if (drop) {
      lin(dt_, H, s.ao, H, p(y.wo), p(y.bo), rows, H, H);
      nn::dropout_fwd(dt_, dt_, rows * H, dropout_, dseed, static_cast<uint64_t>(2 * l));
      std::memcpy(s.xm, s.x, sizeof(float) * static_cast<size_t>(rows * H));
      nn::add_inplace(s.xm, dt_, rows * H);
    } else {
      lin(s.xm, H, s.ao, H, p(y.wo), p(y.bo), rows, H, H, s.x);
    }
    nn::layernorm_fwd(s.xn2, s.xm, p(y.ln2g), p(y.ln2b), rows, H, c.eps, s.m2, s.r2);
    lin(s.h, F, s.xn2, H, p(y.w1), p(y.b1), rows, H, F);
    nn::gelu_fwd(gbuf_, s.h, rows * F, gk);
    if (drop) {
      lin(dt_, H, gbuf_, F, p(y.w2), p(y.b2), rows, F, H);
      nn::dropout_fwd(dt_, dt_, rows * H, dropout_, dseed, static_cast<uint64_t>(2 * l + 1));
      std::memcpy(xnext, s.xm, sizeof(float) * static_cast<size_t>(rows * H));
      nn::add_inplace(xnext, dt_, rows * H);
    } else {
      lin(xnext, H, gbuf_, F, p(y.w2), p(y.b2), rows, F, H, s.xm);
    }
  }
  nn::layernorm_fwd(xf_, xl_, p(flng_), p(flnb_), rows, H, c.eps, fm_, fr_);
  StepResult res;
  head_forward_backward(b, xf_, dt2_, train, res);
  if (!train) {
    return timed(res, t_start);
  }

  // Backward, top to bottom. dx_ is the gradient of the residual stream.
  nn::layernorm_bwd(dx_, g(flng_), g(flnb_), dt2_, xl_, p(flng_), fm_, fr_, rows, H);
  for (int64_t l = c.layers - 1; l >= 0; --l) {
    const Layer& y = L_[static_cast<size_t>(l)];
    Saved& s = S_[static_cast<size_t>(l)];
    // FFN branch: x_next = xm + W2·gelu(h) + b2.
    const float* dff = dx_;
    if (drop) {
      nn::dropout_bwd(dt_, dx_, rows * H, dropout_, dseed, static_cast<uint64_t>(2 * l + 1));
      dff = dt_;
    }
    nn::gelu_fwd(gbuf_, s.h, rows * F, gk);
    lin_bwd(dh_, F, g(y.w2), g(y.b2), dff, H, gbuf_, F, p(y.w2), rows, F, H);
    nn::gelu_bwd(dh_, dh_, s.h, rows * F, gk);
    lin_bwd(dt2_, H, g(y.w1), g(y.b1), dh_, F, s.xn2, H, p(y.w1), rows, H, F);
    nn::layernorm_bwd(dx_, g(y.ln2g), g(y.ln2b), dt2_, s.xm, p(y.ln2g), s.m2, s.r2, rows, H, true);
    // Attention branch: xm = x + Wo·attn(LN1(x)) + bo.
    const float* dat = dx_;
    if (drop) {
      nn::dropout_bwd(dt_, dx_, rows * H, dropout_, dseed, static_cast<uint64_t>(2 * l));
      dat = dt_;
    }
    lin_bwd(dao_, H, g(y.wo), g(y.bo), dat, H, s.ao, H, p(y.wo), rows, H, H);
    std::memset(dqkv_, 0, sizeof(float) * static_cast<size_t>(rows * 3 * H));
    const AttentionInputs ai = attn_inputs(l, hv(s.qkv, 3 * H), hv(s.qkv + H, 3 * H), hv(s.qkv + 2 * H, 3 * H), b, train, step);
    attn_backward(l, ai, hv(s.ao, H), hv(dao_, H), hv(dqkv_, 3 * H), hv(dqkv_ + H, 3 * H), hv(dqkv_ + 2 * H, 3 * H));
    lin_bwd(dt2_, H, g(y.wqkv), g(y.bqkv), dqkv_, 3 * H, s.xn1, H, p(y.wqkv), rows, H, 3 * H);
    nn::layernorm_bwd(dx_, g(y.ln1g), g(y.ln1b), dt2_, s.x, p(y.ln1g), s.m1, s.r1, rows, H, true);
  }
  nn::layernorm_bwd(dt2_, g(elng_), g(elnb_), dx_, e_, p(elng_), em_, er_, rows, H);
  nn::embedding_bwd(g(word_), b.ids.data(), dt2_, rows, H, c.vocab);
  float* dpos = g(pos_);
  for_rows(T, B * H, [&](int64_t t) {  // fixed order over the batch: deterministic
    for (int64_t s = 0; s < B; ++s)
      for (int64_t e = 0; e < H; ++e) dpos[t * H + e] += dt2_[(s * T + t) * H + e];
  });
  return timed(res, t_start);
}

}  // namespace

std::unique_ptr<ModelBase> make_bert(const ModelConfig& cfg, TaskKind head) {
  return std::make_unique<Bert>(cfg, head);
}

}  // namespace clattn::train
