// Training and evaluation data (docs/design.md §1, layer "data"): the tasks `clattn train` knows,
// as batches of padded token sequences with per-example lengths.
//
// Determinism: the training batch of step s is a pure function of (task, seed, s) — never of how
// many batches were drawn before — so a resumed run sees exactly the batches of an uninterrupted
// one. Evaluation batches are a fixed, held-out set (fixed by the seed too).
//
// The tasks (src/data/):
//   listops  Long Range Arena ListOps (Tay et al. 2021; grammar of Nangia & Bowman 2018).
//            Vocabulary (16): 0 pad, 1..10 the digits 0..9, 11 [MIN, 12 [MAX, 13 [MED, 14 [SM,
//            15 ']'. The binarising parentheses of the Nangia/LRA files are dropped, as LRA's input
//            pipeline does: "( ( [MAX 2 ) 9 ) ] )" and "[MAX 2 9 ]" are the same expression, the
//            prefix form with ']' is unambiguous, and sequences are ~3x shorter. Generator and TSV
//            reader produce the same tokens. Labels 0..9: MIN, MAX, MED = int(np.median(args))
//            (even count: the mean of the two middle values, truncated), SM = sum mod 10 — the
//            definitions of LRA's listops.py; all 10,000 labels of test_d20s.tsv agree (a test).
//            Generator (LRA's generate_tree): at depth < 10 a node is a leaf (a uniform digit) with
//            probability 0.75, otherwise an operator (uniform of 4) over 2..10 (uniform) arguments;
//            at depth 10 always a leaf; a tree is kept when its token count (operators, digits,
//            ']') lies in [min_length, min(max_length, T)] — inclusive, where LRA's is strict.
//            Held-out: the TSV given as `data` (examples longer than T skipped, eval_skipped says
//            how many), or without one 1,000 generated examples drawn apart from training ones.
//   mlm      masked character modelling over a text file. Vocabulary (258): ids 0..255 the bytes,
//            256 pad, 257 mask. A training window is T consecutive bytes of the first 90 % of the
//            file, its start drawn from (seed, step, row). Exactly max(1, round(mask_prob·T))
//            positions per window are targets (chosen uniformly without replacement); as in BERT
//            each is replaced by mask with probability 0.8, a uniform random byte with 0.1, and
//            kept with 0.1. targets = the original byte there, -1 elsewhere. The loss (and bits
//            per character = nats / ln 2) is taken on all target positions.
//   lm       causal character LM over a text file, the same bytes and split: a window is T + 1
//            bytes, ids = window[0, T), targets = window[1, T].
//   Held-out text: the last 10 % of the file (floor(size/10) bytes), never touched by a training
//   window; evaluation windows tile it from its start with stride T (mlm: T bytes, lm: T + 1),
//   masks drawn once from the seed.
//   Byte-level checkpoints carry Tokenizer::byte_tokenizer_json() as their tokenizer.json (ids =
//            bytes, 256 pad, 257 mask, nothing added); reading it back keeps the byte mode.
//   lm with a tokenizer: the same split (moved forward to a UTF-8 character boundary), each part
//            tokenized without BOS/EOS; windows of token ids as above; metric bits per token.
//   features classification of feature frames (a KWT feature set: features [n, T, dim], labels
//            [n]): a fixed permutation of the examples (stream 2^62 of Rng(0), independent of the
//            seed) puts the last 10 % (at least one) in the held-out set; training row r of step s
//            is example below(train count) drawn from (seed, s, r). Sequences are exactly T frames.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace clattn {

// One batch: B sequences padded to T tokens (or, for feature models, T frames of features).
struct Batch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> ids;      // (B, T) token ids, padding = the task's pad id
  std::vector<int32_t> lengths;  // (B) valid tokens per sequence, 1..T
  // classify: (B) labels. mlm / lm: (B, T) target per position, -1 where no loss is taken
  // (padding; for mlm the unmasked positions).
  std::vector<int32_t> targets;
  // Feature models (KWT): (B, T, feature_dim) frames instead of ids (ids empty).
  std::vector<float> features;
  int64_t feature_dim = 0;
  // Index of the first sequence in its step's whole batch: a part of a batch (a rank's share, an
  // accumulation micro-batch) draws the dropout masks of its own sequences.
  int64_t first = 0;
};

// The rows [from, from + n) of a batch, with `first` advanced to match.
Batch batch_slice(const Batch& b, int64_t from, int64_t n);

enum class TaskKind { classify, mlm, lm };
const char* task_kind_name(TaskKind k);         // "classify", "mlm", "lm"
// The head a task trains: listops and features classify, mlm and lm their own; any other name is
// an Error "<who>: unknown task '...' (expected listops, mlm, lm or features)".
TaskKind task_head(const std::string& task, const char* who);
TaskKind task_kind_from_name(const std::string& s);  // an Error naming the accepted ones

class Task {
 public:
  virtual ~Task() = default;
  virtual TaskKind kind() const = 0;
  virtual std::string name() const = 0;        // "listops", "mlm", "lm"
  virtual int64_t vocab() const = 0;           // ids lie in [0, vocab)
  virtual int64_t classes() const = 0;         // classify: labels in [0, classes); else vocab()
  virtual int32_t pad_id() const = 0;
  virtual std::string decode(int32_t id) const = 0;  // a token's text, for logs and tests
  // Throws clattn::Error naming the problem unless batches of length T can be made (listops: the
  // length window must reach T; text: the file must hold a training and a held-out window).
  virtual void check_length(int64_t T) const = 0;
  // Training batch of `step` (see Determinism). T is the sequence length asked for: mlm / lm
  // windows are exactly T; listops pads each batch to T (longer expressions are not drawn).
  virtual Batch train_batch(int64_t B, int64_t T, uint64_t step) const = 0;
  // The held-out set, cut into batches of B (the last one may be smaller); at most `limit`
  // examples (0 = all).
  virtual std::vector<Batch> eval_batches(int64_t B, int64_t T, int64_t limit) const = 0;
  // Held-out examples left out of eval_batches because they are longer than T (listops TSV).
  virtual int64_t eval_skipped(int64_t /*T*/) const { return 0; }
  // The held-out metric: "accuracy" (classify), "bits_per_char" (byte-level text) or
  // "bits_per_token" (text through a tokenizer).
  virtual std::string metric() const { return kind() == TaskKind::classify ? "accuracy" : "bits_per_char"; }
  // Feature tasks: the frames' width (batches carry features, not ids); 0 for token tasks.
  virtual int64_t feature_dim() const { return 0; }
  // The sequence length the task's data fixes (feature sets: their frame count), or 0.
  virtual int64_t fixed_length() const { return 0; }
};

struct TaskOptions {
  std::string kind{};     // "listops" | "mlm" | "lm" | "features"
  std::string data{};     // listops: a TSV (label<TAB>expression) for evaluation, or "" for a
                          // generated held-out set; mlm / lm: a text file (the last 10 % held out);
                          // features: a feature set (safetensors: features [n, T, dim], labels [n])
  uint64_t seed = 0;
  int64_t min_length = 500, max_length = 2000;  // listops generator length window (tokens)
  float mask_prob = 0.15f;                      // mlm
  // lm: a tokenizer.json whose ids replace the bytes (a pretrained model's own vocabulary); each
  // part of the text (training, held-out) is tokenized on its own. "" = bytes.
  std::string tokenizer{};
};

// Builds a task; errors (clattn::Error) name the file, line and problem.
std::unique_ptr<Task> make_task(const TaskOptions& opt);

}  // namespace clattn
