#include "clattn/threads.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "clattn/error.h"

namespace clattn {

int max_threads() { return omp_get_max_threads(); }
void set_threads(int n) {
  check(n >= 1, "threads must be >= 1, got ", n);
  omp_set_num_threads(n);
}
int thread_id() { return omp_get_thread_num(); }

double serial_flops() {
  static const double v = [] {
    if (const char* s = std::getenv("CLATTN_SERIAL_FLOPS"); s && *s) {
      char* end = nullptr;
      const double x = std::strtod(s, &end);
      if (end != s && *end == 0 && x >= 0) return x;
    }
    return 4e6;
  }();
  return v;
}

int threads_for_flops(double flops) {
  const int most = omp_get_max_threads();
  const double unit = serial_flops();
  if (unit <= 0) return most;
  if (flops < unit) return 1;
  return static_cast<int>(std::min<double>(most, std::floor(flops / unit)));
}

ThreadLimit::ThreadLimit(int n) : saved_(omp_get_max_threads()) {
  if (n < saved_) omp_set_num_threads(std::max(n, 1));
}

ThreadLimit::~ThreadLimit() {
  if (omp_get_max_threads() != saved_) omp_set_num_threads(saved_);
}
int team_size() { return omp_get_num_threads(); }

}  // namespace clattn
