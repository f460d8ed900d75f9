// Ranks as threads of one process (run_ranks_in_threads in include/clattn/comm.h): every message
// is a copy in memory, matched by (sender, receiver, tag) in the order sent, as MPI matches.
//
// Sends are buffered: isend copies the payload at once and completes, so a ring of sends never
// waits for its receives (MPI's eager protocol for small messages). Collectives are messages
// under tags of their own, one per collective call (every rank calls them in the same order), and
// every rank reduces the ranks' contributions in rank order, so all ranks hold the same bits.
// A rank that throws breaks the job: every rank waiting on it gets an Error naming it instead of
// waiting for ever, and run_ranks_in_threads rethrows the first error after all threads ended.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "clattn/comm.h"
#include "clattn/error.h"
#include "comm/comm_internal.h"

namespace clattn {
namespace {

// One receive's completion, guarded by its hub's mutex.
struct RecvState {
  bool done = false;
};

// What the ranks of one communicator share.
struct Hub {
  explicit Hub(int n) : size(n) {}
  const int size;
  std::mutex mu;
  std::condition_variable cv;
  std::string broken;  // non-empty: why every wait ends with an error

  // (from, to, tag): user tags are >= 0 ints, collective tags count down from -1.
  using Key = std::tuple<int, int, int64_t>;
  struct Posted {
    void* data;
    size_t bytes;
    std::shared_ptr<RecvState> state;
  };
  std::map<Key, std::deque<std::vector<char>>> messages;  // sent, not yet received
  std::map<Key, std::deque<Posted>> receives;             // posted, not yet matched
  // The communicators split() made: (split call, color) -> their hub.
  std::map<std::pair<uint64_t, int>, std::shared_ptr<Hub>> children;

  // Under mu.
  void break_all(const std::string& why) {
    if (!broken.empty()) return;
    broken = why;
    cv.notify_all();
    for (auto& [key, child] : children) {
      std::lock_guard<std::mutex> lock(child->mu);
      child->break_all(why);
    }
  }
};

class Threaded;

// Receives that end together; `finish` runs once, on the rank's own thread, when they have.
class Pending final : public CommRequest {
 public:
  Pending(std::shared_ptr<Hub> hub, int rank, const char* what) : hub_(std::move(hub)), rank_(rank), what_(what) {}
  void add(std::shared_ptr<RecvState> s) { states_.push_back(std::move(s)); }
  std::function<void()> finish;

  bool test() override {
    bool all;
    {
      std::lock_guard<std::mutex> lock(hub_->mu);
      check(hub_->broken.empty(), "communicator: ", what_, " on rank ", rank_, ": ", hub_->broken);
      all = std::all_of(states_.begin(), states_.end(), [](const auto& s) { return s->done; });
    }
    if (all) complete();
    return all;
  }
  void wait() override {
    {
      std::unique_lock<std::mutex> lock(hub_->mu);
      const auto ready = [&] {
        return !hub_->broken.empty() || std::all_of(states_.begin(), states_.end(), [](const auto& s) { return s->done; });
      };
      const double limit = comm_timeout();
      if (limit > 0) {
        if (!hub_->cv.wait_for(lock, std::chrono::duration<double>(limit), ready)) {
          const std::string why = detail::concat("rank ", rank_, " waited more than ", limit, " s in ", what_,
                                                 " (a rank that never calls it, or calls another collective)");
          hub_->break_all(why);
          fail("communicator: ", why);
        }
      } else {
        hub_->cv.wait(lock, ready);
      }
      check(hub_->broken.empty(), "communicator: ", what_, " on rank ", rank_, ": ", hub_->broken);
    }
    complete();
  }

 private:
  void complete() {
    if (finish) {
      auto f = std::move(finish);
      finish = nullptr;
      f();
    }
  }
  std::shared_ptr<Hub> hub_;
  int rank_;
  const char* what_;
  std::vector<std::shared_ptr<RecvState>> states_;
};

class Done final : public CommRequest {
 public:
  bool test() override { return true; }
  void wait() override {}
};

// out[x] = parts[0][x] op parts[1][x] op ... over the R rows of parts (R, n), in rank order, so
// every rank that combines the same rows holds the same bits.
template <class T, class Op>
void combine_in_rank_order(const T* parts, size_t R, size_t n, T* out, Op op) {
  for (size_t x = 0; x < n; ++x) {
    T s = parts[x];
    for (size_t r = 1; r < R; ++r) s = op(s, parts[n * r + x]);
    out[x] = s;
  }
}

class Threaded final : public Communicator {
 public:
  Threaded(std::shared_ptr<Hub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return hub_->size; }
  std::string name() const override { return detail::concat("threads of one process, ", hub_->size, " ranks"); }

