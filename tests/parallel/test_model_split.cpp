// Whole models with the sequence split across the ranks (Model::set_sequence_parallel) against the
// same model in one process. Run alone (one rank: the split is off and the two must be identical),
// at 2, 3 and 4 ranks as threads, and under `mpirun -np R` (CTest: parallel_mpi2, 3, 4). Every rank
// builds the same model twice from one seed; one runs whole, the other split across the ranks. The
// split model's hidden rows, its summed loss shares and its summed gradient shares must equal the
// whole model's to 1e-5 relative, for encoders (mlm, mean-pooled and first-token + pooler
// classifiers, padding) under full, clustered and improved-clustered attention, and for decoders
// (causal, ring attention, zig-zag positions through RoPE) in training, in forward and in prefill.
// Assertions never change the control flow between collectives.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "clattn/comm.h"
#include "clattn/model.h"
#include "clattn/rng.h"
#include "clattn/safetensors.h"
#include "clattn/seq_parallel.h"
#include "common/test_util.h"
#include "parallel/ranks.h"
#include "train/train_fixtures.h"

namespace clattn::testing {
namespace {

// sqrt(Σ (a − b)² / Σ b²) of two flat arrays.
double rel(const float* a, const float* b, size_t n) {
  double e = 0, s = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    e += d * d;
    s += static_cast<double>(b[i]) * b[i];
  }
  return s > 0 ? std::sqrt(e / s) : std::sqrt(e);
}

double norm(const float* a, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * a[i];
  return std::sqrt(s);
}

// Σ (split rows − whole rows at the same positions)² over the ranks, relative: the split model's
// (B, n, W) rows against the whole model's (B, T, W).
double split_rows_error(Communicator& comm, const Tensor& part, const Tensor& whole, const SeqSplit& s) {
  const int64_t B = whole.dim(0), T = whole.dim(1), W = whole.dim(2), n = s.local_rows(comm.rank());
  double e[2] = {0, 0};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < W; ++k) {
        const double want = whole.data()[(b * T + s.global(comm.rank(), i)) * W + k];
        const double d = part.data()[(b * n + i) * W + k] - want;
        e[0] += d * d;
        e[1] += want * want;
      }
  comm.all_reduce_sum(e, 2);
  return std::sqrt(e[0] / std::max(e[1], 1e-30));
}

// The whole model's step against the split model's: the shares of loss, targets and correct
// predictions, and the gradient shares, summed over the ranks.
void compare_steps(Communicator& comm, Model& whole, Model& part, const Batch& b, const std::string& what) {
  SCOPED_TRACE(what + " ranks=" + std::to_string(comm.size()));
  whole.zero_grads();
  part.zero_grads();
  const StepResult w = whole.forward_backward(b, true, 3);
  const StepResult p = part.forward_backward(b, true, 3);
  double figures[3] = {p.loss_sum, static_cast<double>(p.counted), static_cast<double>(p.correct)};
  comm.all_reduce_sum(figures, 3);
  EXPECT_NEAR(figures[0], w.loss_sum, 1e-5 * std::abs(w.loss_sum)) << "loss";
  EXPECT_EQ(static_cast<int64_t>(figures[1]), w.counted) << "targets";
  EXPECT_EQ(static_cast<int64_t>(figures[2]), w.correct) << "correct";
  std::vector<float> g(part.grads().begin(), part.grads().end());
  comm.all_reduce_sum(g.data(), g.size());
  EXPECT_LE(rel(g.data(), whole.grads().data(), g.size()), 1e-5) << "gradient";
  // Named parameters, so a failure says where: each within 1e-4 of its own norm, or of 1e-5 of
  // the whole gradient's for those whose exact gradient is zero (the key bias: softmax does not
  // see a shift shared by every key, so what is left is rounding).
  const double total = norm(whole.grads().data(), whole.grads().size());
  for (const ParamInfo& pi : whole.param_info()) {
    const size_t n = static_cast<size_t>(pi.size);
    const double want = norm(whole.grads().data() + pi.offset, n);
    const double e = rel(g.data() + pi.offset, whole.grads().data() + pi.offset, n) * std::max(want, 1e-30);
    if (e > 1e-4 * want + 1e-5 * total) ADD_FAILURE() << pi.name << ": gradient error " << e << " of " << want;
  }
  // Evaluation: the shares add up too.
  const StepResult we = whole.forward_backward(b, false, 0);
  const StepResult pe = part.forward_backward(b, false, 0);
  double ev[2] = {pe.loss_sum, static_cast<double>(pe.counted)};
  comm.all_reduce_sum(ev, 2);
  EXPECT_NEAR(ev[0], we.loss_sum, 1e-5 * std::abs(we.loss_sum)) << "evaluation loss";
  EXPECT_EQ(static_cast<int64_t>(ev[1]), we.counted);
}

