#include "clattn/parallel.h"

#include <omp.h>

#include "clattn/error.h"

namespace clattn {

int max_threads() { return omp_get_max_threads(); }
void set_threads(int n) {
  check(n >= 1, "threads must be >= 1, got ", n);
  omp_set_num_threads(n);
}
int thread_id() { return omp_get_thread_num(); }
int team_size() { return omp_get_num_threads(); }

}  // namespace clattn
