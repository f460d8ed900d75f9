// The encoder: BERT family (post-LN or pre-LN, token types, pooler) and the KWT input path, one
// forward for inference and training and one backward. The step reads top to bottom as its list
// of calls; activations are token-major (rows = B·T) and attention reads and writes them through
// strided (B, H, T, D) views, so no transpose is ever made.
//
// A layer, with LN the layer norms and drop() the residual dropout of training:
//   pre-LN   a = LN1(x)   u1 = x + drop(attn(a·Wqkv)·Wo)   f = LN2(u1)   x' = u1 + drop(gelu(f·W1)·W2)
//   post-LN  a = x        u1 = x + drop(attn(a·Wqkv)·Wo)   f = LN1(u1)   u2 = f + drop(gelu(f·W1)·W2)
//            x' = LN2(u2)
// Inference keeps one set of buffers for every layer and updates the residual stream in place
// (x = u1 = u2); training keeps each layer's x, a, qkv, attention output, u1, f, the FFN's
// pre-activation, u2 and the norms' statistics for the backward.
#include <cmath>
#include <cstring>
#include <filesystem>
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

using model::for_rows;
using model::ms_now;

struct EncoderImpl::Layout {
  struct Layer {  // offsets into params / grads
    int64_t wqkv, bqkv = -1, wo, bo, ln1g, ln1b, w1, b1, w2, b2, ln2g, ln2b;
    int64_t begin, end;  // the layer's range of the flat buffer
  };
  std::vector<Layer> layers;
  int64_t word = -1, pos = -1, type = -1, elng = -1, elnb = -1;  // BERT embeddings
  int64_t patch_w = -1, patch_b = -1, cls = -1;                  // KWT input path
  int64_t flng = -1, flnb = -1;                                  // final LayerNorm
  int64_t pool_w = -1, pool_b = -1, cls_w = -1, cls_b = -1, mlm_b = -1;
  int64_t mlm_tw = -1, mlm_tb = -1, mlm_lng = -1, mlm_lnb = -1;  // the masked-LM transform
};

struct EncoderImpl::Bufs : ModelImpl::ArenaPlan {
  struct Saved {  // per layer (training), or one set every layer shares (inference)
    float *x, *xn1, *m1, *r1, *qkv, *ao, *u1, *xn2, *m2, *r2, *h, *u2;
  };
  std::vector<Saved> S;
  float *e = nullptr, *em = nullptr, *er = nullptr;  // embeddings before their LayerNorm, its statistics
  float *proj = nullptr;                             // (B·P, H) KWT patch projections
  float *xl = nullptr, *xf = nullptr, *fm = nullptr, *fr = nullptr;  // last layer's output, final LN
  float *dx = nullptr, *dt = nullptr, *dt2 = nullptr, *dao = nullptr, *dqkv = nullptr, *dh = nullptr, *gbuf = nullptr;
  float *keep_ffn = nullptr, *keep_att = nullptr;  // (rows, H) each: the first layer's held dy (hold_first_layer)
  float *pool_in = nullptr;
  // The masked-LM transform: dense output (rows, H), its GELU (rows, H), the LayerNorm output
  // (rows, H) the output layer reads, its mean | 1/std (2, rows), and its gradient (rows, H).
  float *mu = nullptr, *mg = nullptr, *mt = nullptr, *mstat = nullptr, *mdt = nullptr;
};

