// clattn.Trainer: the library's training loop (include/clattn/train.h) from Python — a fresh model
// or any checkpoint (init=), any attention plan, held-out evaluation, atomic checkpoints and
// bit-exact resumption. The GIL is released while the loop runs; on_step / on_eval callbacks are
// called with it held, with a dict of the step's or evaluation's figures.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "clattn/comm.h"
#include "clattn/error.h"
#include "clattn/train.h"
#include "common.h"

namespace clattn::py {
namespace {

pb::dict step_dict(const StepReport& r) {
  pb::dict d;
  d["step"] = r.step;
  d["loss"] = r.loss;
  d["lr"] = r.lr;
  d["ms"] = r.ms;
  d["tokens_per_s"] = r.tokens_per_s;
  d["grad_norm"] = r.grad_norm;
  d["comm_ms"] = r.comm_ms;
  d["comm_exposed_ms"] = r.comm_exposed_ms;
  d["attention_ms"] = r.detail.attention_ms;
  d["dense_ms"] = r.detail.dense_ms;
  return d;
}

pb::dict eval_dict(const EvalReport& r, const std::string& metric) {
  pb::dict d;
  d["step"] = r.step;
  d["loss"] = r.result.loss;
  d["metric"] = metric;
  d["value"] = r.result.metric;
  d["improved"] = r.improved;
  d["examples"] = r.result.examples;
  d["seconds"] = r.result.seconds;
  return d;
}

struct PyTrainer {
  std::unique_ptr<Trainer> t;
  pb::object on_step = pb::none(), on_eval = pb::none();
  bool progress = true;
  std::mutex mu;
};

// Writes text to Python's sys.stderr (a notebook's, a redirected one), with the GIL held.
void to_stderr(const std::string& text) {
  if (text.empty()) return;
  const pb::object err = pb::module_::import("sys").attr("stderr");
  if (err.is_none()) return;
  err.attr("write")(text);
  err.attr("flush")();
}

// Runs f with the GIL released and the trainer's mutex held; the callbacks take the GIL back.
// `report` (run() with progress on) prints the command line's live report to sys.stderr.
template <class F>
auto run_locked(PyTrainer& p, F&& f, TrainReport* report = nullptr) {
  p.t->on_step = [&p, report](const StepReport& r) {
    pb::gil_scoped_acquire gil;
    if (report) to_stderr(report->step(r));
    if (!p.on_step.is_none()) p.on_step(step_dict(r));
  };
  p.t->on_eval = [&p, report](const EvalReport& r) {
    pb::gil_scoped_acquire gil;
    if (report) to_stderr(report->eval(r));
    if (!p.on_eval.is_none()) p.on_eval(eval_dict(r, p.t->metric()));
  };
  pb::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lock(p.mu);
  apply_threads();
  return f();
}

}  // namespace

void bind_train(pb::module_& m) {
  static const TrainOptions kDefaults;
  pb::class_<PyTrainer>(m, "Trainer",
                        "The training loop of `clattn train`: a task, a model (fresh or from a checkpoint), "
                        "AdamW, held-out evaluation, checkpoints and exact resumption")
      .def(pb::init([](const std::string& task, const std::string& data, const std::string& init, const std::string& attention,
                       int64_t layers, int64_t dim, int64_t heads, int64_t ff, int64_t seq, int64_t batch, int64_t steps,
                       double lr, double min_lr, int64_t warmup, double clip, double weight_decay, double dropout,
                       int64_t eval_every, int64_t eval_examples, const std::string& checkpoint, const std::string& log,
                       bool resume, double time_budget, uint64_t seed, int64_t min_length, int64_t max_length,
                       double mask_prob, bool data_parallel, bool reproducible, bool shard_optimizer, int sequence_ranks,
                       int64_t accum, bool overlap) {
             TrainOptions o;
             o.task.kind = task;
             o.task.data = data;
             o.task.seed = seed;
             o.task.min_length = min_length;
             o.task.max_length = max_length;
             o.task.mask_prob = static_cast<float>(mask_prob);
             o.init = init;
             o.attention = attention;
             o.layers = layers;
             o.dim = dim;
             o.heads = heads;
             o.ff = ff;
             o.seq = seq;
             o.batch = batch;
             o.steps = steps;
             o.lr = lr;
             o.min_lr = min_lr;
             o.warmup = warmup;
             o.clip = clip;
             o.weight_decay = weight_decay;
             o.dropout = dropout;
             o.eval_every = eval_every;
             o.eval_examples = eval_examples;
             o.checkpoint = checkpoint;
             o.log = log;
             o.resume = resume;
             o.time_budget = time_budget;
             // Under mpirun every rank's script makes the same Trainer; they share each step's batch,
             // and with sequence_ranks S > 1 groups of S ranks split each sequence (-1: all ranks).
             check(sequence_ranks >= -1, "train: sequence_ranks must be >= -1 (-1: all ranks), got ", sequence_ranks);
             if (data_parallel || sequence_ranks != 0) o.comm = &world();
             o.sequence_ranks = sequence_ranks < 0 ? world().size() : sequence_ranks;
             o.reproducible = reproducible;
             o.shard_optimizer = shard_optimizer;
             o.accum = accum;
             o.overlap = overlap;
             o.version = CLATTN_VERSION;
             o.commit = "python";
             o.threads = default_threads();
             auto p = std::make_unique<PyTrainer>();
             pb::gil_scoped_release nogil;
             apply_threads();
             p->t = std::make_unique<Trainer>(o);
             return p;
           }),
           // The defaults are TrainOptions' own (kDefaults), so the command line and Python cannot drift.
           pb::arg("task"), pb::arg("data") = kDefaults.task.data, pb::arg("init") = kDefaults.init,
           pb::arg("attention") = kDefaults.attention, pb::arg("layers") = kDefaults.layers, pb::arg("dim") = kDefaults.dim,
           pb::arg("heads") = kDefaults.heads, pb::arg("ff") = kDefaults.ff, pb::arg("seq") = kDefaults.seq,
           pb::arg("batch") = kDefaults.batch, pb::arg("steps") = kDefaults.steps, pb::arg("lr") = kDefaults.lr,
           pb::arg("min_lr") = kDefaults.min_lr, pb::arg("warmup") = kDefaults.warmup, pb::arg("clip") = kDefaults.clip,
           pb::arg("weight_decay") = kDefaults.weight_decay, pb::arg("dropout") = kDefaults.dropout,
           pb::arg("eval_every") = kDefaults.eval_every, pb::arg("eval_examples") = kDefaults.eval_examples,
           pb::arg("checkpoint") = kDefaults.checkpoint, pb::arg("log") = kDefaults.log, pb::arg("resume") = kDefaults.resume,
           pb::arg("time_budget") = kDefaults.time_budget, pb::arg("seed") = kDefaults.task.seed,
           pb::arg("min_length") = kDefaults.task.min_length, pb::arg("max_length") = kDefaults.task.max_length,
           pb::arg("mask_prob") = std::stod(std::to_string(kDefaults.task.mask_prob)),  // 0.15, as typed
           pb::arg("data_parallel") = false,
           pb::arg("reproducible") = kDefaults.reproducible, pb::arg("shard_optimizer") = kDefaults.shard_optimizer,
           pb::arg("sequence_ranks") = kDefaults.sequence_ranks, pb::arg("accum") = kDefaults.accum,
           pb::arg("overlap") = kDefaults.overlap,
           "Trainer(task, data=..., init=checkpoint folder or '', attention='full', sizes of a fresh model, seq=0 "
           "(the task's or checkpoint's own, else 512), batch, steps, lr, ..., checkpoint='', log='', resume=False)")
      .def("run", [](PyTrainer& p) {
             if (!p.progress) return run_locked(p, [&] { return p.t->run(); });
             const pb::object err = pb::module_::import("sys").attr("stderr");
             const bool live = !err.is_none() && pb::hasattr(err, "isatty") && err.attr("isatty")().cast<bool>();
             TrainReport report(*p.t, live);
             const std::string stop = run_locked(p, [&] { return p.t->run(); }, &report);
             to_stderr(report.finish(stop));
             return stop;
           },
           "Train until `steps` or the time budget, evaluating every eval_every steps and at the end; returns "
           "'steps' or 'time_budget'. With `progress` (the default) it reports on sys.stderr as `clattn train` "
           "does: step, loss, lr, steps/s and ETA about once a second (rewritten in place on a terminal), and "
           "each evaluation")
      .def_readwrite("progress", &PyTrainer::progress,
                     "Whether run() reports its progress on sys.stderr (True by default, as `clattn train`)")
      .def("step", [](PyTrainer& p) {
             const StepReport r = run_locked(p, [&] { return p.t->step(); });
             return step_dict(r);
           }, "One optimizer step: {'step', 'loss', 'lr', 'ms', 'tokens_per_s', 'grad_norm', ...}")
      .def("evaluate", [](PyTrainer& p) {
             const EvalReport r = run_locked(p, [&] { return p.t->evaluate(); });
             return eval_dict(r, p.t->metric());
           }, "Held-out evaluation (logged, checkpointed): {'step', 'loss', 'metric', 'value', 'improved', ...}")
      .def("save_model", [](PyTrainer& p, const std::string& dir) {
             run_locked(p, [&] { p.t->save_model(dir); });
           }, pb::arg("dir"),
           "The model as a folder (config.json, model.safetensors and, for text tasks, tokenizer.json), loadable "
           "by load_model")
      .def_readwrite("on_step", &PyTrainer::on_step, "Called with each step's dict (or None)")
      .def_readwrite("on_eval", &PyTrainer::on_eval, "Called with each evaluation's dict (or None)")
      .def_property_readonly("steps_done", [](PyTrainer& p) { return p.t->steps_done(); })
      .def_property_readonly("start_step", [](PyTrainer& p) { return p.t->start_step(); })
      .def_property_readonly("resumed", [](PyTrainer& p) { return p.t->resumed(); })
      .def_property_readonly("elapsed_s", [](PyTrainer& p) { return p.t->elapsed_s(); })
      .def_property_readonly("best_metric", [](PyTrainer& p) { return p.t->best_metric(); })
      .def_property_readonly("best_step", [](PyTrainer& p) { return p.t->best_step(); })
      .def_property_readonly("metric", [](PyTrainer& p) { return p.t->metric(); })
      .def_property_readonly("seq", [](PyTrainer& p) { return p.t->options().seq; })
      .def_property_readonly("parameters", [](PyTrainer& p) { return p.t->model().params().size(); })
      .def("__repr__", [](PyTrainer& p) {
        return "clattn.Trainer(" + p.t->task().name() + ", " + p.t->options().attention + ", step " +
               std::to_string(p.t->steps_done()) + "/" + std::to_string(p.t->options().steps) + ")";
      });

  m.def(
      "evaluate",
      [](const std::string& checkpoint, std::optional<std::vector<std::string>> attention,
         std::optional<std::string> task, std::optional<std::string> data, std::optional<int64_t> seq,
         std::optional<uint64_t> seed, std::optional<int64_t> batch, std::optional<int64_t> min_length,
         std::optional<int64_t> max_length, std::optional<double> mask_prob, int64_t eval_examples) {
        CheckpointEvalOptions o;
        o.checkpoint = checkpoint;
        if (attention) o.attention = *attention;
        o.task = task;
        o.data = data;
        o.seq = seq;
        o.seed = seed;
        o.batch = batch;
        o.min_length = min_length;
        o.max_length = max_length;
        o.mask_prob = mask_prob;
        o.eval_examples = eval_examples;
        const CheckpointEval ev = [&] {
          pb::gil_scoped_release nogil;
          apply_threads();
          return evaluate_checkpoint(o);
        }();
        pb::list rows;
        for (size_t i = 0; i < ev.plans.size(); ++i) {
          pb::dict d;
          d["attention"] = ev.plans[i];
          d["loss"] = ev.results[i].loss;
          d["value"] = ev.results[i].metric;
          d["examples"] = ev.results[i].examples;
          d["targets"] = ev.results[i].targets;
          d["seconds"] = ev.results[i].seconds;
          rows.append(d);
        }
        pb::dict out;
        out["checkpoint"] = ev.folder;
        out["task"] = ev.task;
        out["metric"] = ev.metric;
        out["seq"] = ev.seq;
        out["batch"] = ev.batch;
        out["results"] = rows;
        return out;
      },
      pb::arg("checkpoint"), pb::kw_only(), pb::arg("attention") = pb::none(), pb::arg("task") = pb::none(),
      pb::arg("data") = pb::none(), pb::arg("seq") = pb::none(), pb::arg("seed") = pb::none(),
      pb::arg("batch") = pb::none(), pb::arg("min_length") = pb::none(), pb::arg("max_length") = pb::none(),
      pb::arg("mask_prob") = pb::none(), pb::arg("eval_examples") = 0,
      "`clattn eval` from Python: a checkpoint (a model folder, or a run folder: its best/, else latest/) on its "
      "task's held-out set with each attention plan (default: the one it was trained with). Task options left "
      "None are the training run's own (train_state.json). Returns {'checkpoint', 'task', 'metric', 'seq', "
      "'batch', 'results': [{'attention', 'loss', 'value', 'examples', 'targets', 'seconds'}]}");
}

}  // namespace clattn::py
