// `clattn train`: option parsing around clattn::Trainer (include/clattn/train.h: the loop, its
// checkpoints, log and exact resumption), with a live status line on stderr.
// `clattn eval`: evaluate a checkpoint with any attention plans (train with one, evaluate with
// another: the paper's Table 1).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "clattn/attention.h"
#include "clattn/comm.h"
#include "clattn/data.h"
#include "clattn/error.h"
#include "clattn/input_file.h"
#include "clattn/model.h"
#include "clattn/threads.h"
#include "clattn/train.h"
#include "commands.h"
#include "progress.h"
#include "result_table.h"
#include "version.h"

namespace clattn::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct TrainCli {
  TrainOptions o;
  std::string task;
  bool sizes_given = false;  // --layers, --dim, --heads or --ff on the command line
  bool seq_given = false;
  bool sequence_parallel = false;
  std::vector<std::string> plan_files;  // --plan
};

// The library's rules for the options (check_train_options, shared with Python's Trainer) with
// the command line's names, as usage errors; and what only a command line can get wrong.
void check_train_args(TrainCli& cl) {
  TrainOptions& a = cl.o;
  a.task.kind = cl.task;
  usage_check(a.init.empty() || !cl.sizes_given, "train: --init keeps the checkpoint's architecture; ",
              "--layers, --dim, --heads and --ff are for a fresh model");
  if (cl.seq_given) check_size(a.seq, 1, kMaxCount, "train: --seq");
  try {
    check_train_options(a, OptionNames::cli);
  } catch (const Error& e) {
    usage_fail(e.what());
  }
  check_elements({a.batch, std::max<int64_t>(a.seq, 1), std::max(a.dim, a.ff)}, "train: activations (batch, seq, max(dim, ff))");
}

void run_train(TrainCli cl) {
  check_train_args(cl);
  TrainOptions& a = cl.o;
  // The Trainer refuses such a log too (for Python); here it is a usage error, like every command's.
  std::vector<PathArg> inputs{{"--data", a.task.data}, {"--init", a.init, true}};
  for (const PathArg& p : path_args("--plan", cl.plan_files)) inputs.push_back(p);
  check_outputs("train", {{"--log", a.log}}, inputs);
  // Under mpirun / srun every rank runs this; the ranks of one machine share its processors.
  Communicator& comm = world();
  a.comm = &comm;
  const bool lead = comm.rank() == 0;
  if (a.threads == 0 && comm.size() > 1) a.threads = std::max(1, available_processors() / local_ranks());
  usage_check(a.sequence_ranks >= 0, "train: --sequence-ranks must be >= 0, got ", a.sequence_ranks);
  // --sequence-parallel alone: every rank splits each sequence; --sequence-ranks S: groups of S.
  if (cl.sequence_parallel && a.sequence_ranks == 0) a.sequence_ranks = comm.size();
  const int threads = checked_threads(a.threads, "train");
  set_threads(threads);
  a.threads = threads;
  a.task.kind = cl.task;
  a.version = kVersion;
  a.commit = kCommit;
  // Said at start, not after the run: a model trained without --checkpoint is thrown away.
  if (lead && a.checkpoint.empty())
    std::fprintf(stderr, "train: warning: no --checkpoint DIR: the trained model will not be saved\n");
  if (lead && a.warmup > a.steps)
    std::fprintf(stderr, "train: warning: --warmup %lld is longer than --steps %lld: the learning rate never "
                 "reaches --lr\n", static_cast<long long>(a.warmup), static_cast<long long>(a.steps));
  if (lead && a.resume && !a.checkpoint.empty() && !fs::exists(fs::path(a.checkpoint) / "latest" / "train_state.json"))
    std::fprintf(stderr, "train: no checkpoint in %s yet; starting from step 0\n", (fs::path(a.checkpoint) / "latest").c_str());
  Trainer tr(a);  // refuses a model and batch that would not fit in memory
  const TrainOptions& o = tr.options();
  if (!lead) {  // rank 0 speaks for the job
    tr.run();
    return;
  }
  if (const int64_t skipped = tr.eval_skipped())
    std::fprintf(stderr, "train: %lld held-out examples longer than --seq %lld are left out of evaluation\n",
                 static_cast<long long>(skipped), static_cast<long long>(o.seq));
  const ModelConfig& c = tr.model().config();
  std::fprintf(stderr, "train: %s, %s, %lld layers, dim %lld, %lld heads, ff %lld, %zu parameters, batch %lld x %lld%s%s\n",
               cl.task.c_str(), o.attention.c_str(), static_cast<long long>(c.layers), static_cast<long long>(c.hidden),
               static_cast<long long>(c.heads), static_cast<long long>(c.ffn), tr.model().params().size(),
               static_cast<long long>(o.batch), static_cast<long long>(o.seq),
               o.init.empty() ? "" : (", from " + o.init).c_str(),
               tr.resumed() ? (", resumed at step " + std::to_string(tr.steps_done())).c_str() : "");
  if (comm.size() > 1)
    std::fprintf(stderr, "train: %s x %d threads, %s gradient sum%s%s\n", comm.name().c_str(), threads, o.reproducible ? "fixed-tree (reproducible)" : "all-reduce",
                 o.shard_optimizer ? ", optimizer sharded (ZeRO-1)" : "",
                 o.sequence_ranks > 1 ? (", each sequence split over " + std::to_string(o.sequence_ranks) + " ranks (" +
                                         std::to_string(comm.size() / o.sequence_ranks) + " data-parallel groups)").c_str()
                                      : "");

  TrainReport report(tr, ::isatty(STDERR_FILENO) != 0);
  auto put = [](const std::string& text) {
    std::fputs(text.c_str(), stderr);
    std::fflush(stderr);
  };
  tr.on_step = [&](const StepReport& r) { put(report.step(r)); };
  tr.on_eval = [&](const EvalReport& e) { put(report.eval(e)); };
  const std::string stop = tr.run();
  put(report.finish(stop));
  std::printf("trained %lld steps (%s) in %.1f s of training; best %s %.4f at step %lld%s%s\n",
              static_cast<long long>(tr.steps_done()), stop.c_str(), tr.elapsed_s(), tr.metric().c_str(), tr.best_metric(),
              static_cast<long long>(tr.best_step()), o.checkpoint.empty() ? "" : "; checkpoints in ",
              o.checkpoint.c_str());
}

