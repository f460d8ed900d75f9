// What the communicators share inside src/comm.
#pragma once

#include <memory>
#include <string>

#include "clattn/comm.h"

namespace clattn::comm {

// Prints `why` on stderr and ends this process with `code` (a job of one rank has no one else).
[[noreturn]] void abort_process(const std::string& why, int code);

// The Open MPI communicator over MPI_COMM_WORLD (mpi.cpp, built with CLATTN_MPI): initialises MPI
// when nobody has, and finalises it at exit.
std::unique_ptr<Communicator> mpi_world();

}  // namespace clattn::comm
