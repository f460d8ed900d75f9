#include "attention/validate.h"
#include "attention/tile/grad_util.h"

#include "clattn/threads.h"
#include "core/simd.h"

namespace clattn {

void reduce_group_partials(const AttentionInputs& in, const AttentionDims& d, const float* part,
                           int64_t rows, int64_t ld, int64_t voff, View dk, View dv) {
  const int64_t G = d.group();
  parallel_for(d.B * d.Hkv, [&](int64_t t) {
    const int64_t b = t / d.Hkv, hk = t % d.Hkv;
    for (int64_t j = 0; j < valid_keys(in, d, b); ++j) {
      float* gk = dk.ptr(b, hk, j);
      float* gv = dv.ptr(b, hk, j);
      for (int64_t g = 0; g < G; ++g) {
        const float* src = part + ((b * d.H + hk * G + g) * rows + j) * ld;
        simd::axpy_row(gk, src, d.Dk);
        simd::axpy_row(gv, src + voff, d.Dv);
      }
    }
  });
}

}  // namespace clattn