struct EvalArgs {
  CheckpointEvalOptions o;
  std::string output = "text";
  int threads = 0;
};

void run_eval(const EvalArgs& a) {
  set_threads(checked_threads(a.threads, "eval"));
  if (a.o.batch) check_size(*a.o.batch, 1, 1 << 20, "eval: --batch");
  if (a.o.seq) check_size(*a.o.seq, 1, kMaxCount, "eval: --seq");
  check_size(a.o.eval_examples, 0, kMaxCount, "eval: --eval-examples (0: the whole held-out set)");
  if (a.o.task) {
    try {
      (void)task_head(*a.o.task, "eval");
    } catch (const Error& e) {
      usage_fail(e.what());
    }
  }
  std::unique_ptr<Progress> progress;
  std::unique_ptr<ResultTable> table;  // its metric column is named by the task: made at the first plan
  nlohmann::ordered_json results = nlohmann::ordered_json::array();  // the rows, as printed
  auto row = [](const CheckpointEval& e, size_t i) {
    const EvalResult& r = e.results[i];
    return nlohmann::ordered_json{{"attention", e.plans[i]}, {"eval_loss", r.loss}, {"eval_metric", r.metric},
                                  {"metric", e.metric},      {"examples", r.examples}, {"targets", r.targets},
                                  {"seconds", r.seconds}};
  };
  const CheckpointEval ev = evaluate_checkpoint(
      a.o,
      [&](const CheckpointEval& e, size_t i) {
        if (!progress) {
          progress = std::make_unique<Progress>("eval", static_cast<int64_t>(e.plans.size()));
          table = std::make_unique<ResultTable>(
              a.output, std::vector<Column>{{"attention", "attention", "", 50, true, false, true},
                                            {"loss", "eval_loss", "%.4f", 10},
                                            {e.metric, "eval_metric", "%.4f", 14},
                                            {"examples", "examples", "", 9},
                                            {"s", "seconds", "%.2f", 10},
                                            {"metric", "metric", "", 0, false, false, false, true},
                                            {"targets", "targets", "", 0, false, false, false, true}});
          progress->above([&] {
            std::fprintf(table->preamble(), "checkpoint %s, task %s, seq %lld\n", e.folder.c_str(), e.task.c_str(),
                         static_cast<long long>(e.seq));
            table->header();
          });
        }
        progress->set(static_cast<int64_t>(i), detail::concat(e.plans[i], ", batches of ", e.batch));
      },
      [&](const CheckpointEval& e, size_t i) {
        results.push_back(row(e, i));
        progress->above([&] { table->row(results.back()); });
      });
  if (progress) progress->finish();
  if (table)
    table->end({{"checkpoint", ev.folder}, {"task", ev.task}, {"seq", ev.seq}, {"results", results}});
}

}  // namespace

