// What the architectures share (ModelImpl, model_impl.h): the flat parameter and gradient
// buffers with their Hugging Face names, loading and saving checkpoints, the attention stack, the
// arena, timed dense layers, residual dropout and the loss heads; and Model (model.h), the handle
// over it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "clattn/atomic_file.h"
#include "clattn/cpu.h"
#include "clattn/error.h"
#include "clattn/input_file.h"
#include "clattn/gemm.h"
#include "clattn/nn.h"
#include "clattn/threads.h"
#include "clattn/rng.h"
#include "clattn/safetensors.h"
#include "core/microkernel.h"
#include "model/layer_attention.h"
#include "model/model_impl.h"
#include "model/model_internal.h"
#include "model/weights.h"

namespace clattn {

using model::ms_now;

namespace {

// The layer a tensor name belongs to: N of a "layers.N.", "layer.N." or "h.N." component (LLaMA,
// BERT, GPT-2 naming), else -1.
int64_t layer_of(const std::string& name) {
  for (const std::string key : {"layers.", "layer.", "h."}) {
    for (size_t at = name.find(key); at != std::string::npos; at = name.find(key, at + 1)) {
      if (at != 0 && name[at - 1] != '.') continue;
      size_t i = at + key.size(), j = i;
      while (j < name.size() && j - i < 9 && name[j] >= '0' && name[j] <= '9') ++j;
      if (j > i && j < name.size() && name[j] == '.') return std::stoll(name.substr(i, j - i));
    }
  }
  return -1;
}


std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// config.json's name for each size of `c`, as its family spells it, with the value read: what an
// error about a tensor the config sized can point at.
std::vector<std::pair<std::string, int64_t>> size_fields(const ModelConfig& c) {
  if (c.model_type == "distilbert")
    return {{"dim", c.hidden}, {"hidden_dim", c.ffn}, {"vocab_size", c.vocab}, {"max_position_embeddings", c.max_positions}};
  if (c.model_type == "gpt2")
    return {{"n_embd", c.hidden}, {"n_inner", c.ffn}, {"vocab_size", c.vocab}, {"n_positions", c.max_positions}};
  std::vector<std::pair<std::string, int64_t>> f{{"hidden_size", c.hidden}, {"intermediate_size", c.ffn},
                                                 {"vocab_size", c.vocab}, {"max_position_embeddings", c.max_positions}};
  if (c.kind == ModelKind::llama) {
    f.emplace_back("num_attention_heads x head_dim", c.heads * c.head_dim);
    f.emplace_back("num_key_value_heads x head_dim", c.kv_heads * c.head_dim);
  }
  if (c.kind == ModelKind::bert) f.emplace_back("type_vocab_size", c.type_vocab);
  if (c.kind == ModelKind::kwt) f.emplace_back("input_dim", c.input_dim);
  f.emplace_back("num_labels", c.num_labels);
  return f;
}

std::string params_what(const ModelConfig& c) {
  return detail::concat("model: the parameters of a ", c.model_type.empty() ? "new" : c.model_type, " model of ",
                        c.layers, " layers (hidden ", c.hidden, ", ffn ", c.ffn, ", vocab ", c.vocab, ")");
}

const char* layers_field(const ModelConfig& c) {
  return c.model_type == "distilbert" ? "n_layers" : c.model_type == "gpt2" ? "n_layer" : "num_hidden_layers";
}

}  // namespace

ModelImpl::ModelImpl(const ModelConfig& cfg, const CheckpointNames* ckpt, WeightType weights)
    : cfg_(cfg), ckpt_(ckpt), weights_(weights) {
  if (ckpt_) prefix_ = ckpt_->prefix;
}
ModelImpl::~ModelImpl() = default;

TaskKind ModelImpl::head() const {
  check(head_.has_value(), "model: this ", cfg_.model_type, " model has no task head");
  return *head_;
}

void ModelImpl::set_attention(const std::string& plan) { att_->set_plan(plan); }
const std::string& ModelImpl::attention_plan() const { return att_->plan(); }
const std::vector<std::string>& ModelImpl::attention_specs() const { return att_->specs(); }
bool ModelImpl::trainable() const { return att_->trainable(); }
void ModelImpl::set_capture(AttentionCapture* cap) { att_->capture = cap; }
double ModelImpl::last_attention_ms() const { return att_->ms; }

void ModelImpl::set_dropout(float p) {
  check(p >= 0.f && p < 1.f, "model: dropout must be in [0, 1), got ", p);
  check(p == 0.f || !split_on(), "model: dropout with the sequence split across ranks is not supported (its masks ",
        "are drawn per whole sequence); train without dropout or without --sequence-parallel");
  dropout_ = p;
}

void ModelImpl::set_sequence_parallel(Communicator* comm) {
  if (comm && comm->size() > 1) {
    check(cfg_.kind != ModelKind::kwt, "model: a KWT model's clips (", cfg_.num_patches + 1,
          " positions) are too short to split across ranks; run data parallel over the batch instead");
    check(dropout_ == 0.f, "model: dropout with the sequence split across ranks is not supported (its masks are ",
          "drawn per whole sequence)");
  }
  att_->set_split(comm && comm->size() > 1 ? comm : nullptr, &seq_.split);
  seq_.comm = comm;
}

SeqSplit ModelImpl::sequence_split(int64_t T) const {
  const int R = split_on() ? seq_.comm->size() : 1;
  return causal() ? SeqSplit::zig_zag(T, R) : SeqSplit::contiguous(T, R);
}

int64_t ModelImpl::begin_split(int64_t T) {
  seq_.T = T;
  if (!split_on()) {
    if (static_cast<int64_t>(seq_.local_pos.size()) != T) {
      seq_.local_pos.resize(static_cast<size_t>(T));
      for (int64_t i = 0; i < T; ++i) seq_.local_pos[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    }
    return T;
  }
  check(T >= seq_.comm->size(), "model: a sequence of ", T, " positions cannot be split over ", seq_.comm->size(),
        " ranks (each needs one)");
  check(!causal() || T >= 2 * seq_.comm->size(), "model: a causal sequence of ", T, " positions cannot be split over ",
        seq_.comm->size(), " ranks (the zig-zag layout needs 2 per rank)");
  if (seq_.split.N != T || seq_.split.ranks != seq_.comm->size()) seq_.split = sequence_split(T);
  const int r = seq_.comm->rank();
  const int64_t n = seq_.split.local_rows(r);
  seq_.local_pos.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) seq_.local_pos[static_cast<size_t>(i)] = static_cast<int32_t>(seq_.split.global(r, i));
  return n;
}

void ModelImpl::take_local(std::span<const int32_t> all, int64_t B, std::vector<int32_t>& out) const {
  const int64_t n = static_cast<int64_t>(seq_.local_pos.size()), T = seq_.T;
  out.resize(static_cast<size_t>(B * n));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i)
      out[static_cast<size_t>(b * n + i)] = all[static_cast<size_t>(b * T + seq_.local_pos[static_cast<size_t>(i)])];
}

