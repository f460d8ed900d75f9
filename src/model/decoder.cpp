// The decoder: LLaMA family (RMSNorm, rotate-half RoPE, grouped-query attention, SwiGLU, tied or
// untied embeddings), for inference: a causal forward of whole sequences with any causal-capable
// attention, and incremental decoding over per-layer KV caches. Activations are token-major
// (rows = B·T); attention reads them through strided (B, H, T, D) views.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "clattn/error.h"
#include "clattn/model.h"
#include "clattn/nn.h"
#include "clattn/parallel.h"
#include "clattn/rng.h"
#include "model/weights.h"

namespace clattn {

struct Decoder::Params {
  struct Layer {
    const float *in_norm, *wq, *wk, *wv, *wo;  // (H), (nh·hd, H), (kvh·hd, H) x2, (H, nh·hd)
    const float *post_norm, *gate, *up, *down;  // (H), (F, H) x2, (H, F)
  };
  std::vector<Layer> layers;
  const float *embed = nullptr, *norm = nullptr, *lm_head = nullptr;  // (V, H), (H), (V, H)
};

Decoder::Decoder() = default;
Decoder::~Decoder() = default;

std::unique_ptr<Decoder> Decoder::load(const std::string& dir, const LoadOptions& opt) {
  std::unique_ptr<Decoder> d(new Decoder());
  d->cfg_ = read_model_config((std::filesystem::path(dir) / "config.json").string());
  const ModelConfig& c = d->cfg_;
  check(c.kind == ModelKind::llama, "model '", dir, "' is an encoder (model_type ", c.model_type, "), not a decoder");
  d->w_ = Weights::open(dir);
  Weights& w = *d->w_;
  d->p_ = std::make_unique<Params>();
  Params& p = *d->p_;
  const int64_t H = c.hidden, F = c.ffn, Q = c.heads * c.head_dim, KV = c.kv_heads * c.head_dim;
  p.embed = w.get("model.embed_tokens.weight", {c.vocab, H});
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string L = "model.layers." + std::to_string(l) + ".";
    Params::Layer y;
    y.in_norm = w.get(L + "input_layernorm.weight", {H});
    y.wq = w.get(L + "self_attn.q_proj.weight", {Q, H});
    y.wk = w.get(L + "self_attn.k_proj.weight", {KV, H});
    y.wv = w.get(L + "self_attn.v_proj.weight", {KV, H});
    y.wo = w.get(L + "self_attn.o_proj.weight", {H, Q});
    y.post_norm = w.get(L + "post_attention_layernorm.weight", {H});
    y.gate = w.get(L + "mlp.gate_proj.weight", {F, H});
    y.up = w.get(L + "mlp.up_proj.weight", {F, H});
    y.down = w.get(L + "mlp.down_proj.weight", {H, F});
    p.layers.push_back(y);
  }
  p.norm = w.get("model.norm.weight", {H});
  // Tied embeddings read the embedding matrix; a checkpoint may still carry an lm_head copy.
  p.lm_head = c.tie_embeddings ? p.embed : w.get("lm_head.weight", {c.vocab, H});
  if (c.tie_embeddings && w.has("lm_head.weight")) (void)w.get("lm_head.weight", {c.vocab, H});
  if (opt.verbose)
    for (const std::string& n : w.unused()) std::fprintf(stderr, "model '%s': ignoring unused tensor '%s'\n", dir.c_str(), n.c_str());
  d->set_attention("full");
  return d;
}

void Decoder::set_attention(const std::string& plan) {
  std::vector<std::string> specs = parse_attention_plan(plan, cfg_.layers);
  std::vector<std::unique_ptr<Attention>> att = make_plan_attentions(specs, true, cfg_.kv_heads != cfg_.heads);
  specs_ = std::move(specs);
  att_ = std::move(att);
  states_.clear();
  states_.resize(att_.size());
  ctx_.clear();
  for (size_t l = 0; l < att_.size(); ++l) ctx_.emplace_back(Mode::inference, &scratch_);
}

double Decoder::forward_bytes(int64_t B, int64_t T, int64_t cache_positions) const {
  const ModelConfig& c = cfg_;
  const double rows = static_cast<double>(B) * static_cast<double>(T);
  const double Q = static_cast<double>(c.heads * c.head_dim), KV = static_cast<double>(c.kv_heads * c.head_dim);
  double ws = 0;
  const AttentionDims d{B, c.heads, c.kv_heads, T, cache_positions > 0 ? cache_positions : T, c.head_dim, c.head_dim};
  for (const auto& a : att_) ws = std::max(ws, static_cast<double>(a->workspace_bytes(d, Mode::inference, max_threads())));
  // x, xn, q, k|v, attention out, gate, up; logits (twice: buffer and returned copy); caches hold
  // K twice (rows and panels) and V once.
  const double act = 4.0 * rows * (2.0 * c.hidden + 2.0 * Q + 2.0 * KV + 2.0 * c.ffn + 2.0 * c.vocab);
  const double cache = cache_positions > 0 ? 4.0 * c.layers * cache_positions * (3.0 * KV + 64) : 0;
  return act + ws + cache;
}

