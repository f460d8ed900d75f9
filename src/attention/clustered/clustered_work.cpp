// The useful work of clustered and improved-clustered attention (clattn/attention.h, WorkModel),
// stage by stage as docs/design.md defines the algorithm. Per (batch, head), C clusters, k top keys:
//   hashing             N·Dk·bits·2 (one product Q·Aᵀ; none for positional clusters)
//   k-means             N·C·(iterations + 1) popcounts (integer work)
//   centroid means      N·Dk
//   centroid attention  softmax attention of C centroids over M keys
//   top-k recomputation softmax attention of each query over its cluster's k keys, and the
//                       C·k·Dv correction of Vc (improved only)
//   member broadcast    N·Dv copied (clustered only)
//   member placement    causal only: each query's distance to its segment's C centroids
// With C >= N every query is its own cluster and the result is full attention: no clustering.
// Causal (causal_clustered.cpp): the in-block part is exact causal attention within each block;
// each segment hashes and clusters the previous segment's queries, places its own by Euclidean
// distance to the centroids, and streams the prefix once for all its centroids.
#include <algorithm>

#include "attention/clustered/clustered.h"
#include "attention/work.h"

namespace clattn {
namespace {

// Hashing and k-means of `definers` queries into `clusters`, and the centroids' means.
void cluster_stages(WorkModel& w, const AttentionDims& d, const ClusteredParams& p, double definers,
                    double clusters) {
  const double bh = static_cast<double>(d.B * d.H);
  if (!p.positional) {
    w.add("hashing", false, 2.0 * definers * static_cast<double>(d.Dk * p.bits) * bh);
    w.add("k-means", false, 0, definers * clusters * (p.iterations + 1) * bh);
  }
  w.add("centroid means", false, definers * static_cast<double>(d.Dk) * bh);
}

// Members of C clusters attending k keys each (improved), or receiving their centroid's output.
void member_stages(WorkModel& w, const AttentionDims& d, const ClusteredParams& p, double members, double clusters,
                   double k, Mode mode) {
  const double bh = static_cast<double>(d.B * d.H), dv = static_cast<double>(d.Dv);
  if (p.topk > 0) {
    w += work::softmax_attention(d, members * k, mode, "top-k recomputation");
    w.add("top-k recomputation", false, 2.0 * clusters * k * dv * bh);
    if (mode == Mode::training) w.add("top-k recomputation", true, 4.0 * clusters * k * dv * bh);
  } else {
    w.add("member broadcast", false, 0, 0, 8.0 * members * dv * bh);
    if (mode == Mode::training)
      w.add("member broadcast", true, members * static_cast<double>(d.Dk + d.Dv) * bh, 0,
            8.0 * members * static_cast<double>(d.Dk + d.Dv) * bh);
  }
}

WorkModel plain_work(const AttentionDims& d, const ClusteredParams& p, Mode mode) {
  WorkModel w;
  if (p.clusters >= d.N) return work::softmax_attention(d, work::visible_pairs(d.N, d.M, false), mode, "centroid attention");
  const double C = static_cast<double>(p.clusters), n = static_cast<double>(d.N);
  cluster_stages(w, d, p, n, C);
  w += work::softmax_attention(d, C * static_cast<double>(d.M), mode, "centroid attention");
  member_stages(w, d, p, n, C, static_cast<double>(std::min(p.topk, d.M)), mode);
  return w;
}

WorkModel causal_work(const AttentionDims& d, const ClusteredParams& p, Mode mode) {
  if (p.clusters >= p.segment) return work::softmax_attention(d, work::visible_pairs(d.N, d.M, true), mode);
  const int64_t Lb = p.block, q0 = std::max<int64_t>(0, d.M - d.N);
  // Exact causal attention inside each block, over the queries' positions [q0, M).
  double in_block = 0;
  for (int64_t b0 = q0 / Lb * Lb; b0 < d.M; b0 += Lb) {
    const int64_t lo = std::max(b0, q0), hi = std::min(b0 + Lb, d.M);
    for (int64_t pos = lo; pos < hi; ++pos) in_block += static_cast<double>(pos - b0 + 1);
  }
  WorkModel w = work::softmax_attention(d, in_block, mode, "in-block attention");
  const std::vector<int64_t> starts = causal_segment_starts(d.M, Lb, p.segment);
  const double bh = static_cast<double>(d.B * d.H);
  auto queries_in = [&](int64_t a, int64_t b) {
    return static_cast<double>(std::max<int64_t>(0, std::min(b, d.M) - std::max(a, q0)));
  };
  for (size_t s = 1; s + 1 < starts.size(); ++s) {
    const int64_t a = starts[s], b = std::min(starts[s + 1], d.M);
    const double members = queries_in(a, b), definers = queries_in(starts[s - 1], a);
    if (members == 0 || definers == 0) continue;
    const double C = std::min(static_cast<double>(p.clusters), definers);
    cluster_stages(w, d, p, definers, C);
    w.add("member placement", false, 2.0 * members * C * static_cast<double>(d.Dk) * bh);
    // One stream over the prefix up to the segment's last block, snapshots at each block end.
    const double prefix = static_cast<double>((b - 1) / Lb * Lb);
    w.add("centroid attention", false, work::softmax_fwd_flops(d, C * prefix));
    if (mode == Mode::training) w.add("centroid attention", true, work::softmax_bwd_flops(d, C * prefix));
    member_stages(w, d, p, members, C * static_cast<double>((b - a + Lb - 1) / Lb),
                  std::min(static_cast<double>(p.topk), prefix), mode);
  }
  return w;
}

}  // namespace

// A decode step (causal_decode.cpp) at position P = context − 1 past the first block, per key/value
// head (cached rows) and query head (queries and derived state), averaged over the steps:
//   in-block keys        (block + 1) / 2 rows: 1 to block over a block's steps
//   stream advance       1 row: a new block streams the centroids over the block just closed
//   segment restart      a / len rows: a new segment [a, a + len) streams the whole prefix once
//   top-k gather         min(k, a) rows per query head (improved only)
//   k-means              1 query row (f32): a segment's len queries define the next one's clusters
//   placement            the C centroids (f32) to find the nearest, and that centroid's output
// Within the first block, or with clusters >= segment, a step is causal full attention's.
double causal_decode_bytes(const AttentionDims& d, const ClusteredParams& p, double context, double element_bytes) {
  const double Lb = static_cast<double>(p.block), kv_rows = static_cast<double>(d.B * d.Hkv),
               heads = static_cast<double>(d.B * d.H), dk = static_cast<double>(d.Dk), dv = static_cast<double>(d.Dv);
  const double all = element_bytes * (dk + dv) * kv_rows * context;
  if (p.clusters >= p.segment || context <= Lb) return all;
  const int64_t pos = static_cast<int64_t>(context) - 1;
  const std::vector<int64_t> starts = causal_segment_starts(pos + 1 + p.segment, p.block, p.segment);
  const size_t s = static_cast<size_t>(causal_segment_of(starts, pos));
  const double a = static_cast<double>(starts[s]), len = static_cast<double>(starts[s + 1] - starts[s]);
  const double prev = static_cast<double>(starts[s] - starts[s - 1]);  // the defining segment's queries
  const double C = std::min(static_cast<double>(p.clusters), prev);
  const double rows = (Lb + 1) / 2 + 1 + a / len;
  // Each query head gathers the top-k rows of its own cluster.
  const double gathered = p.topk > 0 ? std::min(static_cast<double>(p.topk), a) * heads : 0;
  const double state = 4.0 * (dk + C * dk + dv) * heads;
  return std::min(all, element_bytes * (dk + dv) * (kv_rows * rows + gathered)) + state;
}

WorkModel clustered_work(const AttentionDims& d, const ClusteredParams& p, bool causal, Mode mode) {
  return causal ? causal_work(d, p, mode) : plain_work(d, p, mode);
}

}  // namespace clattn
