// The decoder: LLaMA family (RMSNorm, rotate-half RoPE, grouped-query attention, SwiGLU, tied or
// untied output layer), one forward for inference, training and KV-cache decoding, and one
// backward. A layer, with drop() the residual dropout of training:
//   a = RMS1(x)   q|k|v = a·Wqkv, q and k rotated   u1 = x + drop(attn(q, k, v)·Wo)
//   f = RMS2(u1)  g|u = f·Wgu                       x' = u1 + drop((silu(g) ∘ u)·Wdown)
// Activations are token-major (rows = B·T); attention reads them through strided (B, H, T, D)
// views. Inference keeps one set of buffers for every layer and updates the residual stream in
// place; training keeps each layer's x, a, qkv, attention output, u1, f, g|u and 1/rms.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "clattn/error.h"
#include "clattn/model.h"
#include "clattn/nn.h"
#include "clattn/parallel.h"
#include "clattn/rng.h"
#include "model/layer_attention.h"
#include "model/model_internal.h"
#include "model/weights.h"

namespace clattn {

using model::ms_now;

struct Decoder::Layout {
  struct Layer {
    int64_t in_norm, wqkv, wo, post_norm, wgu, down;
    int64_t begin, end;  // the layer's range of the flat buffer
  };
  std::vector<Layer> layers;
  int64_t embed = -1, norm = -1, lm_head = -1;
};

struct Decoder::Bufs {
  struct Saved {  // per layer (training), or one set every layer shares (inference)
    float *x, *xn1, *r1, *qkv, *ao, *u1, *xn2, *r2, *gu;
  };
  std::vector<Saved> S;
  float *xl = nullptr, *xf = nullptr, *fr = nullptr;  // last layer's output, final norm output, its 1/rms
  float *dx = nullptr, *dt = nullptr, *dt2 = nullptr, *dao = nullptr, *dqkv = nullptr, *dgu = nullptr;
  float *sbuf = nullptr;  // (rows, F) SwiGLU output, then its gradient
  float *hs = nullptr, *dhs = nullptr, *logits = nullptr;
};

Decoder::Decoder(const ModelConfig& cfg_in)
    : Model(cfg_in), L_(std::make_unique<Layout>()), b_(std::make_unique<Bufs>()) {
  ModelConfig& c = cfg_;
  head_ = TaskKind::lm;
  if (c.kv_heads == 0) c.kv_heads = c.heads;
  if (c.head_dim == 0 && c.heads > 0) c.head_dim = c.hidden / c.heads;
  check(c.hidden >= 1 && c.layers >= 1 && c.heads >= 1 && c.ffn >= 1 && c.vocab >= 1 && c.head_dim >= 2 &&
            c.head_dim % 2 == 0 && c.kv_heads >= 1 && c.heads % c.kv_heads == 0,
        "decoder: sizes must be >= 1 (hidden, layers, heads, ffn, vocab), head_dim even, heads a multiple of kv_heads");
  c.model_type = "llama";
  if (!(c.eps > 0)) c.eps = 1e-6f;
  if (!(c.rope_theta > 0)) c.rope_theta = 10000.f;
  const int64_t H = c.hidden, F = c.ffn, Q = c.heads * c.head_dim, KV = c.kv_heads * c.head_dim;
  Layout& L = *L_;
  L.embed = add("model.embed_tokens.weight", {c.vocab, H}, Init::normal);
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Layout::Layer y;
    y.in_norm = add(p + "input_layernorm.weight", {H}, Init::one);
    // q, k, v adjacent (one (Q + 2KV, H) matrix: one GEMM), and gate, up (one (2F, H) matrix).
    y.wqkv = add(p + "self_attn.q_proj.weight", {Q, H}, Init::normal);
    add(p + "self_attn.k_proj.weight", {KV, H}, Init::normal);
    add(p + "self_attn.v_proj.weight", {KV, H}, Init::normal);
    y.wo = add(p + "self_attn.o_proj.weight", {H, Q}, Init::normal);
    y.post_norm = add(p + "post_attention_layernorm.weight", {H}, Init::one);
    y.wgu = add(p + "mlp.gate_proj.weight", {F, H}, Init::normal);
    add(p + "mlp.up_proj.weight", {F, H}, Init::normal);
    y.down = add(p + "mlp.down_proj.weight", {H, F}, Init::normal);
    y.begin = y.in_norm;
    y.end = y.down + H * F;
    L.layers.push_back(y);
  }
  L.norm = add("model.norm.weight", {H}, Init::one);
  L.lm_head = c.tie_embeddings ? L.embed : add("lm_head.weight", {c.vocab, H}, Init::normal);
  allocate();
  att_ = std::make_unique<LayerAttention>(c.layers, true, c.kv_heads != c.heads);
  att_->set_plan("full");
}

