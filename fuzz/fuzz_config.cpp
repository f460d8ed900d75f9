// config.json of a checkpoint: read_model_config must refuse anything it cannot use with a
// clattn::Error naming the field.
#include <cstdint>

#include "clattn/error.h"
#include "clattn/model.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace clattn;
  const fuzz::MemFile file(data, size);
  try {
    (void)read_model_config(file.path());
  } catch (const Error&) {
  }
  return 0;
}
