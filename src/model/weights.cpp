#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "clattn/error.h"
#include "clattn/input_file.h"
#include "core/half.h"
#include "core/microkernel.h"

namespace clattn {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

// "(i, j, ...)": the index of element `flat` of a row-major tensor of `shape`.
std::string index_str(const std::vector<int64_t>& shape, int64_t flat) {
  std::vector<int64_t> idx(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    idx[i] = shape[i] > 0 ? flat % shape[i] : 0;
    flat = shape[i] > 0 ? flat / shape[i] : 0;
  }
  std::ostringstream at;
  at << '(';
  for (size_t i = 0; i < idx.size(); ++i) at << (i ? ", " : "") << idx[i];
  at << ')';
  return at.str();
}

// Refuses a tensor holding NaN or Inf, naming the file, the tensor and the first bad index:
// such a weight poisons every logit downstream, where it is reported far from its cause.
void check_finite_tensor(const float* p, const std::vector<int64_t>& shape, const std::string& file,
                         const std::string& name) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const int64_t bad = first_non_finite(p, n);
  if (bad == n) return;
  const float v = p[bad];
  fail("model '", file, "': tensor '", name, "' holds ", std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf",
       " at index ", index_str(shape, bad), "; a checkpoint's weights must be finite");
}

}  // namespace

void Weights::get16(const std::string& name, const std::vector<int64_t>& shape, WeightType type, uint16_t* dst,
                    bool transpose) {
  check(type != WeightType::f32 && (!transpose || shape.size() == 2), "model: internal: get16 of f32 or of a ",
        shape.size(), "-d transpose");
  const bool f16 = type == WeightType::f16;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  auto it = where_.find(name);
  check(it != where_.end(), "model '", dir_, "': tensor '", name, "' ", shape_str(shape),
        " is missing from the checkpoint");
  if (!files_.empty()) {
    const SafetensorsFile& f = *files_[it->second];
    const TensorInfo& info = f.info(name);
    if (info.dtype == (f16 ? DType::F16 : DType::BF16)) {
      check(info.shape == shape, "model '", f.path(), "': tensor '", name, "' has shape ", shape_str(info.shape),
            " but the config implies ", shape_str(shape));
      const uint8_t* src = f.bytes(name);  // (shape) 16-bit values, only byte-aligned
      if (!transpose) {
        std::memcpy(dst, src, sizeof(uint16_t) * static_cast<size_t>(n));
      } else {
        const int64_t a = shape[0], b = shape[1];  // src (a, b) -> dst (b, a)
        for (int64_t r = 0; r < a; ++r)
          for (int64_t c = 0; c < b; ++c) std::memcpy(dst + c * a + r, src + 2 * (r * b + c), 2);
      }
      // All exponent bits set: inf (mantissa 0) or NaN, in either format.
      const uint16_t exp = f16 ? 0x7c00u : 0x7f80u, man = f16 ? 0x03ffu : 0x007fu;
      for (int64_t i = 0; i < n; ++i)
        if ((dst[i] & exp) == exp)
          fail("model '", f.path(), "': tensor '", name, "' holds ", (dst[i] & man) ? "nan" : (dst[i] & 0x8000u) ? "-inf" : "inf",
               " at index ", index_str(transpose ? std::vector<int64_t>{shape[1], shape[0]} : shape, i),
               transpose ? " (held transposed)" : "", "; a checkpoint's weights must be finite");
      used_.insert(name);
      return;
    }
  }
  const float* src = get(name, shape);  // (shape) row-major, checked finite
  if (f16)
    for (int64_t i = 0; i < n; ++i)
      if (std::fabs(src[i]) > 65504.f)
        fail("model '", file(name), "': tensor '", name, "' holds ", src[i], " at index ", index_str(shape, i),
             ", past f16's largest finite value 65504: load it with weights bf16 or f32");
  const mk::Half h = f16 ? mk::Half::f16 : mk::Half::bf16;
  if (!transpose) {
    mk::to_half(h, src, n, dst);
    return;
  }
  const int64_t a = shape[0], b = shape[1];  // src (a, b) -> dst (b, a)
  for (int64_t r = 0; r < a; ++r)
    for (int64_t c = 0; c < b; ++c)
      dst[c * a + r] = f16 ? half::f32_to_f16(src[r * b + c]) : half::f32_to_bf16(src[r * b + c]);
}

int64_t first_non_finite(const float* p, int64_t n) {
  constexpr int64_t kBlock = 4096;
  constexpr uint32_t kExp = 0x7f800000u;  // all exponent bits set: Inf or NaN
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    uint32_t mx = 0;
    for (int64_t i = b; i < e; ++i) {
      uint32_t u;
      std::memcpy(&u, p + i, sizeof u);
      mx = std::max(mx, u & kExp);
    }
    if (mx == kExp)
      for (int64_t i = b; i < e; ++i)
        if (!std::isfinite(p[i])) return i;
  }
  return n;
}

