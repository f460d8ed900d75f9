// The training loop (train.h): a run's model, task, optimizer, evaluation, checkpoints, log.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "clattn/atomic_file.h"
#include "clattn/error.h"
#include "clattn/train.h"
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

TaskKind head_of(const std::string& task) {
  if (task == "listops" || task == "features") return TaskKind::classify;
  if (task == "mlm") return TaskKind::mlm;
  if (task == "lm") return TaskKind::lm;
  fail("train: unknown task '", task, "' (expected listops, mlm, lm or features)");
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
  // Absent for fresh byte-level runs, so their saved options read as before.
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
    if (!fs::exists(from)) continue;
    std::ifstream in(from, std::ios::binary);
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    check(!in.bad(), "train: cannot read '", from.string(), "'");
    write_file_atomic((dir / f).string(), s);
  }
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

class Trainer::Files {
 public:
  fs::path root;
  json args, state;
  train::Log log;
};

Trainer::Trainer(TrainOptions opt) : opt_(std::move(opt)), files_(std::make_unique<Files>()), best_(std::nan("")) {
  TrainOptions& a = opt_;
  check(!a.resume || !a.checkpoint.empty(), "train: resume needs a checkpoint folder");
  check(a.batch >= 1 && a.steps >= 1 && a.warmup >= 0 && a.eval_every >= 1 && a.eval_examples >= 0 && a.seq >= 0,
        "train: batch, steps and eval_every must be >= 1, warmup, eval_examples and seq >= 0");
  if (a.min_lr < 0) a.min_lr = a.lr / 10;
  if (a.ff <= 0) a.ff = 2 * a.dim;
  const TaskKind head = head_of(a.task.kind);
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
  files_->args = run_args(a, seq, tokenizer_);

  // Fresh or resumed state.
  Files& f = *files_;
  if (!a.checkpoint.empty()) {
    f.root = a.checkpoint;
    std::error_code ec;
    fs::create_directories(f.root, ec);
    check(fs::is_directory(f.root), "train: cannot create the checkpoint folder '", f.root.string(), "'");
    train::recover(f.root, "latest");
    train::recover(f.root, "best");
    const bool have = fs::exists(f.root / "latest" / "train_state.json");
    check(a.resume || !have, "train: '", f.root.string(),
          "' already holds a run (latest/); pass --resume to continue it, or choose another --checkpoint");
    if (a.resume && have) {
      std::ifstream in(f.root / "latest" / "train_state.json");
      f.state = json::parse(in, nullptr, false);
      check(f.state.is_object() && f.state.contains("step") && f.state.contains("args"), "train: '",
            (f.root / "latest" / "train_state.json").string(), "' is not a train state");
      std::string diff;
      for (const auto& [k, v] : f.args.items())
        if (!f.state["args"].contains(k) || f.state["args"][k] != v)
          diff += " --" + k + " " + (f.state["args"].contains(k) ? f.state["args"][k].dump() : "(absent)") + " (now " + v.dump() + ")";
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
  check(model_->trainable(), "train: the attention plan '", a.attention, "' has a layer without a backward; it can only evaluate");

  OptimizerOptions oo;
  oo.lr = static_cast<float>(a.lr);
  oo.min_lr = static_cast<float>(a.min_lr);
  oo.warmup = a.warmup;
  oo.total_steps = a.steps;
  oo.clip = static_cast<float>(a.clip);
  oo.adamw.weight_decay = static_cast<float>(a.weight_decay);
  optim_ = std::make_unique<Optimizer>(*model_, oo);
  if (resumed_) {
    const json& st = f.state;
    optim_->load((f.root / "latest" / "optimizer.safetensors").string());
    step_ = st["step"].get<int64_t>();
    elapsed_ = st.value("elapsed_s", 0.0);
    if (st.contains("best_metric") && st["best_metric"].is_number()) best_ = st["best_metric"].get<double>();
    best_step_ = st.value("best_step", int64_t{-1});
    check(optim_->steps_done() == step_, "train: the optimizer state has ", optim_->steps_done(),
          " steps, train_state.json says ", step_);
    last_eval_ = step_;
  }
  start_ = step_;
  eval_set_ = task_->eval_batches(a.batch, seq, a.eval_examples);
  eval_skipped_ = task_->eval_skipped(seq);
  check(!eval_set_.empty(), "train: no held-out example fits the sequence length ", seq);
}

Trainer::~Trainer() = default;

double Trainer::step_bytes() const { return model_->train_bytes(opt_.batch, opt_.seq); }

void Trainer::begin() {
  if (begun_) return;
  begun_ = true;
  const TrainOptions& a = opt_;
  files_->log = train::Log(a.log, resumed_ || a.resume);
  json cfg = files_->args;
  cfg["eval_every"] = a.eval_every;
  cfg["eval_examples"] = a.eval_examples;
  cfg["time_budget"] = a.time_budget;
  cfg["threads"] = a.threads;
  cfg["params"] = model_->params().size();
  cfg["vocab"] = task_->vocab();
  cfg["version"] = a.version;
  cfg["commit"] = a.commit;
  files_->log.write({{"config", cfg}, {"attention", a.attention}, {"resume_step", step_}});
}

void Trainer::checkpoint(const std::string& name, const char* why) {
  if (opt_.checkpoint.empty()) return;
  json st = {{"step", step_}, {"elapsed_s", elapsed_}, {"best_step", best_step_}, {"seed", opt_.task.seed},
             {"best_metric", std::isnan(best_) ? json(nullptr) : json(best_)}, {"metric", metric_},
             {"args", files_->args}};
  if (name == "latest") st["saved_because"] = why;
  train::write_checkpoint(files_->root, name, [&](const fs::path& tmp) {
    model_->save(tmp.string());
    optim_->save((tmp / "optimizer.safetensors").string());
    copy_tokenizer(tokenizer_, tmp);
    write_file_atomic((tmp / "train_state.json").string(), st.dump(2) + "\n");
  });
}

StepReport Trainer::step() {
  begin();
  check(step_ < opt_.steps, "train: all ", opt_.steps, " steps are done");
  const auto t0 = Clock::now();
  const Batch batch = task_->train_batch(opt_.batch, opt_.seq, static_cast<uint64_t>(step_));
  model_->zero_grads();
  StepReport r;
  r.detail = model_->forward_backward(batch, true, static_cast<uint64_t>(step_));
  float lr = 0;
  r.grad_norm = optim_->step(&lr);
  r.ms = seconds_since(t0) * 1e3;
  elapsed_ += r.ms / 1e3;
  ++step_;
  r.step = step_;
  r.lr = lr;
  r.loss = r.detail.counted ? r.detail.loss_sum / static_cast<double>(r.detail.counted) : 0;
  r.tokens_per_s = static_cast<double>(opt_.batch * opt_.seq) / (r.ms / 1e3);
  check(std::isfinite(r.loss), "train: the loss is not finite at step ", step_, " (try a lower --lr)");
  files_->log.write({{"step", step_}, {"loss", r.loss}, {"lr", lr}, {"ms", r.ms}, {"tokens_per_s", r.tokens_per_s},
                     {"grad_norm", r.grad_norm}});
  if (on_step) on_step(r);
  return r;
}

EvalReport Trainer::evaluate() {
  begin();
  EvalReport r;
  r.step = step_;
  r.result = clattn::evaluate(*model_, eval_set_, task_->kind() == TaskKind::classify);
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
  checkpoint("latest", "eval");
  if (r.improved) checkpoint("best", "eval");
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
