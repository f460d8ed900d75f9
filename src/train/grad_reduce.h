// The gradient of a step's whole batch, summed across ranks in one fixed order whatever their
// number (docs/distributed.md).
//
// A step's batch of G sequences is cut into G units of one sequence each; rank r computes the
// gradients of its contiguous units [lo, hi) one forward/backward each. Their sum follows one
// binary tree over the G units, fixed by G alone (a node [a, b) adds its left half
// [a, a + ceil((b-a)/2)) and its right half, in that order), so it has the same bits for any
// number of ranks and any split of the units:
//   * locally, each unit's gradient is merged bottom-up into the complete subtrees it finishes
//     (a stack of at most log2(G) + 1 partial sums); at the end the stack holds the maximal tree
//     nodes inside [lo, hi);
//   * the parameters are split into R contiguous shards, one per rank; each rank sends every node
//     it holds, restricted to shard j, to rank j (all-to-all), in buckets as the last unit's
//     backward finishes each layer, so the exchange overlaps the rest of the backward;
//   * rank j evaluates the tree over all G units for its shard from the nodes it received (a node
//     a rank sent is taken as is; any other node is left + right), bucket by bucket as each one's
//     nodes are all in, and scales it;
//   * then each bucket's shards are gathered (every rank holds the summed gradient), again bucket
//     by bucket, so that only the last buckets' exchange waits after the backward; or, with the
//     optimizer sharded (ZeRO-1), each rank updates its own shard and the parameters are gathered.
// On one rank the same tree is evaluated locally, so R = 1, 2, 4 and R = 1 with any batch split
// give identical sums. The shards are unions of nn::sum_squares blocks, so the gradient norm of
// the shards adds up to the same bits as the norm of the whole.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "clattn/comm.h"

namespace clattn::train {

class GradReducer {
 public:
  GradReducer(Communicator& comm, int64_t params, int64_t units);
  int64_t lo() const { return lo_; }  // this rank's units [lo, hi)
  int64_t hi() const { return hi_; }
  int64_t shard_begin() const { return shard_[static_cast<size_t>(comm_.rank())]; }
  int64_t shard_end() const { return shard_[static_cast<size_t>(comm_.rank()) + 1]; }
  const std::vector<int64_t>& shards() const { return shard_; }  // (R + 1) boundaries

  // Unit u's gradient g (params floats), [begin, end) of it final: merges that range into the
  // partial sums. Units come in order lo..hi-1; a unit may come in several ranges (the last one,
  // range by range as its backward finishes them), each range once.
  void add(int64_t u, const float* g, int64_t begin, int64_t end);
  // Where the step's sum goes, set before its first send: this rank's shard, times `scale`, into
  // out + shard_begin(); with `gather`, every rank's shards into out (params floats) as well. The
  // ranges of out a bucket covers are written while the backward still runs (they are final).
  void target(float* out, float scale, bool gather);
  // After the last unit's range [begin, end) was added: starts exchanging it.
  void send(int64_t begin, int64_t end);
  // Progresses the exchanges under way (call now and then during compute): a bucket whose nodes
  // are all in is summed into the target and its gather started.
  void progress();
  // Completes every exchange (all params must have been sent) and returns the milliseconds it took.
  double finish();

 private:
  struct Node {
    int64_t a, b;
  };
  struct Op {  // one step of merging unit u into the stack of partial sums
    enum Kind { copy_leaf, add_leaf, add_slot } kind;
    int dst, src;
  };
  std::vector<Op> schedule(int64_t u);
  Node left(const Node& n) const;
  Node right(const Node& n) const;
  std::vector<Node> cover(int64_t lo, int64_t hi) const;
  void fold(const Node& n, size_t depth, int64_t len, const std::vector<const float*>& have,
            const std::vector<Node>& ids, float* out);
  struct Bucket;
  void reduce(Bucket& b);  // the bucket's nodes are in: sum, scale, start the gather

  Communicator& comm_;
  std::unique_ptr<Communicator> gather_comm_;  // the same ranks, for the gathers
  int64_t P_, G_, lo_ = 0, hi_ = 0;
  std::vector<int64_t> shard_;                 // (R + 1)
  std::vector<std::vector<Node>> covers_;      // per rank: its maximal nodes, left to right
  std::vector<std::vector<Op>> ops_;           // per local unit: the merges it triggers
  std::vector<std::vector<float>> slots_;      // partial sums (params floats each)
  std::vector<int> stack_;                     // slots holding the local cover at the end
  float* out_ = nullptr;
  float scale_ = 1.f;
  bool gather_ = false;
  // Exchange buffers: per bucket, what this rank sends (its nodes for each destination) and what
  // it receives (every rank's nodes for its shard); then its sum on this rank's shard, sent to
  // every rank.
  struct Bucket {
    int64_t begin, end;
    std::vector<float> send, recv, mine;
    std::vector<size_t> sc, sd, rc, rd, gc, gd;
    std::unique_ptr<CommRequest> req, gat;
    bool reduced = false;
  };
  std::vector<std::unique_ptr<Bucket>> buckets_;  // kept from step to step: [0, used_) this step's
  size_t used_ = 0;
  std::vector<std::vector<float>> scratch_;  // fold's right halves, one per tree depth
};

}  // namespace clattn::train
