// The attention API contract (docs/design.md), for every registered variant: objects hold nothing
// and Contexts / Scratches hold (and free) everything; workspace_bytes() bounds what a call takes;
// one object is safe across threads; stochastic variants are functions of (seed, step); routing's
// EMA centroids live in the caller's AttentionState; backward reads the output it is given; a
// capabilities say what each variant is. (KVCache decoding: test_kv_cache.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "attention/full/full.h"
#include "clattn/attention.h"
#include "clattn/kv_cache.h"
#include "clattn/threads.h"
#include "clattn/scratch.h"
#include "common/test_util.h"

namespace clattn {
namespace {

using testing::bitwise_equal;
using testing::max_abs_diff;
using testing::nmse;
using testing::randn;
using testing::rows;

constexpr size_t kMiB = size_t{1} << 20;

// ---------------------------------------------------------------------------------------------
// Helpers

// One problem's data, shaped for a variant: shared-QK variants take k = q (the same view), so
// they get M = N and Hkv = H.
struct Data {
  Tensor q, k, v, dout;
  std::vector<int32_t> qlen, klen;
  bool causal = false;
  bool shared_qk = false;
  AttentionState* state = nullptr;
  uint64_t step = 0;
  bool train = false;

  AttentionInputs inputs() const {
    AttentionInputs in;
    in.q = q.view();
    in.k = shared_qk ? q.view() : k.view();
    in.v = v.view();
    in.query_lengths = qlen;
    in.key_lengths = klen;
    in.causal = causal;
    in.step = step;
    in.state = state;
    in.train = train;
    return in;
  }
  AttentionDims dims() const {
    return AttentionDims{q.dim(0), q.dim(1), v.dim(1), q.dim(2), v.dim(2), q.dim(3), v.dim(3)};
  }
};

struct Shapes {
  int64_t B = 1, H = 2, Hkv = 2, N = 16, M = 16, Dk = 16, Dv = 16;
  bool lengths = false;  // query and key lengths (where the variant honours them)
  bool causal = false;   // where the variant honours it
};

// Data for `caps` at (about) the shapes asked: what the variant cannot honour is dropped.
Data make_data(const Capabilities& caps, Shapes s, uint64_t seed) {
  if (caps.shared_qk) {
    s.M = s.N;
    s.Hkv = s.H;
  }
  if (!caps.cross) s.M = s.N;
  if (!caps.gqa) s.Hkv = s.H;
  Data d;
  d.shared_qk = caps.shared_qk;
  d.q = randn(Shape{s.B, s.H, s.N, s.Dk}, seed, 1);
  if (!caps.shared_qk) d.k = randn(Shape{s.B, s.Hkv, s.M, s.Dk}, seed, 2);
  d.v = randn(Shape{s.B, s.Hkv, s.M, s.Dv}, seed, 3);
  d.dout = randn(Shape{s.B, s.H, s.N, s.Dv}, seed, 4);
  if (s.lengths && caps.query_lengths)
    for (int64_t b = 0; b < s.B; ++b)
      d.qlen.push_back(static_cast<int32_t>(std::max<int64_t>(1, s.N - s.N / 3 - b)));
  if (s.lengths && caps.key_lengths)
    for (int64_t b = 0; b < s.B; ++b)
      d.klen.push_back(static_cast<int32_t>(std::max<int64_t>(1, s.M - s.M / 4 - 2 * b)));
  d.causal = s.causal && caps.causal;
  return d;
}

struct Result {
  Tensor out, dq, dk, dv;
};

// Forward (and backward when trainable) on a fresh training Context.
Result run(const Attention& att, const Data& d, bool with_backward = true) {
  const AttentionDims dm = d.dims();
  Result r;
  r.out = Tensor(Shape{dm.B, dm.H, dm.N, dm.Dv});
  Context ctx(Mode::training);
  const AttentionInputs in = d.inputs();
  att.forward(in, r.out.view(), ctx);
  if (with_backward && att.capabilities().trainable) {
    r.dq = Tensor(in.q.shape);
    r.dk = Tensor(in.k.shape);
    r.dv = Tensor(in.v.shape);
    att.backward(in, r.out.view(), ctx, d.dout.view(), r.dq.view(), r.dk.view(), r.dv.view());
  }
  return r;
}

// The parameter is the variant's registered name; its example spec is looked up.
std::vector<std::string> variant_names() {
  std::vector<std::string> names;
  for (const VariantInfo& v : registered_attentions()) names.push_back(v.name);
  return names;
}
VariantInfo variant_info(const std::string& name) {
  for (const VariantInfo& v : registered_attentions())
    if (v.name == name) return v;
  return {};
}

std::string param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

class ApiVariants : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    info_ = variant_info(GetParam());
    ASSERT_FALSE(info_.example.empty()) << GetParam();
    att_ = make_attention(info_.example);
    ASSERT_TRUE(att_) << info_.example;
  }
  const VariantInfo& info() const { return info_; }
  const Attention& att() const { return *att_; }
  const Capabilities& caps() const { return att_->capabilities(); }
  VariantInfo info_;
  std::unique_ptr<Attention> att_;
};

