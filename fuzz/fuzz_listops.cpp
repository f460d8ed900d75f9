// The ListOps TSV reader (src/data): any file must give batches whose tokens, lengths and labels
// are in range, or a clattn::Error naming file:line — never a crash, and never an evaluator that
// recurses without bound on nested brackets.
#include <cstdint>

#include "clattn/data.h"
#include "clattn/error.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace clattn;
  const fuzz::MemFile file(data, size);
  try {
    TaskOptions opt;
    opt.kind = "listops";
    opt.data = file.path();
    opt.min_length = 1;
    opt.max_length = 64;
    const std::unique_ptr<Task> task = make_task(opt);
    for (const Batch& b : task->eval_batches(4, 64, 16)) {
      for (int32_t id : b.ids)
        if (id < 0 || id >= task->vocab()) __builtin_trap();
      for (int32_t len : b.lengths)
        if (len < 1 || len > b.T) __builtin_trap();
      for (int32_t y : b.targets)
        if (y < -1 || y >= task->classes()) __builtin_trap();
    }
  } catch (const Error&) {
  }
  return 0;
}
