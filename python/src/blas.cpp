// The BLAS the extension's products go to. The library itself opens the OpenMP build of OpenBLAS
// it was configured with by path, with RTLD_DEEPBIND when NumPy or PyTorch loaded Debian's
// pthreads build (same soname) first, and chooses its kernel from the CPU's features
// (src/core/gemm.cpp); the extension only reports what it chose.
#include <string>

#include "clattn/cpu.h"

namespace clattn::py {
// The file of the OpenBLAS clattn's sgemm calls go to.
std::string blas_library() { return gemm_backend().library; }
}  // namespace clattn::py
