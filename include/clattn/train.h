// Training as a library: AdamW over a Model's flat buffers, and the Trainer — the loop of steps,
// schedule, held-out evaluation, atomic `latest/` and `best/` checkpoints, bit-exact resumption,
// a time budget and a JSON-lines log — that `clattn train` and the Python package drive.
//
// A run trains a model (model.h: the same Encoder / Decoder that runs inference) on a task
// (data.h): a fresh model of the given sizes (listops -> pre-LN BERT encoder + mean-pooled
// classifier; mlm -> BERT + tied output layer; lm -> LLaMA decoder), or any checkpoint the loader
// accepts (`init`: a Hugging Face folder, a run's own best/), keeping its architecture.
//
// Checkpoint folder DIR: DIR/latest/ (model.safetensors + config.json in Hugging Face naming,
// optimizer.safetensors, train_state.json, and tokenizer.json: the task's tokenizer files, or
// for byte-level text (mlm, lm) Tokenizer::byte_tokenizer_json(), so every language model can
// be sampled and evaluated from its folder alone) written
// at every evaluation and at the end; DIR/best/ the same when the held-out metric improved. A
// checkpoint is written whole into DIR/.tmp-NAME/ and swapped in by two renames (NAME ->
// .old-NAME, .tmp-NAME -> NAME; a run killed between them is recovered from .old-NAME), so a
// SIGKILL at any moment leaves a complete checkpoint.
//
// Exact resumption: the batch of step s is a pure function of (task, seed, s); the step's draws
// (attention, dropout) come from s; the optimizer's m, v and t and the attention layer state are
// restored bit for bit; so a resumed run repeats the uninterrupted run's losses exactly (at the
// same thread count). The options that define the run must equal the saved ones (checked).
//
// Log (JSON lines, appended to on resume): a header {"config": {...}, "attention",
// "resume_step"}; per step {"step", "loss", "lr", "ms", "tokens_per_s", "grad_norm"} (step = steps
// done, loss in nats per target); per evaluation {"step", "eval_loss", "eval_metric", "metric",
// "elapsed_s", "attention", "examples"}; and {"end", "step", "elapsed_s"} when run() stops.
// elapsed_s counts training time only (steps, not evaluations or checkpoints), carried across
// resumptions; the time budget compares it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "clattn/comm.h"
#include "clattn/data.h"
#include "clattn/model.h"
#include "clattn/nn.h"

namespace clattn {

namespace train {
class GradReducer;  // src/train/grad_reduce.h
}

struct OptimizerOptions {
  float lr = 1e-3f, min_lr = 1e-4f;
  int64_t warmup = 100, total_steps = 1000;
  float clip = 1.0f;  // global gradient-norm clip (0 = off)
  nn::AdamWOptions adamw;
};

// AdamW over a model's flat buffers: clip, schedule, step. No allocation after construction.
class Optimizer {
 public:
  Optimizer(Model& model, const OptimizerOptions& opt);
  // The optimizer of one shard [begin, end) of the parameters (ZeRO-1: each rank of comm holds
  // the moments of its own shard and updates only it; the caller gathers the parameters). The
  // gradient norm adds the shards' nn::sum_squares blocks across comm, so it has the bits of the
  // unsharded norm; shards must be unions of those blocks. save() and load() read and write the
  // whole state (save is then collective: every rank calls it, rank 0 writes).
  Optimizer(Model& model, const OptimizerOptions& opt, Communicator* comm, int64_t begin, int64_t end);
  // Applies one update from the model's grads (already averaged; clipped in place when their
  // global norm exceeds clip); returns the pre-clip grad norm. The learning rate is
  // nn::lr_schedule(steps_done(), ...) before the step. A non-finite norm is an error (nothing is
  // updated). Does not zero the grads.
  double step(float* lr_used = nullptr);
  int64_t steps_done() const { return t_; }
  // m, v (F32, bit-exact) and t (metadata) as safetensors, written atomically; load() checks
  // that the sizes match the model's parameters.
  void save(const std::string& path) const;
  void load(const std::string& path);

