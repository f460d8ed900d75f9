// The training loop (train.h): a run's model, task, optimizer, evaluation, checkpoints, log.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include <nlohmann/json.hpp>

#include "clattn/atomic_file.h"
#include "clattn/cpu.h"
#include "clattn/error.h"
#include "clattn/input_file.h"
#include "clattn/nn.h"
#include "clattn/tokenizer.h"
#include "clattn/train.h"
#include "train/grad_reduce.h"
#include "train/run_files.h"

namespace clattn {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string canonical(const std::string& path) {
  if (path.empty()) return path;
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(path, ec);
  return ec ? path : p.string();
}

// The shortest decimal that reads back as f: options logged as typed (0.15, not 0.150000006).
double as_typed(float f) {
  char buf[32];
  for (int digits = 6; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(f));
    if (std::strtof(buf, nullptr) == f) break;
  }
  return std::strtod(buf, nullptr);
}

// The options that determine the training trajectory: a resumed run must repeat them.
json run_args(const TrainOptions& a, int64_t seq, const std::string& tokenizer) {
  json j = {{"task", a.task.kind},       {"data", canonical(a.task.data)}, {"attention", a.attention},
            {"layers", a.layers},        {"dim", a.dim},                   {"heads", a.heads},
            {"ff", a.ff},                {"seq", seq},                     {"batch", a.batch},
            {"steps", a.steps},          {"lr", a.lr},                     {"min_lr", a.min_lr},
            {"warmup", a.warmup},        {"clip", a.clip},                 {"weight_decay", a.weight_decay},
            {"dropout", a.dropout},      {"seed", a.task.seed},            {"min_length", a.task.min_length},
            {"max_length", a.task.max_length}, {"mask_prob", as_typed(a.task.mask_prob)}};
  // Saved only when set: a byte-level run from scratch has neither (resume compares the keys saved).
  if (!a.init.empty()) j["init"] = canonical(a.init);
  if (!tokenizer.empty()) j["tokenizer"] = canonical(tokenizer);
  return j;
}

// A fresh model for the task: listops -> pre-LN BERT encoder with a mean-pooled classifier, mlm ->
// BERT with the tied output layer, lm -> LLaMA decoder (heads of dim / heads, no grouping).
ModelConfig fresh_config(const TrainOptions& a, const Task& task, int64_t seq) {
  ModelConfig c;
  c.layers = a.layers;
  c.hidden = a.dim;
  c.heads = a.heads;
  c.ffn = a.ff > 0 ? a.ff : 2 * a.dim;
  c.vocab = task.vocab();
  c.max_positions = seq;
  c.eps = 1e-5f;
  if (task.kind() == TaskKind::lm) {
    c.kind = ModelKind::llama;
    c.model_type = "llama";
    c.kv_heads = a.heads;
    c.head_dim = a.dim / a.heads;
    c.tie_embeddings = true;
  } else {
    check(task.feature_dim() == 0, "train: a feature task trains a pretrained KWT model: give init");
    c.kind = ModelKind::bert;
    c.model_type = "bert";
    c.pre_ln = true;
    c.final_layer_norm = true;
    if (task.kind() == TaskKind::classify) {
      c.num_labels = task.classes();
      c.mean_pooling = true;
    }
  }
  return c;
}

void copy_tokenizer(const std::string& tokenizer, const fs::path& dir) {
  if (tokenizer.empty()) return;
  const fs::path src = fs::path(tokenizer).parent_path();
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}) {
    const fs::path from = f == std::string("tokenizer.json") ? fs::path(tokenizer) : src / f;
    if (!input_exists(from.string())) continue;
    write_file_atomic((dir / f).string(), read_input_file(from.string(), "train: tokenizer file", kMaxJsonBytes));
  }
}

[[noreturn]] void diverged(int64_t step, const std::string& why) {
  fail("train: diverged at step ", step, " (try a lower --lr): ", why);
}

// No inf or NaN among the values (x·0 is 0 for finite x only).
bool all_finite(std::span<const float> v) {
  float acc = 0.f;
  for (const float x : v) acc += x * 0.f;
  return acc == 0.f;
}

}  // namespace

EvalResult evaluate(Model& model, const std::vector<Batch>& batches, bool accuracy) {
  const auto t0 = Clock::now();
  double loss = 0;
  int64_t counted = 0, correct = 0, examples = 0;
  for (const Batch& b : batches) {
    const StepResult r = model.forward_backward(b, false, 0);
    loss += r.loss_sum;
    counted += r.counted;
    correct += r.correct;
    examples += b.B;
  }
  EvalResult e;
  e.examples = examples;
  e.targets = counted;
  e.loss = counted ? loss / static_cast<double>(counted) : 0;
  e.metric = accuracy ? (counted ? static_cast<double>(correct) / static_cast<double>(counted) : 0) : e.loss / std::log(2.0);
  e.seconds = seconds_since(t0);
  return e;
}

