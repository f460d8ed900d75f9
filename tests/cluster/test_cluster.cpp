// The cluster module: LSH codes, nearest-centroid search, Hamming k-means, counting sort.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>
#include <bit>
#include <set>
#include <vector>

#include "cluster/cluster.h"
#include "common/test_util.h"

namespace clattn::cluster {
namespace {

TEST(Lsh, CodesMatchDirectProjection) {
  for (int bits : {1, 16, 17, 63, 64}) {
    const int64_t n = 2100, D = 24;  // more than one hash block
    Tensor x = testing::randn(Shape{n, D}, 1, 1);
    std::vector<float> scratch(static_cast<size_t>(kHashBlock * 64));
    const LshPlanes pl = draw_planes(Rng(5), 0, bits, D, true);
    std::vector<uint64_t> codes(static_cast<size_t>(n));
    hash_codes(x.data(), n, D, pl, codes.data(), scratch.data());
    int64_t mismatches = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int b = 0; b < bits; ++b) {
        double s = 0;
        for (int64_t e = 0; e < D; ++e) s += static_cast<double>(x.data()[i * D + e]) * pl.panel[static_cast<size_t>(e * 64 + b)];
        const double t = pl.thresholds[static_cast<size_t>(b)];
        if (std::abs(s - t) > 1e-4 && (s > t) != static_cast<bool>((codes[static_cast<size_t>(i)] >> b) & 1)) ++mismatches;
      }
    EXPECT_EQ(mismatches, 0) << bits;
    if (bits < 64) {
      for (uint64_t c : codes) ASSERT_EQ(c >> bits, 0u);
    }
  }
  EXPECT_THROW(draw_planes(Rng(1), 0, 65, 4, true), Error);
  EXPECT_THROW(draw_planes(Rng(1), 0, 0, 4, true), Error);
  // Same stream, same planes; thresholds are 0 without hash_bias.
  EXPECT_EQ(draw_planes(Rng(1), 3, 8, 4, true).panel, draw_planes(Rng(1), 3, 8, 4, true).panel);
  EXPECT_NE(draw_planes(Rng(1), 3, 8, 4, true).panel, draw_planes(Rng(2), 3, 8, 4, true).panel);
  EXPECT_EQ(draw_planes(Rng(1), 3, 8, 4, false).thresholds[5], 0.f);
}

TEST(KMeans, NearestMatchesReference) {
  Rng r(3);
  for (int64_t C : {1, 7, 8, 9, 100}) {
    std::vector<uint64_t> codes(1001), cent(static_cast<size_t>(C));
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = r.u64(0, i) >> (i % 3);
    for (int64_t c = 0; c < C; ++c) cent[static_cast<size_t>(c)] = r.u64(1, static_cast<uint64_t>(c) % 5);  // duplicates: first wins
    std::vector<int32_t> a1(codes.size()), a2(codes.size());
    std::vector<uint32_t> d1(codes.size()), d2(codes.size());
    assign_nearest(codes.data(), 1001, cent.data(), C, a1.data(), d1.data());
    assign_nearest_ref(codes.data(), 1001, cent.data(), C, a2.data(), d2.data());
    EXPECT_EQ(a1, a2);
    EXPECT_EQ(d1, d2);
  }
}

TEST(KMeans, DistinctCodesAndDeterminism) {
  Rng r(4);
  const int64_t n = 3000;
  std::vector<uint64_t> codes(n);
  // 40 well-separated families of codes with a few flipped bits each.
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t fam = r.u64(10, static_cast<uint64_t>(i % 40));
    codes[static_cast<size_t>(i)] = fam ^ (uint64_t{1} << r.below(64, 11, static_cast<uint64_t>(i)));
  }
  KMeansScratch ws;
  std::vector<int32_t> a1(n), a2(n), a3(n);
  std::vector<uint64_t> c1(40), c2(40), c3(40);
  EXPECT_EQ(hamming_kmeans(codes.data(), n, 40, 10, Rng(1), 0, a1.data(), c1.data(), ws), 40);
  hamming_kmeans(codes.data(), n, 40, 10, Rng(1), 0, a2.data(), c2.data(), ws);
  hamming_kmeans(codes.data(), n, 40, 10, Rng(2), 0, a3.data(), c3.data(), ws);
  EXPECT_EQ(a1, a2);
  EXPECT_EQ(c1, c2);
  // Mostly recovered families: k-means may split one family and merge two others (a local
  // minimum), but members sit far closer to their centroid than random codes (~32 bits apart),
  // and the empty-cluster rule leaves no cluster empty.
  std::vector<int64_t> size(40, 0);
  int64_t close = 0;
  for (int64_t i = 0; i < n; ++i) {
    ++size[static_cast<size_t>(a1[static_cast<size_t>(i)])];
    close += std::popcount(codes[static_cast<size_t>(i)] ^ c1[static_cast<size_t>(a1[static_cast<size_t>(i)])]) <= 2;
  }
  EXPECT_GE(close, n * 6 / 10);
  EXPECT_EQ(std::count(size.begin(), size.end(), 0), 0);
  EXPECT_EQ(std::set<uint64_t>(c1.begin(), c1.end()).size(), 40u);
}