  std::unique_ptr<Communicator> split(int color, int key) override {
    check(color >= 0, "communicator: split needs a color >= 0, got ", color);
    const int R = size();
    std::vector<int> mine = {color, key}, all(static_cast<size_t>(2 * R));
    all_gather(mine.data(), sizeof(int) * 2, all.data());
    std::vector<std::pair<int, int>> group;  // (key, rank) of the ranks with this color
    for (int r = 0; r < R; ++r)
      if (all[static_cast<size_t>(2 * r)] == color) group.push_back({all[static_cast<size_t>(2 * r + 1)], r});
    std::sort(group.begin(), group.end());
    const int new_rank = static_cast<int>(
        std::find_if(group.begin(), group.end(), [&](const auto& g) { return g.second == rank_; }) - group.begin());
    std::shared_ptr<Hub> child;
    {
      std::lock_guard<std::mutex> lock(hub_->mu);
      auto& slot = hub_->children[{splits_++, color}];
      if (!slot) slot = std::make_shared<Hub>(static_cast<int>(group.size()));
      child = slot;
    }
    return std::make_unique<Threaded>(child, new_rank);
  }

  void barrier() override {
    const int64_t tag = next_tag();
    auto req = std::make_unique<Pending>(hub_, rank_, "barrier");
    for (int j = 0; j < size(); ++j)
      if (j != rank_) send(nullptr, 0, j, tag);
    for (int i = 0; i < size(); ++i)
      if (i != rank_) req->add(post(nullptr, 0, i, tag));
    req->wait();
  }

  void broadcast(void* data, size_t bytes, int root) override {
    check_rank(root, "broadcast");
    const int64_t tag = next_tag();
    if (rank_ == root) {
      for (int j = 0; j < size(); ++j)
        if (j != rank_) send(data, bytes, j, tag);
      return;
    }
    auto req = std::make_unique<Pending>(hub_, rank_, "broadcast");
    req->add(post(data, bytes, root, tag));
    req->wait();
  }

  void all_reduce_sum(double* data, size_t n) override { reduce(data, n, [](double a, double b) { return a + b; }); }
  void all_reduce_sum(int64_t* data, size_t n) override { reduce(data, n, [](int64_t a, int64_t b) { return a + b; }); }
  void all_reduce_sum(float* data, size_t n) override { reduce(data, n, [](float a, float b) { return a + b; }); }
  void all_reduce_max(double* data, size_t n) override {
    reduce(data, n, [](double a, double b) { return std::max(a, b); });
  }

  void all_gather(const void* send_buf, size_t bytes, void* recv) override {
    std::vector<size_t> counts(static_cast<size_t>(size()), bytes), displs(static_cast<size_t>(size()));
    for (size_t r = 0; r < displs.size(); ++r) displs[r] = r * bytes;
    iall_gatherv(send_buf, bytes, recv, counts, displs)->wait();
  }

  void reduce_scatter_sum(const float* send_buf, float* recv, std::span<const size_t> counts) override {
    const int R = size();
    check(counts.size() == static_cast<size_t>(R), "communicator: reduce_scatter_sum needs one count per rank (", R,
          "), got ", counts.size());
    std::vector<size_t> at(static_cast<size_t>(R) + 1, 0);
    for (int r = 0; r < R; ++r) at[static_cast<size_t>(r) + 1] = at[static_cast<size_t>(r)] + counts[static_cast<size_t>(r)];
    const size_t n = counts[static_cast<size_t>(rank_)];
    const int64_t tag = next_tag();
    for (int j = 0; j < R; ++j)
      if (j != rank_) send(send_buf + at[static_cast<size_t>(j)], counts[static_cast<size_t>(j)] * sizeof(float), j, tag);
    std::vector<float> parts(n * static_cast<size_t>(R));  // (R, n) every rank's block rank_
    std::copy(send_buf + at[static_cast<size_t>(rank_)], send_buf + at[static_cast<size_t>(rank_)] + n,
              parts.data() + n * static_cast<size_t>(rank_));
    auto req = std::make_unique<Pending>(hub_, rank_, "reduce_scatter_sum");
    for (int i = 0; i < R; ++i)
      if (i != rank_) req->add(post(parts.data() + n * static_cast<size_t>(i), n * sizeof(float), i, tag));
    req->wait();
    combine_in_rank_order(parts.data(), static_cast<size_t>(R), n, recv, std::plus<float>());
  }