Batch ModelImpl::local_batch(const Batch& b) const {
  Batch part;
  part.B = b.B;
  part.T = static_cast<int64_t>(seq_.local_pos.size());
  part.lengths = b.lengths;
  part.first = b.first;
  take_local(b.ids, b.B, part.ids);
  part.targets = b.targets;
  if (head_ && *head_ != TaskKind::classify) take_local(b.targets, b.B, part.targets);
  return part;
}

ConstView ModelImpl::last_hidden() const { return make_view(head_ws_.xf, Shape{head_ws_.rows_xf, cfg_.hidden}); }

double ModelImpl::inference_flops(int64_t rows, double keys) const {
  const double r = static_cast<double>(rows);
  const double head_dim = cfg_.head_dim > 0 ? static_cast<double>(cfg_.head_dim)
                                            : static_cast<double>(cfg_.hidden) / static_cast<double>(std::max<int64_t>(cfg_.heads, 1));
  return 2.0 * static_cast<double>(param_count()) * r +
         4.0 * static_cast<double>(cfg_.layers * cfg_.heads) * head_dim * keys * r;
}

double ModelImpl::train_bytes(int64_t B, int64_t T) const {
  if (split_on()) T = sequence_split(T).local_rows(seq_.comm->rank());
  const AttentionDims d{B, cfg_.heads, cfg_.kv_heads, T, T, cfg_.head_dim, cfg_.head_dim};
  return 4.0 * arena_floats(B, T, true) + att_->workspace_bytes(d, true) + 4.0 * 4.0 * static_cast<double>(param_count());
}

int64_t ModelImpl::add(const std::string& name, std::vector<int64_t> shape, Init init, bool transposed) {
  check(!transposed || shape.size() == 2, "model: internal: only a matrix is stored transposed");
  // Only an encoder's own tensors take the checkpoint's family prefix ("bert.", "roberta.",
  // "distilbert."), never the task heads.
  bool head = false;
  for (const char* h : {"classifier.", "cls.", "pre_classifier.", "lm_head.", "vocab_"}) head |= name.rfind(h, 0) == 0;
  if (ckpt_) expect_tensor(head ? name : prefix_ + name, name, transposed ? std::vector<int64_t>{shape[1], shape[0]} : shape);
  // Each size is at most 2^31 (config.cpp), so a product may pass 2^63: sum in double first.
  const int64_t off = info_.empty() ? 0 : info_.back().offset + info_.back().size;
  double numel = 1;
  for (int64_t d : shape) numel *= static_cast<double>(d);
  if (static_cast<double>(off) + numel > 0x1p50) refuse_size(static_cast<double>(off) + numel);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  info_.push_back({name, std::move(shape), off, n, init == Init::normal});
  inits_.push_back(init);
  prefixed_.push_back(!head);
  transposed_.push_back(transposed);
  linear_.push_back(false);
  return off;
}

int64_t ModelImpl::add_linear(const std::string& name, std::vector<int64_t> shape, bool transposed) {
  const int64_t off = add(name, std::move(shape), Init::normal, transposed);
  linear_.back() = true;
  return off;
}

