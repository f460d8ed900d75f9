// Hamming k-means on LSH codes and the counting sort by cluster.
// Differences from the reference (fast-transformers): initial centroids are distinct code values
// (it draws positions, which on real models duplicated centroids and left up to half the
// clusters empty); empty clusters are re-seeded; every draw is seeded; C > n is allowed.
#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <numeric>

#include "clattn/error.h"
#include "cluster/cluster.h"
#include "core/isa.h"

#include "clattn/cpu.h"
#include "clattn/threads.h"

namespace clattn::cluster {

void assign_nearest_ref(const uint64_t* codes, int64_t n, const uint64_t* centroids, int64_t C,
                        int32_t* assign, uint32_t* dist) {
  for (int64_t i = 0; i < n; ++i) {
    int best = std::numeric_limits<int>::max();
    int32_t arg = 0;
    for (int64_t c = 0; c < C; ++c) {
      const int d = std::popcount(codes[i] ^ centroids[c]);
      if (d < best) {
        best = d;
        arg = static_cast<int32_t>(c);
      }
    }
    assign[i] = arg;
    if (dist) dist[i] = static_cast<uint32_t>(best);
  }
}

// The vector kernels of k-means are compiled once per ISA (kmeans_isa.cpp), in the tables of
// core/isa.h.
void assign_nearest(const uint64_t* codes, int64_t n, const uint64_t* centroids, int64_t C,
                    int32_t* assign, uint32_t* dist) {
  isa_kernels().assign_nearest(codes, n, centroids, C, assign, dist);
}

namespace {

// counts (C, 64) += bits of each member's code; sizes (C) += members.
void count_bits(const uint64_t* codes, const int32_t* assign, int64_t n, uint32_t* counts,
                uint32_t* sizes) {
  isa_kernels().count_bits(codes, assign, n, counts, sizes);
}

constexpr int64_t kVotes = 65;  // per cluster: 64 bit counts, then the size

bool holds(const KMeansProblem& p, int64_t pos) { return pos >= p.first && pos < p.first + p.n; }

// With no more distinct code values than C over all ranks, each is its own cluster, numbered in
// code order: the problem is done (ws.open[p] = 0). Each rank sends its first C + 1 distinct codes,
// found by an open-address set that stops as soon as it has them (usually after a few hundred
// codes); the union has more than C exactly when the problem does.
void distinct_stage(std::span<KMeansProblem> ps, int64_t C, KMeansPeers& peers, KMeansScratch& ws) {
  const size_t P = ps.size(), slot = static_cast<size_t>(C + 2);  // count, then up to C + 1 codes
  ws.mine.assign(P * slot, 0);
  for (size_t p = 0; p < P; ++p) {
    const KMeansProblem& q = ps[p];
    int64_t* m = ws.mine.data() + p * slot;  // (C + 2)
    size_t cap = 16;
    while (cap < static_cast<size_t>(4 * std::min<int64_t>(C + 1, q.n))) cap *= 2;
    ws.set.assign(cap, 0);
    ws.used.assign(cap, 0);
    int64_t distinct = 0;
    for (int64_t i = 0; i < q.n && distinct <= C; ++i) {
      size_t h = static_cast<size_t>((q.codes[i] * 0x9E3779B97F4A7C15ull) >> 32) & (cap - 1);
      while (ws.used[h] && ws.set[h] != q.codes[i]) h = (h + 1) & (cap - 1);
      if (!ws.used[h]) {
        ws.used[h] = 1;
        ws.set[h] = q.codes[i];
        m[1 + distinct++] = static_cast<int64_t>(q.codes[i]);
      }
    }
    m[0] = distinct;
  }
  const size_t R = static_cast<size_t>(peers.size());
  ws.all.resize(R * P * slot);
  peers.gather(ws.mine.data(), P * slot, ws.all.data());
  for (size_t p = 0; p < P; ++p) {
    KMeansProblem& q = ps[p];
    if (q.total == 0) continue;
    ws.set.clear();
    bool over = false;  // a rank alone holds more than C
    for (size_t r = 0; r < R && !over; ++r) {
      const int64_t* s = ws.all.data() + (r * P + p) * slot;
      for (int64_t x = 0; x < s[0]; ++x) ws.set.push_back(static_cast<uint64_t>(s[1 + x]));
      over = s[0] > C;
    }
    if (over) {
      ws.open[p] = 1;
      continue;
    }
    std::sort(ws.set.begin(), ws.set.end());
    ws.set.erase(std::unique(ws.set.begin(), ws.set.end()), ws.set.end());
    const int64_t u = static_cast<int64_t>(ws.set.size());
    if (u > C) {
      ws.open[p] = 1;
      continue;
    }
    std::copy(ws.set.begin(), ws.set.end(), q.centroids);
    for (int64_t i = 0; i < q.n; ++i)
      q.assign[i] = static_cast<int32_t>(std::lower_bound(q.centroids, q.centroids + u, q.codes[i]) - q.centroids);
    q.clusters = u;
  }
}

// C distinct code values for each open problem: the codes at the positions of its seeded partial
// Fisher-Yates shuffle, in draw order, skipping repeats. Positions are drawn a batch at a time and
// their codes fetched from the ranks that hold them: each writes the codes it holds and zero
// elsewhere, so the sum (exact as two's-complement integers) is the code. Batches of C + 16, then
// twice as many each time, keep the exchanges few; one process, which fetches nothing, draws only
// as many as are still missing, never past the C-th distinct code.
void draw_stage(std::span<KMeansProblem> ps, int64_t C, const Rng& rng, KMeansPeers& peers, KMeansScratch& ws) {
  const bool alone = peers.size() == 1;
  std::vector<size_t>& act = ws.live;   // problems still drawing
  std::vector<int64_t>& made = ws.flags;  // (act) draws of this batch
  ws.draws.resize(ps.size());
  for (size_t p = 0; p < ps.size(); ++p)
    if (ws.open[p]) ws.draws[p].reset(ps[p].total);
  for (int64_t batch = C + 16;; batch *= alone ? 1 : 2) {
    act.clear();
    for (size_t p = 0; p < ps.size(); ++p)
      if (ws.open[p] && ps[p].clusters < C) act.push_back(p);
    if (act.empty()) break;  // the same on every rank: the same draws, the same fetched codes
    made.resize(act.size());
    size_t stride = 0;
    for (size_t a = 0; a < act.size(); ++a) {
      const KMeansProblem& q = ps[act[a]];
      made[a] = std::min(alone ? C - q.clusters : batch, q.total - ws.draws[act[a]].drawn());
      stride = std::max(stride, static_cast<size_t>(made[a]));
    }
    ws.mine.assign(act.size() * stride, 0);  // (act, stride) codes of the draws
    for (size_t a = 0; a < act.size(); ++a) {
      const KMeansProblem& q = ps[act[a]];
      SparseShuffle& sh = ws.draws[act[a]];
      for (int64_t x = 0; x < made[a]; ++x) {
        const int64_t pos = sh.next(rng, q.stream);
        if (holds(q, pos)) ws.mine[a * stride + static_cast<size_t>(x)] = static_cast<int64_t>(q.codes[pos - q.first]);
      }
    }
    peers.sum(ws.mine.data(), ws.mine.size());
    for (size_t a = 0; a < act.size(); ++a) {
      KMeansProblem& q = ps[act[a]];
      for (int64_t x = 0; x < made[a] && q.clusters < C; ++x) {
        const uint64_t code = static_cast<uint64_t>(ws.mine[a * stride + static_cast<size_t>(x)]);
        if (std::find(q.centroids, q.centroids + q.clusters, code) == q.centroids + q.clusters)
          q.centroids[q.clusters++] = code;
      }
      check(q.clusters == C || ws.draws[act[a]].drawn() < q.total, "hamming k-means: internal: fewer than ", C,
            " distinct codes drawn");
    }
  }
}

// Empty clusters take, in cluster order, the codes of the members farthest from their centroids
// (lower position on ties), skipping codes some centroid already holds; a cluster stays empty when
// every member has been tried. Each rank orders its own members; the ranks' orders merge
// peers.reseed_batch() candidates from each per exchange, and a merge pauses at a rank that has
// more than it sent (its next could come first) until the next exchange. In one process the merge
// is the rank's own order. which (E): problems with an empty cluster; sizes[e] (C) the clusters'
// sizes over all ranks.
void reseed_stage(std::span<KMeansProblem> ps, const std::vector<size_t>& which,
                  const std::vector<const uint32_t*>& sizes, int64_t C, KMeansPeers& peers, KMeansScratch& ws) {
  const size_t E = which.size(), R = static_cast<size_t>(peers.size()), me = static_cast<size_t>(peers.rank());
  std::vector<int64_t> start(E + 1, 0), cursor(E, 0), next_c(E, 0), head(R);
  std::vector<char> done(E, 0);
  for (size_t e = 0; e < E; ++e) start[e + 1] = start[e] + ps[which[e]].n;
  ws.pick.resize(static_cast<size_t>(start[E]));  // (E, n) local members by (distance desc, position asc)
  for (size_t e = 0; e < E; ++e) {
    const uint32_t* dist = ws.dist.data() + ws.off[which[e]];
    const auto first = ws.pick.begin() + start[e], last = ws.pick.begin() + start[e + 1];
    std::iota(first, last, int64_t{0});
    std::stable_sort(first, last, [&](int64_t a, int64_t b) { return dist[a] > dist[b]; });
  }
  const int64_t batch = peers.reseed_batch();
  check(batch >= 1, "hamming k-means: the re-seeding batch must be >= 1, got ", batch);
  const size_t per = static_cast<size_t>(2 + 3 * batch);  // sent, left after, then (dist, pos, code)
  ws.mine.resize(E * per);
  ws.all.resize(R * E * per);
  while (true) {
    for (size_t e = 0; e < E; ++e) {
      int64_t* m = ws.mine.data() + e * per;
      std::fill(m, m + per, 0);
      if (done[e]) continue;
      const KMeansProblem& q = ps[which[e]];
      const uint32_t* dist = ws.dist.data() + ws.off[which[e]];
      const int64_t avail = start[e + 1] - start[e] - cursor[e], k = std::min(batch, avail);
      m[0] = k;
      m[1] = avail - k;
      for (int64_t x = 0; x < k; ++x) {
        const int64_t i = ws.pick[static_cast<size_t>(start[e] + cursor[e] + x)];
        m[2 + 3 * x] = dist[i];
        m[3 + 3 * x] = q.first + i;
        m[4 + 3 * x] = static_cast<int64_t>(q.codes[i]);
      }
    }
    peers.gather(ws.mine.data(), E * per, ws.all.data());
    bool more = false;
    for (size_t e = 0; e < E; ++e) {
      if (done[e]) continue;
      uint64_t* cent = ps[which[e]].centroids;
      auto list = [&](size_t r) { return ws.all.data() + (r * E + e) * per; };
      std::fill(head.begin(), head.end(), 0);
      bool starved = false;
      while (next_c[e] < C) {
        if (sizes[e][next_c[e]] != 0) {
          ++next_c[e];
          continue;
        }
        // The next candidate over the ranks.
        size_t best = R;
        for (size_t r = 0; r < R; ++r) {
          const int64_t* l = list(r);
          if (head[r] == l[0]) {
            starved = starved || l[1] > 0;
            continue;
          }
          const int64_t *c = l + 2 + 3 * head[r], *b = best < R ? list(best) + 2 + 3 * head[best] : nullptr;
          if (!b || c[0] > b[0] || (c[0] == b[0] && c[1] < b[1])) best = r;
        }
        if (starved) break;
        if (best == R) {  // every member tried: the rest stay empty
          next_c[e] = C;
          break;
        }
        const uint64_t code = static_cast<uint64_t>(list(best)[2 + 3 * head[best] + 2]);
        ++head[best];
        if (std::find(cent, cent + C, code) != cent + C) continue;
        cent[next_c[e]++] = code;
      }
      cursor[e] += head[me];
      if (next_c[e] >= C) done[e] = 1;
      else more = true;
    }
    // Every rank reaches the same decision: the merge runs on the same gathered lists.
    if (!more) break;
  }
}

// Cuts the live problems' rows into blocks. Called outside a parallel region, a problem with
// enough work (n·C >= 2^18) splits into blocks for the team (shared among the live problems):
// rows are independent and votes are integers summed after, so the clusters equal the
// single-thread ones exactly. The first block of live problem a votes into slot a, every other
// block into a slot of its own; returns the number of slots.
size_t plan_blocks(std::span<const KMeansProblem> ps, const std::vector<size_t>& live, int64_t C,
                   std::vector<KMeansBlock>& blocks) {
  const int64_t A = static_cast<int64_t>(live.size()), share = (max_threads() + A - 1) / std::max<int64_t>(A, 1);
  size_t slots = live.size();
  blocks.clear();
  for (size_t a = 0; a < live.size(); ++a) {
    const int64_t n = ps[live[a]].n;
    const int64_t T = n * C >= (int64_t{1} << 18) && team_size() == 1 ? std::min<int64_t>(share, n / 256 + 1) : 1;
    for (int64_t x = 0; x < T; ++x) blocks.push_back({a, x * n / T, (x + 1) * n / T - x * n / T, x == 0 ? a : slots++});
  }
  return slots;
}

// fn(block index, block) over the blocks: on the team when called outside a parallel region, else
// in order on the calling thread.
template <class F>
void run_blocks(const std::vector<KMeansBlock>& blocks, F&& fn) {
  split_for(blocks.size() > 1 && team_size() == 1, static_cast<int64_t>(blocks.size()), thread_id(),
            [&](int64_t x, int) { fn(x, blocks[static_cast<size_t>(x)]); });
}

}  // namespace

void SparseShuffle::reset(int64_t n) {
  n_ = n;
  t_ = 0;
  filled_ = 0;
  keys_.assign(std::max<size_t>(keys_.size(), 64), -1);
  vals_.resize(keys_.size());
}

int64_t& SparseShuffle::entry(int64_t x) {
  const size_t mask = keys_.size() - 1;
  size_t h = static_cast<size_t>((static_cast<uint64_t>(x) * 0x9E3779B97F4A7C15ull) >> 32) & mask;
  while (keys_[h] != -1 && keys_[h] != x) h = (h + 1) & mask;
  if (keys_[h] == -1) {
    keys_[h] = x;
    vals_[h] = x;
    ++filled_;
  }
  return vals_[h];
}

int64_t SparseShuffle::next(const Rng& rng, uint64_t stream) {
  // A draw adds at most two entries: the table grows first (kept at most a quarter full), so the
  // two references below stay valid.
  if (4 * (filled_ + 2) > static_cast<int64_t>(keys_.size())) {
    const std::vector<int64_t> k = std::move(keys_), v = std::move(vals_);
    keys_.assign(2 * k.size(), -1);
    vals_.assign(keys_.size(), 0);
    filled_ = 0;
    for (size_t i = 0; i < k.size(); ++i)
      if (k[i] != -1) entry(k[i]) = v[i];
  }
  const int64_t j =
      t_ + static_cast<int64_t>(rng.below(static_cast<uint64_t>(n_ - t_), stream, static_cast<uint64_t>(t_)));
  int64_t& at_t = entry(t_);
  std::swap(at_t, entry(j));
  ++t_;
  return at_t;
}

void KMeansPeers::gather(const int64_t* mine, size_t n, int64_t* all) { std::copy(mine, mine + n, all); }

void KMeansPeers::vote(uint32_t* votes, uint64_t* codes, size_t problems, int64_t C) {
  const size_t cv = static_cast<size_t>(C * kVotes);
  sum_counts(votes, problems * cv);
  for (size_t a = 0; a < problems; ++a) {
    const uint32_t *counts = votes + a * cv, *sizes = counts + C * 64;  // (C, 64), (C)
    for (int64_t c = 0; c < C; ++c)
      codes[a * static_cast<size_t>(C) + static_cast<size_t>(c)] =
          majority_code(counts + c * 64, sizes[c], codes[a * static_cast<size_t>(C) + static_cast<size_t>(c)]);
  }
}

void hamming_kmeans(std::span<KMeansProblem> ps, int64_t C, int iterations, const Rng& rng, KMeansPeers& peers,
                    KMeansScratch& ws) {
  check(C >= 1, "hamming k-means: clusters must be >= 1, got ", C);
  check(iterations >= 0, "hamming k-means: iterations must be >= 0, got ", iterations);
  for (KMeansProblem& q : ps) {
    const bool inside = q.n == 0 || (q.first >= 0 && q.first + q.n <= q.total);
    check(q.total <= std::numeric_limits<int32_t>::max() && q.n >= 0 && inside,
          "hamming k-means: a problem holds codes [first, first + n) of total < 2^31 (votes are 32-bit "
          "counts), got first ", q.first, ", n ", q.n, ", total ", q.total);
    q.clusters = 0;
  }
  const size_t P = ps.size(), cv = static_cast<size_t>(C * kVotes);
  ws.open.assign(P, 0);
  distinct_stage(ps, C, peers, ws);
  draw_stage(ps, C, rng, peers, ws);

  std::vector<size_t>& live = ws.live;
  std::vector<KMeansBlock>& blocks = ws.blocks;
  std::vector<int64_t>& changed = ws.changed;  // (blocks) the assignment changed
  std::vector<int64_t>& any = ws.flags;        // (live) the assignment changed on some rank
  live.clear();
  ws.off.assign(P + 1, 0);
  for (size_t p = 0; p < P; ++p) {
    ws.off[p + 1] = ws.off[p] + (ws.open[p] ? ps[p].n : 0);
    if (ws.open[p]) live.push_back(p);
  }
  ws.prev.assign(static_cast<size_t>(ws.off[P]), -1);  // (Σn)
  ws.dist.resize(static_cast<size_t>(ws.off[P]));      // (Σn)
  std::vector<size_t> reseed;  // only allocated when a cluster empties
  std::vector<const uint32_t*> reseed_sizes;
  for (int it = 0; it < iterations && !live.empty(); ++it) {
    plan_blocks(ps, live, C, blocks);
    changed.assign(blocks.size(), 0);
    run_blocks(blocks, [&](int64_t x, const KMeansBlock& b) {
      const KMeansProblem& q = ps[live[b.a]];
      const int64_t o = ws.off[live[b.a]] + b.i0;
      assign_nearest(q.codes + b.i0, b.rows, q.centroids, C, q.assign + b.i0, ws.dist.data() + o);
      changed[static_cast<size_t>(x)] = !std::equal(q.assign + b.i0, q.assign + b.i0 + b.rows, ws.prev.begin() + o);
    });
    any.assign(live.size(), 0);
    for (size_t x = 0; x < blocks.size(); ++x) any[blocks[x].a] |= changed[x];
    peers.sum(any.data(), any.size());
    // Same assignment on every rank as the round before: the update would reproduce the same
    // centroids (same votes, same ties, same re-seeding), so every later round is identical. That
    // problem stops early, its assignment final.
    size_t kept = 0;
    for (size_t a = 0; a < live.size(); ++a)
      if (any[a] != 0) live[kept++] = live[a];
    live.resize(kept);
    if (live.empty()) break;

    const size_t slots = plan_blocks(ps, live, C, blocks);
    ws.votes.assign(slots * cv, 0u);  // (slots, C, 65)
    run_blocks(blocks, [&](int64_t, const KMeansBlock& b) {
      const KMeansProblem& q = ps[live[b.a]];
      std::copy(q.assign + b.i0, q.assign + b.i0 + b.rows, ws.prev.begin() + ws.off[live[b.a]] + b.i0);
      uint32_t* v = ws.votes.data() + b.slot * cv;
      count_bits(q.codes + b.i0, q.assign + b.i0, b.rows, v, v + C * 64);
    });
    for (const KMeansBlock& b : blocks)
      if (b.slot != b.a)
        for (size_t i = 0; i < cv; ++i) ws.votes[b.a * cv + i] += ws.votes[b.slot * cv + i];
    ws.codes.resize(live.size() * static_cast<size_t>(C));  // (live, C)
    for (size_t a = 0; a < live.size(); ++a)
      std::copy(ps[live[a]].centroids, ps[live[a]].centroids + C, ws.codes.begin() + static_cast<int64_t>(a) * C);
    peers.vote(ws.votes.data(), ws.codes.data(), live.size(), C);
    reseed.clear();
    reseed_sizes.clear();
    for (size_t a = 0; a < live.size(); ++a) {
      std::copy(ws.codes.begin() + static_cast<int64_t>(a) * C, ws.codes.begin() + static_cast<int64_t>(a + 1) * C,
                ps[live[a]].centroids);
      const uint32_t* sizes = ws.votes.data() + a * cv + C * 64;  // (C)
      const bool empty = std::find(sizes, sizes + C, 0u) != sizes + C;
      if (empty) {
        reseed.push_back(live[a]);
        reseed_sizes.push_back(sizes);
      }
    }
    // Every rank sees the same sizes, so every rank takes part in the same re-seeding exchanges.
    if (!reseed.empty()) reseed_stage(ps, reseed, reseed_sizes, C, peers, ws);
  }
  plan_blocks(ps, live, C, blocks);
  run_blocks(blocks, [&](int64_t, const KMeansBlock& b) {
    const KMeansProblem& q = ps[live[b.a]];
    assign_nearest(q.codes + b.i0, b.rows, q.centroids, C, q.assign + b.i0, nullptr);
  });
}

int64_t hamming_kmeans(const uint64_t* codes, int64_t n, int64_t C, int iterations, const Rng& rng,
                       uint64_t stream, int32_t* assign, uint64_t* centroids, KMeansScratch& ws) {
  KMeansProblem q;
  q.codes = codes;
  q.n = q.total = n;
  q.stream = stream;
  q.assign = assign;
  q.centroids = centroids;
  KMeansPeers one_process;
  hamming_kmeans(std::span<KMeansProblem>(&q, 1), C, iterations, rng, one_process, ws);
  return q.clusters;
}

int64_t hamming_kmeans_ref(const uint64_t* codes, int64_t n, int64_t C, int iterations,
                           const Rng& rng, uint64_t stream, int32_t* assign, uint64_t* centroids) {
  if (n == 0) return 0;
  std::vector<uint64_t> distinct(codes, codes + n);
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  if (static_cast<int64_t>(distinct.size()) <= C) {
    std::copy(distinct.begin(), distinct.end(), centroids);
    for (int64_t i = 0; i < n; ++i)
      assign[i] = static_cast<int32_t>(std::lower_bound(distinct.begin(), distinct.end(), codes[i]) - distinct.begin());
    return static_cast<int64_t>(distinct.size());
  }
  std::vector<int64_t> pick(static_cast<size_t>(n));
  std::iota(pick.begin(), pick.end(), int64_t{0});
  int64_t chosen = 0;
  for (int64_t t = 0; t < n && chosen < C; ++t) {
    const int64_t j = t + static_cast<int64_t>(rng.below(static_cast<uint64_t>(n - t), stream, static_cast<uint64_t>(t)));
    std::swap(pick[static_cast<size_t>(t)], pick[static_cast<size_t>(j)]);
    const uint64_t code = codes[pick[static_cast<size_t>(t)]];
    if (std::find(centroids, centroids + chosen, code) == centroids + chosen) centroids[chosen++] = code;
  }
  std::vector<uint32_t> dist(static_cast<size_t>(n));
  for (int it = 0; it < iterations; ++it) {
    assign_nearest_ref(codes, n, centroids, C, assign, dist.data());
    std::vector<int64_t> size(static_cast<size_t>(C), 0), ones(static_cast<size_t>(C * 64), 0);
    for (int64_t i = 0; i < n; ++i) {
      ++size[static_cast<size_t>(assign[i])];
      for (int b = 0; b < 64; ++b) ones[static_cast<size_t>(assign[i] * 64 + b)] += (codes[i] >> b) & 1;
    }
    for (int64_t c = 0; c < C; ++c)
      for (int b = 0; b < 64 && size[static_cast<size_t>(c)] > 0; ++b) {
        const int64_t twice = 2 * ones[static_cast<size_t>(c * 64 + b)], sz = size[static_cast<size_t>(c)];
        if (twice > sz) centroids[c] |= uint64_t{1} << b;
        if (twice < sz) centroids[c] &= ~(uint64_t{1} << b);
      }
    std::vector<int64_t> far(static_cast<size_t>(n));
    std::iota(far.begin(), far.end(), int64_t{0});
    std::stable_sort(far.begin(), far.end(), [&](int64_t a, int64_t b) { return dist[static_cast<size_t>(a)] > dist[static_cast<size_t>(b)]; });
    size_t next = 0;
    for (int64_t c = 0; c < C; ++c) {
      if (size[static_cast<size_t>(c)] != 0) continue;
      while (next < far.size() && std::find(centroids, centroids + C, codes[far[next]]) != centroids + C) ++next;
      if (next < far.size()) centroids[c] = codes[far[next++]];
    }
  }
  assign_nearest_ref(codes, n, centroids, C, assign, nullptr);
  return C;
}

void counting_sort(const int32_t* assign, int64_t n, int64_t C, int32_t* order, int32_t* offsets) {
  std::fill(offsets, offsets + C + 1, 0);
  for (int64_t i = 0; i < n; ++i) ++offsets[assign[i] + 1];
  for (int64_t c = 0; c < C; ++c) offsets[c + 1] += offsets[c];
  // Place members using a running cursor per cluster (offsets[c] advanced, then restored).
  for (int64_t i = 0; i < n; ++i) order[offsets[assign[i]]++] = static_cast<int32_t>(i);
  for (int64_t c = C; c > 0; --c) offsets[c] = offsets[c - 1];
  offsets[0] = 0;
}

}  // namespace clattn::cluster
