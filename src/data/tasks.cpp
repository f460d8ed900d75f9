// make_task (include/clattn/data.h) and the file reading the tasks share.
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <type_traits>

#include "clattn/error.h"
#include "clattn/input_file.h"
#include "data/tasks.h"

namespace clattn {

namespace data {

std::string read_file_bytes(const std::string& path) {
  check(!path.empty(), "data: no file given");
  return read_input_file(path, "data", kMaxDataBytes);
}

}  // namespace data

std::unique_ptr<Task> make_task(const TaskOptions& opt) {
  check(opt.tokenizer.empty() || opt.kind == "lm", "data: a tokenizer applies to the lm task only (", opt.kind,
        " reads bytes)");
  if (opt.kind == "listops") return data::make_listops_task(opt);
  if (opt.kind == "mlm" || opt.kind == "lm")
    check(!opt.data.empty(), opt.kind, ": needs a text file to read (data)");
  if (opt.kind == "mlm") return data::make_text_task(opt, TaskKind::mlm);
  if (opt.kind == "lm") return data::make_text_task(opt, TaskKind::lm);
  if (opt.kind == "features") return data::make_features_task(opt);
  fail("data: unknown task '", opt.kind, "' (expected listops, mlm, lm or features)");
}

TaskKind task_head(const std::string& task, const char* who) {
  if (task == "listops" || task == "features") return TaskKind::classify;
  if (task == "mlm") return TaskKind::mlm;
  if (task == "lm") return TaskKind::lm;
  fail(who, ": unknown task '", task, "' (expected listops, mlm, lm or features)");
}

const char* task_kind_name(TaskKind k) {
  switch (k) {
    case TaskKind::classify: return "classify";
    case TaskKind::mlm: return "mlm";
    case TaskKind::lm: return "lm";
  }
  return "?";
}

TaskKind task_kind_from_name(const std::string& s) {
  if (s == "classify") return TaskKind::classify;
  if (s == "mlm") return TaskKind::mlm;
  if (s == "lm") return TaskKind::lm;
  fail("unknown task head '", s, "' (classify, mlm, lm)");
}

Batch batch_slice(const Batch& b, int64_t from, int64_t n) {
  check(from >= 0 && n >= 1 && from + n <= b.B, "batch_slice: rows [", from, ", ", from + n, ") are outside the batch of ",
        b.B);
  Batch s;
  s.B = n;
  s.T = b.T;
  s.first = b.first + from;
  s.feature_dim = b.feature_dim;
  auto part = [&](const auto& v, int64_t per_row) {
    using T = typename std::decay_t<decltype(v)>::value_type;
    if (v.empty()) return std::vector<T>{};
    return std::vector<T>(v.begin() + from * per_row, v.begin() + (from + n) * per_row);
  };
  s.ids = part(b.ids, b.T);
  s.lengths = part(b.lengths, 1);
  s.targets = part(b.targets, static_cast<int64_t>(b.targets.size()) == b.B ? 1 : b.T);
  s.features = part(b.features, b.T * b.feature_dim);
  return s;
}

}  // namespace clattn
