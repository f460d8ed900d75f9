// Seedable counter-based random numbers (Philox4x32-10, Salmon et al. 2011): the value at
// (seed, stream, index) is a pure function, so draws are reproducible in any order and from any
// thread, and forward and backward can regenerate the same planes.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

namespace clattn {

class Rng {
 public:
  explicit Rng(uint64_t seed) : key_{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)} {}

  // Four 32-bit words for counter (stream, index).
  std::array<uint32_t, 4> bits(uint64_t stream, uint64_t index) const {
    std::array<uint32_t, 4> c{static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                              static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)};
    std::array<uint32_t, 2> k = key_;
    for (int r = 0; r < 10; ++r) {
      const uint64_t p0 = uint64_t{0xD2511F53} * c[0];
      const uint64_t p1 = uint64_t{0xCD9E8D57} * c[2];
      c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
      k[0] += 0x9E3779B9u;
      k[1] += 0xBB67AE85u;
    }
    return c;
  }
  uint64_t u64(uint64_t stream, uint64_t index) const {
    auto b = bits(stream, index);
    return (uint64_t{b[0]} << 32) | b[1];
  }
  // Uniform in [0, 1) with 24 random bits.
  float uniform(uint64_t stream, uint64_t index) const {
    return static_cast<float>(bits(stream, index)[0] >> 8) * (1.0f / 16777216.0f);
  }
  // Standard normal (Box-Muller on two 32-bit words of the same counter).
  float normal(uint64_t stream, uint64_t index) const {
    auto b = bits(stream, index);
    const double u1 = (static_cast<double>(b[0]) + 1.0) * (1.0 / 4294967296.0);  // (0, 1]
    const double u2 = static_cast<double>(b[1]) * (1.0 / 4294967296.0);
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  // Uniform integer in [0, n) (n >= 1), nearly unbiased for n << 2^64.
  uint64_t below(uint64_t n, uint64_t stream, uint64_t index) const {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(u64(stream, index)) * n) >> 64);
  }

 private:
  std::array<uint32_t, 2> key_;
};

}  // namespace clattn