EncoderImpl::EncoderImpl(const ModelConfig& cfg_in, const std::optional<TaskKind>& head, bool pooler,
                         const CheckpointNames* ckpt, WeightType weights)
    : ModelImpl(cfg_in, ckpt, weights), layout_(std::make_unique<Layout>()), bufs_(std::make_unique<Bufs>()), pooler_(pooler) {
  ModelConfig& c = cfg_;
  head_ = head;
  check(c.hidden >= 1 && c.layers >= 1 && c.heads >= 1 && c.hidden % c.heads == 0 && c.ffn >= 1 &&
            c.max_positions >= 1 && (c.kind == ModelKind::kwt || c.vocab >= 1),
        "encoder: sizes must be >= 1 (hidden, layers, heads, ffn, vocab, max_positions) with hidden a multiple of heads");
  check(c.kind != ModelKind::kwt || (c.input_dim >= 1 && c.num_patches >= 1 && c.max_positions == c.num_patches + 1),
        "encoder: a KWT model needs input_dim >= 1, num_patches >= 1 and max_positions = num_patches + 1");
  if (c.model_type.empty()) c.model_type = c.kind == ModelKind::kwt ? "kwt" : "bert";
  c.head_dim = c.hidden / c.heads;
  c.kv_heads = c.heads;
  if (!(c.eps > 0)) c.eps = 1e-12f;
  const int64_t H = c.hidden, F = c.ffn;
  Layout& L = *layout_;
  if (c.kind == ModelKind::kwt) {
    L.patch_w = add("embeddings.patch_projection.weight", {H, c.input_dim}, Init::normal);
    L.patch_b = add("embeddings.patch_projection.bias", {H}, Init::zero);
    L.cls = add("embeddings.cls_token", {H}, Init::normal);
    L.pos = add("embeddings.position_embeddings", {c.max_positions, H}, Init::normal);
  } else {
    L.word = add("embeddings.word_embeddings.weight", {c.vocab, H}, Init::normal);
    L.pos = add("embeddings.position_embeddings.weight", {c.max_positions + c.position_offset, H}, Init::normal);
    if (c.type_vocab > 0) L.type = add("embeddings.token_type_embeddings.weight", {c.type_vocab, H}, Init::normal);
    L.elng = add("embeddings.LayerNorm.weight", {H}, Init::one);
    L.elnb = add("embeddings.LayerNorm.bias", {H}, Init::zero);
  }
  // Each family's names for the same tensors (BERT and RoBERTa share them).
  const bool distil = c.model_type == "distilbert", roberta = c.model_type == "roberta";
  struct Names {
    const char *layer, *q, *k, *v, *o, *ln1, *ff1, *ff2, *ln2;
  };
  static constexpr Names kBert{"encoder.layer.", "attention.self.query", "attention.self.key",
                               "attention.self.value", "attention.output.dense", "attention.output.LayerNorm",
                               "intermediate.dense", "output.dense", "output.LayerNorm"};
  static constexpr Names kDistil{"transformer.layer.", "attention.q_lin", "attention.k_lin", "attention.v_lin",
                                 "attention.out_lin", "sa_layer_norm", "ffn.lin1", "ffn.lin2", "output_layer_norm"};
  const Names& n = distil ? kDistil : kBert;
  const auto name = [](const std::string& p, const char* t, const char* what) { return p + t + what; };
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = n.layer + std::to_string(l) + ".";
    Layout::Layer y;
    // query, key and value adjacent: one (3H, H) matrix and one (3H) bias for a fused GEMM (at
    // KWT's H = 64 a narrow product runs at half the sgemm rate).
    y.wqkv = add_linear(name(p, n.q, ".weight"), {H, H});
    add_linear(name(p, n.k, ".weight"), {H, H});
    add_linear(name(p, n.v, ".weight"), {H, H});
    if (c.qkv_bias) {
      y.bqkv = add(name(p, n.q, ".bias"), {H}, Init::zero);
      add(name(p, n.k, ".bias"), {H}, Init::zero);
      add(name(p, n.v, ".bias"), {H}, Init::zero);
    }
    y.wo = add_linear(name(p, n.o, ".weight"), {H, H});
    y.bo = add(name(p, n.o, ".bias"), {H}, Init::zero);
    y.ln1g = add(name(p, n.ln1, ".weight"), {H}, Init::one);
    y.ln1b = add(name(p, n.ln1, ".bias"), {H}, Init::zero);
    y.w1 = add_linear(name(p, n.ff1, ".weight"), {F, H});
    y.b1 = add(name(p, n.ff1, ".bias"), {F}, Init::zero);
    y.w2 = add_linear(name(p, n.ff2, ".weight"), {H, F});
    y.b2 = add(name(p, n.ff2, ".bias"), {H}, Init::zero);
    y.ln2g = add(name(p, n.ln2, ".weight"), {H}, Init::one);
    y.ln2b = add(name(p, n.ln2, ".bias"), {H}, Init::zero);
    y.begin = y.wqkv;
    y.end = y.ln2b + H;
    L.layers.push_back(y);
    if (l == 0) check_layers_fit(y.begin);
  }
  if (c.final_layer_norm) {
    L.flng = add("encoder.final_layer_norm.weight", {H}, Init::one);
    L.flnb = add("encoder.final_layer_norm.bias", {H}, Init::zero);
  }
  // The dense layer between the first token and the classifier: BERT's pooler, RoBERTa's
  // classification head (dense, tanh, out_proj), DistilBERT's pre_classifier (ReLU).
  const bool classifier = c.num_labels >= 1 && (!head_ || *head_ == TaskKind::classify);
  if (pooler_) {
    const std::string pool = roberta ? "classifier.dense" : distil ? "pre_classifier" : "pooler.dense";
    L.pool_w = add(pool + ".weight", {H, H}, Init::normal);
    L.pool_b = add(pool + ".bias", {H}, Init::zero);
  }
  if (classifier) {
    const std::string cls = roberta ? "classifier.out_proj" : "classifier";
    L.cls_w = add(cls + ".weight", {c.num_labels, H}, Init::normal);
    L.cls_b = add(cls + ".bias", {c.num_labels}, Init::zero);
  }
  if (head_ && *head_ == TaskKind::mlm) {
    check(c.kind == ModelKind::bert, "encoder: the mlm head needs a token model (bert)");
    if (c.mlm_transform) {
      const char* dense = roberta ? "lm_head.dense" : distil ? "vocab_transform" : "cls.predictions.transform.dense";
      const char* norm = roberta ? "lm_head.layer_norm" : distil ? "vocab_layer_norm" : "cls.predictions.transform.LayerNorm";
      L.mlm_tw = add(std::string(dense) + ".weight", {H, H}, Init::normal);
      L.mlm_tb = add(std::string(dense) + ".bias", {H}, Init::zero);
      L.mlm_lng = add(std::string(norm) + ".weight", {H}, Init::one);
      L.mlm_lnb = add(std::string(norm) + ".bias", {H}, Init::zero);
    }
    // The output layer is tied to the word embeddings; its bias under the family's name.
    L.mlm_b = add(c.mlm_transform && roberta ? "lm_head.bias" : c.mlm_transform && distil ? "vocab_projector.bias"
                                                                                         : "cls.predictions.bias",
                  {c.vocab}, Init::zero);
  }
  check(!head_ || *head_ != TaskKind::classify || L.cls_w >= 0, "encoder: the classify head needs num_labels >= 1");
  check(!head_ || *head_ != TaskKind::lm, "encoder: an encoder takes the classify or mlm head, not lm");
  allocate();
  att_ = std::make_unique<LayerAttention>(c.layers, false, false);
  att_->set_plan("full");
}

EncoderImpl::~EncoderImpl() = default;