 private:
  struct Run {  // consecutive parameters with the same weight-decay flag: one adamw_step each
    int64_t offset, size;
    bool decay;
  };
  Model* model_;
  OptimizerOptions opt_;
  Communicator* comm_ = nullptr;  // sharded when set
  int64_t begin_ = 0, end_ = 0;   // the shard of the parameters this optimizer updates
  std::vector<float> m_, v_;      // (end - begin)
  std::vector<Run> runs_;
  int64_t t_ = 0;
};

// Held-out figures of a model over batches: the mean loss per target (nats) and the task's
// metric (accuracy, or bits per character / token = loss / ln 2). Draws from a fixed step, so the
// same parameters always give the same figures.
struct EvalResult {
  double loss = 0, metric = 0;
  int64_t examples = 0, targets = 0;
  double seconds = 0;
};
EvalResult evaluate(Model& model, const std::vector<Batch>& batches, bool accuracy);
// The same split across the ranks of comm (batch i on rank i mod R), with the same figures as
// on one rank: per-batch sums gathered and added in batch order.
EvalResult evaluate(Model& model, const std::vector<Batch>& batches, bool accuracy, Communicator& comm);
// The same over groups of `group_ranks` consecutive ranks (batch i on group i mod the number of
// groups), each rank adding its share: with the model's sequences split across a group
// (Model::set_sequence_parallel), every rank of the group runs the batch and the shares add up.
EvalResult evaluate(Model& model, const std::vector<Batch>& batches, bool accuracy, Communicator& comm,
                    int group_ranks);

// A checkpoint on its task's held-out set with each attention plan: `clattn eval`, and
// clattn.evaluate in Python. Each task option left unset is the training run's own, from its
// train_state.json "args" (each field checked, named with the file when wrong), else the default
// shown; so a run's held-out figures are repeated exactly, or re-measured with other plans.
struct CheckpointEvalOptions {
  std::string checkpoint;              // a model folder, or a run folder: its best/, else latest/
  std::vector<std::string> attention;  // plans; empty: the one the checkpoint was trained with
  std::optional<std::string> task, data;
  std::optional<uint64_t> seed;                             // default 0
  std::optional<int64_t> seq;                               // default: the task's, else min(context, 512)
  std::optional<int64_t> batch;                             // default 8
  std::optional<int64_t> min_length, max_length;            // listops, default 500 / 2000
  std::optional<double> mask_prob;                          // mlm, default 0.15
  int64_t eval_examples = 0;                                // 0: the whole held-out set
};
struct CheckpointEval {
  std::string folder, task, metric;  // the model folder read; the task; its metric's name
  int64_t seq = 0, batch = 0;
  std::vector<std::string> plans;    // what runs, in order
  std::vector<EvalResult> results;   // per plan, as each finishes
};
// `on_plan(ev, i)` is called before plans[i] runs (ev holds everything but the results from i on)
// and `on_result(ev, i)` once results[i] is in (progress, streamed rows); both may be empty. The
// head of the checkpoint must fit the task.
using CheckpointEvalCallback = std::function<void(const CheckpointEval& ev, size_t i)>;
CheckpointEval evaluate_checkpoint(const CheckpointEvalOptions& o, const CheckpointEvalCallback& on_plan = {},
                                   const CheckpointEvalCallback& on_result = {});

struct TrainOptions {
  TaskOptions task;       // kind, data, seed (also of the initialisation and every draw), ...
  std::string init;       // a checkpoint folder to start from; "" = a fresh model of these sizes:
  int64_t layers = 2, dim = 128, heads = 2, ff = 0;  // ff 0 = 2 x dim
  std::string attention = "full";  // the plan trained with
  // Sequence length; 0 = the task's own (feature sets), else the checkpoint's context capped at
  // 512, else 512.
  int64_t seq = 0;
  int64_t batch = 8, steps = 1000, warmup = 100, eval_every = 100, eval_examples = 256;
  double lr = 1e-3, min_lr = -1, clip = 1, weight_decay = 0.01, dropout = 0;  // min_lr < 0: lr / 10
  double time_budget = 0;  // seconds of training; 0 = none
  std::string checkpoint;  // folder of latest/ and best/ ("" = none)
  std::string log;         // JSON-lines log ("" = none)
  bool resume = false;     // continue the run saved in checkpoint/latest (same options)
  // Recorded in the log header (the caller sets the thread count and knows its build).
  int threads = 0;
  std::string version, commit;

