// Sequence-parallel k-means (src/attention/clustered/split_kmeans.cpp) against one process. Run
// alone (then 2, 3 and 4 ranks as threads) and under `mpirun -np R` (CTest parallel_mpi2…4): every
// rank builds the same problems and clusters its own slice of each; the clusters must be those of
// cluster::hamming_kmeans on the whole problem.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "clattn/comm.h"
#include "clattn/seq_parallel.h"
#include "cluster/cluster.h"
#include "attention/clustered/split_kmeans.h"
#include "parallel/ranks.h"

namespace clattn::sp {
namespace {

using testing::on_each_job;

// Vote counts are summed two to an int64 lane: sums up to 2^31 - 1 come back exact, in half the
// bytes of int64 counts.
TEST(SeqParallelKMeans, CountsTravelTwoToALane) {
  on_each_job([](Communicator& comm) {
    const int R = comm.size(), r = comm.rank();
    const uint32_t top = (uint32_t{1} << 31) - 1;
    std::vector<uint32_t> x(7), want(7);  // odd: the last lane holds one count
    for (uint32_t i = 0; i < 7; ++i) {
      want[i] = i % 2 ? top - i : i;
      x[i] = want[i] / static_cast<uint32_t>(R) + (static_cast<uint32_t>(r) < want[i] % static_cast<uint32_t>(R) ? 1 : 0);
    }
    CommTraffic sent;
    const std::unique_ptr<Communicator> counted = counting_communicator(comm, sent);
    KMeansCommPeers peers(*counted);
    peers.sum_counts(x.data(), x.size());
    EXPECT_EQ(x, want);
    EXPECT_EQ(sent.bytes, static_cast<uint64_t>(2 * 4 * 8 * (R - 1) / R));  // 4 lanes
  });
}

TEST(SeqParallelKMeans, MatchesOneProcess) {
  on_each_job([](Communicator& comm) {
    const int R = comm.size(), r = comm.rank();
    const Rng rng(7);
    const int64_t C = 16;
    // Families of codes with flipped bits and a few outliers (several clusters empty at once in
    // some rounds), a problem with fewer distinct codes than C, one without codes, and one small
    // enough that some ranks hold none of it.
    std::vector<std::vector<uint64_t>> codes;
    for (int64_t n : {3000, 1000, 0, 40, 7}) {
      std::vector<uint64_t> c(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const uint64_t u = static_cast<uint64_t>(i);
        uint64_t x = rng.u64(1, rng.below(n == 40 ? 5 : 10, 2, u));
        for (int f = 0; f < (i % 2 ? 8 : 0); ++f) x ^= uint64_t{1} << rng.below(64, 3, u * 8 + static_cast<uint64_t>(f));
        c[static_cast<size_t>(i)] = i % 97 == 3 ? rng.u64(4, u) : n == 40 ? x & 0xFF00 : x;
      }
      codes.push_back(c);
    }
    std::vector<KmTask> tasks(codes.size());
    for (size_t p = 0; p < codes.size(); ++p) {
      const int64_t N = static_cast<int64_t>(codes[p].size()), lo = N * r / R, hi = N * (r + 1) / R;
      tasks[p].codes = codes[p].data() + lo;
      tasks[p].nloc = hi - lo;
      tasks[p].first = lo;
      tasks[p].nv = N;
      tasks[p].stream = 3 + p;
    }
    distributed_kmeans(comm, tasks, C, 10, rng);
    cluster::KMeansScratch ws;
    for (size_t p = 0; p < codes.size(); ++p) {
      const int64_t N = static_cast<int64_t>(codes[p].size());
      std::vector<int32_t> a(codes[p].size());
      std::vector<uint64_t> c(static_cast<size_t>(C));
      const int64_t ce = cluster::hamming_kmeans(codes[p].data(), N, C, 10, rng, 3 + p, a.data(), c.data(), ws);
      std::vector<int64_t> sizes(static_cast<size_t>(ce), 0);
      for (int32_t j : a) ++sizes[static_cast<size_t>(j)];
      const KmTask& k = tasks[p];
      ASSERT_EQ(k.ce, ce) << "problem " << p;
      EXPECT_TRUE(std::equal(k.centroids.begin(), k.centroids.end(), c.begin())) << "problem " << p;
      EXPECT_TRUE(std::equal(k.assign.begin(), k.assign.end(), a.begin() + k.first)) << "problem " << p;
      EXPECT_EQ(k.sizes, sizes) << "problem " << p;
    }
  });
}

}  // namespace
}  // namespace clattn::sp
