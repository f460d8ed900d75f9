// `clattn train`: train a transformer on a task (include/clattn/data.h) with any attention plan,
// with periodic held-out evaluation, checkpoints and exact resumption.
// `clattn eval`: evaluate a checkpoint with any attention plans (train with one, evaluate with
// another: the paper's Table 1).
//
// Models: listops -> pre-LN BERT encoder + classify head (mean over valid tokens); mlm -> BERT +
// tied output layer; lm -> LLaMA decoder (heads of dim/heads, no grouping) + lm head. Sizes from
// --layers --dim --heads --ff; max positions = --seq.
//
// Checkpoint folder DIR: DIR/latest/ (model.safetensors + config.json in Hugging Face naming,
// optimizer.safetensors, train_state.json) written at every evaluation and at the end; DIR/best/
// the same when the held-out metric improved. A checkpoint is written whole into DIR/.tmp-NAME/
// and swapped in by two renames (NAME -> .old-NAME, .tmp-NAME -> NAME; a run killed between them
// is recovered from .old-NAME), so a SIGKILL at any moment leaves a complete checkpoint.
//
// Exact resumption: the batch of step s is a pure function of (task, seed, s); forward_backward
// draws from step s; the optimizer's m, v and t and the attention layer state are restored bit
// for bit; so `--resume` from DIR/latest repeats the uninterrupted run's losses exactly (at the
// same thread count). The options that define the run must equal the saved ones (checked).
//
// Log (--log FILE, JSON lines, appended to on --resume): a header {"config": {...}, "attention",
// "resume_step"}; per step {"step", "loss", "lr", "ms", "tokens_per_s", "grad_norm"} (step = steps
// done, loss in nats per target); per evaluation {"step", "eval_loss", "eval_metric", "metric",
// "elapsed_s", "attention"} (metric: accuracy for listops, bits per character for mlm / lm);
// and {"end", "step", "elapsed_s"} when the run stops. elapsed_s counts training time only
// (steps, not evaluations or checkpoints), carried across resumptions; --time-budget compares it.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "clattn/atomic_file.h"
#include "clattn/attention.h"
#include "clattn/data.h"
#include "clattn/error.h"
#include "clattn/model.h"
#include "clattn/parallel.h"
#include "clattn/train.h"
#include "commands.h"
#include "version.h"

namespace clattn::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct TrainArgs {
  std::string task, data, attention = "full", checkpoint, log;
  int64_t layers = 2, dim = 128, heads = 2, ff = 0, seq = 512, batch = 8, steps = 1000;
  int64_t warmup = 100, eval_every = 100, eval_examples = 256;
  int64_t min_length = 500, max_length = 2000;
  // Doubles, so the logged options read as typed (0.001, not 0.0010000000474974513).
  double lr = 1e-3, min_lr = -1, clip = 1, weight_decay = 0.01, dropout = 0, mask_prob = 0.15;
  double time_budget = 0;
  uint64_t seed = 0;
  int threads = 0;
  bool resume = false;
};

TaskKind head_of(const std::string& task) {
  if (task == "listops") return TaskKind::classify;
  if (task == "mlm") return TaskKind::mlm;
  if (task == "lm") return TaskKind::lm;
  usage_fail("unknown task '", task, "' (expected listops, mlm or lm)");
}

std::string metric_name(TaskKind k) { return k == TaskKind::classify ? "accuracy" : "bits_per_char"; }
bool better(TaskKind k, double a, double b) { return k == TaskKind::classify ? a > b : a < b; }

// The options that determine the training trajectory: a resumed run must repeat them.
json run_args(const TrainArgs& a) {
  std::string data = a.data;
  if (!data.empty()) {
    std::error_code ec;
    const fs::path p = fs::weakly_canonical(data, ec);
    if (!ec) data = p.string();
  }
  return {{"task", a.task},       {"data", data},         {"attention", a.attention}, {"layers", a.layers},
          {"dim", a.dim},         {"heads", a.heads},     {"ff", a.ff},               {"seq", a.seq},
          {"batch", a.batch},     {"steps", a.steps},     {"lr", a.lr},               {"min_lr", a.min_lr},
          {"warmup", a.warmup},   {"clip", a.clip},       {"weight_decay", a.weight_decay},
          {"dropout", a.dropout}, {"seed", a.seed},       {"min_length", a.min_length},
          {"max_length", a.max_length}, {"mask_prob", a.mask_prob}};
}