  // Data parallelism (docs/distributed.md). The ranks of `comm` (null: this process alone) split
  // each step's batch; every rank builds the same task and model, only rank 0 writes the log and
  // the checkpoints, and evaluation is split across the ranks.
  Communicator* comm = nullptr;
  // Sum the batch's gradient in one fixed tree over its sequences (one forward/backward per
  // sequence): losses, parameters and checkpoints have the same bits for any number of ranks and
  // any accum. Off (default): each rank's share in `accum` micro-batches, summed by MPI's
  // all-reduce (the same bits run to run for a given number of ranks). Measured at N = 4096 on
  // one rank of 2 threads, the fixed tree costs 2 % of a step with full attention and 11 % with
  // improved-clustered (its sequences no longer share one batched forward).
  bool reproducible = false;
  int64_t accum = 1;
  // ZeRO-1: AdamW's moments and update sharded across the ranks (memory per rank / R), the
  // parameters gathered after each step. Results equal the unsharded optimizer's.
  bool shard_optimizer = false;
  // Start exchanging each layer's gradient as soon as its backward is done (the exchange overlaps
  // the rest of the backward); off: exchange everything after the backward (for measuring what
  // the overlap hides).
  bool overlap = true;
  // Sequence parallelism (docs/sequence-parallel.md): groups of `sequence_ranks` consecutive ranks
  // of comm each split every sequence of their share of the batch across themselves
  // (Model::set_sequence_parallel), and the comm->size() / sequence_ranks groups run data parallel
  // over the batch as ranks otherwise do. 0 or 1: off. It must divide the number of ranks; it is
  // refused with `reproducible` (whose fixed tree sums whole sequences) and with dropout.
  int sequence_ranks = 0;
};

// How check_train_options names an option: as the command line spells it ("--eval-every") or as
// the Python Trainer's keyword ("eval_every").
enum class OptionNames { cli, python };
// The one set of rules for TrainOptions, for every front end: ranges (sizes of at most 1024
// layers, 2^16 dim, 2^20 ff and batch; counts below 2^31), finite positive rates, what needs what
// (a task's data, --resume's checkpoint, features' --init); then the derived defaults (ff 0 ->
// 2·dim, min_lr < 0 -> lr / 10). Throws Error naming the first option out of range with the value
// seen. The Trainer applies it (Python names); the command line first with its own names.
void check_train_options(TrainOptions& o, OptionNames names);

struct StepReport {
  int64_t step = 0;  // steps done
  double loss = 0, lr = 0, ms = 0, tokens_per_s = 0, grad_norm = 0;
  // Milliseconds this rank waited for the gradient exchange after its backward (what the
  // backward did not hide), and spent gathering the result.
  double comm_ms = 0;
  // The least comm_ms over the ranks: the rank whose backward ended last waits for the exchange
  // alone, not for a slower peer, so this is the exchange's exposed time.
  double comm_exposed_ms = 0;
  StepResult detail;  // this rank's forward/backward timings, summed over its micro-batches
};

struct EvalReport {
  int64_t step = 0;
  EvalResult result;
  bool improved = false;  // a new best held-out metric (best/ was written)
};

class Trainer {
 public:
  // Builds the task, the model (fresh, from `init`, or resumed from checkpoint/latest) and the
  // optimizer, and the held-out set. Errors name the option or file. Nothing is written yet.
  explicit Trainer(TrainOptions opt);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Called after every step and every evaluation (optional).
  std::function<void(const StepReport&)> on_step;
  std::function<void(const EvalReport&)> on_eval;