Decoder::~Decoder() = default;

std::unique_ptr<Decoder> Decoder::for_checkpoint(ModelConfig cfg, const Weights& w, const LoadOptions& opt) {
  check(!opt.head || *opt.head == TaskKind::lm, "model '", w.dir(), "': a decoder takes the lm head");
  std::unique_ptr<Decoder> d(new Decoder(cfg));
  d->init(opt.seed);
  return d;
}

// ---- activations

Decoder::Bufs Decoder::plan(int64_t B, int64_t T, bool train, bool head, float* base, int64_t* used) const {
  const ModelConfig& c = cfg_;
  const int64_t rows = B * T, H = c.hidden, F = c.ffn, Q = c.heads * c.head_dim, QKV = Q + 2 * c.kv_heads * c.head_dim;
  model::Carver a(base);
  Bufs b;
  if (train) {
    b.S.resize(static_cast<size_t>(c.layers));
    for (Bufs::Saved& s : b.S) {
      s.x = a.take(rows * H);      // (rows, H) layer input
      s.xn1 = a.take(rows * H);    // (rows, H) RMSNorm output
      s.r1 = a.take(rows);         // (rows) 1/rms
      s.qkv = a.take(rows * QKV);  // (rows, Q + 2KV) q | k | v, q and k rotated
      s.ao = a.take(rows * Q);     // (rows, Q) attention output
      s.u1 = a.take(rows * H);     // (rows, H) residual after attention
      s.xn2 = a.take(rows * H);
      s.r2 = a.take(rows);
      s.gu = a.take(rows * 2 * F); // (rows, 2F) gate | up
    }
    b.xl = a.take(rows * H);
    b.xf = a.take(rows * H);
    b.fr = a.take(rows);
    b.dx = a.take(rows * H);       // (rows, H) gradient of the residual stream
    b.dt = a.take(rows * H);
    b.dt2 = a.take(rows * H);
    b.dao = a.take(rows * Q);      // (rows, Q)
    b.dqkv = a.take(rows * QKV);   // (rows, Q + 2KV)
    b.dgu = a.take(rows * 2 * F);  // (rows, 2F)
    b.dhs = a.take(rows * H);
  } else {
    Bufs::Saved s;
    s.x = s.u1 = a.take(rows * H);  // (rows, H) residual stream, updated in place
    s.xn1 = s.xn2 = a.take(rows * H);
    s.r1 = s.r2 = nullptr;
    s.qkv = a.take(rows * QKV);
    s.ao = a.take(rows * Q);
    s.gu = a.take(rows * 2 * F);
    b.S.assign(static_cast<size_t>(c.layers), s);
    b.xl = s.x;
    b.xf = s.xn1;  // the normalised input is free after the last layer
  }
  b.sbuf = a.take(rows * F);       // (rows, F)
  if (head) {
    b.hs = a.take(rows * H);       // (n, H) rows with a target
    b.logits = a.take(rows * c.vocab);
  }
  if (used) *used = a.used();
  return b;
}

double Decoder::arena_floats(int64_t B, int64_t T, bool train) const {
  int64_t used = 0;
  (void)plan(B, T, train, true, nullptr, &used);
  return static_cast<double>(used);
}

void Decoder::carve(int64_t B, int64_t T, bool train, bool head) {
  if (B == B_ && T == T_ && train == train_layout_ && head == head_layout_) return;
  int64_t used = 0;
  (void)plan(B, T, train, head, nullptr, &used);
  *b_ = plan(B, T, train, head, arena(used), nullptr);
  hs_ = b_->hs;
  dhs_ = b_->dhs;
  logits_ = b_->logits;
  sel_.assign(static_cast<size_t>(B * T), 0);
  tsel_.assign(static_cast<size_t>(B * T), 0);
  B_ = B;
  T_ = T;
  train_layout_ = train;
  head_layout_ = head;
}

