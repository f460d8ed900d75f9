// ListOps (include/clattn/data.h): evaluator, tokenizer, the LRA generator and the task.
// Random streams of Rng(seed): training example (step, row) draws from stream step at indices
// row·2^40 + k; held-out example i from stream 2^63 + i. Steps are < 2^63, so the two never meet.
#include "data/listops.h"

#include <algorithm>
#include <array>
#include <string>

#include "clattn/error.h"
#include "data/tasks.h"

namespace clattn::listops {

namespace {

constexpr std::array<const char*, 4> kOpNames = {"[MIN", "[MAX", "[MED", "[SM"};
constexpr uint64_t kEvalStream = uint64_t{1} << 63;
constexpr uint64_t kRowStride = uint64_t{1} << 40;
constexpr int64_t kMaxRows = int64_t{1} << 23;  // rows per batch the stream layout allows
constexpr int64_t kGeneratedEval = 1000;         // held-out examples without a TSV
constexpr int64_t kMaxAttempts = 1000000;        // rejection attempts before the window is refused

// MIN, MAX, MED (int(np.median): the mean of the two middle values truncated when even), SM.
int apply(int32_t op, int* a, int n) {
  switch (op) {
    case kMin: return *std::min_element(a, a + n);
    case kMax: return *std::max_element(a, a + n);
    case kMed: {
      std::sort(a, a + n);
      return n % 2 ? a[n / 2] : (a[n / 2 - 1] + a[n / 2]) / 2;
    }
    default: {
      int s = 0;
      for (int i = 0; i < n; ++i) s += a[i];
      return s % 10;
    }
  }
}

// Sequential draws of one stream, from counter index `next`.
struct Draws {
  const Rng& rng;
  uint64_t stream, next;
  float uniform() { return rng.uniform(stream, next++); }
  int below(int n) { return static_cast<int>(rng.below(static_cast<uint64_t>(n), stream, next++)); }
};

// Appends the subtree of a node at `depth` (the root is depth 1, as in LRA's generate_tree) and
// returns its value, or -1 as soon as `out` grows past max_len (the attempt is rejected anyway).
int grow(Draws& d, int depth, int64_t max_len, std::vector<int32_t>& out) {
  if (static_cast<int64_t>(out.size()) >= max_len) return -1;
  if (depth >= kMaxDepth || d.uniform() < kLeafProb) {
    const int v = d.below(10);
    out.push_back(kDigit0 + v);
    return v;
  }
  const int32_t op = kMin + d.below(4);
  const int n = 2 + d.below(kMaxArgs - 1);  // randint(2, max_args)
  out.push_back(op);
  int args[kMaxArgs];
  for (int i = 0; i < n; ++i) {
    args[i] = grow(d, depth + 1, max_len, out);
    if (args[i] < 0) return -1;
  }
  if (static_cast<int64_t>(out.size()) >= max_len) return -1;
  out.push_back(kEnd);
  return apply(op, args, n);
}

}  // namespace

std::string token_text(int32_t id) {
  if (id == kPad) return "<pad>";
  if (id >= kDigit0 && id < kDigit0 + 10) return std::string(1, static_cast<char>('0' + id - kDigit0));
  if (id >= kMin && id <= kSm) return kOpNames[static_cast<size_t>(id - kMin)];
  if (id == kEnd) return "]";
  return detail::concat("<", id, "?>");
}

int evaluate(const int32_t* ids, int64_t n) {
  // vals holds the arguments of every open operator, frames (op, first argument) the operators.
  std::vector<int> vals;
  std::vector<std::pair<int32_t, size_t>> frames;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = ids[i];
    check(!(frames.empty() && !vals.empty()), "listops: token ", i, " ('", token_text(t),
          "') follows a complete expression");
    if (t >= kDigit0 && t < kDigit0 + 10) {
      vals.push_back(t - kDigit0);
    } else if (t >= kMin && t <= kSm) {
      frames.emplace_back(t, vals.size());
    } else if (t == kEnd) {
      check(!frames.empty(), "listops: token ", i, " (']') closes no operator");
      const auto [op, from] = frames.back();
      frames.pop_back();
      const int count = static_cast<int>(vals.size() - from);
      check(count >= 1, "listops: token ", i, " (']') closes ", token_text(op), " with no argument");
      const int v = apply(op, vals.data() + from, count);
      vals.resize(from);
      vals.push_back(v);
    } else {
      fail("listops: token ", i, " has id ", t, ", not a digit, an operator or ']'");
    }
  }
  check(frames.empty(), "listops: ", frames.size(), " operator(s) left open at the end");
  check(vals.size() == 1, "listops: an expression is one value, found ", vals.size());
  return vals[0];
}