std::unique_ptr<EncoderImpl> EncoderImpl::for_checkpoint(ModelConfig cfg, const Weights& w, const LoadOptions& opt,
                                                         std::vector<std::string>& optional) {
  // A task model stores its encoder under the family's name ("bert.", "roberta.",
  // "distilbert."); a bare encoder (BertModel) stores it unprefixed.
  const std::string family = cfg.kind == ModelKind::kwt ? "" : cfg.model_type + ".";
  const bool prefixed = !family.empty() && w.has(family + "embeddings.word_embeddings.weight");
  const std::string pre = prefixed ? family : "";
  const bool roberta = cfg.model_type == "roberta", distil = cfg.model_type == "distilbert";
  const std::string cls_name = roberta ? "classifier.out_proj" : "classifier";
  const bool has_classifier = w.has(cls_name + ".weight");
  std::optional<TaskKind> head = opt.head;
  if (!head && (has_classifier || cfg.kind == ModelKind::kwt)) head = TaskKind::classify;
  if (!head && (w.has("cls.predictions.transform.dense.weight") || w.has("lm_head.dense.weight") ||
                w.has("vocab_transform.weight")))
    head = TaskKind::mlm;
  check(!head || *head != TaskKind::lm, "model '", w.dir(), "': an encoder takes the classify or mlm head, not lm");
  if (cfg.kind == ModelKind::kwt) {
    check(has_classifier, "model '", w.dir(), "': tensor 'classifier.weight' is missing");
    check(!head || *head == TaskKind::classify, "model '", w.dir(), "': a KWT model takes the classify head");
  }
  if (head && *head == TaskKind::classify) {
    if (has_classifier) {
      // A config without num_labels (or id2label): the classifier's own rows say it.
      const std::vector<int64_t> cs = w.shape(cls_name + ".weight");
      if (cfg.num_labels < 1 && cs.size() == 2) cfg.num_labels = cs[0];
      check(cfg.num_labels >= 1, "model '", w.dir(), "': the checkpoint has a classifier but the config no num_labels");
      check(opt.num_labels <= cfg.num_labels, "model '", w.dir(), "': its classifier has ", cfg.num_labels,
            " classes, fewer than the ", opt.num_labels, " asked for");
    } else {
      check(opt.num_labels >= 1, "model '", w.dir(), "' has no classifier; the classify head needs a number of classes");
      cfg.num_labels = opt.num_labels;
      cfg.labels.clear();
      optional.push_back(cls_name + ".weight");
      optional.push_back(cls_name + ".bias");
      // A new classifier on RoBERTa or DistilBERT comes with the dense layer before it.
      if (roberta || distil) {
        const std::string pool = roberta ? "classifier.dense" : "pre_classifier";
        optional.push_back(pool + ".weight");
        optional.push_back(pool + ".bias");
      }
    }
  } else if (!has_classifier) {
    cfg.num_labels = 0;
  }
  if (head && *head == TaskKind::mlm) {
    // The output layer is the word embeddings: an untied one's stored weights would be ignored.
    check(cfg.tie_embeddings, "model '", w.dir(), "': tie_word_embeddings false is not supported for a ", cfg.model_type,
          " masked-LM head (its output layer is the word embeddings; the stored decoder weights would be ignored)");
    // A pretrained masked-LM head (dense, GELU, LayerNorm, then the tied output layer) when the
    // checkpoint has one; else clattn's own (the tied output layer and a bias, zero when absent).
    const std::string transform = roberta ? "lm_head.dense.weight" : distil ? "vocab_transform.weight"
                                                                            : "cls.predictions.transform.dense.weight";
    cfg.mlm_transform = w.has(transform);
    if (!cfg.mlm_transform) optional.push_back("cls.predictions.bias");
    cfg.num_labels = 0;  // a classifier the checkpoint may have is not part of this model
    cfg.labels.clear();
  }
  // RoBERTa and DistilBERT have their dense layer exactly when they classify; BERT's pooler is
  // part of the encoder checkpoint, with or without a classifier.
  const bool classify = head && *head == TaskKind::classify;
  const bool pooler = cfg.kind == ModelKind::bert &&
                      ((roberta || distil) ? classify : w.has(pre + "pooler.dense.weight"));
  const CheckpointNames names{&w, pre, optional};
  std::unique_ptr<EncoderImpl> e(new EncoderImpl(cfg, head, pooler, &names, opt.weights));
  e->init(opt.seed);  // what the checkpoint lacks (a new head) starts from here
  return e;
}

std::unique_ptr<EncoderImpl> EncoderImpl::random_bert(const ModelConfig& cfg_in, uint64_t seed) {
  ModelConfig c = cfg_in;
  c.kind = ModelKind::bert;
  c.model_type = "bert";
  c.architecture = "BertModel";
  check(c.hidden >= 1 && c.layers >= 1 && c.heads >= 1 && c.hidden % c.heads == 0 && c.ffn >= 1 &&
            c.vocab >= 1 && c.max_positions >= 1,
        "random_bert: sizes must be >= 1 with hidden a multiple of heads");
  c.type_vocab = 2;
  c.num_labels = 0;
  c.pre_ln = false;
  c.final_layer_norm = false;
  std::unique_ptr<EncoderImpl> e(new EncoderImpl(c, std::nullopt, false));
  e->init(seed);
  return e;
}

// ---- activations

EncoderImpl::Bufs EncoderImpl::plan(int64_t B, int64_t T, bool train, bool head, float* base) const {
  const ModelConfig& c = cfg_;
  const int64_t rows = B * T, H = c.hidden, F = c.ffn, O = std::max<int64_t>(c.num_labels, head_ && *head_ == TaskKind::mlm ? c.vocab : 0);
  model::Carver a(base);
  Bufs b;
  if (train) {
    check(head, "encoder: internal: training needs the head's buffers");
    b.S.resize(static_cast<size_t>(c.layers));
    for (Bufs::Saved& s : b.S) {
      s.x = a.take(rows * H);                      // (rows, H) layer input (residual stream)
      s.xn1 = c.pre_ln ? a.take(rows * H) : s.x;   // (rows, H) attention input: LN1(x) or x
      s.m1 = a.take(rows);                         // (rows) LN1 mean and 1/std
      s.r1 = a.take(rows);
      s.qkv = a.take(rows * 3 * H);                // (rows, 3H) q | k | v
      s.ao = a.take(rows * H);                     // (rows, H) attention output
      s.u1 = a.take(rows * H);                     // (rows, H) residual after attention
      s.xn2 = a.take(rows * H);                    // (rows, H) FFN input: LN2(u1) or LN1(u1)
      s.m2 = a.take(rows);
      s.r2 = a.take(rows);
      s.h = a.take(rows * F);                      // (rows, F) FFN hidden before GELU
      s.u2 = c.pre_ln ? nullptr : a.take(rows * H);  // (rows, H) post-LN: residual before LN2
    }
    b.xl = a.take(rows * H);                       // (rows, H) output of the last layer
    b.dx = a.take(rows * H);                       // (rows, H) gradient of the residual stream
    b.dt = a.take(rows * H);                       // (rows, H) gradient through a dropout
    b.dt2 = a.take(rows * H);                      // (rows, H) gradient of a normalised input
    b.dao = a.take(rows * H);                      // (rows, H) gradient of the attention output
    b.dqkv = a.take(rows * 3 * H);                 // (rows, 3H)
    b.dh = a.take(rows * F);                       // (rows, F)
    b.gbuf = a.take(rows * F);                     // (rows, F) GELU output (recomputed in backward)
    b.keep_ffn = a.take(rows * H);                 // (rows, H)
    b.keep_att = a.take(rows * H);                 // (rows, H)
    b.dhs = a.take(rows * H);                      // (n, H) head: gradient of the gathered rows
  } else {
    // One set for every layer; the residual stream is updated in place.
    Bufs::Saved s;
    s.x = s.u1 = s.u2 = a.take(rows * H);          // (rows, H)
    s.xn1 = c.pre_ln ? a.take(rows * H) : s.x;     // (rows, H)
    s.xn2 = c.pre_ln ? s.xn1 : s.x;
    s.m1 = s.r1 = s.m2 = s.r2 = nullptr;
    s.qkv = a.take(rows * 3 * H);                  // (rows, 3H)
    s.ao = a.take(rows * H);                       // (rows, H)
    s.h = a.take(rows * F);                        // (rows, F) GELU in place
    b.S.assign(static_cast<size_t>(c.layers), s);
    b.xl = s.x;
    b.gbuf = s.h;
  }
  if (c.kind == ModelKind::kwt) {
    b.proj = a.take(B * c.num_patches * H);        // (B·P, H)
  } else {
    b.e = train ? a.take(rows * H) : b.S[0].x;     // (rows, H) word + position (+ type) embeddings
    b.em = train ? a.take(rows) : nullptr;
    b.er = train ? a.take(rows) : nullptr;
  }
  if (c.mlm_transform && head_ && *head_ == TaskKind::mlm) {
    b.mu = a.take(rows * H);
    b.mg = a.take(rows * H);
    b.mt = a.take(rows * H);
    b.mstat = a.take(2 * rows);
    b.mdt = train ? a.take(rows * H) : nullptr;
  }
  if (c.final_layer_norm) {
    b.xf = train ? a.take(rows * H) : b.xl;        // (rows, H) final LayerNorm output
    b.fm = train ? a.take(rows) : nullptr;
    b.fr = train ? a.take(rows) : nullptr;
  } else {
    b.xf = b.xl;
  }
  b.hs = a.take((head ? rows : B) * H);            // (n, H) head input: target rows or pooled rows
  b.pool_in = a.take(B * H);                       // (B, H) the pooler's input (first tokens)
  if (head) b.logits = a.take(rows * std::max<int64_t>(O, 1));  // (n, classes)
  b.floats = a.used();
  return b;
}