double Decoder::forward_bytes(int64_t B, int64_t T, int64_t cache_positions) const {
  if (split_on()) T = sequence_split(T).local_rows(sp_->rank());
  const ModelConfig& c = cfg_;
  const AttentionDims d{B, c.heads, c.kv_heads, T, cache_positions > 0 ? cache_positions : T, c.head_dim, c.head_dim};
  int64_t used = 0;
  (void)plan(B, T, false, false, nullptr, &used);
  // The arena, the returned logits, the largest attention workspace; caches hold K twice (rows
  // and panels) and V once.
  const double KV = static_cast<double>(c.kv_heads * c.head_dim);
  const double cache = cache_positions > 0 ? 4.0 * static_cast<double>(c.layers * cache_positions) * (3.0 * KV + 64) : 0;
  return 4.0 * static_cast<double>(used) + 4.0 * static_cast<double>(B * T * c.vocab) + att_->workspace_bytes(d, false) + cache;
}

// ---- forward

void Decoder::forward_layers(int64_t B, int64_t T, std::span<const int32_t> lengths, const int32_t* pos, bool use_cache,
                             bool train, uint64_t step, int64_t first) {
  const ModelConfig& c = cfg_;
  const int64_t rows = B * T, H = c.hidden, F = c.ffn, nh = c.heads, kvh = c.kv_heads, hd = c.head_dim;
  const int64_t Q = nh * hd, KV = kvh * hd, QKV = Q + 2 * KV;
  const bool drop = train && dropout_ > 0;
  const std::span<const int32_t> lens = model::padding_lengths(lengths, seq_T_);  // global lengths
  auto hv = [&](float* base, int64_t heads, int64_t ld) { return model::heads_view(base, B, heads, T, hd, ld); };
  Bufs& b = *b_;
  for (int64_t l = 0; l < c.layers; ++l) {
    const Layout::Layer& y = L_->layers[static_cast<size_t>(l)];
    Bufs::Saved& s = b.S[static_cast<size_t>(l)];
    float* xnext = l + 1 < c.layers ? b.S[static_cast<size_t>(l + 1)].x : b.xl;
    nn::rmsnorm_fwd(s.xn1, s.x, p(y.in_norm), rows, H, c.eps, s.r1);
    lin(s.qkv, QKV, s.xn1, H, p(y.wqkv), nullptr, rows, H, QKV);
    nn::rope_fwd(s.qkv, QKV, hd, pos, rows, nh, hd, c.rope_theta);
    nn::rope_fwd(s.qkv + Q, QKV, hd, pos, rows, kvh, hd, c.rope_theta);
    AttentionInputs ai = att_->inputs(l, hv(s.qkv, nh, QKV), hv(s.qkv + Q, kvh, QKV), hv(s.qkv + Q + KV, kvh, QKV), lens,
                                      step, train);
    if (use_cache) {
      KVCache& kc = cache_[static_cast<size_t>(l)];
      kc.append(hv(s.qkv + Q, kvh, QKV), hv(s.qkv + Q + KV, kvh, QKV),
                kc.keeps_queries() ? ConstView(hv(s.qkv, nh, QKV)) : ConstView{});
      ai.k = kc.keys();
      ai.v = kc.values();
      ai.cache = &kc;
    }
    att_->forward(l, ai, hv(s.ao, nh, Q), train);
    // u1 = x + drop(ao·Wo)
    if (drop) {
      lin(b.dt, H, s.ao, Q, p(y.wo), nullptr, rows, Q, H);
      residual_dropout(s.u1, s.x, b.dt, B, T, H, l, 0, step, first);
    } else {
      lin(s.u1, H, s.ao, Q, p(y.wo), nullptr, rows, Q, H, s.x);
    }
    nn::rmsnorm_fwd(s.xn2, s.u1, p(y.post_norm), rows, H, c.eps, s.r2);
    lin(s.gu, 2 * F, s.xn2, H, p(y.wgu), nullptr, rows, H, 2 * F);
    nn::swiglu_rows_fwd(b.sbuf, F, s.gu, 2 * F, rows, F);
    // x' = u1 + drop(s·Wdown)
    if (drop) {
      lin(b.dt, H, b.sbuf, F, p(y.down), nullptr, rows, F, H);
      residual_dropout(xnext, s.u1, b.dt, B, T, H, l, 1, step, first);
    } else {
      lin(xnext, H, b.sbuf, F, p(y.down), nullptr, rows, F, H, s.u1);
    }
  }
}