EvalResult evaluate(Model& model, const std::vector<Batch>& batches, bool accuracy, Communicator& comm) {
  return evaluate(model, batches, accuracy, comm, 1);
}

EvalResult evaluate(Model& model, const std::vector<Batch>& batches, bool accuracy, Communicator& comm,
                    int group_ranks) {
  const auto t0 = Clock::now();
  check(group_ranks >= 1 && comm.size() % group_ranks == 0, "evaluate: groups of ", group_ranks,
        " ranks do not divide the ", comm.size(), " ranks");
  const int G = comm.size() / group_ranks, g = comm.rank() / group_ranks;
  const bool group_lead = comm.rank() % group_ranks == 0;
  // Per batch: loss sum, targets, correct, examples; zero where another group evaluates (and the
  // examples counted by the group's first rank), so the all-reduce is exact and every rank adds
  // the same numbers in batch order.
  std::vector<double> per(4 * batches.size(), 0.0);
  for (size_t i = static_cast<size_t>(g); i < batches.size(); i += static_cast<size_t>(G)) {
    const StepResult r = model.forward_backward(batches[i], false, 0);
    per[4 * i] = r.loss_sum;
    per[4 * i + 1] = static_cast<double>(r.counted);
    per[4 * i + 2] = static_cast<double>(r.correct);
    per[4 * i + 3] = group_lead ? static_cast<double>(batches[i].B) : 0.0;
  }
  comm.all_reduce_sum(per.data(), per.size());
  double loss = 0, counted = 0, correct = 0, examples = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    loss += per[4 * i];
    counted += per[4 * i + 1];
    correct += per[4 * i + 2];
    examples += per[4 * i + 3];
  }
  EvalResult e;
  e.examples = static_cast<int64_t>(examples);
  e.targets = static_cast<int64_t>(counted);
  e.loss = counted > 0 ? loss / counted : 0;
  e.metric = accuracy ? (counted > 0 ? correct / counted : 0) : e.loss / std::log(2.0);
  e.seconds = seconds_since(t0);
  return e;
}

class Trainer::Files {
 public:
  fs::path root;
  json args;
  train::SavedState state;
  train::FolderLock lock;  // rank 0 only
  train::Log log;
};

// Every rank of a data- or sequence-parallel run must run the same command on the same data: ranks
// that differ would deadlock in a collective, exchange buffers of other sizes, or train copies
// that silently diverge. One all-gather of one hash per option compares them at start-up; a
// difference ends the job on every rank, naming the option, this rank's value and the ranks.
void check_train_ranks_agree(Communicator& comm, const TrainOptions& a) {
  if (comm.size() <= 1) return;
  // The options that shape the trajectory (as a resumed run's are compared) and those that shape
  // the job: every rank must stop, evaluate and checkpoint at the same steps.
  std::vector<std::pair<std::string, std::string>> facts;
  json args = run_args(a, a.seq, "");
  args["init"] = canonical(a.init);  // present on every rank: the ranks' lists must be as long
  for (const auto& [k, v] : args.items()) facts.emplace_back(k, v.is_string() ? v.get<std::string>() : v.dump());
  for (auto& [k, v] : std::vector<std::pair<std::string, std::string>>{
           {"data file", file_fingerprint(a.task.data)},
           {"init config.json", a.init.empty() ? "" : file_fingerprint((fs::path(a.init) / "config.json").string())},
           {"eval_every", std::to_string(a.eval_every)}, {"eval_examples", std::to_string(a.eval_examples)},
           {"time_budget", detail::concat(a.time_budget)}, {"checkpoint", canonical(a.checkpoint)},
           {"resume", a.resume ? "on" : "off"}, {"accum", std::to_string(a.accum)},
           {"reproducible", a.reproducible ? "on" : "off"}, {"shard_optimizer", a.shard_optimizer ? "on" : "off"},
           {"overlap", a.overlap ? "on" : "off"}, {"sequence_ranks", std::to_string(a.sequence_ranks)}})
    facts.emplace_back(std::move(k), std::move(v));
  clattn::check_ranks_agree(comm, "train", facts);
}

