#include "attention/clustered/split_kmeans.h"

#include <algorithm>
#include <cstring>

#include "clattn/error.h"

namespace clattn::sp {

void KMeansCommPeers::sum(int64_t* x, size_t n) {
  if (n > 0) comm_.all_reduce_sum(x, n);
}

// The communicator sums int64: counts travel two to a lane, as 32-bit integers. Every count and
// every sum over ranks is at most a problem's total < 2^31 (hamming_kmeans checks it), so the low
// half never carries into the high one and the lane never overflows: the sums are exact.
void KMeansCommPeers::sum_counts(uint32_t* x, size_t n) {
  if (n == 0) return;
  lanes_.assign((n + 1) / 2, 0);
  for (size_t i = 0; i < n; ++i) lanes_[i / 2] |= static_cast<int64_t>(uint64_t{x[i]} << (32 * (i % 2)));
  comm_.all_reduce_sum(lanes_.data(), lanes_.size());
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<uint32_t>(static_cast<uint64_t>(lanes_[i / 2]) >> (32 * (i % 2)));
}

void KMeansCommPeers::vote(uint32_t* votes, uint64_t* codes, size_t problems, int64_t C) {
  const int R = comm_.size(), me = comm_.rank();
  const size_t rows = problems * static_cast<size_t>(C), cv = static_cast<size_t>(C) * 65, K = 65;
  if (rows == 0) return;
  auto first = [&](int j) { return rows * static_cast<size_t>(j) / static_cast<size_t>(R); };  // rank j owns [first(j), first(j + 1))
  const size_t lo = first(me), mine = first(me + 1) - lo;
  // Each cluster's 64 bit counts and size, side by side, in owner order.
  out_.resize(rows * K);
  for (size_t x = 0; x < rows; ++x) {
    const size_t a = x / static_cast<size_t>(C), c = x % static_cast<size_t>(C);
    const uint32_t* counts = votes + a * cv + c * 64;
    std::copy(counts, counts + 64, out_.begin() + static_cast<int64_t>(x * K));
    out_[x * K + 64] = votes[a * cv + static_cast<size_t>(C) * 64 + c];
  }
  in_.resize(static_cast<size_t>(R) * mine * K);
  std::vector<size_t> sc(static_cast<size_t>(R)), sd(static_cast<size_t>(R)), rc(static_cast<size_t>(R)), rd(static_cast<size_t>(R));
  for (int j = 0; j < R; ++j) {
    sc[static_cast<size_t>(j)] = sizeof(uint32_t) * K * (first(j + 1) - first(j));
    sd[static_cast<size_t>(j)] = sizeof(uint32_t) * K * first(j);
    rc[static_cast<size_t>(j)] = sizeof(uint32_t) * K * mine;
    rd[static_cast<size_t>(j)] = sizeof(uint32_t) * K * mine * static_cast<size_t>(j);
  }
  comm_.iall_to_allv(out_.data(), sc, sd, in_.data(), rc, rd)->wait();
  // The owner sums (exact: every sum is at most a problem's total < 2^31) and decides.
  decided_.resize(mine * 12);
  std::vector<uint32_t> sum(K);
  for (size_t i = 0; i < mine; ++i) {
    std::fill(sum.begin(), sum.end(), 0u);
    for (int j = 0; j < R; ++j)
      for (size_t k = 0; k < K; ++k) sum[k] += in_[(static_cast<size_t>(j) * mine + i) * K + k];
    const uint64_t code = cluster::majority_code(sum.data(), sum[64], codes[lo + i]);
    std::memcpy(decided_.data() + i * 12, &code, 8);
    std::memcpy(decided_.data() + i * 12 + 8, &sum[64], 4);
  }
  std::vector<size_t> gc(static_cast<size_t>(R)), gd(static_cast<size_t>(R));
  for (int j = 0; j < R; ++j) {
    gc[static_cast<size_t>(j)] = 12 * (first(j + 1) - first(j));
    gd[static_cast<size_t>(j)] = 12 * first(j);
  }
  all_decided_.resize(rows * 12);
  comm_.iall_gatherv(decided_.data(), decided_.size(), all_decided_.data(), gc, gd)->wait();
  for (size_t x = 0; x < rows; ++x) {
    const size_t a = x / static_cast<size_t>(C), c = x % static_cast<size_t>(C);
    std::memcpy(&codes[x], all_decided_.data() + x * 12, 8);
    std::memcpy(&votes[a * cv + static_cast<size_t>(C) * 64 + c], all_decided_.data() + x * 12 + 8, 4);
  }
}

void KMeansCommPeers::gather(const int64_t* mine, size_t n, int64_t* all) {
  comm_.all_gather(mine, sizeof(int64_t) * n, all);
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
