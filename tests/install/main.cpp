// The consumer of an installed clattn (tests/install/run.sh builds it with find_package(clattn)
// and with pkg-config): only the public headers and the installed library. Prints "ok" and exits
// 0 only if every output is finite and of the expected shape.
#include <clattn/attention.h>
#include <clattn/gemm.h>
#include <clattn/threads.h>
#include <clattn/tensor.h>
#include <clattn/validate.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

namespace {

constexpr int64_t B = 1, H = 2, N = 48, D = 8;

// A deterministic input filled through clattn's OpenMP helper (needs -fopenmp at compile time).
clattn::Tensor input(uint32_t seed) {
  clattn::Tensor t(clattn::Shape{B, H, N, D});
  float* p = t.data();
  clattn::parallel_for(t.numel(), [&](int64_t i) {
    uint32_t x = seed ^ static_cast<uint32_t>(i * 2654435761u);
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    p[i] = static_cast<float>(x % 2001) / 1000.0f - 1.0f;
  });
  return t;
}

bool run(const std::string& spec, const clattn::Tensor& q, const clattn::Tensor& k,
         const clattn::Tensor& v) {
  auto att = clattn::make_attention(spec);
  clattn::Tensor out(clattn::Shape{B, H, N, D});
  out.fill(NAN);
  clattn::AttentionInputs in;
  in.q = q.view();
  in.k = k.view();
  in.v = v.view();
  clattn::Context ctx = clattn::Context::for_inference();
  att->forward(in, out.view(), ctx);
  if (!(out.shape() == clattn::Shape{B, H, N, D})) {
    std::printf("%s: output shape %s\n", spec.c_str(), out.shape().str().c_str());
    return false;
  }
  for (int64_t i = 0; i < out.numel(); ++i) {
    if (!std::isfinite(out.data()[i])) {
      std::printf("%s: output %lld is not finite\n", spec.c_str(), static_cast<long long>(i));
      return false;
    }
  }
  std::printf("%s: %s, out[0] = %g\n", att->name().c_str(), out.shape().str().c_str(), out.data()[0]);
  return true;
}

// The contract's checks and a training forward's clusters, through the public headers.
bool groups(const clattn::Tensor& q, const clattn::Tensor& k, const clattn::Tensor& v) {
  auto att = clattn::make_attention("improved-clustered:clusters=2");
  clattn::AttentionInputs in;
  in.q = q.view();
  in.k = k.view();
  in.v = v.view();
  const clattn::AttentionDims d = clattn::validate_inputs(in, att->capabilities(), "consumer");
  clattn::Tensor out(clattn::Shape{d.B, d.H, d.N, d.Dv});
  clattn::Context ctx(clattn::Mode::training);
  att->forward(in, out.view(), ctx);
  const clattn::QueryGroups g = att->query_groups(in, ctx, 0, 1);
  bool good = g.kind == "cluster" && static_cast<int64_t>(g.ids.size()) == N;
  for (const int32_t id : g.ids) good = good && id >= 0 && id < 2;
  std::printf("query_groups: %zu queries in %ss%s\n", g.ids.size(), g.kind.c_str(), good ? "" : " (wrong)");
  return good;
}

}  // namespace

int main() {
  try {
    // BLAS through clattn::gemm: [1 2; 3 4] * [5 6; 7 8] = [19 22; 43 50].
    const float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
    float c[4] = {};
    clattn::gemm(false, false, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2);
    if (c[0] != 19 || c[1] != 22 || c[2] != 43 || c[3] != 50) {
      std::printf("gemm: wrong product %g %g %g %g\n", c[0], c[1], c[2], c[3]);
      return 1;
    }
    const clattn::Tensor q = input(1), k = input(2), v = input(3);
    bool good = run("full", q, k, v);
    good = run("improved-clustered:clusters=2", q, k, v) && good;
    good = groups(q, k, v) && good;
    if (!good) return 1;
    std::printf("threads: %d\nok\n", clattn::max_threads());
    return 0;
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
}
