// Scalar conversions between f32 and the 16-bit floats a KV cache may hold: IEEE binary16 (f16:
// 5-bit exponent, 10-bit mantissa, largest finite 65504) and bfloat16 (bf16: f32's exponent, 7-bit
// mantissa). Narrowing rounds to nearest, ties to even, as F16C's vcvtps2ph does with rounding
// mode 0, so the vector and scalar paths store the same bits. Used where no vector instruction
// applies (tails, the portable build) and by tests as the reference.
#pragma once

#include <cstdint>
#include <cstring>

namespace clattn::half {

inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// f32 -> f16, round to nearest even. Magnitudes that round past 65504 become inf; NaN stays NaN
// (quiet); values below f16's smallest subnormal (2^-24) round to ±0.
inline uint16_t f32_to_f16(float f) {
  const uint32_t x = bits(f), sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x47800000u)  // >= 2^16 (rounds to inf), inf or NaN
    return static_cast<uint16_t>(sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (ax < 0x38800000u) {  // below 2^-14: an f16 subnormal (or zero)
    // Adding 0.5 lines the f16 subnormal's mantissa up with f32's low bits; the FPU rounds.
    const float v = from_bits(ax) + 0.5f;
    return static_cast<uint16_t>(sign | (bits(v) - 0x3f000000u));
  }
  const uint32_t odd = (ax >> 13) & 1u;
  ax += 0xc8000fffu + odd;  // rebias the exponent (127 -> 15) and round the 13 dropped bits
  return static_cast<uint16_t>(sign | (ax >> 13));
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, e = h & 0x7c00u, m = h & 0x3ffu;
  if (e == 0x7c00u) return from_bits(sign | 0x7f800000u | (m << 13));  // inf, NaN
  if (e == 0) {                                                         // zero, subnormal
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;     // m · 2^-24
    return from_bits(sign | bits(v));
  }
  return from_bits(sign | ((static_cast<uint32_t>(h & 0x7fffu) << 13) + 0x38000000u));
}

// f32 -> bf16, round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  const uint32_t x = bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

inline float bf16_to_f32(uint16_t h) { return from_bits(static_cast<uint32_t>(h) << 16); }

}  // namespace clattn::half