  std::unique_ptr<CommRequest> iall_to_allv(const void* send_buf, std::span<const size_t> send_counts,
                                            std::span<const size_t> send_displs, void* recv,
                                            std::span<const size_t> recv_counts,
                                            std::span<const size_t> recv_displs) override {
    const size_t R = static_cast<size_t>(size()), me = static_cast<size_t>(rank_);
    check(send_counts.size() == R && send_displs.size() == R && recv_counts.size() == R && recv_displs.size() == R,
          "communicator: iall_to_allv needs one count and offset per rank (", R, ")");
    check(send_counts[me] == recv_counts[me], "communicator: iall_to_allv sends ", send_counts[me],
          " bytes to its own rank but receives ", recv_counts[me]);
    const int64_t tag = next_tag();
    const char* s = static_cast<const char*>(send_buf);
    char* d = static_cast<char*>(recv);
    for (size_t j = 0; j < R; ++j)
      if (j != me) send(s + send_displs[j], send_counts[j], static_cast<int>(j), tag);
    copy(d + recv_displs[me], s + send_displs[me], send_counts[me]);
    auto req = std::make_unique<Pending>(hub_, rank_, "iall_to_allv");
    for (size_t i = 0; i < R; ++i)
      if (i != me) req->add(post(d + recv_displs[i], recv_counts[i], static_cast<int>(i), tag));
    return req;
  }

  std::unique_ptr<CommRequest> iall_gatherv(const void* send_buf, size_t bytes, void* recv,
                                            std::span<const size_t> counts, std::span<const size_t> displs) override {
    const size_t R = static_cast<size_t>(size()), me = static_cast<size_t>(rank_);
    check(counts.size() == R && displs.size() == R && counts[me] == bytes,
          "communicator: iall_gatherv needs one count per rank (", R, "), its own equal to the bytes sent");
    const int64_t tag = next_tag();
    for (size_t j = 0; j < R; ++j)
      if (j != me) send(send_buf, bytes, static_cast<int>(j), tag);
    char* d = static_cast<char*>(recv);
    copy(d + displs[me], send_buf, bytes);
    auto req = std::make_unique<Pending>(hub_, rank_, "iall_gatherv");
    for (size_t i = 0; i < R; ++i)
      if (i != me) req->add(post(d + displs[i], counts[i], static_cast<int>(i), tag));
    return req;
  }

  std::unique_ptr<CommRequest> iall_reduce_sum(float* data, size_t n) override {
    const size_t R = static_cast<size_t>(size()), me = static_cast<size_t>(rank_);
    const int64_t tag = next_tag();
    for (size_t j = 0; j < R; ++j)
      if (j != me) send(data, n * sizeof(float), static_cast<int>(j), tag);
    auto parts = std::make_shared<std::vector<float>>(n * R);  // (R, n)
    std::copy(data, data + n, parts->data() + n * me);
    auto req = std::make_unique<Pending>(hub_, rank_, "iall_reduce_sum");
    for (size_t i = 0; i < R; ++i)
      if (i != me) req->add(post(parts->data() + n * i, n * sizeof(float), static_cast<int>(i), tag));
    req->finish = [parts, data, n, R] { combine_in_rank_order(parts->data(), R, n, data, std::plus<float>()); };
    return req;
  }

  std::unique_ptr<CommRequest> isend(const void* data, size_t bytes, int to, int tag) override {
    check_rank(to, "isend");
    check(tag >= 0, "communicator: isend needs a tag >= 0, got ", tag);
    send(data, bytes, to, tag);
    return std::make_unique<Done>();
  }
  std::unique_ptr<CommRequest> irecv(void* data, size_t bytes, int from, int tag) override {
    check_rank(from, "irecv");
    check(tag >= 0, "communicator: irecv needs a tag >= 0, got ", tag);
    auto req = std::make_unique<Pending>(hub_, rank_, "irecv");
    req->add(post(data, bytes, from, tag));
    return req;
  }

  [[noreturn]] void abort(const std::string& why, int code) override { comm::abort_process(why, code); }

 private:
  // Collectives take tags below every user tag, one per call: the ranks call them in one order.
  int64_t next_tag() { return -(++collectives_); }

