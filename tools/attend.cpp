// `clattn attend`: run any attention spec on tensors from a safetensors file, and
// `clattn make-inputs`: write a random input file to try it on.
// attend checks only what it reads (presence, dtype, rank); shapes and their agreement are the
// attention's own preconditions (validate_inputs), so they are not repeated here.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "attention/validate.h"
#include "clattn/attention.h"
#include "clattn/error.h"
#include "clattn/parallel.h"
#include "clattn/rng.h"
#include "clattn/safetensors.h"
#include "commands.h"

namespace clattn::cli {
namespace {

struct AttendOptions {
  std::string spec, input, output;
  bool causal = false, train = false;
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

void run_attend(const AttendOptions& o) {
  if (o.threads > 0) set_threads(o.threads);
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
  bool with_grad = false, with_bias = false;
  std::vector<int32_t> query_lengths, key_lengths;
};

void run_make_inputs(const MakeOptions& o) {
  check(o.kv_heads >= 0 && o.m >= 0, "make-inputs: --kv-heads and --m must be >= 0 (0: same as --heads, --n), got ",
        o.kv_heads, " and ", o.m);
  const int64_t hkv = o.kv_heads > 0 ? o.kv_heads : o.heads, m = o.m > 0 ? o.m : o.n;
  check(o.batch >= 1 && o.heads >= 1 && o.n >= 0 && o.dim >= 1,
        "make-inputs: need batch >= 1, heads >= 1, n >= 0 and dim >= 1, got batch ", o.batch, ", heads ",
        o.heads, ", n ", o.n, ", dim ", o.dim);
  check(o.heads % hkv == 0, "make-inputs: heads must be a multiple of kv-heads, got ", o.heads, " and ", hkv);
  for (const auto* l : {&o.query_lengths, &o.key_lengths})
    check(l->empty() || static_cast<int64_t>(l->size()) == o.batch,
          "make-inputs: --query-lengths and --key-lengths need one value per batch item (", o.batch,
          "), got ", l->size());
  const Rng rng(o.seed);
  auto randn = [&](const Shape& s, uint64_t stream) {
    Tensor t = Tensor::empty_like_shape(s);
    for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = rng.normal(stream, static_cast<uint64_t>(i));
    return t;
  };
  SafetensorsWriter w;
  w.add("q", randn(Shape{o.batch, o.heads, o.n, o.dim}, 1).view());  // (B, H, N, D)
  w.add("k", randn(Shape{o.batch, hkv, m, o.dim}, 2).view());        // (B, Hkv, M, D)
  w.add("v", randn(Shape{o.batch, hkv, m, o.dim}, 3).view());        // (B, Hkv, M, D)
  if (o.with_grad) w.add("do", randn(Shape{o.batch, o.heads, o.n, o.dim}, 4).view());  // (B, H, N, D)
  if (o.with_bias) w.add("bias", randn(Shape{o.n, m}, 5).view());                      // (N, M)
  // Lengths are written as given: out-of-range values are for attend to refuse, which is useful.
  if (!o.query_lengths.empty()) w.add_i32("query_lengths", {o.batch}, o.query_lengths);
  if (!o.key_lengths.empty()) w.add_i32("key_lengths", {o.batch}, o.key_lengths);
  w.write(o.output);
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
  sub->add_option("--spec", opts->spec, "attention spec, e.g. full or full:scale=0.125")->required();
  sub->add_option("--input", opts->input, "input .safetensors")->required();
  sub->add_option("--output", opts->output, "output .safetensors (written atomically)")->required();
  sub->add_flag("--causal", opts->causal, "causal mask (query i sees keys j <= i + M - N)");
  sub->add_option("--threads", opts->threads, "OpenMP threads (default: all)");
  sub->add_option("--step", opts->step,
                  "random step of stochastic variants: same spec, inputs and step give the same output");
  sub->add_flag("--train", opts->train, "a training call (routing centroids=ema updates its state)");
  sub->callback([opts] { run_attend(*opts); });
}

void add_make_inputs(CLI::App& app) {
  auto opts = std::make_shared<MakeOptions>();
  CLI::App* sub = app.add_subcommand(
      "make-inputs", "Write random q, k, v (and do, bias, lengths if asked) for `clattn attend`.");
  sub->add_option("--output", opts->output, "output .safetensors")->required();
  sub->add_option("--batch", opts->batch, "B");
  sub->add_option("--heads", opts->heads, "H");
  sub->add_option("--kv-heads", opts->kv_heads, "Hkv (default H)");
  sub->add_option("--n", opts->n, "N queries");
  sub->add_option("--m", opts->m, "M keys (default N)");
  sub->add_option("--dim", opts->dim, "head dim D");
  sub->add_option("--seed", opts->seed, "rng seed");
  sub->add_flag("--with-grad", opts->with_grad, "also write do (B,H,N,D)");
  sub->add_flag("--with-bias", opts->with_bias, "also write an additive bias (N,M) (full only)");
  sub->add_option("--query-lengths", opts->query_lengths, "valid queries per batch item, e.g. 70,33")
      ->delimiter(',');
  sub->add_option("--key-lengths", opts->key_lengths, "valid keys per batch item, e.g. 90,41")
      ->delimiter(',');
  sub->callback([opts] { run_make_inputs(*opts); });
}

}  // namespace clattn::cli