// ---------------------------------------------------------------------------------------------
// 1. Contexts and Scratches hold the memory; release() frees it; the object holds none.

TEST_P(ApiVariants, ContextFreesEverything) {
  SCOPED_TRACE(info().example);
  const Data d = make_data(caps(), Shapes{.B = 1, .H = 4, .Hkv = 4, .N = 300, .M = 300, .Dk = 32, .Dv = 32}, 11);
  AttentionInputs in = d.inputs();
  const AttentionDims dm = d.dims();
  Context ctx(Mode::training);
  EXPECT_EQ(ctx.bytes(), 0u);
  EXPECT_TRUE(ctx.empty());
  Tensor out(Shape{dm.B, dm.H, dm.N, dm.Dv});
  att().forward(in, out.view(), ctx);
  EXPECT_GT(ctx.bytes(), 0u) << "forward left nothing in its Context";
  if (caps().trainable) {
    Tensor dq(in.q.shape), dk(in.k.shape), dv(in.v.shape);
    att().backward(in, out.view(), ctx, d.dout.view(), dq.view(), dk.view(), dv.view());
    EXPECT_GT(ctx.bytes(), 0u);
  }
  ctx.release();
  EXPECT_EQ(ctx.bytes(), 0u) << "release() left memory in the Context";
  EXPECT_TRUE(ctx.empty());
  // The released Context serves again.
  Tensor out2(Shape{dm.B, dm.H, dm.N, dm.Dv});
  att().forward(in, out2.view(), ctx);
  EXPECT_TRUE(bitwise_equal(out, out2));
  EXPECT_GT(ctx.bytes(), 0u);
}

