// OpenMP helpers. Work is split over (batch x head x tile) items; BLAS calls made inside our
// parallel regions run single-threaded (the OpenMP build of OpenBLAS does that by itself).
#pragma once

#include <cstdint>
#include <type_traits>

namespace clattn {

int max_threads();             // omp_get_max_threads()
void set_threads(int n);       // omp_set_num_threads(n), n >= 1
int thread_id();               // omp_get_thread_num() inside a region, 0 outside
int team_size();               // omp_get_num_threads(): 1 outside a region

// Runs fn(thread, team size) once on every thread of the OpenMP team: for kernels that assign
// work statically because a thread prepares its next item while finishing the current one.
template <class F>
void parallel_team(F&& fn) {
#pragma omp parallel
  fn(thread_id(), team_size());
}

// Runs fn(i, thread) -- or fn(i) -- for i in [0, n) over the OpenMP team with dynamic
// scheduling. `thread` in [0, max_threads()) is the caller's index into its per-thread scratch:
// kernels take it from here rather than asking OpenMP, so which scratch a task uses is explicit.
template <class F>
void parallel_for(int64_t n, F&& fn) {
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_invocable_v<F&, int64_t, int>) fn(i, thread_id());
    else fn(i);
  }
}

}  // namespace clattn