void check_train_options(TrainOptions& a, OptionNames names) {
  // "eval_every" as the front end spells it.
  const auto opt = [names](std::string field) {
    if (names == OptionNames::python) return field;
    std::replace(field.begin(), field.end(), '_', '-');
    return "--" + field;
  };
  using train::kMaxCount;
  const auto range = [&](int64_t v, int64_t lo, int64_t hi, const char* field) {
    if (v >= lo && v <= hi) return;
    if (hi == kMaxCount) fail("train: ", opt(field), " must be >= ", lo, ", got ", v);
    fail("train: ", opt(field), " must be in [", lo, ", ", hi, "], got ", v);
  };
  (void)task_head(a.task.kind, "train");
  check(!a.checkpoint.empty() || !a.resume, "train: ", opt("resume"), " needs ", opt("checkpoint"));
  range(a.layers, 1, 1024, "layers");
  range(a.dim, 1, 1 << 16, "dim");
  range(a.heads, 1, a.dim, "heads");
  check(a.dim % a.heads == 0, "train: ", opt("dim"), " (", a.dim, ") must be a multiple of ", opt("heads"), " (", a.heads,
        ")");
  if (a.ff == 0) a.ff = 2 * a.dim;
  range(a.ff, 1, 1 << 20, "ff");
  range(a.seq, 0, kMaxCount, "seq");
  range(a.batch, 1, 1 << 20, "batch");
  range(a.accum, 1, 1 << 20, "accum");
  range(a.steps, 1, kMaxCount, "steps");
  range(a.warmup, 0, kMaxCount, "warmup");
  range(a.eval_every, 1, kMaxCount, "eval_every");
  range(a.eval_examples, 0, kMaxCount, "eval_examples");
  range(a.sequence_ranks, 0, 1 << 20, "sequence_ranks");
  check(a.lr > 0 && std::isfinite(a.lr), "train: ", opt("lr"), " must be > 0, got ", a.lr);
  if (a.min_lr < 0) a.min_lr = a.lr / 10;
  check(a.min_lr <= a.lr && std::isfinite(a.min_lr), "train: ", opt("min_lr"), " must be in [0, ", opt("lr"), "], got ",
        a.min_lr);
  check(a.clip >= 0 && std::isfinite(a.clip), "train: ", opt("clip"), " must be >= 0 (0: off), got ", a.clip);
  check(a.weight_decay >= 0 && std::isfinite(a.weight_decay), "train: ", opt("weight_decay"), " must be >= 0, got ",
        a.weight_decay);
  check(a.dropout >= 0 && a.dropout < 1, "train: ", opt("dropout"), " must be in [0, 1), got ", a.dropout);
  check(a.task.mask_prob > 0 && a.task.mask_prob <= 1, "train: ", opt("mask_prob"), " must be in (0, 1], got ",
        a.task.mask_prob);
  check(a.time_budget >= 0 && std::isfinite(a.time_budget), "train: ", opt("time_budget"),
        " must be >= 0 seconds, got ", a.time_budget);
  check(a.task.min_length >= 1 && a.task.min_length <= a.task.max_length, "train: listops lengths need 1 <= ",
        opt("min_length"), " <= ", opt("max_length"), ", got ", a.task.min_length, " and ", a.task.max_length);
  check(a.task.kind == "listops" || !a.task.data.empty(), "train: task ", a.task.kind, " needs ", opt("data"),
        a.task.kind == "features" ? " FEATURES.safetensors" : " TEXTFILE");
  check(a.task.kind != "features" || !a.init.empty(), "train: task features fine-tunes a KWT model: give ", opt("init"),
        " DIR");
}

