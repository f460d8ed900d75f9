// Threads: the OpenMP helpers every kernel splits its work with inside one process (ranks of a
// communicator are comm.h, the sequence split seq_parallel.h). Work is split over (batch x head
// x tile) items; BLAS calls made inside our parallel regions run single-threaded (the OpenMP
// build of OpenBLAS does that by itself).
#pragma once

#include <cstdint>
#include <exception>
#include <type_traits>

namespace clattn {

int max_threads();             // omp_get_max_threads()
void set_threads(int n);       // omp_set_num_threads(n), n >= 1
int thread_id();               // omp_get_thread_num() inside a region, 0 outside
int team_size();               // omp_get_num_threads(): 1 outside a region

// Threads for a call of `flops` floating-point operations (a model's decode step, a short
// prefill, a small batch): 1 below serial_flops(), where a parallel region's fork and barriers
// cost more than the work they split — and on a busy machine every barrier waits for the team's
// slowest, descheduled thread — else one thread per serial_flops() of work, at most
// max_threads(). serial_flops() is 4 MFLOP unless CLATTN_SERIAL_FLOPS sets it (0: always the
// whole team; for measurements).
int threads_for_flops(double flops);
double serial_flops();

// Caps OpenMP's team, and with it OpenBLAS's threads (its OpenMP build follows
// omp_get_max_threads), at n for the calling thread until the end of the scope; never raises it.
class ThreadLimit {
 public:
  explicit ThreadLimit(int n);
  ~ThreadLimit();
  ThreadLimit(const ThreadLimit&) = delete;
  ThreadLimit& operator=(const ThreadLimit&) = delete;

 private:
  int saved_;
};

// An exception must never leave an OpenMP region (that is std::terminate): the helpers below catch
// the first one thrown by any task, let the region finish, and rethrow it on the calling thread.
class FirstError {
 public:
  template <class F>
  void run(F&& f) noexcept {
    try {
      f();
    } catch (...) {
#pragma omp critical(clattn_first_error)
      if (!error_) error_ = std::current_exception();
    }
  }
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::exception_ptr error_;
};

// Runs fn(thread, team size) once on every thread of the OpenMP team: for kernels that assign
// work statically because a thread prepares its next item while finishing the current one.
template <class F>
void parallel_team(F&& fn) {
  FirstError err;
#pragma omp parallel
  err.run([&] { fn(thread_id(), team_size()); });
  err.rethrow();
}

// Runs fn(i, thread) -- or fn(i) -- for i in [0, n) over the OpenMP team with dynamic
// scheduling. `thread` in [0, max_threads()) is the caller's index into its per-thread scratch:
// kernels take it from here rather than asking OpenMP, so which scratch a task uses is explicit.
template <class F>
void parallel_for(int64_t n, F&& fn) {
  FirstError err;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) {
    err.run([&] {
      if constexpr (std::is_invocable_v<F&, int64_t, int>) fn(i, thread_id());
      else fn(i);
    });
  }
  err.rethrow();
}

// The rule for kernels whose tasks are (batch, head) pairs: with fewer tasks than threads, the
// tasks run one after another and each splits its phases over the team instead.
inline bool split_tasks(int64_t tasks) { return max_threads() > 1 && tasks < max_threads(); }

// Runs fn(i, thread) for i in [0, n): over the team when `split`, else in order on the calling
// task's `thread`. A kernel written once this way computes the same values either way as long
// as its items are independent and fixed in size.
template <class F>
void split_for(bool split, int64_t n, int thread, F&& fn) {
  if (split) {
    parallel_for(n, [&](int64_t i, int t) { fn(i, t); });
  } else {
    for (int64_t i = 0; i < n; ++i) fn(i, thread);
  }
}

}  // namespace clattn
