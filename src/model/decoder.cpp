// The decoder: LLaMA family (RMSNorm, rotate-half RoPE, grouped-query attention, SwiGLU, tied or
// untied output layer), one forward for inference, training and KV-cache decoding, and one
// backward. A layer, with drop() the residual dropout of training:
//   a = RMS1(x)   q|k|v = a·Wqkv, q and k rotated   u1 = x + drop(attn(q, k, v)·Wo)
//   f = RMS2(u1)  g|u = f·Wgu                       x' = u1 + drop((silu(g) ∘ u)·Wdown)
// Each family is a recipe (kDecoderRecipes below), the loop reading its parts: GPT-2 (model_type
// gpt2) is the same loop with LayerNorms (gain and bias) for the RMSNorms, biases on every linear
// layer, learned positions added to the embeddings instead of rotation, and h = gelu_tanh(f·Wfc +
// bfc) for the SwiGLU; its Conv1D matrices, stored (in, out), are held (out, in) like every other
// (ModelImpl::add's `transposed`), so q|k|v is still one GEMM. A new family is a table entry, its
// config.json reader (config.cpp) and a loader test.
// Activations are token-major (rows = B·T); attention reads them through strided (B, H, T, D)
// views. Inference keeps one set of buffers for every layer and updates the residual stream in
// place; training keeps each layer's x, a, qkv, attention output, u1, f, g|u and 1/rms.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>

#include "clattn/error.h"
#include "clattn/model.h"
#include "clattn/nn.h"
#include "clattn/threads.h"
#include "clattn/rng.h"
#include "model/layer_attention.h"
#include "model/model_impl.h"
#include "model/model_internal.h"
#include "model/weights.h"

