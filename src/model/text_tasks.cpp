// An encoder's jobs on texts (model.h): classification and pooled embeddings, in padded batches.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "clattn/error.h"
#include "clattn/model.h"
#include "clattn/tokenizer.h"

namespace clattn {

namespace {

// Texts [t0, t1) as one batch, counting the cut ones into *truncated.
BatchEncoding tokenize(const Encoder& enc, const Tokenizer& tok, std::span<const std::string> texts, size_t t0,
                       size_t t1, int64_t* truncated) {
  BatchEncoding b = encode_texts(enc, tok, texts.subspan(t0, t1 - t0), t0);
  if (truncated) *truncated += b.truncated;
  return b;
}

void check_batch(int64_t batch, std::span<const std::string> texts) {
  check(batch >= 1, "encoder: batch must be >= 1, got ", batch);
  check(!texts.empty(), "encoder: no text to run");
}

}  // namespace

BatchEncoding encode_texts(const Encoder& enc, const Tokenizer& tok, std::span<const std::string> texts, size_t first) {
  BatchOptions opt;
  opt.literal = true;
  opt.max_length = std::max<int64_t>(0, enc.config().max_positions);
  opt.padding = Padding{};
  BatchEncoding b = tok.encode_batch(texts, {}, opt);
  for (int64_t r = 0; r < b.B; ++r)
    check(b.lengths[static_cast<size_t>(r)] > 0, "encoder: text ", first + static_cast<size_t>(r),
          " gives no token (an empty text with a tokenizer that adds none)");
  return b;
}

std::vector<Classification> classify_logits(ConstView logits) {
  check(logits.rank() == 2 && logits.dim(1) >= 1, "classify: logits must be (rows, classes), got ", logits.shape);
  std::vector<Classification> out;
  for (int64_t r = 0; r < logits.dim(0); ++r) {
    const float* x = logits.ptr(r, 0);
    const int64_t C = logits.dim(1);
    const int64_t best = std::max_element(x, x + C) - x;  // the first maximum: the lower class on ties
    double sum = 0;
    for (int64_t c = 0; c < C; ++c) sum += std::exp(static_cast<double>(x[c]) - x[best]);
    out.push_back({static_cast<int32_t>(best), static_cast<float>(1.0 / sum)});
  }
  return out;
}

std::vector<Classification> classify_texts(Encoder& enc, const Tokenizer& tok, std::span<const std::string> texts,
                                           int64_t batch, int64_t* truncated) {
  check_batch(batch, texts);
  check(enc.config().num_labels >= 1, "classify: this encoder has no classifier (num_labels is 0)");
  std::vector<Classification> out;
  for (size_t t0 = 0; t0 < texts.size(); t0 += static_cast<size_t>(batch)) {
    const BatchEncoding b = tokenize(enc, tok, texts, t0, std::min(texts.size(), t0 + static_cast<size_t>(batch)), truncated);
    const Tensor logits = enc.forward_tokens(b.ids, b.B, b.T, b.lengths);  // (B, num_labels)
    const std::vector<Classification> c = classify_logits(logits.view());
    out.insert(out.end(), c.begin(), c.end());
  }
  return out;
}

Pooling parse_pooling(std::string_view name) {
  if (name == "mean") return Pooling::mean;
  if (name == "cls") return Pooling::cls;
  fail("embed: pooling must be mean or cls, got '", name, "'");
}

Tensor embed_texts(Encoder& enc, const Tokenizer& tok, std::span<const std::string> texts, Pooling pooling,
                   int64_t batch, int64_t* truncated) {
  check_batch(batch, texts);
  const int64_t H = enc.config().hidden;
  Tensor out(Shape{static_cast<int64_t>(texts.size()), H});  // (texts, hidden)
  std::vector<double> acc(static_cast<size_t>(H));          // (hidden) one row's sum, in double
  for (size_t t0 = 0; t0 < texts.size(); t0 += static_cast<size_t>(batch)) {
    const BatchEncoding b = tokenize(enc, tok, texts, t0, std::min(texts.size(), t0 + static_cast<size_t>(batch)), truncated);
    (void)enc.forward_tokens(b.ids, b.B, b.T, b.lengths);
    const ConstView h = enc.last_hidden();  // (B·T, hidden)
    check(h.rank() == 2 && h.dim(0) == b.B * b.T && h.dim(1) == H, "embed: the encoder's final hidden state is ",
          h.shape, ", not (", b.B * b.T, ", ", H, ")");
    for (int64_t r = 0; r < b.B; ++r) {
      float* e = out.data() + (static_cast<int64_t>(t0) + r) * H;
      const int64_t n = pooling == Pooling::cls ? 1 : b.lengths[static_cast<size_t>(r)];
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t t = 0; t < n; ++t) {
        const float* x = h.ptr(r * b.T + t, 0);
        for (int64_t c = 0; c < H; ++c) acc[static_cast<size_t>(c)] += x[c];
      }
      for (int64_t c = 0; c < H; ++c) e[c] = static_cast<float>(acc[static_cast<size_t>(c)] / static_cast<double>(n));
    }
  }
  return out;
}

}  // namespace clattn
