// The kernels compiled once per instruction set (src/core/microkernel_isa.cpp, src/cluster/
// kmeans_isa.cpp; CMakeLists.txt), as one table per ISA, and the one place that chooses which
// table runs: the ISA of include/clattn/cpu.h, taken at the first kernel call from the CPU's
// features or $CLATTN_ISA. Every dispatched entry point (mk::gemm_abt, cluster::assign_nearest,
// ...) reads the active table through isa_kernels(); nothing else tests the ISA.
//
// ScopedIsa makes another table active for a while, so a test can run each ISA the CPU has in one
// process (each against the plain references and against the others) instead of re-running its
// suites under CLATTN_ISA. It is for tests and A/B benchmarks: a switch while kernels run on other
// threads would mix tables within one call.
#pragma once

#include <cstdint>
#include <vector>

#include "clattn/cpu.h"
#include "core/microkernel.h"

namespace clattn {

namespace nn {
struct NnKernels;
}

struct IsaKernels {
  Isa isa = Isa::avx2;
  const mk::Kernels* tiles = nullptr;  // the tile products, packers and few-row products
  // Hamming k-means (cluster.h): nearest centroid of each code, and the per-bit votes of members.
  void (*assign_nearest)(const uint64_t* codes, int64_t n, const uint64_t* centroids, int64_t C, int32_t* assign,
                         uint32_t* dist) = nullptr;
  void (*count_bits)(const uint64_t* codes, const int32_t* assign, int64_t n, uint32_t* counts,
                     uint32_t* sizes) = nullptr;
  const nn::NnKernels* nn = nullptr;  // the nn layers' activations and norm rows (nn/nn_isa.h)
};

// The active ISA's table (chosen at the first call; see active_isa()).
const IsaKernels& isa_kernels();
// This build's table for `isa`, or nullptr when the build has no copy for it.
const IsaKernels* isa_kernels_for(Isa isa);
// The ISAs this build has a copy of and this CPU runs, narrowest first.
std::vector<Isa> runnable_isas();

class ScopedIsa {
 public:
  // Throws clattn::Error when the build has no copy for `isa` or the CPU cannot run it.
  explicit ScopedIsa(Isa isa);
  ~ScopedIsa();
  ScopedIsa(const ScopedIsa&) = delete;
  ScopedIsa& operator=(const ScopedIsa&) = delete;

 private:
  const IsaKernels* prev_;
};

namespace detail {
// The ISA chosen for this process from the CPU and $CLATTN_ISA (cpu.cpp), before any ScopedIsa.
Isa chosen_isa();
}  // namespace detail

}  // namespace clattn