int64_t EncoderImpl::plan_floats(int64_t B, int64_t T, bool train, bool head) const {
  return plan(B, T, train, head, nullptr).floats;
}

const ModelImpl::ArenaPlan& EncoderImpl::carve_into(float* base, int64_t B, int64_t T, bool train, bool head) {
  *bufs_ = plan(B, T, train, head, base);
  if (static_cast<int64_t>(zero_types_.size()) < B * T) zero_types_.assign(static_cast<size_t>(B * T), 0);
  return *bufs_;
}

double EncoderImpl::forward_bytes(int64_t B, int64_t T) const {
  if (split_on()) T = sequence_split(T).local_rows(seq_.comm->rank());
  const AttentionDims d{B, cfg_.heads, cfg_.heads, T, T, cfg_.head_dim, cfg_.head_dim};
  return 4.0 * static_cast<double>(plan_floats(B, T, false, false)) + att_->workspace_bytes(d, false);
}

// ---- forward

void EncoderImpl::embed_tokens(const int32_t* ids, const int32_t* types, int64_t B, int64_t T) {
  const ModelConfig& c = cfg_;
  const Layout& L = *layout_;
  const int64_t H = c.hidden, rows = B * T;
  float* e = bufs_->e;  // (rows, H)
  nn::embedding_fwd(e, ids, p(L.word), rows, H, c.vocab);
  const float* pe = p(L.pos);
  const float* te = L.type >= 0 ? p(L.type) : nullptr;
  for_rows(rows, H, [&](int64_t r) {
    const float* pr = pe + (seq_.local_pos[static_cast<size_t>(r % T)] + c.position_offset) * H;  // global position
    const float* tr = te ? te + static_cast<int64_t>(types ? types[r] : 0) * H : nullptr;
    for (int64_t k = 0; k < H; ++k) e[r * H + k] += pr[k] + (tr ? tr[k] : 0.f);
  });
  nn::layernorm_fwd(bufs_->S[0].x, e, p(L.elng), p(L.elnb), rows, H, c.eps, bufs_->em, bufs_->er);
}

void EncoderImpl::embed_features(const float* feats, int64_t B) {
  const ModelConfig& c = cfg_;
  const Layout& L = *layout_;
  const int64_t H = c.hidden, P = c.num_patches, T = P + 1;
  // Patches through the projection in one GEMM, then each sequence is [cls; patches] + positions.
  lin(bufs_->proj, H, feats, c.input_dim, L.patch_w, p(L.patch_b), B * P, c.input_dim, H);
  float* x = bufs_->S[0].x;
  const float* cls = p(L.cls);
  const float* pos = p(L.pos);
  for_rows(B * T, H, [&](int64_t r) {
    const int64_t s = r / T, i = r % T;
    const float* src = i == 0 ? cls : bufs_->proj + (s * P + i - 1) * H;
    for (int64_t k = 0; k < H; ++k) x[r * H + k] = src[k] + pos[i * H + k];
  });
}