size_t ModelImpl::param_index(int64_t off) const {
  auto it = std::upper_bound(info_.begin(), info_.end(), off,
                             [](int64_t o, const ParamInfo& pi) { return o < pi.offset; });
  check(it != info_.begin() && off < std::prev(it)->offset + std::prev(it)->size, "model: internal: no parameter at offset ", off);
  return static_cast<size_t>(std::prev(it) - info_.begin());
}

int64_t ModelImpl::f32_at_mapped(int64_t off) const {
  const size_t i = param_index(off);
  check(!linear_[i], "model: internal: '", info_[i].name, "' is held in ", weight_type_name(weights_),
        "; read it through weight()");
  return at_[i] + (off - info_[i].offset);
}

WeightMatrix ModelImpl::weight(int64_t off, int64_t in) const {
  if (at_.empty()) return WeightMatrix{p(off), in, WeightType::f32};
  const size_t i = param_index(off);
  if (!linear_[i]) return WeightMatrix{p(off), in, WeightType::f32};
  return WeightMatrix{half_.data() + at_[i] + (off - info_[i].offset), in, weights_};
}

void ModelImpl::check_f32_weights(const char* what) const {
  check(at_.empty(), "model: ", what, " needs f32 weights, and this model holds its linear layers' weights in ",
        weight_type_name(weights_), " (loaded with weights ", weight_type_name(weights_),
        ", for inference only); load it with weights f32");
}

double ModelImpl::param_bytes() const {
  return 4.0 * static_cast<double>(params_.size()) + 2.0 * static_cast<double>(half_.size());
}

void ModelImpl::expect_tensor(const std::string& stored, const std::string& name, const std::vector<int64_t>& shape) const {
  const Weights& w = *ckpt_->w;
  auto config = [&] { return (std::filesystem::path(w.dir()) / "config.json").string(); };
  if (!w.has(stored)) {
    if (std::find(ckpt_->optional.begin(), ckpt_->optional.end(), name) != ckpt_->optional.end()) return;
    // A whole layer absent: the config claims more layers than the checkpoint holds.
    const int64_t layer = layer_of(name);
    int64_t held = 0;
    bool in_layer = false;
    for (const std::string& n : w.names()) {
      const int64_t l = layer_of(n);
      held = std::max(held, l + 1);
      in_layer |= l == layer;
    }
    if (layer >= 0 && !in_layer)
      fail("config '", config(), "': \"", layers_field(cfg_), "\" = ", cfg_.layers, " but the checkpoint holds ", held,
           " layers (no tensor '", stored, "')");
    fail("model '", w.dir(), "': tensor '", stored, "' ", shape_str(shape), " is missing from the checkpoint");
  }
  const std::vector<int64_t> have = w.shape(stored);
  if (have == shape) return;
  // Point at the fields whose values the misfit sizes are.
  std::string fields;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < have.size() && have.size() == shape.size() && have[i] == shape[i]) continue;
    for (const auto& [field, v] : size_fields(cfg_))
      if (v == shape[i] && fields.find("\"" + field + "\"") == std::string::npos)
        fields += detail::concat(fields.empty() ? " (" : ", ", "\"", field, "\" = ", v);
  }
  if (!fields.empty()) fields += ")";
  fail("config '", config(), "' disagrees with the checkpoint: tensor '", stored, "' of '", w.file(stored),
       "' has shape ", shape_str(have), " but the config implies ", shape_str(shape), fields);
}

void ModelImpl::refuse_size(double floats) const {
  const std::string what = params_what(cfg_);
  check_memory(4.0 * floats, what);
  char need[32];
  std::snprintf(need, sizeof need, "%.4g GB", 4.0 * floats / 1e9);
  fail(what, " needs about ", need, " of memory: more than any machine holds");
}

void ModelImpl::check_layers_fit(int64_t first_layer_begin) {
  // A checkpoint's model is no larger than its checkpoint, already in memory: every add() has
  // found its tensor there.
  if (ckpt_) return;
  const int64_t end = info_.back().offset + info_.back().size;
  const double floats = static_cast<double>(first_layer_begin) +
                        static_cast<double>(end - first_layer_begin) * static_cast<double>(cfg_.layers);
  // The layout's own records (a name, a shape) cost about 128 bytes per tensor.
  const double records = static_cast<double>(info_.size()) * static_cast<double>(cfg_.layers) * 32.0;
  if (floats + records > 0x1p50) refuse_size(floats + records);
  check_memory(4.0 * (floats + records), params_what(cfg_));
}

void ModelImpl::allocate() {
  ckpt_ = nullptr;  // it lives in the factory that called the constructor
  const int64_t n = param_count();
  if (weights_ == WeightType::f32 || std::find(linear_.begin(), linear_.end(), true) == linear_.end()) {
    check_memory(4.0 * static_cast<double>(n), params_what(cfg_));
    params_.assign(static_cast<size_t>(n), 0.f);
    return;
  }
  // Each linear weight in half_, everything else in params_, both in layout order, so matrices
  // that are adjacent in the layout (q|k|v, gate|up) stay one matrix.
  int64_t nf = 0, nh = 0, ws = 0;
  at_.resize(info_.size());
  for (size_t i = 0; i < info_.size(); ++i) {
    int64_t& next = linear_[i] ? nh : nf;
    at_[i] = next;
    next += info_[i].size;
    // Sized for any row count: a fused matrix (q|k|v) has more rows than its parts.
    if (linear_[i]) ws = std::max(ws, linear_gemm_workspace(weights_, int64_t{1} << 40, info_[i].shape[1]));
  }
  check_memory(4.0 * static_cast<double>(nf) + 2.0 * static_cast<double>(nh), params_what(cfg_));
  params_.assign(static_cast<size_t>(nf), 0.f);
  half_.assign(static_cast<size_t>(nh), 0);
  widen_.assign(static_cast<size_t>(ws), 0.f);
}

