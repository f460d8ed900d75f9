// The communicator of one rank (include/clattn/comm.h): every collective is a copy or nothing,
// and messages to itself are matched by tag in this process.
#include <cstring>
#include <deque>
#include <memory>

#include "clattn/comm.h"
#include "clattn/error.h"
#include "comm/comm_internal.h"

namespace clattn {
namespace {

class Done final : public CommRequest {
 public:
  bool test() override { return true; }
  void wait() override {}
};

// A message to itself: the send and the receive of one tag meet in whichever order they come.
struct Mailbox {
  struct Pending {
    const void* send = nullptr;
    void* recv = nullptr;
    size_t bytes = 0;
    int tag = 0;
    std::shared_ptr<bool> done;
  };
  std::deque<Pending> sends, recvs;
};

class SelfRequest final : public CommRequest {
 public:
  explicit SelfRequest(std::shared_ptr<bool> done) : done_(std::move(done)) {}
  bool test() override { return *done_; }
  void wait() override {
    check(*done_, "communicator: a message of the single process to itself has no matching send or receive "
                  "(it would wait for ever)");
  }

 private:
  std::shared_ptr<bool> done_;
};

class Single final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "single process"; }
  std::unique_ptr<Communicator> split(int color, int) override {
    check(color >= 0, "communicator: split needs a color >= 0, got ", color);
    return std::make_unique<Single>();
  }
  void barrier() override {}
  void broadcast(void*, size_t, int root) override { check_rank(root, "broadcast"); }
  void all_reduce_sum(double*, size_t) override {}
  void all_reduce_sum(int64_t*, size_t) override {}
  void all_reduce_sum(float*, size_t) override {}
  void all_reduce_max(double*, size_t) override {}
  void all_gather(const void* send, size_t bytes, void* recv) override { copy(recv, send, bytes); }
  void reduce_scatter_sum(const float* send, float* recv, std::span<const size_t> counts) override {
    check(counts.size() == 1, "communicator: reduce_scatter_sum needs one count per rank (1), got ", counts.size());
    copy(recv, send, counts[0] * sizeof(float));
  }
  std::unique_ptr<CommRequest> iall_to_allv(const void* send, std::span<const size_t> send_counts,
                                            std::span<const size_t> send_displs, void* recv,
                                            std::span<const size_t> recv_counts,
                                            std::span<const size_t> recv_displs) override {
    check(send_counts.size() == 1 && send_displs.size() == 1 && recv_counts.size() == 1 && recv_displs.size() == 1,
          "communicator: iall_to_allv needs one count and offset per rank (1)");
    check(send_counts[0] == recv_counts[0], "communicator: iall_to_allv sends ", send_counts[0], " bytes to itself but receives ",
          recv_counts[0]);
    copy(static_cast<char*>(recv) + recv_displs[0], static_cast<const char*>(send) + send_displs[0], send_counts[0]);
    return std::make_unique<Done>();
  }
  std::unique_ptr<CommRequest> iall_gatherv(const void* send, size_t bytes, void* recv, std::span<const size_t> counts,
                                            std::span<const size_t> displs) override {
    check(counts.size() == 1 && displs.size() == 1 && counts[0] == bytes,
          "communicator: iall_gatherv needs one count per rank (1) equal to the bytes sent");
    copy(static_cast<char*>(recv) + displs[0], send, bytes);
    return std::make_unique<Done>();
  }
  std::unique_ptr<CommRequest> iall_reduce_sum(float*, size_t) override { return std::make_unique<Done>(); }
  std::unique_ptr<CommRequest> isend(const void* data, size_t bytes, int to, int tag) override {
    check_rank(to, "isend");
    auto done = std::make_shared<bool>(false);
    for (auto it = box_.recvs.begin(); it != box_.recvs.end(); ++it)
      if (it->tag == tag) {
        check(it->bytes == bytes, "communicator: a message of ", bytes, " bytes meets a receive of ", it->bytes);
        copy(it->recv, data, bytes);
        *it->done = true;
        box_.recvs.erase(it);
        *done = true;
        return std::make_unique<SelfRequest>(done);
      }
    box_.sends.push_back({data, nullptr, bytes, tag, done});
    return std::make_unique<SelfRequest>(done);
  }
  std::unique_ptr<CommRequest> irecv(void* data, size_t bytes, int from, int tag) override {
    check_rank(from, "irecv");
    auto done = std::make_shared<bool>(false);
    for (auto it = box_.sends.begin(); it != box_.sends.end(); ++it)
      if (it->tag == tag) {
        check(it->bytes == bytes, "communicator: a receive of ", bytes, " bytes meets a message of ", it->bytes);
        copy(data, it->send, bytes);
        *it->done = true;
        box_.sends.erase(it);
        *done = true;
        return std::make_unique<SelfRequest>(done);
      }
    box_.recvs.push_back({nullptr, data, bytes, tag, done});
    return std::make_unique<SelfRequest>(done);
  }
  [[noreturn]] void abort(const std::string& why, int code) override { comm::abort_process(why, code); }

 private:
  static void check_rank(int r, const char* what) {
    check(r == 0, "communicator: ", what, " names rank ", r, " but the single process is rank 0 of 1");
  }
  static void copy(void* dst, const void* src, size_t bytes) {
    if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
  }
  Mailbox box_;
};

}  // namespace

std::unique_ptr<Communicator> single_process_communicator() { return std::make_unique<Single>(); }

}  // namespace clattn
