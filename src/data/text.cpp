// Character tasks over a text file (include/clattn/data.h): masked character modelling (mlm) and
// causal character LM (lm), byte-level; lm also over a tokenizer's ids.
// Random streams of Rng(seed): training row r of step s draws from stream s at indices r·2^24 + k
// (k = 0 the window start, then the mask draws); held-out window w from stream 2^63 + w.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "clattn/error.h"
#include "clattn/rng.h"
#include "clattn/tokenizer.h"
#include "data/tasks.h"

namespace clattn::data {

namespace {

constexpr int32_t kPad = 256, kMask = 257;
constexpr int64_t kVocab = 258;
constexpr uint64_t kEvalStream = uint64_t{1} << 63;
constexpr int64_t kMaxRows = int64_t{1} << 30;  // rows per step the stream layout allows
constexpr uint64_t kRowStride = uint64_t{1} << 24;
constexpr int64_t kMaxT = int64_t{1} << 22;     // T·(draws per position) must fit a row's slice

class TextTask final : public Task {
 public:
  TextTask(const TaskOptions& opt, TaskKind kind)
      : opt_(opt), kind_(kind), rng_(opt.seed), bytes_(read_file_bytes(opt.data)) {
    check(!bytes_.empty(), opt.data, ": empty file (", name(), " needs text)");
    check(kind != TaskKind::mlm || (opt.mask_prob > 0.f && opt.mask_prob <= 1.f),
          "mlm: the mask probability must be in (0, 1], got ", opt.mask_prob);
    held_ = static_cast<int64_t>(bytes_.size()) / 10;
    train_ = static_cast<int64_t>(bytes_.size()) - held_;
    // A byte-level model's own tokenizer.json (Tokenizer::is_bytes) is the byte mode itself: the
    // task stays byte-level (any bytes, bits per character) when a run or evaluation reads it.
    std::optional<Tokenizer> tok;
    if (!opt.tokenizer.empty()) {
      tok = Tokenizer::from_file(opt.tokenizer);
      if (tok->is_bytes()) tok.reset();
    }
    if (tok) {
      check(kind == TaskKind::lm, "mlm: a tokenizer applies to the lm task only");
      tok_ = std::make_unique<Tokenizer>(std::move(*tok));
      // Split at a character boundary, then each part on its own: no token spans the two.
      int64_t cut = train_;
      while (cut < static_cast<int64_t>(bytes_.size()) && (static_cast<unsigned char>(bytes_[static_cast<size_t>(cut)]) & 0xC0) == 0x80)
        ++cut;
      ids_ = tok_->encode(std::string_view(bytes_).substr(0, static_cast<size_t>(cut)), false);
      train_ = static_cast<int64_t>(ids_.size());
      const std::vector<int32_t> held = tok_->encode(std::string_view(bytes_).substr(static_cast<size_t>(cut)), false);
      ids_.insert(ids_.end(), held.begin(), held.end());
      held_ = static_cast<int64_t>(held.size());
      bytes_.clear();
      bytes_.shrink_to_fit();
    }
  }
  TaskKind kind() const override { return kind_; }
  std::string name() const override { return kind_ == TaskKind::mlm ? "mlm" : "lm"; }
  int64_t vocab() const override { return tok_ ? tok_->vocab_size() : kVocab; }
  int64_t classes() const override { return vocab(); }
  int32_t pad_id() const override { return tok_ ? 0 : kPad; }
  std::string metric() const override { return tok_ ? "bits_per_token" : "bits_per_char"; }
  std::string decode(int32_t id) const override {
    if (tok_) return id >= 0 && id < tok_->vocab_size() ? tok_->token(id) : detail::concat("<", id, "?>");
    if (id == kPad) return "<pad>";
    if (id == kMask) return "<mask>";
    if (id < 0 || id > kMask) return detail::concat("<", id, "?>");
    if (id >= 32 && id < 127) return std::string(1, static_cast<char>(id));
    static const char* hex = "0123456789abcdef";
    return detail::concat("\\x", hex[id >> 4], hex[id & 15]);
  }

  void check_length(int64_t T) const override {
    check(T >= 1 && T <= kMaxT, name(), ": the sequence length must be in [1, ", kMaxT, "], got ", T);
    const int64_t w = window(T);
    const char* unit = tok_ ? "tokens" : "bytes";
    check(train_ >= w, opt_.data, ": the training part (the first 90 %, ", train_, " of ",
          train_ + held_, " ", unit, ") is shorter than one window of ", w, " ", unit, " (", name(),
          " with sequence length ", T, "): use a longer file or a shorter sequence");
    check(held_ >= w, opt_.data, ": the held-out part (the last 10 %, ", held_, " of ", train_ + held_,
          " ", unit, ") is shorter than one window of ", w, " ", unit, " (", name(), " with sequence length ",
          T, "): the file needs at least ", 10 * w, " ", unit, ", or use a shorter sequence");
  }

