// `clattn attend`: run any attention spec on tensors from a safetensors file, and
// `clattn make-inputs`: write a random input file to try it on.
// attend checks only what it reads (presence, dtype, rank); shapes and their agreement are the
// attention's own preconditions (validate_inputs, clattn/validate.h), so they are not repeated here.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.h"
#include "clattn/attention.h"
#include "clattn/comm.h"
#include "clattn/error.h"
#include "clattn/threads.h"
#include "clattn/rng.h"
#include "clattn/safetensors.h"
#include "clattn/seq_parallel.h"
#include "commands.h"

namespace clattn::cli {
namespace {

struct AttendOptions {
  std::string spec, input, output;
  bool causal = false, train = false, sequence_parallel = false;
  int threads = 0;
  uint64_t step = 0;
};

// "(2, 3)": the info shape may have any rank, so not via Shape (which caps it).
std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << '(';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << (s.size() == 1 ? ",)" : ")");
  return os.str();
}

Tensor load_rank(const SafetensorsFile& f, const std::string& name, size_t rank, const char* layout) {
  check(f.has(name), "attend: '", f.path(), "' has no tensor '", name, "' ", layout);
  const TensorInfo& info = f.info(name);
  check(info.shape.size() == rank, "attend: tensor '", name, "' must have rank ", rank, " ", layout,
        ", got shape ", shape_str(info.shape));
  return f.get_f32(name);  // throws naming the dtype unless F32, F16 or BF16
}

std::vector<int32_t> load_lengths(const SafetensorsFile& f, const std::string& name) {
  if (!f.has(name)) return {};
  const TensorInfo& info = f.info(name);
  check(info.shape.size() == 1, "attend: '", name, "' must be I32 [B] (one length per batch item), got ",
        dtype_name(info.dtype), " of shape ", shape_str(info.shape));
  return f.get_i32(name);  // throws naming the dtype unless I32 (or I64 that fits)
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The rows of rank r's pieces of a (B, Hx, N, D) view, in its local order.
Tensor take_rows(ConstView t, const SeqSplit& s, int r) {
  const int64_t n = s.local_rows(r);
  Tensor out(Shape{t.dim(0), t.dim(1), n, t.dim(3)});
  for (int64_t b = 0; b < t.dim(0); ++b)
    for (int64_t h = 0; h < t.dim(1); ++h)
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(out.data() + ((b * t.dim(1) + h) * n + i) * t.dim(3), t.ptr(b, h, s.global(r, i)),
                    sizeof(float) * static_cast<size_t>(t.dim(3)));
  return out;
}

// Every rank's rows of a (B, Hx, n_r, D) tensor back into (B, Hx, N, D) order, on every rank.
Tensor gather_rows(Communicator& comm, const Tensor& mine, const SeqSplit& s) {
  const int R = comm.size();
  const int64_t B = mine.dim(0), Hx = mine.dim(1), D = mine.dim(3);
  std::vector<size_t> counts, displs;
  size_t total = 0;
  for (int j = 0; j < R; ++j) {
    counts.push_back(sizeof(float) * static_cast<size_t>(B * Hx * s.local_rows(j) * D));
    displs.push_back(total);
    total += counts.back();
  }
  std::vector<float> all(total / sizeof(float));
  comm.iall_gatherv(mine.data(), sizeof(float) * static_cast<size_t>(mine.numel()), all.data(), counts, displs)->wait();
  Tensor out(Shape{B, Hx, s.N, D});
  for (int j = 0; j < R; ++j) {
    const float* src = all.data() + displs[static_cast<size_t>(j)] / sizeof(float);
    const int64_t n = s.local_rows(j);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hx; ++h)
        for (int64_t i = 0; i < n; ++i)
          std::memcpy(out.data() + ((b * Hx + h) * s.N + s.global(j, i)) * D, src + ((b * Hx + h) * n + i) * D,
                      sizeof(float) * static_cast<size_t>(D));
  }
  return out;
}

// --sequence-parallel: every rank (mpirun) reads the whole file, keeps its positions (contiguous
// slices; causal: the zig-zag chunks), runs the attention split across the ranks, and rank 0
// writes the whole output, as one process would.
void run_split(const AttendOptions& o, const Attention& att, const AttentionInputs& in, const Tensor* dout) {
  Communicator& comm = world();
  const int R = comm.size(), r = comm.rank();
  std::string why;
  check(sequence_parallel_supported(att, in.causal, &why), "attend --sequence-parallel: ", why);
  check(!in.bias.data, "attend --sequence-parallel: the input has a bias, which a split sequence cannot take");
  check(in.q.dim(2) == in.k.dim(2), "attend --sequence-parallel: splits self-attention (N = M), got N = ", in.q.dim(2),
        " and M = ", in.k.dim(2));
  const SeqSplit split = in.causal ? SeqSplit::zig_zag(in.q.dim(2), R) : SeqSplit::contiguous(in.q.dim(2), R);
  const Tensor q = take_rows(in.q, split, r), k = take_rows(in.k, split, r), v = take_rows(in.v, split, r);
  AttentionInputs part = in;
  part.q = q.view();
  part.k = k.view();
  part.v = v.view();
  part.state = nullptr;
  Tensor out(Shape{q.dim(0), q.dim(1), q.dim(2), v.dim(3)});
  Context ctx = dout ? Context() : Context::for_inference();
  reset_sequence_parallel_traffic();
  const auto t0 = std::chrono::steady_clock::now();
  sequence_parallel_forward(comm, split, att, part, out.view(), ctx);
  const double fwd_ms = ms_since(t0);
  SafetensorsWriter w;
  const Tensor o_all = gather_rows(comm, out, split);
  w.add("o", o_all.view());
  Tensor dq_all, dk_all, dv_all;
  double bwd_ms = 0;
  if (dout) {
    const Tensor g = take_rows(dout->view(), split, r);
    Tensor dq(q.shape()), dk(k.shape()), dv(v.shape());
    const auto t1 = std::chrono::steady_clock::now();
    sequence_parallel_backward(comm, split, att, part, out.view(), ctx, g.view(), dq.view(), dk.view(), dv.view());
    bwd_ms = ms_since(t1);
    dq_all = gather_rows(comm, dq, split);
    dk_all = gather_rows(comm, dk, split);
    dv_all = gather_rows(comm, dv, split);
    w.add("dq", dq_all.view());
    w.add("dk", dk_all.view());
    w.add("dv", dv_all.view());
  }
  const SeqParallelTraffic traffic = sequence_parallel_traffic();
  if (r != 0) return;
  w.set_metadata("spec", att.name());
  w.set_metadata("causal", in.causal ? "true" : "false");
  w.set_metadata("ranks", std::to_string(R));
  w.write(o.output);
  char bwd[64] = "";  // rounded as the one-process line rounds it (std::to_string printed 6 decimals)
  if (dout) std::snprintf(bwd, sizeof bwd, ", backward %.2f ms", bwd_ms);
  std::fprintf(stderr, "attend: %s on q %s split over %d ranks%s: forward %.2f ms%s, rank 0 sent %.3f MB -> %s\n",
               att.name().c_str(), in.q.shape.str().c_str(), R, in.causal ? " (causal, zig-zag)" : "", fwd_ms, bwd,
               static_cast<double>(traffic.bytes) / 1e6, o.output.c_str());
}

void run_attend(const AttendOptions& o) {
  // Under mpirun ranks given other lengths, specs or inputs died in MPI_ERR_TRUNCATE, hung, or
  // wrote an output off one process's: they must agree first.
  check_cli_ranks_agree("attend", {{"--input", o.input}});
  set_threads(checked_threads(o.threads, "attend"));
  check_outputs("attend", {{"--output", o.output}}, {{"--input", o.input}});
  // The spec first: a typo fails at once, before a large input is read.
  auto att = make_attention(o.spec);
  const SafetensorsFile f = SafetensorsFile::open(o.input);
  const Tensor q = load_rank(f, "q", 4, "(B, H, N, D)");
  // Shared-QK attention (reformer) takes q as its keys: k may be absent, or must equal q.
  const bool shared_qk = att->capabilities().shared_qk;
  const Tensor k = shared_qk && !f.has("k") ? Tensor() : load_rank(f, "k", 4, "(B, Hkv, M, D)");
  if (shared_qk && k.defined())
    check(k.shape() == q.shape() &&
              std::equal(k.data(), k.data() + k.numel(), q.data()),
          "attend: ", att->name(), " is shared-QK attention (keys are the queries): the input's k ",
          "must be absent or equal to q, got k ", k.shape(), " and q ", q.shape());
  const Tensor v = load_rank(f, "v", 4, "(B, Hkv, M, Dv)");
  const std::vector<int32_t> qlen = load_lengths(f, "query_lengths"), klen = load_lengths(f, "key_lengths");
  std::optional<Tensor> bias, dout;
  if (f.has("bias")) bias = load_rank(f, "bias", 2, "(N, M)");
  if (f.has("do")) dout = load_rank(f, "do", 4, "(B, H, N, Dv)");

  AttentionInputs in;
  in.q = q.view();
  in.k = shared_qk ? q.view() : k.view();
  in.v = v.view();
  in.query_lengths = qlen;
  in.key_lengths = klen;
  in.causal = o.causal;
  in.step = o.step;
  in.train = o.train;
  AttentionState state;  // a stateful variant's layer state, fresh from its seed
  in.state = &state;
  if (bias) in.bias = bias->view();
  {  // Memory before allocation: the output (and gradients) plus the variant's stated workspace.
    const AttentionDims d{q.dim(0), q.dim(1), in.k.dim(1), q.dim(2), in.k.dim(2), q.dim(3), v.dim(3)};
    const double outsz = 4.0 * d.B * d.H * d.N * d.Dv;
    const double grads = dout ? 4.0 * (q.numel() + 2.0 * static_cast<double>(in.k.numel())) : 0;
    check_memory(outsz + grads + static_cast<double>(att->workspace_bytes(d, dout ? Mode::training : Mode::inference, max_threads())),
                 "attend: " + att->name() + " on q " + q.shape().str());
  }
  if (o.sequence_parallel) {
    run_split(o, *att, in, dout ? &*dout : nullptr);
    return;
  }
  Tensor out(Shape{q.dim(0), q.dim(1), q.dim(2), v.dim(3)});  // (B, H, N, Dv)
  // Without dO there is no backward: the forward need not keep its backward state.
  Context ctx = dout ? Context() : Context::for_inference();
  const auto t0 = std::chrono::steady_clock::now();
  att->forward(in, out.view(), ctx);
  const double fwd_ms = ms_since(t0);
  SafetensorsWriter w;
  w.add("o", out.view());
  std::string bwd;
  if (dout) {
    // backward accumulates (+=), so the gradients start at zero.
    Tensor dq(q.shape()), dk(in.k.shape), dv(v.shape());  // like q, k, v
    const auto t1 = std::chrono::steady_clock::now();
    att->backward(in, out.view(), ctx, dout->view(), dq.view(), dk.view(), dv.view());
    char buf[48];
    std::snprintf(buf, sizeof buf, ", backward %.2f ms", ms_since(t1));
    bwd = buf;
    w.add("dq", dq.view());
    w.add("dk", dk.view());
    w.add("dv", dv.view());
  }
  w.set_metadata("spec", att->name());
  w.set_metadata("causal", o.causal ? "true" : "false");
  w.write(o.output);
  std::fprintf(stderr, "attend: %s on q %s, k %s, v %s%s%s%s%s: forward %.2f ms%s -> %s\n",
               att->name().c_str(), q.shape().str().c_str(), in.k.shape.str().c_str(),
               v.shape().str().c_str(), bias ? ", bias" : "", qlen.empty() ? "" : ", query_lengths",
               klen.empty() ? "" : ", key_lengths", o.causal ? " (causal)" : "", fwd_ms, bwd.c_str(),
               o.output.c_str());
}

struct MakeOptions {
  std::string output;
  int64_t batch = 1, heads = 8, kv_heads = 0, n = 1024, m = 0, dim = 64;
  uint64_t seed = 0;
  bool with_grad = false, with_bias = false, shared_qk = false;
  std::vector<int32_t> query_lengths, key_lengths;
};

// Usage errors unless `lengths` is empty or has one value in [0, limit] per batch item.
void check_lengths(const std::vector<int32_t>& lengths, int64_t batch, int64_t limit, const char* option,
                   const char* size) {
  if (lengths.empty()) return;
  usage_check(static_cast<int64_t>(lengths.size()) == batch, "make-inputs: ", option,
              " needs one value per batch item (", batch, "), got ", lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i)
    usage_check(lengths[i] >= 0 && lengths[i] <= limit, "make-inputs: ", option, " value ", i + 1, " (",
                lengths[i], ") must be in [0, ", limit, "] (", size, " = ", limit, ")");
}

void run_make_inputs(const MakeOptions& o) {
  check_size(o.batch, 1, kMaxCount, "make-inputs: --batch");
  check_size(o.heads, 1, kMaxCount, "make-inputs: --heads");
  check_size(o.kv_heads, 0, kMaxCount, "make-inputs: --kv-heads (0: same as --heads)");
  check_size(o.n, 0, kMaxCount, "make-inputs: --n");
  check_size(o.m, 0, kMaxCount, "make-inputs: --m (0: same as --n)");
  check_size(o.dim, 1, kMaxCount, "make-inputs: --dim");
  const int64_t hkv = o.kv_heads > 0 ? o.kv_heads : o.heads, m = o.m > 0 ? o.m : o.n;
  usage_check(o.heads % hkv == 0, "make-inputs: --heads must be a multiple of --kv-heads, got ", o.heads,
              " and ", hkv);
  // Shared-QK attention takes q as its keys: k must be able to have q's shape.
  usage_check(!o.shared_qk || (m == o.n && hkv == o.heads),
              "make-inputs: --shared-qk writes no k (the keys are q), so it needs --m equal to --n and "
              "--kv-heads equal to --heads, got n ", o.n, ", m ", m, ", heads ", o.heads, ", kv-heads ", hkv);
  check_lengths(o.query_lengths, o.batch, o.n, "--query-lengths", "N");
  check_lengths(o.key_lengths, o.batch, m, "--key-lengths", "M");
  check_elements({o.batch, o.heads, o.n, o.dim}, "make-inputs: q (B, H, N, D)");
  {  // each tensor is built, then copied into the writer: twice its size at the peak
    const double q = 4.0 * o.batch * o.heads * o.n * o.dim, kv = 4.0 * o.batch * (o.kv_heads > 0 ? o.kv_heads : o.heads) * (o.m > 0 ? o.m : o.n) * o.dim;
    check_memory(2 * (q * (o.with_grad ? 2 : 1) + 2 * kv + (o.with_bias ? 4.0 * o.n * (o.m > 0 ? o.m : o.n) : 0)), "make-inputs");
  }
  check_elements({o.batch, hkv, m, o.dim}, "make-inputs: k and v (B, Hkv, M, D)");
  if (o.with_bias) check_elements({o.n, m}, "make-inputs: bias (N, M)");
  const Rng rng(o.seed);
  auto randn = [&](const Shape& s, uint64_t stream) {
    Tensor t = Tensor::empty_like_shape(s);
    for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = rng.normal(stream, static_cast<uint64_t>(i));
    return t;
  };
  SafetensorsWriter w;
  std::string summary;  // "q (1, 8, 1000, 64), k (1, 8, 1000, 64), ..."
  auto add = [&](const char* name, const Shape& s, uint64_t stream) {
    w.add(name, randn(s, stream).view());
    summary += (summary.empty() ? "" : ", ") + std::string(name) + " " + s.str();
  };
  add("q", Shape{o.batch, o.heads, o.n, o.dim}, 1);                 // (B, H, N, D)
  if (o.shared_qk) summary += ", no k (shared-QK: the keys are q)";
  else add("k", Shape{o.batch, hkv, m, o.dim}, 2);                  // (B, Hkv, M, D)
  add("v", Shape{o.batch, hkv, m, o.dim}, 3);                       // (B, Hkv, M, D)
  if (o.with_grad) add("do", Shape{o.batch, o.heads, o.n, o.dim}, 4);  // (B, H, N, D)
  if (o.with_bias) add("bias", Shape{o.n, m}, 5);                      // (N, M)
  const std::string batch_shape = shape_str({o.batch});
  if (!o.query_lengths.empty()) {
    w.add_i32("query_lengths", {o.batch}, o.query_lengths);
    summary += ", query_lengths " + batch_shape;
  }
  if (!o.key_lengths.empty()) {
    w.add_i32("key_lengths", {o.batch}, o.key_lengths);
    summary += ", key_lengths " + batch_shape;
  }
  w.write(o.output);
  std::fprintf(stderr, "make-inputs: wrote %s: %s\n", o.output.c_str(), summary.c_str());
}

}  // namespace

