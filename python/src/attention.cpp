// clattn.Attention (NumPy) and clattn.Call: one spec's attention on NumPy arrays.
//
// The C++ Attention is const and keeps nothing between calls; backward needs the forward's
// inputs, output and Context again. A Call holds exactly that: its Context and references to the
// arrays of its last forward (so a backward never reads memory Python has freed; arrays changed
// in place in between are read as they are then). clattn.Attention has one Call per Python
// thread for forward() then backward(); autograd adapters make a Call per forward
// (Attention.new_call()). Outputs given in place (out=, dq=, dk=, dv=) may not alias an array
// the call reads or another output, nor overlap themselves (a zero stride): ValueError.
//
// Threads: kernels run with the GIL released. A Call runs one forward or backward at a time
// (a second thread waits for it); Calls of one Attention run at once, except that a stateful
// variant's training calls, which update the shared layer state, take turns.
//
// Error classes: a failed call is re-checked against the attention contract (validate_inputs /
// validate_backward, run only on this failure path): inputs that break it are ValueError, any
// other failure RuntimeError, both with clattn's message.
#include <pybind11/stl.h>

#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "clattn/attention.h"
#include "clattn/error.h"
#include "clattn/validate.h"
#include "common.h"

namespace clattn::py {
namespace {

// (shape, max finite |x|, first bad index or None, its value) -> TensorFacts; None -> no tensor.
TensorFacts tensor_facts(pb::handle f, const char* name) {
  TensorFacts t;
  if (f.is_none()) return t;
  const pb::tuple tup = pb::cast<pb::tuple>(f);
  if (tup.size() != 4) throw pb::value_error(std::string(name) + " facts must be (shape, max_abs, first_bad, bad_value)");
  t.shape = Shape(pb::cast<std::vector<int64_t>>(tup[0]));
  t.max_abs = pb::cast<double>(tup[1]);
  if (!tup[2].is_none()) t.first_bad = pb::cast<std::vector<int64_t>>(tup[2]);
  t.bad_value = pb::cast<double>(tup[3]);
  return t;
}

struct Core {  // one spec, shared by an Attention and every Call it made
  std::unique_ptr<Attention> att;
  AttentionState state;  // layer state of stateful variants (routing's EMA centroids)
  std::mutex state_mu;   // held only with the GIL released
};

// One forward's arguments, kept alive until the next forward of the same Call.
struct Saved {
  FloatArg q, k, v, bias;
  pb::array_t<int32_t> qlen, klen;
  pb::array out;
  View out_view;
  AttentionInputs in;  // views into the arrays above
  std::vector<std::string> copied;
};

pb::dict capabilities_dict(const Capabilities& c) {
  pb::dict d;
  for (const auto& [name, value] : capability_list(c)) d[name.c_str()] = value;
  return d;
}

// Waits for `mu` with the GIL released, returns holding both. Nothing locks a Call's mutex while
// holding the GIL, so this never deadlocks.
std::unique_lock<std::mutex> lock_released(std::mutex& mu) {
  std::unique_lock<std::mutex> lock(mu, std::defer_lock);
  pb::gil_scoped_release nogil;
  lock.lock();
  return lock;
}

// Rethrows a failure of a kernel call as ValueError when `contract_broken` says the inputs break
// the attention contract, as RuntimeError (or the exception's own class) otherwise.
template <class F>
[[noreturn]] void rethrow_classified(std::exception_ptr e, F&& contract_broken) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    bool broken = false;
    try {
      contract_broken();
    } catch (const Error&) {
      broken = true;
    }
    if (broken) throw_value_error(err.what());
    throw;
  }
}

class Call {
 public:
  Call(std::shared_ptr<Core> core, bool backward) : core_(std::move(core)), ctx_(backward ? Mode::training : Mode::inference) {}