// The fast k-means (Hamerly bounds, early stop, vector scans) gives exactly the plain one's result.
TEST(KMeans, MatchesPlainLloyd) {
  KMeansScratch ws;
  for (uint64_t seed = 1; seed <= 6; ++seed)
    for (auto [n, C, fams, flips] : {std::tuple<int64_t, int64_t, int, int>{2000, 37, 20, 6},
                                      {999, 100, 300, 10}, {3000, 8, 5, 20}, {500, 64, 1000, 30}}) {
      Rng r(seed);
      std::vector<uint64_t> codes(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        uint64_t x = r.u64(10, r.below(static_cast<uint64_t>(fams), 12, static_cast<uint64_t>(i)));
        for (int f = 0; f < flips; ++f) x ^= uint64_t{r.below(2, 13, static_cast<uint64_t>(i * 64 + f))} << r.below(63, 14, static_cast<uint64_t>(i * 64 + f));
        codes[static_cast<size_t>(i)] = x >> 1;  // 63-bit codes, as the default hash
      }
      for (int iters : {0, 1, 3, 10}) {
        std::vector<int32_t> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
        std::vector<uint64_t> ca(static_cast<size_t>(C)), cb(static_cast<size_t>(C));
        const int64_t na = hamming_kmeans(codes.data(), n, C, iters, Rng(seed), 5, a.data(), ca.data(), ws);
        const int64_t nb = hamming_kmeans_ref(codes.data(), n, C, iters, Rng(seed), 5, b.data(), cb.data());
        ASSERT_EQ(na, nb);
        ASSERT_EQ(a, b) << "seed " << seed << " n " << n << " C " << C << " iterations " << iters;
      }
    }
}

TEST(KMeans, FewerDistinctCodesThanClusters) {
  std::vector<uint64_t> codes = {5, 9, 5, 5, 1, 9};
  std::vector<int32_t> a(6);
  std::vector<uint64_t> c(10);
  KMeansScratch ws;
  EXPECT_EQ(hamming_kmeans(codes.data(), 6, 10, 10, Rng(1), 0, a.data(), c.data(), ws), 3);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(c[static_cast<size_t>(a[i])], codes[i]);
  EXPECT_EQ(hamming_kmeans(codes.data(), 0, 10, 10, Rng(1), 0, a.data(), c.data(), ws), 0);
  EXPECT_THROW(hamming_kmeans(codes.data(), 6, 0, 10, Rng(1), 0, a.data(), c.data(), ws), Error);
}

TEST(Sort, RadixSortByFloatKey) {
  Rng r(9);
  for (int64_t n : {0, 1, 7, 1000, 70000}) {
    std::vector<float> key(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) key[static_cast<size_t>(i)] = i % 13 == 0 ? 0.5f : (i % 17 == 0 ? -0.f : r.normal(0, static_cast<uint64_t>(i)) * 100.f);
    if (n > 5) key[3] = -INFINITY, key[4] = INFINITY, key[5] = 0.f;
    std::vector<int32_t> order(static_cast<size_t>(n)), want(static_cast<size_t>(n));
    RadixScratch ws;
    sort_by_key(key.data(), n, order.data(), ws);
    std::iota(want.begin(), want.end(), 0);
    std::stable_sort(want.begin(), want.end(), [&](int32_t a, int32_t b) {
      // -0 sorts before +0 in the bit order; compare as the sort does
      return key[static_cast<size_t>(a)] < key[static_cast<size_t>(b)] ||
             (key[static_cast<size_t>(a)] == key[static_cast<size_t>(b)] && std::signbit(key[static_cast<size_t>(a)]) && !std::signbit(key[static_cast<size_t>(b)]));
    });
    EXPECT_EQ(order, want) << n;
  }
}

TEST(Sort, CountingSortSegments) {
  std::vector<int32_t> assign = {2, 0, 2, 1, 0, 2, 4};
  std::vector<int32_t> order(7), off(6);
  counting_sort(assign.data(), 7, 5, order.data(), off.data());
  EXPECT_EQ(order, (std::vector<int32_t>{1, 4, 3, 0, 2, 5, 6}));
  EXPECT_EQ(off, (std::vector<int32_t>{0, 2, 3, 6, 6, 7}));
}

}  // namespace
}  // namespace clattn::cluster