TaskOptions task_options(const std::string& task, const std::string& data, uint64_t seed, int64_t min_length,
                         int64_t max_length, double mask_prob) {
  TaskOptions t;
  t.kind = task;
  t.data = data;
  t.seed = seed;
  t.min_length = min_length;
  t.max_length = max_length;
  t.mask_prob = static_cast<float>(mask_prob);
  return t;
}

ModelConfig model_config(const TrainArgs& a, const Task& task) {
  ModelConfig c;
  c.layers = a.layers;
  c.hidden = a.dim;
  c.heads = a.heads;
  c.ffn = a.ff;
  c.vocab = task.vocab();
  c.max_positions = a.seq;
  c.eps = 1e-5f;
  if (task.kind() == TaskKind::lm) {
    c.kind = ModelKind::llama;
    c.model_type = "llama";
    c.kv_heads = a.heads;
    c.head_dim = a.dim / a.heads;
    c.tie_embeddings = true;
  } else {
    c.kind = ModelKind::bert;
    c.model_type = "bert";
    c.pre_ln = true;
    c.final_layer_norm = true;
    if (task.kind() == TaskKind::classify) c.num_labels = task.classes();
  }
  return c;
}

// A rough upper estimate of what training allocates beyond the parameters' four copies
// (weights, gradients, two moments): every layer's saved activations, the logits and their
// gradient, and the attention's stated training workspace.
double training_bytes(const ModelConfig& c, int64_t params, const std::string& plan, int64_t B, int64_t T) {
  const double tokens = static_cast<double>(B) * static_cast<double>(T);
  const double per_layer = 16.0 * static_cast<double>(c.hidden) + 4.0 * static_cast<double>(c.ffn);
  double bytes = 16.0 * static_cast<double>(params) +
                 4.0 * tokens * (static_cast<double>(c.layers) * per_layer + 3.0 * static_cast<double>(c.vocab));
  size_t ws = 0;
  const int64_t hd = c.hidden / c.heads;
  for (const std::string& spec : parse_attention_plan(plan, c.layers)) {
    const AttentionDims d{B, c.heads, c.heads, T, T, hd, hd};
    ws = std::max(ws, make_attention(spec)->workspace_bytes(d, Mode::training, max_threads()));
  }
  return bytes + static_cast<double>(ws);
}

struct EvalResult {
  double loss = 0, metric = 0;
  int64_t examples = 0, counted = 0;
  double ms = 0;
};

// Mean loss per target (nats) and the metric over the held-out batches. Draws from a fixed step,
// so the same parameters always give the same figures.
EvalResult evaluate(TrainModel& model, const std::vector<Batch>& batches) {
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
  e.counted = counted;
  e.loss = counted ? loss / static_cast<double>(counted) : 0;
  e.metric = model.head() == TaskKind::classify ? (counted ? static_cast<double>(correct) / static_cast<double>(counted) : 0)
                                                : e.loss / std::log(2.0);
  e.ms = seconds_since(t0) * 1e3;
  return e;
}

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    (void)::fsync(fd);
    ::close(fd);
  }
}

// A checkpoint folder NAME of root whose .tmp-/.old- leftovers from a killed run are settled:
// a lone .old-NAME (killed between the two renames) becomes NAME again; a .tmp-NAME is dropped.
void recover(const fs::path& root, const std::string& name) {
  const fs::path cur = root / name, old = root / (".old-" + name), tmp = root / (".tmp-" + name);
  std::error_code ec;
  if (!fs::exists(cur) && fs::exists(old)) fs::rename(old, cur);
  fs::remove_all(old, ec);
  fs::remove_all(tmp, ec);
}