TEST_P(ApiVariants, ObjectsHoldNoMemory) {
  SCOPED_TRACE(info().example);
  const Data d = make_data(caps(), Shapes{.B = 1, .H = 4, .Hkv = 4, .N = 300, .M = 300, .Dk = 32, .Dv = 32}, 12);
  const AttentionInputs in = d.inputs();
  const AttentionDims dm = d.dims();
  Scratch scratch;
  Tensor out(Shape{dm.B, dm.H, dm.N, dm.Dv});
  Tensor dq(in.q.shape), dk(in.k.shape), dv(in.v.shape);
  size_t after_first = 0;
  {
    Context ctx(Mode::training, &scratch);
    att().forward(in, out.view(), ctx);
    if (caps().trainable)
      att().backward(in, out.view(), ctx, d.dout.view(), dq.view(), dk.view(), dv.view());
    // The workspace went to the borrowed Scratch, not to the object.
    after_first = scratch.bytes();
    EXPECT_GT(after_first, 0u) << "a Context borrowing a Scratch left no workspace in it";
  }
  // More layers' Contexts on the same Scratch and the same sizes reuse it: it holds the largest
  // need of one call (what workspace_bytes bounds), never the sum over layers. (Per-thread tiles
  // are made by the threads that first need them, so it may still grow a little.)
  const size_t bound = att().workspace_bytes(d.dims(), Mode::training, max_threads());
  for (int layer = 1; layer < 4; ++layer) {
    Context ctx(Mode::training, &scratch);
    Tensor out2(Shape{dm.B, dm.H, dm.N, dm.Dv});
    Tensor dq2(in.q.shape), dk2(in.k.shape), dv2(in.v.shape);
    att().forward(in, out2.view(), ctx);
    if (caps().trainable)
      att().backward(in, out2.view(), ctx, d.dout.view(), dq2.view(), dk2.view(), dv2.view());
    EXPECT_LE(scratch.bytes(), bound) << "layer " << layer << ": the shared Scratch holds more than "
                                      << "one call's bound (first call: " << after_first << " bytes)";
    EXPECT_TRUE(bitwise_equal(out, out2));
    if (caps().trainable) {
      EXPECT_TRUE(bitwise_equal(dq, dq2));
      EXPECT_TRUE(bitwise_equal(dk, dk2));
      EXPECT_TRUE(bitwise_equal(dv, dv2));
    }
    const size_t held = scratch.bytes();
    ctx.release();
    EXPECT_EQ(ctx.bytes(), 0u);
    EXPECT_EQ(scratch.bytes(), held) << "a borrowing Context's release() freed the shared Scratch";
  }
  scratch.release();
  EXPECT_EQ(scratch.bytes(), 0u) << "Scratch::release() left memory";
  // After everything is released, a fresh Context on the released Scratch gives the same output:
  // nothing the object keeps between calls.
  Context ctx(Mode::training, &scratch);
  Tensor out3(Shape{dm.B, dm.H, dm.N, dm.Dv});
  att().forward(in, out3.view(), ctx);
  EXPECT_TRUE(bitwise_equal(out, out3));
  EXPECT_GT(scratch.bytes(), 0u);
}

// ---------------------------------------------------------------------------------------------
// 2. workspace_bytes() is an upper bound of what a call holds, and not an absurd one.

TEST_P(ApiVariants, WorkspaceBytesIsAnUpperBound) {
  const int threads = max_threads();
  struct NM { int64_t N, M; };
  const std::vector<NM> pairs = caps().cross
      ? std::vector<NM>{{1, 1}, {3, 64}, {63, 63}, {64, 65}, {65, 3}, {1, 1000}, {1000, 63}, {1000, 1000}}
      : std::vector<NM>{{1, 1}, {3, 3}, {63, 63}, {64, 64}, {65, 65}, {1000, 1000}};
  struct Config { int64_t B, Hkv; bool lengths, causal; };
  const std::vector<Config> configs = {
      {1, 4, false, false}, {2, 2, true, false}, {2, 4, false, true}, {1, 2, true, true}};
  uint64_t seed = 100;
  for (const NM& nm : pairs)
    for (const Config& c : configs) {
      if (std::max(nm.N, nm.M) >= 1000 && c.B == 2 && c.Hkv == 2) continue;  // time
      const Data d = make_data(caps(), Shapes{.B = c.B, .H = 4, .Hkv = c.Hkv, .N = nm.N, .M = nm.M,
                                              .Dk = 16, .Dv = 24, .lengths = c.lengths, .causal = c.causal},
                               ++seed);
      const AttentionDims dm = d.dims();
      SCOPED_TRACE(::testing::Message() << info().example << " B=" << dm.B << " H=" << dm.H
                                        << " Hkv=" << dm.Hkv << " N=" << dm.N << " M=" << dm.M
                                        << " Dk=" << dm.Dk << " Dv=" << dm.Dv
                                        << " lengths=" << c.lengths << " causal=" << d.causal
                                        << " threads=" << threads);
      const AttentionInputs in = d.inputs();
      Tensor out(Shape{dm.B, dm.H, dm.N, dm.Dv});
      {
        Context ctx(Mode::training);
        ASSERT_NO_THROW(att().forward(in, out.view(), ctx));
        if (caps().trainable) {
          Tensor dq(in.q.shape), dk(in.k.shape), dv(in.v.shape);
          ASSERT_NO_THROW(
              att().backward(in, out.view(), ctx, d.dout.view(), dq.view(), dk.view(), dv.view()));
        }
        const size_t held = ctx.bytes();
        const size_t bound = att().workspace_bytes(dm, Mode::training, threads);
        EXPECT_LE(held, bound) << "training: held " << held << " bytes, workspace_bytes says " << bound;
        EXPECT_LE(bound, 64 * (held + kMiB)) << "training: bound " << bound << " is absurd beside the "
                                             << held << " bytes held";
      }
      {
        Context ctx = Context::for_inference();
        ASSERT_NO_THROW(att().forward(in, out.view(), ctx));
        const size_t held = ctx.bytes();
        const size_t bound = att().workspace_bytes(dm, Mode::inference, threads);
        EXPECT_LE(held, bound) << "inference: held " << held << " bytes, workspace_bytes says " << bound;
        EXPECT_LE(bound, 64 * (held + kMiB)) << "inference: bound " << bound
                                             << " is absurd beside the " << held << " bytes held";
        EXPECT_LE(bound, att().workspace_bytes(dm, Mode::training, threads))
            << "inference needs more than training";
      }
      if (::testing::Test::HasFatalFailure()) return;
    }
}