void Decoder::final_norm(int64_t rows, int64_t from) {
  const int64_t H = cfg_.hidden;
  float* xf = b_->xf + from * H;
  nn::rmsnorm_fwd(xf, b_->xl + from * H, p(L_->norm), rows - from, H, cfg_.eps, b_->fr ? b_->fr + from : nullptr);
  xf_ = xf;
  rows_xf_ = rows - from;
}

void Decoder::inference_logits(float* out, int64_t n) {
  lin(out, cfg_.vocab, xf_, cfg_.hidden, p(L_->lm_head), nullptr, n, cfg_.hidden, cfg_.vocab);
}

// ---- backward

void Decoder::backward_layers(int64_t B, int64_t T, std::span<const int32_t> lengths, const int32_t* pos, uint64_t step,
                              int64_t first) {
  const ModelConfig& c = cfg_;
  const int64_t rows = B * T, H = c.hidden, F = c.ffn, nh = c.heads, kvh = c.kv_heads, hd = c.head_dim;
  const int64_t Q = nh * hd, KV = kvh * hd, QKV = Q + 2 * KV;
  const bool drop = dropout_ > 0;
  const std::span<const int32_t> lens = model::padding_lengths(lengths, seq_T_);  // global lengths
  auto hv = [&](float* base, int64_t heads, int64_t ld) { return model::heads_view(base, B, heads, T, hd, ld); };
  Bufs& b = *b_;
  float* dx = b.dx;  // (rows, H) gradient of the residual stream
  for (int64_t l = c.layers - 1; l >= 0; --l) {
    const Layout::Layer& y = L_->layers[static_cast<size_t>(l)];
    Bufs::Saved& s = b.S[static_cast<size_t>(l)];
    // x' = u1 + drop(swiglu(f·Wgu)·Wdown)
    const float* dff = dx;
    if (drop) {
      dropout_grad(b.dt, dx, B, T, H, l, 1, step, first);
      dff = b.dt;
    }
    nn::swiglu_rows_fwd(b.sbuf, F, s.gu, 2 * F, rows, F);
    lin_bwd(b.dgu, 2 * F, g(y.down), nullptr, dff, H, b.sbuf, F, p(y.down), rows, F, H);
    // dgu holds d(swiglu) in the first F columns of each row; SwiGLU's backward writes dgate
    // over it and dup beside it.
    nn::swiglu_rows_bwd(b.dgu, 2 * F, b.dgu, 2 * F, s.gu, 2 * F, rows, F);
    lin_bwd(b.dt2, H, g(y.wgu), nullptr, b.dgu, 2 * F, s.xn2, H, p(y.wgu), rows, H, 2 * F);
    // f = RMS2(u1): du1 = dx + RMS2'(df)
    nn::rmsnorm_bwd(dx, g(y.post_norm), b.dt2, s.u1, p(y.post_norm), s.r2, rows, H, true);
    // u1 = x + drop(attn·Wo)
    const float* dat = dx;
    if (drop) {
      dropout_grad(b.dt, dx, B, T, H, l, 0, step, first);
      dat = b.dt;
    }
    lin_bwd(b.dao, Q, g(y.wo), nullptr, dat, H, s.ao, Q, p(y.wo), rows, Q, H);
    std::memset(b.dqkv, 0, sizeof(float) * static_cast<size_t>(rows * QKV));
    const AttentionInputs ai = att_->inputs(l, hv(s.qkv, nh, QKV), hv(s.qkv + Q, kvh, QKV), hv(s.qkv + Q + KV, kvh, QKV),
                                            lens, step, true);
    att_->backward(l, ai, hv(s.ao, nh, Q), hv(b.dao, nh, Q), hv(b.dqkv, nh, QKV), hv(b.dqkv + Q, kvh, QKV),
                   hv(b.dqkv + Q + KV, kvh, QKV));
    nn::rope_bwd(b.dqkv, QKV, hd, pos, rows, nh, hd, c.rope_theta);
    nn::rope_bwd(b.dqkv + Q, QKV, hd, pos, rows, kvh, hd, c.rope_theta);
    // a = RMS1(x): dx = du1 + RMS1'(da)
    lin_bwd(b.dt2, H, g(y.wqkv), nullptr, b.dqkv, QKV, s.xn1, H, p(y.wqkv), rows, H, QKV);
    nn::rmsnorm_bwd(dx, g(y.in_norm), b.dt2, s.x, p(y.in_norm), s.r1, rows, H, true);
    layer_grads_ready(y.begin, y.end);
  }
}

