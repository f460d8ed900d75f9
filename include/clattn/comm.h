// Communicators: how the ranks of a job exchange data, for data-parallel training and
// sequence-parallel attention (docs/distributed.md). A small interface with three implementations:
// the single process (every collective of one rank is a copy or nothing), ranks as threads of one
// process (run_ranks_in_threads: tests and sanitizers), and Open MPI's MPI_COMM_WORLD when clattn
// is built with CLATTN_MPI and started by `mpirun` or `srun`.
// Across machines, distribution always goes through an existing engine (MPI); clattn has no
// network transport of its own.
//
// Collectives are called by every rank in the same order with matching sizes (MPI's rule). Sizes
// are in elements of the stated type unless they say bytes. Errors: MPI's own failures end the
// job (MPI_ERRORS_ARE_FATAL: the launcher reports the rank and stops every other one); argument
// errors throw clattn::Error naming the call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace clattn {

// A non-blocking operation. Its buffers must stay untouched until it completes.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual bool test() = 0;  // progresses the operation; true once complete
  virtual void wait() = 0;  // blocks until complete
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // What runs underneath, e.g. "single process" or "Open MPI v4.1.4, 2 ranks".
  virtual std::string name() const = 0;
  // The ranks of this communicator with the same color (>= 0), ordered by key then rank, as a
  // communicator of their own (MPI_Comm_split; every rank calls it). Sequence-parallel training
  // splits sequences within such groups and runs data parallel across them.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  virtual void barrier() = 0;
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // Element-wise sums (and max) over the ranks, in place. The double and int64 sums of values
  // that are zero on every rank but one are exact, whatever order MPI adds in.
  virtual void all_reduce_sum(double* data, size_t n) = 0;
  virtual void all_reduce_sum(int64_t* data, size_t n) = 0;
  virtual void all_reduce_sum(float* data, size_t n) = 0;
  virtual void all_reduce_max(double* data, size_t n) = 0;
  // recv holds size() blocks of `bytes`, rank r's at r·bytes.
  virtual void all_gather(const void* send, size_t bytes, void* recv) = 0;
  // recv (counts[rank()] floats) = the sum over ranks of the block rank() of send, where send
  // holds size() consecutive blocks of counts[r] floats.
  virtual void reduce_scatter_sum(const float* send, float* recv, std::span<const size_t> counts) = 0;

  // Non-blocking collectives, in bytes: rank r sends send_counts[j] bytes at send_displs[j] to
  // rank j and receives recv_counts[i] bytes at recv_displs[i] from rank i (all-to-all); or
  // contributes `bytes` and receives each rank's counts[i] bytes at displs[i] (all-gather).
  virtual std::unique_ptr<CommRequest> iall_to_allv(const void* send, std::span<const size_t> send_counts,
                                                    std::span<const size_t> send_displs, void* recv,
                                                    std::span<const size_t> recv_counts,
                                                    std::span<const size_t> recv_displs) = 0;
  virtual std::unique_ptr<CommRequest> iall_gatherv(const void* send, size_t bytes, void* recv,
                                                    std::span<const size_t> counts,
                                                    std::span<const size_t> displs) = 0;
  virtual std::unique_ptr<CommRequest> iall_reduce_sum(float* data, size_t n) = 0;

  // Point to point, matched by (peer, tag).
  virtual std::unique_ptr<CommRequest> isend(const void* data, size_t bytes, int to, int tag) = 0;
  virtual std::unique_ptr<CommRequest> irecv(void* data, size_t bytes, int from, int tag) = 0;

  // Ends every rank of the job (MPI_Abort) after printing `why` on this rank's stderr: a rank that
  // cannot go on must not leave the others waiting in a collective.
  [[noreturn]] virtual void abort(const std::string& why, int code) = 0;
};

// A communicator of one rank.
std::unique_ptr<Communicator> single_process_communicator();

// What one rank sent through a counting communicator, and how long it was blocked.
struct CommTraffic {
  uint64_t bytes = 0;     // payload sent to other ranks; an all-reduce of n bytes counts 2n(R−1)/R
  uint64_t messages = 0;  // messages and collectives that sent any
  // Milliseconds blocked on communication: inside the blocking collectives, and in the wait of a
  // transfer that had not completed when its data was needed. What overlapped compute is not.
  double wait_ms = 0;
};
// A communicator that passes every call to `inner` and adds what this rank sends, and the time it
// waits, to `into` (split() returns one that counts into the same). Both must outlive it.
std::unique_ptr<Communicator> counting_communicator(Communicator& inner, CommTraffic& into);

// Runs fn on `ranks` threads of this process (rank 0 on the calling thread), each with its own
// rank of one communicator whose messages are copies in memory: the split kernels and the
// data-parallel paths run at R ranks without mpirun, under the sanitizers, in one test. Sends are
// buffered (they complete at once); every rank reduces in rank order, so all hold the same bits.
// Returns when every thread has ended; the first exception a rank threw is rethrown here, and a
// rank waiting on a rank that threw gets an Error instead of waiting for ever. Blocking waits obey
// comm_timeout(). split() works across the threads; abort() ends the process.
void run_ranks_in_threads(int ranks, const std::function<void(Communicator&)>& fn);

// The job's communicator: MPI_COMM_WORLD when clattn is built with MPI and this process was
// started by an MPI launcher (mpirun, mpiexec, srun), else a single process. MPI is initialised on
// the first call (thread level funneled: only the calling thread communicates) and finalised at
// exit.
Communicator& world();
// The progress watchdog of the MPI communicator: a rank that has waited in one blocking collective
// (or in the wait of a non-blocking one) for longer than `seconds` prints which operation stalled
// and ends the job, instead of spinning for ever on a peer that was stopped (SIGSTOP), hangs or
// runs other work. Default 300 s, or $CLATTN_COMM_TIMEOUT (a malformed value is warned about and
// ignored); 0 waits for ever. Read at each wait,
// so it may be set before or after world(); a single process never waits.
void set_comm_timeout(double seconds);
double comm_timeout();

// Every rank of a job must run the same command on the same data: ranks that differ deadlock in
// a collective, exchange buffers of other sizes (a corrupted heap), or compute silently different
// results. check_ranks_agree compares `facts` (name, value) across the ranks in one all-gather
// of one hash per fact, called by every rank at start-up with facts in the same order; a
// difference throws clattn::Error on every rank alike (no rank is left waiting), naming `who`,
// the fact, the ranks that differ from rank 0 and this rank's value. One rank: nothing to compare.
void check_ranks_agree(Communicator& comm, const std::string& who,
                       const std::vector<std::pair<std::string, std::string>>& facts);
// A file's size and a hash of 16 blocks of 64 KiB spread over it (the first and the last among
// them): a start-up check reads at most 1 MiB of a file of any size and tells apart copies that
// differ in length, head, tail or a sampled block. "(no regular file)" for anything else.
std::string file_fingerprint(const std::string& path);
// "n bytes, hash H" of a buffer (FNV-1a over every byte): what a rank holds in memory.
std::string bytes_fingerprint(const void* data, size_t n);

// Whether this build has the Open MPI communicator (CMake option CLATTN_MPI).
bool built_with_mpi();
// Whether the environment says an MPI launcher started this process (OMPI_COMM_WORLD_SIZE,
// PMI_SIZE, PMIX_RANK, SLURM_STEP_ID with PMI).
bool launched_by_mpi();

}  // namespace clattn