  Batch train_batch(int64_t B, int64_t T, uint64_t step) const override {
    check_length(T);
    check(B >= 1 && B <= kMaxRows, name(), ": batch size must be in [1, ", kMaxRows, "], got ", B);
    check(step < kEvalStream, name(), ": step ", step, " out of range");
    Batch b = empty_batch(B, T);
    const uint64_t starts = static_cast<uint64_t>(train_ - window(T) + 1);
    for (int64_t r = 0; r < B; ++r) {
      const uint64_t base = static_cast<uint64_t>(r) * kRowStride;
      const int64_t start = static_cast<int64_t>(rng_.below(starts, step, base));
      fill_row(b, r, start, step, base + 1);
    }
    return b;
  }

  std::vector<Batch> eval_batches(int64_t B, int64_t T, int64_t limit) const override {
    check_length(T);
    check(B >= 1, name(), ": batch size must be >= 1, got ", B);
    // Windows tile the held-out part with stride T (an lm window's extra byte is the next one's
    // first input), so every held-out byte is predicted at most once.
    int64_t n = (held_ - window(T)) / T + 1;
    if (limit > 0) n = std::min(n, limit);
    std::vector<Batch> out;
    for (int64_t w0 = 0; w0 < n; w0 += B) {
      const int64_t rows = std::min(B, n - w0);
      Batch b = empty_batch(rows, T);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t w = w0 + r;
        fill_row(b, r, train_ + w * T, kEvalStream + static_cast<uint64_t>(w), 0);
      }
      out.push_back(std::move(b));
    }
    return out;
  }

 private:
  int64_t window(int64_t T) const { return kind_ == TaskKind::lm ? T + 1 : T; }

  Batch empty_batch(int64_t B, int64_t T) const {
    Batch b;
    b.B = B;
    b.T = T;
    b.ids.assign(static_cast<size_t>(B * T), pad_id());
    b.lengths.assign(static_cast<size_t>(B), static_cast<int32_t>(T));
    b.targets.assign(static_cast<size_t>(B * T), -1);
    return b;
  }

  // Row r from the bytes at `start`; mlm draws its masks from (stream, first...).
  void fill_row(Batch& b, int64_t r, int64_t start, uint64_t stream, uint64_t first) const {
    const int64_t T = b.T;
    int32_t* ids = b.ids.data() + r * T;      // (T)
    int32_t* tgt = b.targets.data() + r * T;  // (T)
    if (tok_) {
      const int32_t* src = ids_.data() + start;
      for (int64_t t = 0; t < T; ++t) {
        ids[t] = src[t];
        tgt[t] = src[t + 1];
      }
      return;
    }
    const auto* src = reinterpret_cast<const unsigned char*>(bytes_.data()) + start;
    if (kind_ == TaskKind::lm) {
      for (int64_t t = 0; t < T; ++t) {
        ids[t] = src[t];
        tgt[t] = src[t + 1];
      }
      return;
    }
    for (int64_t t = 0; t < T; ++t) ids[t] = src[t];
    // k targets chosen uniformly without replacement (a partial Fisher-Yates shuffle), then BERT's
    // 80 / 10 / 10 replacement of each.
    const int64_t k = std::clamp<int64_t>(std::llround(static_cast<double>(opt_.mask_prob) * T), 1, T);
    std::vector<int32_t> order(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) order[static_cast<size_t>(t)] = static_cast<int32_t>(t);
    uint64_t idx = first;
    for (int64_t i = 0; i < k; ++i) {
      const int64_t j = i + static_cast<int64_t>(rng_.below(static_cast<uint64_t>(T - i), stream, idx++));
      std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
      const int32_t p = order[static_cast<size_t>(i)];
      tgt[p] = ids[p];
      const float u = rng_.uniform(stream, idx++);
      const uint64_t rnd = rng_.below(256, stream, idx++);
      if (u < 0.8f) {
        ids[p] = kMask;
      } else if (u < 0.9f) {
        ids[p] = static_cast<int32_t>(rnd);
      }
    }
  }

  TaskOptions opt_;
  TaskKind kind_;
  Rng rng_;
  std::string bytes_;
  std::unique_ptr<Tokenizer> tok_;  // lm over a tokenizer's ids: ids_ replaces bytes_
  std::vector<int32_t> ids_;
  int64_t held_ = 0, train_ = 0;  // bytes (or ids): held-out = the last held_, training = the first train_
};

}  // namespace

std::unique_ptr<Task> make_text_task(const TaskOptions& opt, TaskKind kind) {
  return std::make_unique<TextTask>(opt, kind);
}

}  // namespace clattn::data