  // Steps until `steps` are done or the time budget is spent, evaluating (and checkpointing)
  // every eval_every steps and at the end; returns why it stopped: "steps" or "time_budget".
  std::string run();
  // One optimizer step (a non-finite loss is an error naming the step).
  StepReport step();
  // The held-out evaluation: logged, then latest/ (and best/ when the metric improved) written.
  EvalReport evaluate();

  Model& model() { return *model_; }
  const Task& task() const { return *task_; }
  // The model as a folder any loader reads (Model::save) with the tokenizer of its task, as the
  // checkpoints have it: a tokenized task's files, or the byte-level tokenizer.json of mlm / lm.
  void save_model(const std::string& dir) const;
  const TrainOptions& options() const { return opt_; }
  int64_t steps_done() const { return step_; }
  int64_t start_step() const { return start_; }  // the step this process started at
  bool resumed() const { return resumed_; }
  double elapsed_s() const { return elapsed_; }
  double best_metric() const { return best_; }  // NaN before the first evaluation
  int64_t best_step() const { return best_step_; }
  const std::string& metric() const { return metric_; }
  bool time_budget_spent() const { return opt_.time_budget > 0 && elapsed_ >= opt_.time_budget; }
  // Bytes a step holds: the model, its gradients and moments, the activations and attention state.
  double step_bytes() const;
  // Held-out examples left out because they are longer than the sequence length (listops TSV).
  int64_t eval_skipped() const { return eval_skipped_; }

 private:
  class Files;  // the checkpoint folder and the log
  void begin();
  void checkpoint(const std::string& name, const char* why);
  void write_tokenizer(const std::string& dir) const;
  // One step's gradient, reduced over the ranks into the model's grads; returns the step's
  // summed loss and counts (identical on every rank) and the exchange's wait.
  StepResult reproducible_gradient(const Batch& batch, double& comm_ms);
  StepResult micro_batch_gradient(const Batch& batch, double& comm_ms);
  bool lead() const { return comm_->rank() == 0; }
  // Data-parallel groups: this rank's group and how many there are (ranks, without a split).
  int group() const { return comm_->rank() / seq_ranks_; }
  int groups() const { return comm_->size() / seq_ranks_; }
  TrainOptions opt_;
  std::unique_ptr<Communicator> own_comm_;  // the single process, when no communicator was given
  Communicator* comm_ = nullptr;
  std::unique_ptr<Communicator> seq_comm_;  // this rank's sequence-parallel group
  int seq_ranks_ = 1;
  std::unique_ptr<train::GradReducer> reducer_;
  std::unique_ptr<Task> task_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optim_;
  std::unique_ptr<Files> files_;
  std::vector<Batch> eval_set_;
  std::string metric_, tokenizer_;
  int64_t step_ = 0, start_ = 0, best_step_ = -1, last_eval_ = -1, eval_skipped_ = 0;
  double elapsed_ = 0, best_;
  bool resumed_ = false, begun_ = false;
};

// The live report of a run, as `clattn train` prints it on stderr and Python's Trainer by default:
//   step 120/400  loss 1.2345  lr 3.00e-04  4.10 steps/s  ETA 1m08s
//   eval at step 200: loss 1.1000, accuracy 0.6120 (best) (512 examples, 1.3 s)
// A step line at most every 0.2 s when `live` (a terminal: each line rewrites the last in place)
// or every 1 s otherwise, the run's first and last steps always; a line per evaluation, and one
// when the time budget stops the run. The rate and ETA count from this object's construction:
// make it just before run(). Each call returns the text to write, "" when nothing is due, so the
// caller writes it where its output goes (stderr, Python's sys.stderr).
class TrainReport {
 public:
  TrainReport(const Trainer& t, bool live);
  std::string step(const StepReport& r);
  std::string eval(const EvalReport& e) const;
  std::string finish(const std::string& stop) const;  // after run() returned `stop`
 private:
  const Trainer& t_;
  bool live_;
  double t0_, last_ = -1e9;  // seconds on a steady clock: the run's start, the last step line
};

}  // namespace clattn
