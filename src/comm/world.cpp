// world(): the job's communicator (include/clattn/comm.h).
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "clattn/comm.h"
#include "clattn/error.h"
#include "comm/comm_internal.h"

namespace clattn {

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "MPI_LOCALNRANKS"})
    if (const char* s = std::getenv(v); s && *s) return true;
  return false;
}

namespace {
// Seconds; < 0: not set yet (the environment's, else the default, on first read).
std::atomic<double> g_comm_timeout{-1};
}  // namespace

void set_comm_timeout(double seconds) {
  check(seconds >= 0 && std::isfinite(seconds), "communicator: the timeout must be >= 0 seconds (0: none), got ", seconds);
  g_comm_timeout = seconds;
}

double comm_timeout() {
  double t = g_comm_timeout.load();
  if (t >= 0) return t;
  t = 300;
  if (const char* s = std::getenv("CLATTN_COMM_TIMEOUT"); s && *s) {
    char* end = nullptr;
    const double v = std::strtod(s, &end);
    // A warning, not an error: this runs while MPI starts, where an exception would not reach the
    // command's error handling on every rank.
    if (end && *end == 0 && v >= 0 && std::isfinite(v)) t = v;
    else std::fprintf(stderr, "clattn: warning: CLATTN_COMM_TIMEOUT='%s' is not a number of seconds >= 0; using %g\n", s, t);
  }
  g_comm_timeout = t;
  return t;
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