const char* kPlans[] = {"full", "clustered:clusters=5,bits=16",
                        "full;improved-clustered:clusters=4,topk=6,bits=16"};

// Longer than the tiny fixtures' 32 positions, so every rank holds a few.
ModelConfig split_bert(int64_t labels) {
  ModelConfig c = tiny_bert(11, labels);
  c.max_positions = 96;
  return c;
}

TEST(ModelSplit, EncoderMlm) {
  on_each_job([](Communicator& comm) {
    OneThread one;
    for (const char* plan : kPlans) {
      std::unique_ptr<Model> whole = Model::create(split_bert(0), TaskKind::mlm, 1);
      std::unique_ptr<Model> part = Model::create(split_bert(0), TaskKind::mlm, 1);
      whole->set_attention(plan);
      part->set_attention(plan);
      part->set_sequence_parallel(&comm);
      compare_steps(comm, *whole, *part, tiny_batch(TaskKind::mlm, 67, {67, 40}, 11, 0, 5), std::string("mlm ") + plan);
    }
  });
}

TEST(ModelSplit, EncoderMeanPooledClassifier) {
  on_each_job([](Communicator& comm) {
    OneThread one;
    for (const char* plan : kPlans) {
      std::unique_ptr<Model> whole = Model::create(split_bert(3), TaskKind::classify, 1);
      std::unique_ptr<Model> part = Model::create(split_bert(3), TaskKind::classify, 1);
      whole->set_attention(plan);
      part->set_attention(plan);
      part->set_sequence_parallel(&comm);
      compare_steps(comm, *whole, *part, tiny_batch(TaskKind::classify, 64, {64, 33, 50}, 11, 3, 6),
                    std::string("classify mean ") + plan);
    }
  });
}

TEST(ModelSplit, PostLnFirstTokenWithPooler) {
  on_each_job([](Communicator& comm) {
    OneThread one;
    // A post-LN classifier with BERT's pooler, as a checkpoint folder (one per rank: no race).
    const std::string dir = ::testing::TempDir() + "clattn_split_pooler_" + std::to_string(comm.rank());
    ModelConfig c = split_bert(3);
    c.pre_ln = false;
    c.final_layer_norm = false;
    c.mean_pooling = false;
    c.type_vocab = 2;
    Model::create(c, TaskKind::classify, 1)->save(dir);
    {
      const SafetensorsFile f = SafetensorsFile::open(dir + "/model.safetensors");
      SafetensorsWriter w;
      std::vector<Tensor> keep;
      for (const std::string& name : f.names()) {
        keep.push_back(f.get_f32(name));
        w.add(name, keep.back().view());
      }
      const Tensor pw = randn(Shape{16, 16}, 9, 1, 0.3f), pb = randn(Shape{16}, 9, 2, 0.1f);
      w.add("pooler.dense.weight", pw.view());
      w.add("pooler.dense.bias", pb.view());
      w.write(dir + "/model.safetensors");
    }
    std::unique_ptr<Model> whole = Model::load(dir), part = Model::load(dir);
    ASSERT_EQ(whole->param("pooler.dense.weight").size, 256);
    part->set_sequence_parallel(&comm);
    compare_steps(comm, *whole, *part, tiny_batch(TaskKind::classify, 70, {70, 41}, 11, 3, 7), "classify first token + pooler");
    // Inference: the logits are whole on every rank.
    const std::vector<int32_t> ids(2 * 70, 3), lens = {70, 41};
    const Tensor lw = static_cast<Encoder&>(*whole).forward_tokens(ids, 2, 70, lens);
    const Tensor lp = static_cast<Encoder&>(*part).forward_tokens(ids, 2, 70, lens);
    EXPECT_LE(rel(lp.data(), lw.data(), static_cast<size_t>(lw.numel())), 1e-5);
    std::filesystem::remove_all(dir);
  });
}

