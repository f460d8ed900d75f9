#include <cstring>

#include "cluster/cluster.h"

namespace clattn::cluster {

void sort_by_key(const float* key, int64_t n, int32_t* order, RadixScratch& ws) {
  if (n <= 0) return;
  ws.keys.resize(static_cast<size_t>(n));
  ws.keys2.resize(static_cast<size_t>(n));
  ws.idx2.resize(static_cast<size_t>(n));
  // Order-preserving map of IEEE floats to unsigned integers: flip all bits of negatives, the
  // sign bit of positives.
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, key + i, 4);
    ws.keys[static_cast<size_t>(i)] = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    order[i] = static_cast<int32_t>(i);
  }
  uint32_t* src_k = ws.keys.data();
  uint32_t* dst_k = ws.keys2.data();
  int32_t* src_i = order;
  int32_t* dst_i = ws.idx2.data();
  constexpr int kBits = 11, kBuckets = 1 << kBits;
  for (int shift = 0; shift < 32; shift += kBits) {
    int64_t count[kBuckets + 1] = {};
    for (int64_t i = 0; i < n; ++i) ++count[((src_k[i] >> shift) & (kBuckets - 1)) + 1];
    for (int b = 0; b < kBuckets; ++b) count[b + 1] += count[b];
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = count[(src_k[i] >> shift) & (kBuckets - 1)]++;
      dst_k[pos] = src_k[i];
      dst_i[pos] = src_i[i];
    }
    std::swap(src_k, dst_k);
    std::swap(src_i, dst_i);
  }
  // Three passes: the result sits in the scratch index buffer.
  if (src_i != order) std::memcpy(order, src_i, sizeof(int32_t) * static_cast<size_t>(n));
}

}  // namespace clattn::cluster
