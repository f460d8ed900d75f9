// Finite-difference gradient checks of whole models (a 2-layer pre-LN encoder with the mlm and the
// classify head, a 2-layer LLaMA decoder, one with grouped-query attention) through every
// trainable registered attention, with unequal lengths in the batch.
//
// The models are float32, so the check is built for float:
//  * the loss of each evaluation is the head's sum in double divided by the count, but the
//    forward itself rounds in float: two evaluations differ by ~1e-6 of the loss from rounding
//    alone (measured: ~3e-7 at these sizes);
//  * central differences L(p + h·d) − L(p − h·d) are compared with Σ g_i·(p⁺_i − p⁻_i) over the
//    perturbation actually applied after float rounding of p ± h·d, so rounding of the perturbed
//    parameters is not an error source;
//  * h = 1e-3 along unit directions: rounding noise (~3e-7 / h = 3e-4 in the derivative) stays
//    below the tolerance, the O(h²) truncation term is far below it (each coordinate moves by at
//    most 1e-3 against parameters of size ~0.3), and a discrete choice flips rarely (below);
//  * tolerance |fd − g·d| <= 2e-2·|g·d| + 1e-3 (derivative units). Measured worst error/tol over
//    every variant: 0.06–0.15 at h = 1e-3 (rounding-dominated) and 0.02–0.04 at h = 1e-2, so the
//    bound has ~7x margin; a tensor's gradient scaled by 0.5 fails it (CatchesAWrongGradient).
// Directions: several random unit directions over all parameters, one random unit direction
// inside every named tensor, and single coordinates (the largest |g| and a random one per tensor).
//
// Discrete choices (hashes, clusters, top-k sets, buckets) are held fixed by passing the same step
// for every evaluation, but a perturbation can still move a query across a hash plane or swap two
// nearly tied top-k keys. Such a flip makes one difference jump; the check then retries that
// direction at h/4, where a flip is four times less likely, accepting there also a one-sided
// difference (flip on the other side only; its O(h) truncation asks for 5e-2·|g·d| + 1.6e-2),
// and fails if neither matches; at most 10 % of a model's directions may need the retry. The
// parameters are roughened (N(0, 0.3²) matrices) so attention is far from uniform.
// Causal clustered variants attend each block exactly (`block=`, default 512) and cluster the
// rest by segments of doubling length: the decoder checks use block=4 so that T = 13 spans
// several segments, and every approximate variant is asserted to differ from full at the test size.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "clattn/attention.h"
#include "clattn/model.h"
#include "clattn/safetensors.h"
#include "clattn/threads.h"
#include "clattn/rng.h"
#include "clattn/train.h"
#include "train_fixtures.h"

namespace clattn::testing {
namespace {

constexpr double kRtol = 2e-2, kAtol = 1e-3, kH = 1e-3;

// Dropout only acts in training calls: with it on, the evaluations are training calls too (their
// gradient accumulation is harmless, the checker keeps its own copy of the gradient).
bool g_train_evals = false;

double mean_loss(Model& m, const Batch& b, uint64_t step) {
  const StepResult r = m.forward_backward(b, g_train_evals, step);
  return r.loss_sum / static_cast<double>(r.counted);
}

struct Checker {
  Model& m;
  const Batch& b;
  uint64_t step;
  std::vector<float> base, grad;
  double worst = 0;  // largest error / tolerance seen
  int flips = 0;     // directions that needed the smaller step
  int64_t directions = 0;

