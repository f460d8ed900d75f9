// Safetensors (Hugging Face) reading and writing: an 8-byte little-endian header length, a JSON
// header {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
// then the data buffer. Reading validates everything a lying or truncated file can get wrong and
// throws clattn::Error naming the file, the tensor and the broken rule. Writing is atomic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "clattn/tensor.h"

namespace clattn {

// Every dtype of the Hugging Face format, so any valid file opens; the getters convert a subset.
enum class DType { F32, F16, BF16, I32, I64, U8, I8, F64, BOOL, I16, U16, U32, U64, F8_E4M3, F8_E5M2 };
const char* dtype_name(DType t);  // "F32", ...
size_t dtype_size(DType t);       // bytes per element: 4 for F32, 2 for F16, ...

struct TensorInfo {
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data buffer
};

class SafetensorsFile {
 public:
  // Reads and validates path. The file is read whole into memory, never mapped: a mapped file
  // truncated by another process would raise SIGBUS; a file that changes while being read is an Error.
  static SafetensorsFile open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;

  const std::string& path() const { return path_; }
  bool has(const std::string& name) const { return infos_.count(name) != 0; }
  std::vector<std::string> names() const;  // sorted
  const TensorInfo& info(const std::string& name) const;  // throws if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // F32, F16 and BF16 tensors as float32. Throws on other dtypes or when absent.
  Tensor get_f32(const std::string& name) const;
  // An F32 tensor's data in place in the file's bytes held by this object (valid while it lives),
  // or nullptr when it is another dtype or not 4-byte aligned in the file (then get_f32 copies it).
  const float* mapped_f32(const std::string& name) const;
  // A tensor's bytes as the file stores them (info() says the dtype), valid while this lives;
  // only byte-aligned, so read them with memcpy.
  const uint8_t* bytes(const std::string& name) const { return map_ + data_start_ + info(name).begin; }
  // I32 (or I64 whose values fit) tensors as int32, flattened; shape via info().
  std::vector<int32_t> get_i32(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  std::map<std::string, TensorInfo> infos_;
  std::map<std::string, std::string> metadata_;
  const uint8_t* map_ = nullptr;  // the whole file, read at open() (64-byte aligned, malloc'd)
  size_t map_size_ = 0;
  size_t data_start_ = 0;         // 8 + header length
};

class SafetensorsWriter {
 public:
  void add(const std::string& name, ConstView t);  // F32, any strides; copied now
  void add_i32(const std::string& name, const std::vector<int64_t>& shape,
               std::span<const int32_t> values);
  void set_metadata(const std::string& key, const std::string& value);
  // Writes an exclusive temporary beside path, fsyncs, renames over path (include/clattn/atomic_file.h):
  // readers never see a half-written file.
  void write(const std::string& path) const;

 private:
  struct Entry {
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace clattn