TEST(ModelSplit, RandomBertHiddenRows) {
  on_each_job([](Communicator& comm) {
    OneThread one;
    ModelConfig c = split_bert(0);
    c.hidden = 32;
    c.heads = 4;
    c.ffn = 64;
    c.max_positions = 1000;
    for (const char* plan : kPlans) {
      std::unique_ptr<Encoder> whole = Encoder::random_bert(c, 2), part = Encoder::random_bert(c, 2);
      whole->set_attention(plan);
      part->set_attention(plan);
      part->set_sequence_parallel(&comm);
      std::vector<int32_t> ids(2 * 1000);
      const Rng rng(4);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(rng.below(11, 0, i));
      const std::vector<int32_t> lens = {1000, 613};
      const Tensor hw = whole->forward_tokens(ids, 2, 1000, lens);
      const Tensor hp = part->forward_tokens(ids, 2, 1000, lens);
      EXPECT_LE(split_rows_error(comm, hp, hw, part->sequence_split(1000)), 1e-5) << plan;
    }
  });
}

TEST(ModelSplit, DecoderTrainingForwardAndPrefill) {
  on_each_job([](Communicator& comm) {
    OneThread one;
    ModelConfig c = tiny_llama(13, 1);  // grouped-query attention
    for (const char* plan : {"full", "full:scale=0.3"}) {
      std::unique_ptr<Model> whole = Model::create(c, TaskKind::lm, 1), part = Model::create(c, TaskKind::lm, 1);
      whole->set_attention(plan);
      part->set_attention(plan);
      part->set_sequence_parallel(&comm);
      compare_steps(comm, *whole, *part, tiny_batch(TaskKind::lm, 63, {63, 30}, 13, 0, 8), std::string("lm ") + plan);
      Decoder& dw = static_cast<Decoder&>(*whole);
      Decoder& dp = static_cast<Decoder&>(*part);
      std::vector<int32_t> ids(64);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7 + 3) % 13);
      const Tensor lw = dw.forward(ids, 1, 64), lp = dp.forward(ids, 1, 64);
      EXPECT_LE(split_rows_error(comm, lp, lw, dp.sequence_split(64)), 1e-5) << "forward logits";
      dw.start(64);
      dp.start(64);
      const std::vector<float> pw = dw.prefill(ids), pp = dp.prefill(ids);
      EXPECT_LE(rel(pp.data(), pw.data(), pw.size()), 1e-5) << "prefill logits";
      if (comm.size() > 1) {
        EXPECT_THROW(dp.step(1), Error) << "decoding after a split prefill";
      }
    }
  });
}

TEST(ModelSplit, RefusalsNameTheReason) {
  on_each_job([](Communicator& comm) {
      std::unique_ptr<Model> m = Model::create(split_bert(0), TaskKind::mlm, 1);
    m->set_sequence_parallel(&comm);
    if (comm.size() == 1) {  // one rank: nothing is split, everything runs
      m->set_attention("local:window=4");
      m->set_dropout(0.1f);
      return;
    }
    try {
      m->set_attention("full;local:window=4");
      ADD_FAILURE() << "local attention was accepted with the sequence split";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("layer 1"), std::string::npos) << e.what();
    }
    EXPECT_EQ(m->attention_plan(), "full");  // nothing changed
    EXPECT_THROW(m->set_dropout(0.1f), Error);
    std::unique_ptr<Model> d = Model::create(tiny_llama(), TaskKind::lm, 1);
    d->set_sequence_parallel(&comm);
    EXPECT_THROW(d->set_attention("clustered:clusters=4"), Error);  // no causal clustering split
  });
}

}  // namespace
}  // namespace clattn::testing