// ---------------------------------------------------------------------------------------------
// 3. One object, several std::threads, each with its own Context: the same bits as serially.

TEST_P(ApiVariants, SafeAcrossThreads) {
  SCOPED_TRACE(info().example);
  constexpr int kThreads = 3, kIters = 3;
  const int omp_threads = max_threads();
  auto data_for = [&](int t, int it) {
    return make_data(caps(), Shapes{.B = 1, .H = 2, .Hkv = 2, .N = 200, .M = 200, .Dk = 16, .Dv = 16},
                     static_cast<uint64_t>(1000 + 10 * t + it));
  };
  std::vector<Data> data;
  for (int t = 0; t < kThreads; ++t)
    for (int it = 0; it < kIters; ++it) data.push_back(data_for(t, it));
  std::vector<AttentionState> states(data.size());  // stateful variants: one layer state each
  for (size_t i = 0; i < data.size(); ++i)
    if (caps().stateful) data[i].state = &states[i];
  // Serially, on this thread, first.
  std::vector<Result> serial;
  for (const Data& d : data) serial.push_back(run(att(), d));
  // Stateful variants: the serial calls created the state; reset it so threads see the same.
  for (auto& s : states) s.buffers.clear();
  std::vector<Result> threaded(data.size());
  std::vector<std::exception_ptr> errors(kThreads);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t)
    pool.emplace_back([&, t]() {
      try {
        set_threads(omp_threads);  // the same OpenMP team size as the serial calls
        for (int it = 0; it < kIters; ++it) {
          const size_t i = static_cast<size_t>(t * kIters + it);
          threaded[i] = run(att(), data[i]);
        }
      } catch (...) {
        errors[static_cast<size_t>(t)] = std::current_exception();
      }
    });
  for (auto& th : pool) th.join();
  for (int t = 0; t < kThreads; ++t)
    if (errors[static_cast<size_t>(t)]) {
      try {
        std::rethrow_exception(errors[static_cast<size_t>(t)]);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "thread " << t << " threw: " << e.what();
      }
    }
  for (size_t i = 0; i < data.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "thread " << i / kIters << " iteration " << i % kIters);
    EXPECT_TRUE(bitwise_equal(serial[i].out, threaded[i].out)) << "out differs from the serial call";
    if (caps().trainable) {
      EXPECT_TRUE(bitwise_equal(serial[i].dq, threaded[i].dq)) << "dq differs from the serial call";
      EXPECT_TRUE(bitwise_equal(serial[i].dk, threaded[i].dk)) << "dk differs from the serial call";
      EXPECT_TRUE(bitwise_equal(serial[i].dv, threaded[i].dv)) << "dv differs from the serial call";
    }
  }
}

// ---------------------------------------------------------------------------------------------
// 4. Same inputs and step: same bits. Stochastic variants change with the step; others do not.

