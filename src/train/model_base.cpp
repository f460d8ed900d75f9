// The parts of a trainable model that do not depend on the architecture: parameter layout and
// initialisation, attention plans with training Contexts, the loss heads, checkpoints.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "clattn/atomic_file.h"
#include "clattn/error.h"
#include "clattn/gemm.h"
#include "clattn/model.h"
#include "clattn/nn.h"
#include "clattn/parallel.h"
#include "clattn/rng.h"
#include "clattn/safetensors.h"
#include "train/train_impl.h"

namespace clattn::train {

std::string head_name(TaskKind k) {
  switch (k) {
    case TaskKind::classify: return "classify";
    case TaskKind::mlm: return "mlm";
    case TaskKind::lm: return "lm";
  }
  return "?";
}

TaskKind head_from_name(const std::string& s) {
  if (s == "classify") return TaskKind::classify;
  if (s == "mlm") return TaskKind::mlm;
  if (s == "lm") return TaskKind::lm;
  fail("train: unknown head '", s, "' (classify, mlm, lm)");
}

int64_t ModelBase::add(const std::string& name, std::vector<int64_t> shape, Init init) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const int64_t off = info_.empty() ? 0 : info_.back().offset + info_.back().size;
  info_.push_back({name, std::move(shape), off, n, init == Init::normal});
  inits_.push_back(init);
  return off;
}

void ModelBase::allocate() {
  const int64_t n = info_.empty() ? 0 : info_.back().offset + info_.back().size;
  params_.assign(static_cast<size_t>(n), 0.f);
  grads_.assign(static_cast<size_t>(n), 0.f);
}

