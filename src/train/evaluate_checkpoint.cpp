// evaluate_checkpoint (train.h): `clattn eval` and clattn.evaluate, one implementation.
#include <algorithm>
#include <filesystem>

#include "clattn/cpu.h"
#include "clattn/error.h"
#include "clattn/input_file.h"
#include "clattn/train.h"
#include "train/run_files.h"

namespace clattn {

namespace fs = std::filesystem;

namespace {

using train::kMaxCount;

// The model folder of a checkpoint: the folder itself when it holds config.json, else its best/,
// else its latest/.
fs::path model_folder(const std::string& dir) {
  const fs::path d = dir;
  for (const fs::path& c : {d, d / "best", d / "latest"})
    if (fs::exists(c / "config.json")) return c;
  fail("eval: '", dir, "' holds no checkpoint (config.json in it, in best/ or in latest/)");
}

// The options left unset, from the run's train_state.json "args" (when the folder has one).
CheckpointEvalOptions with_run_args(CheckpointEvalOptions o, const fs::path& folder) {
  const std::string path = (folder / "train_state.json").string();
  if (!input_exists(path)) return o;
  const nlohmann::json args = train::read_train_state_json(path)["args"];
  const std::string& where = path;
  if (!o.task) o.task = train::args_text(args, where, "task");
  if (!o.data) o.data = train::args_text(args, where, "data");
  if (!o.seed && args.contains("seed")) {
    // Seeds are unsigned 64-bit: above INT64_MAX only as an unsigned JSON integer.
    if (args["seed"].is_number_unsigned()) o.seed = args["seed"].get<uint64_t>();
    else o.seed = static_cast<uint64_t>(*train::args_integer(args, where, "seed", 0, INT64_MAX));
  }
  if (!o.seq) o.seq = train::args_integer(args, where, "seq", 1, kMaxCount);
  if (!o.min_length && !o.max_length) {
    o.min_length = train::args_integer(args, where, "min_length", 1, kMaxCount);
    o.max_length = train::args_integer(args, where, "max_length", 1, kMaxCount);
  }
  if (!o.mask_prob && args.contains("mask_prob")) {
    const nlohmann::json& v = args["mask_prob"];
    check(v.is_number() && v.get<double>() > 0 && v.get<double>() <= 1, "'", where,
          "': args field \"mask_prob\" must be a number in (0, 1], got ", v.dump());
    o.mask_prob = v.get<double>();
  }
  // The run's batch size too: the loss sums in the same order, so eval repeats the run's figures.
  if (!o.batch) o.batch = train::args_integer(args, where, "batch", 1, 1 << 20);
  return o;
}

}  // namespace

CheckpointEval evaluate_checkpoint(const CheckpointEvalOptions& given, const CheckpointEvalCallback& on_plan,
                                   const CheckpointEvalCallback& on_result) {
  check(given.eval_examples >= 0 && given.eval_examples <= kMaxCount, "eval: eval_examples must be in [0, ", kMaxCount,
        "] (0: the whole held-out set), got ", given.eval_examples);
  const fs::path folder = model_folder(given.checkpoint);
  const CheckpointEvalOptions o = with_run_args(given, folder);
  check(o.task && !o.task->empty(), "eval: a task is needed (", folder.string(),
        " has no train_state.json to read it from)");
  const TaskKind head = task_head(*o.task, "eval");
  const int64_t batch = o.batch.value_or(8);
  check(batch >= 1 && batch <= (1 << 20), "eval: batch must be in [1, 1048576], got ", batch);
  std::unique_ptr<Model> model = Model::load(folder.string());
  check(model->has_head() && model->head() == head, "eval: the checkpoint's head does not fit task '", *o.task, "'");
  TaskOptions to;
  to.kind = *o.task;
  to.data = o.data.value_or("");
  to.seed = o.seed.value_or(0);
  to.min_length = o.min_length.value_or(500);
  to.max_length = o.max_length.value_or(2000);
  to.mask_prob = static_cast<float>(o.mask_prob.value_or(0.15));
  // A language model reads its own tokens, as train --init does: its tokenizer, when it has one.
  if (*o.task == "lm" && fs::exists(folder / "tokenizer.json")) to.tokenizer = (folder / "tokenizer.json").string();
  const std::unique_ptr<Task> task = make_task(to);
  int64_t seq = o.seq.value_or(0);
  if (!given.seq && task->fixed_length() > 0) seq = task->fixed_length();
  if (seq == 0) seq = std::min<int64_t>(model->config().max_positions, 512);
  check(seq >= 1 && seq <= kMaxCount, "eval: seq must be in [1, ", kMaxCount, "], got ", seq);
  check(task->feature_dim() > 0 || task->vocab() <= model->config().vocab, "eval: task '", *o.task, "' has ",
        task->vocab(), " tokens but the model's vocabulary is ", model->config().vocab);
  const std::vector<Batch> batches = task->eval_batches(batch, seq, given.eval_examples);
  check(!batches.empty(), "eval: no held-out example fits seq ", seq);
  CheckpointEval out;
  out.folder = folder.string();
  out.task = *o.task;
  out.metric = task->metric();
  out.seq = seq;
  out.batch = batch;
  out.plans = given.attention;
  if (out.plans.empty()) out.plans.push_back(model->attention_plan());
  for (size_t i = 0; i < out.plans.size(); ++i) {
    model->set_attention(out.plans[i]);
    check_memory(model->train_bytes(batch, seq), "eval: " + out.plans[i]);
    if (on_plan) on_plan(out, i);
    out.results.push_back(evaluate(*model, batches, head == TaskKind::classify));
    if (on_result) on_result(out, i);
  }
  return out;
}

}  // namespace clattn
