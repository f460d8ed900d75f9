// The vector kernels of Hamming k-means, compiled once per ISA (CMakeLists.txt) into
// clattn::cluster::avx2 / ::avx512; kmeans.cpp calls the copy of the active ISA. The AVX-512 copy
// takes the VPOPCNTQ assignment only on CPUs that have AVX512-VPOPCNTDQ (Ice Lake, Zen 4 and
// later; not Skylake-X), chosen at run time: that instruction is outside x86-64-v4.
#include <algorithm>
#include <bit>
#include <cstdint>

#include "clattn/cpu.h"
#include "cluster/cluster.h"

#if !defined(CLATTN_ISA_NS)
#error "kmeans_isa.cpp is compiled once per ISA with CLATTN_ISA_NS set (CMakeLists.txt)"
#endif
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace clattn::cluster::CLATTN_ISA_NS {
namespace {

#if defined(__AVX512F__)
typedef unsigned long long u64x8 __attribute__((vector_size(64)));
typedef unsigned long long u64x4 __attribute__((vector_size(32)));
typedef unsigned long long u64x2 __attribute__((vector_size(16)));
// Horizontal unsigned min in registers (storing the lanes to an array made GCC spill the
// accumulators of the hot loop to the stack on every iteration).
inline uint64_t hmin_u64(u64x8 v) {
  const u64x4 a = __builtin_shufflevector(v, v, 0, 1, 2, 3), b = __builtin_shufflevector(v, v, 4, 5, 6, 7);
  const u64x4 m = a < b ? a : b;
  const u64x2 c = __builtin_shufflevector(m, m, 0, 1), d = __builtin_shufflevector(m, m, 2, 3);
  const u64x2 e = c < d ? c : d;
  return e[0] < e[1] ? e[0] : e[1];
}

__attribute__((target("avx512vpopcntdq"))) void assign_vpopcnt(const uint64_t* codes, int64_t n,
                                                               const uint64_t* centroids, int64_t C,
                                                               int32_t* assign, uint32_t* dist) {
  // Key = distance << 32 | centroid index: one unsigned min keeps the nearest centroid and, among
  // equally near ones, the first. Several codes per pass share each centroid load.
  constexpr int kCodes = 8;
  const __m512i lane = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  for (int64_t i = 0; i < n; i += kCodes) {
    const int cnt = static_cast<int>(std::min<int64_t>(kCodes, n - i));
    __m512i x[kCodes], best[kCodes];
#pragma GCC unroll 8
    for (int u = 0; u < kCodes; ++u) {
      x[u] = _mm512_set1_epi64(static_cast<long long>(codes[i + (u < cnt - 1 ? u : cnt - 1)]));
      best[u] = _mm512_set1_epi64(-1);
    }
    for (int64_t c0 = 0; c0 < C; c0 += 8) {
      const __mmask8 m = C - c0 >= 8 ? static_cast<__mmask8>(0xFF)
                                     : static_cast<__mmask8>((1u << (C - c0)) - 1u);
      const __m512i cv = _mm512_maskz_loadu_epi64(m, centroids + c0);
      const u64x8 idx = (u64x8)lane + static_cast<unsigned long long>(c0);
#pragma GCC unroll 8
      for (int u = 0; u < kCodes; ++u) {
        // Vector-extension shift and or: the unmasked shift intrinsic trips GCC 12's
        // -Wmaybe-uninitialized.
        const __m512i key = (__m512i)(((u64x8)_mm512_popcnt_epi64(cv ^ x[u]) << 32) | idx);
        best[u] = _mm512_mask_min_epu64(best[u], m, best[u], key);
      }
    }
    uint64_t res[kCodes];
#pragma GCC unroll 8
    for (int u = 0; u < kCodes; ++u) res[u] = hmin_u64((u64x8)best[u]);  // constant trip count keeps best[] in registers
    for (int u = 0; u < cnt; ++u) {
      const uint64_t b = res[u];
      assign[i + u] = static_cast<int32_t>(b & 0xFFFFFFFFu);
      if (dist) dist[i + u] = static_cast<uint32_t>(b >> 32);
    }
  }
}
#endif

}  // namespace

void assign_nearest_isa(const uint64_t* codes, int64_t n, const uint64_t* centroids, int64_t C,
                        int32_t* assign, uint32_t* dist) {
#if defined(__AVX512F__)
  static const bool vpopcnt = cpu_features().avx512_vpopcntdq;
  if (vpopcnt) return assign_vpopcnt(codes, n, centroids, C, assign, dist);
#endif
  assign_nearest_ref(codes, n, centroids, C, assign, dist);
}

// counts (C, 64) += bits of each member's code; sizes (C) += members.
void count_bits_isa(const uint64_t* codes, const int32_t* assign, int64_t n, uint32_t* counts,
                    uint32_t* sizes) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t* cnt = counts + static_cast<int64_t>(assign[i]) * 64;
    ++sizes[assign[i]];
#if defined(__AVX512F__)
    const __m512i one = _mm512_set1_epi32(1);
    for (int q = 0; q < 4; ++q) {
      const __mmask16 m = static_cast<__mmask16>(codes[i] >> (16 * q));
      __m512i v = _mm512_loadu_si512(cnt + 16 * q);
      _mm512_storeu_si512(cnt + 16 * q, _mm512_mask_add_epi32(v, m, v, one));
    }
#else
    for (uint64_t x = codes[i]; x; x &= x - 1) ++cnt[std::countr_zero(x)];
#endif
  }
}

}  // namespace clattn::cluster::CLATTN_ISA_NS