std::span<float> ModelImpl::grads() {
  check_f32_weights("grads()");
  if (grads_.size() != params_.size()) grads_.assign(params_.size(), 0.f);
  return {grads_.data(), grads_.size()};
}

void ModelImpl::zero_grads() {
  check_f32_weights("zero_grads()");
  if (grads_.size() != params_.size()) grads_.assign(params_.size(), 0.f);
  else std::memset(grads_.data(), 0, sizeof(float) * grads_.size());
}

const ParamInfo& ModelImpl::param(const std::string& name) const {
  for (const ParamInfo& pi : info_)
    if (pi.name == name) return pi;
  fail("model: no parameter '", name, "'");
}

void ModelImpl::init(uint64_t seed) {
  const Rng rng(seed);
  for (size_t i = 0; i < info_.size(); ++i) {
    const int64_t n = info_[i].size;
    if (is_half(i)) {  // the f32 draws, rounded
      const mk::Half f = weights_ == WeightType::f16 ? mk::Half::f16 : mk::Half::bf16;
      uint16_t* h = half_.data() + at_[i];
      parallel_for((n + 4095) / 4096, [&](int64_t blk) {
        float tmp[4096];
        const int64_t j0 = blk * 4096, j1 = std::min(n, j0 + 4096);
        for (int64_t j = j0; j < j1; ++j) tmp[j - j0] = 0.02f * rng.normal(i, static_cast<uint64_t>(j));
        mk::to_half(f, tmp, j1 - j0, h + j0);
      });
      continue;
    }
    float* d = p(info_[i].offset);
    if (inits_[i] == Init::normal) {
      parallel_for((n + 4095) / 4096, [&](int64_t blk) {
        for (int64_t j = blk * 4096; j < std::min(n, (blk + 1) * 4096); ++j)
          d[j] = 0.02f * rng.normal(i, static_cast<uint64_t>(j));
      });
    } else {
      std::fill(d, d + n, inits_[i] == Init::one ? 1.f : 0.f);
    }
  }
}


void ModelImpl::load_weights(Weights& w, bool verbose, const std::vector<std::string>& optional) {
  for (size_t i = 0; i < info_.size(); ++i) {
    const ParamInfo& pi = info_[i];
    const std::string name = (prefixed_[i] ? prefix_ : "") + pi.name;
    if (!w.has(name) && std::find(optional.begin(), optional.end(), pi.name) != optional.end()) continue;
    if (is_half(i)) {
      const std::vector<int64_t> stored = transposed_[i] ? std::vector<int64_t>{pi.shape[1], pi.shape[0]} : pi.shape;
      w.get16(name, stored, weights_, half_.data() + at_[i], transposed_[i]);
      continue;
    }
    if (transposed_[i]) {
      const int64_t out = pi.shape[0], in = pi.shape[1];
      const float* src = w.get(name, {in, out});  // (in, out)
      float* dst = p(pi.offset);                  // (out, in)
      for (int64_t r = 0; r < in; ++r)
        for (int64_t c = 0; c < out; ++c) dst[c * in + r] = src[r * out + c];
      continue;
    }
    const float* src = w.get(name, pi.shape);
    std::memcpy(p(pi.offset), src, sizeof(float) * static_cast<size_t>(pi.size));
  }
  // A tied output layer may still be stored; it must have the embedding's shape.
  if (cfg_.kind == ModelKind::llama && cfg_.tie_embeddings && w.has("lm_head.weight"))
    (void)w.get("lm_head.weight", {cfg_.vocab, cfg_.hidden});
  att_->load_state(w);
  // Tensors of a layer past the config's count (weights of 5 layers, a config of 4) would be
  // dropped silently: the two disagree, and neither can be trusted.
  for (const std::string& n : w.unused()) {
    const int64_t layer = layer_of(n);
    if (layer >= cfg_.layers)
      fail("model '", w.dir(), "': tensor '", n, "' belongs to layer ", layer, ", but config.json has ",
           cfg_.layers, " layers (num_hidden_layers): the weights and the config disagree");
  }
  if (verbose)
    for (const std::string& n : w.unused())
      if (n.rfind("clattn.attention_state.", 0) != 0)
        std::fprintf(stderr, "model '%s': ignoring unused tensor '%s'\n", w.dir().c_str(), n.c_str());
}

