// The tensors of a Hugging Face checkpoint folder: model.safetensors, or the sharded form named by
// model.safetensors.index.json, read into memory (never mapped: a file changed underneath cannot
// fault). F32 tensors are read in place; F16 and BF16 are converted to F32 once, on load, except
// where get16() takes a tensor's own 16-bit bits (a model's 16-bit linear weights). Every lookup
// states the shape the config implies, and a missing or misshapen tensor is an error naming the
// file and the tensor. The first lookup of a
// tensor also checks its values: a NaN or Inf weight is an error naming the file, the tensor and
// the index, never a model that runs and samples garbage.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "clattn/gemm.h"
#include "clattn/safetensors.h"
#include "clattn/tensor.h"

namespace clattn {

class Weights {
 public:
  static std::unique_ptr<Weights> open(const std::string& dir);
  // Weights held in memory under `name` (random models for benchmarks, tests).
  static std::unique_ptr<Weights> from_tensors(std::map<std::string, Tensor> tensors, const std::string& name);
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  // The tensor `name` with exactly `shape` (row-major, contiguous), valid while this lives.
  const float* get(const std::string& name, const std::vector<int64_t>& shape);
  std::vector<int64_t> shape(const std::string& name) const;  // of a tensor that has()
  // The file that holds `name` (a tensor that has()): a shard's path, or the name of in-memory weights.
  std::string file(const std::string& name) const;
  // The tensor `name` with exactly `shape` as `type` (f16 or bf16) into dst (numel values): its
  // own bits when the file stores that type (never widened), else rounded to nearest even from
  // f32; an f16 value past 65504 is an error naming the tensor. With `transpose` (shape is (a, b)
  // as stored), dst receives (b, a). Checked finite like get().
  void get16(const std::string& name, const std::vector<int64_t>& shape, WeightType type, uint16_t* dst,
             bool transpose = false);
  // A tensor of any shape as F32 (a copy), e.g. the attention state clattn saves.
  Tensor get_any(const std::string& name) const;
  std::vector<std::string> names() const;  // every tensor of the checkpoint, sorted
  // Names never asked for (extra tensors of the checkpoint: ignored, listed by --verbose).
  std::vector<std::string> unused() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;   // tensor -> file index (files_.size() for owned_)
  std::map<std::string, Tensor> owned_;    // converted (or unaligned) copies
  std::set<std::string> used_;          // asked for by get(), and checked finite
};

// Index of the first NaN or Inf of p[0, n), or n when every value is finite: one pass that
// vectorises (a max over the exponent bits), scalar only inside the block that holds one.
int64_t first_non_finite(const float* p, int64_t n);

}  // namespace clattn
