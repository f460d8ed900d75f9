// The vector kernels of Hamming k-means, compiled once per ISA (CMakeLists.txt) into
// clattn::cluster::avx2 / ::avx512; kmeans.cpp calls the copy of the active ISA. The AVX-512 copy
// takes the VPOPCNTQ assignment only on CPUs that have AVX512-VPOPCNTDQ (Ice Lake, Zen 4 and
// later; not Skylake-X), chosen at run time: that instruction is outside x86-64-v4.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <vector>

#include "clattn/cpu.h"
#include "cluster/cluster.h"

#if !defined(CLATTN_ISA_NS)
#error "kmeans_isa.cpp is compiled once per ISA with CLATTN_ISA_NS set (CMakeLists.txt)"
#endif
#if defined(__AVX2__)
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

#if defined(__AVX2__)
// AVX2 has no vector popcount: a nibble table (vpshufb) counts the bits of each nibble and
// vpsadbw adds a u64's 16 counts. Each code and centroid is split into its low and high nibbles
// once (a centroid's once per call, a code's once per pass), so a distance's nibbles are one xor
// each; and the two lookups use tables of 4 + popcount and 4 - popcount, whose absolute
// differences, summed by vpsadbw, are the popcounts themselves (no add of the two lookups).
// Two vectors of 4 centroids give 8 distances, packed with the centroid index into 32-bit keys
// (distance << 24 | index), so one unsigned vpminud keeps the nearest centroid and, among equally
// near ones, the first. Six codes per pass share each centroid load (some of their registers
// spill, which costs less than reloading the centroids: one Zen 3 core, 16384 codes x 100
// centroids, 4.6 / 4.9 / 5.0 G pairs/s at 3 / 6 / 8 codes, 3.7 before the nibble split); every
// (code, lane) pair keeps its own running minimum, so no dependency chain runs through the loop
// (the scalar loop's compare-and-move chain cost ~2.7 cycles per pair on Zen 2).
constexpr int64_t kKeyIndexBits = 24;  // index field of a key: C < 2^24
constexpr uint64_t kNibbles = 0x0f0f0f0f0f0f0f0full;

inline uint32_t hmin_u32(__m256i v) {
  __m256i m = _mm256_min_epu32(v, _mm256_permute2x128_si256(v, v, 1));
  m = _mm256_min_epu32(m, _mm256_shuffle_epi32(m, 0x4E));
  m = _mm256_min_epu32(m, _mm256_shuffle_epi32(m, 0xB1));
  return static_cast<uint32_t>(_mm256_cvtsi256_si32(m));
}

