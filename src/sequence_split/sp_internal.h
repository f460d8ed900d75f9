// What the sequence-split kernels share (include/clattn/seq_parallel.h): per-batch lengths of a
// split's pieces.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace clattn::sp {

// Valid positions of each batch row inside [start, start + len) of the sequence: lengths (B)
// clamped, or len when the inputs have no lengths.
std::vector<int32_t> piece_lengths(std::span<const int32_t> global, int64_t B, int64_t start, int64_t len);

}  // namespace clattn::sp
