// The counting communicator (counting_communicator in include/clattn/comm.h): every call passes
// through to the inner communicator; what goes to other ranks and the time spent waiting are added
// to the caller's CommTraffic. Sequence-parallel attention counts its traffic through one.
#include <chrono>
#include <cstdlib>
#include <memory>

#include "clattn/comm.h"

namespace clattn {
namespace {

// Adds the time from construction to destruction to the blocked time.
class Blocked {
 public:
  explicit Blocked(CommTraffic& t) : t_(t), t0_(std::chrono::steady_clock::now()) {}
  ~Blocked() { t_.wait_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count(); }
  Blocked(const Blocked&) = delete;
  Blocked& operator=(const Blocked&) = delete;

 private:
  CommTraffic& t_;
  std::chrono::steady_clock::time_point t0_;
};

// A transfer whose wait() counts as blocked only when it had not completed (test() never blocks).
class TimedRequest final : public CommRequest {
 public:
  TimedRequest(std::unique_ptr<CommRequest> r, CommTraffic& t) : r_(std::move(r)), t_(t) {}
  bool test() override { return r_->test(); }
  void wait() override {
    if (r_->test()) return;
    Blocked b(t_);
    r_->wait();
  }

 private:
  std::unique_ptr<CommRequest> r_;
  CommTraffic& t_;
};

class Counting final : public Communicator {
 public:
  Counting(Communicator& inner, CommTraffic& t, std::unique_ptr<Communicator> owned = nullptr)
      : owned_(std::move(owned)), c_(inner), t_(t) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  std::string name() const override { return c_.name(); }
  std::unique_ptr<Communicator> split(int color, int key) override {
    std::unique_ptr<Communicator> sub = c_.split(color, key);
    Communicator& ref = *sub;
    return std::make_unique<Counting>(ref, t_, std::move(sub));
  }

  // The blocking collectives count whole as blocked time: nothing else runs meanwhile.
  void barrier() override {
    Blocked b(t_);
    c_.barrier();
  }
  void broadcast(void* data, size_t bytes, int root) override {
    if (c_.rank() == root && others()) count(bytes * others());
    Blocked b(t_);
    c_.broadcast(data, bytes, root);
  }
  void all_reduce_sum(double* data, size_t n) override { reduce(data, n, &Communicator::all_reduce_sum); }
  void all_reduce_sum(int64_t* data, size_t n) override { reduce(data, n, &Communicator::all_reduce_sum); }
  void all_reduce_sum(float* data, size_t n) override { reduce(data, n, &Communicator::all_reduce_sum); }
  void all_reduce_max(double* data, size_t n) override { reduce(data, n, &Communicator::all_reduce_max); }
  void all_gather(const void* send, size_t bytes, void* recv) override {
    if (others()) count(bytes * others());
    Blocked b(t_);
    c_.all_gather(send, bytes, recv);
  }
  void reduce_scatter_sum(const float* send, float* recv, std::span<const size_t> counts) override {
    uint64_t out = 0;
    for (size_t j = 0; j < counts.size(); ++j)
      if (static_cast<int>(j) != c_.rank()) out += counts[j] * sizeof(float);
    if (others()) count(out);
    Blocked b(t_);
    c_.reduce_scatter_sum(send, recv, counts);
  }

  std::unique_ptr<CommRequest> iall_to_allv(const void* send, std::span<const size_t> send_counts,
                                            std::span<const size_t> send_displs, void* recv,
                                            std::span<const size_t> recv_counts,
                                            std::span<const size_t> recv_displs) override {
    uint64_t out = 0;
    for (size_t j = 0; j < send_counts.size(); ++j)
      if (static_cast<int>(j) != c_.rank()) out += send_counts[j];
    if (out > 0) count(out);
    return timed(c_.iall_to_allv(send, send_counts, send_displs, recv, recv_counts, recv_displs));
  }
  std::unique_ptr<CommRequest> iall_gatherv(const void* send, size_t bytes, void* recv, std::span<const size_t> counts,
                                            std::span<const size_t> displs) override {
    if (others()) count(bytes * others());
    return timed(c_.iall_gatherv(send, bytes, recv, counts, displs));
  }
  std::unique_ptr<CommRequest> iall_reduce_sum(float* data, size_t n) override {
    count_all_reduce(n * sizeof(float));
    return timed(c_.iall_reduce_sum(data, n));
  }
  std::unique_ptr<CommRequest> isend(const void* data, size_t bytes, int to, int tag) override {
    if (to != c_.rank()) count(bytes);
    return timed(c_.isend(data, bytes, to, tag));
  }
  std::unique_ptr<CommRequest> irecv(void* data, size_t bytes, int from, int tag) override {
    return timed(c_.irecv(data, bytes, from, tag));
  }
  [[noreturn]] void abort(const std::string& why, int code) override {
    c_.abort(why, code);
    std::abort();  // not reached; the compiler does not see a virtual call's [[noreturn]]
  }

 private:
  uint64_t others() const { return static_cast<uint64_t>(c_.size() - 1); }
  // A message to another rank, or a collective of more than one rank.
  void count(uint64_t bytes) {
    t_.bytes += bytes;
    ++t_.messages;
  }
  // The ring all-reduce's share: 2n(R−1)/R from each rank.
  void count_all_reduce(size_t bytes) {
    if (c_.size() > 1) count(2 * bytes * others() / static_cast<uint64_t>(c_.size()));
  }
  template <class T>
  void reduce(T* data, size_t n, void (Communicator::*op)(T*, size_t)) {
    count_all_reduce(n * sizeof(T));
    Blocked b(t_);
    (c_.*op)(data, n);
  }
  std::unique_ptr<CommRequest> timed(std::unique_ptr<CommRequest> r) { return std::make_unique<TimedRequest>(std::move(r), t_); }

  std::unique_ptr<Communicator> owned_;  // a split()'s inner communicator
  Communicator& c_;
  CommTraffic& t_;
};

}  // namespace

std::unique_ptr<Communicator> counting_communicator(Communicator& inner, CommTraffic& into) {
  return std::make_unique<Counting>(inner, into);
}

}  // namespace clattn