bool tokenize(std::string_view text, std::vector<int32_t>& out, std::string& bad) {
  out.clear();
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t' || text[i] == '\r')) ++i;
    size_t j = i;
    while (j < text.size() && text[j] != ' ' && text[j] != '\t' && text[j] != '\r') ++j;
    if (j == i) break;
    const std::string_view tok = text.substr(i, j - i);
    i = j;
    if (tok == "(" || tok == ")") continue;
    if (tok.size() == 1 && tok[0] >= '0' && tok[0] <= '9') {
      out.push_back(kDigit0 + (tok[0] - '0'));
    } else if (tok == "]") {
      out.push_back(kEnd);
    } else {
      const auto it = std::find(kOpNames.begin(), kOpNames.end(), tok);
      if (it == kOpNames.end()) {
        bad = std::string(tok);
        return false;
      }
      out.push_back(kMin + static_cast<int32_t>(it - kOpNames.begin()));
    }
  }
  return true;
}

int generate(const Rng& rng, uint64_t stream, uint64_t first, int64_t min_len, int64_t max_len,
             std::vector<int32_t>& out) {
  check(min_len >= 1 && min_len <= max_len, "listops: bad length window [", min_len, ", ", max_len, "]");
  Draws d{rng, stream, first};
  for (int64_t attempt = 0; attempt < kMaxAttempts; ++attempt) {
    out.clear();
    const int v = grow(d, 1, max_len, out);
    if (v >= 0 && static_cast<int64_t>(out.size()) >= min_len) return v;
  }
  fail("listops: no expression of ", min_len, " to ", max_len, " tokens in ", kMaxAttempts,
       " attempts: widen the length window");
}

namespace {

struct Example {
  std::vector<int32_t> ids;
  int label;
};

class ListOpsTask final : public Task {
 public:
  explicit ListOpsTask(const TaskOptions& opt) : opt_(opt), rng_(opt.seed) {
    check(opt.min_length >= 1 && opt.min_length <= opt.max_length,
          "listops: the length window must satisfy 1 <= min <= max, got [", opt.min_length, ", ",
          opt.max_length, "]");
    if (!opt.data.empty()) read_tsv(opt.data);
  }
  TaskKind kind() const override { return TaskKind::classify; }
  std::string name() const override { return "listops"; }
  int64_t vocab() const override { return kVocab; }
  int64_t classes() const override { return 10; }
  int32_t pad_id() const override { return kPad; }
  std::string decode(int32_t id) const override { return token_text(id); }

  void check_length(int64_t T) const override {
    check(T >= 1, "listops: the sequence length must be >= 1, got ", T);
    check(T >= opt_.min_length, "listops: sequence length ", T,
          " is shorter than the generator's minimum expression length ", opt_.min_length,
          " (lower the minimum or raise the length)");
  }

  Batch train_batch(int64_t B, int64_t T, uint64_t step) const override {
    check_length(T);
    check(B >= 1 && B <= kMaxRows, "listops: batch size must be in [1, ", kMaxRows, "], got ", B);
    check(step < kEvalStream, "listops: step ", step, " out of range");
    Batch b = empty_batch(B, T);
    std::vector<int32_t> ex;
    for (int64_t r = 0; r < B; ++r) {
      // Each row is its own slice of the step's stream: row r never depends on the rows before it.
      const int label = generate(rng_, step, static_cast<uint64_t>(r) * kRowStride, opt_.min_length,
                                 std::min(opt_.max_length, T), ex);
      place(b, r, ex, label);
    }
    return b;
  }

