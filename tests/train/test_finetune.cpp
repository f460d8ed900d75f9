// One model for inference and training: the pretrained checkpoints of ../shared/data train
// (their loss from forward_backward equals the one from their inference logits, and falls with
// training), a loaded Encoder is the object that trains, and the Trainer (the library's loop)
// resumes bit for bit.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "clattn/model.h"
#include "clattn/safetensors.h"
#include "clattn/train.h"
#include "common/data.h"
#include "common/test_util.h"
#include "train_fixtures.h"

namespace clattn::testing {
namespace {

namespace fs = std::filesystem;

// Mean cross-entropy (nats) of logits (n, C) against targets (-1 skipped), in double.
double mean_ce(const float* logits, const std::vector<int32_t>& targets, int64_t C) {
  double s = 0;
  int64_t n = 0;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (targets[i] < 0) continue;
    const float* z = logits + static_cast<int64_t>(i) * C;
    double mx = z[0];
    for (int64_t c = 1; c < C; ++c) mx = std::max(mx, static_cast<double>(z[c]));
    double e = 0;
    for (int64_t c = 0; c < C; ++c) e += std::exp(z[c] - mx);
    s += mx + std::log(e) - z[targets[i]];
    ++n;
  }
  return s / static_cast<double>(n);
}

// stories260k: the loss of forward_backward equals the loss of its published logits, and a few
// AdamW steps on one batch lower it; the trained object still decodes, and saving and loading
// gives the same loss bits.
TEST(FineTune, Stories260kTrainsAndStillDecodes) {
  CLATTN_NEED_DATA("stories260k");
  const std::string dir = (data_dir() / "stories260k").string();
  const SafetensorsFile ref = SafetensorsFile::open(dir + "/reference_logits.safetensors");
  const std::vector<int32_t> tokens = ref.get_i32("tokens"), targets = ref.get_i32("targets");
  const Tensor logits = ref.get_f32("logits");  // (200, 512)
  std::unique_ptr<Model> m = Model::load(dir);
  ASSERT_EQ(m->head(), TaskKind::lm);
  Batch b;
  b.B = 1;
  b.T = static_cast<int64_t>(tokens.size());
  b.ids = tokens;
  b.lengths = {static_cast<int32_t>(b.T)};
  b.targets = targets;
  const StepResult r0 = m->forward_backward(b, false, 0);
  EXPECT_NEAR(r0.loss_sum / static_cast<double>(r0.counted), mean_ce(logits.data(), targets, 512), 1e-4);
  OptimizerOptions o;
  o.lr = 3e-3f;
  o.warmup = 0;
  o.total_steps = 5;
  Optimizer opt(*m, o);
  double before = 0, after = 0;
  for (int s = 0; s < 5; ++s) {
    m->zero_grads();
    const StepResult r = m->forward_backward(b, true, static_cast<uint64_t>(s));
    if (s == 0) before = r.loss_sum / static_cast<double>(r.counted);
    opt.step();
  }
  const StepResult r1 = m->forward_backward(b, false, 0);
  after = r1.loss_sum / static_cast<double>(r1.counted);
  EXPECT_LT(after, before - 0.05) << before << " -> " << after;
  // The object that trained decodes: a prefill's last logits equal the whole forward's.
  auto* dec = dynamic_cast<Decoder*>(m.get());
  ASSERT_NE(dec, nullptr);
  const Tensor full = dec->forward(tokens, 1, b.T);
  dec->start(b.T);
  const std::vector<float> last = dec->prefill(tokens);
  double worst = 0;
  for (int64_t v = 0; v < 512; ++v) worst = std::max(worst, std::abs(static_cast<double>(last[static_cast<size_t>(v)]) - full.data()[(b.T - 1) * 512 + v]));
  EXPECT_LT(worst, 1e-4);
  const std::string out = ::testing::TempDir() + "clattn_ft_stories_" + std::to_string(::getpid());
  m->save(out);
  std::unique_ptr<Model> m2 = Model::load(out);
  const StepResult r2 = m2->forward_backward(b, false, 0);
  EXPECT_EQ(r2.loss_sum, r1.loss_sum);
  fs::remove_all(out);
}

// KWT-1: the classify loss of a feature batch equals the one of its reference logits; training
// lowers it; the inference forward of the same object gives the trained logits.
TEST(FineTune, Kwt1TrainsOnFeatures) {
  CLATTN_NEED_DATA("kwt1");
  OneThread one;
  const std::string dir = (data_dir() / "kwt1").string();
  const SafetensorsFile fs_ = SafetensorsFile::open(dir + "/features_espeak_keywords.safetensors");
  const Tensor feats = fs_.get_f32("features"), logits = fs_.get_f32("logits");  // (100, 98, 40), (100, 12)
  const std::vector<int32_t> labels = fs_.get_i32("labels");
  std::unique_ptr<Encoder> e = Encoder::load(dir);
  const int64_t B = 8;
  Batch b;
  b.B = B;
  b.T = 98;
  b.feature_dim = 40;
  b.features.assign(feats.data(), feats.data() + B * 98 * 40);
  b.lengths.assign(B, 98);
  b.targets.assign(labels.begin(), labels.begin() + B);
  const StepResult r0 = e->forward_backward(b, false, 0);
  EXPECT_NEAR(r0.loss_sum / static_cast<double>(r0.counted), mean_ce(logits.data(), b.targets, 12), 1e-4);
  OptimizerOptions o;
  o.lr = 1e-3f;
  o.warmup = 0;
  o.total_steps = 8;
  Optimizer opt(*e, o);
  for (int s = 0; s < 8; ++s) {
    e->zero_grads();
    e->forward_backward(b, true, static_cast<uint64_t>(s));
    opt.step();
  }
  const StepResult r1 = e->forward_backward(b, false, 0);
  EXPECT_LT(r1.loss_sum, r0.loss_sum);
  ConstView v = feats.view();
  v.shape = Shape{B, 98, 40};
  const Tensor trained = e->forward_features(v);
  EXPECT_NEAR(mean_ce(trained.data(), b.targets, 12), r1.loss_sum / static_cast<double>(r1.counted), 1e-5);
}

// The library's training loop: a run stopped by its time budget after one step and resumed
// repeats an uninterrupted run's losses bit for bit, and its checkpoints load as models.
TEST(Trainer, ResumesBitExactAndWritesLoadableCheckpoints) {
  OneThread one;
  const fs::path root = fs::path(::testing::TempDir()) / ("clattn_trainer_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  {
    std::ofstream text(root / "text.txt");
    for (int i = 0; i < 400; ++i) text << "line " << i << ": the quick brown fox " << (i * 7 % 13) << "\n";
  }
  auto options = [&](const std::string& ck) {
    TrainOptions a;
    a.task.kind = "lm";
    a.task.data = (root / "text.txt").string();
    a.layers = 2;
    a.dim = 16;
    a.heads = 2;
    a.ff = 32;
    a.seq = 32;
    a.batch = 2;
    a.steps = 6;
    a.warmup = 2;
    a.eval_every = 3;
    a.eval_examples = 4;
    a.checkpoint = (root / ck).string();
    a.attention = "improved-clustered:clusters=3,topk=4,block=8";
    return a;
  };
  std::vector<double> ref, got;
  {
    Trainer t(options("ref"));
    t.on_step = [&](const StepReport& r) { ref.push_back(r.loss); };
    EXPECT_EQ(t.run(), "steps");
    EXPECT_EQ(t.steps_done(), 6);
    EXPECT_FALSE(std::isnan(t.best_metric()));
  }
  {
    TrainOptions a = options("tb");
    a.time_budget = 1e-9;
    Trainer t(a);
    t.on_step = [&](const StepReport& r) { got.push_back(r.loss); };
    EXPECT_EQ(t.run(), "time_budget");
    EXPECT_EQ(t.steps_done(), 1);
  }
  {
    TrainOptions a = options("tb");
    a.resume = true;
    Trainer t(a);
    EXPECT_TRUE(t.resumed());
    EXPECT_EQ(t.start_step(), 1);
    t.on_step = [&](const StepReport& r) { got.push_back(r.loss); };
    t.run();
  }
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_EQ(got[i], ref[i]) << "step " << i + 1;
  // Different options are refused on resume, naming the option.
  {
    TrainOptions a = options("tb");
    a.resume = true;
    a.lr = 2e-3;
    try {
      Trainer t(a);
      ADD_FAILURE() << "a resume with another --lr was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--lr"), std::string::npos) << e.what();
    }
  }
  // A kill between the two writes of an evaluation: best/ is written first, so latest/ may name an
  // older best than best/ holds; the resumed run takes the best from best/ itself.
  {
    fs::copy(root / "ref", root / "kill", fs::copy_options::recursive);
    const fs::path ls = root / "kill" / "latest" / "train_state.json";
    nlohmann::json st = nlohmann::json::parse(std::ifstream(ls));
    const nlohmann::json bst = nlohmann::json::parse(std::ifstream(root / "kill" / "best" / "train_state.json"));
    st["best_step"] = 0;
    st["best_metric"] = 1e9;
    std::ofstream(ls) << st.dump(2) << "\n";
    TrainOptions a = options("kill");
    a.resume = true;
    Trainer t(a);
    EXPECT_EQ(t.best_step(), bst["step"].get<int64_t>());
    EXPECT_EQ(t.best_metric(), bst["best_metric"].get<double>());
  }
  std::unique_ptr<Model> best = Model::load((root / "ref" / "best").string());
  EXPECT_EQ(best->attention_plan(), "improved-clustered:clusters=3,topk=4,block=8");
  EXPECT_EQ(best->head(), TaskKind::lm);
  fs::remove_all(root);
}