void save_checkpoint(const fs::path& root, const std::string& name, const TrainModel& model, const Optimizer& opt,
                     const json& state) {
  const fs::path cur = root / name, old = root / (".old-" + name), tmp = root / (".tmp-" + name);
  std::error_code ec;
  fs::remove_all(tmp, ec);
  model.save(tmp.string());
  opt.save((tmp / "optimizer.safetensors").string());
  write_file_atomic((tmp / "train_state.json").string(), state.dump(2) + "\n");
  fs::remove_all(old, ec);
  if (fs::exists(cur)) fs::rename(cur, old);
  fs::rename(tmp, cur);
  fsync_dir(root);
  fs::remove_all(old, ec);
}

// JSON lines, each flushed whole so a killed run leaves only complete lines.
class Log {
 public:
  Log(const std::string& path, bool append) {
    if (path.empty()) return;
    f_ = std::fopen(path.c_str(), append ? "a" : "w");
    check(f_ != nullptr, "train: cannot open the log '", path, "' for writing");
  }
  ~Log() {
    if (f_) std::fclose(f_);
  }
  void write(const json& j) {
    if (!f_) return;
    const std::string s = j.dump() + "\n";
    std::fwrite(s.data(), 1, s.size(), f_);
    std::fflush(f_);
  }

 private:
  std::FILE* f_ = nullptr;
};