void ModelImpl::save(const std::string& dir) const {
  check_f32_weights("save()");
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  check(fs::is_directory(dir), "model: cannot create the checkpoint folder '", dir, "'");
  SafetensorsWriter w;
  for (size_t i = 0; i < info_.size(); ++i) {
    const ParamInfo& pi = info_[i];
    const std::string name = (prefixed_[i] ? prefix_ : "") + pi.name;
    if (!transposed_[i]) {
      w.add(name, make_view(params_.data() + pi.offset, Shape(pi.shape)));
      continue;
    }
    const int64_t out = pi.shape[0], in = pi.shape[1];
    Tensor t(Shape{in, out});  // (in, out) as the checkpoint stores it; add() copies it
    const float* src = p(pi.offset);
    for (int64_t r = 0; r < in; ++r)
      for (int64_t c = 0; c < out; ++c) t.data()[r * out + c] = src[c * in + r];
    w.add(name, t.view());
  }
  // Layer state of stateful attentions (routing's EMA centroids) beside the weights.
  att_->save_state(w);
  w.set_metadata("format", "pt");
  w.write((fs::path(dir) / "model.safetensors").string());
  write_file_atomic((fs::path(dir) / "config.json").string(), model_config_json(cfg_, head_, att_->plan()));
}

void ModelImpl::check_batch(const Batch& b) const {
  check(head_.has_value(), "model: this ", cfg_.model_type, " model has no task head to train or evaluate");
  check(b.B >= 1 && b.T >= 1, "model: batch must have B >= 1 and T >= 1, got B=", b.B, " T=", b.T);
  if (cfg_.kind == ModelKind::kwt) {
    check(b.T == cfg_.num_patches && b.feature_dim == cfg_.input_dim &&
              static_cast<int64_t>(b.features.size()) == b.B * b.T * b.feature_dim,
          "model: a KWT batch holds features (B, ", cfg_.num_patches, ", ", cfg_.input_dim, "), got T=", b.T,
          " feature_dim=", b.feature_dim, " and ", b.features.size(), " values");
  } else {
    check(static_cast<int64_t>(b.ids.size()) == b.B * b.T, "model: batch ids must hold B x T = ", b.B * b.T,
          " tokens, got ", b.ids.size());
  }
  check(static_cast<int64_t>(b.lengths.size()) == b.B, "model: batch lengths must have B = ", b.B,
        " entries, got ", b.lengths.size());
  for (int32_t len : b.lengths) check(len >= 1 && len <= b.T, "model: every length must be in [1, T = ", b.T, "], got ", len);
  const int64_t nt = *head_ == TaskKind::classify ? b.B : b.B * b.T;
  check(static_cast<int64_t>(b.targets.size()) == nt, "model: the ", task_kind_name(*head_), " head needs ", nt,
        " targets, the batch has ", b.targets.size());
  check(b.first >= 0, "model: Batch::first must be >= 0, got ", b.first);
  if (cfg_.kind == ModelKind::bert)
    check(b.T <= cfg_.max_positions, "model: T = ", b.T, " exceeds max_position_embeddings ", cfg_.max_positions);
  if (cfg_.kind == ModelKind::llama && cfg_.max_positions > 0)
    check(b.T <= cfg_.max_positions, "model: T = ", b.T, " exceeds max_position_embeddings ", cfg_.max_positions);
}

float* ModelImpl::arena(int64_t n) {
  if (arena_.numel() < n) arena_.resize(Shape{n});
  return arena_.data();
}

double ModelImpl::arena_floats(int64_t B, int64_t T, bool train) const {
  return static_cast<double>(plan_floats(B, T, train, true));
}

void ModelImpl::carve(int64_t B, int64_t T, bool train, bool head) {
  if (B == B_ && T == T_ && train == train_layout_ && head == head_layout_) return;
  const ArenaPlan& a = carve_into(arena(plan_floats(B, T, train, head)), B, T, train, head);
  head_ws_.hs = a.hs;
  head_ws_.dhs = a.dhs;
  head_ws_.logits = a.logits;
  // Token targets (B·T), or one per sequence (B) for the pooled head.
  head_ws_.sel.assign(static_cast<size_t>(B * T), 0);
  head_ws_.tsel.assign(static_cast<size_t>(std::max(B * T, B)), 0);
  B_ = B;
  T_ = T;
  train_layout_ = train;
  head_layout_ = head;
}

void ModelImpl::lin(float* y, int64_t ldy, const float* x, int64_t ldx, int64_t w_off, const float* b, int64_t rows,
                int64_t in, int64_t out, const float* res) {
  const double t0 = ms_now();
  const WeightMatrix wm = weight(w_off, in);
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(out);
  if (wm.type != WeightType::f32) {
    // y = res + b (or b, or 0) first, then the product with beta = 1, as for f32 below.
#pragma omp parallel for schedule(static) if (rows * out > 32768)
    for (int64_t r = 0; r < rows; ++r) {
      float* yr = y + r * ldy;
      if (res) {
        if (yr != res + r * ldy) std::memcpy(yr, res + r * ldy, row_bytes);
        if (b)
          for (int64_t e = 0; e < out; ++e) yr[e] += b[e];
      } else if (b) {
        std::memcpy(yr, b, row_bytes);
      } else {
        std::memset(yr, 0, row_bytes);
      }
    }
    if (rows > 0) linear_gemm(rows, out, in, 1.f, x, ldx, wm, 1.f, y, ldy, widen_.data());
    dense_ms_ += ms_now() - t0;
    return;
  }
  const float* w = static_cast<const float*>(wm.data);
  if (!res) {
    nn::linear_fwd(y, ldy, x, ldx, w, b, rows, in, out);
  } else {
    // y = res (a copy when not in place), then the product accumulating into it with the bias.
    if (res != y) {
#pragma omp parallel for schedule(static) if (rows * out > 32768)
      for (int64_t r = 0; r < rows; ++r) std::memcpy(y + r * ldy, res + r * ldy, row_bytes);
    }
    if (rows > 0) linear_product(rows, out, in, x, ldx, w, in, b, true, y, ldy);
  }
  dense_ms_ += ms_now() - t0;
}

