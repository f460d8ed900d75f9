// Sequence-parallel attention (include/clattn/seq_parallel.h): the split's geometry, the checks
// every rank agrees on, and the dispatch to the variant's split kernels (Attention::split(), the
// plug-in of parallel/split_attention.h) through a communicator that counts their traffic.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>

#include "attention/validate.h"
#include "clattn/attention.h"
#include "clattn/error.h"
#include "sequence_split/sp_internal.h"
#include "sequence_split/split_attention.h"

namespace clattn {

SeqSplit SeqSplit::contiguous(int64_t N, int ranks) {
  check(N >= 1 && ranks >= 1, "sequence parallel: need N >= 1 and ranks >= 1, got N = ", N, ", ranks = ", ranks);
  check(N >= ranks, "sequence parallel: a sequence of ", N, " positions cannot be split over ", ranks, " ranks");
  SeqSplit s;
  s.N = N;
  s.ranks = ranks;
  s.segments.resize(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    const int64_t a = N * r / ranks, b = N * (r + 1) / ranks;
    s.segments[static_cast<size_t>(r)].push_back({a, b - a});
  }
  return s;
}

SeqSplit SeqSplit::zig_zag(int64_t N, int ranks) {
  check(N >= 1 && ranks >= 1, "sequence parallel: need N >= 1 and ranks >= 1, got N = ", N, ", ranks = ", ranks);
  check(N >= 2 * ranks, "sequence parallel: a causal sequence of ", N, " positions cannot be cut into the ", 2 * ranks,
        " chunks of ", ranks, " ranks");
  SeqSplit s;
  s.N = N;
  s.ranks = ranks;
  s.zigzag = true;
  s.segments.resize(static_cast<size_t>(ranks));
  const int64_t C = 2 * ranks;
  auto chunk = [&](int64_t c) { return std::pair<int64_t, int64_t>{N * c / C, N * (c + 1) / C - N * c / C}; };
  for (int r = 0; r < ranks; ++r) {
    s.segments[static_cast<size_t>(r)].push_back(chunk(r));
    s.segments[static_cast<size_t>(r)].push_back(chunk(C - 1 - r));
  }
  return s;
}

int64_t SeqSplit::local_rows(int rank) const {
  int64_t n = 0;
  for (const auto& [a, len] : segments.at(static_cast<size_t>(rank))) n += len;
  return n;
}

int64_t SeqSplit::global(int rank, int64_t i) const {
  for (const auto& [a, len] : segments.at(static_cast<size_t>(rank))) {
    if (i < len) return a + i;
    i -= len;
  }
  fail("sequence parallel: local row past rank ", rank, "'s ", local_rows(rank), " rows");
}

namespace {

// The local rows as a sequence of their own: lengths are global, and the mask is the split's.
AttentionInputs local_inputs(const AttentionInputs& in) {
  AttentionInputs local = in;
  local.query_lengths = {};
  local.key_lengths = {};
  local.causal = false;
  return local;
}

// Per thread: a rank communicates from one thread (MPI's funneled level), and ranks that are
// threads of one process (run_ranks_in_threads) each count their own traffic.
thread_local CommTraffic g_traffic;

}  // namespace

SeqParallelTraffic sequence_parallel_traffic() { return g_traffic; }
void reset_sequence_parallel_traffic() { g_traffic = {}; }

namespace sp {

std::vector<int32_t> piece_lengths(std::span<const int32_t> global, int64_t B, int64_t start, int64_t len) {
  std::vector<int32_t> out(static_cast<size_t>(B), static_cast<int32_t>(len));
  if (!global.empty())
    for (int64_t b = 0; b < B; ++b)
      out[static_cast<size_t>(b)] = static_cast<int32_t>(std::clamp<int64_t>(global[static_cast<size_t>(b)] - start, 0, len));
  return out;
}

}  // namespace sp

double ring_transfer_ms(Communicator& c, size_t bytes) {
  const int R = c.size(), r = c.rank();
  if (R == 1) return 0;
  std::vector<char> a(bytes, 1), b(bytes);
  c.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s + 1 < R; ++s) {
    auto recv = c.irecv(s % 2 ? a.data() : b.data(), bytes, (r - 1 + R) % R, 7199);
    auto send = c.isend(s % 2 ? b.data() : a.data(), bytes, (r + 1) % R, 7199);
    recv->wait();
    send->wait();
  }
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  c.all_reduce_max(&ms, 1);
  return ms;
}