  std::vector<Batch> eval_batches(int64_t B, int64_t T, int64_t limit) const override {
    check(T >= 1, "listops: the sequence length must be >= 1, got ", T);
    check(B >= 1, "listops: batch size must be >= 1, got ", B);
    std::vector<const Example*> chosen;
    std::vector<Example> generated;
    if (!opt_.data.empty()) {
      for (const Example& e : tsv_) {
        if (limit > 0 && static_cast<int64_t>(chosen.size()) >= limit) break;
        if (static_cast<int64_t>(e.ids.size()) <= T) chosen.push_back(&e);
      }
    } else {
      check_length(T);
      const int64_t n = limit > 0 ? std::min(limit, kGeneratedEval) : kGeneratedEval;
      generated.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        Example& e = generated[static_cast<size_t>(i)];
        e.label = generate(rng_, kEvalStream + static_cast<uint64_t>(i), 0, opt_.min_length,
                           std::min(opt_.max_length, T), e.ids);
      }
      for (const Example& e : generated) chosen.push_back(&e);
    }
    std::vector<Batch> out;
    for (size_t i = 0; i < chosen.size(); i += static_cast<size_t>(B)) {
      const int64_t rows = std::min<int64_t>(B, static_cast<int64_t>(chosen.size() - i));
      Batch b = empty_batch(rows, T);
      for (int64_t r = 0; r < rows; ++r) {
        const Example& e = *chosen[i + static_cast<size_t>(r)];
        place(b, r, e.ids, e.label);
      }
      out.push_back(std::move(b));
    }
    return out;
  }

  int64_t eval_skipped(int64_t T) const override {
    int64_t n = 0;
    for (const Example& e : tsv_) n += static_cast<int64_t>(e.ids.size()) > T;
    return n;
  }

 private:
  static Batch empty_batch(int64_t B, int64_t T) {
    Batch b;
    b.B = B;
    b.T = T;
    b.ids.assign(static_cast<size_t>(B * T), kPad);
    b.lengths.assign(static_cast<size_t>(B), 0);
    b.targets.assign(static_cast<size_t>(B), 0);
    return b;
  }

  static void place(Batch& b, int64_t r, const std::vector<int32_t>& ex, int label) {
    std::copy(ex.begin(), ex.end(), b.ids.begin() + r * b.T);
    b.lengths[static_cast<size_t>(r)] = static_cast<int32_t>(ex.size());
    b.targets[static_cast<size_t>(r)] = label;
  }

  // label<TAB>expression per line, or with a "Source<TAB>Target" header (LRA's files)
  // expression<TAB>label. Blank lines are skipped.
  void read_tsv(const std::string& path) {
    const std::string text = data::read_file_bytes(path);
    std::vector<int32_t> ids;
    std::string bad;
    bool expr_first = false;
    int64_t line_no = 0;
    for (size_t pos = 0; pos < text.size();) {
      size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();
      std::string_view line(text.data() + pos, end - pos);
      pos = end + 1;
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
      if (line_no == 1 && line == "Source\tTarget") {
        expr_first = true;
        continue;
      }
      const size_t tab = line.find('\t');
      check(tab != std::string_view::npos && line.find('\t', tab + 1) == std::string_view::npos,
            path, ":", line_no, ": expected two tab-separated fields (",
            expr_first ? "expression, label" : "label, expression", ")");
      std::string_view label = line.substr(0, tab), expr = line.substr(tab + 1);
      if (expr_first) std::swap(label, expr);
      while (!label.empty() && label.front() == ' ') label.remove_prefix(1);
      while (!label.empty() && label.back() == ' ') label.remove_suffix(1);
      check(label.size() == 1 && label[0] >= '0' && label[0] <= '9', path, ":", line_no,
            ": the label must be one digit 0-9, got '", std::string(label), "'");
      check(tokenize(expr, ids, bad), path, ":", line_no, ": unknown token '", bad,
            "' (expected ( ) [MIN [MAX [MED [SM ] or a digit)");
      check(!ids.empty(), path, ":", line_no, ": empty expression");
      try {
        evaluate(ids);  // well-formedness; the labels are the file's
      } catch (const Error& e) {
        fail(path, ":", line_no, ": malformed expression: ", e.what());
      }
      tsv_.push_back({ids, label[0] - '0'});
    }
    check(!tsv_.empty(), path, ": no examples (expected lines label<TAB>expression)");
  }

  TaskOptions opt_;
  Rng rng_;
  std::vector<Example> tsv_;
};

}  // namespace

}  // namespace clattn::listops

namespace clattn::data {
std::unique_ptr<Task> make_listops_task(const TaskOptions& opt) {
  return std::make_unique<listops::ListOpsTask>(opt);
}
}  // namespace clattn::data
