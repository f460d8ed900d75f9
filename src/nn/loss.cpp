// The losses and the random layer of nn.h: softmax cross-entropy (loss and gradient in one sweep of
// the logits) and inverted dropout, whose mask is redrawn from the counter-based Rng, never stored.
#include <cmath>
#include <cstring>
#include <limits>

#include "clattn/error.h"
#include "clattn/nn.h"
#include "clattn/rng.h"
#include "nn/nn_internal.h"

namespace clattn::nn {

using namespace detail;  // nn_internal.h: SIMD names, kParallelMin

namespace {

// The rows of a cross-entropy call are cut into at most this many contiguous blocks, a count fixed
// by `rows` alone: each block sums its rows' losses in row order, then the blocks are summed in
// block order, so the loss has the same bits for any thread count (bit-identical resumed runs).
constexpr int64_t kMaxLossBlocks = 256;

// −log softmax(x)[t] for one counted row x (classes), in double, with dlogits (when d is not
// null) = scale · (softmax(x) − onehot(t)); d may be x. Returns NaN (and writes nothing) when a
// logit of the row is NaN or ±Inf; the caller reports it.
double row_loss(float* d, const float* x, int32_t t, int64_t classes, float scale) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int tail = static_cast<int>(classes % kLanes);
  const int64_t body = classes - tail;
  // Pass 1: the max, and x·0 summed, which is NaN exactly when some logit is NaN or ±Inf.
  vf mv = splat(kNegInf), bad{};
  for (int64_t e = 0; e < body; e += kLanes) {
    const vf v = load(x + e);
    mv = simd::vmax(mv, v);
    bad += v * 0.f;
  }
  if (tail) {
    const vf v = load_partial(x + body, tail);
    const vi lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    mv = simd::vmax(mv, lane < tail ? v : splat(kNegInf));
    bad += v * 0.f;
  }
  if (std::isnan(simd::hsum(bad))) return std::numeric_limits<double>::quiet_NaN();
  const float m = simd::hmax(mv), xt = x[t];  // x[t] read before d (maybe x) is written
  // Pass 2: p = exp(x − m), kept in d when there is one, and Σ p.
  const vf m_v = splat(m);
  vf sum{};
  for (int64_t e = 0; e < body; e += kLanes) {
    const vf p = simd::exp(load(x + e) - m_v);
    if (d) store(d + e, p);
    sum += p;
  }
  if (tail) {
    vf p = simd::exp(load_partial(x + body, tail) - m_v);
    const vi lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    p = lane < tail ? p : vf{};
    if (d) store_partial(d + body, p, tail);
    sum += p;
  }
  const float s = simd::hsum(sum);  // >= 1: the max's own term is exp(0)
  if (d) {  // Pass 3: d = p · scale / Σp, minus scale at the target.
    const vf k = splat(scale / s);
    for (int64_t e = 0; e < body; e += kLanes) store(d + e, load(d + e) * k);
    if (tail) store_partial(d + body, load_partial(d + body, tail) * k, tail);
    d[t] -= scale;
  }
  return static_cast<double>(m) - static_cast<double>(xt) + std::log(static_cast<double>(s));
}

}  // namespace

double cross_entropy(float* dlogits, const float* logits, const int32_t* targets, int64_t rows,
                     int64_t classes, float scale, int64_t* counted) {
  check(rows >= 0 && classes >= 1, "cross_entropy: need rows >= 0 and classes >= 1, got rows=", rows,
        " classes=", classes);
  if (counted) *counted = 0;
  if (rows == 0) return 0.0;
  check(logits != nullptr && targets != nullptr, "cross_entropy: logits and targets must not be null");
  int64_t n_counted = 0;
  for (int64_t r = 0; r < rows; ++r) {
    check(targets[r] >= -1 && targets[r] < classes, "cross_entropy: the target of row ", r, " is ", targets[r],
          "; targets must lie in [0, classes = ", classes, ") or be -1 (ignored)");
    n_counted += targets[r] != -1;
  }
  // 1 / counted is inf for a batch with nothing counted: harmless then (every gradient row is 0).
  check(dlogits == nullptr || n_counted == 0 || std::isfinite(scale), "cross_entropy: scale must be finite, got ",
        scale);
  const int64_t blocks = std::min(kMaxLossBlocks, rows);
  double partial[kMaxLossBlocks];   // (blocks) Σ loss over each block's rows, in row order
  int64_t first_bad[kMaxLossBlocks];  // (blocks) first row with a non-finite logit, or −1
#pragma omp parallel for schedule(static) if (rows * classes > kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t r0 = rows * b / blocks, r1 = rows * (b + 1) / blocks;
    double acc = 0;
    first_bad[b] = -1;
    for (int64_t r = r0; r < r1; ++r) {
      float* d = dlogits ? dlogits + r * classes : nullptr;  // (classes), may be the logits row
      if (targets[r] == -1) {
        if (d) std::memset(d, 0, sizeof(float) * static_cast<size_t>(classes));
        continue;
      }
      const double l = row_loss(d, logits + r * classes, targets[r], classes, scale);
      if (std::isnan(l)) {
        first_bad[b] = r;
        break;
      }
      acc += l;
    }
    partial[b] = acc;
  }
  double total = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    if (first_bad[b] >= 0) {
      const int64_t r = first_bad[b];
      int64_t c = 0;
      while (c + 1 < classes && std::isfinite(logits[r * classes + c])) ++c;
      fail("cross_entropy: the logits of row ", r, " are not finite: logits[", r, ", ", c, "] = ",
           logits[r * classes + c], " (a diverged model or a bad input)");
    }
    total += partial[b];
  }
  if (counted) *counted = n_counted;
  return total;
}

