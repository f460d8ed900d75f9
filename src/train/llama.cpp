// The trainable LLaMA decoder (kind llama): token embeddings, L layers of [RMSNorm -> causal MHA
// with rotate-half RoPE -> residual, RMSNorm -> SwiGLU FFN -> residual], a final RMSNorm and the
// output layer tied to the embeddings (head lm: next-token targets, -1 where no loss is taken).
// The same function as Decoder::forward on the saved folder. q_proj, k_proj, v_proj are adjacent in
// the flat buffer (one (Q + 2KV, H) matrix: one GEMM), and so are gate_proj and up_proj.
#include <algorithm>
#include <cstring>

#include "clattn/error.h"
#include "clattn/nn.h"
#include "clattn/parallel.h"
#include "train/train_impl.h"

namespace clattn::train {
namespace {

class Llama final : public ModelBase {
 public:
  Llama(const ModelConfig& cfg, TaskKind head);
  StepResult forward_backward(const Batch& b, bool train, uint64_t step) override;

 private:
  bool causal() const override { return true; }
  double arena_floats(int64_t B, int64_t T) const override {
    // Per layer 4H + (Q + 2KV) + Q + 2F + 2 floats a row, then 7H + Q + (Q + 2KV) + 3F + 1 +
    // vocab (see ensure), each piece rounded up to 16 floats.
    const ModelConfig& c = cfg_;
    const double rows = static_cast<double>(B * T), H = static_cast<double>(c.hidden), F = static_cast<double>(c.ffn);
    const double Q = static_cast<double>(c.heads * c.head_dim), QKV = Q + 2.0 * static_cast<double>(c.kv_heads * c.head_dim);
    const double pieces = 9.0 * static_cast<double>(c.layers) + 13;
    return rows * (static_cast<double>(c.layers) * (4 * H + QKV + Q + 2 * F + 2) + 7 * H + Q + QKV + 3 * F + 1 + static_cast<double>(head_out_)) +
           16 * pieces;
  }
  void ensure(int64_t B, int64_t T);
  struct Layer {
    int64_t in_norm, wqkv, wo, post_norm, wgu, down;
  };
  struct Saved {
    float *x, *xn1, *r1, *qkv, *ao, *xm, *xn2, *r2, *gu;
  };
  std::vector<Layer> L_;
  int64_t embed_, norm_;
  std::vector<Saved> S_;
  std::vector<int32_t> pos_;
  float *xl_, *fr_;
  float *dx_, *dt_, *dt2_, *dao_, *dqkv_, *dgu_, *sbuf_;
};

Llama::Llama(const ModelConfig& cfg_in, TaskKind head) : ModelBase(cfg_in, head) {
  ModelConfig& c = cfg_;
  check(head == TaskKind::lm, "train: a llama decoder takes the lm head, not ", head_name(head));
  if (c.kv_heads == 0) c.kv_heads = c.heads;
  if (c.head_dim == 0 && c.heads > 0) c.head_dim = c.hidden / c.heads;
  check(c.hidden >= 1 && c.layers >= 1 && c.heads >= 1 && c.ffn >= 1 && c.vocab >= 1 && c.head_dim >= 2 &&
            c.head_dim % 2 == 0 && c.kv_heads >= 1 && c.heads % c.kv_heads == 0,
        "train: llama sizes must be >= 1 (hidden, layers, heads, ffn, vocab), head_dim even, heads a multiple of kv_heads");
  c.model_type = "llama";
  c.tie_embeddings = true;
  if (!(c.eps > 0)) c.eps = 1e-6f;
  if (!(c.rope_theta > 0)) c.rope_theta = 10000.f;
  const int64_t H = c.hidden, F = c.ffn, Q = c.heads * c.head_dim, KV = c.kv_heads * c.head_dim;
  embed_ = add("model.embed_tokens.weight", {c.vocab, H}, Init::normal);
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Layer y;
    y.in_norm = add(p + "input_layernorm.weight", {H}, Init::one);
    y.wqkv = add(p + "self_attn.q_proj.weight", {Q, H}, Init::normal);
    add(p + "self_attn.k_proj.weight", {KV, H}, Init::normal);
    add(p + "self_attn.v_proj.weight", {KV, H}, Init::normal);
    y.wo = add(p + "self_attn.o_proj.weight", {H, Q}, Init::normal);
    y.post_norm = add(p + "post_attention_layernorm.weight", {H}, Init::one);
    y.wgu = add(p + "mlp.gate_proj.weight", {F, H}, Init::normal);
    add(p + "mlp.up_proj.weight", {F, H}, Init::normal);
    y.down = add(p + "mlp.down_proj.weight", {H, F}, Init::normal);
    L_.push_back(y);
  }
  norm_ = add("model.norm.weight", {H}, Init::one);
  head_w_ = embed_;  // tied
  head_out_ = c.vocab;
  allocate();
  set_attention("full");
}

void Llama::ensure(int64_t B, int64_t T) {
  if (B == B_ && T == T_) return;
  const ModelConfig& c = cfg_;
  const int64_t rows = B * T, H = c.hidden, F = c.ffn, Q = c.heads * c.head_dim, QKV = Q + 2 * c.kv_heads * c.head_dim;
  Arena a;
  for (int pass = 0; pass < 2; ++pass) {
    a.begin(pass ? arena_.data() : nullptr);
    S_.assign(static_cast<size_t>(c.layers), Saved{});
    for (Saved& s : S_) {
      s.x = a.take(rows * H);      // (rows, H) layer input
      s.xn1 = a.take(rows * H);    // (rows, H) RMSNorm output
      s.r1 = a.take(rows);         // (rows) 1/rms
      s.qkv = a.take(rows * QKV);  // (rows, Q + 2KV) q | k | v, q and k rotated
      s.ao = a.take(rows * Q);     // (rows, Q) attention output
      s.xm = a.take(rows * H);     // (rows, H) residual after attention
      s.xn2 = a.take(rows * H);
      s.r2 = a.take(rows);
      s.gu = a.take(rows * 2 * F); // (rows, 2F) gate | up
    }
    xl_ = a.take(rows * H);
    xf_ = a.take(rows * H);
    fr_ = a.take(rows);
    dx_ = a.take(rows * H);        // (rows, H) gradient of the residual stream
    dt_ = a.take(rows * H);
    dt2_ = a.take(rows * H);
    dao_ = a.take(rows * Q);       // (rows, Q)
    dqkv_ = a.take(rows * QKV);    // (rows, Q + 2KV)
    dgu_ = a.take(rows * 2 * F);   // (rows, 2F)
    sbuf_ = a.take(rows * F);      // (rows, F) SwiGLU output, then its gradient
    hs_ = a.take(rows * H);
    dhs_ = a.take(rows * H);
    logits_ = a.take(rows * head_out_);
    if (!pass) {
      // train_bytes() promises this bound: a layout change must update arena_floats().
      check(static_cast<double>(a.used()) <= arena_floats(B, T), "train: internal: the arena (", a.used(),
            " floats) exceeds arena_floats() = ", arena_floats(B, T));
      arena_.resize(Shape{a.used()});
    }
  }
  pos_.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) pos_[static_cast<size_t>(r)] = static_cast<int32_t>(r % T);
  sel_.assign(static_cast<size_t>(rows), 0);
  tsel_.assign(static_cast<size_t>(rows), 0);
  B_ = B;
  T_ = T;
}