// ---- entry points

StepResult Decoder::forward_backward(const Batch& bt, bool train, uint64_t step, double divisor) {
  const double t0 = ms_now();
  check_batch(bt);
  if (train) {
    att_->check_trainable();
    (void)grads();
  }
  const ModelConfig& c = cfg_;
  // With the sequence split: this rank's positions (zig-zag), and (unless given) the divisor of
  // the whole batch, which no rank counts alone.
  if (split_on() && divisor <= 0)
    divisor = static_cast<double>(std::max<int64_t>(1, std::count_if(bt.targets.begin(), bt.targets.end(),
                                                                     [](int32_t t) { return t != -1; })));
  const int64_t B = bt.B, T = begin_split(bt.T), rows = B * T, H = c.hidden;
  Batch part;
  if (split_on()) part = local_batch(bt);
  const Batch& b = split_on() ? part : bt;
  carve(B, T, train, true);
  att_->ms = dense_ms_ = 0;
  set_positions(B, T, 0);
  nn::embedding_fwd(b_->S[0].x, b.ids.data(), p(L_->embed), rows, H, c.vocab);
  forward_layers(B, T, bt.lengths, posbuf_.data(), false, train, step, bt.first);
  final_norm(rows, 0);
  StepResult res;
  const float scale = divisor > 0 ? static_cast<float>(1.0 / divisor) : 0.f;
  token_loss(b, b_->xf, b_->dt2, L_->lm_head, -1, train, scale, res);
  if (!train) return timed(res, t0);
  nn::rmsnorm_bwd(b_->dx, g(L_->norm), b_->dt2, b_->xl, p(L_->norm), b_->fr, rows, H);
  backward_layers(B, T, bt.lengths, posbuf_.data(), step, bt.first);
  nn::embedding_bwd(g(L_->embed), b.ids.data(), b_->dx, rows, H, c.vocab);
  other_grads_ready(L_->layers.front().begin, L_->layers.back().end);
  return timed(res, t0);
}

Tensor Decoder::forward(std::span<const int32_t> ids, int64_t B, int64_t T, std::span<const int32_t> lengths) {
  const ModelConfig& c = cfg_;
  check(B >= 1 && T >= 1 && static_cast<int64_t>(ids.size()) == B * T, "decoder: ids must hold B x T = ",
        B, " x ", T, " tokens, got ", ids.size());
  check(lengths.empty() || static_cast<int64_t>(lengths.size()) == B, "decoder: lengths must have B = ", B, " entries");
  for (int32_t len : lengths) check(len >= 0 && len <= T, "decoder: every length must be in [0, T = ", T, "], got ", len);
  T = begin_split(T);
  std::vector<int32_t> local_ids;
  if (split_on()) {  // this rank's positions
    take_local(ids, B, local_ids);
    ids = local_ids;
  }
  const ThreadLimit threads(threads_for_flops(inference_flops(B * T, 0.5 * static_cast<double>(T))));
  carve(B, T, false, false);
  att_->ms = dense_ms_ = 0;
  nn::embedding_fwd(b_->S[0].x, ids.data(), p(L_->embed), B * T, c.hidden, c.vocab);
  set_positions(B, T, 0);
  forward_layers(B, T, lengths, posbuf_.data(), false, false, 0, 0);
  final_norm(B * T, 0);
  Tensor out(Shape{B, T, c.vocab});  // (B, n, vocab): this rank's positions when split
  inference_logits(out.data(), B * T);
  return out;
}

