// The live report of a training run (include/clattn/train.h, TrainReport).
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "clattn/train.h"

namespace clattn {

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::string duration(double s) {
  char buf[32];
  if (s < 60) std::snprintf(buf, sizeof buf, "%.0fs", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  else std::snprintf(buf, sizeof buf, "%dh%02dm", static_cast<int>(s) / 3600, static_cast<int>(s) / 60 % 60);
  return buf;
}

}  // namespace

TrainReport::TrainReport(const Trainer& t, bool live) : t_(t), live_(live), t0_(now_s()) {}

std::string TrainReport::step(const StepReport& r) {
  const TrainOptions& o = t_.options();
  const double now = now_s();
  if (now - last_ < (live_ ? 0.2 : 1.0) && r.step != o.steps && r.step != t_.start_step() + 1) return "";
  last_ = now;
  const double rate = static_cast<double>(r.step - t_.start_step()) / std::max(now - t0_, 1e-9);
  double eta = static_cast<double>(o.steps - r.step) / std::max(rate, 1e-9);
  if (o.time_budget > 0) eta = std::min(eta, std::max(0.0, o.time_budget - t_.elapsed_s()));
  char buf[256];
  std::snprintf(buf, sizeof buf, "%sstep %lld/%lld  loss %.4f  lr %.2e  %.2f steps/s  ETA %s%s", live_ ? "\r\033[K" : "",
                static_cast<long long>(r.step), static_cast<long long>(o.steps), r.loss, r.lr, rate,
                duration(eta).c_str(), live_ ? "" : "\n");
  return buf;
}

std::string TrainReport::eval(const EvalReport& e) const {
  char buf[512];
  std::snprintf(buf, sizeof buf, "%seval at step %lld: loss %.4f, %s %.4f%s (%lld examples, %.1f s)\n",
                live_ ? "\r\033[K" : "", static_cast<long long>(e.step), e.result.loss, t_.metric().c_str(),
                e.result.metric, e.improved ? " (best)" : "", static_cast<long long>(e.result.examples),
                e.result.seconds);
  return buf;
}

std::string TrainReport::finish(const std::string& stop) const {
  std::string out;
  if (stop == "time_budget") {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%strain: time budget of %.1f s reached after %lld steps\n", live_ ? "\r\033[K" : "",
                  t_.options().time_budget, static_cast<long long>(t_.steps_done()));
    out = buf;
  }
  if (live_) out += "\n";
  return out;
}

}  // namespace clattn