void ModelImpl::lin_bwd(float* dx, int64_t lddx, float* dw, float* db, const float* dy, int64_t lddy, const float* x,
                    int64_t ldx, const float* w, int64_t rows, int64_t in, int64_t out, bool accumulate) {
  const double t0 = ms_now();
  nn::linear_bwd(dx, lddx, dw, db, dy, lddy, x, ldx, w, rows, in, out, accumulate);
  dense_ms_ += ms_now() - t0;
}

void ModelImpl::lin_bwd_held(bool hold, float* dx, int64_t lddx, const WeightGrad& wg, const float* w, float* keep,
                             bool accumulate) {
  if (!hold) {
    lin_bwd(dx, lddx, g(wg.w), wg.b >= 0 ? g(wg.b) : nullptr, wg.dy, wg.lddy, wg.x, wg.ldx, w, wg.rows, wg.in, wg.out,
            accumulate);
    return;
  }
  lin_bwd(dx, lddx, nullptr, nullptr, wg.dy, wg.lddy, nullptr, wg.ldx, w, wg.rows, wg.in, wg.out, accumulate);
  WeightGrad h = wg;
  if (keep) {
    model::for_rows(wg.rows, wg.out, [&](int64_t r) {
      std::memcpy(keep + r * wg.out, wg.dy + r * wg.lddy, sizeof(float) * static_cast<size_t>(wg.out));
    });
    h.dy = keep;
    h.lddy = wg.out;
  }
  held_.push_back(h);
}

void ModelImpl::release_weights(int64_t begin, int64_t end) {
  if (held_.empty()) return;
  // Each product's range (weight, and its bias where the layout puts it right after), reported as
  // soon as it is computed; the gaps between them afterwards.
  std::vector<std::pair<int64_t, int64_t>> done;
  auto ready = [&](int64_t lo, int64_t hi) {
    check(lo >= begin && hi <= end, "model: internal: held range [", lo, ", ", hi, ") outside the layer's [", begin,
          ", ", end, ")");
    layer_grads_ready(lo, hi);
    done.emplace_back(lo, hi);
  };
  for (const WeightGrad& h : held_) {
    lin_bwd(nullptr, 0, g(h.w), h.b >= 0 ? g(h.b) : nullptr, h.dy, h.lddy, h.x, h.ldx, nullptr, h.rows, h.in, h.out);
    const int64_t wend = h.w + h.in * h.out;
    if (h.b == wend) {
      ready(h.w, h.b + h.out);
    } else {
      ready(h.w, wend);
      if (h.b >= 0) ready(h.b, h.b + h.out);
    }
  }
  held_.clear();
  std::sort(done.begin(), done.end());
  int64_t at = begin;
  for (const auto& [lo, hi] : done) {
    if (lo > at) layer_grads_ready(at, lo);
    at = std::max(at, hi);
  }
  if (at < end) layer_grads_ready(at, end);
}

namespace {

// The dropout stream of (step, layer, branch) for one sequence, by its index in the step's global
// batch: masks never depend on how sequences are grouped into batches.
uint64_t dropout_seed(uint64_t step) { return step * 0x9E3779B97F4A7C15ull + 0xD1B54A32D192ED03ull; }
uint64_t dropout_stream(int64_t layer, int which, int64_t seq) {
  return (static_cast<uint64_t>(2 * layer + which) << 40) + static_cast<uint64_t>(seq);
}

}  // namespace

void ModelImpl::residual_dropout(float* dst, const float* src, float* branch, int64_t B, int64_t T, int64_t width,
                             int64_t layer, int which, uint64_t step, int64_t first) const {
  const int64_t n = T * width;
  for (int64_t s = 0; s < B; ++s)
    nn::dropout_fwd(branch + s * n, branch + s * n, n, dropout_, dropout_seed(step), dropout_stream(layer, which, first + s));
  if (dst != src) std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(B * n));
  nn::add_inplace(dst, branch, B * n);
}

void ModelImpl::dropout_grad(float* d, const float* dy, int64_t B, int64_t T, int64_t width, int64_t layer, int which,
                         uint64_t step, int64_t first) const {
  const int64_t n = T * width;
  for (int64_t s = 0; s < B; ++s)
    nn::dropout_bwd(d + s * n, dy + s * n, n, dropout_, dropout_seed(step), dropout_stream(layer, which, first + s));
}