  pb::array forward(pb::handle q, pb::handle k, pb::handle v, pb::handle qlen, pb::handle klen,
                    bool causal, pb::handle bias, uint64_t step, bool train, pb::handle out) {
    const Attention& att = *core_->att;
    const Capabilities& caps = att.capabilities();
    auto s = std::make_unique<Saved>();
    s->q = float_arg(q, "q", 4, "(B, H, N, Dk)");
    if (k.is_none() && caps.shared_qk) {
      s->k = s->q;  // shared-QK: the keys are the queries
    } else if (k.is(q)) {
      s->k = s->q;
    } else {
      s->k = float_arg(k, "k", 4, "(B, Hkv, M, Dk)");
    }
    s->v = float_arg(v, "v", 4, "(B, Hkv, M, Dv)");
    if (!bias.is_none()) s->bias = float_arg(bias, "bias", 2, "(N, M)");
    s->qlen = int_arg(qlen, "query_lengths");
    s->klen = int_arg(klen, "key_lengths");
    const std::pair<const FloatArg*, const char*> args[] = {{&s->q, "q"}, {&s->k, "k"}, {&s->v, "v"}, {&s->bias, "bias"}};
    for (const auto& [arg, name] : args)
      if (arg->copied && !(arg == &s->k && s->k.keep.is(s->q.keep))) s->copied.push_back(name);
    const Shape oshape{s->q.view.dim(0), s->q.view.dim(1), s->q.view.dim(2), s->v.view.dim(3)};  // (B, H, N, Dv)
    if (out.is_none()) {
      s->out = new_array(oshape, false);
      s->out_view = out_arg(s->out, "out", oshape);
    } else {
      s->out_view = out_arg(out, "out", oshape);
      s->out = pb::reinterpret_borrow<pb::array>(out);
      // Written while q, k, v are read: an alias of one (out=v) would feed the output back in.
      check_output_alone("out", s->out_view, s->out,
                         {{"q", s->q.keep}, {"k", s->k.keep}, {"v", s->v.keep}, {"bias", s->bias.keep}});
    }
    AttentionInputs& in = s->in;
    in.q = s->q.view;
    in.k = s->k.view;
    in.v = s->v.view;
    in.bias = s->bias.view;
    in.query_lengths = span_of(s->qlen);
    in.key_lengths = span_of(s->klen);
    in.causal = causal;
    in.step = step;
    in.train = train;
    in.state = &core_->state;

    auto lock = lock_released(mu_);
    std::unique_ptr<Saved> old = std::move(saved_);  // a failed forward leaves nothing to differentiate
    std::exception_ptr error;
    {
      pb::gil_scoped_release nogil;
      try {
        apply_threads();
        std::unique_lock<std::mutex> state_lock(core_->state_mu, std::defer_lock);
        if (caps.stateful) state_lock.lock();
        att.forward(in, s->out_view, ctx_);
      } catch (...) {
        error = std::current_exception();
      }
    }
    if (error) {
      rethrow_classified(error, [&] {
        validate_forward_inputs(att, in);
        validate_output(s->out_view, oshape, "out", att.name());
      });
    }
    last_copied_ = s->copied;
    pb::array result = s->out;
    saved_ = std::move(s);
    return result;
  }

