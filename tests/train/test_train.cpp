// Trainable models against the inference models, checkpoints, the optimizer, and overfitting a
// tiny batch. The throughput measurement (DISABLED_, run by hand) is at the end.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "clattn/error.h"
#include "clattn/gemm.h"
#include "clattn/model.h"
#include "clattn/threads.h"
#include "clattn/train.h"
#include "common/test_util.h"
#include "train_fixtures.h"

namespace clattn::testing {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name) {
    path = fs::temp_directory_path() / ("clattn_train_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string str(const std::string& sub = "") const { return (sub.empty() ? path : path / sub).string(); }
};

// The encoder's final hidden state equals Encoder::load's output on the saved folder (the
// "without head" path), for every row, padded ones included.
TEST(Train, EncoderMatchesInferenceEncoder) {
  TempDir d("enc");
  std::unique_ptr<Model> m = Model::create(tiny_bert(11, 0), TaskKind::mlm, 1);
  roughen(*m, 2);
  const Batch b = tiny_batch(TaskKind::mlm, 13, {13, 9}, 11, 0, 4);
  for (const std::string plan : {"full", "full;improved-clustered:clusters=3,bits=16,topk=4"}) {
    m->set_attention(plan);
    m->forward_backward(b, false, 0);
    m->save(d.str());
    std::unique_ptr<Encoder> e = Encoder::load(d.str());
    e->set_attention(plan);
    const Tensor h = e->forward_tokens(b.ids, b.B, b.T, b.lengths);
    ASSERT_EQ(h.numel(), m->last_hidden().numel());
    EXPECT_LT(max_abs_diff(make_view(h.data(), m->last_hidden().shape), m->last_hidden()), 1e-5) << plan;
  }
}

// A trained classifier pools the mean of the valid tokens; Encoder::load reads that from the
// saved config ("classifier_pooling": "mean"), so its logits give the trainer's loss.
TEST(Train, ClassifierMatchesInferenceEncoder) {
  TempDir d("cls");
  std::unique_ptr<Model> m = Model::create(tiny_bert(11, 3), TaskKind::classify, 1);
  roughen(*m, 2);
  const Batch b = tiny_batch(TaskKind::classify, 11, {11, 6, 9}, 11, 3, 6);
  const StepResult r = m->forward_backward(b, false, 0);
  m->save(d.str());
  std::unique_ptr<Encoder> e = Encoder::load(d.str());
  const Tensor logits = e->forward_tokens(b.ids, b.B, b.T, b.lengths);  // (B, 3)
  ASSERT_EQ(logits.numel(), b.B * 3);
  double loss = 0;
  for (int64_t i = 0; i < b.B; ++i) {
    const float* z = logits.data() + i * 3;
    const double mx = std::max({z[0], z[1], z[2]});
    double s = 0;
    for (int c = 0; c < 3; ++c) s += std::exp(z[c] - mx);
    loss += mx + std::log(s) - z[b.targets[static_cast<size_t>(i)]];
  }
  EXPECT_NEAR(loss, r.loss_sum, 1e-5 * b.B);
}

// The decoder's logits (final hidden state times the tied embeddings, in double) equal
// Decoder::load's on the saved folder.
TEST(Train, DecoderMatchesInferenceDecoder) {
  TempDir d("dec");
  for (int64_t kv : {2, 1}) {
    std::unique_ptr<Model> m = Model::create(tiny_llama(13, kv), TaskKind::lm, 1);
    roughen(*m, 2);
    const Batch b = tiny_batch(TaskKind::lm, 17, {17, 10}, 13, 0, 7);
    m->forward_backward(b, false, 0);
    m->save(d.str());
    std::unique_ptr<Decoder> dec = Decoder::load(d.str());
    const Tensor logits = dec->forward(b.ids, b.B, b.T, b.lengths);
    const ConstView h = m->last_hidden();
    const float* emb = m->params().data() + m->param_info()[0].offset;
    ASSERT_EQ(m->param_info()[0].name, "model.embed_tokens.weight");
    double worst = 0;
    for (int64_t r = 0; r < b.B * b.T; ++r) {
      if (r % b.T >= b.lengths[static_cast<size_t>(r / b.T)]) continue;  // padded rows: not compared
      for (int64_t v = 0; v < 13; ++v) {
        double s = 0;
        for (int64_t e = 0; e < 16; ++e) s += static_cast<double>(h.data[r * 16 + e]) * emb[v * 16 + e];
        worst = std::max(worst, std::abs(s - logits.data()[r * 13 + v]));
      }
    }
    EXPECT_LT(worst, 1e-5) << "kv_heads " << kv;
  }
}

TEST(Train, SaveLoadGivesIdenticalLossBits) {
  TempDir d("saveload");
  for (TaskKind head : {TaskKind::mlm, TaskKind::classify, TaskKind::lm}) {
    const bool dec = head == TaskKind::lm;
    const ModelConfig cfg = dec ? tiny_llama() : tiny_bert(11, head == TaskKind::classify ? 3 : 0);
    std::unique_ptr<Model> m = Model::create(cfg, head, 9);
    roughen(*m, 3);
    m->set_attention("improved-clustered:clusters=3,topk=4");
    const Batch b = tiny_batch(head, 13, {13, 7}, cfg.vocab, cfg.num_labels, 8);
    const StepResult r0 = m->forward_backward(b, false, 3);
    m->save(d.str());
    std::unique_ptr<Model> m2 = Model::load(d.str());
    EXPECT_EQ(m2->head(), head);
    ASSERT_EQ(m2->params().size(), m->params().size());
    EXPECT_EQ(std::memcmp(m2->params().data(), m->params().data(), sizeof(float) * m->params().size()), 0);
    const StepResult r1 = m2->forward_backward(b, false, 3);
    EXPECT_EQ(std::memcmp(&r0.loss_sum, &r1.loss_sum, sizeof(double)), 0) << r0.loss_sum << " vs " << r1.loss_sum;
    EXPECT_EQ(r0.counted, r1.counted);
  }
}

// Routing's EMA centroids (layer state) move with training calls and travel with the checkpoint.
TEST(Train, AttentionStateIsSavedWithTheCheckpoint) {
  TempDir d("state");
  std::unique_ptr<Model> m = Model::create(tiny_bert(), TaskKind::mlm, 1);
  roughen(*m, 2);
  m->set_attention("full;routing:clusters=3,centroids=ema,decay=0.1");
  const Batch b = tiny_batch(TaskKind::mlm, 13, {13, 9}, 11, 0, 4);
  const StepResult fresh = m->forward_backward(b, false, 1);
  for (uint64_t s = 0; s < 3; ++s) m->forward_backward(b, true, s);  // EMA updates
  const StepResult moved = m->forward_backward(b, false, 1);
  EXPECT_NE(fresh.loss_sum, moved.loss_sum);
  m->save(d.str());
  std::unique_ptr<Model> m2 = Model::load(d.str());
  const StepResult r = m2->forward_backward(b, false, 1);
  EXPECT_EQ(std::memcmp(&r.loss_sum, &moved.loss_sum, sizeof(double)), 0) << r.loss_sum << " vs " << moved.loss_sum;
}

TEST(Train, CheckpointErrorsNameTheProblem) {
  TempDir d("bad");
  std::unique_ptr<Model> m = Model::create(tiny_bert(), TaskKind::mlm, 1);
  m->save(d.str());
  // A config of another size: the tensor shapes disagree.
  {
    std::ifstream in(d.str("config.json"));
    std::string s((std::istreambuf_iterator<char>(in)), {});
    const size_t at = s.find("\"intermediate_size\": 32");
    ASSERT_NE(at, std::string::npos);
    s.replace(at, 23, "\"intermediate_size\": 31");
    std::ofstream(d.str("config.json")) << s;
  }
  try {
    Model::load(d.str());
    ADD_FAILURE() << "a misshapen checkpoint was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("intermediate.dense.weight"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Model::load(d.str("missing")), Error);
  // Bad batches are refused, not crashed on.
  Batch b = tiny_batch(TaskKind::mlm, 13, {13, 9}, 11, 0, 4);
  b.lengths[1] = 14;
  EXPECT_THROW(m->forward_backward(b, true, 0), Error);
  b = tiny_batch(TaskKind::mlm, 13, {13, 9}, 11, 0, 4);
  b.ids[3] = 11;
  EXPECT_THROW(m->forward_backward(b, true, 0), Error);
  b = tiny_batch(TaskKind::mlm, 40, {40}, 11, 0, 4);  // beyond max_position_embeddings
  EXPECT_THROW(m->forward_backward(b, true, 0), Error);
  m->set_attention("reformer");  // shared-QK: trained with the queries as keys
  m->set_attention("full");
  EXPECT_THROW(Model::create(tiny_bert(), TaskKind::lm, 1), Error);
  EXPECT_THROW(Model::create(tiny_llama(), TaskKind::mlm, 1), Error);
}

TEST(Train, TrainBytesEstimate) {
  ModelConfig c = tiny_bert(256, 0);
  c.hidden = 128;
  c.ffn = 256;
  c.layers = 4;
  c.max_positions = 4096;
  std::unique_ptr<Model> m = Model::create(c, TaskKind::mlm, 1);
  // Activations alone are 4 layers x (8H + F) + 13H + 2F + vocab floats a row: ~9.6 KB a token.
  const double per_token = (m->train_bytes(1, 4096) - m->train_bytes(1, 2048)) / 2048;
  EXPECT_GT(per_token, 4.0 * (4 * (8 * 128 + 256) + 13 * 128 + 2 * 256 + 256));
  EXPECT_LT(per_token, 4.0 * 3 * (4 * (8 * 128 + 256) + 13 * 128 + 2 * 256 + 256));  // + full's O(N) state
  EXPECT_GT(m->train_bytes(1, 16), 16.0 * static_cast<double>(m->params().size()));
}

// AdamW on one small batch: the loss falls far, with clipping and the schedule on.
TEST(Train, OverfitsATinyBatch) {
  OneThread one;
  for (TaskKind head : {TaskKind::mlm, TaskKind::lm, TaskKind::classify}) {
    const bool dec = head == TaskKind::lm;
    const ModelConfig cfg = dec ? tiny_llama() : tiny_bert(11, head == TaskKind::classify ? 3 : 0);
    std::unique_ptr<Model> m = Model::create(cfg, head, 5);
    m->set_attention(dec ? "full" : "improved-clustered:clusters=3,topk=4");
    OptimizerOptions o;
    o.lr = 1e-2f;
    o.min_lr = 1e-3f;
    o.warmup = 5;
    o.total_steps = 50;
    Optimizer opt(*m, o);
    const Batch b = tiny_batch(head, 13, {13, 9}, cfg.vocab, cfg.num_labels, 4);
    double first = 0, last = 0;
    for (int s = 0; s < 50; ++s) {
      m->zero_grads();
      const StepResult r = m->forward_backward(b, true, static_cast<uint64_t>(s));
      const double loss = r.loss_sum / static_cast<double>(r.counted);
      if (s == 0) first = loss;
      last = loss;
      opt.step();
    }
    EXPECT_EQ(opt.steps_done(), 50);
    EXPECT_LT(last, 0.3 * first) << "head " << static_cast<int>(head) << ": " << first << " -> " << last;
  }
}

TEST(Train, OptimizerStateRoundTripIsBitExact) {
  TempDir d("opt");
  std::unique_ptr<Model> m = Model::create(tiny_llama(), TaskKind::lm, 5);
  const Batch b = tiny_batch(TaskKind::lm, 13, {13, 9}, 13, 0, 4);
  OptimizerOptions o;
  o.warmup = 2;
  o.total_steps = 20;
  Optimizer opt(*m, o);
  auto train = [&](Model& model, Optimizer& op, int from, int to) {
    for (int s = from; s < to; ++s) {
      model.zero_grads();
      model.forward_backward(b, true, static_cast<uint64_t>(s));
      op.step();
    }
  };
  train(*m, opt, 0, 3);
  m->save(d.str("model"));
  opt.save(d.str("optimizer.safetensors"));
  // Continue the original, and a restored copy, for 3 more steps: identical parameters.
  train(*m, opt, 3, 6);
  std::unique_ptr<Model> m2 = Model::load(d.str("model"));
  Optimizer opt2(*m2, o);
  opt2.load(d.str("optimizer.safetensors"));
  EXPECT_EQ(opt2.steps_done(), 3);
  train(*m2, opt2, 3, 6);
  EXPECT_EQ(std::memcmp(m->params().data(), m2->params().data(), sizeof(float) * m->params().size()), 0);
  // A state of another model is refused.
  std::unique_ptr<Model> other = Model::create(tiny_bert(), TaskKind::mlm, 1);
  Optimizer opt3(*other, o);
  EXPECT_THROW(opt3.load(d.str("optimizer.safetensors")), Error);
}

TEST(Train, ClipAndNonFiniteGradients) {
  std::unique_ptr<Model> m = Model::create(tiny_bert(), TaskKind::mlm, 1);
  OptimizerOptions o;
  o.clip = 1e-3f;
  Optimizer opt(*m, o);
  std::fill(m->grads().begin(), m->grads().end(), 1.f);
  const double norm = opt.step();
  EXPECT_NEAR(norm, std::sqrt(static_cast<double>(m->grads().size())), 1e-3);
  double s = 0;
  for (float g : m->grads()) s += static_cast<double>(g) * g;
  EXPECT_NEAR(std::sqrt(s), 1e-3, 1e-6);  // clipped in place
  m->grads()[7] = NAN;
  EXPECT_THROW(opt.step(), Error);
}

}  // namespace
}  // namespace clattn::testing
