// The per-ISA kernel tables and the active one (core/isa.h).
#include "core/isa.h"

#include <atomic>

#include "clattn/error.h"
#include "nn/nn_isa.h"

namespace clattn {

#if defined(CLATTN_HAVE_AVX512_KERNELS)
namespace mk::avx2 {
extern const Kernels kTable;
}
namespace mk::avx512 {
extern const Kernels kTable;
}
#define CLATTN_KMEANS_DECL(ns)                                                                           \
  namespace cluster::ns {                                                                                \
  void assign_nearest_isa(const uint64_t*, int64_t, const uint64_t*, int64_t, int32_t*, uint32_t*);     \
  void count_bits_isa(const uint64_t*, const int32_t*, int64_t, uint32_t*, uint32_t*);                   \
  }
CLATTN_KMEANS_DECL(avx2)
CLATTN_KMEANS_DECL(avx512)
#undef CLATTN_KMEANS_DECL
namespace nn::avx2 {
extern const NnKernels kNnTable;
}
namespace nn::avx512 {
extern const NnKernels kNnTable;
}
#else
namespace mk::base {
extern const Kernels kTable;
}
namespace cluster::base {
void assign_nearest_isa(const uint64_t*, int64_t, const uint64_t*, int64_t, int32_t*, uint32_t*);
void count_bits_isa(const uint64_t*, const int32_t*, int64_t, uint32_t*, uint32_t*);
}  // namespace cluster::base
namespace nn::base {
extern const NnKernels kNnTable;
}
#endif

namespace {

#if defined(CLATTN_HAVE_AVX512_KERNELS)
const IsaKernels kAvx2{Isa::avx2, &mk::avx2::kTable, cluster::avx2::assign_nearest_isa, cluster::avx2::count_bits_isa,
                       &nn::avx2::kNnTable};
const IsaKernels kAvx512{Isa::avx512, &mk::avx512::kTable, cluster::avx512::assign_nearest_isa,
                         cluster::avx512::count_bits_isa, &nn::avx512::kNnTable};
#else
// One copy, built for the compiler's target: x86-64-v3 on x86, the portable code elsewhere.
#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
constexpr Isa kBaseIsa = Isa::avx2;
#else
constexpr Isa kBaseIsa = Isa::generic;
#endif
const IsaKernels kBase{kBaseIsa, &mk::base::kTable, cluster::base::assign_nearest_isa, cluster::base::count_bits_isa,
                       &nn::base::kNnTable};
#endif

std::atomic<const IsaKernels*> g_active{nullptr};

}  // namespace

const IsaKernels* isa_kernels_for(Isa isa) {
#if defined(CLATTN_HAVE_AVX512_KERNELS)
  return isa == Isa::avx512 ? &kAvx512 : isa == Isa::avx2 ? &kAvx2 : nullptr;
#else
  return isa == kBase.isa ? &kBase : nullptr;
#endif
}

const IsaKernels& isa_kernels() {
  const IsaKernels* k = g_active.load(std::memory_order_acquire);
  if (k) return *k;
  const IsaKernels* chosen = isa_kernels_for(detail::chosen_isa());
  check(chosen != nullptr, "clattn: this build has no kernels for ISA ", isa_name(detail::chosen_isa()));
  const IsaKernels* expected = nullptr;
  g_active.compare_exchange_strong(expected, chosen, std::memory_order_acq_rel);
  return *g_active.load(std::memory_order_acquire);
}

Isa active_isa() { return isa_kernels().isa; }

const nn::NnKernels& nn::isa_nn_kernels() { return *isa_kernels().nn; }

std::vector<Isa> runnable_isas() {
  std::vector<Isa> out;
  const CpuFeatures& f = cpu_features();
  for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512}) {
    const bool runs = isa == Isa::generic || (isa == Isa::avx2 && f.has_avx2()) || (isa == Isa::avx512 && f.has_avx512());
    if (runs && isa_kernels_for(isa)) out.push_back(isa);
  }
  return out;
}

ScopedIsa::ScopedIsa(Isa isa) : prev_(&isa_kernels()) {
  const IsaKernels* k = isa_kernels_for(isa);
  check(k != nullptr, "ScopedIsa: this build has no kernels for ISA ", isa_name(isa));
  bool runs = false;
  for (Isa r : runnable_isas()) runs = runs || r == isa;
  check(runs, "ScopedIsa: this CPU cannot run ISA ", isa_name(isa), " (it runs: ", supported_isas(), ")");
  g_active.store(k, std::memory_order_release);
}

ScopedIsa::~ScopedIsa() { g_active.store(prev_, std::memory_order_release); }

}  // namespace clattn