Trainer::Trainer(TrainOptions opt) : opt_(std::move(opt)), files_(std::make_unique<Files>()), best_(std::nan("")) {
  TrainOptions& a = opt_;
  comm_ = a.comm;
  if (!comm_) {
    own_comm_ = single_process_communicator();
    comm_ = own_comm_.get();
  }
  check_train_ranks_agree(*comm_, a);  // first: a check that failed on one rank alone would leave the others waiting
  check_train_options(a, OptionNames::python);
  if (a.sequence_ranks > 1) {
    check(comm_->size() % a.sequence_ranks == 0, "train: ", a.sequence_ranks,
          " ranks per sequence (--sequence-ranks) must divide the ", comm_->size(), " ranks");
    check(!a.reproducible, "train: --reproducible sums whole sequences in a fixed tree; it does not run with the ",
          "sequence split (--sequence-parallel)");
    check(a.dropout == 0, "train: dropout with the sequence split (--sequence-parallel) is not supported (its masks ",
          "are drawn per whole sequence)");
    seq_ranks_ = a.sequence_ranks;
  }
  check(a.batch >= groups(), "train: a batch of ", a.batch, " sequences cannot be split over ", groups(),
        seq_ranks_ > 1 ? " groups of ranks" : " ranks", " (each needs one); use --batch >= ", groups());
  const TaskKind head = task_head(a.task.kind, "train");
  // A pretrained language model reads its own tokens: its tokenizer, when its folder has one.
  TaskOptions to = a.task;
  if (!a.init.empty() && to.kind == "lm" && to.tokenizer.empty() && fs::exists(fs::path(a.init) / "tokenizer.json"))
    to.tokenizer = (fs::path(a.init) / "tokenizer.json").string();
  tokenizer_ = to.tokenizer;
  task_ = make_task(to);
  metric_ = task_->metric();

  // Sequence length: the task's own, the checkpoint's context (capped), or 512.
  int64_t seq = a.seq;
  std::optional<ModelConfig> init_cfg;
  if (!a.init.empty()) init_cfg = read_model_config((fs::path(a.init) / "config.json").string());
  if (seq == 0) {
    if (task_->fixed_length() > 0) seq = task_->fixed_length();
    else if (init_cfg && init_cfg->kind == ModelKind::kwt) seq = init_cfg->num_patches;
    else if (init_cfg && init_cfg->max_positions > 0) seq = std::min<int64_t>(512, init_cfg->max_positions);
    else seq = 512;
  }
  a.seq = seq;
  task_->check_length(seq);
  // --init trains the checkpoint's architecture: the log, train_state.json and the checks below
  // name its sizes, not the fresh-model defaults.
  if (init_cfg) {
    a.layers = init_cfg->layers;
    a.dim = init_cfg->hidden;
    a.heads = init_cfg->heads;
    a.ff = init_cfg->ffn;
  }
  files_->args = run_args(a, seq, tokenizer_);
  // Before anything is allocated: a model's parameters are at least L·(4·dim² + 2·dim·ff) floats
  // (attention and feed-forward weights), each held four times in training (value, gradient, two
  // AdamW moments), so an absurd size is an error, not the kernel's OOM killer. The exact figure
  // (Model::train_bytes) is checked once the model exists.
  check_memory(16.0 * static_cast<double>(a.layers) *
                 (4.0 * static_cast<double>(a.dim) * static_cast<double>(a.dim) + 2.0 * static_cast<double>(a.dim) * static_cast<double>(a.ff)),
             detail::concat("train: a model of ", a.layers, " layers, dim ", a.dim, ", ff ", a.ff,
                            " with its gradients and optimizer state"));

  // Fresh or resumed state.
  Files& f = *files_;
  if (!a.checkpoint.empty()) {
    f.root = a.checkpoint;
    if (lead()) {  // rank 0 owns the folder; the others read it once it is settled
      std::error_code ec;
      fs::create_directories(f.root, ec);
      check(fs::is_directory(f.root), "train: cannot create the checkpoint folder '", f.root.string(), "'");
      // Before anything in the folder is touched: a second run must not remove this one's temporaries.
      f.lock = train::FolderLock(f.root);
      train::recover(f.root, "latest");
      train::recover(f.root, "best");
    }
    comm_->barrier();
    const bool have = fs::exists(f.root / "latest" / "train_state.json");
    check(a.resume || !have, "train: '", f.root.string(),
          "' already holds a run (latest/); pass --resume to continue it, or choose another --checkpoint");
    if (a.resume && have) {
      f.state = train::read_train_state((f.root / "latest" / "train_state.json").string());
      const json& saved = f.state.args;
      std::string diff;
      for (const auto& [k, v] : f.args.items()) {
        // An --init run's sizes are its checkpoint's (runs saved before they were recorded hold
        // the defaults); the loaded model's config is checked against them below.
        if (!a.init.empty() && (k == "layers" || k == "dim" || k == "heads" || k == "ff")) continue;
        if (!saved.contains(k) || saved[k] != v)
          diff += " --" + k + " " + (saved.contains(k) ? saved[k].dump() : "(absent)") + " (now " + v.dump() + ")";
      }
      check(diff.empty(), "train: --resume needs the options of the saved run; they differ:", diff);
      model_ = Model::load((f.root / "latest").string());
      resumed_ = true;
    }
  }
  if (!model_ && !a.init.empty()) {
    check((task_->feature_dim() > 0) == (init_cfg->kind == ModelKind::kwt), "train: the ", task_->name(), " task has ",
          task_->feature_dim() > 0 ? "feature frames" : "tokens", " but the model '", a.init, "' (",
          init_cfg->model_type, ") reads ", init_cfg->kind == ModelKind::kwt ? "feature frames" : "tokens");
    LoadOptions lo;
    lo.head = head;
    lo.num_labels = head == TaskKind::classify ? task_->classes() : 0;
    lo.seed = a.task.seed;
    model_ = Model::load(a.init, lo);
  }
  if (!model_) model_ = Model::create(fresh_config(a, *task_, seq), head, a.task.seed);
  const ModelConfig& c = model_->config();
  // What is trained is what the run's options (and so its log) say: a resumed run whose
  // latest/config.json was swapped for another model's would train that model under this log.
  check(c.layers == a.layers && c.hidden == a.dim && c.heads == a.heads && c.ffn == a.ff, "train: the model (",
        resumed_ ? (f.root / "latest").string() : !a.init.empty() ? a.init : std::string("fresh"), ") has ", c.layers,
        " layers, dim ", c.hidden, ", ", c.heads, " heads, ff ", c.ffn, "; the run's options say ", a.layers,
        " layers, dim ", a.dim, ", ", a.heads, " heads, ff ", a.ff);
  if (task_->feature_dim() > 0) {
    check(c.kind == ModelKind::kwt && c.input_dim == task_->feature_dim() && c.num_patches == seq, "train: the ",
          task_->name(), " task holds frames of ", task_->feature_dim(), " features x ", seq,
          "; the model takes ", c.kind == ModelKind::kwt ? std::to_string(c.input_dim) + " x " + std::to_string(c.num_patches) : "tokens");
  } else {
    check(c.kind != ModelKind::kwt, "train: a KWT model reads feature frames; the ", task_->name(), " task has tokens");
    check(task_->vocab() <= c.vocab, "train: the ", task_->name(), " task has ", task_->vocab(),
          " token ids but the model's vocabulary is ", c.vocab);
    check(seq <= c.max_positions, "train: the sequence length ", seq, " exceeds the model's context (max_position_embeddings ",
          c.max_positions, ")");
  }
  if (head == TaskKind::classify)
    check(task_->classes() <= c.num_labels, "train: the task has ", task_->classes(), " classes; the model's classifier has ",
          c.num_labels);
  model_->set_attention(a.attention);
  model_->set_dropout(static_cast<float>(a.dropout));
  if (seq_ranks_ > 1) {
    seq_comm_ = comm_->split(group(), comm_->rank());
    model_->set_sequence_parallel(seq_comm_.get());
  }
  check(model_->trainable(), "train: the attention plan '", a.attention, "' has a layer without a backward; it can only evaluate");
  check_memory(step_bytes(), detail::concat("train: the model, its optimizer state and the activations of batch ", a.batch,
                                          " x ", seq));

  OptimizerOptions oo;
  oo.lr = static_cast<float>(a.lr);
  oo.min_lr = static_cast<float>(a.min_lr);
  oo.warmup = a.warmup;
  oo.total_steps = a.steps;
  oo.clip = static_cast<float>(a.clip);
  oo.adamw.weight_decay = static_cast<float>(a.weight_decay);
  const int64_t P = static_cast<int64_t>(model_->params().size());
  if (a.reproducible) reducer_ = std::make_unique<train::GradReducer>(*comm_, P, a.batch);
  if (a.shard_optimizer) {
    // Shards of whole nn::sum_squares blocks, as the reducer's (same split).
    const int R = comm_->size(), r = comm_->rank();
    const int64_t nb = nn::sum_squares_blocks(P);
    optim_ = std::make_unique<Optimizer>(*model_, oo, comm_, P * (nb * r / R) / nb, P * (nb * (r + 1) / R) / nb);
  } else {
    optim_ = std::make_unique<Optimizer>(*model_, oo);
  }
  if (resumed_) {
    const train::SavedState& st = f.state;
    optim_->load((f.root / "latest" / "optimizer.safetensors").string());
    step_ = st.step;
    elapsed_ = st.elapsed_s;
    if (st.best_metric) best_ = *st.best_metric;
    best_step_ = st.best_step;
    // best/ is written before latest/ (evaluate()), so after a kill between the two it is the newer
    // one: what it holds is the best so far, whatever latest/ says.
    if (const fs::path bs = f.root / "best" / "train_state.json"; fs::exists(bs)) {
      const train::SavedState b = train::read_train_state(bs.string());
      best_step_ = b.step;
      best_ = b.best_metric ? *b.best_metric : std::numeric_limits<double>::quiet_NaN();
    }
    check(optim_->steps_done() == step_, "train: the optimizer state has ", optim_->steps_done(),
          " steps, train_state.json says ", step_);
    last_eval_ = step_;
  }
  start_ = step_;
  eval_set_ = task_->eval_batches(a.batch, seq, a.eval_examples);
  eval_skipped_ = task_->eval_skipped(seq);
  check(!eval_set_.empty(), "train: no held-out example fits the sequence length ", seq);
  // What each rank loaded, compared once it is loaded (the start-up check hashes options and
  // samples of files): the parameters (an --init folder whose weights differ), the step it starts
  // from (a rank that cannot see latest/ starts from 0 beside a peer that resumes), the data as
  // the task holds it (the held-out set and the first step's batch: files that differ outside the
  // sampled blocks), and under --reproducible the ISA and the GEMM kernel, which change the sums.
  if (comm_->size() > 1) {
    const std::span<float> p = model_->params();
    const auto batch_fp = [](const std::vector<Batch>& bs) {
      std::string s;
      for (const Batch& b : bs)
        s += bytes_fingerprint(b.ids.data(), b.ids.size() * sizeof(int32_t)) + "/" +
             bytes_fingerprint(b.targets.data(), b.targets.size() * sizeof(int32_t)) + "/" +
             bytes_fingerprint(b.features.data(), b.features.size() * sizeof(float)) + ";";
      return s;
    };
    std::vector<std::pair<std::string, std::string>> facts{
        {"step to start from (resumed, or 0)", std::to_string(step_)},
        {"initial parameters", bytes_fingerprint(p.data(), p.size() * sizeof(float))},
        {"held-out data", batch_fp(eval_set_)},
        {"first batch", batch_fp({task_->train_batch(a.batch, seq, static_cast<uint64_t>(step_))})}};
    if (a.reproducible) {
      facts.emplace_back("ISA (--reproducible)", isa_name(active_isa()));
      facts.emplace_back("GEMM kernel (--reproducible)", gemm_backend().kernel);
    }
    clattn::check_ranks_agree(*comm_, "train", facts);
  }
}

