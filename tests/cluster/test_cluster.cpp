// The cluster module: LSH codes, nearest-centroid search, Hamming k-means, counting sort.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <numeric>
#include <tuple>
#include <utility>
#include <bit>
#include <set>
#include <thread>
#include <vector>

#include "cluster/cluster.h"
#include "core/isa.h"
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

// In every ISA copy this CPU runs (core/isa.h), one process.
TEST(KMeans, NearestMatchesReference) {
  for (const Isa isa : runnable_isas()) {
  const ScopedIsa scoped(isa);
  SCOPED_TRACE(isa_name(isa));
  Rng r(3);
  // Centroid counts around the vector kernels' groups (4, 8 and 16 per pass) and code counts
  // around their 6 or 8 codes per pass; all-ones and all-zeros codes reach distances 0 and 64.
  for (int64_t C : {1, 3, 4, 7, 8, 9, 15, 16, 17, 100, 301})
    for (int64_t n : {1, 3, 5, 6, 7, 13, 1001}) {
      std::vector<uint64_t> codes(static_cast<size_t>(n)), cent(static_cast<size_t>(C));
      for (size_t i = 0; i < codes.size(); ++i) codes[i] = r.u64(0, i) >> (i % 3);
      if (n > 3) codes[1] = ~uint64_t{0}, codes[2] = 0;
      for (int64_t c = 0; c < C; ++c) cent[static_cast<size_t>(c)] = r.u64(1, static_cast<uint64_t>(c) % 5);  // duplicates: first wins
      if (C > 2) cent[static_cast<size_t>(C - 1)] = 0;
      std::vector<int32_t> a1(codes.size()), a2(codes.size());
      std::vector<uint32_t> d1(codes.size()), d2(codes.size());
      assign_nearest(codes.data(), n, cent.data(), C, a1.data(), d1.data());
      assign_nearest_ref(codes.data(), n, cent.data(), C, a2.data(), d2.data());
      EXPECT_EQ(a1, a2) << "C=" << C << " n=" << n;
      EXPECT_EQ(d1, d2) << "C=" << C << " n=" << n;
    }
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

// The fast k-means (Hamerly bounds, early stop, vector scans) gives exactly the plain one's result,
// in every ISA copy.
TEST(KMeans, MatchesPlainLloyd) {
  for (const Isa isa : runnable_isas()) {  // every ISA copy this CPU runs (core/isa.h)
  const ScopedIsa scoped(isa);
  SCOPED_TRACE(isa_name(isa));
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

// One code at almost every position: the draws take many batches to find C distinct codes, and
// neither the result nor the scratch depends on how many.
TEST(KMeans, DrawsPastManyRepeats) {
  const int64_t n = 5000, C = 100;
  std::vector<uint64_t> codes(static_cast<size_t>(n), 77);
  for (int64_t i = 0; i < n; i += 40) codes[static_cast<size_t>(i)] = Rng(3).u64(0, static_cast<uint64_t>(i));
  std::vector<int32_t> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
  std::vector<uint64_t> ca(static_cast<size_t>(C)), cb(static_cast<size_t>(C));
  KMeansScratch ws;
  ASSERT_EQ(hamming_kmeans(codes.data(), n, C, 3, Rng(1), 0, a.data(), ca.data(), ws), C);
  ASSERT_EQ(hamming_kmeans_ref(codes.data(), n, C, 3, Rng(1), 0, b.data(), cb.data()), C);
  EXPECT_EQ(a, b);
  EXPECT_EQ(ca, cb);
  EXPECT_LT(ws.bytes(), size_t{1} << 20);
}

TEST(KMeans, SparseShuffleIsFisherYates) {
  for (int64_t n : {1, 2, 7, 1000, 100000}) {
    std::vector<int64_t> a(static_cast<size_t>(n));
    std::iota(a.begin(), a.end(), int64_t{0});
    SparseShuffle sh;
    sh.reset(n);
    for (int64_t t = 0; t < std::min<int64_t>(n, 3000); ++t) {
      const int64_t j = t + static_cast<int64_t>(Rng(7).below(static_cast<uint64_t>(n - t), 3, static_cast<uint64_t>(t)));
      std::swap(a[static_cast<size_t>(t)], a[static_cast<size_t>(j)]);
      ASSERT_EQ(sh.next(Rng(7), 3), a[static_cast<size_t>(t)]) << "n " << n << " draw " << t;
    }
  }
}

// R ranks in one process, one thread each, exchanging through shared slots between barriers: the
// peers contract of hamming_kmeans without MPI.
class ThreadRanks {
 public:
  explicit ThreadRanks(int R) : R_(R), sync_(R), slots_(static_cast<size_t>(R)) {}
  int size() const { return R_; }
  // out (R, n) = every rank's x (n) when `gather`, else (n) their sum.
  template <class T>
  void exchange(int r, const T* x, size_t n, T* out, bool gather) {
    slots_[static_cast<size_t>(r)] = x;
    sync_.arrive_and_wait();
    std::vector<T> got(gather ? n * static_cast<size_t>(R_) : n, T{0});
    for (size_t q = 0; q < static_cast<size_t>(R_); ++q)
      for (size_t i = 0; i < n; ++i) {
        const T v = static_cast<const T*>(slots_[q])[i];
        if (gather) got[q * n + i] = v;
        else got[i] += v;
      }
    sync_.arrive_and_wait();  // every rank has read every slot before any overwrites its own
    std::copy(got.begin(), got.end(), out);
  }

 private:
  int R_;
  std::barrier<> sync_;
  std::vector<const void*> slots_;
};

class ThreadPeer : public KMeansPeers {
 public:
  ThreadPeer(ThreadRanks& g, int r, int64_t batch) : g_(g), r_(r), batch_(batch) {}
  int rank() const override { return r_; }
  int64_t reseed_batch() const override { return batch_; }
  int size() const override { return g_.size(); }
  void sum(int64_t* x, size_t n) override { g_.exchange(r_, x, n, x, false); }
  void sum_counts(uint32_t* x, size_t n) override { g_.exchange(r_, x, n, x, false); }
  void gather(const int64_t* mine, size_t n, int64_t* all) override { g_.exchange(r_, mine, n, all, true); }

 private:
  ThreadRanks& g_;
  int r_;
  int64_t batch_;
};

// `heavy` codes of `copies` copies each, every other copy with `flips` random bits flipped, then
// `light` random codes, interleaved: k-means empties several clusters at once on some of these,
// and re-seeding meets candidates whose code a centroid already holds.
std::vector<uint64_t> families(const Rng& r, int heavy, int copies, int light, int flips) {
  std::vector<uint64_t> codes;
  for (int h = 0; h < heavy; ++h)
    for (int x = 0; x < copies; ++x) {
      uint64_t c = r.u64(1, static_cast<uint64_t>(h));
      for (int f = 0; f < (x % 2 ? flips : 0); ++f) c ^= uint64_t{1} << r.below(64, 2, static_cast<uint64_t>(h * 100000 + x * 10 + f));
      codes.push_back(c);
    }
  for (int l = 0; l < light; ++l) codes.push_back(r.u64(3, static_cast<uint64_t>(l)));
  std::vector<uint64_t> out(codes.size());
  for (size_t i = 0; i < codes.size(); ++i) out[(i * 7919) % codes.size()] = codes[i];
  return out;
}

// Every problem at once, split unevenly over R ranks (some holding nothing), gives each rank the
// assignment and centroids one process gets on the whole problem: distinct-code problems, empty
// ones, draws over many batches (one code fills almost every position), several empty clusters at
// once, re-seeding candidates skipped, and merges over the ranks that take many exchanges
// (batches of 1 and 3 candidates).
TEST(KMeans, ProblemsSplitOverRanksMatchOneProcess) {
  const int iters = 10;
  const Rng r(7);
  std::vector<std::vector<uint64_t>> codes = {families(r, 10, 100, 5, 3), families(r, 10, 50, 5, 8),
                                              families(r, 10, 300, 20, 3), families(r, 10, 300, 20, 8),
                                              {5, 9, 5, 5, 1, 9, 1, 1}};
  for (int64_t n : {0, 5, 200, 999, 3000}) {
    std::vector<uint64_t> fam(static_cast<size_t>(n)), dup(static_cast<size_t>(n)), rare(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t u = static_cast<uint64_t>(i);
      fam[static_cast<size_t>(i)] = r.u64(11, r.below(30, 12, u)) ^ (uint64_t{1} << r.below(64, 13, u));
      dup[static_cast<size_t>(i)] = r.u64(14, r.below(i % 7 == 0 ? 200 : 3, 15, u));
      rare[static_cast<size_t>(i)] = i % 97 == 3 ? r.u64(16, u) : 12345;
    }
    codes.push_back(fam);
    codes.push_back(dup);
    codes.push_back(rare);
  }
  const size_t P = codes.size();
  for (int64_t C : {16, 24}) {
    // One process, one problem at a time (stream 0 for the first four, as the cases were found).
    auto stream = [](size_t p) { return p < 4 ? 0 : 40 + p; };
    std::vector<std::vector<int32_t>> want_a(P);
    std::vector<std::vector<uint64_t>> want_c(P);
    std::vector<int64_t> want_ce(P);
    KMeansScratch ws;
    for (size_t p = 0; p < P; ++p) {
      want_a[p].resize(codes[p].size());
      want_c[p].resize(static_cast<size_t>(C));
      want_ce[p] = hamming_kmeans(codes[p].data(), static_cast<int64_t>(codes[p].size()), C, iters, r, stream(p),
                                  want_a[p].data(), want_c[p].data(), ws);
      want_c[p].resize(static_cast<size_t>(want_ce[p]));
    }
    for (const std::pair<int, int64_t>& rb : {std::pair<int, int64_t>{1, 64}, {1, 1}, {2, 64}, {2, 1}, {3, 3}, {5, 1}, {5, 64}}) {
      const int R = rb.first;
      const int64_t batch = rb.second;
      SCOPED_TRACE(::testing::Message() << "C " << C << " R " << R << " batch " << batch);
      ThreadRanks group(R);
      std::vector<std::vector<std::vector<int32_t>>> got_a(static_cast<size_t>(R), std::vector<std::vector<int32_t>>(P));
      std::vector<std::vector<std::vector<uint64_t>>> got_c(static_cast<size_t>(R), std::vector<std::vector<uint64_t>>(P));
      std::vector<std::vector<KMeansProblem>> ps(static_cast<size_t>(R), std::vector<KMeansProblem>(P));
      auto rank = [&](int q) {
        ThreadPeer peer(group, q, batch);
        KMeansPeers one_process;
        KMeansScratch scratch;
        for (size_t p = 0; p < P; ++p) {
          // Uneven cuts: rank q holds [N q² / R², N (q + 1)² / R²).
          const int64_t N = static_cast<int64_t>(codes[p].size()), lo = N * q * q / (R * R), hi = N * (q + 1) * (q + 1) / (R * R);
          KMeansProblem& k = ps[static_cast<size_t>(q)][p];
          got_a[static_cast<size_t>(q)][p].assign(static_cast<size_t>(hi - lo), -1);
          got_c[static_cast<size_t>(q)][p].assign(static_cast<size_t>(C), 0);
          k.codes = codes[p].data() + lo;
          k.n = hi - lo;
          k.first = lo;
          k.total = N;
          k.stream = stream(p);
          k.assign = got_a[static_cast<size_t>(q)][p].data();
          k.centroids = got_c[static_cast<size_t>(q)][p].data();
        }
        hamming_kmeans(ps[static_cast<size_t>(q)], C, iters, r, R == 1 && batch == 64 ? one_process : static_cast<KMeansPeers&>(peer), scratch);
      };
      std::vector<std::thread> threads;
      for (int q = 0; q < R; ++q) threads.emplace_back(rank, q);
      for (std::thread& t : threads) t.join();
      for (int q = 0; q < R; ++q)
        for (size_t p = 0; p < P; ++p) {
          const KMeansProblem& k = ps[static_cast<size_t>(q)][p];
          const std::vector<int32_t>& a = got_a[static_cast<size_t>(q)][p];
          const std::vector<uint64_t>& c = got_c[static_cast<size_t>(q)][p];
          ASSERT_EQ(k.clusters, want_ce[p]) << "rank " << q << " problem " << p;
          EXPECT_TRUE(std::equal(c.begin(), c.begin() + k.clusters, want_c[p].begin())) << "rank " << q << " problem " << p;
          EXPECT_TRUE(std::equal(a.begin(), a.end(), want_a[p].begin() + k.first)) << "rank " << q << " problem " << p;
        }
    }
  }
}

TEST(KMeans, RefusesProblemsPastThirtyTwoBitVotes) {
  uint64_t code = 1;
  int32_t a = 0;
  uint64_t c = 0;
  KMeansProblem k;
  k.codes = &code;
  k.n = 1;
  k.first = int64_t{1} << 31;
  k.total = k.first + 1;
  k.assign = &a;
  k.centroids = &c;
  KMeansPeers one_process;
  KMeansScratch ws;
  EXPECT_THROW(hamming_kmeans(std::span<KMeansProblem>(&k, 1), 1, 1, Rng(1), one_process, ws), Error);
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
