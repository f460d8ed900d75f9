#include "train/grad_reduce.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "clattn/error.h"
#include "clattn/nn.h"

namespace clattn::train {

namespace {
double ms_now() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

GradReducer::GradReducer(Communicator& comm, int64_t params, int64_t units) : comm_(comm), P_(params), G_(units) {
  const int R = comm.size(), r = comm.rank();
  check(G_ >= R, "train: a batch of ", G_, " sequences cannot be split over ", R, " ranks (each needs one); use --batch >= ", R);
  lo_ = G_ * r / R;
  hi_ = G_ * (r + 1) / R;
  // Shards: unions of the blocks nn::sum_squares adds in order.
  const int64_t nb = nn::sum_squares_blocks(P_);
  shard_.resize(static_cast<size_t>(R) + 1);
  for (int j = 0; j <= R; ++j) shard_[static_cast<size_t>(j)] = P_ * (nb * j / R) / nb;
  for (int i = 0; i < R; ++i) covers_.push_back(cover(G_ * i / R, G_ * (i + 1) / R));
  // The merges each local unit triggers, and the slots they use.
  struct Entry {
    Node n;
    int slot;
  };
  std::vector<Entry> stack;
  std::vector<int> free_slots;
  int nslots = 0;
  auto is_node = [&](Node n) {
    Node cur{0, G_};
    while (true) {
      if (cur.a == n.a && cur.b == n.b) return true;
      if (cur.b - cur.a <= 1) return false;
      const Node l = left(cur), rt = right(cur);
      if (n.a >= l.a && n.b <= l.b) cur = l;
      else if (n.a >= rt.a && n.b <= rt.b) cur = rt;
      else return false;
    }
  };
  for (int64_t u = lo_; u < hi_; ++u) {
    std::vector<Op> ops;
    Node cur{u, u + 1};
    int cur_slot = -1;  // -1: the unit's own gradient (the leaf)
    while (!stack.empty()) {
      const Entry& top = stack.back();
      const Node parent{top.n.a, cur.b};
      if (top.n.b != cur.a || !is_node(parent) || left(parent).b != top.n.b) break;
      if (cur_slot < 0) ops.push_back({Op::add_leaf, top.slot, -1});
      else {
        ops.push_back({Op::add_slot, top.slot, cur_slot});
        free_slots.push_back(cur_slot);
      }
      cur = parent;
      cur_slot = top.slot;
      stack.pop_back();
    }
    if (cur_slot < 0) {
      if (free_slots.empty()) free_slots.push_back(nslots++);
      cur_slot = free_slots.back();
      free_slots.pop_back();
      ops.push_back({Op::copy_leaf, cur_slot, -1});
    }
    stack.push_back({cur, cur_slot});
    ops_.push_back(std::move(ops));
  }
  const std::vector<Node>& mine = covers_[static_cast<size_t>(r)];
  check(stack.size() == mine.size(), "train: internal: the local tree ends with ", stack.size(), " nodes, its cover has ",
        mine.size());
  for (size_t i = 0; i < stack.size(); ++i) {
    check(stack[i].n.a == mine[i].a && stack[i].n.b == mine[i].b, "train: internal: the local tree's nodes differ from its cover");
    stack_.push_back(stack[i].slot);
  }
  // The gathers start while later buckets' all-to-alls are under way, at moments that differ from
  // rank to rank: on a communicator of their own, each kind keeps one order on every rank.
  gather_comm_ = comm.split(0, r);
  slots_.resize(static_cast<size_t>(nslots));
  for (auto& s : slots_) s.assign(static_cast<size_t>(P_), 0.f);
}

GradReducer::Node GradReducer::left(const Node& n) const { return {n.a, n.a + (n.b - n.a + 1) / 2}; }
GradReducer::Node GradReducer::right(const Node& n) const { return {n.a + (n.b - n.a + 1) / 2, n.b}; }

std::vector<GradReducer::Node> GradReducer::cover(int64_t lo, int64_t hi) const {
  std::vector<Node> out;
  std::vector<Node> todo{{0, G_}};
  while (!todo.empty()) {
    const Node n = todo.back();
    todo.pop_back();
    if (n.b <= lo || n.a >= hi) continue;
    if (n.a >= lo && n.b <= hi) {
      out.push_back(n);
      continue;
    }
    todo.push_back(right(n));  // left first out of the stack: nodes come left to right
    todo.push_back(left(n));
  }
  return out;
}

void GradReducer::add(int64_t u, const float* g, int64_t begin, int64_t end) {
  check(u >= lo_ && u < hi_ && begin >= 0 && end <= P_ && begin <= end, "train: internal: unit ", u, " range [", begin, ", ",
        end, ") outside [", lo_, ", ", hi_, ") x [0, ", P_, ")");
  const int64_t n = end - begin;
  for (const Op& op : ops_[static_cast<size_t>(u - lo_)]) {
    float* d = slots_[static_cast<size_t>(op.dst)].data() + begin;
    const float* s = op.kind == Op::add_slot ? slots_[static_cast<size_t>(op.src)].data() + begin : g + begin;
    if (op.kind == Op::copy_leaf) {
      std::memcpy(d, s, sizeof(float) * static_cast<size_t>(n));
    } else {
#pragma omp parallel for schedule(static) if (n > 65536)
      for (int64_t i = 0; i < n; ++i) d[i] += s[i];  // a node = its left half + its right half
    }
  }
}

void GradReducer::send(int64_t begin, int64_t end) {
  const int R = comm_.size(), me = comm_.rank();
  // A step sends the same ranges in the same order as the last: its buffers are reused.
  if (used_ == buckets_.size()) buckets_.push_back(std::make_unique<Bucket>());
  Bucket& b = *buckets_[used_++];
  b.begin = begin;
  b.end = end;
  b.reduced = false;
  for (auto* v : {&b.sc, &b.sd, &b.rc, &b.rd, &b.gc, &b.gd}) v->clear();
  auto part = [&](int j) {  // [begin, end) within shard j
    const int64_t s = std::max(begin, shard_[static_cast<size_t>(j)]), e = std::min(end, shard_[static_cast<size_t>(j) + 1]);
    return std::pair<int64_t, int64_t>{s, std::max(s, e)};
  };
  const int64_t k = static_cast<int64_t>(stack_.size());
  size_t soff = 0, roff = 0;
  const auto [ms, me_end] = part(me);
  const int64_t mylen = me_end - ms;
  for (int j = 0; j < R; ++j) {
    const auto [s, e] = part(j);
    b.sc.push_back(sizeof(float) * static_cast<size_t>(k * (e - s)));
    b.sd.push_back(soff);
    soff += b.sc.back();
    const int64_t from_j = static_cast<int64_t>(covers_[static_cast<size_t>(j)].size());
    b.rc.push_back(sizeof(float) * static_cast<size_t>(from_j * mylen));
    b.rd.push_back(roff);
    roff += b.rc.back();
  }
  b.send.resize(soff / sizeof(float));
  b.recv.resize(roff / sizeof(float));
  for (int j = 0; j < R; ++j) {
    const auto [s, e] = part(j);
    float* dst = b.send.data() + b.sd[static_cast<size_t>(j)] / sizeof(float);
    for (int64_t t = 0; t < k; ++t)
      std::memcpy(dst + t * (e - s), slots_[static_cast<size_t>(stack_[static_cast<size_t>(t)])].data() + s,
                  sizeof(float) * static_cast<size_t>(e - s));
  }
  b.req = comm_.iall_to_allv(b.send.data(), b.sc, b.sd, b.recv.data(), b.rc, b.rd);
}

void GradReducer::target(float* out, float scale, bool gather) {
  check(used_ == 0, "train: internal: the reduction's target set while buckets are under way");
  out_ = out;
  scale_ = scale;
  gather_ = gather;
}

void GradReducer::progress() {
  // Buckets are reduced in the order they were sent: their gathers are collectives, posted in one
  // order on every rank.
  bool in_order = true;
  for (size_t i = 0; i < used_; ++i) {
    Bucket* b = buckets_[i].get();
    if (!b->reduced) {
      const bool in = b->req->test();
      if (in && in_order) reduce(*b);
      else in_order = false;
    } else if (b->gat) {
      (void)b->gat->test();
    }
  }
}

void GradReducer::reduce(Bucket& b) {
  const int R = comm_.size();
  const int64_t s = std::max(b.begin, shard_begin()), e = std::max(s, std::min(b.end, shard_end()));
  if (e > s) {
    std::vector<const float*> have;
    std::vector<Node> ids;
    for (int i = 0; i < R; ++i) {
      const float* base = b.recv.data() + b.rd[static_cast<size_t>(i)] / sizeof(float);
      const std::vector<Node>& c = covers_[static_cast<size_t>(i)];
      for (size_t t = 0; t < c.size(); ++t) {
        have.push_back(base + static_cast<int64_t>(t) * (e - s));
        ids.push_back(c[t]);
      }
    }
    fold({0, G_}, 0, e - s, have, ids, out_ + s);
    nn::scale_inplace(out_ + s, scale_, e - s);
  }
  b.reduced = true;
  if (!gather_ || R == 1) return;
  for (int j = 0; j < R; ++j) {  // each rank's part of [begin, end), in place in out
    const int64_t js = std::clamp(shard_[static_cast<size_t>(j)], b.begin, b.end);
    const int64_t je = std::clamp(shard_[static_cast<size_t>(j) + 1], b.begin, b.end);
    b.gc.push_back(sizeof(float) * static_cast<size_t>(je - js));
    b.gd.push_back(sizeof(float) * static_cast<size_t>(js - b.begin));
  }
  b.mine.assign(out_ + s, out_ + e);  // MPI reads the send block apart from the receive buffer
  b.gat = gather_comm_->iall_gatherv(b.mine.data(), sizeof(float) * b.mine.size(), out_ + b.begin, b.gc, b.gd);
}

// out = the node's sum: a node some rank sent as is, else its left half + its right half (the
// right one added straight from a received node, or from scratch_[depth]).
void GradReducer::fold(const Node& n, size_t depth, int64_t len, const std::vector<const float*>& have,
                       const std::vector<Node>& ids, float* out) {
  auto received = [&](const Node& m) -> const float* {
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i].a == m.a && ids[i].b == m.b) return have[i];
    return nullptr;
  };
  if (const float* got = received(n)) {
    std::memcpy(out, got, sizeof(float) * static_cast<size_t>(len));
    return;
  }
  check(n.b - n.a > 1, "train: internal: tree node [", n.a, ", ", n.b, ") was sent by no rank");
  fold(left(n), depth + 1, len, have, ids, out);
  const float* r = received(right(n));
  if (!r) {
    if (scratch_.size() <= depth) scratch_.resize(depth + 1);
    std::vector<float>& tmp = scratch_[depth];
    tmp.resize(static_cast<size_t>(len));
    fold(right(n), depth + 1, len, have, ids, tmp.data());
    r = tmp.data();
  }
  for (int64_t i = 0; i < len; ++i) out[i] += r[i];
}

double GradReducer::finish() {
  const double t0 = ms_now();
  int64_t covered = 0;
  for (size_t i = 0; i < used_; ++i) {
    Bucket& b = *buckets_[i];
    covered += b.end - b.begin;
    if (b.reduced) continue;
    b.req->wait();
    reduce(b);
  }
  check(covered == P_, "train: internal: the buckets sent cover ", covered, " of ", P_, " parameters");
  for (size_t i = 0; i < used_; ++i) {
    Bucket& b = *buckets_[i];
    if (b.gat) b.gat->wait();
    b.req.reset();
    b.gat.reset();
  }
  used_ = 0;
  return ms_now() - t0;
}

}  // namespace clattn::train
