// Rotary position embedding (nn.h) and its backward: per row, the angles pos·θ_i in double,
// reduced modulo π/2 in double (so positions in the tens of thousands keep ~1e-7 accuracy), then
// sin and cos of the reduced angle as float polynomials over vectors, and the rotation of every
// head with them (by −θ in the backward).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "clattn/error.h"
#include "clattn/nn.h"
#include "core/simd.h"

namespace clattn::nn {

namespace {

using simd::kLanes;
using simd::load;
using simd::load_partial;
using simd::store;
using simd::store_partial;
using simd::vf;
using simd::vi;

constexpr int64_t kPairs = 128;         // pairs (i < head_dim / 2) per block: head_dim <= 256 in one
constexpr int64_t kRowsPerItem = 16;    // rows per OpenMP work item (one θ table per item)
constexpr int64_t kParallelMin = 32768;

// π/2 = kPio2Hi + kPio2Lo with kPio2Hi of 33 bits (fdlibm's pio2_1 / pio2_1t): k·kPio2Hi is exact
// for |k| < 2^20, i.e. angles below ~1.6e6.
constexpr double kPio2Hi = 1.57079632673412561417e+00;
constexpr double kPio2Lo = 6.07710050650619224932e-11;
constexpr double kTwoOverPi = 0.63661977236758134308;

// s[i], c[i] = sin, cos of (q[i]·π/2 + r[i]) for i < n, |r| <= π/4 (Taylor to degree 9 / 10:
// truncation < 2e-9, so float rounding dominates).
void sincos_reduced(const float* r, const int32_t* q, float* s, float* c, int64_t n) {
  for (int64_t i = 0; i < n; i += kLanes) {
    const int m = static_cast<int>(std::min<int64_t>(kLanes, n - i));
    vf x;
    vi k;
    if (m == kLanes) {
      x = load(r + i);
      std::memcpy(&k, q + i, sizeof k);
    } else {
      x = load_partial(r + i, m);
      k = vi{};
      std::memcpy(&k, q + i, sizeof(int32_t) * static_cast<size_t>(m));
    }
    const vf x2 = x * x;
    const vf sp = x + x * x2 * (-1.f / 6 + x2 * (1.f / 120 + x2 * (-1.f / 5040 + x2 * (1.f / 362880))));
    const vf cp = 1.f + x2 * (-0.5f + x2 * (1.f / 24 + x2 * (-1.f / 720 + x2 * (1.f / 40320 + x2 * (-1.f / 3628800)))));
    // sin(kπ/2 + x) = sp, cp, −sp, −cp and cos(kπ/2 + x) = cp, −sp, −cp, sp for k mod 4 = 0..3.
    const vi odd = (k & 1) != 0;
    vf sv = odd ? cp : sp, cv = odd ? sp : cp;
    vi sb, cb;
    std::memcpy(&sb, &sv, sizeof sb);
    std::memcpy(&cb, &cv, sizeof cb);
    sb ^= (k & 2) << 30;
    cb ^= ((k + 1) & 2) << 30;
    std::memcpy(&sv, &sb, sizeof sv);
    std::memcpy(&cv, &cb, sizeof cv);
    if (m == kLanes) {
      store(s + i, sv);
      store(c + i, cv);
    } else {
      store_partial(s + i, sv, m);
      store_partial(c + i, cv, m);
    }
  }
}

// The rotation of one head's pairs [0, n) (a = x[i], b = x[i + h]) by angles with cos c, sin s.
void rotate(float* a, float* b, const float* c, const float* s, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const vf x1 = load(a + i), x2 = load(b + i), cv = load(c + i), sv = load(s + i);
    store(a + i, x1 * cv - x2 * sv);
    store(b + i, x2 * cv + x1 * sv);
  }
  if (i < n) {
    const int m = static_cast<int>(n - i);
    const vf x1 = load_partial(a + i, m), x2 = load_partial(b + i, m);
    const vf cv = load_partial(c + i, m), sv = load_partial(s + i, m);
    store_partial(a + i, x1 * cv - x2 * sv, m);
    store_partial(b + i, x2 * cv + x1 * sv, m);
  }
}

// Rotates every head of every row by +θ (forward) or −θ (backward: a rotation's transpose is its
// inverse, and sin(−θ) = −sin θ, so the backward is the forward with s negated).
void rope_apply(const char* name, float* x, int64_t ld, int64_t head_stride, const int32_t* pos,
                int64_t rows, int64_t heads, int64_t head_dim, float theta, bool inverse) {
  check(rows >= 0 && heads >= 0, name, ": rows and heads must be >= 0, got rows=", rows, " heads=", heads);
  check(head_dim >= 2 && head_dim % 2 == 0, name, ": head_dim must be even and >= 2, got ", head_dim);
  check(theta > 0.f && std::isfinite(theta), name, ": theta must be finite and > 0, got ", theta);
  check(heads <= 1 || head_stride >= head_dim, name, ": head_stride must be >= head_dim, got head_stride=",
        head_stride, " head_dim=", head_dim);
  check(rows <= 1 || heads == 0 || ld >= (heads - 1) * head_stride + head_dim,
        name, ": row stride ld must cover the heads of a row: ld=", ld, " heads=", heads,
        " head_stride=", head_stride, " head_dim=", head_dim);
  if (rows == 0 || heads == 0) return;
  check(x != nullptr && pos != nullptr, name, ": x and pos must not be null");
  const int64_t h = head_dim / 2, items = (rows + kRowsPerItem - 1) / kRowsPerItem;
#pragma omp parallel for schedule(static) if (rows * heads * head_dim > kParallelMin)
  for (int64_t it = 0; it < items; ++it) {
    const int64_t r0 = it * kRowsPerItem, r1 = std::min(rows, r0 + kRowsPerItem);
    double inv_freq[kPairs];
    float red[kPairs], s[kPairs], c[kPairs];
    int32_t quad[kPairs];
    for (int64_t i0 = 0; i0 < h; i0 += kPairs) {
      const int64_t n = std::min(kPairs, h - i0);
      for (int64_t i = 0; i < n; ++i)  // θ^(−2i/head_dim)
        inv_freq[i] = std::pow(static_cast<double>(theta), -2.0 * static_cast<double>(i0 + i) / static_cast<double>(head_dim));
      for (int64_t r = r0; r < r1; ++r) {
        const double p = pos[r];
        for (int64_t i = 0; i < n; ++i) {
          const double a = p * inv_freq[i];
          const double k = std::nearbyint(a * kTwoOverPi);
          red[i] = static_cast<float>((a - k * kPio2Hi) - k * kPio2Lo);
          quad[i] = static_cast<int32_t>(static_cast<int64_t>(k) & 3);
        }
        sincos_reduced(red, quad, s, c, n);
        if (inverse)
          for (int64_t i = 0; i < n; ++i) s[i] = -s[i];
        float* row = x + r * ld;
        for (int64_t hd = 0; hd < heads; ++hd) {
          float* head = row + hd * head_stride;  // (head_dim)
          rotate(head + i0, head + h + i0, c, s, n);
        }
      }
    }
  }
}

}  // namespace

void rope_fwd(float* x, int64_t ld, int64_t head_stride, const int32_t* pos, int64_t rows,
              int64_t heads, int64_t head_dim, float theta) {
  rope_apply("rope_fwd", x, ld, head_stride, pos, rows, heads, head_dim, theta, false);
}

void rope_bwd(float* dx, int64_t ld, int64_t head_stride, const int32_t* pos, int64_t rows,
              int64_t heads, int64_t head_dim, float theta) {
  rope_apply("rope_bwd", dx, ld, head_stride, pos, rows, heads, head_dim, theta, true);
}

}  // namespace clattn::nn