std::string duration(double s) {
  char buf[32];
  if (s < 60) std::snprintf(buf, sizeof buf, "%.0fs", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  else std::snprintf(buf, sizeof buf, "%dh%02dm", static_cast<int>(s) / 3600, static_cast<int>(s) / 60 % 60);
  return buf;
}

void check_train_args(TrainArgs& a) {
  (void)head_of(a.task);
  usage_check(!a.checkpoint.empty() || !a.resume, "train: --resume needs --checkpoint DIR");
  check_size(a.layers, 1, 1024, "train: --layers");
  check_size(a.dim, 1, 1 << 16, "train: --dim");
  check_size(a.heads, 1, a.dim, "train: --heads");
  usage_check(a.dim % a.heads == 0, "train: --dim (", a.dim, ") must be a multiple of --heads (", a.heads, ")");
  if (a.ff == 0) a.ff = 2 * a.dim;
  check_size(a.ff, 1, 1 << 20, "train: --ff");
  check_size(a.seq, 1, kMaxCount, "train: --seq");
  check_size(a.batch, 1, 1 << 20, "train: --batch");
  check_size(a.steps, 1, kMaxCount, "train: --steps");
  check_size(a.warmup, 0, kMaxCount, "train: --warmup");
  check_size(a.eval_every, 1, kMaxCount, "train: --eval-every");
  check_size(a.eval_examples, 0, kMaxCount, "train: --eval-examples (0: the whole held-out set)");
  check_elements({a.batch, a.seq, std::max(a.dim, a.ff)}, "train: activations (batch, seq, max(dim, ff))");
  usage_check(a.lr > 0 && std::isfinite(a.lr), "train: --lr must be > 0, got ", a.lr);
  if (a.min_lr < 0) a.min_lr = a.lr / 10;
  usage_check(a.min_lr <= a.lr && std::isfinite(a.min_lr), "train: --min-lr must be in [0, --lr], got ", a.min_lr);
  usage_check(a.clip >= 0 && std::isfinite(a.clip), "train: --clip must be >= 0 (0: off), got ", a.clip);
  usage_check(a.weight_decay >= 0 && std::isfinite(a.weight_decay), "train: --weight-decay must be >= 0, got ", a.weight_decay);
  usage_check(a.dropout >= 0 && a.dropout < 1, "train: --dropout must be in [0, 1), got ", a.dropout);
  usage_check(a.mask_prob > 0 && a.mask_prob <= 1, "train: --mask-prob must be in (0, 1], got ", a.mask_prob);
  usage_check(a.time_budget >= 0 && std::isfinite(a.time_budget), "train: --time-budget must be >= 0 seconds, got ",
              a.time_budget);
  usage_check(a.min_length >= 1 && a.min_length <= a.max_length,
              "train: listops lengths need 1 <= --min-length <= --max-length, got ", a.min_length, " and ", a.max_length);
  usage_check(a.task != "mlm" && a.task != "lm" ? true : !a.data.empty(), "train: --task ", a.task,
              " needs --data TEXTFILE");
}

void run_train(TrainArgs a) {
  check_train_args(a);
  const int threads = checked_threads(a.threads, "train");
  set_threads(threads);
  const TaskKind head = head_of(a.task);
  const std::unique_ptr<Task> task =
      make_task(task_options(a.task, a.data, a.seed, a.min_length, a.max_length, a.mask_prob));
  task->check_length(a.seq);
  const json args = run_args(a);

  // Fresh or resumed state.
  const fs::path root = a.checkpoint;
  std::unique_ptr<TrainModel> model;
  json state;
  if (!a.checkpoint.empty()) {
    std::error_code ec;
    fs::create_directories(root, ec);
    check(fs::is_directory(root), "train: cannot create the checkpoint folder '", root.string(), "'");
    recover(root, "latest");
    recover(root, "best");
    const bool have = fs::exists(root / "latest" / "train_state.json");
    check(a.resume || !have, "train: '", root.string(),
          "' already holds a run (latest/); pass --resume to continue it, or choose another --checkpoint");
    if (a.resume && !have)
      std::fprintf(stderr, "train: no checkpoint in %s yet; starting from step 0\n", (root / "latest").c_str());
    if (a.resume && have) {
      std::ifstream in(root / "latest" / "train_state.json");
      state = json::parse(in, nullptr, false);
      check(state.is_object() && state.contains("step") && state.contains("args"), "train: '",
            (root / "latest" / "train_state.json").string(), "' is not a train state");
      std::string diff;
      for (const auto& [k, v] : args.items())
        if (!state["args"].contains(k) || state["args"][k] != v)
          diff += " --" + k + " " + (state["args"].contains(k) ? state["args"][k].dump() : "(absent)") + " (now " + v.dump() + ")";
      check(diff.empty(), "train: --resume needs the options of the saved run; they differ:", diff);
      model = TrainModel::load((root / "latest").string());
    }
  }
  const bool resumed = model != nullptr;
  if (!model) model = TrainModel::create(model_config(a, *task), head, a.seed);
  model->set_attention(a.attention);
  model->set_dropout(static_cast<float>(a.dropout));
  OptimizerOptions oo;
  oo.lr = static_cast<float>(a.lr);
  oo.min_lr = static_cast<float>(a.min_lr);
  oo.warmup = a.warmup;
  oo.total_steps = a.steps;
  oo.clip = static_cast<float>(a.clip);
  oo.adamw.weight_decay = static_cast<float>(a.weight_decay);
  Optimizer opt(*model, oo);
  int64_t step = 0;
  double elapsed = 0, best = std::nan("");
  int64_t best_step = -1;
  if (resumed) {
    opt.load((root / "latest" / "optimizer.safetensors").string());
    step = state["step"].get<int64_t>();
    elapsed = state.value("elapsed_s", 0.0);
    if (state.contains("best_metric") && state["best_metric"].is_number()) best = state["best_metric"].get<double>();
    best_step = state.value("best_step", int64_t{-1});
    check(opt.steps_done() == step, "train: the optimizer state has ", opt.steps_done(), " steps, train_state.json says ", step);
  }
  check_memory(training_bytes(model->config(), static_cast<int64_t>(model->params().size()), a.attention, a.batch, a.seq),
               "train: the model, its optimizer state and the activations of batch " + std::to_string(a.batch) +
                   " x " + std::to_string(a.seq));
  const std::vector<Batch> eval_set = task->eval_batches(a.batch, a.seq, a.eval_examples);
  if (const int64_t skipped = task->eval_skipped(a.seq))
    std::fprintf(stderr, "train: %lld held-out examples longer than --seq %lld are left out of evaluation\n",
                 static_cast<long long>(skipped), static_cast<long long>(a.seq));
  check(!eval_set.empty(), "train: no held-out example fits --seq ", a.seq);

  Log log(a.log, resumed || a.resume);
  json cfg = args;
  cfg["eval_every"] = a.eval_every;
  cfg["eval_examples"] = a.eval_examples;
  cfg["time_budget"] = a.time_budget;
  cfg["threads"] = threads;
  cfg["params"] = model->params().size();
  cfg["vocab"] = task->vocab();
  cfg["version"] = CLATTN_VERSION;
  cfg["commit"] = CLATTN_COMMIT;
  log.write({{"config", cfg}, {"attention", a.attention}, {"resume_step", step}});
  std::fprintf(stderr, "train: %s, %s, %lld layers, dim %lld, %lld heads, ff %lld, %zu parameters, batch %lld x %lld%s\n",
               a.task.c_str(), a.attention.c_str(), static_cast<long long>(a.layers), static_cast<long long>(a.dim),
               static_cast<long long>(a.heads), static_cast<long long>(a.ff), model->params().size(),
               static_cast<long long>(a.batch), static_cast<long long>(a.seq),
               resumed ? (", resumed at step " + std::to_string(step)).c_str() : "");

  const bool tty = ::isatty(STDERR_FILENO) != 0;
  const std::string metric = metric_name(head);
  auto checkpoint = [&](const char* why) {
    if (a.checkpoint.empty()) return;
    json st = {{"step", step}, {"elapsed_s", elapsed}, {"best_step", best_step}, {"seed", a.seed},
               {"best_metric", std::isnan(best) ? json(nullptr) : json(best)}, {"metric", metric},
               {"args", args}, {"saved_because", why}};
    save_checkpoint(root, "latest", *model, opt, st);
  };
  int64_t last_eval = resumed ? step : -1;
  auto run_eval = [&] {
    const EvalResult e = evaluate(*model, eval_set);
    last_eval = step;
    const bool improved = std::isnan(best) || better(head, e.metric, best);
    if (improved) {
      best = e.metric;
      best_step = step;
    }
    log.write({{"step", step}, {"eval_loss", e.loss}, {"eval_metric", e.metric}, {"metric", metric},
               {"elapsed_s", elapsed}, {"attention", a.attention}, {"examples", e.examples}});
    std::fprintf(stderr, "%seval at step %lld: loss %.4f, %s %.4f%s (%lld examples, %.1f s)\n", tty ? "\r\033[K" : "",
                 static_cast<long long>(step), e.loss, metric.c_str(), e.metric, improved ? " (best)" : "",
                 static_cast<long long>(e.examples), e.ms / 1e3);
    checkpoint("eval");
    if (improved && !a.checkpoint.empty()) {
      json st = {{"step", step}, {"elapsed_s", elapsed}, {"seed", a.seed}, {"best_metric", best},
                 {"metric", metric}, {"args", args}};
      save_checkpoint(root, "best", *model, opt, st);
    }
  };

  const int64_t tokens_per_step = a.batch * a.seq;
  const int64_t start = step;
  const auto run_t0 = Clock::now();
  auto last_print = Clock::now() - std::chrono::seconds(10);
  std::string stop = "steps";
  while (step < a.steps) {
    if (a.time_budget > 0 && elapsed >= a.time_budget) {
      stop = "time_budget";
      break;
    }
    const auto t0 = Clock::now();
    const Batch batch = task->train_batch(a.batch, a.seq, static_cast<uint64_t>(step));
    model->zero_grads();
    const StepResult r = model->forward_backward(batch, true, static_cast<uint64_t>(step));
    float lr = 0;
    const double gnorm = opt.step(&lr);
    const double ms = seconds_since(t0) * 1e3;
    elapsed += ms / 1e3;
    ++step;
    const double loss = r.counted ? r.loss_sum / static_cast<double>(r.counted) : 0;
    check(std::isfinite(loss), "train: the loss is not finite at step ", step, " (try a lower --lr)");
    log.write({{"step", step}, {"loss", loss}, {"lr", lr}, {"ms", ms},
               {"tokens_per_s", static_cast<double>(tokens_per_step) / (ms / 1e3)}, {"grad_norm", gnorm}});
    const double since = seconds_since(last_print);
    if (since >= (tty ? 0.2 : 1.0) || step == a.steps || step == start + 1) {
      last_print = Clock::now();
      const double rate = static_cast<double>(step - start) / std::max(seconds_since(run_t0), 1e-9);
      double eta = static_cast<double>(a.steps - step) / std::max(rate, 1e-9);
      if (a.time_budget > 0) eta = std::min(eta, std::max(0.0, a.time_budget - elapsed));
      std::fprintf(stderr, "%sstep %lld/%lld  loss %.4f  lr %.2e  %.2f steps/s  ETA %s%s", tty ? "\r\033[K" : "",
                   static_cast<long long>(step), static_cast<long long>(a.steps), loss, static_cast<double>(lr), rate,
                   duration(eta).c_str(), tty ? "" : "\n");
      std::fflush(stderr);
    }
    if (step % a.eval_every == 0) run_eval();
  }
  if (stop == "time_budget")
    std::fprintf(stderr, "%strain: time budget of %.1f s reached after %lld steps\n", tty ? "\r\033[K" : "",
                 a.time_budget, static_cast<long long>(step));
  if (last_eval != step) run_eval();
  log.write({{"end", stop}, {"step", step}, {"elapsed_s", elapsed}});
  if (tty) std::fputs("\n", stderr);
  std::printf("trained %lld steps (%s) in %.1f s of training; best %s %.4f at step %lld%s%s\n",
              static_cast<long long>(step), stop.c_str(), elapsed, metric.c_str(), best,
              static_cast<long long>(best_step), a.checkpoint.empty() ? "" : "; checkpoints in ",
              a.checkpoint.c_str());
}

struct EvalArgs {
  std::string checkpoint, task, data, output = "text";
  std::vector<std::string> attention;
  int64_t seq = 0, batch = 8, eval_examples = 0, min_length = 500, max_length = 2000;
  double mask_prob = 0.15;
  uint64_t seed = 0;
  int threads = 0;
  // Which of the task options the command line gave (the rest come from the run's train_state.json).
  bool has_task = false, has_data = false, has_seed = false, has_seq = false, has_lengths = false, has_mask = false,
       has_batch = false;
};

// The model folder of --checkpoint: DIR itself when it holds config.json, else DIR/best, else
// DIR/latest.
fs::path model_folder(const std::string& dir) {
  const fs::path d = dir;
  for (const fs::path& c : {d, d / "best", d / "latest"})
    if (fs::exists(c / "config.json")) return c;
  fail("eval: '", dir, "' holds no checkpoint (config.json in it, in best/ or in latest/)");
}

void run_eval(EvalArgs o) {
  set_threads(checked_threads(o.threads, "eval"));
  usage_check(o.output == "text" || o.output == "json", "eval: -o must be text or json, got '", o.output, "'");
  check_size(o.batch, 1, 1 << 20, "eval: --batch");
  check_size(o.eval_examples, 0, kMaxCount, "eval: --eval-examples (0: the whole held-out set)");
  const fs::path folder = model_folder(o.checkpoint);
  // Task options of the training run, unless given.
  json saved;
  if (std::ifstream in(folder / "train_state.json"); in) {
    const json st = json::parse(in, nullptr, false);
    if (st.is_object() && st.contains("args") && st["args"].is_object()) saved = st["args"];
  }
  if (!saved.is_null()) {
    if (!o.has_task) o.task = saved.value("task", o.task);
    if (!o.has_data) o.data = saved.value("data", o.data);
    if (!o.has_seed) o.seed = saved.value("seed", o.seed);
    if (!o.has_seq) o.seq = saved.value("seq", o.seq);
    if (!o.has_lengths) {
      o.min_length = saved.value("min_length", o.min_length);
      o.max_length = saved.value("max_length", o.max_length);
    }
    if (!o.has_mask) o.mask_prob = saved.value("mask_prob", o.mask_prob);
    // The run's batch size too: the loss sums in the same order, so eval repeats the run's figures.
    if (!o.has_batch) o.batch = saved.value("batch", o.batch);
  }
  usage_check(!o.task.empty(), "eval: --task is needed (", folder.string(), " has no train_state.json to read it from)");
  const TaskKind head = head_of(o.task);
  std::unique_ptr<TrainModel> model = TrainModel::load(folder.string());
  check(model->head() == head, "eval: the checkpoint's head does not fit task '", o.task, "'");
  if (o.seq == 0) o.seq = model->config().max_positions;
  check_size(o.seq, 1, kMaxCount, "eval: --seq");
  const std::unique_ptr<Task> task = make_task(task_options(o.task, o.data, o.seed, o.min_length, o.max_length, o.mask_prob));
  check(task->vocab() == model->config().vocab, "eval: task '", o.task, "' has ", task->vocab(),
        " tokens but the model's vocabulary is ", model->config().vocab);
  const std::vector<Batch> batches = task->eval_batches(o.batch, o.seq, o.eval_examples);
  check(!batches.empty(), "eval: no held-out example fits --seq ", o.seq);
  if (o.attention.empty()) {
    std::ifstream in(folder / "config.json");
    const json cj = json::parse(in, nullptr, false);
    o.attention.push_back(cj.is_object() ? cj.value("clattn_attention", std::string("full")) : "full");
  }
  const std::string metric = metric_name(head);
  json results = json::array();
  if (o.output == "text") {
    std::printf("checkpoint %s, task %s, seq %lld\n", folder.c_str(), o.task.c_str(), static_cast<long long>(o.seq));
    std::printf("%-50s %10s %14s %9s %10s\n", "attention", "loss", metric.c_str(), "examples", "s");
  }
  for (const std::string& plan : o.attention) {
    model->set_attention(plan, /*training=*/false);
    check_memory(training_bytes(model->config(), static_cast<int64_t>(model->params().size()), plan, o.batch, o.seq),
                 "eval: " + plan);
    const EvalResult e = evaluate(*model, batches);
    results.push_back({{"attention", plan}, {"eval_loss", e.loss}, {"eval_metric", e.metric}, {"metric", metric},
                       {"examples", e.examples}, {"targets", e.counted}, {"seconds", e.ms / 1e3}});
    if (o.output == "text") {
      std::printf("%-50s %10.4f %14.4f %9lld %10.2f\n", plan.c_str(), e.loss, e.metric,
                  static_cast<long long>(e.examples), e.ms / 1e3);
      std::fflush(stdout);
    }
  }
  if (o.output == "json") {
    const json doc = {{"checkpoint", folder.string()}, {"task", o.task}, {"seq", o.seq}, {"results", results}};
    std::printf("%s\n", doc.dump(2).c_str());
  }
}

}  // namespace