void ModelImpl::token_loss(const Batch& b, const float* xf, float* dxf, int64_t w_off, int64_t b_off, bool train,
                       float scale_in, StepResult& r) {
  const int64_t H = cfg_.hidden, rows = b.B * b.T;
  const int64_t O = param_rows(w_off);
  const float* bias = b_off >= 0 ? p(b_off) : nullptr;
  // Only rows with a target go through the output layer (for mlm, 15 % of them).
  int64_t n = 0;
  for (int64_t i = 0; i < rows; ++i)
    if (b.targets[static_cast<size_t>(i)] != -1) {
      head_ws_.sel[static_cast<size_t>(n)] = static_cast<int32_t>(i);
      head_ws_.tsel[static_cast<size_t>(n)] = b.targets[static_cast<size_t>(i)];
      ++n;
    }
  model::for_rows(n, H, [&](int64_t i) {
    std::memcpy(head_ws_.hs + i * H, xf + static_cast<int64_t>(head_ws_.sel[static_cast<size_t>(i)]) * H, sizeof(float) * static_cast<size_t>(H));
  });
  if (train) std::memset(dxf, 0, sizeof(float) * static_cast<size_t>(rows * H));
  if (n == 0) return;
  lin(head_ws_.logits, O, head_ws_.hs, H, w_off, bias, n, H, O);
  for (int64_t i = 0; i < n; ++i) {
    const float* row = head_ws_.logits + i * O;
    if (std::max_element(row, row + O) - row == head_ws_.tsel[static_cast<size_t>(i)]) ++r.correct;
  }
  int64_t counted = 0;
  const float scale = scale_in > 0 ? scale_in : 1.f / static_cast<float>(n);
  r.loss_sum += nn::cross_entropy(train ? head_ws_.logits : nullptr, head_ws_.logits, head_ws_.tsel.data(), n, O, scale, &counted);
  r.counted += counted;
  if (!train) return;
  lin_bwd(head_ws_.dhs, H, g(w_off), b_off >= 0 ? g(b_off) : nullptr, head_ws_.logits, O, head_ws_.hs, H, p(w_off), n, H, O);
  model::for_rows(n, H, [&](int64_t i) {
    std::memcpy(dxf + static_cast<int64_t>(head_ws_.sel[static_cast<size_t>(i)]) * H, head_ws_.dhs + i * H, sizeof(float) * static_cast<size_t>(H));
  });
}

void ModelImpl::pooled_loss(const Batch& b, int64_t w_off, int64_t b_off, bool train, float scale_in, StepResult& r) {
  const int64_t H = cfg_.hidden, O = param_rows(w_off), n = b.B;
  lin(head_ws_.logits, O, head_ws_.hs, H, w_off, b_off >= 0 ? p(b_off) : nullptr, n, H, O);
  // Every rank of a split sequence computes the pooled head alike: rank 0 alone reports its
  // figures and adds its parameter gradient, so the sums over the ranks count it once.
  const bool lead = split_lead();
  int64_t valid = 0, correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = b.targets[static_cast<size_t>(i)];
    head_ws_.tsel[static_cast<size_t>(i)] = t;
    if (t < 0) continue;
    ++valid;
    const float* row = head_ws_.logits + i * O;
    if (std::max_element(row, row + O) - row == t) ++correct;
  }
  int64_t counted = 0;
  const float scale = scale_in > 0 ? scale_in : (valid > 0 ? 1.f / static_cast<float>(valid) : 0.f);
  const double loss = nn::cross_entropy(train ? head_ws_.logits : nullptr, head_ws_.logits, head_ws_.tsel.data(), n, O, scale, &counted);
  if (lead) {
    r.loss_sum += loss;
    r.counted += counted;
    r.correct += correct;
  }
  if (train)
    lin_bwd(head_ws_.dhs, H, lead ? g(w_off) : nullptr, lead && b_off >= 0 ? g(b_off) : nullptr, head_ws_.logits, O, head_ws_.hs, H, p(w_off), n, H, O);
}

void ModelImpl::layer_grads_ready(int64_t begin, int64_t end) const {
  if (*on_grads_ready) (*on_grads_ready)(begin, end);
}

void ModelImpl::other_grads_ready(int64_t layers_begin, int64_t layers_end) const {
  const auto& ready = *on_grads_ready;
  if (!ready) return;
  if (layers_begin > 0) ready(0, layers_begin);
  if (layers_end < param_count()) ready(layers_end, param_count());
}

int64_t ModelImpl::param_rows(int64_t off) const {
  for (const ParamInfo& pi : info_)
    if (pi.offset == off) return pi.shape[0];
  fail("model: internal: no parameter at offset ", off);
}

StepResult ModelImpl::timed(StepResult r, double t0) const {
  r.attention_ms = att_->ms;
  r.dense_ms = dense_ms_;
  r.total_ms = ms_now() - t0;
  return r;
}

// ---- Model, the public handle

Model::Model(std::unique_ptr<ModelImpl> impl) : impl_(std::move(impl)) { impl_->on_grads_ready = &on_grads_ready; }
Model::~Model() = default;