void add_train(CLI::App& app) {
  auto cl = std::make_shared<TrainCli>();
  TrainOptions& a = cl->o;
  a.task.min_length = 500;
  a.task.max_length = 2000;
  CLI::App* sub = app.add_subcommand(
      "train", "Train a transformer on listops, mlm, lm or features with any attention; evaluate, checkpoint, resume");
  sub->add_option("--task", cl->task,
                  "listops (BERT + classifier), mlm (BERT, masked characters), lm (LLaMA, next character or token), "
                  "features (a KWT model on a feature set)")
      ->required();
  sub->add_option("--data", a.task.data,
                  "mlm / lm: a text file (last 10 % held out); listops: a TSV for evaluation (default: generated); "
                  "features: a feature set (.safetensors with features and labels)");
  sub->add_option("--init", a.init,
                  "start from this checkpoint (a Hugging Face folder or a run's best/), keeping its architecture; "
                  "lm reads its tokenizer.json when it has one");
  sub->add_option("--attention", a.attention, "attention plan: a spec, or 'spec0;spec1;...' per layer (default full)")
      ->check(spec_validator());
  add_plan_file_option(sub, a.attention, &cl->plan_files);
  CLI::Option* sizes[] = {
      sub->add_option("--layers", a.layers, "layers of a fresh model")->capture_default_str(),
      sub->add_option("--dim", a.dim, "hidden size of a fresh model")->capture_default_str(),
      sub->add_option("--heads", a.heads, "attention heads of a fresh model, dividing --dim")->capture_default_str(),
      sub->add_option("--ff", a.ff, "feed-forward size of a fresh model (default 2 x dim)")};
  CLI::Option* seq = sub->add_option("--seq", a.seq,
                                     "sequence length (default 512; with --init the checkpoint's context up to 512; "
                                     "features: the set's frames)");
  sub->add_option("--batch", a.batch, "sequences per step")->capture_default_str();
  sub->add_option("--steps", a.steps, "optimizer steps (the schedule's length)")->capture_default_str();
  sub->add_option("--lr", a.lr, "peak learning rate")->capture_default_str();
  sub->add_option("--min-lr", a.min_lr, "final learning rate of the cosine (default lr / 10)");
  sub->add_option("--warmup", a.warmup, "linear warm-up steps")->capture_default_str();
  sub->add_option("--clip", a.clip, "global gradient-norm clip (0 = off)")->capture_default_str();
  sub->add_option("--weight-decay", a.weight_decay, "AdamW decoupled weight decay")->capture_default_str();
  sub->add_option("--dropout", a.dropout, "dropout on the residual branches")->capture_default_str();
  sub->add_option("--eval-every", a.eval_every, "evaluate (and checkpoint) every N steps")->capture_default_str();
  sub->add_option("--eval-examples", a.eval_examples, "held-out examples per evaluation (0 = all)")->capture_default_str();
  sub->add_option("--min-length", a.task.min_length, "listops: shortest generated expression (tokens)")->capture_default_str();
  sub->add_option("--max-length", a.task.max_length, "listops: longest generated expression (capped at --seq)")->capture_default_str();
  sub->add_option("--mask-prob", a.task.mask_prob, "mlm: share of positions predicted")->capture_default_str();
  sub->add_option("--checkpoint", a.checkpoint, "folder for latest/ and best/ checkpoints");
  sub->add_flag("--resume", a.resume, "continue the run saved in --checkpoint DIR/latest (same options)");
  sub->add_option("--time-budget", a.time_budget, "stop after this many seconds of training, then evaluate (0 = none)")->capture_default_str();
  sub->add_option("--seed", a.task.seed, "seed of the initialisation, the data and the attention draws")->capture_default_str();
  sub->add_option("--log", a.log, "JSON-lines log (appended to on --resume)");
  sub->add_flag("--reproducible,!--no-reproducible", a.reproducible,
                "sum the gradient in one fixed tree over the batch's sequences: the same bits for any number of "
                "ranks and any --accum at the same --threads per rank (other thread counts reorder float sums "
                "inside some attention backwards: ~1e-10 relative) (default off: each rank's share in --accum "
                "micro-batches, all-reduced)");
  sub->add_option("--accum", a.accum, "micro-batches per rank and step without --reproducible")->capture_default_str();
  sub->add_flag("!--no-overlap", a.overlap,
                "exchange the gradient after the backward instead of layer by layer during it (for measuring the overlap)");
  sub->add_flag("--shard-optimizer", a.shard_optimizer,
                "ZeRO-1 under mpirun: AdamW's moments and update sharded across the ranks (default off)");
  sub->add_flag("--sequence-parallel", cl->sequence_parallel,
                "under mpirun, split every sequence across the ranks (docs/sequence-parallel.md): full attention "
                "as ring attention, clustered and improved-clustered with distributed clustering; no dropout");
  sub->add_option("--sequence-ranks", a.sequence_ranks,
                  "ranks per sequence (a divisor of the ranks; the groups run data parallel); implies "
                  "--sequence-parallel (default: all ranks)");
  add_threads_option(sub, a.threads, "train");
  add_comm_timeout_option(sub);
  sub->callback([cl, sizes, seq] {
    for (CLI::Option* o : sizes) cl->sizes_given = cl->sizes_given || o->count() > 0;
    cl->seq_given = seq->count() > 0;
    run_train(*cl);
  });
}