TEST_P(ApiVariants, SameStepSameOutput) {
  SCOPED_TRACE(info().example);
  Data d = make_data(caps(), Shapes{.B = 1, .H = 2, .Hkv = 2, .N = 300, .M = 300, .Dk = 16, .Dv = 16}, 21);
  AttentionState s1, s2;
  for (uint64_t step : {uint64_t{0}, uint64_t{7}}) {
    d.step = step;
    if (caps().stateful) d.state = &s1;
    const Result a = run(att(), d);
    if (caps().stateful) d.state = &s2;
    const Result b = run(att(), d);
    EXPECT_TRUE(bitwise_equal(a.out, b.out)) << "step " << step << ": two fresh Contexts differ";
    if (caps().trainable) {
      EXPECT_TRUE(bitwise_equal(a.dq, b.dq)) << "step " << step;
      EXPECT_TRUE(bitwise_equal(a.dk, b.dk)) << "step " << step;
      EXPECT_TRUE(bitwise_equal(a.dv, b.dv)) << "step " << step;
    }
  }
}

TEST_P(ApiVariants, StepChangesStochasticVariants) {
  SCOPED_TRACE(info().example);
  // conditional-full runs its (stochastic) inner variant only beyond its length limit (512 in
  // the registered example): test it there.
  const int64_t N = info().name == "conditional-full" ? 600 : 300;
  Data d = make_data(caps(), Shapes{.B = 1, .H = 2, .Hkv = 2, .N = N, .M = N, .Dk = 16, .Dv = 16}, 22);
  AttentionState state;
  if (caps().stateful) d.state = &state;
  d.step = 0;
  const Tensor out0 = std::move(run(att(), d, false).out);
  int differing = 0;
  for (uint64_t step = 1; step <= 5; ++step) {
    d.step = step;
    const Tensor o = std::move(run(att(), d, false).out);
    if (!bitwise_equal(out0, o)) ++differing;
  }
  if (caps().stochastic)
    EXPECT_GT(differing, 0) << "a stochastic variant gave the same output at steps 0..5";
  else
    EXPECT_EQ(differing, 0) << "a variant that is not stochastic depends on the step";
}

INSTANTIATE_TEST_SUITE_P(Api, ApiVariants, ::testing::ValuesIn(variant_names()), param_name);

// ---------------------------------------------------------------------------------------------
// 5. Routing's EMA centroids: the caller's AttentionState.

