// The one SIMD wrapper: 16-lane float vectors as a GCC vector type, which is __m512 itself on
// AVX-512 targets (so intrinsics apply directly) and splits into narrower registers elsewhere.
// Only the few operations that need an instruction choice are written twice. Loops whose values
// must stay in registers use the native width `vn` (one register: 16 lanes with AVX-512, 8
// otherwise): outside AVX-512 GCC keeps 16-lane values that go through a reduction or a
// per-lane operation on the stack, which cost the row softmax of full attention a third of its
// time on an AVX2 machine. (The register-blocked tiles choose their shapes in microkernel.cpp.)
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

// Each ISA copy of the kernels (CLATTN_ISA_NS, set by CMake for src/core/microkernel_isa.cpp)
// gets its own inline namespace, so the inline functions here, compiled once per ISA, are distinct
// symbols: the linker can never hand the AVX-512 copy of one to code that runs on an AVX2 CPU.
#if !defined(CLATTN_ISA_NS)
#define CLATTN_ISA_NS base
#endif

namespace clattn::simd {
inline namespace CLATTN_ISA_NS {

#if defined(__AVX512F__)
// Full-mask forms of the intrinsics: the unmasked ones start from _mm512_undefined_ps(), which
// GCC 12 reports as maybe-uninitialized under -Werror.
inline constexpr __mmask16 kAll = 0xFFFF;
#endif

inline constexpr int kLanes = 16;
typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));


inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
// A broadcast (not vf{} + x: adding +0.0 is not an identity for -0.0, so that form costs an add).
inline vf splat(float x) { return vf{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }

// First n (0..16) lanes from p, the rest 0; never reads past p + n.
inline vf load_partial(const float* p, int n) {
#if defined(__AVX512F__)
  return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1u), p);
#else
  vf v{};
  for (int i = 0; i < n; ++i) v[i] = p[i];
  return v;
#endif
}
inline void store_partial(float* p, vf v, int n) {
#if defined(__AVX512F__)
  _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1u), v);
#else
  for (int i = 0; i < n; ++i) p[i] = v[i];
#endif
}

#if defined(__AVX2__) && !defined(__AVX512F__)
// The two 8-lane halves of a 16-lane vector and back. GCC lowers a 16-lane ?: outside AVX-512
// lane by lane (scalar compares and blends: the vectorised exp and GELU ran at a tenth of their
// speed), so the operations that need a choice are written on the halves.
typedef float vh __attribute__((vector_size(32)));
inline vh half_lo(vf v) { return __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7); }
inline vh half_hi(vf v) { return __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15); }
// A union of the halves, not a 16-lane shuffle: GCC assembles the shuffle lane by lane on the
// stack and keeps the union in two registers.
inline vf join(vh lo, vh hi) {
  union {
    vh h[2];
    vf f;
  } u{{lo, hi}};
  return u.f;
}
#endif

inline vf vmax(vf a, vf b) {
#if defined(__AVX512F__)
  return _mm512_mask_max_ps(a, kAll, a, b);
#elif defined(__AVX2__)
  // maxps(a, b) is a > b ? a : b, its second operand when either is NaN, as the generic form.
  return join(vh(_mm256_max_ps(__m256(half_lo(a)), __m256(half_lo(b)))),
              vh(_mm256_max_ps(__m256(half_hi(a)), __m256(half_hi(b)))));
#else
  return a > b ? a : b;
#endif
}
inline vf vmin(vf a, vf b) {
#if defined(__AVX512F__)
  return _mm512_mask_min_ps(a, kAll, a, b);
#elif defined(__AVX2__)
  return join(vh(_mm256_min_ps(__m256(half_lo(a)), __m256(half_lo(b)))),
              vh(_mm256_min_ps(__m256(half_hi(a)), __m256(half_hi(b)))));
#else
  return a < b ? a : b;
#endif
}

// Horizontal reductions as a halving tree of vector ops (the _mm512_reduce_* intrinsics start
// from undefined registers and trip GCC 12's -Wmaybe-uninitialized).
typedef float vf8 __attribute__((vector_size(32)));
typedef float vf4 __attribute__((vector_size(16)));
inline float hsum(vf v) {
  const vf8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const vf4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[1]) + (b[2] + b[3]);
}
inline float hmax(vf v) {
  const vf8 x = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7),
            y = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const vf8 a = x > y ? x : y;
  const vf4 p = __builtin_shufflevector(a, a, 0, 1, 2, 3), q = __builtin_shufflevector(a, a, 4, 5, 6, 7);
  const vf4 b = p > q ? p : q;
  const float m0 = b[0] > b[1] ? b[0] : b[1], m1 = b[2] > b[3] ? b[2] : b[3];
  return m0 > m1 ? m0 : m1;
}

