// The work model's stages and the softmax-attention counts every variant builds on.
#include "attention/work.h"

#include <algorithm>
#include <utility>

namespace clattn {

double WorkModel::flops() const {
  double s = 0;
  for (const WorkStage& st : stages) s += st.flops;
  return s;
}
double WorkModel::int_ops() const {
  double s = 0;
  for (const WorkStage& st : stages) s += st.int_ops;
  return s;
}
double WorkModel::bytes() const {
  double s = 0;
  for (const WorkStage& st : stages) s += st.bytes;
  return s;
}
WorkModel& WorkModel::add(std::string name, bool backward, double flops, double int_ops, double bytes) {
  for (WorkStage& st : stages)
    if (st.name == name && st.backward == backward) {
      st.flops += flops;
      st.int_ops += int_ops;
      st.bytes += bytes;
      return *this;
    }
  stages.push_back(WorkStage{std::move(name), backward, flops, int_ops, bytes});
  return *this;
}
WorkModel& WorkModel::operator+=(const WorkModel& o) {
  for (const WorkStage& st : o.stages) add(st.name, st.backward, st.flops, st.int_ops, st.bytes);
  return *this;
}

namespace work {

double visible_pairs(int64_t N, int64_t M, bool causal) {
  const double n = static_cast<double>(N), m = static_cast<double>(M);
  if (!causal) return n * m;
  // Query i sees min(M, max(0, i + M - N + 1)) keys.
  const int64_t off = M - N;
  if (off >= 0) return n * static_cast<double>(off + 1) + n * (n - 1) / 2;
  const double seen = static_cast<double>(N + off);  // queries with at least one key
  return seen * (seen + 1) / 2;
}

double capped_pairs(int64_t N, int64_t M, int64_t k, bool causal) {
  if (!causal) return static_cast<double>(N) * static_cast<double>(std::min(k, M));
  double s = 0;
  for (int64_t i = 0; i < N; ++i) s += static_cast<double>(std::clamp<int64_t>(i + M - N + 1, 0, std::min(k, M)));
  return s;
}

double band_pairs(int64_t N, int64_t M, int64_t w, bool causal) {
  double s = 0;
  const int64_t off = M - N;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t p = i + off;
    const int64_t lo = std::max<int64_t>(0, causal ? p - w + 1 : p - w / 2);
    const int64_t hi = std::min<int64_t>(M, causal ? p + 1 : p + w / 2 + 1);
    s += static_cast<double>(std::max<int64_t>(0, hi - lo));
  }
  return s;
}

double softmax_fwd_flops(const AttentionDims& d, double pairs) {
  return 2.0 * pairs * static_cast<double>(d.Dk + d.Dv) * static_cast<double>(d.B * d.H);
}

double softmax_bwd_flops(const AttentionDims& d, double pairs) {
  return 2.0 * pairs * static_cast<double>(3 * d.Dk + 2 * d.Dv) * static_cast<double>(d.B * d.H);
}

double io_bytes(const AttentionDims& d, bool backward) {
  const double q = static_cast<double>(d.B * d.H * d.N), kv = static_cast<double>(d.B * d.Hkv * d.M);
  const double fwd = 4.0 * (q * static_cast<double>(d.Dk + d.Dv) + kv * static_cast<double>(d.Dk + d.Dv));
  // Backward reads q, k, v, out, dO and writes dq, dk, dv: the forward's bytes twice, plus dO.
  return backward ? 2.0 * fwd + 4.0 * q * static_cast<double>(d.Dv) : fwd;
}

WorkModel softmax_attention(const AttentionDims& d, double pairs, Mode mode, const char* name) {
  WorkModel w;
  w.add(name, false, softmax_fwd_flops(d, pairs), 0, io_bytes(d, false));
  if (mode == Mode::training) w.add(name, true, softmax_bwd_flops(d, pairs), 0, io_bytes(d, true));
  return w;
}

}  // namespace work
}  // namespace clattn