TEST(ApiRouting, RoutingEmaState) {
  const std::string spec = "routing:clusters=4,centroids=ema,seed=3";
  auto att = make_attention(spec);
  ASSERT_TRUE(att->capabilities().stateful);
  constexpr int64_t H = 2, D = 16, N = 64, C = 4;
  const Shape cshape{H, C, D};
  const std::vector<StateBuffer> bufs = att->state_buffers(H, D);
  ASSERT_EQ(bufs.size(), 1u);
  EXPECT_EQ(bufs[0].name, "centroids");
  EXPECT_EQ(bufs[0].shape, cshape) << bufs[0].shape.str();

  Data d = make_data(att->capabilities(), Shapes{.B = 1, .H = H, .Hkv = H, .N = N, .M = N, .Dk = D, .Dv = D}, 31);
  d.step = 2;
  // Without a state: refused.
  {
    Tensor out(Shape{1, H, N, D});
    Context ctx;
    EXPECT_THROW(att->forward(d.inputs(), out.view(), ctx), Error);
  }
  auto forward = [&](AttentionState& st, bool train) {
    AttentionInputs in = d.inputs();
    in.state = &st;
    in.train = train;
    Tensor out(Shape{1, H, N, D});
    Context ctx;
    att->forward(in, out.view(), ctx);
    return out;
  };
  auto snapshot = [&](AttentionState& st) {
    const Tensor* t = st.find("centroids");
    return t ? Tensor::from(t->view()) : Tensor();
  };

  // An empty state gets the buffer, with its documented shape.
  AttentionState st;
  EXPECT_EQ(st.find("centroids"), nullptr);
  const Tensor e1 = forward(st, false);
  ASSERT_NE(st.find("centroids"), nullptr) << "forward did not create the 'centroids' buffer";
  EXPECT_EQ(st.find("centroids")->shape(), cshape) << st.find("centroids")->shape().str();
  ASSERT_TRUE(testing::all_finite(st.find("centroids")->view()));
  const Tensor c0 = snapshot(st);
  // Creation is seeded: another empty state gets the same centroids and output.
  {
    AttentionState other;
    const Tensor e = forward(other, false);
    EXPECT_TRUE(bitwise_equal(snapshot(other), c0)) << "created centroids differ between states";
    EXPECT_TRUE(bitwise_equal(e, e1));
  }
  // Evaluation calls read the state and never change it.
  const Tensor e2 = forward(st, false);
  EXPECT_TRUE(bitwise_equal(snapshot(st), c0)) << "an evaluation call changed the centroids";
  EXPECT_TRUE(bitwise_equal(e1, e2));

  // A training call changes it.
  const Tensor t1 = forward(st, true);
  const Tensor c1 = snapshot(st);
  EXPECT_FALSE(bitwise_equal(c1, c0)) << "a training call left the centroids unchanged";
  ASSERT_TRUE(testing::all_finite(c1.view()));
  const Tensor e3 = forward(st, false);
  // The output depends on the state: other centroids route differently. (One EMA step with
  // decay 0.999 barely moves them, so the routing, and the output, may well stay the same.)
  {
    AttentionState other;
    Tensor& t = other.add("centroids", cshape);
    const Tensor r = randn(cshape, 77, 1);
    for (int64_t row = 0; row < H * C; ++row) {
      double nn = 0;
      for (int64_t e = 0; e < D; ++e) nn += double(r.data()[row * D + e]) * r.data()[row * D + e];
      for (int64_t e = 0; e < D; ++e) t.data()[row * D + e] = float(r.data()[row * D + e] / std::sqrt(nn));
    }
    const Tensor e = forward(other, false);
    EXPECT_FALSE(bitwise_equal(e, e3)) << "the output does not depend on the state";
  }

  // Saved and restored into a fresh state: the same outputs, and the same updates.
  {
    AttentionState restored;
    Tensor& t = restored.add("centroids", cshape);
    std::memcpy(t.data(), c1.data(), sizeof(float) * static_cast<size_t>(c1.numel()));
    const Tensor e = forward(restored, false);
    EXPECT_TRUE(bitwise_equal(e, e3)) << "restored state: evaluation output differs";
    EXPECT_TRUE(bitwise_equal(snapshot(restored), c1));
  }
  {
    AttentionState a, b;
    a.buffers.emplace_back("centroids", Tensor::from(c1.view()));
    b.buffers.emplace_back("centroids", Tensor::from(c1.view()));
    const Tensor ta = forward(a, true), tb = forward(b, true);
    EXPECT_TRUE(bitwise_equal(ta, tb)) << "restored states: training outputs differ";
    EXPECT_TRUE(bitwise_equal(snapshot(a), snapshot(b))) << "restored states: updates differ";
    EXPECT_FALSE(bitwise_equal(snapshot(a), c1));
  }
  // Training from the restored first state reproduces the first training call.
  {
    AttentionState r0;
    r0.buffers.emplace_back("centroids", Tensor::from(c0.view()));
    const Tensor t = forward(r0, true);
    EXPECT_TRUE(bitwise_equal(t, t1)) << "training from the saved state: output differs";
    EXPECT_TRUE(bitwise_equal(snapshot(r0), c1)) << "training from the saved state: update differs";
  }
  // Backward of a training call runs.
  {
    AttentionState a;
    a.buffers.emplace_back("centroids", Tensor::from(c1.view()));
    d.state = &a;
    d.train = true;
    EXPECT_NO_THROW(run(*att, d));
    d.state = nullptr;
    d.train = false;
  }
  // A wrong-shaped (or non-finite) buffer is refused.
  for (const Shape& bad : {Shape{H, C + 1, D}, Shape{H, C, D / 2}, Shape{H + 1, C, D}, Shape{H * C * D}}) {
    AttentionState b;
    b.add("centroids", bad).fill(0.25f);
    Tensor out(Shape{1, H, N, D});
    Context ctx;
    AttentionInputs in = d.inputs();
    in.state = &b;
    EXPECT_THROW(att->forward(in, out.view(), ctx), Error) << "centroids " << bad.str();
    in.train = true;
    EXPECT_THROW(att->forward(in, out.view(), ctx), Error) << "centroids " << bad.str();
  }
  {
    AttentionState b;
    b.buffers.emplace_back("centroids", Tensor::from(c1.view()));
    b.find("centroids")->data()[5] = std::numeric_limits<float>::quiet_NaN();
    d.state = &b;
    Tensor out(Shape{1, H, N, D});
    Context ctx;
    EXPECT_THROW(att->forward(d.inputs(), out.view(), ctx), Error) << "NaN centroids";
    d.state = nullptr;
  }
}