namespace clattn {

using model::ms_now;

// A decoder family as data: its layers' parts and its checkpoint's tensor names.
struct DecoderRecipe {
  std::string_view model_type;
  bool layer_norm;         // LayerNorm (gain and bias); else RMSNorm (gain)
  bool learned_positions;  // a (max_positions, hidden) table added to the embeddings; else RoPE on q, k
  bool gelu_mlp;           // h = gelu_tanh(f·Wfc + b); else SwiGLU over gate | up
  bool biases;             // every linear layer has one
  bool conv1d;             // matrices stored (in, out) (GPT-2's Conv1D), held (out, in)
  bool tied_head;          // the output layer is the embedding, always
  float eps;               // the norms' epsilon when config.json gives none
  // Tensor names, without ".weight" / ".bias": a checkpoint may wrap them all in `wrapper`; a
  // layer's are `layer` + its index + "." + each part's. q alone (k, v empty) is one fused q|k|v
  // matrix; gate alone (up empty) the GELU MLP's first matrix.
  std::string_view wrapper, embed, pos, layer, in_norm, q, k, v, o, post_norm, gate, up, down, norm, lm_head;
};

constexpr DecoderRecipe kDecoderRecipes[] = {
    {.model_type = "llama", .layer_norm = false, .learned_positions = false, .gelu_mlp = false, .biases = false,
     .conv1d = false, .tied_head = false, .eps = 1e-6f, .wrapper = "", .embed = "model.embed_tokens", .pos = "",
     .layer = "model.layers.", .in_norm = "input_layernorm", .q = "self_attn.q_proj", .k = "self_attn.k_proj",
     .v = "self_attn.v_proj", .o = "self_attn.o_proj", .post_norm = "post_attention_layernorm",
     .gate = "mlp.gate_proj", .up = "mlp.up_proj", .down = "mlp.down_proj", .norm = "model.norm",
     .lm_head = "lm_head"},
    // GPT2LMHeadModel stores the model under "transformer."; GPT2Model (the original gpt2 files) bare.
    {.model_type = "gpt2", .layer_norm = true, .learned_positions = true, .gelu_mlp = true, .biases = true,
     .conv1d = true, .tied_head = true, .eps = 1e-5f, .wrapper = "transformer.", .embed = "wte", .pos = "wpe",
     .layer = "h.", .in_norm = "ln_1", .q = "attn.c_attn", .k = "", .v = "", .o = "attn.c_proj", .post_norm = "ln_2",
     .gate = "mlp.c_fc", .up = "", .down = "mlp.c_proj", .norm = "ln_f", .lm_head = ""},
};

const DecoderRecipe& decoder_recipe(const std::string& model_type) {
  std::string known;
  for (const DecoderRecipe& r : kDecoderRecipes) {
    if (r.model_type == model_type) return r;
    known += (known.empty() ? "" : " or ") + std::string(r.model_type);
  }
  fail("decoder: model_type must be ", known, ", got \"", model_type, "\"");
}

struct DecoderImpl::Layout {
  struct Layer {
    int64_t in_norm, wqkv, wo, post_norm, wgu, down;
    int64_t in_norm_b = -1, bqkv = -1, bo = -1, post_norm_b = -1, bgu = -1, bdown = -1;  // GPT-2
    int64_t begin, end;  // the layer's range of the flat buffer
  };
  std::vector<Layer> layers;
  int64_t embed = -1, pos = -1, norm = -1, norm_b = -1, lm_head = -1;
};

struct DecoderImpl::Bufs : ModelImpl::ArenaPlan {
  struct Saved {  // per layer (training), or one set every layer shares (inference)
    // r1, r2: 1/rms (rows), or LayerNorm's mean then 1/std (2·rows) for GPT-2.
    float *x, *xn1, *r1, *qkv, *ao, *u1, *xn2, *r2, *gu;
  };
  std::vector<Saved> S;
  float *xl = nullptr, *xf = nullptr, *fr = nullptr;  // last layer's output, final norm output, its 1/rms
  float *dx = nullptr, *dt = nullptr, *dt2 = nullptr, *dao = nullptr, *dqkv = nullptr, *dgu = nullptr;
  float *sbuf = nullptr;  // (rows, F) SwiGLU output, then its gradient
  float *keep_ffn = nullptr, *keep_att = nullptr;  // (rows, H) each: the first layer's held dy (hold_first_layer)
};

DecoderImpl::DecoderImpl(const ModelConfig& cfg_in, const CheckpointNames* ckpt, WeightType weights)
    : ModelImpl(cfg_in, ckpt, weights), layout_(std::make_unique<Layout>()), bufs_(std::make_unique<Bufs>()) {
  ModelConfig& c = cfg_;
  head_ = TaskKind::lm;
  if (c.model_type.empty()) c.model_type = "llama";
  recipe_ = &decoder_recipe(c.model_type);
  const DecoderRecipe& R = *recipe_;
  const bool fused_qkv = R.k.empty();
  if (c.kv_heads == 0) c.kv_heads = c.heads;
  if (c.head_dim == 0 && c.heads > 0) c.head_dim = c.hidden / c.heads;
  check(c.hidden >= 1 && c.layers >= 1 && c.heads >= 1 && c.ffn >= 1 && c.vocab >= 1 && c.head_dim >= 1 &&
            c.kv_heads >= 1 && c.heads % c.kv_heads == 0,
        "decoder: sizes must be >= 1 (hidden, layers, heads, ffn, vocab), heads a multiple of kv_heads");
  check(R.learned_positions || c.head_dim % 2 == 0, "decoder: head_dim must be even for rotary embeddings, got ",
        c.head_dim);
  check(!R.learned_positions || c.max_positions >= 1, "decoder: ", c.model_type,
        " needs its learned positions' count (n_positions >= 1)");
  check(!fused_qkv || (c.kv_heads == c.heads && c.heads * c.head_dim == c.hidden), "decoder: ", c.model_type,
        "'s fused q|k|v matrix needs n_head x head_dim = n_embd, without grouped heads");
  check(!R.tied_head || c.tie_embeddings, "decoder: ", c.model_type,
        "'s output layer is tied to the embeddings (tie_word_embeddings true)");
  if (!(c.eps > 0)) c.eps = R.eps;
  if (!(c.rope_theta > 0)) c.rope_theta = 10000.f;
  const int64_t H = c.hidden, F = c.ffn, Q = c.heads * c.head_dim, KV = c.kv_heads * c.head_dim;
  Layout& L = *layout_;
  auto name = [](std::string_view a, std::string_view b, const char* what) { return std::string(a) + std::string(b) + what; };
  // A norm's gain, and with LayerNorm its bias: the bias's offset in *bias.
  auto norm = [&](const std::string& n, int64_t* bias) {
    const int64_t gain = add(n + ".weight", {H}, Init::one);
    if (R.layer_norm) *bias = add(n + ".bias", {H}, Init::zero);
    return gain;
  };
  // A linear map's weight (out, in) from `parts` stacked in order (one GEMM), and with biases theirs.
  auto linear = [&](const std::string& p, std::initializer_list<std::pair<std::string_view, int64_t>> parts, int64_t in,
                    int64_t* bias) {
    int64_t w = -1;
    for (const auto& [part, out] : parts) {
      const int64_t o = add_linear(name(p, part, ".weight"), {out, in}, R.conv1d);
      if (w < 0) w = o;
    }
    if (R.biases)
      for (const auto& [part, out] : parts) {
        const int64_t o = add(name(p, part, ".bias"), {out}, Init::zero);
        if (*bias < 0) *bias = o;
      }
    return w;
  };
  L.embed = add(name(R.embed, "", ".weight"), {c.vocab, H}, Init::normal);
  if (R.learned_positions) L.pos = add(name(R.pos, "", ".weight"), {c.max_positions, H}, Init::normal);
  for (int64_t l = 0; l < c.layers; ++l) {
    Layout::Layer y;
    const std::string p = std::string(R.layer) + std::to_string(l) + ".";
    y.in_norm = norm(p + std::string(R.in_norm), &y.in_norm_b);
    // q, k, v adjacent (one (Q + 2KV, H) matrix: one GEMM), and gate, up (one (2F, H) matrix).
    y.wqkv = fused_qkv ? linear(p, {{R.q, Q + 2 * KV}}, H, &y.bqkv)
                       : linear(p, {{R.q, Q}, {R.k, KV}, {R.v, KV}}, H, &y.bqkv);
    y.wo = linear(p, {{R.o, H}}, Q, &y.bo);
    y.post_norm = norm(p + std::string(R.post_norm), &y.post_norm_b);
    y.wgu = R.gelu_mlp ? linear(p, {{R.gate, F}}, H, &y.bgu) : linear(p, {{R.gate, F}, {R.up, F}}, H, &y.bgu);
    y.down = linear(p, {{R.down, H}}, F, &y.bdown);
    y.begin = y.in_norm;
    y.end = param_count();
    L.layers.push_back(y);
    if (l == 0) check_layers_fit(y.begin);
  }
  L.norm = norm(std::string(R.norm), &L.norm_b);
  // A tied output layer is the embedding, which stays f32 (one row of it is read per token).
  L.lm_head = c.tie_embeddings ? L.embed : add_linear(name(R.lm_head, "", ".weight"), {c.vocab, H});
  allocate();
  att_ = std::make_unique<LayerAttention>(c.layers, true, c.kv_heads != c.heads);
  att_->set_plan("full");
}

DecoderImpl::~DecoderImpl() = default;

std::unique_ptr<DecoderImpl> DecoderImpl::for_checkpoint(ModelConfig cfg, const Weights& w, const LoadOptions& opt) {
  check(!opt.head || *opt.head == TaskKind::lm, "model '", w.dir(), "': a decoder takes the lm head");
  // GPT2LMHeadModel stores the model under "transformer."; GPT2Model (the original gpt2 files)
  // stores it bare.
  CheckpointNames names{&w, "", {}};
  const DecoderRecipe& r = decoder_recipe(cfg.model_type.empty() ? "llama" : cfg.model_type);
  if (!r.wrapper.empty() && w.has(std::string(r.wrapper) + std::string(r.embed) + ".weight")) names.prefix = r.wrapper;
  std::unique_ptr<DecoderImpl> d(new DecoderImpl(cfg, &names, opt.weights));
  d->init(opt.seed);
  return d;
}

// ---- activations

DecoderImpl::Bufs DecoderImpl::plan(int64_t B, int64_t T, bool train, bool head, float* base) const {
  const ModelConfig& c = cfg_;
  const int64_t rows = B * T, H = c.hidden, F = c.ffn, Q = c.heads * c.head_dim, QKV = Q + 2 * c.kv_heads * c.head_dim;
  const int64_t nstat = recipe_->layer_norm ? 2 * rows : rows;
  model::Carver a(base);
  Bufs b;
  if (train) {
    b.S.resize(static_cast<size_t>(c.layers));
    for (Bufs::Saved& s : b.S) {
      s.x = a.take(rows * H);      // (rows, H) layer input
      s.xn1 = a.take(rows * H);    // (rows, H) RMSNorm output
      s.r1 = a.take(nstat);        // (rows) 1/rms, or (2, rows) LayerNorm's mean | 1/std
      s.qkv = a.take(rows * QKV);  // (rows, Q + 2KV) q | k | v, q and k rotated
      s.ao = a.take(rows * Q);     // (rows, Q) attention output
      s.u1 = a.take(rows * H);     // (rows, H) residual after attention
      s.xn2 = a.take(rows * H);
      s.r2 = a.take(nstat);
      s.gu = a.take(rows * 2 * F); // (rows, 2F) gate | up; GPT-2: (rows, F) c_fc's output
    }
    b.xl = a.take(rows * H);
    b.xf = a.take(rows * H);
    b.fr = a.take(nstat);
    b.dx = a.take(rows * H);       // (rows, H) gradient of the residual stream
    b.dt = a.take(rows * H);
    b.dt2 = a.take(rows * H);
    b.dao = a.take(rows * Q);      // (rows, Q)
    b.dqkv = a.take(rows * QKV);   // (rows, Q + 2KV)
    b.dgu = a.take(rows * 2 * F);  // (rows, 2F)
    b.dhs = a.take(rows * H);
    b.keep_ffn = a.take(rows * H);
    b.keep_att = a.take(rows * H);
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
  b.floats = a.used();
  return b;
}

int64_t DecoderImpl::plan_floats(int64_t B, int64_t T, bool train, bool head) const {
  return plan(B, T, train, head, nullptr).floats;
}

const ModelImpl::ArenaPlan& DecoderImpl::carve_into(float* base, int64_t B, int64_t T, bool train, bool head) {
  *bufs_ = plan(B, T, train, head, base);
  return *bufs_;
}

double DecoderImpl::forward_bytes(int64_t B, int64_t T, int64_t cache_positions) const {
  if (split_on()) T = sequence_split(T).local_rows(seq_.comm->rank());
  const ModelConfig& c = cfg_;
  const AttentionDims d{B, c.heads, c.kv_heads, T, cache_positions > 0 ? cache_positions : T, c.head_dim, c.head_dim};
  // The arena, the returned logits, the largest attention workspace; caches hold K twice (rows
  // and panels) and V once.
  const double KV = static_cast<double>(c.kv_heads * c.head_dim);
  const double cache = cache_positions <= 0            ? 0
                       : kv_type_ == KVCacheType::f32 ? 4.0 * static_cast<double>(c.layers * cache_positions) * (3.0 * KV + 64)
                                                       : 2.0 * static_cast<double>(c.layers * cache_positions) * 2.0 * KV;
  return 4.0 * static_cast<double>(plan_floats(B, T, false, false)) + 4.0 * static_cast<double>(B * T * c.vocab) + att_->workspace_bytes(d, false) + cache;
}

// ---- forward

void DecoderImpl::forward_layers(int64_t B, int64_t T, std::span<const int32_t> lengths, const int32_t* pos, bool use_cache,
                             bool train, uint64_t step, int64_t first) {
  const ModelConfig& c = cfg_;
  const int64_t rows = B * T, H = c.hidden, F = c.ffn, nh = c.heads, kvh = c.kv_heads, hd = c.head_dim;
  const int64_t Q = nh * hd, KV = kvh * hd, QKV = Q + 2 * KV, GU = recipe_->gelu_mlp ? F : 2 * F;
  const bool drop = train && dropout_ > 0;
  const std::span<const int32_t> lens = model::padding_lengths(lengths, seq_.T);  // global lengths
  auto hv = [&](float* base, int64_t heads, int64_t ld) { return model::heads_view(base, B, heads, T, hd, ld); };
  auto bias = [&](int64_t off) -> const float* { return off >= 0 ? p(off) : nullptr; };
  Bufs& b = *bufs_;
  for (int64_t l = 0; l < c.layers; ++l) {
    const Layout::Layer& y = layout_->layers[static_cast<size_t>(l)];
    Bufs::Saved& s = b.S[static_cast<size_t>(l)];
    float* xnext = l + 1 < c.layers ? b.S[static_cast<size_t>(l + 1)].x : b.xl;
    norm_fwd(s.xn1, s.x, y.in_norm, y.in_norm_b, rows, s.r1);
    lin(s.qkv, QKV, s.xn1, H, y.wqkv, bias(y.bqkv), rows, H, QKV);
    if (!recipe_->learned_positions) {
      nn::rope_fwd(s.qkv, QKV, hd, pos, rows, nh, hd, c.rope_theta);
      nn::rope_fwd(s.qkv + Q, QKV, hd, pos, rows, kvh, hd, c.rope_theta);
    }
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
    // u1 = x + drop(ao·Wo + bo)
    if (drop) {
      lin(b.dt, H, s.ao, Q, y.wo, bias(y.bo), rows, Q, H);
      residual_dropout(s.u1, s.x, b.dt, B, T, H, l, 0, step, first);
    } else {
      lin(s.u1, H, s.ao, Q, y.wo, bias(y.bo), rows, Q, H, s.x);
    }
    norm_fwd(s.xn2, s.u1, y.post_norm, y.post_norm_b, rows, s.r2);
    lin(s.gu, GU, s.xn2, H, y.wgu, bias(y.bgu), rows, H, GU);
    if (recipe_->gelu_mlp) nn::gelu_fwd(b.sbuf, s.gu, rows * F, nn::Gelu::tanh);
    else nn::swiglu_rows_fwd(b.sbuf, F, s.gu, 2 * F, rows, F);
    // x' = u1 + drop(s·Wdown + bdown)
    if (drop) {
      lin(b.dt, H, b.sbuf, F, y.down, bias(y.bdown), rows, F, H);
      residual_dropout(xnext, s.u1, b.dt, B, T, H, l, 1, step, first);
    } else {
      lin(xnext, H, b.sbuf, F, y.down, bias(y.bdown), rows, F, H, s.u1);
    }
  }
}

void DecoderImpl::final_norm(int64_t rows, int64_t from) {
  const int64_t H = cfg_.hidden;
  float* xf = bufs_->xf + from * H;
  // Statistics are kept only by training, which normalises every row (from = 0).
  check(from == 0 || bufs_->fr == nullptr, "decoder: internal: a partial final norm keeps no statistics");
  norm_fwd(xf, bufs_->xl + from * H, layout_->norm, layout_->norm_b, rows - from, bufs_->fr);
  head_ws_.xf = xf;
  head_ws_.rows_xf = rows - from;
}

void DecoderImpl::inference_logits(float* out, int64_t n) {
  lin(out, cfg_.vocab, head_ws_.xf, cfg_.hidden, layout_->lm_head, nullptr, n, cfg_.hidden, cfg_.vocab);
}

void DecoderImpl::norm_fwd(float* y, const float* x, int64_t gain, int64_t bias, int64_t rows, float* stat) {
  if (recipe_->layer_norm) nn::layernorm_fwd(y, x, p(gain), p(bias), rows, cfg_.hidden, cfg_.eps, stat, stat ? stat + rows : nullptr);
  else nn::rmsnorm_fwd(y, x, p(gain), rows, cfg_.hidden, cfg_.eps, stat);
}

void DecoderImpl::norm_bwd(float* dx, int64_t gain, int64_t bias, const float* dy, const float* x, const float* stat,
                       int64_t rows, bool accumulate) {
  if (recipe_->layer_norm) nn::layernorm_bwd(dx, g(gain), g(bias), dy, x, p(gain), stat, stat + rows, rows, cfg_.hidden, accumulate);
  else nn::rmsnorm_bwd(dx, g(gain), dy, x, p(gain), stat, rows, cfg_.hidden, accumulate);
}

void DecoderImpl::embed(const int32_t* ids, int64_t rows) {
  const int64_t H = cfg_.hidden;
  float* x = bufs_->S[0].x;  // (rows, H)
  nn::embedding_fwd(x, ids, p(layout_->embed), rows, H, cfg_.vocab);
  if (!recipe_->learned_positions) return;
  const int32_t last = *std::max_element(posbuf_.begin(), posbuf_.begin() + rows);
  check(last < cfg_.max_positions, "decoder: position ", last, " is past GPT-2's ", cfg_.max_positions,
        " learned positions (n_positions)");
  const float* wpe = p(layout_->pos);
  model::for_rows(rows, H, [&](int64_t r) {
    const float* pr = wpe + static_cast<int64_t>(posbuf_[static_cast<size_t>(r)]) * H;
    for (int64_t k = 0; k < H; ++k) x[r * H + k] += pr[k];
  });
}

void DecoderImpl::embed_backward(const int32_t* ids, int64_t B, int64_t T, const float* dx) {
  const int64_t H = cfg_.hidden;
  nn::embedding_bwd(g(layout_->embed), ids, dx, B * T, H, cfg_.vocab);
  if (!recipe_->learned_positions) return;
  float* dpos = g(layout_->pos);
  model::for_rows(T, B * H, [&](int64_t t) {  // each position's row summed over the batch in order
    float* row = dpos + static_cast<int64_t>(posbuf_[static_cast<size_t>(t)]) * H;
    for (int64_t s = 0; s < B; ++s)
      for (int64_t k = 0; k < H; ++k) row[k] += dx[(s * T + t) * H + k];
  });
}

// ---- backward

void DecoderImpl::backward_layers(int64_t B, int64_t T, std::span<const int32_t> lengths, const int32_t* pos, uint64_t step,
                              int64_t first) {
  const ModelConfig& c = cfg_;
  const int64_t rows = B * T, H = c.hidden, F = c.ffn, nh = c.heads, kvh = c.kv_heads, hd = c.head_dim;
  const int64_t Q = nh * hd, KV = kvh * hd, QKV = Q + 2 * KV, GU = recipe_->gelu_mlp ? F : 2 * F;
  const bool drop = dropout_ > 0;
  const std::span<const int32_t> lens = model::padding_lengths(lengths, seq_.T);  // global lengths
  auto hv = [&](float* base, int64_t heads, int64_t ld) { return model::heads_view(base, B, heads, T, hd, ld); };
  Bufs& b = *bufs_;
  float* dx = b.dx;  // (rows, H) gradient of the residual stream
  held_.clear();
  for (int64_t l = c.layers - 1; l >= 0; --l) {
    const Layout::Layer& y = layout_->layers[static_cast<size_t>(l)];
    Bufs::Saved& s = b.S[static_cast<size_t>(l)];
    const bool hold = l == 0 && hold_first_layer();
    // x' = u1 + drop(act(f·Wgu + bgu)·Wdown + bdown)
    const float* dff = dx;
    if (drop) {
      dropout_grad(b.dt, dx, B, T, H, l, 1, step, first);
      dff = b.dt;
    }
    if (recipe_->gelu_mlp) nn::gelu_fwd(b.sbuf, s.gu, rows * F, nn::Gelu::tanh);
    else nn::swiglu_rows_fwd(b.sbuf, F, s.gu, 2 * F, rows, F);
    lin_bwd_held(hold, b.dgu, GU, {y.down, y.bdown, dff, H, b.sbuf, F, rows, F, H}, p(y.down), b.keep_ffn);
    // dgu holds d(act) in the first F columns of each row. SwiGLU's backward writes dgate over
    // it and dup beside it; GELU's takes it in place.
    if (recipe_->gelu_mlp) nn::gelu_bwd(b.dgu, b.dgu, s.gu, rows * F, nn::Gelu::tanh);
    else nn::swiglu_rows_bwd(b.dgu, 2 * F, b.dgu, 2 * F, s.gu, 2 * F, rows, F);
    lin_bwd_held(hold, b.dt2, H, {y.wgu, y.bgu, b.dgu, GU, s.xn2, H, rows, H, GU}, p(y.wgu), nullptr);
    // f = norm2(u1): du1 = dx + norm2'(df)
    norm_bwd(dx, y.post_norm, y.post_norm_b, b.dt2, s.u1, s.r2, rows, true);
    // u1 = x + drop(attn·Wo + bo)
    const float* dat = dx;
    if (drop) {
      dropout_grad(b.dt, dx, B, T, H, l, 0, step, first);
      dat = b.dt;
    }
    lin_bwd_held(hold, b.dao, Q, {y.wo, y.bo, dat, H, s.ao, Q, rows, Q, H}, p(y.wo), b.keep_att);
    std::memset(b.dqkv, 0, sizeof(float) * static_cast<size_t>(rows * QKV));
    const AttentionInputs ai = att_->inputs(l, hv(s.qkv, nh, QKV), hv(s.qkv + Q, kvh, QKV), hv(s.qkv + Q + KV, kvh, QKV),
                                            lens, step, true);
    att_->backward(l, ai, hv(s.ao, nh, Q), hv(b.dao, nh, Q), hv(b.dqkv, nh, QKV), hv(b.dqkv + Q, kvh, QKV),
                   hv(b.dqkv + Q + KV, kvh, QKV));
    if (!recipe_->learned_positions) {
      nn::rope_bwd(b.dqkv, QKV, hd, pos, rows, nh, hd, c.rope_theta);
      nn::rope_bwd(b.dqkv + Q, QKV, hd, pos, rows, kvh, hd, c.rope_theta);
    }
    // a = norm1(x): dx = du1 + norm1'(da)
    lin_bwd_held(hold, b.dt2, H, {y.wqkv, y.bqkv, b.dqkv, QKV, s.xn1, H, rows, H, QKV}, p(y.wqkv), nullptr);
    norm_bwd(dx, y.in_norm, y.in_norm_b, b.dt2, s.x, s.r1, rows, true);
    if (!hold) layer_grads_ready(y.begin, y.end);
  }
}

// ---- entry points

StepResult DecoderImpl::forward_backward(const Batch& bt, bool train, uint64_t step, double divisor) {
  const double t0 = ms_now();
  check_batch(bt);
  if (train) {
    check_f32_weights("training");
    att_->check_trainable();
    (void)grads();
  }
  // With the sequence split: this rank's positions (zig-zag), and (unless given) the divisor of
  // the whole batch, which no rank counts alone.
  if (split_on() && divisor <= 0)
    divisor = static_cast<double>(std::max<int64_t>(1, std::count_if(bt.targets.begin(), bt.targets.end(),
                                                                     [](int32_t t) { return t != -1; })));
  const int64_t B = bt.B, T = begin_split(bt.T), rows = B * T;
  Batch part;
  if (split_on()) part = local_batch(bt);
  const Batch& b = split_on() ? part : bt;
  carve(B, T, train, true);
  att_->ms = dense_ms_ = 0;
  set_positions(B, T, 0);
  embed(b.ids.data(), rows);
  forward_layers(B, T, bt.lengths, posbuf_.data(), false, train, step, bt.first);
  final_norm(rows, 0);
  StepResult res;
  const float scale = divisor > 0 ? static_cast<float>(1.0 / divisor) : 0.f;
  token_loss(b, bufs_->xf, bufs_->dt2, layout_->lm_head, -1, train, scale, res);
  if (!train) return timed(res, t0);
  norm_bwd(bufs_->dx, layout_->norm, layout_->norm_b, bufs_->dt2, bufs_->xl, bufs_->fr, rows, false);
  backward_layers(B, T, bt.lengths, posbuf_.data(), step, bt.first);
  embed_backward(b.ids.data(), B, T, bufs_->dx);
  other_grads_ready(layout_->layers.front().begin, layout_->layers.back().end);
  release_weights(layout_->layers.front().begin, layout_->layers.front().end);
  return timed(res, t0);
}

Tensor DecoderImpl::forward(std::span<const int32_t> ids, int64_t B, int64_t T, std::span<const int32_t> lengths) {
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
  set_positions(B, T, 0);
  embed(ids.data(), B * T);
  forward_layers(B, T, lengths, posbuf_.data(), false, false, 0, 0);
  final_norm(B * T, 0);
  Tensor out(Shape{B, T, c.vocab});  // (B, n, vocab): this rank's positions when split
  inference_logits(out.data(), B * T);
  return out;
}

void DecoderImpl::start(int64_t capacity) {
  check(capacity >= 1, "decoder: cache capacity must be >= 1, got ", capacity);
  const ModelConfig& c = cfg_;
  for (int64_t l = 0; l < c.layers; ++l)
    check(!att_->at(l).capabilities().shared_qk, "decoder: attention of layer ", l, ": '", att_->specs()[static_cast<size_t>(l)],
          "' takes the queries as its keys, which a KV cache does not hold; it cannot decode token by token");
  if (kv_type_ != KVCacheType::f32)
    for (int64_t l = 0; l < c.layers; ++l)
      check(att_->at(l).capabilities().half_cache, "decoder: attention of layer ", l, ": '",
            att_->specs()[static_cast<size_t>(l)], "' reads the cache's keys as f32 rows; a ",
            kv_cache_type_name(kv_type_), " KV cache is read by full, local and causal clustered attention only (use an f32 cache)");
  // A layer whose attention builds on earlier queries (causal clustered) keeps them in its cache,
  // so that decoding computes what a prefill of the same tokens computes.
  auto query_heads = [&](int64_t l) { return att_->at(l).capabilities().decode_queries ? c.heads : 0; };
  bool fits = cache_.size() == static_cast<size_t>(c.layers);
  for (int64_t l = 0; fits && l < c.layers; ++l) {
    const KVCache& kc = cache_[static_cast<size_t>(l)];
    fits = kc.capacity() >= capacity && kc.query_heads() == query_heads(l) && kc.type() == kv_type_;
  }
  if (!fits) {
    cache_.clear();
    for (int64_t l = 0; l < c.layers; ++l)
      cache_.emplace_back(1, c.kv_heads, capacity, c.head_dim, c.head_dim, query_heads(l), kv_type_);
  }
  for (KVCache& kc : cache_) kc.clear();
  pos_ = 0;
  split_prefill_ = false;
}

std::vector<float> DecoderImpl::prefill(std::span<const int32_t> ids) {
  check(!cache_.empty(), "decoder: call start() before prefill()");
  const int64_t T = static_cast<int64_t>(ids.size());
  check(T >= 1, "decoder: prefill needs at least one token");
  check(!split_prefill_, "decoder: the prompt was prefilled with the sequence split across ranks, which leaves ",
        "the KV cache spread over them; decoding after it is not supported (start() again, or prefill in one process)");
  if (split_on()) return split_prefill(ids);
  check(pos_ + T <= cache_[0].capacity(), "decoder: ", pos_ + T, " positions exceed the cache capacity ", cache_[0].capacity());
  check(!recipe_->learned_positions || pos_ + T <= cfg_.max_positions, "decoder: ", pos_ + T, " positions exceed ",
        cfg_.model_type, "'s ", cfg_.max_positions, " learned positions (n_positions)");
  // A decode step (T = 1) or a short prompt: on one thread, or as many as the work pays for.
  const ThreadLimit threads(threads_for_flops(inference_flops(T, static_cast<double>(pos_) + 0.5 * static_cast<double>(T))));
  carve(1, T, false, false);
  att_->ms = dense_ms_ = 0;
  (void)begin_split(T);
  set_positions(1, T, pos_);
  embed(ids.data(), T);
  forward_layers(1, T, {}, posbuf_.data(), true, false, 0, 0);
  final_norm(T, T - 1);
  std::vector<float> out(static_cast<size_t>(cfg_.vocab));
  inference_logits(out.data(), 1);
  pos_ += T;
  return out;
}

std::vector<float> DecoderImpl::step(int32_t id) { return prefill(std::span<const int32_t>(&id, 1)); }

bool DecoderImpl::can_shift() const { return !recipe_->learned_positions; }

void DecoderImpl::shift(int64_t keep, int64_t discard) {
  check(!cache_.empty(), "decoder: call start() and prefill() before shift()");
  check(!split_prefill_, "decoder: the prompt was prefilled with the sequence split across ranks; its KV cache is spread "
        "over them and cannot shift");
  check(can_shift(), "decoder: ", cfg_.model_type, " adds learned absolute positions to its input, so "
        "every layer's cached keys and values carry the positions they were computed at and no rotation moves them; "
        "encode the window again instead (start() and prefill() of it: generate's reencode shift)");
  check(keep >= 0 && discard >= 1 && keep + discard <= pos_, "decoder: shift(keep ", keep, ", discard ", discard,
        ") needs keep >= 0, discard >= 1 and keep + discard within the ", pos_, " cached positions");
  // RoPE rotations compose (R(p)·R(−d) = R(p − d)): each moved key (and kept query) turns by −discard
  // positions, which is what it would have been computed as at its new position.
  const int64_t hd = cfg_.head_dim;
  const float theta = cfg_.rope_theta;
  const std::vector<int32_t> back(static_cast<size_t>(pos_ - keep - discard), static_cast<int32_t>(-discard));
  const KVCache::RowRotation rotate = [&](float* rows, int64_t n, int64_t ld) {
    nn::rope_fwd(rows, ld, ld, back.data(), n, 1, hd, theta);
  };
  for (KVCache& kc : cache_) kc.drop(keep, discard, rotate);
  pos_ -= discard;
}

void DecoderImpl::set_positions(int64_t B, int64_t T, int64_t offset) {
  posbuf_.resize(static_cast<size_t>(B * T));
  for (int64_t r = 0; r < B * T; ++r)
    posbuf_[static_cast<size_t>(r)] = static_cast<int32_t>(offset + seq_.local_pos[static_cast<size_t>(r % T)]);
}

std::vector<float> DecoderImpl::split_prefill(std::span<const int32_t> ids) {
  check(pos_ == 0, "decoder: a prefill with the sequence split across ranks starts at position 0 (call start())");
  const int64_t Tg = static_cast<int64_t>(ids.size());
  const int64_t T = begin_split(Tg);
  std::vector<int32_t> local_ids;
  take_local(ids, 1, local_ids);
  carve(1, T, false, false);
  att_->ms = dense_ms_ = 0;
  set_positions(1, T, 0);
  embed(local_ids.data(), T);
  forward_layers(1, T, {}, posbuf_.data(), false, false, 0, 0);
  // The zig-zag layout gives rank 0 the last chunk: its last row is the prompt's last position.
  std::vector<float> out(static_cast<size_t>(cfg_.vocab));
  if (seq_.comm->rank() == 0) {
    final_norm(T, T - 1);
    inference_logits(out.data(), 1);
  }
  seq_.comm->broadcast(out.data(), sizeof(float) * out.size(), 0);
  pos_ = Tg;
  split_prefill_ = true;
  return out;
}

double DecoderImpl::step_bytes(double context) const {
  const ModelConfig& c = cfg_;
  // Parameters as held (2 bytes per 16-bit weight), less the f32 embedding rows a step skips.
  const double weights = param_bytes() - (c.tie_embeddings ? 0.0 : 4.0 * static_cast<double>((c.vocab - 1) * c.hidden));
  const double per_value = kv_cache() == KVCacheType::f32 ? 4.0 : 2.0;
  const AttentionDims d{.B = 1, .H = c.heads, .Hkv = c.kv_heads, .N = 1, .M = 0, .Dk = c.head_dim, .Dv = c.head_dim};
  double cache = 0;
  for (int64_t l = 0; l < c.layers; ++l) cache += att_->at(l).decode_bytes(d, context, per_value);
  return weights + cache;
}

// ---- Decoder, the public handle

Decoder::Decoder(std::unique_ptr<DecoderImpl> impl) : Model(std::move(impl)) {}
Decoder::~Decoder() = default;
DecoderImpl& Decoder::impl() const { return static_cast<DecoderImpl&>(*impl_); }

Tensor Decoder::forward(std::span<const int32_t> ids, int64_t B, int64_t T, std::span<const int32_t> lengths) {
  return impl().forward(ids, B, T, lengths);
}
void Decoder::start(int64_t capacity) { impl().start(capacity); }
void Decoder::set_kv_cache(KVCacheType type) { impl().set_kv_cache(type); }
KVCacheType Decoder::kv_cache() const { return impl().kv_cache(); }
std::vector<float> Decoder::prefill(std::span<const int32_t> ids) { return impl().prefill(ids); }
std::vector<float> Decoder::step(int32_t id) { return impl().step(id); }
int64_t Decoder::position() const { return impl().position(); }
void Decoder::shift(int64_t keep, int64_t discard) { impl().shift(keep, discard); }
bool Decoder::can_shift() const { return impl().can_shift(); }
double Decoder::step_bytes(double context) const { return impl().step_bytes(context); }
double Decoder::forward_bytes(int64_t B, int64_t T, int64_t cache_positions) const {
  return impl().forward_bytes(B, T, cache_positions);
}

}  // namespace clattn
