// Internals shared by the nn layer files: the SIMD names they use and the size below which a
// call stays on one thread (an OpenMP region costs a few µs, more than a small pass).
#pragma once

#include <cstdint>

#include "core/simd.h"

namespace clattn::nn::detail {

using simd::kLanes;
using simd::load;
using simd::load_partial;
using simd::splat;
using simd::store;
using simd::store_partial;
using simd::vf;
using simd::vi;

inline constexpr int64_t kParallelMin = 32768;  // floats

}  // namespace clattn::nn::detail