const ModelConfig& Model::config() const { return impl_->config(); }
bool Model::has_head() const { return impl_->has_head(); }
TaskKind Model::head() const { return impl_->head(); }
void Model::set_attention(const std::string& plan) { impl_->set_attention(plan); }
const std::string& Model::attention_plan() const { return impl_->attention_plan(); }
const std::vector<std::string>& Model::attention_specs() const { return impl_->attention_specs(); }
bool Model::trainable() const { return impl_->trainable(); }
void Model::set_dropout(float p) { impl_->set_dropout(p); }
void Model::set_sequence_parallel(Communicator* comm) { impl_->set_sequence_parallel(comm); }
Communicator* Model::sequence_parallel() const { return impl_->sequence_parallel(); }
SeqSplit Model::sequence_split(int64_t T) const { return impl_->sequence_split(T); }
StepResult Model::forward_backward(const Batch& b, bool train, uint64_t step, double divisor) {
  return impl_->forward_backward(b, train, step, divisor);
}
ConstView Model::last_hidden() const { return impl_->last_hidden(); }
double Model::last_attention_ms() const { return impl_->last_attention_ms(); }
double Model::forward_bytes(int64_t B, int64_t T) const { return impl_->forward_bytes(B, T); }
double Model::train_bytes(int64_t B, int64_t T) const { return impl_->train_bytes(B, T); }
std::span<float> Model::params() { return impl_->params(); }
std::span<const float> Model::params() const { return std::as_const(*impl_).params(); }
WeightType Model::weights() const { return impl_->weights(); }
std::span<float> Model::grads() { return impl_->grads(); }
const std::vector<ParamInfo>& Model::param_info() const { return impl_->param_info(); }
const ParamInfo& Model::param(const std::string& name) const { return impl_->param(name); }
void Model::zero_grads() { impl_->zero_grads(); }
void Model::save(const std::string& dir) const { impl_->save(dir); }
void Model::set_capture(AttentionCapture* cap) { impl_->set_capture(cap); }

// ---- factories

std::unique_ptr<Model> Model::create(const ModelConfig& cfg, TaskKind head, uint64_t seed) {
  std::unique_ptr<Model> m;
  if (cfg.kind == ModelKind::llama) {
    check(head == TaskKind::lm, "model: a llama decoder takes the lm head, not ", task_kind_name(head));
    m.reset(new Decoder(std::make_unique<DecoderImpl>(cfg)));
  } else {
    check(head != TaskKind::lm, "model: a ", cfg.kind == ModelKind::kwt ? "kwt" : "bert",
          " encoder takes the classify or mlm head, not lm");
    check(cfg.kind != ModelKind::kwt || head == TaskKind::classify, "model: a kwt encoder takes the classify head");
    check(head != TaskKind::classify || cfg.num_labels >= 1, "model: the classify head needs num_labels >= 1");
    m.reset(new Encoder(std::make_unique<EncoderImpl>(cfg, head, false)));
  }
  m->impl_->init(seed);
  return m;
}

std::unique_ptr<Model> Model::load(const std::string& dir, const LoadOptions& opt) {
  return load(dir, read_model_config((std::filesystem::path(dir) / "config.json").string()), opt);
}

std::unique_ptr<Model> Model::load(const std::string& dir, const ModelConfig& cfg, const LoadOptions& opt) {
  LoadOptions o = opt;
  if (!o.head) o.head = cfg.saved_head;
  std::unique_ptr<Weights> w = Weights::open(dir);
  std::unique_ptr<Model> m;
  std::vector<std::string> optional;
  if (cfg.kind == ModelKind::llama) m.reset(new Decoder(DecoderImpl::for_checkpoint(cfg, *w, o)));
  else m.reset(new Encoder(EncoderImpl::for_checkpoint(cfg, *w, o, optional)));
  // A clattn checkpoint runs with the attention it was trained with, and its layer state.
  m->set_attention(cfg.saved_plan);
  m->impl_->load_weights(*w, o.verbose, optional);
  return m;
}

std::unique_ptr<Encoder> Encoder::load(const std::string& dir, const LoadOptions& opt) {
  const ModelConfig cfg = read_model_config((std::filesystem::path(dir) / "config.json").string());
  check(cfg.kind != ModelKind::llama, "model '", dir, "' is a decoder (model_type ", cfg.model_type, "), not an encoder");
  std::unique_ptr<Model> m = Model::load(dir, cfg, opt);
  return std::unique_ptr<Encoder>(static_cast<Encoder*>(m.release()));
}

std::unique_ptr<Decoder> Decoder::load(const std::string& dir, const LoadOptions& opt) {
  const ModelConfig cfg = read_model_config((std::filesystem::path(dir) / "config.json").string());
  check(cfg.kind == ModelKind::llama, "model '", dir, "' is an encoder (model_type ", cfg.model_type, "), not a decoder");
  std::unique_ptr<Model> m = Model::load(dir, cfg, opt);
  return std::unique_ptr<Decoder>(static_cast<Decoder*>(m.release()));
}

}  // namespace clattn