void add_attend(CLI::App& app) {
  auto opts = std::make_shared<AttendOptions>();
  CLI::App* sub = app.add_subcommand(
      "attend",
      "Run an attention spec on tensors from a safetensors file: q (B,H,N,D), k (B,Hkv,M,D), "
      "v (B,Hkv,M,Dv), optional query_lengths/key_lengths (I32 [B]), bias (N,M) and do "
      "(B,H,N,Dv); k may be absent for shared-QK attention (reformer), which uses q. Writes o, "
      "and dq, dk, dv when do is given.");
  sub->add_option("--spec", opts->spec, "attention spec, e.g. full or full:scale=0.125")->required()->check(spec_validator());
  sub->add_option("--input", opts->input, "input .safetensors")->required();
  sub->add_option("--output", opts->output, "output .safetensors (written atomically; not the input)")
      ->required();
  sub->add_flag("--causal", opts->causal, "causal mask (query i sees keys j <= i + M - N)");
  add_threads_option(sub, opts->threads, "attend");
  add_comm_timeout_option(sub);
  sub->add_option("--step", opts->step,
                  "random step of stochastic variants: same spec, inputs and step give the same output")
      ->capture_default_str();
  sub->add_flag("--train", opts->train, "a training call (routing centroids=ema updates its state)");
  sub->add_flag("--sequence-parallel", opts->sequence_parallel,
                "under mpirun, split the sequence across the ranks (full: ring; clustered variants: "
                "distributed clustering); rank 0 writes the same file one process would");
  sub->callback([opts] { run_attend(*opts); });
}