  pb::tuple backward(pb::handle dout, pb::handle dq, pb::handle dk, pb::handle dv) {
    const Attention& att = *core_->att;
    auto lock = lock_released(mu_);
    if (!saved_)
      throw std::runtime_error(att.name() + ": backward needs a successful forward of this call first");
    if (ctx_.inference())
      throw std::runtime_error(att.name() + ": backward on an inference call (made with backward=False), "
                               "whose forward keeps no backward state");
    const Saved& s = *saved_;
    FloatArg d = float_arg(dout, "do", 4, "(B, H, N, Dv)");
    if (!(d.view.shape == s.out_view.shape))
      throw pb::value_error(att.name() + ": do must have the output's shape " + s.out_view.shape.str() +
                            ", got " + d.view.shape.str());
    auto grad = [](pb::handle given, const char* name, const Shape& shape, pb::array& keep) {
      if (given.is_none()) {
        keep = new_array(shape, true);  // backward accumulates
        return out_arg(keep, name, shape);
      }
      keep = pb::reinterpret_borrow<pb::array>(given);
      return out_arg(given, name, shape);
    };
    pb::array gq, gk, gv;
    const View vq = grad(dq, "dq", s.in.q.shape, gq), vk = grad(dk, "dk", s.in.k.shape, gk),
               vv = grad(dv, "dv", s.in.v.shape, gv);
    // Gradients are accumulated while do and the forward's arrays are read, and each is written
    // on its own: none may alias another (dq=do, dk=dq) or an array the backward reads.
    const std::initializer_list<std::pair<const char*, pb::handle>> read = {
        {"do", d.keep}, {"q", s.q.keep}, {"k", s.k.keep}, {"v", s.v.keep}, {"out", s.out}, {"bias", s.bias.keep}};
    if (!dq.is_none()) check_output_alone("dq", vq, dq, read);
    if (!dk.is_none()) check_output_alone("dk", vk, dk, read);
    if (!dv.is_none()) check_output_alone("dv", vv, dv, read);
    if (!dq.is_none() && !dk.is_none()) check_output_alone("dk", vk, dk, {{"dq", dq}});
    if (!dv.is_none() && !dq.is_none()) check_output_alone("dv", vv, dv, {{"dq", dq}});
    if (!dv.is_none() && !dk.is_none()) check_output_alone("dv", vv, dv, {{"dk", dk}});
    last_copied_ = s.copied;
    if (d.copied) last_copied_.push_back("do");
    std::exception_ptr error;
    {
      pb::gil_scoped_release nogil;
      try {
        apply_threads();
        att.backward(s.in, s.out_view, ctx_, d.view, vq, vk, vv);
      } catch (...) {
        error = std::current_exception();
      }
    }
    if (error) {
      rethrow_classified(error, [&] {
        const AttentionDims dims = validate_inputs(s.in, att.capabilities(), att.name());
        validate_backward(s.in, dims, s.out_view, d.view, vq, vk, vv, att.name());
      });
    }
    return pb::make_tuple(gq, gk, gv);
  }

  std::vector<std::string> last_copied() {
    auto lock = lock_released(mu_);
    return last_copied_;
  }
  bool has_forward() {
    auto lock = lock_released(mu_);
    return saved_ != nullptr;
  }
  // Drops the last forward's references and the Context's buffers.
  void release() {
    auto lock = lock_released(mu_);
    saved_.reset();
    ctx_.release();
  }
  size_t context_bytes() {
    auto lock = lock_released(mu_);
    return ctx_.bytes();
  }

 private:
  std::shared_ptr<Core> core_;
  std::mutex mu_;  // held only with the GIL released, or while re-taking it
  Context ctx_;
  std::unique_ptr<Saved> saved_;
  std::vector<std::string> last_copied_;
};

// forward() then backward() on one Attention pair up per Python thread: each thread has its own
// Call (in a threading.local, freed with the thread), so threads sharing an Attention never get
// another thread's forward — a backward always differentiates the calling thread's last forward.
class PyAttention {
 public:
  PyAttention(const std::string& spec, bool backward)
      : core_(std::make_shared<Core>()), backward_(backward), local_(pb::module_::import("threading").attr("local")()) {
    try {
      core_->att = make_attention(spec);
    } catch (const Error& e) {
      throw_value_error(e.what());
    }
  }
  Call& call() {
    pb::object c = pb::getattr(local_, "call", pb::none());
    if (c.is_none()) {
      c = pb::cast(std::make_unique<Call>(core_, backward_));
      local_.attr("call") = c;
    }
    return c.cast<Call&>();
  }
  const Attention& att() const { return *core_->att; }
  std::unique_ptr<Call> new_call(bool backward) { return std::make_unique<Call>(core_, backward); }
  pb::dict state() {
    std::vector<std::pair<std::string, Tensor>> copy;
    {
      pb::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(core_->state_mu);
      for (const auto& [name, t] : core_->state.buffers) copy.emplace_back(name, Tensor::from(t.view()));
    }
    pb::dict d;
    for (auto& [name, t] : copy) d[pb::str(name)] = to_numpy(std::move(t));
    return d;
  }
  void reset_state() {
    pb::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(core_->state_mu);
    core_->state.buffers.clear();
  }
  // Replaces the layer state with copies of `buffers` ({name: float32 array}); the variant checks
  // names and shapes when it next reads them, as it does for state a model file brings.
  void set_state(const pb::dict& buffers) {
    std::vector<std::pair<std::string, Tensor>> copy;
    for (const auto& [name, arr] : buffers) {
      const std::string n = pb::str(name);
      const pb::array a = pb::array::ensure(arr);
      if (!a) throw pb::value_error("state buffer '" + n + "' is not an array");
      FloatArg f = float_arg(a, n.c_str(), static_cast<int>(a.ndim()), "");
      copy.emplace_back(n, Tensor::from(f.view));
    }
    pb::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(core_->state_mu);
    core_->state.buffers = std::move(copy);
  }
  bool keeps_backward() const { return backward_; }