void ModelBase::init(uint64_t seed) {
  const Rng rng(seed);
  for (size_t i = 0; i < info_.size(); ++i) {
    float* d = p(info_[i].offset);
    const int64_t n = info_[i].size;
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

double ModelBase::train_bytes(int64_t B, int64_t T) const {
  const AttentionDims d{B, cfg_.heads, cfg_.kv_heads, T, T, cfg_.head_dim, cfg_.head_dim};
  double att = 0;
  for (const auto& a : att_) att += static_cast<double>(a->workspace_bytes(d, Mode::training, max_threads()));
  return 4.0 * arena_floats(B, T) + att + 4.0 * 4.0 * static_cast<double>(params_.size());
}

void ModelBase::zero_grads() { std::memset(grads_.data(), 0, sizeof(float) * grads_.size()); }

void ModelBase::set_attention(const std::string& plan, bool training) {
  std::vector<std::string> specs = parse_attention_plan(plan, cfg_.layers);
  std::vector<std::unique_ptr<Attention>> att =
      make_plan_attentions(specs, causal(), cfg_.kv_heads != cfg_.heads, /*shared_qk_ok=*/true);
  bool trainable = true;
  for (size_t l = 0; l < att.size(); ++l) {
    check(!training || att[l]->capabilities().trainable, "attention of layer ", l, ": '", specs[l],
          "' has no backward (not trainable)");
    trainable = trainable && att[l]->capabilities().trainable;
  }
  for (size_t l = 0; l < att.size(); ++l)
    check(att[l]->capabilities().query_lengths && att[l]->capabilities().key_lengths, "attention of layer ", l,
          ": '", specs[l], "' does not honour per-example lengths, which training batches have");
  // A layer keeps its attention state (routing's EMA centroids) while its spec is unchanged.
  std::vector<AttentionState> states(att.size());
  for (size_t l = 0; l < att.size() && l < specs_.size() && l < states_.size(); ++l)
    if (specs_[l] == specs[l]) states[l] = std::move(states_[l]);
  plan_ = plan;
  trainable_ = trainable;
  specs_ = std::move(specs);
  att_ = std::move(att);
  states_ = std::move(states);
  ctx_.clear();
  for (size_t l = 0; l < att_.size(); ++l) ctx_.emplace_back(trainable_ ? Mode::training : Mode::inference, &scratch_);
}

void ModelBase::set_dropout(float p) {
  check(p >= 0.f && p < 1.f, "train: dropout must be in [0, 1), got ", p);
  dropout_ = p;
}

void ModelBase::check_batch(const Batch& b) const {
  check(b.B >= 1 && b.T >= 1, "train: batch must have B >= 1 and T >= 1, got B=", b.B, " T=", b.T);
  check(static_cast<int64_t>(b.ids.size()) == b.B * b.T, "train: batch ids must hold B x T = ", b.B * b.T,
        " tokens, got ", b.ids.size());
  check(static_cast<int64_t>(b.lengths.size()) == b.B, "train: batch lengths must have B = ", b.B,
        " entries, got ", b.lengths.size());
  for (int32_t len : b.lengths) check(len >= 1 && len <= b.T, "train: every length must be in [1, T = ", b.T, "], got ", len);
  const int64_t nt = head_ == TaskKind::classify ? b.B : b.B * b.T;
  check(static_cast<int64_t>(b.targets.size()) == nt, "train: the ", head_name(head_), " head needs ", nt,
        " targets, the batch has ", b.targets.size());
  if (cfg_.kind == ModelKind::bert)
    check(b.T <= cfg_.max_positions, "train: T = ", b.T, " exceeds max_position_embeddings ", cfg_.max_positions);
}

AttentionInputs ModelBase::attn_inputs(int64_t l, ConstView q, ConstView k, ConstView v, const Batch& b,
                                       bool train, uint64_t step) {
  check(!train || trainable_, "train: the attention plan '", plan_, "' has a layer without a backward; it can only evaluate");
  AttentionInputs ai;
  ai.q = q;
  // Shared-QK attention takes the queries as keys; its backward puts the gradient of both roles
  // into dq and leaves dk (the K projection's slot, zeroed by the caller) alone.
  ai.k = att_[static_cast<size_t>(l)]->capabilities().shared_qk ? q : k;
  ai.v = v;
  ai.query_lengths = b.lengths;
  ai.key_lengths = b.lengths;
  ai.causal = causal();
  ai.step = step;
  ai.train = train;
  if (att_[static_cast<size_t>(l)]->capabilities().stateful) ai.state = &states_[static_cast<size_t>(l)];
  return ai;
}

void ModelBase::attn_forward(int64_t l, const AttentionInputs& in, View out) {
  const auto t0 = Clock::now();
  att_[static_cast<size_t>(l)]->forward(in, out, ctx_[static_cast<size_t>(l)]);
  attn_ms_ += ms_since(t0);
}

void ModelBase::attn_backward(int64_t l, const AttentionInputs& in, ConstView out, ConstView dout, View dq,
                              View dk, View dv) {
  const auto t0 = Clock::now();
  att_[static_cast<size_t>(l)]->backward(in, out, ctx_[static_cast<size_t>(l)], dout, dq, dk, dv);
  attn_ms_ += ms_since(t0);
}

void ModelBase::lin(float* y, int64_t ldy, const float* x, int64_t ldx, const float* w, const float* b,
                    int64_t rows, int64_t in, int64_t out, const float* res) {
  const auto t0 = Clock::now();
  if (!res) {
    nn::linear_fwd(y, ldy, x, ldx, w, b, rows, in, out);
  } else {
    // y = res + b first, then one sgemm with beta = 1: the residual add costs no extra pass.
    const size_t row_bytes = sizeof(float) * static_cast<size_t>(out);
#pragma omp parallel for schedule(static) if (rows * out > 32768)
    for (int64_t r = 0; r < rows; ++r) {
      if (y + r * ldy != res + r * ldy) std::memcpy(y + r * ldy, res + r * ldy, row_bytes);
      if (b)
        for (int64_t e = 0; e < out; ++e) y[r * ldy + e] += b[e];
    }
    gemm(false, true, rows, out, in, 1.f, x, ldx, w, in, 1.f, y, ldy);
  }
  dense_ms_ += ms_since(t0);
}

void ModelBase::lin_bwd(float* dx, int64_t lddx, float* dw, float* db, const float* dy, int64_t lddy,
                        const float* x, int64_t ldx, const float* w, int64_t rows, int64_t in, int64_t out,
                        bool accumulate) {
  const auto t0 = Clock::now();
  nn::linear_bwd(dx, lddx, dw, db, dy, lddy, x, ldx, w, rows, in, out, accumulate);
  dense_ms_ += ms_since(t0);
}

void ModelBase::head_forward_backward(const Batch& b, const float* xf, float* dxf, bool train, StepResult& r) {
  const int64_t H = cfg_.hidden, rows = b.B * b.T, O = head_out_;
  const float* w = p(head_w_);
  const float* bias = head_b_ >= 0 ? p(head_b_) : nullptr;
  int64_t n = 0;
  if (head_ == TaskKind::classify) {
    // Mean over each sequence's valid tokens: unlike a class token, it does not depend on how an
    // approximate attention treats one position (a clustered query gets its centroid's output).
    n = b.B;
    for_rows(b.B, b.T * H, [&](int64_t s) {
      const int64_t len = b.lengths[static_cast<size_t>(s)];
      float* o = hs_ + s * H;
      std::fill(o, o + H, 0.f);
      for (int64_t t = 0; t < len; ++t)
        for (int64_t e = 0; e < H; ++e) o[e] += xf[(s * b.T + t) * H + e];
      for (int64_t e = 0; e < H; ++e) o[e] /= static_cast<float>(len);
    });
    for (int64_t s = 0; s < b.B; ++s) tsel_[static_cast<size_t>(s)] = b.targets[static_cast<size_t>(s)];
  } else {
    // Only rows with a target go through the output layer (for mlm, 15 % of them).
    for (int64_t i = 0; i < rows; ++i)
      if (b.targets[static_cast<size_t>(i)] != -1) {
        sel_[static_cast<size_t>(n)] = static_cast<int32_t>(i);
        tsel_[static_cast<size_t>(n)] = b.targets[static_cast<size_t>(i)];
        ++n;
      }
    for_rows(n, H, [&](int64_t i) {
      std::memcpy(hs_ + i * H, xf + static_cast<int64_t>(sel_[static_cast<size_t>(i)]) * H, sizeof(float) * static_cast<size_t>(H));
    });
  }
  if (train) std::memset(dxf, 0, sizeof(float) * static_cast<size_t>(rows * H));
  if (n == 0) return;
  lin(logits_, O, hs_, H, w, bias, n, H, O);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = tsel_[static_cast<size_t>(i)];
    if (t < 0) continue;
    const float* row = logits_ + i * O;
    if (std::max_element(row, row + O) - row == t) ++r.correct;
  }
  const int64_t valid = std::count_if(tsel_.begin(), tsel_.begin() + n, [](int32_t t) { return t != -1; });
  int64_t counted = 0;
  const float scale = valid > 0 ? 1.f / static_cast<float>(valid) : 0.f;  // the batch's mean loss
  const double loss = nn::cross_entropy(train ? logits_ : nullptr, logits_, tsel_.data(), n, O, scale, &counted);
  r.loss_sum += loss;
  r.counted += counted;
  if (!train || counted == 0) return;
  lin_bwd(dhs_, H, g(head_w_), head_b_ >= 0 ? g(head_b_) : nullptr, logits_, O, hs_, H, w, n, H, O);
  if (head_ == TaskKind::classify) {
    for_rows(b.B, b.T * H, [&](int64_t s) {
      const int64_t len = b.lengths[static_cast<size_t>(s)];
      const float inv = 1.f / static_cast<float>(len);
      for (int64_t t = 0; t < len; ++t)
        for (int64_t e = 0; e < H; ++e) dxf[(s * b.T + t) * H + e] = dhs_[s * H + e] * inv;
    });
  } else {
    for_rows(n, H, [&](int64_t i) {
      std::memcpy(dxf + static_cast<int64_t>(sel_[static_cast<size_t>(i)]) * H, dhs_ + i * H, sizeof(float) * static_cast<size_t>(H));
    });
  }
}

// ---- checkpoints

namespace {

using nlohmann::json;

json config_json(const ModelConfig& c, TaskKind head, const std::string& plan) {
  json j;
  j["model_type"] = c.model_type;
  j["hidden_size"] = c.hidden;
  j["num_hidden_layers"] = c.layers;
  j["num_attention_heads"] = c.heads;
  j["intermediate_size"] = c.ffn;
  j["vocab_size"] = c.vocab;
  j["max_position_embeddings"] = c.max_positions;
  if (c.kind == ModelKind::llama) {
    j["architectures"] = {"LlamaForCausalLM"};
    j["num_key_value_heads"] = c.kv_heads;
    j["head_dim"] = c.head_dim;
    j["rms_norm_eps"] = c.eps;
    j["rope_theta"] = c.rope_theta;
    j["tie_word_embeddings"] = true;
    j["hidden_act"] = "silu";
  } else {
    j["architectures"] = {head == TaskKind::classify ? "BertForSequenceClassification" : "BertModel"};
    j["type_vocab_size"] = 0;
    j["layer_norm_eps"] = c.eps;
    j["hidden_act"] = c.gelu_tanh ? "gelu_tanh" : "gelu";
    j["norm_placement"] = "pre";
    j["final_layer_norm"] = true;
    j["qkv_bias"] = true;
    if (head == TaskKind::classify) {
      j["num_labels"] = c.num_labels;
      j["classifier_pooling"] = "mean";
    }
  }
  // clattn's own keys: which head the checkpoint trains, and the attention it was trained with.
  j["clattn_head"] = head_name(head);
  j["clattn_attention"] = plan;
  return j;
}

}  // namespace

void ModelBase::save(const std::string& dir) const {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  check(fs::is_directory(dir), "train: cannot create checkpoint folder '", dir, "'");
  SafetensorsWriter w;
  for (const ParamInfo& pi : info_)
    w.add(pi.name, make_view(params_.data() + pi.offset, Shape(pi.shape)));
  // Layer state of stateful attentions (routing's EMA centroids) beside the weights; the
  // inference loaders ignore these names.
  for (size_t l = 0; l < states_.size(); ++l)
    for (const auto& [name, t] : states_[l].buffers)
      w.add("clattn.attention_state." + std::to_string(l) + "." + name, t.view());
  w.set_metadata("format", "pt");
  w.write((fs::path(dir) / "model.safetensors").string());
  write_file_atomic((fs::path(dir) / "config.json").string(), config_json(cfg_, head_, plan_).dump(2) + "\n");
}

void ModelBase::load_tensors(const std::string& file) {
  const SafetensorsFile f = SafetensorsFile::open(file);
  for (const ParamInfo& pi : info_) {
    check(f.has(pi.name), "train: checkpoint '", file, "' has no tensor '", pi.name, "'");
    check(f.info(pi.name).shape == pi.shape, "train: tensor '", pi.name, "' of '", file, "' has shape ",
          Shape(f.info(pi.name).shape), " but the config implies ", Shape(pi.shape));
    const Tensor t = f.get_f32(pi.name);
    std::memcpy(params_.data() + pi.offset, t.data(), sizeof(float) * static_cast<size_t>(pi.size));
  }
  const std::string prefix = "clattn.attention_state.";
  for (const std::string& name : f.names()) {
    if (name.rfind(prefix, 0) != 0) continue;
    const size_t dot = name.find('.', prefix.size());
    check(dot != std::string::npos, "train: checkpoint '", file, "': bad attention state name '", name, "'");
    size_t l = 0;
    try {
      l = std::stoul(name.substr(prefix.size(), dot - prefix.size()));
    } catch (...) {
      fail("train: checkpoint '", file, "': bad attention state name '", name, "'");
    }
    check(l < states_.size(), "train: checkpoint '", file, "': attention state '", name, "' names a layer the model lacks");
    const Tensor t = f.get_f32(name);
    Tensor& dst = states_[l].add(name.substr(dot + 1), t.shape());
    std::memcpy(dst.data(), t.data(), sizeof(float) * static_cast<size_t>(t.numel()));
  }
}

std::unique_ptr<ModelBase> make_bert(const ModelConfig& cfg, TaskKind head);
std::unique_ptr<ModelBase> make_llama(const ModelConfig& cfg, TaskKind head);

}  // namespace clattn::train

