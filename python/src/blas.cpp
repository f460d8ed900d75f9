// cblas_sgemm of the extension: the OpenMP build of OpenBLAS the library was configured with.
//
// Why: NumPy (and PyTorch) load Debian's default OpenBLAS, the pthreads build, whose soname is
// the same libopenblas.so.0. Once it is in the process, the extension's own dependency on
// libopenblas.so.0 binds to it whatever the RUNPATH says, and clattn's sgemm calls from inside
// its OpenMP regions would start a second thread pool fighting OpenMP's over the cores (see
// docs/building.md). So the library's one BLAS call, cblas_sgemm (src/core/gemm.cpp), is defined
// here — hidden, so it binds only inside this extension and NumPy keeps its own — and forwards to
// the OpenMP build opened by path (a second copy when the pthreads one is loaded already;
// RTLD_DEEPBIND keeps that copy's internal calls inside it). If it cannot be opened, the
// libopenblas.so.0 the extension was linked with is used.
#include <cblas.h>
#include <dlfcn.h>

#include <string>

namespace {

using Sgemm = decltype(&cblas_sgemm);

struct Resolved {
  Sgemm fn = nullptr;
  std::string library;
};

const Resolved& resolved() {
  static const Resolved r = [] {
    Resolved out;
    if (void* h = dlopen(CLATTN_OPENBLAS_PATH, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND))
      out.fn = reinterpret_cast<Sgemm>(dlsym(h, "cblas_sgemm"));
    if (!out.fn) out.fn = reinterpret_cast<Sgemm>(dlsym(RTLD_NEXT, "cblas_sgemm"));
    Dl_info info{};
    if (out.fn && dladdr(reinterpret_cast<void*>(out.fn), &info) && info.dli_fname) out.library = info.dli_fname;
    return out;
  }();
  return r;
}

}  // namespace

extern "C" void cblas_sgemm(OPENBLAS_CONST enum CBLAS_ORDER Order, OPENBLAS_CONST enum CBLAS_TRANSPOSE TransA,
                            OPENBLAS_CONST enum CBLAS_TRANSPOSE TransB, OPENBLAS_CONST blasint M,
                            OPENBLAS_CONST blasint N, OPENBLAS_CONST blasint K, OPENBLAS_CONST float alpha,
                            OPENBLAS_CONST float* A, OPENBLAS_CONST blasint lda, OPENBLAS_CONST float* B,
                            OPENBLAS_CONST blasint ldb, OPENBLAS_CONST float beta, float* C,
                            OPENBLAS_CONST blasint ldc) {
  resolved().fn(Order, TransA, TransB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

namespace clattn::py {
// The file of the OpenBLAS clattn's sgemm calls go to.
std::string blas_library() { return resolved().library; }
}  // namespace clattn::py