void Decoder::start(int64_t capacity) {
  check(capacity >= 1, "decoder: cache capacity must be >= 1, got ", capacity);
  const ModelConfig& c = cfg_;
  for (int64_t l = 0; l < c.layers; ++l)
    check(!att_->at(l).capabilities().shared_qk, "decoder: attention of layer ", l, ": '", att_->specs()[static_cast<size_t>(l)],
          "' takes the queries as its keys, which a KV cache does not hold; it cannot decode token by token");
  // A layer whose attention builds on earlier queries (causal clustered) keeps them in its cache,
  // so that decoding computes what a prefill of the same tokens computes.
  auto query_heads = [&](int64_t l) { return att_->at(l).capabilities().decode_queries ? c.heads : 0; };
  bool fits = cache_.size() == static_cast<size_t>(c.layers);
  for (int64_t l = 0; fits && l < c.layers; ++l)
    fits = cache_[static_cast<size_t>(l)].capacity() >= capacity && cache_[static_cast<size_t>(l)].query_heads() == query_heads(l);
  if (!fits) {
    cache_.clear();
    for (int64_t l = 0; l < c.layers; ++l) cache_.emplace_back(1, c.kv_heads, capacity, c.head_dim, c.head_dim, query_heads(l));
  }
  for (KVCache& kc : cache_) kc.clear();
  pos_ = 0;
  split_prefill_ = false;
}

std::vector<float> Decoder::prefill(std::span<const int32_t> ids) {
  check(!cache_.empty(), "decoder: call start() before prefill()");
  const int64_t T = static_cast<int64_t>(ids.size());
  check(T >= 1, "decoder: prefill needs at least one token");
  check(!split_prefill_, "decoder: the prompt was prefilled with the sequence split across ranks, which leaves ",
        "the KV cache spread over them; decoding after it is not supported (start() again, or prefill in one process)");
  if (split_on()) return split_prefill(ids);
  check(pos_ + T <= cache_[0].capacity(), "decoder: ", pos_ + T, " positions exceed the cache capacity ", cache_[0].capacity());
  // A decode step (T = 1) or a short prompt: on one thread, or as many as the work pays for.
  const ThreadLimit threads(threads_for_flops(inference_flops(T, static_cast<double>(pos_) + 0.5 * static_cast<double>(T))));
  carve(1, T, false, false);
  att_->ms = dense_ms_ = 0;
  nn::embedding_fwd(b_->S[0].x, ids.data(), p(L_->embed), T, cfg_.hidden, cfg_.vocab);
  (void)begin_split(T);
  set_positions(1, T, pos_);
  forward_layers(1, T, {}, posbuf_.data(), true, false, 0, 0);
  final_norm(T, T - 1);
  std::vector<float> out(static_cast<size_t>(cfg_.vocab));
  inference_logits(out.data(), 1);
  pos_ += T;
  return out;
}

std::vector<float> Decoder::step(int32_t id) { return prefill(std::span<const int32_t>(&id, 1)); }

void Decoder::set_positions(int64_t B, int64_t T, int64_t offset) {
  posbuf_.resize(static_cast<size_t>(B * T));
  for (int64_t r = 0; r < B * T; ++r)
    posbuf_[static_cast<size_t>(r)] = static_cast<int32_t>(offset + local_pos_[static_cast<size_t>(r % T)]);
}

std::vector<float> Decoder::split_prefill(std::span<const int32_t> ids) {
  check(pos_ == 0, "decoder: a prefill with the sequence split across ranks starts at position 0 (call start())");
  const int64_t Tg = static_cast<int64_t>(ids.size());
  const int64_t T = begin_split(Tg);
  std::vector<int32_t> local_ids;
  take_local(ids, 1, local_ids);
  carve(1, T, false, false);
  att_->ms = dense_ms_ = 0;
  nn::embedding_fwd(b_->S[0].x, local_ids.data(), p(L_->embed), T, cfg_.hidden, cfg_.vocab);
  set_positions(1, T, 0);
  forward_layers(1, T, {}, posbuf_.data(), false, false, 0, 0);
  // The zig-zag layout gives rank 0 the last chunk: its last row is the prompt's last position.
  std::vector<float> out(static_cast<size_t>(cfg_.vocab));
  if (sp_->rank() == 0) {
    final_norm(T, T - 1);
    inference_logits(out.data(), 1);
  }
  sp_->broadcast(out.data(), sizeof(float) * out.size(), 0);
  pos_ = Tg;
  split_prefill_ = true;
  return out;
}

}  // namespace clattn