 private:
  std::shared_ptr<Core> core_;
  bool backward_;
  pb::object local_;  // threading.local(): .call is this thread's Call
};

constexpr const char* kForwardDoc = R"(Attention output o (B, H, N, Dv), float32.

q (B, H, N, Dk), k (B, Hkv, M, Dk), v (B, Hkv, M, Dv): float32 arrays with a unit innermost stride
are read in place (no copy); other float dtypes and layouts are converted to a float32 copy
(last_copies names them). k may be None for shared-QK variants (reformer): the keys are q.
query_lengths, key_lengths: one valid length per batch item (padding at the end); causal: query i
sees keys j <= i + M - N; bias (N, M): additive logits (full only). step: the random step of
stochastic variants (same inputs and step give the same output); train: a training call
(stateful variants update their state). out: a float32 array to write o into, in place (its own
memory: an out that overlaps q, k, v or bias, or itself through a zero stride, is a ValueError).)";

constexpr const char* kBackwardDoc = R"(Gradients (dq, dk, dv) of the last forward for do (B, H, N, Dv).

The last forward of the calling thread: threads sharing one Attention each differentiate their
own forward. They are accumulated (+=) into dq, dk, dv when given (float32, shaped like q, k, v,
each its own memory: none may alias do, another gradient or the forward's arrays), else returned
as new arrays. Uses the arrays of the last forward as they are now. For a shared-QK variant
(reformer) the gradient of q is dq + dk.)";

// validate_facts for clattn.torch's tensor-op path: the kernels' rules and messages, as ValueError.
void check_facts(const PyAttention& a, pb::handle q, pb::handle k, pb::handle v, pb::handle bias, pb::handle qlen,
                 pb::handle klen, bool causal) {
  InputFacts in;
  try {  // a rank past clattn's is refused by Shape, as ValueError
    in.q = tensor_facts(q, "q");
    in.k = tensor_facts(k, "k");
    in.v = tensor_facts(v, "v");
    in.bias = tensor_facts(bias, "bias");
  } catch (const Error& e) {
    throw_value_error(e.what());
  }
  const pb::array_t<int32_t> ql = int_arg(qlen, "query_lengths"), kl = int_arg(klen, "key_lengths");
  const std::span<const int32_t> qs = span_of(ql), ks = span_of(kl);
  in.query_lengths.assign(qs.begin(), qs.end());
  in.key_lengths.assign(ks.begin(), ks.end());
  in.causal = causal;
  try {
    validate_facts(a.att(), in);
  } catch (const Error& e) {
    throw_value_error(e.what());
  }
}

}  // namespace