void add_make_inputs(CLI::App& app) {
  auto opts = std::make_shared<MakeOptions>();
  CLI::App* sub = app.add_subcommand(
      "make-inputs", "Write random q, k, v (and do, bias, lengths if asked) for `clattn attend`.");
  sub->add_option("--output", opts->output, "output .safetensors")->required();
  sub->add_option("--batch", opts->batch, "B")->capture_default_str();
  sub->add_option("--heads", opts->heads, "H")->capture_default_str();
  sub->add_option("--kv-heads", opts->kv_heads, "Hkv (default H)");
  sub->add_option("--n", opts->n, "N queries")->capture_default_str();
  sub->add_option("--m", opts->m, "M keys (default N)");
  sub->add_option("--dim", opts->dim, "head dim D")->capture_default_str();
  sub->add_option("--seed", opts->seed, "rng seed")->capture_default_str();
  sub->add_flag("--with-grad", opts->with_grad, "also write do (B,H,N,D)");
  sub->add_flag("--with-bias", opts->with_bias, "also write an additive bias (N,M) (full only)");
  sub->add_flag("--shared-qk", opts->shared_qk,
                "write no k: attend uses q as the keys, for shared-QK attention (reformer); needs M = N "
                "and Hkv = H");
  sub->add_option("--query-lengths", opts->query_lengths, "valid queries per batch item, each in [0, N], e.g. 70,33")
      ->delimiter(',');
  sub->add_option("--key-lengths", opts->key_lengths, "valid keys per batch item, each in [0, M], e.g. 90,41")
      ->delimiter(',');
  sub->callback([opts] { run_make_inputs(*opts); });
}

}  // namespace clattn::cli