Trainer::~Trainer() = default;

double Trainer::step_bytes() const { return model_->train_bytes(opt_.batch, opt_.seq); }

void Trainer::begin() {
  if (begun_) return;
  begun_ = true;
  const TrainOptions& a = opt_;
  if (lead()) {
    // The log never overwrites an input of the run (its data, tokenizer or initial checkpoint).
    std::vector<std::string> inputs = {a.task.data, tokenizer_};
    if (!a.init.empty())
      for (const char* name : {"config.json", "model.safetensors", "tokenizer.json"})
        inputs.push_back((fs::path(a.init) / name).string());
    files_->log = train::Log(a.log, resumed_ || a.resume, inputs);
  }
  json cfg = files_->args;
  cfg["eval_every"] = a.eval_every;
  cfg["eval_examples"] = a.eval_examples;
  cfg["time_budget"] = a.time_budget;
  cfg["threads"] = a.threads;
  cfg["params"] = model_->params().size();
  cfg["vocab"] = task_->vocab();
  cfg["version"] = a.version;
  cfg["commit"] = a.commit;
  cfg["ranks"] = comm_->size();
  cfg["reproducible"] = a.reproducible;
  cfg["accum"] = a.accum;
  cfg["shard_optimizer"] = a.shard_optimizer;
  cfg["overlap"] = a.overlap;
  cfg["sequence_ranks"] = seq_ranks_;
  files_->log.write({{"config", cfg}, {"attention", a.attention}, {"resume_step", step_}});
}

