// world(): the job's communicator (include/clattn/comm.h).
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "clattn/comm.h"
#include "comm/comm_internal.h"

namespace clattn {

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "MPI_LOCALNRANKS"})
    if (const char* s = std::getenv(v); s && *s) return true;
  return false;
}

Communicator& world() {
  static std::unique_ptr<Communicator> w;
  static std::once_flag once;
  std::call_once(once, [] {
#ifdef CLATTN_HAVE_MPI
    if (launched_by_mpi()) {
      w = comm::mpi_world();
      return;
    }
#endif
    w = single_process_communicator();
  });
  return *w;
}

bool built_with_mpi() {
#ifdef CLATTN_HAVE_MPI
  return true;
#else
  return false;
#endif
}

namespace comm {

void abort_process(const std::string& why, int code) {
  std::fprintf(stderr, "clattn: %s\n", why.c_str());
  std::fflush(stderr);
  std::_Exit(code);
}

}  // namespace comm
}  // namespace clattn