void Decoder::ensure(int64_t B, int64_t T) {
  if (B * T <= B_ * T_ && x_.defined()) return;  // buffers only grow (decode steps reuse them)
  const ModelConfig& c = cfg_;
  const int64_t rows = B * T;
  x_.resize(Shape{rows, c.hidden});
  xn_.resize(Shape{rows, c.hidden});
  q_.resize(Shape{rows, c.heads * c.head_dim});
  kv_.resize(Shape{rows, 2 * c.kv_heads * c.head_dim});
  ao_.resize(Shape{rows, c.heads * c.head_dim});
  g_.resize(Shape{rows, c.ffn});
  u_.resize(Shape{rows, c.ffn});
  B_ = B;
  T_ = T;
}

void Decoder::run(int64_t B, int64_t T, std::span<const int32_t> lengths, const int32_t* pos,
                  bool use_cache, int64_t logits_from) {
  const ModelConfig& c = cfg_;
  const int64_t rows = B * T, H = c.hidden, F = c.ffn, nh = c.heads, kvh = c.kv_heads, hd = c.head_dim;
  const int64_t Q = nh * hd, KV = kvh * hd;
  float* x = x_.data();    // (rows, H) residual stream
  float* xn = xn_.data();  // (rows, H) normalised block input
  float* q = q_.data();    // (rows, Q)
  float* kv = kv_.data();  // (rows, 2·KV) k | v
  float* ao = ao_.data();  // (rows, Q) attention output
  float* g = g_.data();    // (rows, F) gate, then SwiGLU
  float* u = u_.data();    // (rows, F) up
  auto heads_view = [&](float* base, int64_t heads, int64_t ld) {  // (B, heads, T, hd)
    View v{base, Shape{B, heads, T, hd}, {}};
    v.strides = {T * ld, hd, ld, 1};
    return v;
  };
  attn_ms_ = 0;
  for (size_t l = 0; l < p_->layers.size(); ++l) {
    const Params::Layer& y = p_->layers[l];
    nn::rmsnorm_fwd(xn, x, y.in_norm, rows, H, c.eps);
    nn::linear_fwd(q, Q, xn, H, y.wq, nullptr, rows, H, Q);
    nn::linear_fwd(kv, 2 * KV, xn, H, y.wk, nullptr, rows, H, KV);
    nn::linear_fwd(kv + KV, 2 * KV, xn, H, y.wv, nullptr, rows, H, KV);
    nn::rope_fwd(q, Q, hd, pos, rows, nh, hd, c.rope_theta);
    nn::rope_fwd(kv, 2 * KV, hd, pos, rows, kvh, hd, c.rope_theta);
    AttentionInputs ai;
    ai.q = heads_view(q, nh, Q);
    ai.causal = true;
    ai.query_lengths = lengths;
    ai.key_lengths = lengths;
    ai.step = step_;
    if (use_cache) {
      KVCache& kc = cache_[l];
      kc.append(heads_view(kv, kvh, 2 * KV), heads_view(kv + KV, kvh, 2 * KV),
                kc.keeps_queries() ? ConstView(heads_view(q, nh, Q)) : ConstView{});
      ai.k = kc.keys();
      ai.v = kc.values();
      ai.cache = &kc;
    } else {
      ai.k = heads_view(kv, kvh, 2 * KV);
      ai.v = heads_view(kv + KV, kvh, 2 * KV);
    }
    if (capture_ && capture_->layer == static_cast<int64_t>(l)) {  // inspection only: copies
      capture_->q = Tensor::from(ai.q);
      capture_->k = Tensor::from(ai.k);
      capture_->v = Tensor::from(ai.v);
      capture_->step = ai.step;
      capture_->causal = ai.causal;
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (att_[l]->capabilities().stateful) ai.state = &states_[l];
    att_[l]->forward(ai, heads_view(ao, nh, Q), ctx_[l]);
    attn_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    nn::linear_fwd(xn, H, ao, Q, y.wo, nullptr, rows, Q, H);
    nn::add_inplace(x, xn, rows * H);
    nn::rmsnorm_fwd(xn, x, y.post_norm, rows, H, c.eps);
    nn::linear_fwd(g, F, xn, H, y.gate, nullptr, rows, H, F);
    nn::linear_fwd(u, F, xn, H, y.up, nullptr, rows, H, F);
    nn::swiglu_fwd(g, g, u, rows * F);
    nn::linear_fwd(xn, H, g, F, y.down, nullptr, rows, F, H);
    nn::add_inplace(x, xn, rows * H);
  }
  const int64_t n = rows - logits_from;
  nn::rmsnorm_fwd(xn, x + logits_from * H, p_->norm, n, H, c.eps);
  logits_.resize(Shape{n, c.vocab});
  nn::linear_fwd(logits_.data(), c.vocab, xn, H, p_->lm_head, nullptr, n, H, c.vocab);
}

Tensor Decoder::forward(std::span<const int32_t> ids, int64_t B, int64_t T, std::span<const int32_t> lengths) {
  const ModelConfig& c = cfg_;
  check(B >= 1 && T >= 1 && static_cast<int64_t>(ids.size()) == B * T, "decoder: ids must hold B x T = ",
        B, " x ", T, " tokens, got ", ids.size());
  check(lengths.empty() || static_cast<int64_t>(lengths.size()) == B, "decoder: lengths must have B = ", B, " entries");
  for (int32_t len : lengths) check(len >= 0 && len <= T, "decoder: every length must be in [0, T = ", T, "], got ", len);
  ensure(B, T);
  nn::embedding_fwd(x_.data(), ids.data(), p_->embed, B * T, c.hidden, c.vocab);
  posbuf_.resize(static_cast<size_t>(B * T));
  for (int64_t r = 0; r < B * T; ++r) posbuf_[static_cast<size_t>(r)] = static_cast<int32_t>(r % T);
  run(B, T, lengths, posbuf_.data(), false, 0);
  Tensor out(Shape{B, T, c.vocab});
  std::memcpy(out.data(), logits_.data(), sizeof(float) * static_cast<size_t>(B * T * c.vocab));
  return out;
}

void Decoder::start(int64_t capacity) {
  check(capacity >= 1, "decoder: cache capacity must be >= 1, got ", capacity);
  const ModelConfig& c = cfg_;
  // A layer whose attention builds on earlier queries (causal clustered) keeps them in its cache,
  // so that decoding computes what a prefill of the same tokens computes.
  auto query_heads = [&](int64_t l) { return att_[static_cast<size_t>(l)]->capabilities().decode_queries ? c.heads : 0; };
  bool fits = cache_.size() == static_cast<size_t>(c.layers);
  for (int64_t l = 0; fits && l < c.layers; ++l)
    fits = cache_[static_cast<size_t>(l)].capacity() >= capacity && cache_[static_cast<size_t>(l)].query_heads() == query_heads(l);
  if (!fits) {
    cache_.clear();
    for (int64_t l = 0; l < c.layers; ++l) cache_.emplace_back(1, c.kv_heads, capacity, c.head_dim, c.head_dim, query_heads(l));
  }
  for (KVCache& kc : cache_) kc.clear();
  pos_ = 0;
}

std::vector<float> Decoder::prefill(std::span<const int32_t> ids) {
  check(!cache_.empty(), "decoder: call start() before prefill()");
  const int64_t T = static_cast<int64_t>(ids.size());
  check(T >= 1, "decoder: prefill needs at least one token");
  check(pos_ + T <= cache_[0].capacity(), "decoder: ", pos_ + T, " positions exceed the cache capacity ", cache_[0].capacity());
  ensure(1, T);
  nn::embedding_fwd(x_.data(), ids.data(), p_->embed, T, cfg_.hidden, cfg_.vocab);
  posbuf_.resize(static_cast<size_t>(T));
  std::iota(posbuf_.begin(), posbuf_.end(), static_cast<int32_t>(pos_));
  run(1, T, {}, posbuf_.data(), true, T - 1);
  pos_ += T;
  return std::vector<float>(logits_.data(), logits_.data() + cfg_.vocab);
}

std::vector<float> Decoder::step(int32_t id) { return prefill(std::span<const int32_t>(&id, 1)); }

int32_t sample_token(std::span<const float> logits, const SamplingOptions& opt, uint64_t step) {
  const int64_t V = static_cast<int64_t>(logits.size());
  check(V >= 1, "sample: no logits");
  check(opt.temperature >= 0 && std::isfinite(opt.temperature), "sample: temperature must be >= 0, got ", opt.temperature);
  check(opt.top_k >= 0, "sample: top_k must be >= 0, got ", opt.top_k);
  check(opt.top_p > 0 && opt.top_p <= 1, "sample: top_p must be in (0, 1], got ", opt.top_p);
  if (opt.temperature == 0.f)
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int32_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  // Candidates by decreasing logit (ties to the lower id), cut by top-k.
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
           (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
  });
  const int64_t k = opt.top_k > 0 ? std::min(opt.top_k, V) : V;
  std::vector<double> p(static_cast<size_t>(k));
  const double mx = logits[static_cast<size_t>(idx[0])];
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) sum += p[static_cast<size_t>(i)] = std::exp((logits[static_cast<size_t>(idx[static_cast<size_t>(i)])] - mx) / opt.temperature);
  // Nucleus: the smallest prefix whose mass reaches top_p.
  int64_t keep = k;
  double mass = 0;
  for (int64_t i = 0; i < k; ++i) {
    mass += p[static_cast<size_t>(i)] / sum;
    if (mass >= opt.top_p) {
      keep = i + 1;
      break;
    }
  }
  double kept = 0;
  for (int64_t i = 0; i < keep; ++i) kept += p[static_cast<size_t>(i)];
  const double r = Rng(opt.seed).uniform(step, 0) * kept;
  double acc = 0;
  for (int64_t i = 0; i < keep; ++i) {
    acc += p[static_cast<size_t>(i)];
    if (r < acc) return idx[static_cast<size_t>(i)];
  }
  return idx[static_cast<size_t>(keep - 1)];
}

}  // namespace clattn
