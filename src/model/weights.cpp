#include "model/weights.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "clattn/error.h"
#include "clattn/input_file.h"

namespace clattn {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

}  // namespace

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
    used_.insert(name);
    return t.data();
  }
  const SafetensorsFile& f = *files_[it->second];
  const TensorInfo& info = f.info(name);
  check(info.shape == shape, "model '", f.path(), "': tensor '", name, "' has shape ",
        shape_str(info.shape), " but the config implies ", shape_str(shape));
  used_.insert(name);
  if (const float* p = f.mapped_f32(name)) return p;
  auto o = owned_.find(name);
  if (o == owned_.end()) o = owned_.emplace(name, f.get_f32(name)).first;  // throws naming the dtype
  return o->second.data();
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

Tensor Weights::get_any(const std::string& name) const {
  auto it = where_.find(name);
  check(it != where_.end(), "model '", dir_, "': tensor '", name, "' is missing from the checkpoint");
  if (files_.empty()) return Tensor::from(owned_.at(name).view());
  return files_[it->second]->get_f32(name);
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
