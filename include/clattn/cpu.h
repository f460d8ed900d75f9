// What the processor offers and what clattn chose to run on it: the instruction set of the
// dispatched kernels and the dense-product (GEMM) backend with its kernel. Read once per process
// from CPUID and the operating system's saved-state mask (XGETBV), never from a table of model
// numbers, so a CPU no table knows gets the kernels its features allow.
//
// One build serves every x86-64-v3 CPU: the library is compiled for AVX2 + FMA, and the tile
// kernels (src/core/microkernel_isa.cpp) a second time for AVX-512; the copy to run is chosen at
// the first kernel call. CLATTN_ISA=avx2|avx512 forces one, and is refused by name when the CPU
// lacks it.
#pragma once

#include <cstdint>
#include <string>

namespace clattn {

struct CpuFeatures {
  std::string vendor;      // CPUID vendor: "GenuineIntel", "AuthenticAMD", ...
  std::string model_name;  // brand string, e.g. "AMD EPYC 7B13"
  int family = 0;          // display family and model (with the extended fields added)
  int model = 0;
  bool os_avx = false;     // the OS saves YMM state (XCR0 bits 1-2)
  bool os_avx512 = false;  // ... and the opmask and ZMM state (XCR0 bits 5-7)
  bool avx = false, avx2 = false, fma = false, f16c = false, bmi2 = false;
  bool fma4 = false;       // AMD's four-operand FMA (Bulldozer to Excavator only)
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false, avx512cd = false;
  bool avx512_vpopcntdq = false, avx512_bf16 = false, amx_tile = false, amx_bf16 = false;

  bool has_avx2() const { return os_avx && avx2 && fma; }  // x86-64-v3 vector part
  bool has_avx512() const {                                 // x86-64-v4 vector part
    return has_avx2() && os_avx512 && avx512f && avx512bw && avx512dq && avx512vl && avx512cd;
  }
  // "avx2 fma avx512f ... amx-bf16": the features above this CPU has, for reports.
  std::string flags() const;
};

const CpuFeatures& cpu_features();

// generic: the portable copy of a build for a processor other than x86-64 (no vector ISA named).
enum class Isa { avx2, avx512, generic };

// The instruction set the dispatched kernels run: the widest this CPU and this build support, or
// $CLATTN_ISA. Throws clattn::Error naming the problem when CLATTN_ISA is not avx2/avx512 or names
// an ISA this CPU lacks (with the features it misses). Chosen at the first call, in one place
// (src/core/isa.h: one table of kernels per ISA).
Isa active_isa();
const char* isa_name(Isa isa);
// The ISAs this CPU can run, narrowest first (what the tests iterate over).
std::string supported_isas();

// The dense-product backend behind clattn::gemm (include/clattn/gemm.h).
struct GemmBackend {
  std::string name;      // "OpenBLAS 0.3.21 (OpenMP)" from openblas_get_config()
  std::string library;   // the file it was loaded from
  std::string kernel;    // the kernel family in use, e.g. "Haswell", "SkylakeX"
  std::string detected;  // what OpenBLAS picked by itself at load time
  std::string reason;    // why `kernel` (CPU features; $OPENBLAS_CORETYPE kept or refused; self-test)
  bool verified = false; // the kernel passed the known-answer check against a double reference
  std::string products;  // which products skip sgemm: clattn's own tiles for narrow linear layers
};

// Chooses and checks the kernel at the first call (see src/core/gemm.cpp).
const GemmBackend& gemm_backend();

// Bytes the kernel says can be allocated without swapping (MemAvailable of /proc/meminfo); -1 when
// unknown. What the command line and the Trainer compare their memory estimates with.
int64_t available_memory_bytes();
// Refuses (an Error naming `what`, the estimate and what is available) a request of `bytes` above
// 90 % of the available memory; does nothing when that is unknown.
void check_memory(double bytes, const std::string& what);

// "AMD EPYC 7B13 (avx2 fma ...), ISA avx2, OpenBLAS 0.3.21 Zen kernel, 2 threads": the line the
// benchmarks print before their tables.
std::string machine_summary();

}  // namespace clattn
