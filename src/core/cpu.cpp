#include "clattn/cpu.h"
#include "core/isa.h"

#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "clattn/error.h"
#include "clattn/threads.h"
#include "core/ascii.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define CLATTN_X86 1
#endif

namespace clattn {
namespace {

#if defined(CLATTN_X86)
struct Regs {
  uint32_t a = 0, b = 0, c = 0, d = 0;
};
Regs cpuid(uint32_t leaf, uint32_t sub = 0) {
  Regs r;
  __cpuid_count(leaf, sub, r.a, r.b, r.c, r.d);
  return r;
}
bool bit(uint32_t v, int i) { return (v >> i) & 1u; }

// XCR0, read by XGETBV: which register states the OS saves on a context switch. CPUID can report
// AVX-512 on a kernel (or hypervisor) that does not save ZMM state; using it there corrupts
// registers, so the features count only with the OS's part set.
uint64_t xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

CpuFeatures read_features() {
  CpuFeatures f;
  const Regs l0 = cpuid(0);
  const uint32_t max_leaf = l0.a;
  char vendor[13] = {};
  std::memcpy(vendor + 0, &l0.b, 4);
  std::memcpy(vendor + 4, &l0.d, 4);
  std::memcpy(vendor + 8, &l0.c, 4);
  f.vendor = vendor;
  if (max_leaf >= 1) {
    const Regs l1 = cpuid(1);
    const int base_family = (l1.a >> 8) & 0xF, base_model = (l1.a >> 4) & 0xF;
    f.family = base_family == 0xF ? base_family + static_cast<int>((l1.a >> 20) & 0xFF) : base_family;
    f.model = (base_family == 0x6 || base_family == 0xF) ? base_model + static_cast<int>(((l1.a >> 16) & 0xF) << 4)
                                                         : base_model;
    f.fma = bit(l1.c, 12);
    f.f16c = bit(l1.c, 29);
    const bool osxsave = bit(l1.c, 27), avx = bit(l1.c, 28);
    f.avx = avx;
    if (osxsave && avx) {
      const uint64_t x = xcr0();
      f.os_avx = (x & 0x6) == 0x6;
      f.os_avx512 = f.os_avx && (x & 0xE0) == 0xE0;
    }
  }
  if (max_leaf >= 7) {
    const Regs l7 = cpuid(7, 0);
    f.avx2 = bit(l7.b, 5);
    f.bmi2 = bit(l7.b, 8);
    f.avx512f = bit(l7.b, 16);
    f.avx512dq = bit(l7.b, 17);
    f.avx512cd = bit(l7.b, 28);
    f.avx512bw = bit(l7.b, 30);
    f.avx512vl = bit(l7.b, 31);
    f.avx512_vpopcntdq = bit(l7.c, 14);
    f.amx_bf16 = bit(l7.d, 22);
    f.amx_tile = bit(l7.d, 24);
    if (l7.a >= 1) f.avx512_bf16 = bit(cpuid(7, 1).a, 5);
  }
  if (cpuid(0x80000000).a >= 0x80000001) f.fma4 = bit(cpuid(0x80000001).c, 16);
  if (cpuid(0x80000000).a >= 0x80000004) {
    char brand[49] = {};
    for (uint32_t i = 0; i < 3; ++i) {
      const Regs r = cpuid(0x80000002 + i);
      std::memcpy(brand + 16 * i + 0, &r.a, 4);
      std::memcpy(brand + 16 * i + 4, &r.b, 4);
      std::memcpy(brand + 16 * i + 8, &r.c, 4);
      std::memcpy(brand + 16 * i + 12, &r.d, 4);
    }
    std::string_view s(brand);
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\0')) s.remove_suffix(1);
    f.model_name = s;
  }
  return f;
}
#else
CpuFeatures read_features() { return {}; }
#endif

Isa choose_isa() {
  const CpuFeatures& f = cpu_features();
#if !defined(CLATTN_X86)
  (void)f;
  return Isa::generic;  // one portable copy of the kernels off x86
#else
  const char* env = std::getenv("CLATTN_ISA");
  const std::string want = detail::ascii_lower(env ? env : "");  // compared without case: AVX2 is avx2
  if (want.empty()) return f.has_avx512() ? Isa::avx512 : Isa::avx2;
  std::string missing;
  auto need = [&](bool have, const char* name) {
    if (!have) missing += std::string(missing.empty() ? "" : ", ") + name;
  };
  need(f.os_avx, "OS support for AVX state");
  need(f.avx2, "avx2");
  need(f.fma, "fma");
  if (want == "avx512") {
    need(f.os_avx512, "OS support for AVX-512 state");
    need(f.avx512f, "avx512f");
    need(f.avx512bw, "avx512bw");
    need(f.avx512dq, "avx512dq");
    need(f.avx512vl, "avx512vl");
    need(f.avx512cd, "avx512cd");
  } else if (want != "avx2") {
    fail("CLATTN_ISA=", env, " is not an instruction set clattn has kernels for (avx2, avx512)");
  }
  check(missing.empty(), "CLATTN_ISA=", env, " but this CPU (",
        f.model_name.empty() ? f.vendor : f.model_name, ") lacks ", missing, "; it supports: ",
        supported_isas().empty() ? std::string("none of them") : supported_isas());
  return want == "avx512" ? Isa::avx512 : Isa::avx2;
#endif
}

}  // namespace

std::string CpuFeatures::flags() const {
  std::string out;
  auto add = [&](bool on, const char* name) {
    if (on) out += std::string(out.empty() ? "" : " ") + name;
  };
  add(avx2 && os_avx, "avx2");
  add(fma, "fma");
  add(avx512f && os_avx512, "avx512f");
  add(avx512bw && os_avx512, "avx512bw");
  add(avx512dq && os_avx512, "avx512dq");
  add(avx512vl && os_avx512, "avx512vl");
  add(avx512cd && os_avx512, "avx512cd");
  add(avx512_vpopcntdq && os_avx512, "avx512-vpopcntdq");
  add(avx512_bf16 && os_avx512, "avx512-bf16");
  add(amx_tile, "amx-tile");
  add(amx_bf16, "amx-bf16");
  return out;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = read_features();
  return f;
}

namespace detail {
Isa chosen_isa() {
  static const Isa isa = choose_isa();
  return isa;
}
}  // namespace detail

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    default: return "generic";
  }
}

