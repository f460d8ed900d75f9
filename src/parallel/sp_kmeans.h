// Hamming k-means over queries split across ranks (sequence parallelism), computing exactly what
// cluster::hamming_kmeans computes on the whole sequence in one process: the same distinct-code
// rule, the same seeded initial draws, the same assignments, votes, re-seeding of empty clusters
// and early stop. Each round adds the per-cluster bit counts and sizes across ranks (integers:
// exact); draws and re-seeding fetch the few codes they need from their owners. Communication
// per round: O(C·64) integers per task, independent of the sequence length.
#pragma once

#include <cstdint>
#include <vector>

#include "clattn/comm.h"
#include "clattn/rng.h"

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

// Every rank calls it with the same tasks in the same order (codes differ). C >= 1 clusters.
void distributed_kmeans(Communicator& comm, std::vector<KmTask>& tasks, int64_t C, int iterations, const Rng& rng);

}  // namespace clattn::sp