// ---------------------------------------------------------------------------------------------
// 6. Backward reads the output it is given.

TEST(ApiFull, BackwardUsesTheGivenOutput) {
  auto att = make_attention("full");
  Data d = make_data(att->capabilities(), Shapes{.B = 2, .H = 4, .Hkv = 2, .N = 70, .M = 90, .Dk = 16, .Dv = 24,
                                                 .lengths = true, .causal = true},
                     41);
  const AttentionInputs in = d.inputs();
  const AttentionDims dm = d.dims();
  Tensor out(Shape{dm.B, dm.H, dm.N, dm.Dv});
  Context ctx;
  att->forward(in, out.view(), ctx);
  auto grads = [&](ConstView o) {
    Result r;
    r.dq = Tensor(in.q.shape);
    r.dk = Tensor(in.k.shape);
    r.dv = Tensor(in.v.shape);
    att->backward(in, o, ctx, d.dout.view(), r.dq.view(), r.dk.view(), r.dv.view());
    return r;
  };
  const Result g1 = grads(out.view());
  // The same output at another address (strided): the same gradients, bit for bit.
  testing::Guarded copy(Shape{dm.B, dm.H, dm.N, dm.Dv});
  {
    View cv = copy.view();
    for (int64_t b = 0; b < dm.B; ++b)
      for (int64_t h = 0; h < dm.H; ++h)
        for (int64_t i = 0; i < dm.N; ++i)
          std::memcpy(cv.ptr(b, h, i), out.view().ptr(b, h, i), sizeof(float) * static_cast<size_t>(dm.Dv));
  }
  const Result g2 = grads(copy.view());
  EXPECT_TRUE(bitwise_equal(g1.dq, g2.dq));
  EXPECT_TRUE(bitwise_equal(g1.dk, g2.dk));
  EXPECT_TRUE(bitwise_equal(g1.dv, g2.dv));
  EXPECT_TRUE(copy.intact());
  // The real output gives the true gradients.
  Tensor rq(in.q.shape), rk(in.k.shape), rv(in.v.shape);
  attn_full_ref_bwd(in, 0.f, d.dout.view(), rq.view(), rk.view(), rv.view());
  EXPECT_LE(nmse(rq.view(), g1.dq.view()), 1e-9);
  EXPECT_LE(nmse(rk.view(), g1.dk.view()), 1e-9);
  EXPECT_LE(nmse(rv.view(), g1.dv.view()), 1e-9);
  // Another output changes dq and dk (D_i = dO_i · O_i is read from it), not dv.
  Tensor other = Tensor::from(out.view());
  for (int64_t i = 0; i < other.numel(); ++i) other.data()[i] *= 1.5f;
  const Result g3 = grads(other.view());
  EXPECT_GT(nmse(g1.dq.view(), g3.dq.view()), 1e-6) << "backward ignored the output it was given";
  EXPECT_GT(nmse(g1.dk.view(), g3.dk.view()), 1e-6) << "backward ignored the output it was given";
  EXPECT_TRUE(bitwise_equal(g1.dv, g3.dv));
  // A wrong-shaped output is refused.
  Tensor wrong(Shape{dm.B, dm.H, dm.N, dm.Dv + 1});
  Tensor dq(in.q.shape), dk(in.k.shape), dv(in.v.shape);
  EXPECT_THROW(att->backward(in, wrong.view(), ctx, d.dout.view(), dq.view(), dk.view(), dv.view()), Error);
}

