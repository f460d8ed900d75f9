// AdamW over a Model's flat buffers (train.h): global-norm clip, warm-up + cosine schedule, one
// nn::adamw_step per run of parameters sharing a weight-decay flag; optionally of one shard of
// the parameters (ZeRO-1). Moments are allocated at construction; step() allocates nothing when
// unsharded.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "clattn/comm.h"
#include "clattn/error.h"
#include "clattn/nn.h"
#include "clattn/safetensors.h"
#include "clattn/train.h"

namespace clattn {

Optimizer::Optimizer(Model& model, const OptimizerOptions& opt)
    : Optimizer(model, opt, nullptr, 0, static_cast<int64_t>(model.params().size())) {}

Optimizer::Optimizer(Model& model, const OptimizerOptions& opt, Communicator* comm, int64_t begin, int64_t end)
    : model_(&model), opt_(opt), comm_(comm), begin_(begin), end_(end) {
  check(opt.lr >= 0 && std::isfinite(opt.lr) && opt.min_lr >= 0 && std::isfinite(opt.min_lr),
        "optimizer: lr and min_lr must be finite and >= 0, got ", opt.lr, " and ", opt.min_lr);
  check(opt.warmup >= 0 && opt.total_steps >= 1, "optimizer: warmup must be >= 0 and total_steps >= 1, got ",
        opt.warmup, " and ", opt.total_steps);
  check(opt.clip >= 0 && std::isfinite(opt.clip), "optimizer: clip must be >= 0 (0 = off), got ", opt.clip);
  check(opt.adamw.beta1 >= 0 && opt.adamw.beta1 < 1 && opt.adamw.beta2 >= 0 && opt.adamw.beta2 < 1 &&
            opt.adamw.eps > 0 && opt.adamw.weight_decay >= 0,
        "optimizer: need 0 <= beta1, beta2 < 1, eps > 0 and weight_decay >= 0");
  const int64_t P = static_cast<int64_t>(model.params().size());
  check(begin >= 0 && begin <= end && end <= P, "optimizer: the shard [", begin, ", ", end, ") is outside the ", P,
        " parameters");
  m_.assign(static_cast<size_t>(end - begin), 0.f);
  v_.assign(static_cast<size_t>(end - begin), 0.f);
  for (const ParamInfo& p : model.param_info()) {
    const int64_t s = std::max(p.offset, begin), e = std::min(p.offset + p.size, end);
    if (s >= e) continue;
    if (!runs_.empty() && runs_.back().decay == p.decay && runs_.back().offset + runs_.back().size == s)
      runs_.back().size += e - s;
    else
      runs_.push_back({s, e - s, p.decay});
  }
}

double Optimizer::step(float* lr_used) {
  std::span<float> p = model_->params(), g = model_->grads();
  const int64_t P = static_cast<int64_t>(p.size());
  check(static_cast<int64_t>(m_.size()) == end_ - begin_ && end_ <= P, "optimizer: the model has ", P,
        " parameters, the optimizer was built for a shard of ", m_.size(), " of them");
  double sq = 0;
  if (!comm_) {
    sq = nn::sum_squares(g.data(), P);
  } else {
    // The blocks of sum_squares, each summed by the rank that holds it, added in order.
    const int64_t nb = nn::sum_squares_blocks(P);
    std::vector<double> part(static_cast<size_t>(nb), 0.0);
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t e0 = P * b / nb, e1 = P * (b + 1) / nb;
      if (e0 >= begin_ && e1 <= end_ && e1 > e0) part[static_cast<size_t>(b)] = nn::sum_squares_block(g.data() + e0, e1 - e0);
      else check(e1 <= begin_ || e0 >= end_ || e1 == e0, "optimizer: the shard [", begin_, ", ", end_,
                 ") cuts a block of the gradient norm");
    }
    comm_->all_reduce_sum(part.data(), part.size());  // one nonzero per block: exact
    for (double x : part) sq += x;
  }
  const double norm = std::sqrt(sq);
  check(std::isfinite(norm), "optimizer: the gradient norm is not finite (", norm, ") at step ", t_,
        "; the update is refused");
  if (opt_.clip > 0 && norm > opt_.clip)
    nn::scale_inplace(g.data() + begin_, static_cast<float>(opt_.clip / norm), end_ - begin_);
  const float lr = nn::lr_schedule(t_, opt_.warmup, opt_.total_steps, opt_.lr, opt_.min_lr);
  ++t_;
  for (const Run& r : runs_)
    nn::adamw_step(p.data() + r.offset, g.data() + r.offset, m_.data() + (r.offset - begin_),
                   v_.data() + (r.offset - begin_), r.size, t_, lr, opt_.adamw, r.decay);
  if (lr_used) *lr_used = lr;
  return norm;
}

void Optimizer::save(const std::string& path) const {
  const int64_t P = static_cast<int64_t>(model_->params().size());
  std::vector<float> m, v;
  const std::vector<float>* pm = &m_;
  const std::vector<float>* pv = &v_;
  if (comm_) {
    // Every shard, so the file is the unsharded optimizer's whatever the number of ranks.
    const int R = comm_->size();
    std::vector<int64_t> bounds(static_cast<size_t>(2 * R));
    const int64_t mine[2] = {begin_, end_};
    comm_->all_gather(mine, sizeof mine, bounds.data());
    std::vector<size_t> counts, displs;
    for (int j = 0; j < R; ++j) {
      counts.push_back(sizeof(float) * static_cast<size_t>(bounds[static_cast<size_t>(2 * j + 1)] - bounds[static_cast<size_t>(2 * j)]));
      displs.push_back(sizeof(float) * static_cast<size_t>(bounds[static_cast<size_t>(2 * j)]));
    }
    m.assign(static_cast<size_t>(P), 0.f);
    v.assign(static_cast<size_t>(P), 0.f);
    comm_->iall_gatherv(m_.data(), sizeof(float) * m_.size(), m.data(), counts, displs)->wait();
    comm_->iall_gatherv(v_.data(), sizeof(float) * v_.size(), v.data(), counts, displs)->wait();
    pm = &m;
    pv = &v;
    if (comm_->rank() != 0) return;
  }
  SafetensorsWriter w;
  w.add("m", make_view(pm->data(), Shape{P}));
  w.add("v", make_view(pv->data(), Shape{P}));
  w.set_metadata("t", std::to_string(t_));
  w.write(path);
}

void Optimizer::load(const std::string& path) {
  const SafetensorsFile f = SafetensorsFile::open(path);
  const int64_t n = static_cast<int64_t>(model_->params().size());
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
  std::memcpy(m_.data(), m.data() + begin_, sizeof(float) * m_.size());
  std::memcpy(v_.data(), v.data() + begin_, sizeof(float) * v_.size());
  t_ = t;
}

}  // namespace clattn