void add_train(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  CLI::App* sub = app.add_subcommand(
      "train", "Train a transformer on listops, mlm or lm with any attention; evaluate, checkpoint, resume");
  sub->add_option("--task", a->task, "listops (BERT + classifier), mlm (BERT, masked characters) or lm (LLaMA, next character)")
      ->required();
  sub->add_option("--data", a->data,
                  "mlm / lm: a text file (last 10 % held out); listops: a TSV for evaluation (default: generated)");
  sub->add_option("--attention", a->attention, "attention plan: a spec, or 'spec0;spec1;...' per layer (default full)");
  sub->add_option("--layers", a->layers, "layers (default 2)");
  sub->add_option("--dim", a->dim, "hidden size (default 128)");
  sub->add_option("--heads", a->heads, "attention heads, dividing --dim (default 2)");
  sub->add_option("--ff", a->ff, "feed-forward size (default 2 x dim)");
  sub->add_option("--seq", a->seq, "sequence length (default 512)");
  sub->add_option("--batch", a->batch, "sequences per step (default 8)");
  sub->add_option("--steps", a->steps, "optimizer steps (default 1000; the schedule's length)");
  sub->add_option("--lr", a->lr, "peak learning rate (default 1e-3)");
  sub->add_option("--min-lr", a->min_lr, "final learning rate of the cosine (default lr / 10)");
  sub->add_option("--warmup", a->warmup, "linear warm-up steps (default 100)");
  sub->add_option("--clip", a->clip, "global gradient-norm clip (default 1; 0 = off)");
  sub->add_option("--weight-decay", a->weight_decay, "AdamW decoupled weight decay (default 0.01)");
  sub->add_option("--dropout", a->dropout, "dropout on the residual branches (default 0)");
  sub->add_option("--eval-every", a->eval_every, "evaluate (and checkpoint) every N steps (default 100)");
  sub->add_option("--eval-examples", a->eval_examples, "held-out examples per evaluation (default 256; 0 = all)");
  sub->add_option("--min-length", a->min_length, "listops: shortest generated expression (default 500 tokens)");
  sub->add_option("--max-length", a->max_length, "listops: longest generated expression (default 2000, capped at --seq)");
  sub->add_option("--mask-prob", a->mask_prob, "mlm: share of positions predicted (default 0.15)");
  sub->add_option("--checkpoint", a->checkpoint, "folder for latest/ and best/ checkpoints");
  sub->add_flag("--resume", a->resume, "continue the run saved in --checkpoint DIR/latest (same options)");
  sub->add_option("--time-budget", a->time_budget, "stop after this many seconds of training, then evaluate (0 = none)");
  sub->add_option("--seed", a->seed, "seed of the initialisation, the data and the attention draws (default 0)");
  sub->add_option("--log", a->log, "JSON-lines log (appended to on --resume)");
  add_threads_option(sub, a->threads, "train");
  sub->callback([a] { run_train(*a); });
}