namespace clattn {

namespace {
std::unique_ptr<train::ModelBase> build(const ModelConfig& cfg, TaskKind head) {
  if (cfg.kind == ModelKind::bert) return train::make_bert(cfg, head);
  if (cfg.kind == ModelKind::llama) return train::make_llama(cfg, head);
  fail("train: model kind '", cfg.model_type, "' is not trainable (bert, llama)");
}
}  // namespace

std::unique_ptr<TrainModel> TrainModel::create(const ModelConfig& cfg, TaskKind head, uint64_t seed) {
  std::unique_ptr<train::ModelBase> m = build(cfg, head);
  m->init(seed);
  return m;
}

std::unique_ptr<TrainModel> TrainModel::load(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string cpath = (fs::path(dir) / "config.json").string();
  ModelConfig cfg = read_model_config(cpath);
  std::ifstream in(cpath);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  check(j.is_object() && j.contains("clattn_head") && j["clattn_head"].is_string(), "train: config '", cpath,
        "' has no \"clattn_head\" (not a checkpoint written by clattn train)");
  std::unique_ptr<train::ModelBase> m = build(cfg, train::head_from_name(j["clattn_head"].get<std::string>()));
  if (j.contains("clattn_attention") && j["clattn_attention"].is_string())
    m->set_attention(j["clattn_attention"].get<std::string>());
  m->load_tensors((fs::path(dir) / "model.safetensors").string());
  return m;
}

}  // namespace clattn
