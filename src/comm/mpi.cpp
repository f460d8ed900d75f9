// The Open MPI communicator over MPI_COMM_WORLD (include/clattn/comm.h), built with CLATTN_MPI.
// Launched by `mpirun -np R clattn ...` (or `srun` under SLURM), every rank runs the same command;
// MPI is initialised here on first use and finalised at exit. Failures inside MPI end the job
// (MPI_ERRORS_ARE_FATAL): the launcher names the rank and stops the others, so no rank waits for
// ever on a peer that died.
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "clattn/comm.h"
#include "clattn/error.h"
#include "comm/comm_internal.h"

namespace clattn {
namespace {

int as_int(size_t n, const char* what) {
  check(n <= static_cast<size_t>(INT_MAX), "communicator: ", what, " of ", n, " exceeds MPI's int count (", INT_MAX, ")");
  return static_cast<int>(n);
}

std::vector<int> as_ints(std::span<const size_t> v, const char* what) {
  std::vector<int> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = as_int(v[i], what);
  return out;
}

// The progress watchdog (set_comm_timeout in clattn/comm.h): the main thread marks when it starts
// to wait in MPI; a thread of its own checks twice a second and, past the timeout, names the stalled
// operation and ends this process, which makes mpirun end the job (a stopped peer included). Only
// waiting counts: a request that is merely pending while the rank computes is not a stall.
class Watchdog {
 public:
  struct Waiting {
    explicit Waiting(const char* op) {
      Watchdog& w = get();
      w.op_.store(op);
      w.since_.store(now_ns());
    }
    ~Waiting() { get().since_.store(0); }
    Waiting(const Waiting&) = delete;
    Waiting& operator=(const Waiting&) = delete;
  };
  static Watchdog& get() {
    static Watchdog w;
    return w;
  }
  void start(int rank, int size) {
    if (thread_.joinable()) return;
    (void)comm_timeout();  // read (and any warning about CLATTN_COMM_TIMEOUT printed) on this thread
    rank_ = rank;
    size_ = size;
    thread_ = std::thread([this] { loop(); });
  }
  void stop() {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  ~Watchdog() { stop(); }

 private:
  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void loop() {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (cv_.wait_for(lock, std::chrono::milliseconds(500), [this] { return stop_; })) return;
      }
      const int64_t since = since_.load();
      const double limit = comm_timeout();
      if (since == 0 || limit <= 0) continue;
      const double waited = static_cast<double>(now_ns() - since) * 1e-9;
      if (waited <= limit) continue;
      std::fprintf(stderr,
                   "clattn: rank %d of %d: error: no progress for %.0f s waiting in %s: a peer rank stopped, hung "
                   "or runs other work; ending the job (--comm-timeout or CLATTN_COMM_TIMEOUT sets the limit, 0 "
                   "waits for ever)\n",
                   rank_, size_, waited, op_.load());
      std::fflush(stderr);
      std::_Exit(3);
    }
  }
  std::atomic<int64_t> since_{0};
  std::atomic<const char*> op_{""};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // under mu_
  std::thread thread_;
  int rank_ = 0, size_ = 1;
};
using Waiting = Watchdog::Waiting;

// A request with the count arrays a non-blocking collective reads until it completes.
class MpiRequest final : public CommRequest {
 public:
  MPI_Request req = MPI_REQUEST_NULL;
  std::vector<int> a, b, c, d;
  ~MpiRequest() override {
    if (req == MPI_REQUEST_NULL) return;
    const Waiting w("the wait of a non-blocking exchange");
    MPI_Wait(&req, MPI_STATUS_IGNORE);  // never free a live operation's arrays
  }
  bool test() override {
    if (req == MPI_REQUEST_NULL) return true;
    int flag = 0;
    MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
    return flag != 0;
  }
  void wait() override {
    if (req == MPI_REQUEST_NULL) return;
    const Waiting w("the wait of a non-blocking exchange");
    MPI_Wait(&req, MPI_STATUS_IGNORE);
  }
};

// Sums of huge buffers go in pieces of at most INT_MAX elements.
template <class T>
void chunked(MPI_Comm comm, T* data, size_t n, MPI_Datatype type, MPI_Op op) {
  for (size_t off = 0; off < n;) {
    const size_t k = std::min(n - off, static_cast<size_t>(INT_MAX));
    const Waiting w("an all-reduce");
    MPI_Allreduce(MPI_IN_PLACE, data + off, static_cast<int>(k), type, op, comm);
    off += k;
  }
}

class Mpi final : public Communicator {
 public:
  Mpi() {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      owns_ = true;
    }
    set_comm(MPI_COMM_WORLD, "");
    if (size_ > 1) Watchdog::get().start(rank_, size_);
  }
  // A sub-communicator of split(): owns comm (freed before MPI is finalised), not MPI itself.
  Mpi(MPI_Comm comm, const std::string& what) : sub_(true) { set_comm(comm, what); }
  ~Mpi() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (sub_) MPI_Comm_free(&comm_);
    if (owns_) {
      Watchdog::get().stop();
      MPI_Finalize();
    }
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  std::unique_ptr<Communicator> split(int color, int key) override {
    check(color >= 0, "communicator: split needs a color >= 0, got ", color);
    MPI_Comm sub = MPI_COMM_NULL;
    const Waiting w("a communicator split");
    MPI_Comm_split(comm_, color, key, &sub);
    return std::make_unique<Mpi>(sub, "group " + std::to_string(color) + " of ");
  }
  void barrier() override {
    const Waiting w("a barrier");
    MPI_Barrier(comm_);
  }
  void broadcast(void* data, size_t bytes, int root) override {
    check_rank(root, "broadcast");
    const Waiting w("a broadcast");
    MPI_Bcast(data, as_int(bytes, "broadcast"), MPI_BYTE, root, comm_);
  }
  void all_reduce_sum(double* data, size_t n) override { chunked(comm_, data, n, MPI_DOUBLE, MPI_SUM); }
  void all_reduce_sum(int64_t* data, size_t n) override { chunked(comm_, data, n, MPI_INT64_T, MPI_SUM); }
  void all_reduce_sum(float* data, size_t n) override { chunked(comm_, data, n, MPI_FLOAT, MPI_SUM); }
  void all_reduce_max(double* data, size_t n) override { chunked(comm_, data, n, MPI_DOUBLE, MPI_MAX); }
  void all_gather(const void* send, size_t bytes, void* recv) override {
    const int n = as_int(bytes, "all_gather");
    const Waiting w("an all-gather");
    MPI_Allgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_);
  }
  void reduce_scatter_sum(const float* send, float* recv, std::span<const size_t> counts) override {
    check(static_cast<int>(counts.size()) == size_, "communicator: reduce_scatter_sum needs one count per rank (", size_,
          "), got ", counts.size());
    const std::vector<int> c = as_ints(counts, "reduce_scatter_sum");
    const Waiting w("a reduce-scatter");
    MPI_Reduce_scatter(send, recv, c.data(), MPI_FLOAT, MPI_SUM, comm_);
  }
  std::unique_ptr<CommRequest> iall_to_allv(const void* send, std::span<const size_t> send_counts,
                                            std::span<const size_t> send_displs, void* recv,
                                            std::span<const size_t> recv_counts,
                                            std::span<const size_t> recv_displs) override {
    check(static_cast<int>(send_counts.size()) == size_ && static_cast<int>(send_displs.size()) == size_ &&
              static_cast<int>(recv_counts.size()) == size_ && static_cast<int>(recv_displs.size()) == size_,
          "communicator: iall_to_allv needs one count and offset per rank (", size_, ")");
    auto r = std::make_unique<MpiRequest>();
    r->a = as_ints(send_counts, "iall_to_allv");
    r->b = as_ints(send_displs, "iall_to_allv");
    r->c = as_ints(recv_counts, "iall_to_allv");
    r->d = as_ints(recv_displs, "iall_to_allv");
    MPI_Ialltoallv(send, r->a.data(), r->b.data(), MPI_BYTE, recv, r->c.data(), r->d.data(), MPI_BYTE, comm_,
                   &r->req);
    return r;
  }
  std::unique_ptr<CommRequest> iall_gatherv(const void* send, size_t bytes, void* recv, std::span<const size_t> counts,
                                            std::span<const size_t> displs) override {
    check(static_cast<int>(counts.size()) == size_ && static_cast<int>(displs.size()) == size_,
          "communicator: iall_gatherv needs one count and offset per rank (", size_, ")");
    auto r = std::make_unique<MpiRequest>();
    r->a = as_ints(counts, "iall_gatherv");
    r->b = as_ints(displs, "iall_gatherv");
    MPI_Iallgatherv(send, as_int(bytes, "iall_gatherv"), MPI_BYTE, recv, r->a.data(), r->b.data(), MPI_BYTE,
                    comm_, &r->req);
    return r;
  }
  std::unique_ptr<CommRequest> iall_reduce_sum(float* data, size_t n) override {
    auto r = std::make_unique<MpiRequest>();
    MPI_Iallreduce(MPI_IN_PLACE, data, as_int(n, "iall_reduce_sum"), MPI_FLOAT, MPI_SUM, comm_, &r->req);
    return r;
  }
  std::unique_ptr<CommRequest> isend(const void* data, size_t bytes, int to, int tag) override {
    check_rank(to, "isend");
    auto r = std::make_unique<MpiRequest>();
    MPI_Isend(data, as_int(bytes, "isend"), MPI_BYTE, to, tag, comm_, &r->req);
    return r;
  }
  std::unique_ptr<CommRequest> irecv(void* data, size_t bytes, int from, int tag) override {
    check_rank(from, "irecv");
    auto r = std::make_unique<MpiRequest>();
    MPI_Irecv(data, as_int(bytes, "irecv"), MPI_BYTE, from, tag, comm_, &r->req);
    return r;
  }
  [[noreturn]] void abort(const std::string& why, int code) override {
    std::fprintf(stderr, "clattn: rank %d of %d: %s\n", rank_, size_, why.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  void check_rank(int r, const char* what) const {
    check(r >= 0 && r < size_, "communicator: ", what, " names rank ", r, " of ", size_);
  }
  void set_comm(MPI_Comm comm, const std::string& what) {
    comm_ = comm;
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, static_cast<size_t>(len));
    if (const size_t cut = v.find(','); cut != std::string::npos) v.resize(cut);
    int world = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    name_ = v + ", " + (what.empty() ? "" : std::to_string(size_) + " ranks in " + what) + std::to_string(world) +
            (world == 1 ? " rank" : " ranks");
  }
  MPI_Comm comm_ = MPI_COMM_WORLD;
  int rank_ = 0, size_ = 1;
  bool owns_ = false, sub_ = false;
  std::string name_;
};

}  // namespace

namespace comm {
std::unique_ptr<Communicator> mpi_world() { return std::make_unique<Mpi>(); }
}  // namespace comm

}  // namespace clattn