void add_eval(CLI::App& app) {
  auto o = std::make_shared<EvalArgs>();
  CLI::App* sub = app.add_subcommand(
      "eval", "Evaluate a checkpoint of clattn train on its held-out data with any attention plans");
  sub->add_option("--checkpoint", o->checkpoint, "a checkpoint folder, or a train --checkpoint DIR (its best/, else latest/)")
      ->required();
  sub->add_option("--attention", o->attention, "attention plan, repeatable (default: the one it was trained with)");
  sub->add_option_function<std::string>("--task", [o](const std::string& v) { o->task = v; o->has_task = true; },
                                        "listops, mlm or lm (default: the training run's)");
  sub->add_option_function<std::string>("--data", [o](const std::string& v) { o->data = v; o->has_data = true; },
                                        "held-out data as for train (default: the training run's)");
  sub->add_option_function<int64_t>("--seq", [o](const int64_t& v) { o->seq = v; o->has_seq = true; },
                                    "sequence length (default: the training run's)");
  sub->add_option_function<uint64_t>("--seed", [o](const uint64_t& v) { o->seed = v; o->has_seed = true; },
                                     "data seed: the mlm masks, the generated listops set (default: the run's)");
  sub->add_option_function<int64_t>("--min-length", [o](const int64_t& v) { o->min_length = v; o->has_lengths = true; },
                                    "listops: shortest generated expression");
  sub->add_option_function<int64_t>("--max-length", [o](const int64_t& v) { o->max_length = v; o->has_lengths = true; },
                                    "listops: longest generated expression");
  sub->add_option_function<double>("--mask-prob", [o](const double& v) { o->mask_prob = v; o->has_mask = true; },
                                  "mlm: share of positions predicted");
  sub->add_option_function<int64_t>("--batch", [o](const int64_t& v) { o->batch = v; o->has_batch = true; },
                                    "sequences per forward (default: the training run's, else 8)");
  sub->add_option("--eval-examples", o->eval_examples, "held-out examples (default 0 = all)");
  sub->add_option("-o,--output", o->output, "text (default) or json on stdout");
  add_threads_option(sub, o->threads, "eval");
  sub->callback([o] { run_eval(*o); });
}

}  // namespace clattn::cli
