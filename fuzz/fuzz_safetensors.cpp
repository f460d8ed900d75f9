// Safetensors files, header and data: open() must refuse a malformed file with a clattn::Error;
// every tensor of a file it accepts must then read (get_f32 / get_i32 / mapped_f32) in bounds.
#include <cstdint>

#include "clattn/error.h"
#include "clattn/safetensors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace clattn;
  const fuzz::MemFile file(data, size);
  try {
    const SafetensorsFile f = SafetensorsFile::open(file.path());
    for (const std::string& name : f.names()) {
      const TensorInfo& info = f.info(name);
      try {
        if (info.dtype == DType::I32 || info.dtype == DType::I64) {
          (void)f.get_i32(name);
        } else {
          const Tensor t = f.get_f32(name);
          if (const float* p = f.mapped_f32(name); p && t.numel() > 0) {
            volatile float sink = p[t.numel() - 1];
            (void)sink;
          }
        }
      } catch (const Error&) {
      }
    }
  } catch (const Error&) {
  }
  return 0;
}
