#include <algorithm>
#include <limits>

#include "clattn/error.h"
#include "cluster/cluster.h"
#include "core/microkernel.h"
#include "core/simd.h"

namespace clattn::cluster {

LshPlanes draw_planes(const Rng& rng, uint64_t stream, int bits, int64_t D, bool hash_bias) {
  check(bits >= 1 && bits <= kMaxBits, "lsh: bits must be in [1, 64], got ", bits);
  check(D >= 1, "lsh: the feature dim must be >= 1, got ", D);
  LshPlanes p;
  p.bits = bits;
  p.D = D;
  std::vector<float> rows(static_cast<size_t>(bits * D));  // (bits, D)
  for (int64_t i = 0; i < bits * D; ++i) rows[static_cast<size_t>(i)] = rng.normal(stream, static_cast<uint64_t>(i));
  p.panel.resize(static_cast<size_t>(D * mk::kPanel));
  mk::pack_panels(rows.data(), bits, D, D, p.panel.data());
  p.thresholds.assign(mk::kPanel, std::numeric_limits<float>::infinity());
  for (int b = 0; b < bits; ++b)
    p.thresholds[static_cast<size_t>(b)] = hash_bias ? rng.normal(stream, static_cast<uint64_t>(bits * D + b)) : 0.f;
  return p;
}

void hash_codes(const float* x, int64_t n, int64_t ld, const LshPlanes& planes, uint64_t* codes,
                float* scratch) {
  const simd::vf t0 = simd::load(planes.thresholds.data()), t1 = simd::load(planes.thresholds.data() + 16),
                 t2 = simd::load(planes.thresholds.data() + 32), t3 = simd::load(planes.thresholds.data() + 48);
  for (int64_t r0 = 0; r0 < n; r0 += kHashBlock) {
    const int64_t rows = std::min(kHashBlock, n - r0);
    // proj (rows, 64) = x (rows, D) · planesᵀ (D, 64)
    mk::gemm_abt(rows, 1, planes.D, x + r0 * ld, ld, planes.panel.data(), scratch, mk::kPanel);
    for (int64_t i = 0; i < rows; ++i) {
      const float* p = scratch + i * mk::kPanel;
      codes[r0 + i] = uint64_t{simd::mask_gt_v(simd::load(p), t0)} |
                      uint64_t{simd::mask_gt_v(simd::load(p + 16), t1)} << 16 |
                      uint64_t{simd::mask_gt_v(simd::load(p + 32), t2)} << 32 |
                      uint64_t{simd::mask_gt_v(simd::load(p + 48), t3)} << 48;
    }
  }
}

}  // namespace clattn::cluster
