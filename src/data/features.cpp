// Classification of feature frames (include/clattn/data.h, task "features"): a KWT feature set
// (safetensors: features [n, T, dim] F32, labels [n] integers) split into training and held-out
// examples by a fixed permutation, so a pretrained keyword model can be fine-tuned on it.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "clattn/error.h"
#include "clattn/rng.h"
#include "clattn/safetensors.h"
#include "data/tasks.h"

namespace clattn::data {
namespace {

constexpr uint64_t kSplitStream = uint64_t{1} << 62;
constexpr int64_t kMaxRows = int64_t{1} << 30;

class FeaturesTask final : public Task {
 public:
  explicit FeaturesTask(const TaskOptions& opt) : opt_(opt), rng_(opt.seed) {
    const SafetensorsFile f = SafetensorsFile::open(opt.data);
    check(f.has("features") && f.has("labels"), opt.data, ": a feature set needs tensors 'features' [n, T, dim] and 'labels' [n]");
    feats_ = f.get_f32("features");
    labels_ = f.get_i32("labels");
    check(feats_.rank() == 3 && feats_.dim(0) >= 2 && feats_.dim(1) >= 1 && feats_.dim(2) >= 1, opt.data,
          ": 'features' must be [n >= 2, T, dim], got ", feats_.shape());
    const int64_t n = feats_.dim(0);
    check(static_cast<int64_t>(labels_.size()) == n, opt.data, ": 'labels' must have one entry per example (", n, "), got ",
          labels_.size());
    for (int64_t i = 0; i < feats_.numel(); ++i)
      check(std::isfinite(feats_.data()[i]), opt.data, ": features must be finite, found ", feats_.data()[i], " at flat index ", i);
    for (int32_t l : labels_) check(l >= 0, opt.data, ": labels must be >= 0, found ", l);
    classes_ = *std::max_element(labels_.begin(), labels_.end()) + 1;
    // A fixed permutation (independent of the seed): the held-out set is the same for every run.
    order_.resize(static_cast<size_t>(n));
    std::iota(order_.begin(), order_.end(), 0);
    const Rng split(0);
    for (int64_t i = n - 1; i > 0; --i)
      std::swap(order_[static_cast<size_t>(i)], order_[static_cast<size_t>(split.below(static_cast<uint64_t>(i + 1), kSplitStream, static_cast<uint64_t>(i)))]);
    held_ = std::max<int64_t>(1, n / 10);
    train_ = n - held_;
  }
  TaskKind kind() const override { return TaskKind::classify; }
  std::string name() const override { return "features"; }
  int64_t vocab() const override { return 0; }
  int64_t classes() const override { return classes_; }
  int32_t pad_id() const override { return 0; }
  std::string decode(int32_t id) const override { return detail::concat("<class ", id, ">"); }
  int64_t feature_dim() const override { return feats_.dim(2); }
  int64_t fixed_length() const override { return feats_.dim(1); }
  void check_length(int64_t T) const override {
    check(T == feats_.dim(1), opt_.data, ": the feature set has ", feats_.dim(1), " frames per example; the sequence length must be ",
          feats_.dim(1), ", got ", T);
  }
  Batch train_batch(int64_t B, int64_t T, uint64_t step) const override {
    check_length(T);
    check(B >= 1 && B <= kMaxRows, "features: batch size must be in [1, ", kMaxRows, "], got ", B);
    check(step < kSplitStream, "features: step ", step, " out of range");
    Batch b = empty_batch(B);
    for (int64_t r = 0; r < B; ++r)
      place(b, r, order_[static_cast<size_t>(rng_.below(static_cast<uint64_t>(train_), step, static_cast<uint64_t>(r)))]);
    return b;
  }
  std::vector<Batch> eval_batches(int64_t B, int64_t T, int64_t limit) const override {
    check_length(T);
    check(B >= 1, "features: batch size must be >= 1, got ", B);
    const int64_t n = limit > 0 ? std::min(limit, held_) : held_;
    std::vector<Batch> out;
    for (int64_t e0 = 0; e0 < n; e0 += B) {
      Batch b = empty_batch(std::min(B, n - e0));
      for (int64_t r = 0; r < b.B; ++r) place(b, r, order_[static_cast<size_t>(train_ + e0 + r)]);
      out.push_back(std::move(b));
    }
    return out;
  }

 private:
  Batch empty_batch(int64_t B) const {
    Batch b;
    b.B = B;
    b.T = feats_.dim(1);
    b.feature_dim = feats_.dim(2);
    b.lengths.assign(static_cast<size_t>(B), static_cast<int32_t>(b.T));
    b.targets.assign(static_cast<size_t>(B), 0);
    b.features.resize(static_cast<size_t>(B * b.T * b.feature_dim));
    return b;
  }
  void place(Batch& b, int64_t r, int64_t example) const {
    const int64_t per = b.T * b.feature_dim;
    std::copy(feats_.data() + example * per, feats_.data() + (example + 1) * per, b.features.data() + r * per);
    b.targets[static_cast<size_t>(r)] = labels_[static_cast<size_t>(example)];
  }

  TaskOptions opt_;
  Rng rng_;
  Tensor feats_;
  std::vector<int32_t> labels_;
  std::vector<int64_t> order_;
  int64_t classes_ = 0, held_ = 0, train_ = 0;
};

}  // namespace

std::unique_ptr<Task> make_features_task(const TaskOptions& opt) {
  check(!opt.data.empty(), "features: needs a feature set to read (data)");
  return std::make_unique<FeaturesTask>(opt);
}

}  // namespace clattn::data