void bind_attention(pb::module_& m) {
  pb::class_<Call>(m, "Call",
                   "One forward, then its backward: an Attention's call with its own Context (see "
                   "Attention.new_call). Autograd adapters use one per forward.")
      .def("forward", &Call::forward, pb::arg("q"), pb::arg("k"), pb::arg("v"), pb::kw_only(),
           pb::arg("query_lengths") = pb::none(), pb::arg("key_lengths") = pb::none(),
           pb::arg("causal") = false, pb::arg("bias") = pb::none(), pb::arg("step") = 0,
           pb::arg("train") = false, pb::arg("out") = pb::none(), kForwardDoc)
      .def("backward", &Call::backward, pb::arg("do"), pb::kw_only(), pb::arg("dq") = pb::none(),
           pb::arg("dk") = pb::none(), pb::arg("dv") = pb::none(), kBackwardDoc)
      .def_property_readonly("last_copies", &Call::last_copied,
                             "Names of the arrays the last call converted to a float32 copy ([] = none)")
      .def_property_readonly("has_forward", &Call::has_forward)
      .def_property_readonly("context_bytes", &Call::context_bytes,
                             "Bytes held by the Context (saved state and scratch)")
      .def("release", &Call::release, "Drop the last forward's arrays and the Context's buffers");

  pb::class_<PyAttention>(m, "Attention",
                          "An attention variant from a spec string, e.g. Attention('improved-clustered:clusters=100').\n"
                          "backward=False: forward keeps no backward state (inference).")
      .def(pb::init<const std::string&, bool>(), pb::arg("spec"), pb::kw_only(), pb::arg("backward") = true)
      .def(
          "forward",
          [](PyAttention& a, pb::handle q, pb::handle k, pb::handle v, pb::handle qlen, pb::handle klen,
             bool causal, pb::handle bias, uint64_t step, bool train, pb::handle out) {
            return a.call().forward(q, k, v, qlen, klen, causal, bias, step, train, out);
          },
          pb::arg("q"), pb::arg("k"), pb::arg("v"), pb::kw_only(), pb::arg("query_lengths") = pb::none(),
          pb::arg("key_lengths") = pb::none(), pb::arg("causal") = false, pb::arg("bias") = pb::none(),
          pb::arg("step") = 0, pb::arg("train") = false, pb::arg("out") = pb::none(), kForwardDoc)
      .def(
          "backward",
          [](PyAttention& a, pb::handle dout, pb::handle dq, pb::handle dk, pb::handle dv) {
            return a.call().backward(dout, dq, dk, dv);
          },
          pb::arg("do"), pb::kw_only(), pb::arg("dq") = pb::none(), pb::arg("dk") = pb::none(),
          pb::arg("dv") = pb::none(), kBackwardDoc)
      .def("new_call", &PyAttention::new_call, pb::arg("backward") = true,
           "A new Call of this attention (own Context): for autograd, one per forward")
      .def_property_readonly("spec", [](const PyAttention& a) { return a.att().name(); },
                             "The canonical spec string, every parameter spelled out")
      .def_property_readonly("capabilities", [](const PyAttention& a) { return capabilities_dict(a.att().capabilities()); })
      .def(
          "work",
          [](const PyAttention& a, int64_t n, int64_t m, int64_t batch, int64_t heads, int64_t kv_heads,
             int64_t dim, int64_t dim_v, bool causal, bool backward) {
            if (m == 0) m = n;
            if (kv_heads == 0) kv_heads = heads;
            if (dim_v == 0) dim_v = dim;
            if (n < 1 || m < 1 || batch < 1 || heads < 1 || kv_heads < 1 || dim < 1 || dim_v < 1 || heads % kv_heads)
              throw pb::value_error(detail::concat("work: sizes must be >= 1 and heads a multiple of kv_heads, got n=", n,
                                                   " m=", m, " batch=", batch, " heads=", heads, " kv_heads=",
                                                   kv_heads, " dim=", dim, " dim_v=", dim_v));
            const WorkModel w = a.att().work(AttentionDims{batch, heads, kv_heads, n, m, dim, dim_v}, causal,
                                             backward ? Mode::training : Mode::inference);
            pb::list stages;
            for (const WorkStage& s : w.stages) {
              pb::dict st;
              st["name"] = s.name;
              st["backward"] = s.backward;
              st["flops"] = s.flops;
              st["int_ops"] = s.int_ops;
              st["bytes"] = s.bytes;
              stages.append(st);
            }
            pb::dict r;
            r["flops"] = w.flops();
            r["int_ops"] = w.int_ops();
            r["bytes"] = w.bytes();
            r["stages"] = stages;
            return r;
          },
          pb::arg("n"), pb::kw_only(), pb::arg("m") = 0, pb::arg("batch") = 1, pb::arg("heads") = 1,
          pb::arg("kv_heads") = 0, pb::arg("dim") = 64, pb::arg("dim_v") = 0, pb::arg("causal") = false,
          pb::arg("backward") = false,
          "The useful work of a call of these sizes (m, kv_heads, dim_v default to n, heads, dim): "
          "{'flops', 'int_ops', 'bytes', 'stages': [{'name', 'backward', 'flops', 'int_ops', 'bytes'}]}; "
          "GFLOP/s against it is the distance to the machine's limit (docs/performance.md)")
      .def("_check_facts", &check_facts, pb::arg("q"), pb::arg("k"), pb::arg("v"), pb::kw_only(),
           pb::arg("bias") = pb::none(), pb::arg("query_lengths") = pb::none(), pb::arg("key_lengths") = pb::none(),
           pb::arg("causal") = false,
           "The attention contract and the variant's overflow rule on facts about tensors the kernels do not "
           "read (clattn.torch's tensor-op path): each fact is (shape, max finite |x|, index of the first "
           "non-finite element or None, its value); ValueError with the C++ kernels' message")
      .def_property_readonly("last_copies", [](PyAttention& a) { return a.call().last_copied(); },
                             "Names of the arrays the last forward/backward converted to a float32 copy")
      .def_property_readonly("state", &PyAttention::state,
                             "Copies of the layer state buffers of stateful variants (routing's EMA centroids)")
      .def("reset_state", &PyAttention::reset_state, "Forget the layer state (rebuilt from the seed on next use)")
      .def("set_state", &PyAttention::set_state, pb::arg("buffers"),
           "Replace the layer state with copies of {name: array} (as `state` returns it)")
      // Pickled as (spec, backward, state): copy.deepcopy, torch.save and nn.TransformerEncoder's
      // layer clones rebuild the same attention with the same layer state.
      .def(pb::pickle(
          [](PyAttention& a) { return pb::make_tuple(a.att().name(), a.keeps_backward(), a.state()); },
          [](const pb::tuple& t) {
            if (t.size() != 3) throw pb::value_error("clattn.Attention: unpickling needs (spec, backward, state)");
            PyAttention a(t[0].cast<std::string>(), t[1].cast<bool>());
            a.set_state(t[2].cast<pb::dict>());
            return a;
          }))
      .def("release", [](PyAttention& a) { a.call().release(); },
           "Drop the last forward's arrays and the Context's buffers")
      .def("__repr__", [](const PyAttention& a) { return "clattn.Attention('" + a.att().name() + "')"; });

  // For python/bench_overhead.py: the same forward timed in a C++ loop (an inference Context
  // reused across calls, the output allocated once), the reference a Python call is measured
  // against.
  m.def(
      "_time_forward_cpp",
      [](const PyAttention& a, pb::handle q, pb::handle k, pb::handle v, int repeat, bool causal) {
        FloatArg fq = float_arg(q, "q", 4, ""), fk = float_arg(k, "k", 4, ""), fv = float_arg(v, "v", 4, "");
        AttentionInputs in;
        in.q = fq.view;
        in.k = fk.view;
        in.v = fv.view;
        in.causal = causal;
        AttentionState state;
        in.state = &state;
        Tensor out(Shape{fq.view.dim(0), fq.view.dim(1), fq.view.dim(2), fv.view.dim(3)});  // (B, H, N, Dv)
        std::vector<double> ms;
        pb::gil_scoped_release nogil;
        apply_threads();
        Context ctx = Context::for_inference();
        for (int r = 0; r < repeat; ++r) {
          const auto t0 = std::chrono::steady_clock::now();
          a.att().forward(in, out.view(), ctx);
          ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
        return ms;
      },
      pb::arg("attention"), pb::arg("q"), pb::arg("k"), pb::arg("v"), pb::arg("repeat"), pb::arg("causal") = false);

  m.def(
      "variants",
      [] {
        pb::list out;
        for (const VariantInfo& v : registered_attentions()) {
          pb::dict d;
          d["name"] = v.name;
          d["params"] = v.params;
          d["summary"] = v.summary;
          d["example"] = v.example;
          d["capabilities"] = capabilities_dict(v.capabilities);
          pb::list params;
          for (const SpecParam& p : v.parameters) {
            pb::dict q;
            q["key"] = p.key;
            q["type"] = p.type;
            q["default"] = p.required ? pb::object(pb::none()) : pb::object(pb::str(p.default_value));
            q["range"] = p.range;
            q["required"] = p.required;
            params.append(q);
          }
          d["parameters"] = params;
          out.append(d);
        }
        return out;
      },
      "The registered attention variants: name, params, summary, example spec, capabilities, parameters "
      "(key, type, default, range, required)");
}

}  // namespace clattn::py