void EncoderImpl::forward_layers(int64_t B, int64_t T, std::span<const int32_t> lengths, bool train, uint64_t step,
                             int64_t first) {
  const ModelConfig& c = cfg_;
  const int64_t rows = B * T, H = c.hidden, F = c.ffn, nh = c.heads, hd = c.head_dim;
  const nn::Gelu gk = c.gelu_tanh ? nn::Gelu::tanh : nn::Gelu::erf;
  const bool drop = train && dropout_ > 0;
  // Query scaling beyond the attention's own 1/sqrt(hd) (configs with attention_scale).
  const float qmul = c.attention_scale > 0 ? c.attention_scale * std::sqrt(static_cast<float>(hd)) : 1.f;
  const std::span<const int32_t> lens = model::padding_lengths(lengths, seq_.T);  // global lengths
  auto hv = [&](float* base, int64_t ld) { return model::heads_view(base, B, nh, T, hd, ld); };
  for (int64_t l = 0; l < c.layers; ++l) {
    const Layout::Layer& y = layout_->layers[static_cast<size_t>(l)];
    Bufs::Saved& s = bufs_->S[static_cast<size_t>(l)];
    float* xnext = l + 1 < c.layers ? bufs_->S[static_cast<size_t>(l + 1)].x : bufs_->xl;
    if (c.pre_ln) nn::layernorm_fwd(s.xn1, s.x, p(y.ln1g), p(y.ln1b), rows, H, c.eps, s.m1, s.r1);
    lin(s.qkv, 3 * H, s.xn1, H, y.wqkv, y.bqkv >= 0 ? p(y.bqkv) : nullptr, rows, H, 3 * H);
    if (qmul != 1.f)
      for_rows(rows, H, [&](int64_t r) { for (int64_t k = 0; k < H; ++k) s.qkv[r * 3 * H + k] *= qmul; });
    const AttentionInputs ai = att_->inputs(l, hv(s.qkv, 3 * H), hv(s.qkv + H, 3 * H), hv(s.qkv + 2 * H, 3 * H), lens, step, train);
    att_->forward(l, ai, hv(s.ao, H), train);
    // u1 = x + drop(ao·Wo + bo)
    if (drop) {
      lin(bufs_->dt, H, s.ao, H, y.wo, p(y.bo), rows, H, H);
      residual_dropout(s.u1, s.x, bufs_->dt, B, T, H, l, 0, step, first);
    } else {
      lin(s.u1, H, s.ao, H, y.wo, p(y.bo), rows, H, H, s.x);
    }
    if (c.pre_ln) nn::layernorm_fwd(s.xn2, s.u1, p(y.ln2g), p(y.ln2b), rows, H, c.eps, s.m2, s.r2);
    else nn::layernorm_fwd(s.xn2, s.u1, p(y.ln1g), p(y.ln1b), rows, H, c.eps, s.m1, s.r1);
    lin(s.h, F, s.xn2, H, y.w1, p(y.b1), rows, H, F);
    nn::gelu_fwd(bufs_->gbuf, s.h, rows * F, gk);
    // pre-LN: x' = u1 + drop(g·W2 + b2); post-LN: u2 = f + drop(g·W2 + b2), x' = LN2(u2)
    float* sum = c.pre_ln ? xnext : s.u2;
    const float* res = c.pre_ln ? s.u1 : s.xn2;
    if (drop) {
      lin(bufs_->dt, H, bufs_->gbuf, F, y.w2, p(y.b2), rows, F, H);
      residual_dropout(sum, res, bufs_->dt, B, T, H, l, 1, step, first);
    } else {
      lin(sum, H, bufs_->gbuf, F, y.w2, p(y.b2), rows, F, H, res);
    }
    if (!c.pre_ln) nn::layernorm_fwd(xnext, s.u2, p(y.ln2g), p(y.ln2b), rows, H, c.eps, s.m2, s.r2);
  }
}

void EncoderImpl::final_norm(int64_t rows) {
  const Layout& L = *layout_;
  if (L.flng >= 0) nn::layernorm_fwd(bufs_->xf, bufs_->xl, p(L.flng), p(L.flnb), rows, cfg_.hidden, cfg_.eps, bufs_->fm, bufs_->fr);
  head_ws_.xf = bufs_->xf;
  head_ws_.rows_xf = rows;
}

void EncoderImpl::pool(int64_t B, int64_t T, std::span<const int32_t> lengths) {
  const int64_t H = cfg_.hidden;
  const float* xf = bufs_->xf;
  float* hs = bufs_->hs;  // (B, H)
  // With the sequence split, a rank sums its own valid positions (or holds position 0 or not),
  // and the sums add across the ranks: every rank then has the whole pooled rows.
  const bool split = split_on();
  if (cfg_.mean_pooling) {
    // The mean over each sequence's valid tokens (padding excluded): unlike a class token, it does
    // not depend on how an approximate attention treats one position.
    for_rows(B, T * H, [&](int64_t s) {
      const int64_t len = lengths.empty() ? seq_.T : lengths[static_cast<size_t>(s)];
      float* o = hs + s * H;
      std::fill(o, o + H, 0.f);
      for (int64_t t = 0; t < T; ++t) {
        if (seq_.local_pos[static_cast<size_t>(t)] >= len) continue;
        for (int64_t k = 0; k < H; ++k) o[k] += xf[(s * T + t) * H + k];
      }
      if (!split)
        for (int64_t k = 0; k < H; ++k) o[k] /= static_cast<float>(len);
    });
    if (split) {
      seq_.comm->all_reduce_sum(hs, static_cast<size_t>(B * H));
      for (int64_t s = 0; s < B; ++s) {
        const float len = static_cast<float>(lengths.empty() ? seq_.T : lengths[static_cast<size_t>(s)]);
        for (int64_t k = 0; k < H; ++k) hs[s * H + k] /= len;
      }
    }
    return;
  }
  float* first = pooler_ ? bufs_->pool_in : hs;  // (B, H) each sequence's first token
  const bool has_first = seq_.local_pos[0] == 0;
  for (int64_t s = 0; s < B; ++s) {
    if (has_first) std::memcpy(first + s * H, xf + s * T * H, sizeof(float) * static_cast<size_t>(H));
    else std::fill(first + s * H, first + (s + 1) * H, 0.f);
  }
  if (split) seq_.comm->all_reduce_sum(first, static_cast<size_t>(B * H));
  if (!pooler_) return;
  lin(hs, H, first, H, layout_->pool_w, p(layout_->pool_b), B, H, H);
  if (cfg_.pooler_relu) for (int64_t i = 0; i < B * H; ++i) hs[i] = std::max(hs[i], 0.f);
  else for (int64_t i = 0; i < B * H; ++i) hs[i] = std::tanh(hs[i]);
}

void EncoderImpl::pool_backward(int64_t B, int64_t T, std::span<const int32_t> lengths, float* dxf) {
  const int64_t H = cfg_.hidden;
  std::memset(dxf, 0, sizeof(float) * static_cast<size_t>(B * T * H));
  float* dhs = bufs_->dhs;  // (B, H)
  if (cfg_.mean_pooling) {
    for_rows(B, T * H, [&](int64_t s) {
      const int64_t len = lengths.empty() ? seq_.T : lengths[static_cast<size_t>(s)];
      const float inv = 1.f / static_cast<float>(len);
      for (int64_t t = 0; t < T; ++t) {
        if (seq_.local_pos[static_cast<size_t>(t)] >= len) continue;
        for (int64_t k = 0; k < H; ++k) dxf[(s * T + t) * H + k] = dhs[s * H + k] * inv;
      }
    });
    return;
  }
  if (pooler_) {
    // hs = tanh(first·Wpᵀ + bp): d(pre) = dhs ∘ (1 − hs²) (ReLU: dhs where hs > 0), then the linear layer's backward
    // gives d(first) (dt as scratch: dxf is dt2). Every rank of a split computes the pooler
    // alike; rank 0 alone adds its parameter gradient.
    if (cfg_.pooler_relu) for (int64_t i = 0; i < B * H; ++i) dhs[i] = bufs_->hs[i] > 0.f ? dhs[i] : 0.f;
    else for (int64_t i = 0; i < B * H; ++i) dhs[i] *= 1.f - bufs_->hs[i] * bufs_->hs[i];
    const bool lead = split_lead();
    lin_bwd(bufs_->dt, H, lead ? g(layout_->pool_w) : nullptr, lead ? g(layout_->pool_b) : nullptr, dhs, H, bufs_->pool_in, H,
            p(layout_->pool_w), B, H, H);
    dhs = bufs_->dt;
  }
  if (seq_.local_pos[0] != 0) return;  // another rank holds the first tokens
  for (int64_t s = 0; s < B; ++s) std::memcpy(dxf + s * T * H, dhs + s * H, sizeof(float) * static_cast<size_t>(H));
}