StepResult Llama::forward_backward(const Batch& b, bool train, uint64_t step) {
  const auto t_start = Clock::now();
  check_batch(b);
  ensure(b.B, b.T);
  attn_ms_ = dense_ms_ = 0;
  const ModelConfig& c = cfg_;
  const int64_t B = b.B, T = b.T, rows = B * T, H = c.hidden, F = c.ffn, nh = c.heads, kvh = c.kv_heads, hd = c.head_dim;
  const int64_t Q = nh * hd, KV = kvh * hd, QKV = Q + 2 * KV;
  const bool drop = train && dropout_ > 0;
  const uint64_t dseed = step * 0x9E3779B97F4A7C15ull + 0xD1B54A32D192ED03ull;
  auto hv = [&](float* base, int64_t heads, int64_t ld) { return heads_view(base, B, heads, T, hd, ld); };
  // SwiGLU over the fused (rows, 2F) gate | up rows: nn's elementwise passes take flat buffers, so
  // one call per row inside our own loop over rows (each call below nn's threading threshold).
  auto swiglu_rows = [&](float* out, const float* gu) {
    for_rows(rows, F, [&](int64_t r) { nn::swiglu_fwd(out + r * F, gu + r * 2 * F, gu + r * 2 * F + F, F); });
  };

  nn::embedding_fwd(S_[0].x, b.ids.data(), p(embed_), rows, H, c.vocab);
  for (int64_t l = 0; l < c.layers; ++l) {
    const Layer& y = L_[static_cast<size_t>(l)];
    Saved& s = S_[static_cast<size_t>(l)];
    float* xnext = l + 1 < c.layers ? S_[static_cast<size_t>(l + 1)].x : xl_;
    nn::rmsnorm_fwd(s.xn1, s.x, p(y.in_norm), rows, H, c.eps, s.r1);
    lin(s.qkv, QKV, s.xn1, H, p(y.wqkv), nullptr, rows, H, QKV);
    nn::rope_fwd(s.qkv, QKV, hd, pos_.data(), rows, nh, hd, c.rope_theta);
    nn::rope_fwd(s.qkv + Q, QKV, hd, pos_.data(), rows, kvh, hd, c.rope_theta);
    const AttentionInputs ai = attn_inputs(l, hv(s.qkv, nh, QKV), hv(s.qkv + Q, kvh, QKV), hv(s.qkv + Q + KV, kvh, QKV), b, train, step);
    attn_forward(l, ai, hv(s.ao, nh, Q));
    if (drop) {
      lin(dt_, H, s.ao, Q, p(y.wo), nullptr, rows, Q, H);
      nn::dropout_fwd(dt_, dt_, rows * H, dropout_, dseed, static_cast<uint64_t>(2 * l));
      std::memcpy(s.xm, s.x, sizeof(float) * static_cast<size_t>(rows * H));
      nn::add_inplace(s.xm, dt_, rows * H);
    } else {
      lin(s.xm, H, s.ao, Q, p(y.wo), nullptr, rows, Q, H, s.x);
    }
    nn::rmsnorm_fwd(s.xn2, s.xm, p(y.post_norm), rows, H, c.eps, s.r2);
    lin(s.gu, 2 * F, s.xn2, H, p(y.wgu), nullptr, rows, H, 2 * F);
    swiglu_rows(sbuf_, s.gu);
    if (drop) {
      lin(dt_, H, sbuf_, F, p(y.down), nullptr, rows, F, H);
      nn::dropout_fwd(dt_, dt_, rows * H, dropout_, dseed, static_cast<uint64_t>(2 * l + 1));
      std::memcpy(xnext, s.xm, sizeof(float) * static_cast<size_t>(rows * H));
      nn::add_inplace(xnext, dt_, rows * H);
    } else {
      lin(xnext, H, sbuf_, F, p(y.down), nullptr, rows, F, H, s.xm);
    }
  }
  nn::rmsnorm_fwd(xf_, xl_, p(norm_), rows, H, c.eps, fr_);
  StepResult res;
  head_forward_backward(b, xf_, dt2_, train, res);
  if (!train) {
    return timed(res, t_start);
  }

  nn::rmsnorm_bwd(dx_, g(norm_), dt2_, xl_, p(norm_), fr_, rows, H);
  for (int64_t l = c.layers - 1; l >= 0; --l) {
    const Layer& y = L_[static_cast<size_t>(l)];
    Saved& s = S_[static_cast<size_t>(l)];
    const float* dff = dx_;
    if (drop) {
      nn::dropout_bwd(dt_, dx_, rows * H, dropout_, dseed, static_cast<uint64_t>(2 * l + 1));
      dff = dt_;
    }
    swiglu_rows(sbuf_, s.gu);
    lin_bwd(dgu_, 2 * F, g(y.down), nullptr, dff, H, sbuf_, F, p(y.down), rows, F, H);
    // dgu_ holds d(swiglu) in its first F columns of each row; SwiGLU's backward per row writes
    // dgate over it (allowed: dgate may alias dy) and dup beside it.
    for_rows(rows, F, [&](int64_t r) {
      nn::swiglu_bwd(dgu_ + r * 2 * F, dgu_ + r * 2 * F + F, dgu_ + r * 2 * F, s.gu + r * 2 * F, s.gu + r * 2 * F + F, F);
    });
    lin_bwd(dt2_, H, g(y.wgu), nullptr, dgu_, 2 * F, s.xn2, H, p(y.wgu), rows, H, 2 * F);
    nn::rmsnorm_bwd(dx_, g(y.post_norm), dt2_, s.xm, p(y.post_norm), s.r2, rows, H, true);
    const float* dat = dx_;
    if (drop) {
      nn::dropout_bwd(dt_, dx_, rows * H, dropout_, dseed, static_cast<uint64_t>(2 * l));
      dat = dt_;
    }
    lin_bwd(dao_, Q, g(y.wo), nullptr, dat, H, s.ao, Q, p(y.wo), rows, Q, H);
    std::memset(dqkv_, 0, sizeof(float) * static_cast<size_t>(rows * QKV));
    const AttentionInputs ai = attn_inputs(l, hv(s.qkv, nh, QKV), hv(s.qkv + Q, kvh, QKV), hv(s.qkv + Q + KV, kvh, QKV), b, train, step);
    attn_backward(l, ai, hv(s.ao, nh, Q), hv(dao_, nh, Q), hv(dqkv_, nh, QKV), hv(dqkv_ + Q, kvh, QKV),
                  hv(dqkv_ + Q + KV, kvh, QKV));
    nn::rope_bwd(dqkv_, QKV, hd, pos_.data(), rows, nh, hd, c.rope_theta);
    nn::rope_bwd(dqkv_ + Q, QKV, hd, pos_.data(), rows, kvh, hd, c.rope_theta);
    lin_bwd(dt2_, H, g(y.wqkv), nullptr, dqkv_, QKV, s.xn1, H, p(y.wqkv), rows, H, QKV);
    nn::rmsnorm_bwd(dx_, g(y.in_norm), dt2_, s.x, p(y.in_norm), s.r1, rows, H, true);
  }
  nn::embedding_bwd(g(embed_), b.ids.data(), dx_, rows, H, c.vocab);
  return timed(res, t_start);
}

}  // namespace

std::unique_ptr<ModelBase> make_llama(const ModelConfig& cfg, TaskKind head) {
  return std::make_unique<Llama>(cfg, head);
}

}  // namespace clattn::train