  Checker(Model& model, const Batch& batch, uint64_t s) : m(model), b(batch), step(s) {
    m.zero_grads();
    m.forward_backward(b, true, step);
    base.assign(m.params().begin(), m.params().end());
    grad.assign(m.grads().begin(), m.grads().end());
    l0 = mean_loss(m, b, step);
  }
  // (numerical, analytic) derivative along d (entries in [lo, hi) of the flat buffer) with step h;
  // also the one-sided differences (L(p + h·d) − L(p)) / h and (L(p) − L(p − h·d)) / h.
  double l0 = 0;
  double fwd = 0, bwd = 0;
  std::pair<double, double> along(const std::vector<float>& d, int64_t lo, int64_t hi, double h) {
    std::span<float> p = m.params();
    std::vector<float> plus(static_cast<size_t>(hi - lo)), minus(static_cast<size_t>(hi - lo));
    for (int64_t i = lo; i < hi; ++i) {
      const size_t k = static_cast<size_t>(i - lo);
      plus[k] = base[static_cast<size_t>(i)] + static_cast<float>(h) * d[k];
      minus[k] = base[static_cast<size_t>(i)] - static_cast<float>(h) * d[k];
    }
    std::copy(plus.begin(), plus.end(), p.begin() + lo);
    const double lp = mean_loss(m, b, step);
    std::copy(minus.begin(), minus.end(), p.begin() + lo);
    const double lm = mean_loss(m, b, step);
    std::copy(base.begin() + lo, base.begin() + hi, p.begin() + lo);
    double an = 0;
    for (int64_t i = lo; i < hi; ++i) {
      const size_t k = static_cast<size_t>(i - lo);
      an += static_cast<double>(grad[static_cast<size_t>(i)]) * (static_cast<double>(plus[k]) - minus[k]);
    }
    fwd = (lp - l0) / h;
    bwd = (l0 - lm) / h;
    return {(lp - lm) / (2 * h), an / (2 * h)};
  }
  // Checks one direction; returns an error message or "".
  std::string check(const std::vector<float>& d, int64_t lo, int64_t hi, const std::string& what) {
    std::string msg;
    ++directions;
    for (double h : {kH, kH / 4}) {
      const auto [fd, an] = along(d, lo, hi, h);
      const double tol = kRtol * std::abs(an) + kAtol * (kH / h);
      const double ratio = std::abs(fd - an) / tol;
      if (ratio <= 1) {
        worst = std::max(worst, ratio);
        if (h != kH) ++flips;
        return "";
      }
      // A flip on one side only: the other side's one-sided difference, whose O(h) truncation
      // error asks for a looser bound, still matches.
      const double tol1 = 2.5 * kRtol * std::abs(an) + 4 * kAtol * (kH / h);
      if (h != kH && (std::abs(fwd - an) <= tol1 || std::abs(bwd - an) <= tol1)) {
        ++flips;
        return "";
      }
      char buf[256];
      std::snprintf(buf, sizeof buf, "%s: h=%g numerical %.6g analytic %.6g (tol %.3g); ", what.c_str(), h, fd, an, tol);
      msg += buf;
    }
    return msg;
  }
};

std::vector<float> unit_direction(int64_t n, uint64_t seed, uint64_t stream) {
  const Rng rng(seed);
  std::vector<float> d(static_cast<size_t>(n));
  double s = 0;
  for (int64_t i = 0; i < n; ++i) {
    d[static_cast<size_t>(i)] = rng.normal(stream, static_cast<uint64_t>(i));
    s += static_cast<double>(d[static_cast<size_t>(i)]) * d[static_cast<size_t>(i)];
  }
  for (float& x : d) x = static_cast<float>(x / std::sqrt(s));
  return d;
}

// Runs every check on a model; failures are reported with the direction.
void gradcheck(Model& m, const Batch& b, const std::string& label) {
  // One thread: at these sizes an OpenMP region costs more than its work, and the checks make
  // hundreds of evaluations (the multi-threaded paths are compared with the inference models and
  // trained in test_train.cpp).
  OneThread one;
  const uint64_t step = 5;
  Checker c(m, b, step);
  const int64_t n = static_cast<int64_t>(c.base.size());
  std::vector<std::string> errors;
  auto note = [&](const std::string& e) { if (!e.empty()) errors.push_back(e); };
  for (uint64_t k = 0; k < 4; ++k) note(c.check(unit_direction(n, 11, k), 0, n, "random direction " + std::to_string(k)));
  const Rng rng(3);
  for (size_t t = 0; t < m.param_info().size(); ++t) {
    const ParamInfo& pi = m.param_info()[t];
    note(c.check(unit_direction(pi.size, 12, t), pi.offset, pi.offset + pi.size, pi.name));
    int64_t big = 0;
    for (int64_t i = 1; i < pi.size; ++i)
      if (std::abs(c.grad[static_cast<size_t>(pi.offset + i)]) > std::abs(c.grad[static_cast<size_t>(pi.offset + big)])) big = i;
    const int64_t rnd = static_cast<int64_t>(rng.below(static_cast<uint64_t>(pi.size), 5, t));
    for (int64_t i : {big, rnd}) {
      const std::vector<float> one{1.f};
      note(c.check(one, pi.offset + i, pi.offset + i + 1, pi.name + "[" + std::to_string(i) + "]"));
    }
  }
  if (std::getenv("CLATTN_GRADCHECK_VERBOSE"))
    std::printf("%-70s worst error/tol %.3f, %d retried at h/4\n", label.c_str(), c.worst, c.flips);
  EXPECT_TRUE(errors.empty()) << label << ": " << errors.size() << " failed directions, first: " << errors.front();
  // A check that passes only by retrying is suspicious beyond a few flips (measured: none for
  // the clustered variants, 5 of ~70 directions for causal topk:topk=4, whose 4th and 5th keys
  // are often near ties).
  EXPECT_LE(c.flips, static_cast<int>(c.directions / 10)) << label << ": too many directions needed the smaller step";
}

// A spec small enough to approximate at T = 13 for each registered variant (the registry's
// example otherwise); "" when the variant cannot run in the model, with the reason.
struct Plan {
  std::string spec, skip;
};
Plan plan_for(const VariantInfo& v, bool decoder) {
  const std::string& n = v.name;
  std::string spec = v.example;
  // Causal clustered variants cluster per block of `block` positions and are exact inside one,
  // so the decoder needs blocks much shorter than T for the clustering to be exercised.
  const std::string blk = decoder ? ",block=4" : "";
  if (n == "clustered") spec = "clustered:clusters=" + std::string(decoder ? "2" : "3") + blk;
  else if (n == "improved-clustered") spec = "improved-clustered:clusters=" + std::string(decoder ? "2,topk=3" : "3,topk=4") + blk;
  else if (n == "local") spec = "local:window=4";
  else if (n == "topk") spec = "topk:topk=4";
  else if (n == "smyrf") spec = "smyrf:hashes=2,q_cluster=8,k_cluster=8";
  else if (n == "routing") spec = "routing:clusters=2";
  else if (n == "reformer") spec = "reformer:chunk=4";  // shared QK: the model gives it its queries as keys
  else if (n == "conditional-full") spec = "conditional-full:length_limit=8,improved-clustered:clusters=" + std::string(decoder ? "2,topk=3" : "3,topk=4") + blk;
  const std::unique_ptr<Attention> a = make_attention(spec);
  const Capabilities& caps = a->capabilities();
  if (!caps.trainable) return {"", "no backward"};
  if (decoder && !caps.causal) return {"", "no causal mask, which the decoder needs"};
  return {spec, ""};
}

std::vector<VariantInfo> variants() { return registered_attentions(); }

void run_all(TaskKind head, bool decoder, int64_t kv_heads, const char* label) {
  for (const VariantInfo& v : variants()) {
    const Plan plan = plan_for(v, decoder);
    if (plan.spec.empty()) {
      std::printf("[ skipped ] %s with %s: %s\n", label, v.name.c_str(), plan.skip.c_str());
      continue;
    }
    const ModelConfig cfg = decoder ? tiny_llama(13, kv_heads) : tiny_bert(11, head == TaskKind::classify ? 3 : 0);
    std::unique_ptr<Model> m = Model::create(cfg, head, 1);
    roughen(*m, 2);
    const Batch b = tiny_batch(head, 13, {13, 9}, cfg.vocab, cfg.num_labels, 4);
    const double full = mean_loss(*m, b, 5);
    m->set_attention(plan.spec);
    // The variant must approximate at this size, or the check would only test full again.
    if (plan.spec != "full") {
      EXPECT_NE(mean_loss(*m, b, 5), full) << label << " " << plan.spec << " equals full here";
    }
    gradcheck(*m, b, std::string(label) + " " + plan.spec);
  }
}

TEST(TrainGradcheck, EncoderMlmEveryVariant) { run_all(TaskKind::mlm, false, 2, "encoder/mlm"); }
TEST(TrainGradcheck, DecoderEveryVariant) { run_all(TaskKind::lm, true, 2, "decoder/lm"); }

TEST(TrainGradcheck, EncoderClassifyAndGqaDecoder) {
  {
    std::unique_ptr<Model> m = Model::create(tiny_bert(11, 3), TaskKind::classify, 1);
    roughen(*m, 2);
    // bits=16: with 63 planes this base point lies within ~2e-4 of a hash-plane crossing along
    // most directions (51 of ~120 needed the fallback), which the flip budget rightly refuses.
    m->set_attention("full;improved-clustered:clusters=3,bits=16,topk=4");
    const Batch b = tiny_batch(TaskKind::classify, 11, {11, 6, 9}, 11, 3, 6);
    gradcheck(*m, b, "encoder/classify full;improved-clustered");
  }
  {
    std::unique_ptr<Model> m = Model::create(tiny_llama(13, 1), TaskKind::lm, 1);
    roughen(*m, 2);
    const Batch b = tiny_batch(TaskKind::lm, 17, {17, 10}, 13, 0, 7);
    gradcheck(*m, b, "decoder/lm gqa full");
  }
}

// Every architecture the loaders accept trains, not only the shapes clattn creates: post-LN and
// pre-LN encoders, both GELU forms, token types, BERT's pooler, attention_scale, KWT's input path
// (feature projection, class token, learned positions), and a decoder with an untied output layer.
ModelConfig post_ln_bert() {
  ModelConfig c = tiny_bert(11, 3);
  c.pre_ln = false;
  c.final_layer_norm = false;
  c.mean_pooling = false;  // the first token, through the pooler below
  c.type_vocab = 2;
  c.attention_scale = 0.3f;
  return c;
}

// A post-LN classifier whose checkpoint has BERT's pooler (dense + tanh on the first token):
// written as a Hugging Face folder and loaded, the way a pretrained BERT arrives.
std::unique_ptr<Model> bert_with_pooler(const std::string& dir, const ModelConfig& cfg = post_ln_bert(),
                                        const std::string& pooler = "pooler.dense") {
  std::unique_ptr<Model> m = Model::create(cfg, TaskKind::classify, 1);
  roughen(*m, 2);
  m->save(dir);
  const SafetensorsFile f = SafetensorsFile::open(dir + "/model.safetensors");
  SafetensorsWriter w;
  std::vector<Tensor> keep;
  for (const std::string& n : f.names()) {
    keep.push_back(f.get_f32(n));
    w.add(n, keep.back().view());
  }
  Tensor pw(Shape{16, 16}), pb(Shape{16});
  const Rng rng(9);
  for (int64_t i = 0; i < pw.numel(); ++i) pw.data()[i] = 0.3f * rng.normal(1, static_cast<uint64_t>(i));
  for (int64_t i = 0; i < pb.numel(); ++i) pb.data()[i] = 0.1f * rng.normal(2, static_cast<uint64_t>(i));
  w.add(pooler + ".weight", pw.view());
  w.add(pooler + ".bias", pb.view());
  w.write(dir + "/model.safetensors");
  return Model::load(dir);
}

TEST(TrainGradcheck, PostLnBertWithPoolerTypesAndScale) {
  const std::string dir = ::testing::TempDir() + "clattn_gradcheck_pooler";
  std::unique_ptr<Model> m = bert_with_pooler(dir);
  ASSERT_EQ(m->param("pooler.dense.weight").size, 256);
  ASSERT_EQ(m->param("embeddings.token_type_embeddings.weight").size, 32);
  const Batch b = tiny_batch(TaskKind::classify, 11, {11, 6, 9}, 11, 3, 6);
  gradcheck(*m, b, "post-LN bert/classify pooler full");
  m->set_attention("full;improved-clustered:clusters=3,bits=16,topk=4");
  gradcheck(*m, b, "post-LN bert/classify pooler full;improved-clustered");
  std::filesystem::remove_all(dir);
}

// RoBERTa (positions from pad_token_id + 1, one token type, classifier.dense + tanh) and
// DistilBERT (its own names, no token types, pre_classifier + ReLU) train through the same code.
TEST(TrainGradcheck, RobertaAndDistilbertClassifiers) {
  for (const std::string family : {"roberta", "distilbert"}) {
    ModelConfig c = post_ln_bert();
    c.model_type = family;
    c.attention_scale = 0;
    if (family == "roberta") {
      c.position_offset = 2;
      c.type_vocab = 1;
    } else {
      c.type_vocab = 0;
    }
    const std::string dir = ::testing::TempDir() + "clattn_gradcheck_" + family;
    std::unique_ptr<Model> m = bert_with_pooler(dir, c, family == "roberta" ? "classifier.dense" : "pre_classifier");
    ASSERT_EQ(m->config().model_type, family);
    ASSERT_EQ(m->config().pooler_relu, family == "distilbert");
    ASSERT_EQ(m->param("embeddings.position_embeddings.weight").shape[0], c.max_positions + c.position_offset);
    const Batch b = tiny_batch(TaskKind::classify, 11, {11, 6, 9}, 11, 3, 6);
    gradcheck(*m, b, family + "/classify full");
    m->set_attention("full;improved-clustered:clusters=3,bits=16,topk=4");
    gradcheck(*m, b, family + "/classify full;improved-clustered");
    std::filesystem::remove_all(dir);
  }
}

// A pretrained masked-LM head: dense, GELU and LayerNorm before the tied output layer, under
// each family's names.
TEST(TrainGradcheck, PretrainedMaskedLmHeads) {
  for (const std::string family : {"bert", "roberta", "distilbert"}) {
    ModelConfig c = post_ln_bert();
    c.model_type = family;
    c.num_labels = 0;
    c.attention_scale = 0;
    c.mlm_transform = true;
    c.type_vocab = family == "distilbert" ? 0 : 1;
    if (family == "roberta") c.position_offset = 2;
    std::unique_ptr<Model> m = Model::create(c, TaskKind::mlm, 1);
    const char* dense = family == "roberta" ? "lm_head.dense.weight" : family == "distilbert" ? "vocab_transform.weight"
                                                                                              : "cls.predictions.transform.dense.weight";
    ASSERT_EQ(m->param(dense).size, 256);
    roughen(*m, 2);
    const Batch b = tiny_batch(TaskKind::mlm, 13, {13, 9}, 11, 0, 4);
    gradcheck(*m, b, family + "/mlm pretrained head full");
  }
}

// GPT-2: LayerNorms with biases, biased Conv1D layers held transposed, learned positions, GELU-tanh.
TEST(TrainGradcheck, Gpt2Decoder) {
  ModelConfig c = tiny_llama(13, 2);
  c.model_type = "gpt2";
  c.max_positions = 20;
  std::unique_ptr<Model> m = Model::create(c, TaskKind::lm, 1);
  ASSERT_EQ(m->param("h.0.attn.c_attn.weight").shape, (std::vector<int64_t>{48, 16}));  // held (out, in)
  roughen(*m, 2);
  const Batch b = tiny_batch(TaskKind::lm, 17, {17, 10}, 13, 0, 7);
  gradcheck(*m, b, "gpt2/lm full");
  m->set_attention("improved-clustered:clusters=2,topk=3,block=4");
  gradcheck(*m, b, "gpt2/lm improved-clustered");
  g_train_evals = true;
  m->set_dropout(0.2f);
  gradcheck(*m, b, "gpt2/lm dropout 0.2");
  g_train_evals = false;
}

TEST(TrainGradcheck, PreLnMlmWithTanhGelu) {
  ModelConfig c = tiny_bert(11, 0);
  c.gelu_tanh = true;
  c.type_vocab = 2;
  std::unique_ptr<Model> m = Model::create(c, TaskKind::mlm, 1);
  roughen(*m, 2);
  gradcheck(*m, tiny_batch(TaskKind::mlm, 13, {13, 9}, 11, 0, 4), "pre-LN bert/mlm gelu_tanh full");
}

// KWT's input path: features (B, P, in) -> projection, class token, positions; post-LN layers
// without q/k/v biases, tanh GELU and attention_scale, as kwt1's config.
ModelConfig tiny_kwt() {
  ModelConfig c;
  c.kind = ModelKind::kwt;
  c.model_type = "kwt";
  c.hidden = 16;
  c.layers = 2;
  c.heads = 2;
  c.ffn = 24;
  c.input_dim = 5;
  c.num_patches = 6;
  c.max_positions = 7;
  c.num_labels = 4;
  c.eps = 1e-6f;
  c.gelu_tanh = true;
  c.qkv_bias = false;
  c.attention_scale = 0.25f;
  return c;
}

Batch feature_batch(const ModelConfig& c, int64_t B, uint64_t seed) {
  Batch b;
  b.B = B;
  b.T = c.num_patches;
  b.feature_dim = c.input_dim;
  b.lengths.assign(static_cast<size_t>(B), static_cast<int32_t>(b.T));
  const Rng rng(seed);
  for (int64_t i = 0; i < B * b.T * c.input_dim; ++i) b.features.push_back(rng.normal(1, static_cast<uint64_t>(i)));
  for (int64_t s = 0; s < B; ++s) b.targets.push_back(static_cast<int32_t>(rng.below(4, 2, static_cast<uint64_t>(s))));
  return b;
}

TEST(TrainGradcheck, KwtInputPath) {
  std::unique_ptr<Model> m = Model::create(tiny_kwt(), TaskKind::classify, 1);
  roughen(*m, 2);
  const Batch b = feature_batch(m->config(), 3, 7);
  gradcheck(*m, b, "kwt/classify full");
  m->set_attention("improved-clustered:clusters=3,bits=16,topk=4");
  gradcheck(*m, b, "kwt/classify improved-clustered");
}

TEST(TrainGradcheck, DecoderWithUntiedOutputLayer) {
  ModelConfig c = tiny_llama(13, 1);
  c.tie_embeddings = false;
  std::unique_ptr<Model> m = Model::create(c, TaskKind::lm, 1);
  ASSERT_EQ(m->param_info().back().name, "lm_head.weight");
  roughen(*m, 2);
  gradcheck(*m, tiny_batch(TaskKind::lm, 17, {17, 10}, 13, 0, 7), "decoder/lm untied gqa full");
}

// Dropout (both residual branches of every layer) redraws the same mask in backward.
TEST(TrainGradcheck, Dropout) {
  g_train_evals = true;
  for (bool dec : {false, true}) {
    std::unique_ptr<Model> m = dec ? Model::create(tiny_llama(), TaskKind::lm, 1)
                                        : Model::create(tiny_bert(), TaskKind::mlm, 1);
    roughen(*m, 2);
    m->set_dropout(0.2f);
    const Batch b = tiny_batch(dec ? TaskKind::lm : TaskKind::mlm, 13, {13, 9}, dec ? 13 : 11, 0, 4);
    const StepResult a = m->forward_backward(b, true, 1), a2 = m->forward_backward(b, true, 1);
    const StepResult c = m->forward_backward(b, true, 2), e = m->forward_backward(b, false, 1);
    EXPECT_EQ(a.loss_sum, a2.loss_sum);  // the same step draws the same masks
    EXPECT_NE(a.loss_sum, c.loss_sum);   // another step, other masks
    EXPECT_NE(a.loss_sum, e.loss_sum);   // evaluation: no dropout
    gradcheck(*m, b, dec ? "decoder/lm dropout 0.2" : "encoder/mlm dropout 0.2");
  }
  g_train_evals = false;
}

// The check must be able to fail: a gradient with one tensor's entries halved is caught.
TEST(TrainGradcheck, CatchesAWrongGradient) {
  std::unique_ptr<Model> m = Model::create(tiny_bert(), TaskKind::mlm, 1);
  roughen(*m, 2);
  const Batch b = tiny_batch(TaskKind::mlm, 13, {13, 9}, 11, 0, 4);
  Checker c(*m, b, 5);
  const ParamInfo* big = nullptr;  // the tensor with the largest gradient
  double best = 0;
  for (const ParamInfo& pi : m->param_info()) {
    double s = 0;
    for (int64_t i = 0; i < pi.size; ++i) s += std::pow(c.grad[static_cast<size_t>(pi.offset + i)], 2);
    if (s > best) best = s, big = &pi;
  }
  const ParamInfo& pi = *big;
  for (int64_t i = 0; i < pi.size; ++i) c.grad[static_cast<size_t>(pi.offset + i)] *= 0.5f;
  EXPECT_NE(c.check(unit_direction(pi.size, 12, 5), pi.offset, pi.offset + pi.size, pi.name), "");
}

}  // namespace
}  // namespace clattn::testing
