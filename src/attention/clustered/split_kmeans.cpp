#include "attention/clustered/split_kmeans.h"

#include <algorithm>

#include "clattn/error.h"
#include "parallel/sp_internal.h"

namespace clattn::sp {

void KMeansCommPeers::sum(int64_t* x, size_t n) {
  if (n > 0) all_reduce(comm_, x, n);
}

// The communicator sums int64: counts travel two to a lane, as 32-bit integers. Every count and
// every sum over ranks is at most a problem's total < 2^31 (hamming_kmeans checks it), so the low
// half never carries into the high one and the lane never overflows: the sums are exact.
void KMeansCommPeers::sum_counts(uint32_t* x, size_t n) {
  if (n == 0) return;
  lanes_.assign((n + 1) / 2, 0);
  for (size_t i = 0; i < n; ++i) lanes_[i / 2] |= static_cast<int64_t>(uint64_t{x[i]} << (32 * (i % 2)));
  all_reduce(comm_, lanes_.data(), lanes_.size());
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<uint32_t>(static_cast<uint64_t>(lanes_[i / 2]) >> (32 * (i % 2)));
}

void KMeansCommPeers::gather(const int64_t* mine, size_t n, int64_t* all) {
  all_gather(comm_, mine, sizeof(int64_t) * n, all);
}

void distributed_kmeans(Communicator& comm, std::vector<KmTask>& tasks, int64_t C, int iterations, const Rng& rng) {
  check(C >= 1 && iterations >= 0, "sequence parallel: k-means needs clusters >= 1 and iterations >= 0");
  std::vector<cluster::KMeansProblem> ps(tasks.size());
  for (size_t t = 0; t < tasks.size(); ++t) {
    KmTask& k = tasks[t];
    k.assign.assign(static_cast<size_t>(k.nloc), 0);
    k.centroids.assign(static_cast<size_t>(C), 0);
    ps[t].codes = k.codes;
    ps[t].n = k.nloc;
    ps[t].first = k.first;
    ps[t].total = k.nv;
    ps[t].stream = k.stream;
    ps[t].assign = k.assign.data();
    ps[t].centroids = k.centroids.data();
  }
  KMeansCommPeers peers(comm);
  cluster::KMeansScratch ws;
  cluster::hamming_kmeans(ps, C, iterations, rng, peers, ws);
  // Sizes of the final clusters over all ranks.
  std::vector<uint32_t> sizes;  // (tasks, ce) concatenated
  for (size_t t = 0; t < tasks.size(); ++t) {
    KmTask& k = tasks[t];
    k.ce = ps[t].clusters;
    k.centroids.resize(static_cast<size_t>(k.ce));
    const size_t o = sizes.size();
    sizes.resize(o + static_cast<size_t>(k.ce), 0);
    for (int32_t c : k.assign) ++sizes[o + static_cast<size_t>(c)];
  }
  peers.sum_counts(sizes.data(), sizes.size());
  size_t o = 0;
  for (KmTask& k : tasks) {
    k.sizes.assign(sizes.begin() + static_cast<int64_t>(o), sizes.begin() + static_cast<int64_t>(o) + k.ce);
    o += static_cast<size_t>(k.ce);
  }
}

}  // namespace clattn::sp