std::unique_ptr<Weights> Weights::open(const std::string& dir) {
  namespace fs = std::filesystem;
  auto w = std::make_unique<Weights>();
  w->dir_ = dir;
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> shards;
  if (fs::exists(single)) {
    shards.push_back(single.string());
  } else {
    check(fs::exists(index), "model '", dir, "': neither model.safetensors nor ",
          "model.safetensors.index.json is there");
    const std::string text = read_input_file(index.string(), "model index", kMaxJsonBytes);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const std::exception& e) {
      throw Error(detail::concat("model '", index.string(), "': not valid JSON: ", e.what()));
    }
    check(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), "model '",
          index.string(), "': no \"weight_map\" object");
    std::map<std::string, size_t> shard_of;
    for (const auto& [name, file] : j["weight_map"].items()) {
      check(file.is_string(), "model '", index.string(), "': weight_map[\"", name, "\"] is not a file name");
      const std::string f = file.get<std::string>();
      check(f.find('/') == std::string::npos && f.find("..") == std::string::npos, "model '",
            index.string(), "': shard name '", f, "' must be a file in the model folder");
      if (!shard_of.count(f)) {
        shard_of[f] = shards.size();
        shards.push_back((fs::path(dir) / f).string());
      }
    }
  }
  for (const std::string& path : shards) {
    w->files_.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(path)));
    for (const std::string& name : w->files_.back()->names()) {
      check(!w->where_.count(name), "model '", dir, "': tensor '", name, "' is in two shards");
      w->where_[name] = w->files_.size() - 1;
    }
  }
  return w;
}

std::unique_ptr<Weights> Weights::from_tensors(std::map<std::string, Tensor> tensors, const std::string& name) {
  auto w = std::make_unique<Weights>();
  w->dir_ = name;
  for (auto& [n, t] : tensors) w->where_[n] = 0;
  w->owned_ = std::move(tensors);
  return w;
}

const float* Weights::get(const std::string& name, const std::vector<int64_t>& shape) {
  auto it = where_.find(name);
  check(it != where_.end(), "model '", dir_, "': tensor '", name, "' ", shape_str(shape),
        " is missing from the checkpoint");
  if (files_.empty()) {  // in-memory weights
    const Tensor& t = owned_.at(name);
    check(t.shape() == Shape(shape), "model '", dir_, "': tensor '", name, "' has shape ", t.shape(),
          " but the config implies ", shape_str(shape));
    if (used_.insert(name).second) check_finite_tensor(t.data(), shape, dir_, name);
    return t.data();
  }
  const SafetensorsFile& f = *files_[it->second];
  const TensorInfo& info = f.info(name);
  check(info.shape == shape, "model '", f.path(), "': tensor '", name, "' has shape ",
        shape_str(info.shape), " but the config implies ", shape_str(shape));
  const float* p = f.mapped_f32(name);
  if (!p) {
    auto o = owned_.find(name);
    if (o == owned_.end()) o = owned_.emplace(name, f.get_f32(name)).first;  // throws naming the dtype
    p = o->second.data();
  }
  if (used_.insert(name).second) check_finite_tensor(p, shape, f.path(), name);
  return p;
}

std::vector<int64_t> Weights::shape(const std::string& name) const {
  auto it = where_.find(name);
  check(it != where_.end(), "model '", dir_, "': tensor '", name, "' is missing from the checkpoint");
  if (files_.empty()) {
    const Shape& s = owned_.at(name).shape();
    return std::vector<int64_t>(s.dims.begin(), s.dims.begin() + s.rank);
  }
  return files_[it->second]->info(name).shape;
}

std::string Weights::file(const std::string& name) const {
  auto it = where_.find(name);
  check(it != where_.end(), "model '", dir_, "': tensor '", name, "' is missing from the checkpoint");
  return files_.empty() ? dir_ : files_[it->second]->path();
}

Tensor Weights::get_any(const std::string& name) const {
  auto it = where_.find(name);
  check(it != where_.end(), "model '", dir_, "': tensor '", name, "' is missing from the checkpoint");
  Tensor t = files_.empty() ? Tensor::from(owned_.at(name).view()) : files_[it->second]->get_f32(name);
  const Shape& s = t.shape();
  check_finite_tensor(t.data(), std::vector<int64_t>(s.dims.begin(), s.dims.begin() + s.rank), file(name), name);
  return t;
}

std::vector<std::string> Weights::names() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : where_) out.push_back(name);
  return out;
}

std::vector<std::string> Weights::unused() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : where_)
    if (!used_.count(name)) out.push_back(name);
  return out;
}

}  // namespace clattn
