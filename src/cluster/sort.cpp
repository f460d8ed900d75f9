#include <cstring>

#include "cluster/cluster.h"

namespace clattn::cluster {

void sort_by_key(const float* key, int64_t n, int32_t* order, RadixScratch& ws) {
  if (n <= 0) return;
  ws.keys.resize(static_cast<size_t>(n));
  ws.keys2.resize(static_cast<size_t>(n));
  ws.idx2.resize(static_cast<size_t>(n));
  ws.idx3.resize(static_cast<size_t>(n));
  constexpr int kBits = 11, kBuckets = 1 << kBits, kPasses = 3;
  constexpr uint32_t kMask = kBuckets - 1;
  // Order-preserving map of IEEE floats to unsigned integers (flip all bits of negatives, the
  // sign bit of positives), and the histograms of all three digits in the same read.
  std::vector<uint32_t>& count = ws.count;
  count.assign(static_cast<size_t>(kPasses * kBuckets), 0);
  uint32_t* keys = ws.keys.data();
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, key + i, 4);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    keys[i] = u;
    ++count[u & kMask];
    ++count[kBuckets + ((u >> kBits) & kMask)];
    ++count[2 * kBuckets + (u >> (2 * kBits))];
  }
  for (int p = 0; p < kPasses; ++p) {  // exclusive prefix sums: the first slot of each digit
    uint32_t* c = count.data() + p * kBuckets;
    uint32_t run = 0;
    for (int b = 0; b < kBuckets; ++b) {
      const uint32_t x = c[b];
      c[b] = run;
      run += x;
    }
  }
  // Pass 0 starts from the identity; pass 2 writes only the indices, straight into order.
  uint32_t* c0 = count.data();
  uint32_t* c1 = count.data() + kBuckets;
  uint32_t* c2 = count.data() + 2 * kBuckets;
  uint32_t* k2 = ws.keys2.data();
  int32_t* i2 = ws.idx2.data();
  int32_t* i3 = ws.idx3.data();
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t pos = c0[keys[i] & kMask]++;
    k2[pos] = keys[i];
    i2[pos] = static_cast<int32_t>(i);
  }
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t pos = c1[(k2[i] >> kBits) & kMask]++;
    keys[pos] = k2[i];
    i3[pos] = i2[i];
  }
  for (int64_t i = 0; i < n; ++i) order[c2[keys[i] >> (2 * kBits)]++] = i3[i];
}

}  // namespace clattn::cluster
