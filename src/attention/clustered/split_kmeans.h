// Hamming k-means over queries split across ranks (sequence parallelism): cluster::hamming_kmeans
// itself, its exchanges over the communicator. Each rank computes on its own codes and every rank
// ends with the clusters one process gets on the whole sequence: the same distinct-code rule,
// initial draws, assignments, votes, re-seeding of empty clusters and early stop. Each round's vote
// is decided where it is summed: the clusters of all tasks are split evenly over the ranks, each
// rank sends every other rank the bit counts and sizes of that rank's clusters (65 32-bit integers
// per cluster, exact), and the owners' majority codes and total sizes are gathered (12 bytes per
// cluster): (R−1)/R of the counts leave a rank instead of the 2(R−1)/R of an all-reduce. The draws
// and the re-seeding fetch the few codes they need from their owners. Communication per round is
// independent of the sequence length.
#pragma once

#include <cstdint>
#include <vector>

#include "clattn/comm.h"
#include "clattn/rng.h"
#include "cluster/cluster.h"

namespace clattn::sp {

// One clustering problem (a (batch, head) pair): this rank's valid queries are global positions
// [first, first + nloc); the sequence has nv valid queries in all.
struct KmTask {
  const uint64_t* codes = nullptr;  // (nloc) this rank's codes
  int64_t nloc = 0, first = 0, nv = 0;
  uint64_t stream = 0;              // rng stream of the initial draws
  // Results: assign (nloc) cluster ids in [0, ce); centroid codes (ce); sizes (ce) over all ranks.
  std::vector<int32_t> assign;
  std::vector<uint64_t> centroids;
  std::vector<int64_t> sizes;
  int64_t ce = 0;
};

// k-means' exchanges over the communicator, counted as sequence-parallel traffic. Vote counts
// travel as 32-bit integers.
class KMeansCommPeers : public cluster::KMeansPeers {
 public:
  explicit KMeansCommPeers(Communicator& comm) : comm_(comm) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  void sum(int64_t* x, size_t n) override;
  void sum_counts(uint32_t* x, size_t n) override;
  void vote(uint32_t* votes, uint64_t* codes, size_t problems, int64_t C) override;
  void gather(const int64_t* mine, size_t n, int64_t* all) override;

 private:
  Communicator& comm_;
  std::vector<int64_t> lanes_;  // ((n + 1) / 2) two counts each
  std::vector<uint32_t> out_, in_;  // (problems·C, 65) counts by owner; (R, mine, 65) received
  std::vector<unsigned char> decided_, all_decided_;  // (mine, 12), (problems·C, 12) code and size
};

// Every rank calls it with the same tasks in the same order (codes differ). C >= 1 clusters.
void distributed_kmeans(Communicator& comm, std::vector<KmTask>& tasks, int64_t C, int iterations, const Rng& rng);

}  // namespace clattn::sp
