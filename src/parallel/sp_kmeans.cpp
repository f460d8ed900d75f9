#include "parallel/sp_kmeans.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <numeric>
#include <unordered_map>

#include "clattn/error.h"
#include "clattn/parallel.h"
#include "cluster/cluster.h"
#include "parallel/sp_internal.h"

namespace clattn::sp {
namespace {

bool owns(const KmTask& t, int64_t pos) { return pos >= t.first && pos < t.first + t.nloc; }

// Codes at global positions pos[task][x], fetched from their owners: each rank writes the codes
// it holds and zeros elsewhere; the sum has one nonzero term per slot, exact as two's-complement
// integers.
std::vector<std::vector<uint64_t>> fetch_codes(Communicator& comm, const std::vector<KmTask*>& tasks,
                                               const std::vector<std::vector<int64_t>>& pos) {
  size_t total = 0;
  for (const auto& p : pos) total += p.size();
  std::vector<int64_t> buf(total, 0);
  size_t o = 0;
  for (size_t t = 0; t < tasks.size(); ++t)
    for (int64_t p : pos[t]) {
      if (owns(*tasks[t], p)) buf[o] = static_cast<int64_t>(tasks[t]->codes[p - tasks[t]->first]);
      ++o;
    }
  if (total > 0) all_reduce(comm, buf.data(), total);
  std::vector<std::vector<uint64_t>> out(tasks.size());
  o = 0;
  for (size_t t = 0; t < tasks.size(); ++t)
    for (size_t x = 0; x < pos[t].size(); ++x) out[t].push_back(static_cast<uint64_t>(buf[o++]));
  return out;
}

// The partial Fisher-Yates over positions 0..nv-1 of hamming_kmeans, simulated without the array:
// only displaced entries are stored.
struct Shuffle {
  std::unordered_map<int64_t, int64_t> moved;
  int64_t t = 0;
  int64_t get(int64_t x) const {
    auto it = moved.find(x);
    return it == moved.end() ? x : it->second;
  }
  int64_t draw(const Rng& rng, uint64_t stream, int64_t nv) {
    const int64_t j = t + static_cast<int64_t>(rng.below(static_cast<uint64_t>(nv - t), stream, static_cast<uint64_t>(t)));
    const int64_t a = get(t), b = get(j);
    moved[t] = b;
    moved[j] = a;
    ++t;
    return b;
  }
};

// Stage 1: with no more distinct codes than C in all, each is its own cluster (sorted).
void distinct_stage(Communicator& comm, std::vector<KmTask*>& tasks, int64_t C, std::vector<bool>& done) {
  const int R = comm.size();
  const size_t slot = static_cast<size_t>(C + 2);  // count, then up to C + 1 codes
  std::vector<uint64_t> mine(tasks.size() * slot, 0), all(mine.size() * static_cast<size_t>(R));
  for (size_t t = 0; t < tasks.size(); ++t) {
    std::vector<uint64_t> d(tasks[t]->codes, tasks[t]->codes + tasks[t]->nloc);
    std::sort(d.begin(), d.end());
    d.erase(std::unique(d.begin(), d.end()), d.end());
    const size_t keep = std::min(d.size(), static_cast<size_t>(C + 1));
    mine[t * slot] = keep;
    std::copy(d.begin(), d.begin() + static_cast<int64_t>(keep), mine.begin() + static_cast<int64_t>(t * slot + 1));
  }
  all_gather(comm, mine.data(), sizeof(uint64_t) * mine.size(), all.data());
  for (size_t t = 0; t < tasks.size(); ++t) {
    std::vector<uint64_t> u;
    for (int r = 0; r < R; ++r) {
      const uint64_t* s = all.data() + static_cast<size_t>(r) * mine.size() + t * slot;
      u.insert(u.end(), s + 1, s + 1 + s[0]);
    }
    std::sort(u.begin(), u.end());
    u.erase(std::unique(u.begin(), u.end()), u.end());
    if (static_cast<int64_t>(u.size()) > C) continue;
    KmTask& k = *tasks[t];
    k.centroids = u;
    k.ce = static_cast<int64_t>(u.size());
    for (int64_t i = 0; i < k.nloc; ++i)
      k.assign[static_cast<size_t>(i)] =
          static_cast<int32_t>(std::lower_bound(u.begin(), u.end(), k.codes[i]) - u.begin());
    done[t] = true;
  }
}

// Stage 2: C distinct codes of the seeded draws, fetched batch by batch from their owners.
void initial_stage(Communicator& comm, std::vector<KmTask*>& tasks, int64_t C, const Rng& rng,
                   const std::vector<bool>& skip) {
  std::vector<Shuffle> sh(tasks.size());
  std::vector<bool> ready(skip);
  for (size_t t = 0; t < tasks.size(); ++t)
    if (!skip[t]) tasks[t]->centroids.clear();
  int64_t batch = C + 16;
  while (true) {
    std::vector<KmTask*> act;
    std::vector<size_t> idx;
    std::vector<std::vector<int64_t>> pos;
    for (size_t t = 0; t < tasks.size(); ++t) {
      if (ready[t]) continue;
      KmTask& k = *tasks[t];
      std::vector<int64_t> p;
      for (int64_t x = 0; x < batch && sh[t].t < k.nv; ++x) p.push_back(sh[t].draw(rng, k.stream, k.nv));
      act.push_back(&k);
      idx.push_back(t);
      pos.push_back(std::move(p));
    }
    // Every rank reaches the same decision (the same draws, the same fetched codes).
    if (act.empty()) break;
    const std::vector<std::vector<uint64_t>> codes = fetch_codes(comm, act, pos);
    for (size_t a = 0; a < act.size(); ++a) {
      KmTask& k = *act[a];
      for (uint64_t code : codes[a]) {
        if (static_cast<int64_t>(k.centroids.size()) == C) break;
        if (std::find(k.centroids.begin(), k.centroids.end(), code) == k.centroids.end()) k.centroids.push_back(code);
      }
      if (static_cast<int64_t>(k.centroids.size()) == C) ready[idx[a]] = true;
      else check(sh[idx[a]].t < k.nv, "sequence parallel: internal: k-means found fewer than ", C, " distinct codes");
    }
    batch *= 2;
  }
}

// Re-seeding of empty clusters: the members farthest from their centroids first (lower position
// on ties), skipping codes some centroid holds — over all ranks, fetched a batch at a time.
void reseed_stage(Communicator& comm, std::vector<KmTask*>& tasks, std::vector<std::vector<int64_t>>& sizes,
                  const std::vector<std::vector<uint32_t>>& dist) {
  const int R = comm.size(), me = comm.rank();
  const size_t n = tasks.size();
  // Local candidates by (distance desc, position asc).
  std::vector<std::vector<int64_t>> order(n);
  std::vector<size_t> cursor(n, 0);
  std::vector<int64_t> next_c(n, 0);
  std::vector<bool> done(n, false);
  for (size_t t = 0; t < n; ++t) {
    order[t].resize(static_cast<size_t>(tasks[t]->nloc));
    std::iota(order[t].begin(), order[t].end(), int64_t{0});
    std::stable_sort(order[t].begin(), order[t].end(),
                     [&](int64_t a, int64_t b) { return dist[t][static_cast<size_t>(a)] > dist[t][static_cast<size_t>(b)]; });
  }
  constexpr int64_t kBatch = 64;
  const size_t per = static_cast<size_t>(2 + 3 * kBatch);  // sent, remaining after, then (dist, pos, code)
  std::vector<int64_t> mine(n * per), all(n * per * static_cast<size_t>(R));
  while (true) {
    for (size_t t = 0; t < n; ++t) {
      int64_t* m = mine.data() + t * per;
      std::fill(m, m + per, 0);
      if (done[t]) continue;
      const int64_t avail = static_cast<int64_t>(order[t].size() - cursor[t]), k = std::min(kBatch, avail);
      m[0] = k;
      m[1] = avail - k;
      for (int64_t x = 0; x < k; ++x) {
        const int64_t i = order[t][cursor[t] + static_cast<size_t>(x)];
        m[2 + 3 * x] = dist[t][static_cast<size_t>(i)];
        m[3 + 3 * x] = tasks[t]->first + i;
        m[4 + 3 * x] = static_cast<int64_t>(tasks[t]->codes[i]);
      }
    }
    all_gather(comm, mine.data(), sizeof(int64_t) * mine.size(), all.data());
    bool more = false;
    for (size_t t = 0; t < n; ++t) {
      if (done[t]) continue;
      KmTask& k = *tasks[t];
      const int64_t C = static_cast<int64_t>(k.centroids.size());
      std::vector<int64_t> head(static_cast<size_t>(R), 0);
      auto list = [&](int r) { return all.data() + (static_cast<size_t>(r) * n + t) * per; };
      bool starved = false;
      while (next_c[t] < C) {
        if (sizes[t][static_cast<size_t>(next_c[t])] != 0) {
          ++next_c[t];
          continue;
        }
        // The next candidate over the ranks; stop when a rank has more than it sent.
        int best = -1;
        for (int r = 0; r < R; ++r) {
          const int64_t* l = list(r);
          if (head[static_cast<size_t>(r)] == l[0]) {
            if (l[1] > 0) starved = true;
            continue;
          }
          const int64_t* e = l + 2 + 3 * head[static_cast<size_t>(r)];
          if (best < 0) {
            best = r;
            continue;
          }
          const int64_t* f = list(best) + 2 + 3 * head[static_cast<size_t>(best)];
          if (e[0] > f[0] || (e[0] == f[0] && e[1] < f[1])) best = r;
        }
        if (starved) break;
        if (best < 0) {  // every candidate used: the cluster stays empty
          next_c[t] = C;
          break;
        }
        const int64_t* e = list(best) + 2 + 3 * head[static_cast<size_t>(best)];
        ++head[static_cast<size_t>(best)];
        const uint64_t code = static_cast<uint64_t>(e[2]);
        if (std::find(k.centroids.begin(), k.centroids.end(), code) != k.centroids.end()) continue;
        k.centroids[static_cast<size_t>(next_c[t])] = code;
        ++next_c[t];
      }
      cursor[t] += static_cast<size_t>(head[static_cast<size_t>(me)]);
      if (next_c[t] >= C) done[t] = true;
      else more = true;
    }
    if (!more) break;
  }
}

}  // namespace

void distributed_kmeans(Communicator& comm, std::vector<KmTask>& all_tasks, int64_t C, int iterations, const Rng& rng) {
  check(C >= 1 && iterations >= 0, "sequence parallel: k-means needs clusters >= 1 and iterations >= 0");
  std::vector<KmTask*> tasks;
  for (KmTask& k : all_tasks) {
    k.assign.assign(static_cast<size_t>(k.nloc), 0);
    k.ce = 0;
    k.centroids.clear();
    if (k.nv > 0) tasks.push_back(&k);
  }
  const size_t n = tasks.size();
  std::vector<bool> done(n, false);
  distinct_stage(comm, tasks, C, done);
  initial_stage(comm, tasks, C, rng, done);
  std::vector<bool> converged(done);
  std::vector<std::vector<int32_t>> prev(n);
  std::vector<std::vector<uint32_t>> dist(n);
  for (size_t t = 0; t < n; ++t) {
    if (done[t]) continue;
    tasks[t]->ce = C;
    prev[t].assign(static_cast<size_t>(tasks[t]->nloc), -1);
    dist[t].resize(static_cast<size_t>(tasks[t]->nloc));
  }
  const size_t cnt = static_cast<size_t>(C * 65);  // 64 bit counts and the size of each cluster
  for (int it = 0; it < iterations; ++it) {
    std::vector<size_t> act;
    for (size_t t = 0; t < n; ++t)
      if (!converged[t]) act.push_back(t);
    if (act.empty()) break;
    std::vector<int64_t> changed(act.size(), 0);
    parallel_for(static_cast<int64_t>(act.size()), [&](int64_t a) {
      KmTask& k = *tasks[act[static_cast<size_t>(a)]];
      const size_t t = act[static_cast<size_t>(a)];
      cluster::assign_nearest(k.codes, k.nloc, k.centroids.data(), C, k.assign.data(), dist[t].data());
      changed[static_cast<size_t>(a)] = !std::equal(k.assign.begin(), k.assign.end(), prev[t].begin());
    });
    all_reduce(comm, changed.data(), changed.size());
    // Same assignment everywhere as the round before: this task's k-means has converged.
    std::vector<size_t> go;
    for (size_t a = 0; a < act.size(); ++a) {
      if (changed[a] == 0) converged[act[a]] = true;
      else go.push_back(act[a]);
    }
    if (go.empty()) break;
    std::vector<int64_t> votes(go.size() * cnt, 0);
    parallel_for(static_cast<int64_t>(go.size()), [&](int64_t a) {
      const size_t t = go[static_cast<size_t>(a)];
      KmTask& k = *tasks[t];
      std::copy(k.assign.begin(), k.assign.end(), prev[t].begin());
      int64_t* v = votes.data() + static_cast<size_t>(a) * cnt;  // (C, 64) bit counts, then (C) sizes
      for (int64_t i = 0; i < k.nloc; ++i) {
        const int64_t c = k.assign[static_cast<size_t>(i)];
        ++v[C * 64 + c];
        for (uint64_t x = k.codes[i]; x; x &= x - 1) ++v[c * 64 + std::countr_zero(x)];
      }
    });
    all_reduce(comm, votes.data(), votes.size());
    std::vector<KmTask*> reseed;
    std::vector<std::vector<int64_t>> rs_sizes;
    std::vector<std::vector<uint32_t>> rs_dist;
    for (size_t a = 0; a < go.size(); ++a) {
      KmTask& k = *tasks[go[a]];
      const int64_t* v = votes.data() + a * cnt;
      bool empty = false;
      for (int64_t c = 0; c < C; ++c) {
        const int64_t size = v[C * 64 + c];
        if (size == 0) {
          empty = true;
          continue;
        }
        uint64_t code = k.centroids[static_cast<size_t>(c)];
        for (int b = 0; b < 64; ++b) {
          const int64_t twice = 2 * v[c * 64 + b];
          if (twice > size) code |= uint64_t{1} << b;
          else if (twice < size) code &= ~(uint64_t{1} << b);
        }
        k.centroids[static_cast<size_t>(c)] = code;
      }
      if (empty) {
        reseed.push_back(&k);
        rs_sizes.emplace_back(v + C * 64, v + C * 65);
        rs_dist.push_back(dist[go[a]]);
      }
    }
    // Every rank sees the same sizes, so every rank takes part in the same re-seeding rounds.
    if (!reseed.empty()) reseed_stage(comm, reseed, rs_sizes, rs_dist);
  }
  for (size_t t = 0; t < n; ++t)
    if (!converged[t]) cluster::assign_nearest(tasks[t]->codes, tasks[t]->nloc, tasks[t]->centroids.data(), C,
                                               tasks[t]->assign.data(), nullptr);
  // Global sizes of the final clusters.
  size_t total = 0;
  for (KmTask* k : tasks) total += static_cast<size_t>(k->ce);
  std::vector<int64_t> sz(total, 0);
  size_t o = 0;
  for (KmTask* k : tasks) {
    for (int32_t c : k->assign) ++sz[o + static_cast<size_t>(c)];
    o += static_cast<size_t>(k->ce);
  }
  if (total > 0) all_reduce(comm, sz.data(), total);
  o = 0;
  for (KmTask* k : tasks) {
    k->sizes.assign(sz.begin() + static_cast<int64_t>(o), sz.begin() + static_cast<int64_t>(o + static_cast<size_t>(k->ce)));
    o += static_cast<size_t>(k->ce);
  }
}

}  // namespace clattn::sp
