// Training and evaluation data (docs/design.md §1, layer "data"): the tasks `clattn train` knows,
// as batches of padded token sequences with per-example lengths.
//
// Determinism: the training batch of step s is a pure function of (task, seed, s) — never of how
// many batches were drawn before — so a resumed run sees exactly the batches of an uninterrupted
// one. Evaluation batches are a fixed, held-out set (fixed by the seed too).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace clattn {

// One batch: B sequences padded to T tokens.
struct Batch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> ids;      // (B, T) token ids, padding = the task's pad id
  std::vector<int32_t> lengths;  // (B) valid tokens per sequence, 1..T
  // classify: (B) labels. mlm / lm: (B, T) target per position, -1 where no loss is taken
  // (padding; for mlm the unmasked positions).
  std::vector<int32_t> targets;
};

enum class TaskKind { classify, mlm, lm };

class Task {
 public:
  virtual ~Task() = default;
  virtual TaskKind kind() const = 0;
  virtual std::string name() const = 0;        // "listops", "mlm", "lm"
  virtual int64_t vocab() const = 0;           // ids lie in [0, vocab)
  virtual int64_t classes() const = 0;         // classify: labels in [0, classes); else vocab()
  virtual int32_t pad_id() const = 0;
  virtual std::string decode(int32_t id) const = 0;  // a token's text, for logs and tests
  // Training batch of `step` (see Determinism). T is the sequence length asked for: mlm / lm
  // windows are exactly T; listops pads each batch to T (longer expressions are not drawn).
  virtual Batch train_batch(int64_t B, int64_t T, uint64_t step) const = 0;
  // The held-out set, cut into batches of B (the last one may be smaller); at most `limit`
  // examples (0 = all).
  virtual std::vector<Batch> eval_batches(int64_t B, int64_t T, int64_t limit) const = 0;
};

struct TaskOptions {
  std::string kind;       // "listops" | "mlm" | "lm"
  std::string data;       // listops: a TSV (label<TAB>expression) for evaluation, or "" for a
                          // generated held-out set; mlm / lm: a text file (the last 10 % held out)
  uint64_t seed = 0;
  int64_t min_length = 500, max_length = 2000;  // listops generator length window (tokens)
  float mask_prob = 0.15f;                      // mlm
};

// Builds a task; errors (clattn::Error) name the file, line and problem.
std::unique_ptr<Task> make_task(const TaskOptions& opt);

}  // namespace clattn