// ---- backward

void EncoderImpl::backward_layers(int64_t B, int64_t T, std::span<const int32_t> lengths, uint64_t step, int64_t first) {
  const ModelConfig& c = cfg_;
  const int64_t rows = B * T, H = c.hidden, F = c.ffn, nh = c.heads, hd = c.head_dim;
  const nn::Gelu gk = c.gelu_tanh ? nn::Gelu::tanh : nn::Gelu::erf;
  const bool drop = dropout_ > 0;
  const float qmul = c.attention_scale > 0 ? c.attention_scale * std::sqrt(static_cast<float>(hd)) : 1.f;
  const std::span<const int32_t> lens = model::padding_lengths(lengths, seq_.T);  // global lengths
  auto hv = [&](float* base, int64_t ld) { return model::heads_view(base, B, nh, T, hd, ld); };
  Bufs& b = *bufs_;
  float* dx = b.dx;  // (rows, H) the gradient of the stream: of x' on entry to a layer, of x on exit
  held_.clear();
  for (int64_t l = c.layers - 1; l >= 0; --l) {
    const Layout::Layer& y = layout_->layers[static_cast<size_t>(l)];
    Bufs::Saved& s = b.S[static_cast<size_t>(l)];
    const bool hold = l == 0 && hold_first_layer();
    // du2: the gradient of the FFN's residual sum (pre-LN: x' itself).
    float* du2 = dx;
    if (!c.pre_ln) {
      // x' = LN2(u2)
      nn::layernorm_bwd(b.dt2, g(y.ln2g), g(y.ln2b), dx, s.u2, p(y.ln2g), s.m2, s.r2, rows, H);
      du2 = b.dt2;
    }
    // sum = res + drop(gelu(f·W1 + b1)·W2 + b2)
    const float* dbranch = du2;
    if (drop) {
      dropout_grad(b.dt, du2, B, T, H, l, 1, step, first);
      dbranch = b.dt;
    }
    nn::gelu_fwd(b.gbuf, s.h, rows * F, gk);
    lin_bwd_held(hold, b.dh, F, {y.w2, y.b2, dbranch, H, b.gbuf, F, rows, F, H}, p(y.w2), b.keep_ffn);
    nn::gelu_bwd(b.dh, b.dh, s.h, rows * F, gk);
    if (c.pre_ln) {
      // f = LN2(u1): du1 = dx + LN2'(df)
      lin_bwd_held(hold, b.dt2, H, {y.w1, y.b1, b.dh, F, s.xn2, H, rows, H, F}, p(y.w1), nullptr);
      nn::layernorm_bwd(dx, g(y.ln2g), g(y.ln2b), b.dt2, s.u1, p(y.ln2g), s.m2, s.r2, rows, H, true);
    } else {
      // df = du2 (the residual) + the FFN's input gradient; f = LN1(u1): du1 = LN1'(df)
      lin_bwd_held(hold, b.dt2, H, {y.w1, y.b1, b.dh, F, s.xn2, H, rows, H, F}, p(y.w1), nullptr, /*accumulate=*/true);
      nn::layernorm_bwd(dx, g(y.ln1g), g(y.ln1b), b.dt2, s.u1, p(y.ln1g), s.m1, s.r1, rows, H);
    }
    // dx now holds du1. u1 = x + drop(attn(a·Wqkv + bqkv)·Wo + bo).
    const float* dat = dx;
    if (drop) {
      dropout_grad(b.dt, dx, B, T, H, l, 0, step, first);
      dat = b.dt;
    }
    lin_bwd_held(hold, b.dao, H, {y.wo, y.bo, dat, H, s.ao, H, rows, H, H}, p(y.wo), b.keep_att);
    std::memset(b.dqkv, 0, sizeof(float) * static_cast<size_t>(rows * 3 * H));
    const AttentionInputs ai = att_->inputs(l, hv(s.qkv, 3 * H), hv(s.qkv + H, 3 * H), hv(s.qkv + 2 * H, 3 * H), lens, step, true);
    att_->backward(l, ai, hv(s.ao, H), hv(b.dao, H), hv(b.dqkv, 3 * H), hv(b.dqkv + H, 3 * H), hv(b.dqkv + 2 * H, 3 * H));
    if (qmul != 1.f)
      for_rows(rows, H, [&](int64_t r) { for (int64_t k = 0; k < H; ++k) b.dqkv[r * 3 * H + k] *= qmul; });
    if (c.pre_ln) {
      // a = LN1(x): dx = du1 + LN1'(da)
      lin_bwd_held(hold, b.dt2, H, {y.wqkv, y.bqkv, b.dqkv, 3 * H, s.xn1, H, rows, H, 3 * H}, p(y.wqkv), nullptr);
      nn::layernorm_bwd(dx, g(y.ln1g), g(y.ln1b), b.dt2, s.x, p(y.ln1g), s.m1, s.r1, rows, H, true);
    } else {
      // a = x: dx = du1 + da
      lin_bwd_held(hold, dx, H, {y.wqkv, y.bqkv, b.dqkv, 3 * H, s.x, H, rows, H, 3 * H}, p(y.wqkv), nullptr,
                   /*accumulate=*/true);
    }
    if (!hold) layer_grads_ready(y.begin, y.end);
  }
}