  void check_rank(int r, const char* what) const {
    check(r >= 0 && r < size(), "communicator: ", what, " names rank ", r, " of ", size());
  }
  static void copy(void* dst, const void* src, size_t bytes) {
    if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
  }

  // A buffered send: the payload is copied now, into the matching posted receive or the queue.
  void send(const void* data, size_t bytes, int to, int64_t tag) {
    std::lock_guard<std::mutex> lock(hub_->mu);
    check(hub_->broken.empty(), "communicator: a send on rank ", rank_, ": ", hub_->broken);
    const Hub::Key key{rank_, to, tag};
    if (auto it = hub_->receives.find(key); it != hub_->receives.end() && !it->second.empty()) {
      Hub::Posted p = it->second.front();
      it->second.pop_front();
      if (it->second.empty()) hub_->receives.erase(it);
      check(p.bytes == bytes, "communicator: rank ", rank_, " sends ", bytes, " bytes to rank ", to,
            ", which receives ", p.bytes, " (tag ", tag, ")");
      copy(p.data, data, bytes);
      p.state->done = true;
      hub_->cv.notify_all();
      return;
    }
    const char* c = static_cast<const char*>(data);
    hub_->messages[key].emplace_back(c, c + (data ? bytes : 0));
  }

  // Posts a receive, completed now when its message is queued.
  std::shared_ptr<RecvState> post(void* data, size_t bytes, int from, int64_t tag) {
    auto state = std::make_shared<RecvState>();
    std::lock_guard<std::mutex> lock(hub_->mu);
    check(hub_->broken.empty(), "communicator: a receive on rank ", rank_, ": ", hub_->broken);
    const Hub::Key key{from, rank_, tag};
    if (auto it = hub_->messages.find(key); it != hub_->messages.end() && !it->second.empty()) {
      std::vector<char> m = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) hub_->messages.erase(it);
      check(m.size() == bytes, "communicator: rank ", rank_, " receives ", bytes, " bytes from rank ", from,
            ", which sent ", m.size(), " (tag ", tag, ")");
      copy(data, m.data(), bytes);
      state->done = true;
      return state;
    }
    hub_->receives[key].push_back({data, bytes, state});
    return state;
  }

  // Every rank's n values, combined in rank order on every rank (the same bits everywhere).
  template <class T, class Op>
  void reduce(T* data, size_t n, Op op) {
    const size_t R = static_cast<size_t>(size()), me = static_cast<size_t>(rank_);
    if (R == 1) return;
    std::vector<T> parts(n * R);  // (R, n)
    std::copy(data, data + n, parts.data() + n * me);
    const int64_t tag = next_tag();
    for (size_t j = 0; j < R; ++j)
      if (j != me) send(data, n * sizeof(T), static_cast<int>(j), tag);
    auto req = std::make_unique<Pending>(hub_, rank_, "all_reduce");
    for (size_t i = 0; i < R; ++i)
      if (i != me) req->add(post(parts.data() + n * i, n * sizeof(T), static_cast<int>(i), tag));
    req->wait();
    combine_in_rank_order(parts.data(), R, n, data, op);
  }

  std::shared_ptr<Hub> hub_;
  int rank_;
  int64_t collectives_ = 0;
  uint64_t splits_ = 0;
};

}  // namespace

void run_ranks_in_threads(int ranks, const std::function<void(Communicator&)>& fn) {
  check(ranks >= 1 && ranks <= 1024, "communicator: run_ranks_in_threads needs 1 to 1024 ranks, got ", ranks);
  auto hub = std::make_shared<Hub>(ranks);
  std::mutex err_mu;
  std::exception_ptr first;
  auto body = [&](int r) {
    Threaded comm(hub, r);
    try {
      fn(comm);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(hub->mu);
      hub->break_all(detail::concat("rank ", r, " failed: ", e.what()));
      std::lock_guard<std::mutex> elock(err_mu);
      if (!first) first = std::current_exception();
    } catch (...) {
      std::lock_guard<std::mutex> lock(hub->mu);
      hub->break_all(detail::concat("rank ", r, " failed"));
      std::lock_guard<std::mutex> elock(err_mu);
      if (!first) first = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(ranks - 1));
  for (int r = 1; r < ranks; ++r) threads.emplace_back(body, r);
  body(0);  // rank 0 on the calling thread: its OpenMP team and thread-locals are the caller's
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace clattn
