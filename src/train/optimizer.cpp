// AdamW over a Model's flat buffers (train.h): global-norm clip, warm-up + cosine schedule,
// one nn::adamw_step per run of parameters sharing a weight-decay flag. Moments are allocated at
// construction; step() allocates nothing.
#include <cmath>
#include <cstring>
#include <string>

#include "clattn/error.h"
#include "clattn/nn.h"
#include "clattn/safetensors.h"
#include "clattn/train.h"

namespace clattn {

Optimizer::Optimizer(Model& model, const OptimizerOptions& opt) : model_(&model), opt_(opt) {
  check(opt.lr >= 0 && std::isfinite(opt.lr) && opt.min_lr >= 0 && std::isfinite(opt.min_lr),
        "optimizer: lr and min_lr must be finite and >= 0, got ", opt.lr, " and ", opt.min_lr);
  check(opt.warmup >= 0 && opt.total_steps >= 1, "optimizer: warmup must be >= 0 and total_steps >= 1, got ",
        opt.warmup, " and ", opt.total_steps);
  check(opt.clip >= 0 && std::isfinite(opt.clip), "optimizer: clip must be >= 0 (0 = off), got ", opt.clip);
  check(opt.adamw.beta1 >= 0 && opt.adamw.beta1 < 1 && opt.adamw.beta2 >= 0 && opt.adamw.beta2 < 1 &&
            opt.adamw.eps > 0 && opt.adamw.weight_decay >= 0,
        "optimizer: need 0 <= beta1, beta2 < 1, eps > 0 and weight_decay >= 0");
  const size_t n = model.params().size();
  m_.assign(n, 0.f);
  v_.assign(n, 0.f);
  for (const ParamInfo& p : model.param_info()) {
    if (!runs_.empty() && runs_.back().decay == p.decay && runs_.back().offset + runs_.back().size == p.offset)
      runs_.back().size += p.size;
    else
      runs_.push_back({p.offset, p.size, p.decay});
  }
}

double Optimizer::step(float* lr_used) {
  std::span<float> p = model_->params(), g = model_->grads();
  check(p.size() == m_.size(), "optimizer: the model has ", p.size(), " parameters, the optimizer was built for ", m_.size());
  const int64_t n = static_cast<int64_t>(g.size());
  const double norm = std::sqrt(nn::sum_squares(g.data(), n));
  check(std::isfinite(norm), "optimizer: the gradient norm is not finite (", norm, ") at step ", t_,
        "; the update is refused");
  if (opt_.clip > 0 && norm > opt_.clip) nn::scale_inplace(g.data(), static_cast<float>(opt_.clip / norm), n);
  const float lr = nn::lr_schedule(t_, opt_.warmup, opt_.total_steps, opt_.lr, opt_.min_lr);
  ++t_;
  for (const Run& r : runs_)
    nn::adamw_step(p.data() + r.offset, g.data() + r.offset, m_.data() + r.offset, v_.data() + r.offset, r.size, t_,
                   lr, opt_.adamw, r.decay);
  if (lr_used) *lr_used = lr;
  return norm;
}

void Optimizer::save(const std::string& path) const {
  SafetensorsWriter w;
  const int64_t n = static_cast<int64_t>(m_.size());
  w.add("m", make_view(m_.data(), Shape{n}));
  w.add("v", make_view(v_.data(), Shape{n}));
  w.set_metadata("t", std::to_string(t_));
  w.write(path);
}

void Optimizer::load(const std::string& path) {
  const SafetensorsFile f = SafetensorsFile::open(path);
  const int64_t n = static_cast<int64_t>(m_.size());
  for (const char* name : {"m", "v"}) {
    check(f.has(name), "optimizer state '", path, "': tensor '", name, "' is missing");
    check(f.info(name).shape == std::vector<int64_t>{n} && f.info(name).dtype == DType::F32, "optimizer state '", path,
          "': tensor '", name, "' must be F32 of shape (", n, ") for this model, got ", Shape(f.info(name).shape));
  }
  auto it = f.metadata().find("t");
  check(it != f.metadata().end(), "optimizer state '", path, "': metadata \"t\" (steps done) is missing");
  int64_t t = -1;
  try {
    size_t used = 0;
    t = std::stoll(it->second, &used);
    if (used != it->second.size()) t = -1;
  } catch (...) {
  }
  check(t >= 0, "optimizer state '", path, "': metadata \"t\" = \"", it->second, "\" is not a step count");
  const Tensor m = f.get_f32("m"), v = f.get_f32("v");
  std::memcpy(m_.data(), m.data(), sizeof(float) * m_.size());
  std::memcpy(v_.data(), v.data(), sizeof(float) * v_.size());
  t_ = t;
}

}  // namespace clattn