// ---------------------------------------------------------------------------------------------
// 8. Capabilities say what each variant is.

TEST(ApiCapabilities, CapabilitiesSaySharedQkStochasticStateful) {
  for (const VariantInfo& v : registered_attentions()) {
    SCOPED_TRACE(v.example);
    auto att = make_attention(v.example);
    const Capabilities& c = att->capabilities();
    EXPECT_EQ(c.shared_qk, v.name == "reformer");
    if (v.name == "clustered" || v.name == "improved-clustered" || v.name == "smyrf" ||
        v.name == "reformer" || v.name == "routing") {
      EXPECT_TRUE(c.stochastic);
    }
    if (v.name == "full" || v.name == "local" || v.name == "linear" || v.name == "topk") {
      EXPECT_FALSE(c.stochastic);
    }
    // The registered examples are all stateless (routing's default centroids are k-means).
    EXPECT_FALSE(c.stateful);
    EXPECT_TRUE(att->state_buffers(4, 16).empty());
  }
  EXPECT_TRUE(make_attention("routing:clusters=4,centroids=ema,seed=3")->capabilities().stateful);
  EXPECT_TRUE(make_attention("routing:clusters=4,centroids=ema,seed=3")->capabilities().stochastic);
  EXPECT_FALSE(make_attention("routing:clusters=4")->capabilities().stateful);
  EXPECT_FALSE(make_attention("routing:clusters=4,centroids=kmeans")->capabilities().stateful);
  EXPECT_TRUE(make_attention("routing:clusters=4")->state_buffers(2, 16).empty());
  EXPECT_FALSE(make_attention("conditional-full:length_limit=64,full")->capabilities().stochastic);
  EXPECT_TRUE(make_attention("conditional-full:length_limit=64,reformer")->capabilities().shared_qk);

  // Reformer: k must be q. Keys other than the queries are refused: other values, or the same
  // values but for one element, or another shape. (A copy of q elsewhere in memory is k = q by
  // value: if accepted, it must give the output of k = q itself.)
  auto reformer = make_attention("reformer:rounds=1,chunk=32");
  const Tensor q = randn(Shape{1, 2, 64, 16}, 61, 1), v = randn(Shape{1, 2, 64, 16}, 61, 2);
  Tensor out(Shape{1, 2, 64, 16});
  AttentionInputs in;
  in.q = q.view();
  in.k = q.view();
  in.v = v.view();
  {
    Context ctx;
    EXPECT_NO_THROW(reformer->forward(in, out.view(), ctx));
  }
  const Tensor other = randn(Shape{1, 2, 64, 16}, 61, 3);
  in.k = other.view();
  {
    Context ctx;
    EXPECT_THROW(reformer->forward(in, out.view(), ctx), Error) << "reformer took k != q";
  }
  Tensor almost = Tensor::from(q.view());
  almost.data()[almost.numel() / 2] += 0.5f;
  in.k = almost.view();
  {
    Context ctx;
    EXPECT_THROW(reformer->forward(in, out.view(), ctx), Error) << "reformer took k != q (one element)";
  }
  const Tensor shorter = Tensor::from(rows(q, 0, 32));
  in.k = shorter.view();
  {
    Context ctx;
    EXPECT_THROW(reformer->forward(in, out.view(), ctx), Error) << "reformer took k of another shape";
  }
  const Tensor copy = Tensor::from(q.view());
  in.k = copy.view();
  {
    Context ctx;
    Tensor out2(Shape{1, 2, 64, 16});
    bool accepted = true;
    try {
      reformer->forward(in, out2.view(), ctx);
    } catch (const Error&) {
      accepted = false;
    }
    if (accepted) {
      EXPECT_TRUE(bitwise_equal(out, out2)) << "k = a copy of q differs from k = q";
    }
  }
}

}  // namespace
}  // namespace clattn