namespace {

// The barrier after rank 0's checkpoint write. Writing is progress, not a stall: the MPI watchdog
// times blocking waits (a multi-GB write on slow storage outlasted its 300 s, and with
// --comm-timeout 1 it fired mid-write and left .tmp-best), so the ranks meet in a non-blocking
// reduction polled with test(), which it does not time. A rank 0 that dies mid-write still ends
// the job through the launcher.
void wait_for_checkpoint(Communicator& comm) {
  float token = 0.f;
  const std::unique_ptr<CommRequest> req = comm.iall_reduce_sum(&token, 1);
  while (!req->test()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

}  // namespace

void Trainer::checkpoint(const std::string& name, const char* why) {
  if (opt_.checkpoint.empty()) return;
  // Every rank is at this step (the evaluation before was collective); the sharded optimizer
  // gathers its moments, and rank 0 alone writes.
  if (!lead()) {
    if (opt_.shard_optimizer) optim_->save("");
    wait_for_checkpoint(*comm_);
    return;
  }
  json st = {{"step", step_}, {"elapsed_s", elapsed_}, {"best_step", best_step_}, {"seed", opt_.task.seed},
             {"best_metric", std::isnan(best_) ? json(nullptr) : json(best_)}, {"metric", metric_},
             {"args", files_->args}};
  if (name == "latest") st["saved_because"] = why;
  train::write_checkpoint(files_->root, name, [&](const fs::path& tmp) {
    model_->save(tmp.string());
    optim_->save((tmp / "optimizer.safetensors").string());
    write_tokenizer(tmp.string());
    write_file_atomic((tmp / "train_state.json").string(), st.dump(2) + "\n");
  });
  wait_for_checkpoint(*comm_);
}

void Trainer::write_tokenizer(const std::string& dir) const {
  if (!tokenizer_.empty()) {
    copy_tokenizer(tokenizer_, dir);
  } else if (task_->kind() != TaskKind::classify) {
    // Byte-level text (mlm, lm): the tokenizer of ids = bytes, so generate, approx --text and the
    // Python API read the checkpoint as they read any Hugging Face model.
    write_file_atomic((fs::path(dir) / "tokenizer.json").string(), Tokenizer::byte_tokenizer_json());
  }
}

void Trainer::save_model(const std::string& dir) const {
  model_->save(dir);
  write_tokenizer(dir);
}

namespace {

// Targets a batch's loss counts: the divisor of its mean loss, known before any forward.
int64_t counted_targets(const Batch& b) {
  int64_t n = 0;
  for (int32_t t : b.targets) n += t >= 0;
  return n;
}

}  // namespace

StepResult Trainer::reproducible_gradient(const Batch& batch, double& comm_ms) {
  train::GradReducer& red = *reducer_;
  Model& m = *model_;
  std::span<float> g = m.grads();
  const int64_t P = static_cast<int64_t>(g.size()), G = batch.B;
  // Per sequence: loss sum, targets, correct (zero where another rank computes it: exact sums).
  std::vector<double> per(static_cast<size_t>(3 * G), 0.0);
  StepResult mine;
  int64_t sent = 0;
  // The step's mean divides the summed gradient by the targets of the whole batch, known before
  // any forward: each bucket is scaled as soon as it is summed.
  const int64_t counted = counted_targets(batch);
  red.target(g.data(), counted > 0 ? static_cast<float>(1.0 / static_cast<double>(counted)) : 0.f, !opt_.shard_optimizer);
  for (int64_t u = red.lo(); u < red.hi(); ++u) {
    const Batch one = batch_slice(batch, u, 1);
    m.zero_grads();
    const bool last = u + 1 == red.hi();
    if (last && opt_.overlap)  // the exchange of each layer starts as soon as its backward is done
      m.on_grads_ready = [&](int64_t lo, int64_t hi) {
        red.add(u, g.data(), lo, hi);
        red.send(lo, hi);
        red.progress();
        sent += hi - lo;
      };
    // The gradient of the sequence's summed loss; the step's mean divides once, after the sum.
    const StepResult r = m.forward_backward(one, true, static_cast<uint64_t>(step_), 1.0);
    m.on_grads_ready = nullptr;
    if (!last || !opt_.overlap) {
      red.add(u, g.data(), 0, P);
      red.progress();
    }
    if (last && !opt_.overlap) {
      red.send(0, P);
      sent = P;
    }
    per[static_cast<size_t>(3 * u)] = r.loss_sum;
    per[static_cast<size_t>(3 * u + 1)] = static_cast<double>(r.counted);
    per[static_cast<size_t>(3 * u + 2)] = static_cast<double>(r.correct);
    mine.attention_ms += r.attention_ms;
    mine.dense_ms += r.dense_ms;
    mine.total_ms += r.total_ms;
  }
  check(sent == P, "train: internal: the backward reported ", sent, " of ", P, " gradients");
  comm_ms = red.finish();
  const auto t0 = Clock::now();
  comm_->all_reduce_sum(per.data(), per.size());
  StepResult all = mine;
  all.loss_sum = 0;
  for (int64_t u = 0; u < G; ++u) {
    all.loss_sum += per[static_cast<size_t>(3 * u)];
    all.counted += static_cast<int64_t>(per[static_cast<size_t>(3 * u + 1)]);
    all.correct += static_cast<int64_t>(per[static_cast<size_t>(3 * u + 2)]);
  }
  check(all.counted == counted, "train: internal: the ranks counted ", all.counted, " targets, the batch holds ", counted);
  comm_ms += seconds_since(t0) * 1e3;
  return all;
}

StepResult Trainer::micro_batch_gradient(const Batch& batch, double& comm_ms) {
  Model& m = *model_;
  std::span<float> g = m.grads();
  const int R = comm_->size(), G = groups(), gi = group();
  // This rank's group's share of the batch (with the sequence split, every rank of the group runs
  // it on its own positions).
  const int64_t lo = batch.B * gi / G, hi = batch.B * (gi + 1) / G, K = std::min<int64_t>(opt_.accum, hi - lo);
  const double divisor = static_cast<double>(std::max<int64_t>(1, counted_targets(batch)));
  m.zero_grads();
  StepResult mine;
  std::vector<std::unique_ptr<CommRequest>> reqs;
  for (int64_t k = 0; k < K; ++k) {
    const int64_t a = lo + (hi - lo) * k / K, b = lo + (hi - lo) * (k + 1) / K;
    const bool last = k + 1 == K;
    if (last && R > 1 && opt_.overlap)  // all-reduce each layer's gradient while the backward goes on
      m.on_grads_ready = [&](int64_t p0, int64_t p1) {
        reqs.push_back(comm_->iall_reduce_sum(g.data() + p0, static_cast<size_t>(p1 - p0)));
        for (auto& q : reqs) (void)q->test();
      };
    const StepResult s = m.forward_backward(batch_slice(batch, a, b - a), true, static_cast<uint64_t>(step_), divisor);
    m.on_grads_ready = nullptr;
    mine.loss_sum += s.loss_sum;
    mine.counted += s.counted;
    mine.correct += s.correct;
    mine.attention_ms += s.attention_ms;
    mine.dense_ms += s.dense_ms;
    mine.total_ms += s.total_ms;
  }
  const auto t0 = Clock::now();
  if (R > 1 && !opt_.overlap) reqs.push_back(comm_->iall_reduce_sum(g.data(), g.size()));
  for (auto& q : reqs) q->wait();
  double sums[3] = {mine.loss_sum, static_cast<double>(mine.counted), static_cast<double>(mine.correct)};
  comm_->all_reduce_sum(sums, 3);
  comm_ms = seconds_since(t0) * 1e3;
  StepResult all = mine;
  all.loss_sum = sums[0];
  all.counted = static_cast<int64_t>(sums[1]);
  all.correct = static_cast<int64_t>(sums[2]);
  return all;
}

StepReport Trainer::step() {
  begin();
  check(step_ < opt_.steps, "train: all ", opt_.steps, " steps are done");
  const auto t0 = Clock::now();
  // Every rank draws the whole batch (a pure function of the seed and the step) and takes its share.
  const Batch batch = task_->train_batch(opt_.batch, opt_.seq, static_cast<uint64_t>(step_));
  StepReport r;
  // A diverged run shows as values no float holds: a forward or backward that refuses them
  // (NumericError), a non-finite loss, gradient norm or parameter. Each stops the run here, before
  // the step is logged or any checkpoint written, with the same words.
  const int64_t at = step_ + 1;
  try {
    r.detail = opt_.reproducible ? reproducible_gradient(batch, r.comm_ms) : micro_batch_gradient(batch, r.comm_ms);
  } catch (const NumericError& e) {
    diverged(at, e.what());
  }
  const double loss = r.detail.counted ? r.detail.loss_sum / static_cast<double>(r.detail.counted) : 0;
  if (!std::isfinite(loss)) diverged(at, "the loss is not finite");
  float lr = 0;
  r.grad_norm = optim_->step(&lr);
  if (!std::isfinite(r.grad_norm)) diverged(at, "the gradient norm is not finite");
  if (opt_.shard_optimizer) {
    // Each rank updated its shard: gather the parameters.
    const auto tg = Clock::now();
    const int R = comm_->size();
    const std::span<float> p = model_->params();
    const int64_t P = static_cast<int64_t>(p.size()), nb = nn::sum_squares_blocks(P);
    std::vector<size_t> counts, displs;
    for (int j = 0; j < R; ++j) {
      const int64_t s = P * (nb * j / R) / nb, e = P * (nb * (j + 1) / R) / nb;
      counts.push_back(sizeof(float) * static_cast<size_t>(e - s));
      displs.push_back(sizeof(float) * static_cast<size_t>(s));
    }
    const int64_t s = P * (nb * comm_->rank() / R) / nb, e = P * (nb * (comm_->rank() + 1) / R) / nb;
    const std::vector<float> mine(p.begin() + s, p.begin() + e);
    comm_->iall_gatherv(mine.data(), sizeof(float) * mine.size(), p.data(), counts, displs)->wait();
    r.comm_ms += seconds_since(tg) * 1e3;
  }
  if (!all_finite(model_->params())) diverged(at, "a parameter is not finite after the update");
  r.ms = seconds_since(t0) * 1e3;
  // Rank 0's clock decides the time budget, so every rank stops at the same step; one maximum
  // carries it and the least wait.
  double both[2] = {comm_->rank() == 0 ? elapsed_ + r.ms / 1e3 : -HUGE_VAL, -r.comm_ms};
  comm_->all_reduce_max(both, 2);
  elapsed_ = both[0];
  r.comm_exposed_ms = -both[1];
  ++step_;
  r.step = step_;
  r.lr = lr;
  r.loss = loss;
  r.tokens_per_s = static_cast<double>(opt_.batch * opt_.seq) / (r.ms / 1e3);
  files_->log.write({{"step", step_}, {"loss", r.loss}, {"lr", lr}, {"ms", r.ms}, {"tokens_per_s", r.tokens_per_s},
                     {"grad_norm", r.grad_norm}, {"comm_ms", r.comm_ms}, {"comm_exposed_ms", r.comm_exposed_ms}});
  if (on_step) on_step(r);
  return r;
}

EvalReport Trainer::evaluate() {
  begin();
  EvalReport r;
  r.step = step_;
  try {
    r.result = clattn::evaluate(*model_, eval_set_, task_->kind() == TaskKind::classify, *comm_, seq_ranks_);
  } catch (const NumericError& e) {
    diverged(step_, e.what());
  }
  if (!std::isfinite(r.result.loss)) diverged(step_, "the evaluation loss is not finite");
  last_eval_ = step_;
  const bool accuracy = task_->kind() == TaskKind::classify;
  r.improved = std::isnan(best_) || (accuracy ? r.result.metric > best_ : r.result.metric < best_);
  if (r.improved) {
    best_ = r.result.metric;
    best_step_ = step_;
  }
  files_->log.write({{"step", step_}, {"eval_loss", r.result.loss}, {"eval_metric", r.result.metric}, {"metric", metric_},
                     {"elapsed_s", elapsed_}, {"attention", opt_.attention}, {"examples", r.result.examples}});
  if (on_eval) on_eval(r);
  // best/ first: a kill between the two writes leaves best/ newer than latest/, and a resume reads
  // the best from best/ itself, so the pair never names a best step that best/ does not hold.
  if (r.improved) checkpoint("best", "eval");
  checkpoint("latest", "eval");
  return r;
}

std::string Trainer::run() {
  begin();
  std::string stop = "steps";
  while (step_ < opt_.steps) {
    if (time_budget_spent()) {
      stop = "time_budget";
      break;
    }
    step();
    if (step_ % opt_.eval_every == 0) evaluate();
  }
  if (last_eval_ != step_) evaluate();
  files_->log.write({{"end", stop}, {"step", step_}, {"elapsed_s", elapsed_}});
  return stop;
}

}  // namespace clattn