namespace {
// What the registry says splits, for the refusal: each variant whose example splits, and whether
// with the causal mask.
std::string splitting_variants() {
  std::string out;
  for (const VariantInfo& v : registered_attentions()) {
    if (!v.capabilities.splits_sequence) continue;
    out += detail::concat(out.empty() ? "" : ", ", v.name,
                          v.capabilities.splits_sequence_causal ? " (causal or not)" : " (not causal)");
  }
  return out;
}
}  // namespace

bool sequence_parallel_supported(const Attention& att, bool causal, std::string* why) {
  const Capabilities& c = att.capabilities();
  if ((causal ? c.splits_sequence_causal : c.splits_sequence) && att.split()) return true;
  if (why)
    *why = detail::concat("'", att.name(), "' ", causal && c.splits_sequence ? "with a causal mask " : "",
                          "does not run with the sequence split; the variants that do: ", splitting_variants(),
                          " (`clattn variants`: the split seq column)");
  return false;
}

namespace {

// Runs fn on every rank and agrees on the outcome: when it threw on any rank, every rank throws,
// the failing one its own error and the others the lowest failing rank's message. A check that
// failed on one rank alone (its slice holds the NaN, its input file is short) would otherwise leave
// the others waiting forever in the next collective.
template <class F>
void on_every_rank(Communicator& comm, F&& fn) {
  std::exception_ptr err;
  std::string what;
  try {
    fn();
  } catch (const std::exception& e) {
    err = std::current_exception();
    what = e.what();
  }
  double first = err ? -static_cast<double>(comm.rank()) : -static_cast<double>(comm.size());  // max: lowest failing rank
  comm.all_reduce_max(&first, 1);
  const int root = static_cast<int>(-first);
  if (root >= comm.size()) return;
  char msg[1024] = {};
  if (comm.rank() == root) std::snprintf(msg, sizeof msg, "%s", what.c_str());
  comm.broadcast(msg, sizeof msg, root);
  if (err) std::rethrow_exception(err);
  throw Error(detail::concat("sequence parallel: rank ", root, " refused the call: ", msg));
}

// The largest magnitudes over every rank's rows (and max|dout| in slot 4): the overflow rule
// (attention/validate.h) bounds the whole sequence's arithmetic, not one slice's.
// Every rank must hold the same batch, heads and head sizes (only the sequence is split): a rank
// that differs would otherwise exchange blocks of another size with its peers.
void check_same_shapes(Communicator& comm, const AttentionDims& d) {
  double x[10] = {double(d.B), double(d.H), double(d.Hkv), double(d.Dk), double(d.Dv)};
  for (int i = 0; i < 5; ++i) x[5 + i] = -x[i];
  comm.all_reduce_max(x, 10);
  check(x[0] == -x[5] && x[1] == -x[6] && x[2] == -x[7] && x[3] == -x[8] && x[4] == -x[9],
        "sequence parallel: the ranks hold inputs of different shapes (B, H, Hkv, Dk, Dv from (", -x[5], ", ", -x[6],
        ", ", -x[7], ", ", -x[8], ", ", -x[9], ") to (", x[0], ", ", x[1], ", ", x[2], ", ", x[3], ", ", x[4],
        ")); every rank holds the same batch and heads, and its own rows of the sequence");
}

Magnitudes global_magnitudes(Communicator& comm, const Magnitudes& m, double& max_dout) {
  double x[5] = {m.q, m.k, m.v, m.bias, max_dout};
  comm.all_reduce_max(x, 5);
  max_dout = x[4];
  return Magnitudes{x[0], x[1], x[2], x[3]};
}

const AttentionDims check_inputs(Communicator& comm, const SeqSplit& split, const Attention& att,
                                 const AttentionInputs& in, Magnitudes& mag) {
  std::string why;
  check(sequence_parallel_supported(att, in.causal, &why), "sequence parallel: ", why);
  check(split.ranks == comm.size(), "sequence parallel: the split is for ", split.ranks, " ranks, the communicator has ",
        comm.size());
  check(!in.bias.data && !in.cache && !in.state, "sequence parallel: no bias, KV cache or layer state");
  check(!in.causal || split.zigzag, "sequence parallel: causal attention needs the zig-zag split (SeqSplit::zig_zag)");
  check(in.q.rank() == 4 && in.k.rank() == 4 && in.v.rank() == 4, "sequence parallel: q, k, v must be (B, H, n, D)");
  const int64_t n = split.local_rows(comm.rank());
  check(in.q.dim(2) == n && in.k.dim(2) == n && in.v.dim(2) == n, "sequence parallel: rank ", comm.rank(), " holds ", n,
        " positions of ", split.N, ", but q, k, v have ", in.q.dim(2), ", ", in.k.dim(2), ", ", in.v.dim(2), " rows");
  for (int32_t len : in.query_lengths)
    check(len >= 0 && len <= split.N, "sequence parallel: query lengths are global and lie in [0, ", split.N, "], got ", len);
  for (int32_t len : in.key_lengths)
    check(len >= 0 && len <= split.N, "sequence parallel: key lengths are global and lie in [0, ", split.N, "], got ", len);
  // The local rows pass the contract as a sequence of their own (shapes, strides, NaN/Inf).
  return validate_inputs(local_inputs(in), att.capabilities(), att.name(), mag);
}

}  // namespace

