// The jobs every equality suite of tests/parallel runs in: world() (one process, or each rank
// under `mpirun -np R`), and in one process also 2, 3 and 4 ranks as threads
// (run_ranks_in_threads), so the split kernels run at R ranks without mpirun and under the
// sanitizers. Under mpirun the threaded jobs are left out (the launcher's ranks are the test).
#pragma once

#include <functional>

#include "clattn/comm.h"

namespace clattn::testing {

inline void on_each_job(const std::function<void(Communicator&)>& fn) {
  fn(world());
  if (world().size() > 1) return;
  for (int ranks : {2, 3, 4}) run_ranks_in_threads(ranks, fn);
}

}  // namespace clattn::testing