void EncoderImpl::embed_backward(const Batch& bt) {
  const ModelConfig& c = cfg_;
  const Layout& L = *layout_;
  const int64_t B = bt.B, H = c.hidden;
  const float* dx = bufs_->dx;  // (rows, H) gradient of the first layer's input
  if (c.kind == ModelKind::kwt) {
    const int64_t P = c.num_patches, T = P + 1;
    float* dcls = g(L.cls);
    float* dpos = g(L.pos);
    // Fixed order over the batch: the same bits for any thread count.
    for_rows(T, B * H, [&](int64_t i) {
      for (int64_t s = 0; s < B; ++s)
        for (int64_t k = 0; k < H; ++k) dpos[i * H + k] += dx[(s * T + i) * H + k];
    });
    for (int64_t s = 0; s < B; ++s)
      for (int64_t k = 0; k < H; ++k) dcls[k] += dx[s * T * H + k];
    float* dproj = bufs_->dt2;  // (B·P, H) the patch rows' gradient
    for_rows(B * P, H, [&](int64_t r) {
      const int64_t s = r / P, i = r % P;
      std::memcpy(dproj + r * H, dx + (s * T + i + 1) * H, sizeof(float) * static_cast<size_t>(H));
    });
    lin_bwd(nullptr, 0, g(L.patch_w), g(L.patch_b), dproj, H, bt.features.data(), c.input_dim, nullptr, B * P,
            c.input_dim, H);
    return;
  }
  const int64_t T = bt.T, rows = B * T;
  float* de = bufs_->dt2;  // (rows, H)
  nn::layernorm_bwd(de, g(L.elng), g(L.elnb), dx, bufs_->e, p(L.elng), bufs_->em, bufs_->er, rows, H);
  nn::embedding_bwd(g(L.word), bt.ids.data(), de, rows, H, c.vocab);
  if (L.type >= 0) nn::embedding_bwd(g(L.type), zero_types_.data(), de, rows, H, c.type_vocab);
  float* dpos = g(L.pos) + c.position_offset * H;
  for_rows(T, B * H, [&](int64_t t) {  // fixed order over the batch: deterministic
    float* row = dpos + static_cast<int64_t>(seq_.local_pos[static_cast<size_t>(t)]) * H;  // global position
    for (int64_t s = 0; s < B; ++s)
      for (int64_t k = 0; k < H; ++k) row[k] += de[(s * T + t) * H + k];
  });
}

// ---- entry points

StepResult EncoderImpl::forward_backward(const Batch& bt, bool train, uint64_t step, double divisor) {
  const double t0 = ms_now();
  check_batch(bt);
  if (train) {
    check_f32_weights("training");
    att_->check_trainable();
    (void)grads();
  }
  const ModelConfig& c = cfg_;
  // With the sequence split: this rank's positions of every sequence, and (unless given) the
  // divisor of the whole batch, which no rank counts alone.
  if (split_on() && divisor <= 0 && *head_ != TaskKind::classify)
    divisor = static_cast<double>(std::max<int64_t>(1, std::count_if(bt.targets.begin(), bt.targets.end(),
                                                                     [](int32_t t) { return t != -1; })));
  const int64_t B = bt.B, T = begin_split(c.kind == ModelKind::kwt ? c.num_patches + 1 : bt.T), rows = B * T, H = c.hidden;
  Batch part;
  if (split_on()) part = local_batch(bt);
  const Batch& b = split_on() ? part : bt;
  carve(B, T, train, true);
  att_->ms = dense_ms_ = 0;
  if (c.kind == ModelKind::kwt) embed_features(bt.features.data(), B);
  else embed_tokens(b.ids.data(), nullptr, B, T);
  // KWT sequences are the class token and every patch: no padding.
  const std::span<const int32_t> lengths = c.kind == ModelKind::kwt ? std::span<const int32_t>() : std::span<const int32_t>(bt.lengths);
  forward_layers(B, T, lengths, train, step, bt.first);
  final_norm(rows);
  StepResult res;
  const float scale = divisor > 0 ? static_cast<float>(1.0 / divisor) : 0.f;
  float* dxf = bufs_->dt2;  // (rows, H) gradient of the final hidden state
  if (*head_ == TaskKind::classify) {
    pool(B, T, lengths);
    pooled_loss(bt, layout_->cls_w, layout_->cls_b, train, scale, res);
    if (train) pool_backward(B, T, lengths, dxf);
  } else if (layout_->mlm_tw >= 0) {
    mlm_transform(rows);
    token_loss(b, bufs_->mt, bufs_->mdt, layout_->word, layout_->mlm_b, train, scale, res);
    if (train) mlm_transform_backward(rows, dxf);
  } else {
    token_loss(b, bufs_->xf, dxf, layout_->word, layout_->mlm_b, train, scale, res);
  }
  if (!train) return timed(res, t0);
  if (layout_->flng >= 0)
    nn::layernorm_bwd(bufs_->dx, g(layout_->flng), g(layout_->flnb), dxf, bufs_->xl, p(layout_->flng), bufs_->fm, bufs_->fr, rows, H);
  else
    std::memcpy(bufs_->dx, dxf, sizeof(float) * static_cast<size_t>(rows * H));
  backward_layers(B, T, lengths, step, bt.first);
  embed_backward(b);
  other_grads_ready(layout_->layers.front().begin, layout_->layers.back().end);
  release_weights(layout_->layers.front().begin, layout_->layers.front().end);
  return timed(res, t0);
}

int64_t EncoderImpl::encode_tokens(std::span<const int32_t> ids, int64_t B, int64_t T, std::span<const int32_t> lengths,
                               std::span<const int32_t> types) {
  const ModelConfig& c = cfg_;
  check(c.kind == ModelKind::bert, "encoder: forward_tokens needs a token model (bert); this is ", c.model_type,
        " (use forward_features)");
  check(B >= 1 && T >= 1 && static_cast<int64_t>(ids.size()) == B * T, "encoder: ids must hold B x T = ",
        B, " x ", T, " tokens, got ", ids.size());
  check(T <= c.max_positions, "encoder: T = ", T, " exceeds max_position_embeddings ", c.max_positions);
  check(types.empty() || static_cast<int64_t>(types.size()) == B * T, "encoder: token types must be B x T");
  check(lengths.empty() || static_cast<int64_t>(lengths.size()) == B, "encoder: lengths must have B = ", B, " entries");
  for (int32_t len : lengths) check(len >= 1 && len <= T, "encoder: every length must be in [1, T = ", T, "], got ", len);
  for (int32_t v : types) check(v >= 0 && v < std::max<int64_t>(c.type_vocab, 1), "encoder: token type ", v, " out of range");
  const int64_t Tg = T;
  T = begin_split(Tg);
  std::vector<int32_t> local_ids, local_types;
  if (split_on()) {  // this rank's positions
    take_local(ids, B, local_ids);
    ids = local_ids;
    if (!types.empty()) {
      take_local(types, B, local_types);
      types = local_types;
    }
  }
  carve(B, T, false, false);
  att_->ms = dense_ms_ = 0;
  embed_tokens(ids.data(), types.empty() ? nullptr : types.data(), B, T);
  forward_layers(B, T, lengths, false, 0, 0);
  final_norm(B * T);
  return T;
}