namespace {

constexpr int64_t kDropChunk = 4096;  // elements per OpenMP work item (a multiple of 32)

typedef uint64_t vu64 __attribute__((vector_size(64)));  // 8 lanes, each a 32-bit word zero-extended
typedef uint32_t vu8 __attribute__((vector_size(32)));   // 8 lanes
typedef uint32_t vu16 __attribute__((vector_size(64)));  // 16 lanes

// Rng::bits (Philox4x32-10) for the 8 counters (stream, i0 .. i0 + 7), one lane per counter:
// w[j] holds word j of each. The 32 x 32 -> 64-bit products are exact in 64-bit lanes (a single
// vpmuludq each), so one call costs about what one scalar Rng::bits does, for 8 counters.
inline void philox8(uint32_t key0, uint32_t key1, uint64_t stream, uint64_t i0, vu8 w[4]) {
  constexpr uint64_t kLo = 0xFFFFFFFFu;
  const vu64 idx = vu64{0, 1, 2, 3, 4, 5, 6, 7} + i0;
  vu64 c0 = idx & kLo, c1 = idx >> 32;
  vu64 c2 = vu64{} + (stream & kLo), c3 = vu64{} + (stream >> 32);
  uint32_t k0 = key0, k1 = key1;
  for (int r = 0; r < 10; ++r) {
    const vu64 p0 = c0 * uint64_t{0xD2511F53}, p1 = c2 * uint64_t{0xCD9E8D57};
    c0 = (p1 >> 32) ^ c1 ^ k0;
    c1 = p1 & kLo;
    c2 = (p0 >> 32) ^ c3 ^ k1;
    c3 = p0 & kLo;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  w[0] = __builtin_convertvector(c0, vu8);
  w[1] = __builtin_convertvector(c1, vu8);
  w[2] = __builtin_convertvector(c2, vu8);
  w[3] = __builtin_convertvector(c3, vu8);
}

// y[e] = x[e]·scale where word e of the 32 (counter-major: element 4k + j is word j of counter k)
// has its top 24 bits >= threshold, else 0.
inline void apply16(float* y, const float* x, vu16 words, uint32_t threshold, float scale) {
  const vf v = load(x) * scale;
  store(y, (words >> 8) >= threshold ? v : vf{});
}

// y = x · keep / (1 − p) with keep drawn per element: element i uses 32-bit word i mod 4 of
// Rng(seed).bits(stream, i / 4) (one Philox block serves four elements), and is kept when that
// word's top 24 bits, as a uniform u = k / 2^24, satisfy u >= p — i.e. k >= ceil(p · 2^24).
// Vectorised: 8 Philox blocks (32 elements) per step, the scalar Rng for the last < 32.
void dropout_apply(const char* name, float* y, const float* x, int64_t n, float p, uint64_t seed,
                   uint64_t stream) {
  check(n >= 0, name, ": n must be >= 0, got ", n);
  check(p >= 0.f && p < 1.f, name, ": the drop probability p must lie in [0, 1), got ", p);
  if (n == 0) return;
  check(y != nullptr && x != nullptr, name, ": the output and input must not be null");
  if (p == 0.f) {
    if (y != x) std::memcpy(y, x, sizeof(float) * static_cast<size_t>(n));
    return;
  }
  const Rng rng(seed);
  const uint32_t key0 = static_cast<uint32_t>(seed), key1 = static_cast<uint32_t>(seed >> 32);
  const uint32_t threshold = static_cast<uint32_t>(std::ceil(static_cast<double>(p) * 16777216.0));
  const float scale = static_cast<float>(1.0 / (1.0 - static_cast<double>(p)));
  const int64_t chunks = (n + kDropChunk - 1) / kDropChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin / 4)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = std::min(n, (c + 1) * kDropChunk);
    int64_t i = c * kDropChunk;
    for (; i + 32 <= end; i += 32) {
      vu8 w[4];
      philox8(key0, key1, stream, static_cast<uint64_t>(i / 4), w);
      // Interleave to element order: a = (w0, w1) pairs, b = (w2, w3) pairs, then 4-word groups.
      const vu16 a = __builtin_shufflevector(w[0], w[1], 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
      const vu16 b = __builtin_shufflevector(w[2], w[3], 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
      apply16(y + i, x + i, __builtin_shufflevector(a, b, 0, 1, 16, 17, 2, 3, 18, 19, 4, 5, 20, 21, 6, 7, 22, 23),
              threshold, scale);
      apply16(y + i + 16, x + i + 16,
              __builtin_shufflevector(a, b, 8, 9, 24, 25, 10, 11, 26, 27, 12, 13, 28, 29, 14, 15, 30, 31), threshold,
              scale);
    }
    for (; i < end; i += 4) {
      const auto bits = rng.bits(stream, static_cast<uint64_t>(i / 4));
      const int64_t m = std::min<int64_t>(4, end - i);
      for (int64_t j = 0; j < m; ++j) y[i + j] = (bits[static_cast<size_t>(j)] >> 8) >= threshold ? x[i + j] * scale : 0.f;
    }
  }
}

}  // namespace

void dropout_fwd(float* y, const float* x, int64_t n, float p, uint64_t seed, uint64_t stream) {
  dropout_apply("dropout_fwd", y, x, n, p, seed, stream);
}

// The same mask and scale applied to the gradient: d(x·keep/(1−p))/dx = keep/(1−p).
void dropout_bwd(float* dx, const float* dy, int64_t n, float p, uint64_t seed, uint64_t stream) {
  dropout_apply("dropout_bwd", dx, dy, n, p, seed, stream);
}

}  // namespace clattn::nn