void sequence_parallel_forward(Communicator& comm, const SeqSplit& split, const Attention& att,
                               const AttentionInputs& in, View out, Context& ctx) {
  Magnitudes mag;
  AttentionDims d;
  on_every_rank(comm, [&] {
    d = check_inputs(comm, split, att, in, mag);
    validate_output(out, Shape{d.B, d.H, d.N, d.Dv}, "out", att.name());
  });
  check_same_shapes(comm, d);
  double no_dout = 0;
  const Magnitudes g = global_magnitudes(comm, mag, no_dout);
  AttentionDims dg = d;  // the whole sequence's sizes
  dg.N = dg.M = split.N;
  const SplitAttention& s = *att.split();
  const float scale = s.scale_at(d.Dk);
  att.check_magnitudes(dg, g);  // the variant's own rule, on the whole sequence's sizes
  s.forward(*counting_communicator(comm, g_traffic), split, in, out, ctx);
  // Approximations can go where the exact bound does not: agreed over the ranks.
  if (s.sums_queries()) on_every_rank(comm, [&] { check_results_finite(dg, g, scale, {out}, att.name()); });
}

void sequence_parallel_backward(Communicator& comm, const SeqSplit& split, const Attention& att,
                                const AttentionInputs& in, ConstView out, Context& ctx, ConstView dout,
                                View dq, View dk, View dv) {
  Magnitudes mag;
  AttentionDims d;
  double max_dout = 0;
  on_every_rank(comm, [&] {
    d = check_inputs(comm, split, att, in, mag);
    max_dout = validate_backward_max(local_inputs(in), d, out, dout, dq, dk, dv, att.name());
    check(!ctx.inference(), "sequence parallel: backward needs a training context (Context::for_inference() keeps ",
          "no backward state)");
    check(att.split()->holds_state(ctx), "sequence parallel: backward needs the forward of the same attention");
  });
  check_same_shapes(comm, d);
  const Magnitudes g = global_magnitudes(comm, mag, max_dout);
  AttentionDims dg = d;
  dg.N = dg.M = split.N;
  const SplitAttention& s = *att.split();
  check_softmax_grad_range(dg, g, max_dout, s.scale_at(d.Dk), att.name());
  if (s.sums_queries()) check_member_range(dg, g, false, att.name());
  s.backward(*counting_communicator(comm, g_traffic), split, in, out, ctx, dout, dq, dk, dv);
}

}  // namespace clattn