Tensor EncoderImpl::forward_tokens(std::span<const int32_t> ids, int64_t B, int64_t T, std::span<const int32_t> lengths,
                               std::span<const int32_t> types) {
  const ModelConfig& c = cfg_;
  const ThreadLimit threads(threads_for_flops(inference_flops(B * T, static_cast<double>(T))));
  T = encode_tokens(ids, B, T, lengths, types);
  if (layout_->cls_w < 0) {
    Tensor out(Shape{B, T, c.hidden});  // (B, n, hidden): this rank's positions when split
    std::memcpy(out.data(), bufs_->xf, sizeof(float) * static_cast<size_t>(B * T * c.hidden));
    return out;
  }
  pool(B, T, lengths);
  Tensor logits(Shape{B, c.num_labels});
  lin(logits.data(), c.num_labels, bufs_->hs, c.hidden, layout_->cls_w, p(layout_->cls_b), B, c.hidden, c.num_labels);
  return logits;
}

Tensor EncoderImpl::forward_mlm(std::span<const int32_t> ids, int64_t B, int64_t T, std::span<const int32_t> lengths) {
  const ModelConfig& c = cfg_;
  check(head_ && *head_ == TaskKind::mlm, "encoder: forward_mlm needs the masked-token head (a model trained with ",
        "--task mlm: cls.predictions.bias); this model has ", head_ ? task_kind_name(*head_) : "no head");
  const ThreadLimit threads(threads_for_flops(inference_flops(B * T, static_cast<double>(T))));
  T = encode_tokens(ids, B, T, lengths, {});
  // The output layer is tied to the word embeddings: logits = xf · Wordᵀ + bias (after the
  // pretrained head's transform, when it has one).
  const float* x = bufs_->xf;
  if (layout_->mlm_tw >= 0) {
    mlm_transform(B * T);
    x = bufs_->mt;
  }
  Tensor logits(Shape{B, T, c.vocab});  // (B, n, vocab): this rank's positions when split
  lin(logits.data(), c.vocab, x, c.hidden, layout_->word, p(layout_->mlm_b), B * T, c.hidden, c.vocab);
  return logits;
}

void EncoderImpl::mlm_transform(int64_t rows) {
  const int64_t H = cfg_.hidden;
  const nn::Gelu gk = cfg_.gelu_tanh ? nn::Gelu::tanh : nn::Gelu::erf;
  lin(bufs_->mu, H, bufs_->xf, H, layout_->mlm_tw, p(layout_->mlm_tb), rows, H, H);
  nn::gelu_fwd(bufs_->mg, bufs_->mu, rows * H, gk);
  nn::layernorm_fwd(bufs_->mt, bufs_->mg, p(layout_->mlm_lng), p(layout_->mlm_lnb), rows, H, cfg_.eps, bufs_->mstat, bufs_->mstat + rows);
}

void EncoderImpl::mlm_transform_backward(int64_t rows, float* dxf) {
  const int64_t H = cfg_.hidden;
  const nn::Gelu gk = cfg_.gelu_tanh ? nn::Gelu::tanh : nn::Gelu::erf;
  float* d = bufs_->mdt;  // (rows, H): d(LN output) in, then d(GELU output), then d(dense output)
  nn::layernorm_bwd(d, g(layout_->mlm_lng), g(layout_->mlm_lnb), d, bufs_->mg, p(layout_->mlm_lng), bufs_->mstat, bufs_->mstat + rows, rows, H);
  nn::gelu_bwd(d, d, bufs_->mu, rows * H, gk);
  lin_bwd(dxf, H, g(layout_->mlm_tw), g(layout_->mlm_tb), d, H, bufs_->xf, H, p(layout_->mlm_tw), rows, H, H);
}

Tensor EncoderImpl::forward_features(ConstView features) {
  const ModelConfig& c = cfg_;
  check(c.kind == ModelKind::kwt, "encoder: forward_features needs a KWT model; this is ", c.model_type);
  check(features.rank() == 3 && features.dim(1) == c.num_patches && features.dim(2) == c.input_dim,
        "encoder: features must be (B, ", c.num_patches, ", ", c.input_dim, "), got ", features.shape);
  check(features.contiguous(), "encoder: features must be contiguous");
  const int64_t B = features.dim(0), T = begin_split(c.num_patches + 1);
  check(B >= 1, "encoder: features hold no example");
  const ThreadLimit threads(threads_for_flops(inference_flops(B * T, static_cast<double>(T))));
  for (int64_t i = 0; i < features.numel(); ++i)
    check(std::isfinite(features.data[i]), "encoder: features must be finite, found ", features.data[i], " at flat index ", i);
  carve(B, T, false, false);
  att_->ms = dense_ms_ = 0;
  embed_features(features.data, B);
  forward_layers(B, T, {}, false, 0, 0);
  final_norm(B * T);
  pool(B, T, {});
  Tensor logits(Shape{B, c.num_labels});
  lin(logits.data(), c.num_labels, bufs_->hs, c.hidden, layout_->cls_w, p(layout_->cls_b), B, c.hidden, c.num_labels);
  return logits;
}

// ---- Encoder, the public handle

Encoder::Encoder(std::unique_ptr<EncoderImpl> impl) : Model(std::move(impl)) {}
Encoder::~Encoder() = default;
EncoderImpl& Encoder::impl() const { return static_cast<EncoderImpl&>(*impl_); }

std::unique_ptr<Encoder> Encoder::random_bert(const ModelConfig& cfg, uint64_t seed) {
  return std::unique_ptr<Encoder>(new Encoder(EncoderImpl::random_bert(cfg, seed)));
}

Tensor Encoder::forward_tokens(std::span<const int32_t> ids, int64_t B, int64_t T, std::span<const int32_t> lengths,
                               std::span<const int32_t> types) {
  return impl().forward_tokens(ids, B, T, lengths, types);
}

Tensor Encoder::forward_mlm(std::span<const int32_t> ids, int64_t B, int64_t T, std::span<const int32_t> lengths) {
  return impl().forward_mlm(ids, B, T, lengths);
}

Tensor Encoder::forward_features(ConstView features) { return impl().forward_features(features); }

}  // namespace clattn