void add_eval(CLI::App& app) {
  auto o = std::make_shared<EvalArgs>();
  CLI::App* sub = app.add_subcommand(
      "eval", "Evaluate a checkpoint of clattn train on its held-out data with any attention plans");
  sub->add_option("--checkpoint", o->o.checkpoint, "a checkpoint folder, or a train --checkpoint DIR (its best/, else latest/)")
      ->required();
  sub->add_option("--attention", o->o.attention, "attention plan, repeatable (default: the one it was trained with)")
      ->check(spec_validator());
  add_plan_file_option(sub, o->o.attention);
  CheckpointEvalOptions& e = o->o;
  sub->add_option_function<std::string>("--task", [&e](const std::string& v) { e.task = v; },
                                        "listops, mlm or lm (default: the training run's)");
  sub->add_option_function<std::string>("--data", [&e](const std::string& v) { e.data = v; },
                                        "held-out data as for train (default: the training run's)");
  sub->add_option_function<int64_t>("--seq", [&e](const int64_t& v) { e.seq = v; },
                                    "sequence length (default: the training run's)");
  sub->add_option_function<uint64_t>("--seed", [&e](const uint64_t& v) { e.seed = v; },
                                     "data seed: the mlm masks, the generated listops set (default: the run's)");
  sub->add_option_function<int64_t>("--min-length", [&e](const int64_t& v) { e.min_length = v; },
                                    "listops: shortest generated expression");
  sub->add_option_function<int64_t>("--max-length", [&e](const int64_t& v) { e.max_length = v; },
                                    "listops: longest generated expression");
  sub->add_option_function<double>("--mask-prob", [&e](const double& v) { e.mask_prob = v; },
                                  "mlm: share of positions predicted");
  sub->add_option_function<int64_t>("--batch", [&e](const int64_t& v) { e.batch = v; },
                                    "sequences per forward (default: the training run's, else 8)");
  sub->add_option("--eval-examples", e.eval_examples, "held-out examples (0 = all)")->capture_default_str();
  add_format_option(sub, o->output);
  add_threads_option(sub, o->threads, "eval");
  sub->callback([o] { run_eval(*o); });
}

}  // namespace clattn::cli