// on_grads_ready reports every parameter exactly once per backward, each range already final
// (what a data-parallel trainer relies on to reduce while the backward still runs). The first
// layer's weight gradients come after the embeddings' (their products are computed while the
// embeddings travel), and the gradient has the same bits as with nobody listening.
TEST(Train, GradsReadyRangesAreFinalAndCoverEveryParameter) {
  for (int arch = 0; arch < 8; ++arch) {  // BERT pre-LN, BERT post-LN, LLaMA, GPT-2; each without and with dropout
    const bool dec = arch % 4 >= 2;
    const TaskKind head = dec ? TaskKind::lm : TaskKind::mlm;
    ModelConfig cfg = dec ? tiny_llama() : tiny_bert();
    if (arch % 4 == 1) cfg.pre_ln = false;
    if (arch % 4 == 3) {
      cfg.model_type = "gpt2";
      cfg.kv_heads = cfg.heads;
      cfg.head_dim = cfg.hidden / cfg.heads;
    }
    SCOPED_TRACE("architecture " + std::to_string(arch));
    std::unique_ptr<Model> m = Model::create(cfg, head, 3);
    if (arch >= 4) m->set_dropout(0.2f);
    roughen(*m, 4);
    const Batch b = tiny_batch(head, 13, {13, 9}, dec ? 13 : 11, 0, 5);
    std::vector<std::pair<int64_t, int64_t>> ranges;
    std::vector<std::vector<float>> copies;
    m->on_grads_ready = [&](int64_t lo, int64_t hi) {
      ranges.emplace_back(lo, hi);
      copies.emplace_back(m->grads().begin() + lo, m->grads().begin() + hi);
    };
    m->zero_grads();
    m->forward_backward(b, true, 1);
    const int64_t P = static_cast<int64_t>(m->params().size());
    std::vector<int> seen(static_cast<size_t>(P), 0);
    for (size_t i = 0; i < ranges.size(); ++i) {
      const auto [lo, hi] = ranges[i];
      for (int64_t k = lo; k < hi; ++k) ++seen[static_cast<size_t>(k)];
      EXPECT_TRUE(std::equal(copies[i].begin(), copies[i].end(), m->grads().begin() + lo)) << "range " << lo << ".." << hi;
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), P);
    auto query = [&](int l) {
      const std::string n = std::to_string(l);
      return m->param(arch % 4 == 3 ? "h." + n + ".attn.c_attn.weight"
                      : dec         ? "model.layers." + n + ".self_attn.q_proj.weight"
                                    : "encoder.layer." + n + ".attention.self.query.weight")
          .offset;
    };
    const int64_t q0 = query(0), q1 = query(1);
    auto when = [&](int64_t k) {  // the index of the report holding parameter float k
      for (size_t i = 0; i < ranges.size(); ++i)
        if (ranges[i].first <= k && k < ranges[i].second) return i;
      return ranges.size();
    };
    EXPECT_LT(when(q1), when(0)) << "the top layer before the embeddings";
    EXPECT_LT(when(0), when(q0)) << "the embeddings before the first layer's weight products";
    EXPECT_GT(ranges.size(), 4u) << "the first layer's weights come product by product";
    const std::vector<float> heard(m->grads().begin(), m->grads().end());
    m->on_grads_ready = nullptr;
    m->zero_grads();
    m->forward_backward(b, true, 1);
    EXPECT_TRUE(std::equal(heard.begin(), heard.end(), m->grads().begin())) << "the held products changed the gradient";
  }
}

}  // namespace
}  // namespace clattn::testing
