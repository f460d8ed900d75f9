// Ranks as threads (run_ranks_in_threads): every collective against what it must compute, the
// same bits on every rank, point-to-point rings that only complete because sends are buffered,
// split(), and the failures: a rank that throws, sizes that do not match, a rank that never comes.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "clattn/comm.h"
#include "clattn/error.h"
#include "clattn/seq_parallel.h"

namespace clattn {
namespace {

// A value of rank r at element i that no two ranks share.
double value(int r, size_t i) { return std::ldexp(1.0 + static_cast<double>(i), r) * (r % 2 ? -0.3 : 1.7); }

TEST(ThreadedComm, CollectivesComputeWhatTheySay) {
  for (int R : {1, 2, 3, 5}) {
    std::vector<std::vector<double>> sums(static_cast<size_t>(R));
    run_ranks_in_threads(R, [&](Communicator& c) {
      const int r = c.rank();
      EXPECT_EQ(c.size(), R);
      EXPECT_NE(c.name().find(std::to_string(R) + " ranks"), std::string::npos) << c.name();
      c.barrier();
      std::vector<double> d(7);
      for (size_t i = 0; i < d.size(); ++i) d[i] = value(r, i);
      c.all_reduce_sum(d.data(), d.size());
      sums[static_cast<size_t>(r)] = d;
      for (size_t i = 0; i < d.size(); ++i) {
        double want = 0;
        for (int s = 0; s < R; ++s) want += value(s, i);
        EXPECT_NEAR(d[i], want, 1e-12 * std::abs(want));
      }
      int64_t n[2] = {r, 1};
      c.all_reduce_sum(n, 2);
      EXPECT_EQ(n[0], R * (R - 1) / 2);
      EXPECT_EQ(n[1], R);
      float f[3] = {1.0f * r, 0.5f, -1.0f};
      c.all_reduce_sum(f, 3);
      EXPECT_EQ(f[0], static_cast<float>(R * (R - 1) / 2));
      EXPECT_EQ(f[2], -static_cast<float>(R));
      double m[2] = {static_cast<double>(r), -static_cast<double>(r)};
      c.all_reduce_max(m, 2);
      EXPECT_EQ(m[0], R - 1);
      EXPECT_EQ(m[1], 0);
      char word[16] = {};
      if (r == R - 1) std::snprintf(word, sizeof word, "root%d", r);
      c.broadcast(word, sizeof word, R - 1);
      EXPECT_EQ(std::string(word), "root" + std::to_string(R - 1));
      std::vector<int32_t> all(static_cast<size_t>(2 * R));
      const int32_t mine[2] = {r, 10 * r};
      c.all_gather(mine, sizeof mine, all.data());
      for (int s = 0; s < R; ++s) {
        EXPECT_EQ(all[static_cast<size_t>(2 * s)], s);
        EXPECT_EQ(all[static_cast<size_t>(2 * s + 1)], 10 * s);
      }
      // Rank r's block j (j + 1 floats) holds r + j: block j sums to Σr + R·j.
      std::vector<size_t> counts(static_cast<size_t>(R));
      std::iota(counts.begin(), counts.end(), size_t{1});
      std::vector<float> blocks;
      for (int j = 0; j < R; ++j) blocks.insert(blocks.end(), static_cast<size_t>(j + 1), static_cast<float>(r + j));
      std::vector<float> got(static_cast<size_t>(r + 1));
      c.reduce_scatter_sum(blocks.data(), got.data(), counts);
      for (float x : got) EXPECT_EQ(x, static_cast<float>(R * (R - 1) / 2 + R * r));
      // All-to-all: rank r sends j + 1 bytes of value 16r + j to rank j.
      std::vector<size_t> sc(static_cast<size_t>(R)), sd(static_cast<size_t>(R)), rc(static_cast<size_t>(R)),
          rd(static_cast<size_t>(R));
      std::vector<unsigned char> sendb, recvb;
      for (int j = 0; j < R; ++j) {
        sd[static_cast<size_t>(j)] = sendb.size();
        sc[static_cast<size_t>(j)] = static_cast<size_t>(j + 1);
        sendb.insert(sendb.end(), static_cast<size_t>(j + 1), static_cast<unsigned char>(16 * r + j));
        rd[static_cast<size_t>(j)] = static_cast<size_t>(j * (r + 1));
        rc[static_cast<size_t>(j)] = static_cast<size_t>(r + 1);
      }
      recvb.resize(static_cast<size_t>(R * (r + 1)));
      c.iall_to_allv(sendb.data(), sc, sd, recvb.data(), rc, rd)->wait();
      for (int i = 0; i < R; ++i)
        for (int x = 0; x < r + 1; ++x)
          EXPECT_EQ(recvb[static_cast<size_t>(i * (r + 1) + x)], static_cast<unsigned char>(16 * i + r));
      // A non-blocking all-reduce completed by test() alone.
      std::vector<float> a(5, static_cast<float>(r + 1));
      auto req = c.iall_reduce_sum(a.data(), a.size());
      while (!req->test()) {
      }
      for (float x : a) EXPECT_EQ(x, static_cast<float>(R * (R + 1) / 2));
    });
    // Every rank reduced in one order: the same bits.
    for (int r = 1; r < R; ++r) EXPECT_EQ(sums[static_cast<size_t>(r)], sums[0]) << "rank " << r;
  }
}

TEST(ThreadedComm, RingsOfSendsCompleteAndMatchInOrder) {
  run_ranks_in_threads(4, [](Communicator& c) {
    const int R = c.size(), r = c.rank();
    // Everyone sends before anyone receives, twice on one tag: matched in the order sent.
    int out[2] = {100 * r, 100 * r + 1}, in[2] = {-1, -1};
    c.isend(&out[0], sizeof(int), (r + 1) % R, 3)->wait();
    c.isend(&out[1], sizeof(int), (r + 1) % R, 3)->wait();
    auto a = c.irecv(&in[0], sizeof(int), (r - 1 + R) % R, 3);
    auto b = c.irecv(&in[1], sizeof(int), (r - 1 + R) % R, 3);
    a->wait();
    b->wait();
    EXPECT_EQ(in[0], 100 * ((r - 1 + R) % R));
    EXPECT_EQ(in[1], 100 * ((r - 1 + R) % R) + 1);
    // A receive posted first, then a message to oneself.
    int self = -1;
    auto s = c.irecv(&self, sizeof(int), r, 9);
    EXPECT_FALSE(s->test());
    c.isend(&r, sizeof(int), r, 9);
    s->wait();
    EXPECT_EQ(self, r);
    // The sequence-parallel ring itself.
    EXPECT_GE(ring_transfer_ms(c, 1 << 12), 0.0);
  });
}

TEST(ThreadedComm, SplitGroupsByColorOrderedByKey) {
  run_ranks_in_threads(5, [](Communicator& c) {
    const int r = c.rank();
    // Colors 0 (ranks 0, 2, 4) and 1 (1, 3), keys reversing the order.
    std::unique_ptr<Communicator> g = c.split(r % 2, -r);
    EXPECT_EQ(g->size(), r % 2 ? 2 : 3);
    EXPECT_EQ(g->rank(), r % 2 ? (3 - r) / 2 : (4 - r) / 2);
    int64_t sum = r;
    g->all_reduce_sum(&sum, 1);
    EXPECT_EQ(sum, r % 2 ? 4 : 6);
    // A second split of the same parent makes new groups, not the first ones again.
    std::unique_ptr<Communicator> all = c.split(0, r);
    EXPECT_EQ(all->size(), 5);
    EXPECT_EQ(all->rank(), r);
    double x = 1;
    all->all_reduce_sum(&x, 1);
    EXPECT_EQ(x, 5);
  });
}

TEST(ThreadedComm, ARankThatThrowsEndsTheJobWithItsError) {
  std::atomic<int> released{0};
  try {
    run_ranks_in_threads(3, [&](Communicator& c) {
      if (c.rank() == 1) throw Error("the input of rank 1 is short");
      double x = 1;
      try {
        c.all_reduce_sum(&x, 1);  // rank 1 never comes
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("rank 1 failed: the input of rank 1 is short"), std::string::npos)
            << e.what();
        ++released;
        throw;
      }
    });
    ADD_FAILURE() << "the job did not fail";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "the input of rank 1 is short");
  }
  EXPECT_EQ(released.load(), 2);
}