// Bit l set when lane l of v is > lane l of t. On AVX2 one compare and one movemask per 8 lanes
// (the lane-by-lane loop cost the streaming top-k scan of every centroid score ~3 ops a lane).
inline uint32_t mask_gt_v(vf v, vf t) {
#if defined(__AVX512F__)
  return _mm512_cmp_ps_mask(v, t, _CMP_GT_OQ);
#elif defined(__AVX2__)
  typedef float h8 __attribute__((vector_size(32)));
  const h8 vl = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7), vh = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const h8 tl = __builtin_shufflevector(t, t, 0, 1, 2, 3, 4, 5, 6, 7), th = __builtin_shufflevector(t, t, 8, 9, 10, 11, 12, 13, 14, 15);
  const uint32_t lo = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(__m256(vl), __m256(tl), _CMP_GT_OQ)));
  const uint32_t hi = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(__m256(vh), __m256(th), _CMP_GT_OQ)));
  return lo | hi << 8;
#else
  uint32_t m = 0;
  for (int i = 0; i < kLanes; ++i) m |= static_cast<uint32_t>(v[i] > t[i]) << i;
  return m;
#endif
}

// Bit l set when lane l of v is > t.
inline uint32_t mask_gt(vf v, float t) { return mask_gt_v(v, splat(t)); }

// x * 2^n for integral n in [-200, 200] stored as float; exact, flushes to 0 / inf like ldexp.
inline vf scale_pow2(vf x, vf n) {
#if defined(__AVX512F__)
  return _mm512_mask_scalef_ps(x, kAll, x, n);
#else
  // Two half steps keep each power of two a normal float.
  const vi h = __builtin_convertvector(n, vi) >> 1;
  const vi rest = __builtin_convertvector(n, vi) - h;
  vf a, b;
  vi ea = (h + 127) << 23, eb = (rest + 127) << 23;
  std::memcpy(&a, &ea, sizeof a);
  std::memcpy(&b, &eb, sizeof b);
  return x * a * b;
#endif
}

// Round to nearest even of |x| <= 2^22 by adding and removing 1.5·2^23 (the float sum rounds
// away the fraction): plain vector arithmetic, which stays in registers on every target, where a
// rounding instruction outside AVX-512 costs a trip through memory for 16-lane vectors.
inline vf round_small(vf x) {
  const vf big = splat(12582912.f);
  return (x + big) - big;
}