void assign_avx2(const uint64_t* codes, int64_t n, const uint64_t* centroids, int64_t C, int32_t* assign,
                 uint32_t* dist) {
  constexpr int kCodes = 6;
  const int64_t groups = (C + 7) / 8;
  // (groups, 4, 4): per group of 8 centroids the low nibbles of its first 4 and last 4, then
  // the high nibbles of each; centroids past C are zero, their keys made absent below.
  thread_local std::vector<uint64_t> split;
  split.resize(static_cast<size_t>(groups * 16));
  for (int64_t c = 0; c < groups * 8; ++c) {
    const uint64_t v = c < C ? centroids[c] : 0;
    uint64_t* g = split.data() + (c / 8) * 16 + (c % 8) / 4 * 4 + c % 4;
    g[0] = v & kNibbles;
    g[8] = (v >> 4) & kNibbles;
  }
  alignas(32) uint32_t tail_off[8] = {};
  const int64_t last = (groups - 1) * 8;
  for (int l = 0; l < 8; ++l) {
    const int64_t c = last + (l % 2 == 0 ? l / 2 : 4 + l / 2);  // the centroid of key lane l
    tail_off[l] = c < C ? 0u : ~0u;
  }
  const __m256i plus = _mm256_setr_epi8(4, 5, 5, 6, 5, 6, 6, 7, 5, 6, 6, 7, 6, 7, 7, 8,
                                        4, 5, 5, 6, 5, 6, 6, 7, 5, 6, 6, 7, 6, 7, 7, 8);
  const __m256i minus = _mm256_setr_epi8(4, 3, 3, 2, 3, 2, 2, 1, 3, 2, 2, 1, 2, 1, 1, 0,
                                         4, 3, 3, 2, 3, 2, 2, 1, 3, 2, 2, 1, 2, 1, 1, 0);
  auto distances = [&](__m256i lo, __m256i hi) {  // (4) popcounts in u64 lanes
    return _mm256_sad_epu8(_mm256_shuffle_epi8(plus, lo), _mm256_shuffle_epi8(minus, hi));
  };
  // Key lane 2j holds centroid c0 + j (low half of u64 lane j of the first vector), 2j + 1
  // centroid c0 + 4 + j (the second vector's distances shifted into the high halves).
  const __m256i lane_index = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i absent = _mm256_load_si256(reinterpret_cast<const __m256i*>(tail_off));
  for (int64_t i = 0; i < n; i += kCodes) {
    const int cnt = static_cast<int>(std::min<int64_t>(kCodes, n - i));
    __m256i xlo[kCodes], xhi[kCodes], best[kCodes];
#pragma GCC unroll 8
    for (int u = 0; u < kCodes; ++u) {
      const uint64_t x = codes[i + (u < cnt - 1 ? u : cnt - 1)];
      xlo[u] = _mm256_set1_epi64x(static_cast<long long>(x & kNibbles));
      xhi[u] = _mm256_set1_epi64x(static_cast<long long>((x >> 4) & kNibbles));
      best[u] = _mm256_set1_epi32(-1);
    }
    for (int64_t g = 0; g < groups; ++g) {
      const __m256i* cg = reinterpret_cast<const __m256i*>(split.data() + g * 16);
      const __m256i alo = _mm256_loadu_si256(cg), blo = _mm256_loadu_si256(cg + 1);
      const __m256i ahi = _mm256_loadu_si256(cg + 2), bhi = _mm256_loadu_si256(cg + 3);
      const __m256i idx = _mm256_or_si256(_mm256_add_epi32(lane_index, _mm256_set1_epi32(static_cast<int>(g * 8))),
                                          g * 8 == last ? absent : _mm256_setzero_si256());
#pragma GCC unroll 8
      for (int u = 0; u < kCodes; ++u) {
        const __m256i da = distances(_mm256_xor_si256(alo, xlo[u]), _mm256_xor_si256(ahi, xhi[u]));
        const __m256i db = distances(_mm256_xor_si256(blo, xlo[u]), _mm256_xor_si256(bhi, xhi[u]));
        const __m256i key = _mm256_or_si256(
            _mm256_or_si256(_mm256_slli_epi64(da, kKeyIndexBits), _mm256_slli_epi64(db, 32 + kKeyIndexBits)), idx);
        best[u] = _mm256_min_epu32(best[u], key);
      }
    }
    for (int u = 0; u < cnt; ++u) {
      const uint32_t key = hmin_u32(best[u]);
      assign[i + u] = static_cast<int32_t>(key & ((1u << kKeyIndexBits) - 1u));
      if (dist) dist[i + u] = key >> kKeyIndexBits;
    }
  }
}

#endif

#if defined(__AVX2__) && !defined(__AVX512F__)
// counts (C, 64) += bits of each member's code: bit 8q + j of a code is lane j of the q-th vector
// of 8 counters, expanded by one variable shift and a mask (the scalar loop over set bits costs
// a dependent load-increment-store per bit).
void count_bits_avx2(const uint64_t* codes, const int32_t* assign, int64_t n, uint32_t* counts, uint32_t* sizes) {
  const __m256i shift = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), one = _mm256_set1_epi32(1);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t* cnt = counts + static_cast<int64_t>(assign[i]) * 64;
    ++sizes[assign[i]];
    const __m256i half[2] = {_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(codes[i]))),
                             _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(codes[i] >> 32)))};
#pragma GCC unroll 8
    for (int q = 0; q < 8; ++q) {
      const __m256i sh = _mm256_add_epi32(shift, _mm256_set1_epi32(8 * (q % 4)));
      const __m256i bits = _mm256_and_si256(_mm256_srlv_epi32(half[q / 4], sh), one);
      __m256i* c = reinterpret_cast<__m256i*>(cnt + 8 * q);
      _mm256_storeu_si256(c, _mm256_add_epi32(_mm256_loadu_si256(c), bits));
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
#if defined(__AVX2__)
  if (C < (int64_t{1} << kKeyIndexBits)) return assign_avx2(codes, n, centroids, C, assign, dist);
#endif
  assign_nearest_ref(codes, n, centroids, C, assign, dist);
}

// counts (C, 64) += bits of each member's code; sizes (C) += members.
void count_bits_isa(const uint64_t* codes, const int32_t* assign, int64_t n, uint32_t* counts,
                    uint32_t* sizes) {
#if defined(__AVX2__) && !defined(__AVX512F__)
  count_bits_avx2(codes, assign, n, counts, sizes);
#else
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
#endif
}

}  // namespace clattn::cluster::CLATTN_ISA_NS