TEST(ThreadedComm, MismatchedSizesAndRanksAreRefused) {
  EXPECT_THROW(run_ranks_in_threads(0, [](Communicator&) {}), Error);
  try {
    run_ranks_in_threads(2, [](Communicator& c) {
      double x[3] = {};
      c.broadcast(x, c.rank() == 0 ? 3 * sizeof(double) : 2 * sizeof(double), 0);
    });
    ADD_FAILURE() << "a broadcast of other sizes went through";
  } catch (const Error& e) {
    const std::string what = e.what();  // whichever came first, the send or the receive
    EXPECT_TRUE(what.find("24") != std::string::npos && what.find("16") != std::string::npos) << what;
  }
  run_ranks_in_threads(2, [](Communicator& c) {
    int x = 0;
    EXPECT_THROW(c.isend(&x, sizeof x, 2, 0), Error);
    EXPECT_THROW(c.irecv(&x, sizeof x, -1, 0), Error);
    EXPECT_THROW(c.isend(&x, sizeof x, 0, -4), Error);  // negative tags are the collectives'
    EXPECT_THROW(c.split(-1, 0), Error);
  });
}

TEST(ThreadedComm, ARankThatNeverComesTimesOut) {
  const double before = comm_timeout();
  set_comm_timeout(0.2);
  try {
    run_ranks_in_threads(2, [](Communicator& c) {
      if (c.rank() == 0) c.barrier();  // rank 1 returns without it
    });
    ADD_FAILURE() << "the barrier did not time out";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 waited more than 0.2 s in barrier"), std::string::npos) << e.what();
  }
  set_comm_timeout(before);
}

}  // namespace
}  // namespace clattn