std::string supported_isas() {
  const CpuFeatures& f = cpu_features();
  std::string out;
  if (f.has_avx2()) out = "avx2";
  if (f.has_avx512()) out += " avx512";
  return out;
}

std::string machine_summary() {
  const CpuFeatures& f = cpu_features();
  const GemmBackend& g = gemm_backend();
  // A refused CLATTN_ISA leaves the facts to report: the summary says why instead of throwing.
  std::string isa;
  try {
    isa = isa_name(active_isa());
  } catch (const Error& e) {
    isa = detail::concat("none (", e.what(), ")");
  }
  return detail::concat(f.model_name.empty() ? f.vendor : f.model_name, " (family ", f.family, " model ",
                        f.model, "), ISA ", isa, ", ", g.name, " ", g.kernel, " kernel, ", max_threads(),
                        " threads");
}

int64_t available_memory_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return -1;
  char line[256];
  long long kib = -1;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %lld kB", &kib) == 1) break;
  std::fclose(f);
  return kib < 0 ? -1 : static_cast<int64_t>(kib) * 1024;
}


void check_memory(double bytes, const std::string& what) {
  const int64_t avail = available_memory_bytes();
  if (avail < 0) return;  // unknown: let the allocation decide
  char need[32], have[32];
  std::snprintf(need, sizeof need, "%.2f GB", bytes / 1e9);
  std::snprintf(have, sizeof have, "%.2f GB", static_cast<double>(avail) / 1e9);
  check(bytes <= 0.9 * static_cast<double>(avail), what, " needs about ", need, " of memory, but this machine has ",
        have, " available");
}

}  // namespace clattn