// 2^x, relative error ~1e-7 (results below 2^-126 may be flushed to 0); 2^-inf = 0, saturates
// to inf. Callers never pass NaN (inputs are
// validated; masks are -inf).
#if defined(__AVX512F__)
// AVX-512: r = x − floor(x) in one vreduceps and 2^floor(x) inside vscalefps, with a degree-6
// minimax polynomial for 2^r on [0, 1) (relative error 6.3e-8 evaluated in f32): 11 operations
// where the portable form below takes 13, in the row pass that is the softmax of every
// flash-style tile. Results below 2^-126 are 0 (no subnormals): a vscalefps that underflows takes
// a microcode assist on Intel cores, and a row of masked (-inf) scores then ran 11x slower.
inline vf exp2(vf x) {
  const __mmask16 normal = _mm512_cmp_ps_mask(x, splat(-126.f), _CMP_GE_OQ);
  x = vmin(vmax(x, splat(-126.f)), splat(200.f));
  const vf r = _mm512_maskz_reduce_ps(kAll, x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  vf p = splat(2.1702748199459165e-04f);
  p = p * r + 1.2439744314178824e-03f;
  p = p * r + 9.6788080409169200e-03f;
  p = p * r + 5.5483374744653700e-02f;
  p = p * r + 2.4022983014583588e-01f;
  p = p * r + 6.9314700365066530e-01f;
  p = p * r + 1.f;
  return _mm512_maskz_scalef_ps(normal, p, x);
}
#else
// Taylor degree 7 on [-1/2, 1/2].
inline vf exp2(vf x) {
  x = vmin(vmax(x, splat(-200.f)), splat(200.f));
  const vf n = round_small(x);
  const vf r = (x - n) * 0.693147180559945309f;  // 2^(x-n) = e^r, |r| <= ln2/2
  vf p = splat(1.f / 5040.f);
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  return scale_pow2(p, n);
}
#endif

// e^x with Cody-Waite range reduction (ln2 split in two), relative error ~1e-7. Arguments are
// clamped to [lo, hi]: the default lo lets results run into the denormals and down to 0, and a
// caller whose tail terms do not matter passes a higher one to keep every result normal.
inline vf exp(vf x, float lo = -150.f, float hi = 100.f) {
  x = vmin(vmax(x, splat(lo)), splat(hi));
  const vf n = round_small(x * 1.44269504088896341f);
  const vf r = (x - n * 0.693145751953125f) - n * 1.42860682030941723212e-6f;
  vf p = splat(1.f / 5040.f);
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  return scale_pow2(p, n);
}

#if defined(__AVX2__) && !defined(__AVX512F__)
// In-place transpose of an 8 x 8 block of 8-lane rows: unpack pairs, shuffle quads, swap 128-bit
// halves (24 shuffles for 64 floats).
inline void transpose8(vh r[8]) {
  __m256 t[8], u[8];
  for (int j = 0; j < 4; ++j) {
    t[2 * j] = _mm256_unpacklo_ps(__m256(r[2 * j]), __m256(r[2 * j + 1]));
    t[2 * j + 1] = _mm256_unpackhi_ps(__m256(r[2 * j]), __m256(r[2 * j + 1]));
  }
  for (int j = 0; j < 2; ++j) {
    u[4 * j] = _mm256_shuffle_ps(t[4 * j], t[4 * j + 2], 0x44);
    u[4 * j + 1] = _mm256_shuffle_ps(t[4 * j], t[4 * j + 2], 0xEE);
    u[4 * j + 2] = _mm256_shuffle_ps(t[4 * j + 1], t[4 * j + 3], 0x44);
    u[4 * j + 3] = _mm256_shuffle_ps(t[4 * j + 1], t[4 * j + 3], 0xEE);
  }
  for (int j = 0; j < 4; ++j) {
    r[j] = vh(_mm256_permute2f128_ps(u[j], u[4 + j], 0x20));
    r[4 + j] = vh(_mm256_permute2f128_ps(u[j], u[4 + j], 0x31));
  }
}

// In-place transpose of a 16 x 16 block held as 16 vectors (r[j] = row j), as four 8 x 8 blocks
// of the halves: the 16-lane shuffles of the generic form are assembled lane by lane on AVX2
// (576 scalar inserts and extracts per block in the K packing of every attention).
inline void transpose16(vf r[16]) {
  vh a[8], b[8], c[8], d[8];  // rows 0-7 low and high halves, rows 8-15 low and high halves
  for (int j = 0; j < 8; ++j) {
    a[j] = half_lo(r[j]);
    b[j] = half_hi(r[j]);
    c[j] = half_lo(r[8 + j]);
    d[j] = half_hi(r[8 + j]);
  }
  transpose8(a);
  transpose8(b);
  transpose8(c);
  transpose8(d);
  for (int j = 0; j < 8; ++j) {
    r[j] = join(a[j], c[j]);
    r[8 + j] = join(b[j], d[j]);
  }
}
#else
// In-place transpose of a 16 x 16 block held as 16 vectors (r[j] = row j): four stages, each
// swapping the off-diagonal h x h sub-blocks of every 2h x 2h block (h = 8, 4, 2, 1).
inline void transpose16(vf r[16]) {
#define CLATTN_T16_STAGE(H, ...)                                              \
  for (int j = 0; j < 16; ++j) {                                              \
    if (j & H) continue;                                                      \
    const vf a = r[j], b = r[j + H];                                          \
    r[j] = __builtin_shufflevector(a, b, __VA_ARGS__);                        \
    r[j + H] = __builtin_shufflevector(a, b, CLATTN_T16_HI_##H);              \
  }
#define CLATTN_T16_HI_8 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define CLATTN_T16_HI_4 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31
#define CLATTN_T16_HI_2 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31
#define CLATTN_T16_HI_1 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31
  CLATTN_T16_STAGE(8, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
  CLATTN_T16_STAGE(4, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27)
  CLATTN_T16_STAGE(2, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29)
  CLATTN_T16_STAGE(1, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30)
#undef CLATTN_T16_STAGE
#undef CLATTN_T16_HI_8
#undef CLATTN_T16_HI_4
#undef CLATTN_T16_HI_2
#undef CLATTN_T16_HI_1
}
#endif

// dst[0, n) = src[0, n) · s, then zeros up to n_pad: the row copy of every packer and gather.
inline void copy_row(float* dst, const float* src, int64_t n, int64_t n_pad, float s = 1.f) {
  int64_t e = 0;
  for (; e + kLanes <= n; e += kLanes) store(dst + e, load(src + e) * s);
  if (e < n) {
    store_partial(dst + e, load_partial(src + e, static_cast<int>(n - e)) * s, static_cast<int>(n - e));
    e = n;
  }
  for (; e < n_pad; ++e) dst[e] = 0.f;
}

// Asks for the cache lines of a row of n floats ahead of a random-order read or write (rows of
// q and out are visited in cluster order, i.e. at random; the misses dominate otherwise).
// On x86 the instruction is emitted through asm volatile: GCC 12 deletes __builtin_prefetch
// calls of a fully unrolled row under a condition (seen in the gathers of gather.h, where not one
// prefetch survived in the object code).
inline void prefetch_line(const float* p, bool for_write) {
#if defined(__x86_64__)
  if (for_write) asm volatile("prefetchw %0" : : "m"(*reinterpret_cast<const char*>(p)));
  else asm volatile("prefetcht0 %0" : : "m"(*reinterpret_cast<const char*>(p)));
#else
  if (for_write) __builtin_prefetch(p, 1, 3);
  else __builtin_prefetch(p, 0, 3);
#endif
}
inline void prefetch_row(const float* p, int64_t n, bool for_write) {
  for (int64_t e = 0; e < n; e += 16) prefetch_line(p + e, for_write);
}
// Into L2 only (prefetcht1): for rows wanted several blocks ahead.
inline void prefetch_row_l2(const float* p, int64_t n) {
  for (int64_t e = 0; e < n; e += 16) {
#if defined(__x86_64__)
    asm volatile("prefetcht1 %0" : : "m"(*reinterpret_cast<const char*>(p + e)));
#else
    __builtin_prefetch(p + e, 0, 2);
#endif
  }
}

// dst[0, n) = a · x[0, n) + y[0, n).
inline void axpby_row(float* dst, float a, const float* x, const float* y, int64_t n) {
  int64_t e = 0;
  for (; e + kLanes <= n; e += kLanes) store(dst + e, load(x + e) * a + load(y + e));
  if (e < n) {
    const int r = static_cast<int>(n - e);
    store_partial(dst + e, load_partial(x + e, r) * a + load_partial(y + e, r), r);
  }
}

// dst[0, n) = src[0, n) for a row written once and not read again soon (a round's output in its
// random destination row): non-temporal stores when dst is 64-byte aligned and n a multiple of
// 16, so the row costs no read-for-ownership and evicts nothing; plain stores otherwise. Call
// store_fence() before other threads read the rows.
inline void stream_row(float* dst, const float* src, int64_t n) {
#if defined(__AVX512F__)
  if ((reinterpret_cast<uintptr_t>(dst) & 63) == 0 && n % kLanes == 0) {
    for (int64_t e = 0; e < n; e += kLanes) _mm512_stream_ps(dst + e, _mm512_loadu_ps(src + e));
    return;
  }
#endif
  std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(n));
}
inline void store_fence() {
#if defined(__AVX512F__)
  _mm_sfence();
#endif
}

// dst[0, n) = a · dst[0, n) + b · x[0, n).
inline void blend_row(float* dst, float a, const float* x, float b, int64_t n) {
  int64_t e = 0;
  for (; e + kLanes <= n; e += kLanes) store(dst + e, load(dst + e) * a + load(x + e) * b);
  if (e < n) {
    const int r = static_cast<int>(n - e);
    store_partial(dst + e, load_partial(dst + e, r) * a + load_partial(x + e, r) * b, r);
  }
}

// Σ a[e]·b[e] over n floats.
inline float dot(const float* a, const float* b, int64_t n) {
  vf acc{};
  int64_t e = 0;
  for (; e + kLanes <= n; e += kLanes) acc += load(a + e) * load(b + e);
  if (e < n) {
    const int r = static_cast<int>(n - e);
    acc += load_partial(a + e, r) * load_partial(b + e, r);
  }
  return hsum(acc);
}

// dst[0, n) += src[0, n) · s (explicit vectors: compilers keep this scalar when they cannot prove
// dst and src apart).
inline void axpy_row(float* dst, const float* src, int64_t n, float s = 1.f) {
  int64_t e = 0;
  for (; e + kLanes <= n; e += kLanes) store(dst + e, load(dst + e) + load(src + e) * s);
  if (e < n) {
    const int r = static_cast<int>(n - e);
    store_partial(dst + e, load_partial(dst + e, r) + load_partial(src + e, r) * s, r);
  }
}

// ---- Native width: one register.
#if defined(__AVX512F__)
using vn = vf;
using vni = vi;
inline constexpr int kNative = 16;
#else
typedef float vn __attribute__((vector_size(32)));
typedef int32_t vni __attribute__((vector_size(32)));
inline constexpr int kNative = 8;
#endif
static_assert(kLanes % kNative == 0, "padded widths must hold whole native vectors");

inline vn load_n(const float* p) {
  vn v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store_n(float* p, vn v) { std::memcpy(p, &v, sizeof v); }
inline vn splat_n(float x) {
  vn v;
  for (int i = 0; i < kNative; ++i) v[i] = x;
  return v;
}

#if defined(__AVX512F__)
inline vn vmax_n(vn a, vn b) { return vmax(a, b); }
inline vn vmin_n(vn a, vn b) { return vmin(a, b); }
inline vn exp_n(vn x, float lo = -150.f, float hi = 100.f) { return exp(x, lo, hi); }
inline vn exp2_n(vn x) { return exp2(x); }
inline float hmax_n(vn v) { return hmax(v); }
inline float hsum_n(vn v) { return hsum(v); }
#else
// 2^x in one register, for the row passes' arguments: scores minus their row's max or log-sum-exp,
// at most a rounding above 0 (or -inf). Results below 2^-125 are 0 and arguments above 127 give
// 2^127·2^frac (finite): 15 operations, where the 16-lane form above costs 27 on AVX2 (two
// compare-blends per clamp, a two-step exponent); the exponent goes straight into the bits of
// the polynomial, a degree-6 minimax for 2^r on [-1/2, 1/2] (relative error 7.9e-8 in f32).
inline vn exp2_n(vn x) {
  const vni live = x >= -125.f;  // all ones where the result is a normal float
#if defined(__AVX2__)
  x = vn(_mm256_min_ps(_mm256_max_ps(__m256(x), _mm256_set1_ps(-125.f)), _mm256_set1_ps(127.f)));
#else
  x = x < -125.f ? splat_n(-125.f) : x;
  x = x > 127.f ? splat_n(127.f) : x;
#endif
  const vn big = splat_n(12582912.f);
  const vn n = (x + big) - big;  // round to nearest even (see round_small)
  const vn r = x - n;            // [-1/2, 1/2]
  vn p = splat_n(1.5346036525e-04f);
  p = p * r + 1.3400026364e-03f;
  p = p * r + 9.6184890717e-03f;
  p = p * r + 5.5503286421e-02f;
  p = p * r + 2.4022646248e-01f;
  p = p * r + 6.9314718246e-01f;
  p = p * r + 1.f;
  vni bits;
  std::memcpy(&bits, &p, sizeof bits);
  bits = (bits + (__builtin_convertvector(n, vni) << 23)) & live;
  std::memcpy(&p, &bits, sizeof p);
  return p;
}
// maxps/minps semantics (the second operand when either is NaN), as vmax/vmin.
inline vn vmax_n(vn a, vn b) {
#if defined(__AVX2__)
  return vn(_mm256_max_ps(__m256(a), __m256(b)));
#else
  return a > b ? a : b;
#endif
}
inline vn vmin_n(vn a, vn b) {
#if defined(__AVX2__)
  return vn(_mm256_min_ps(__m256(a), __m256(b)));
#else
  return a < b ? a : b;
#endif
}
// exp of the 16-lane form in one register, operation for operation (the same bits per lane).
inline vn exp_n(vn x, float lo = -150.f, float hi = 100.f) {
  x = vmin_n(vmax_n(x, splat_n(lo)), splat_n(hi));
  const vn big = splat_n(12582912.f);
  const vn n = (x * 1.44269504088896341f + big) - big;
  const vn r = (x - n * 0.693145751953125f) - n * 1.42860682030941723212e-6f;
  vn p = splat_n(1.f / 5040.f);
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const vni h = __builtin_convertvector(n, vni) >> 1;
  const vni rest = __builtin_convertvector(n, vni) - h;
  vn a, b;
  const vni ea = (h + 127) << 23, eb = (rest + 127) << 23;
  std::memcpy(&a, &ea, sizeof a);
  std::memcpy(&b, &eb, sizeof b);
  return p * a * b;
}
typedef float vn4 __attribute__((vector_size(16)));
inline float hmax_n(vn v) {
  const vn4 x = __builtin_shufflevector(v, v, 0, 1, 2, 3), y = __builtin_shufflevector(v, v, 4, 5, 6, 7);
  const vn4 a = x > y ? x : y;
  const float m0 = a[0] > a[1] ? a[0] : a[1], m1 = a[2] > a[3] ? a[2] : a[3];
  return m0 > m1 ? m0 : m1;
}
inline float hsum_n(vn v) {
  const vn4 a = __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
  return (a[0] + a[1]) + (a[2] + a[3]);
}
#endif

}  // namespace CLATTN_ISA_NS
}  // namespace clattn::simd
