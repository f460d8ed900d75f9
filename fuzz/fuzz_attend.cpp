// The attention API on tensors from a fuzzed safetensors file: q, k, v (any rank, any dtype the
// reader takes), optional query_lengths, key_lengths, bias and do, run forward (and backward when
// the file has do) through one of a few specs chosen by the input's length, causal or not. The
// library validates everything it is handed: anything wrong with the file or the tensors must be a
// clattn::Error, never a crash, a sanitizer report or a read outside a buffer.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "clattn/attention.h"
#include "clattn/error.h"
#include "clattn/threads.h"
#include "clattn/safetensors.h"
#include "clattn/tensor.h"
#include "fuzz_util.h"

namespace {

std::vector<int32_t> lengths(const clattn::SafetensorsFile& f, const std::string& name) {
  return f.has(name) ? f.get_i32(name) : std::vector<int32_t>{};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace clattn;
  if (size > (1 << 20)) return 0;
  // Variants with different input paths: masks and bias (full), sparse (topk), linear, shared-QK
  // (reformer: k absent or equal to q), clustering, a window.
  static const char* const kSpecs[] = {"full", "topk:topk=3", "linear", "reformer:chunk=4",
                                        "improved-clustered:clusters=2,topk=2", "local:window=3"};
  set_threads(1);
  const fuzz::MemFile input(data, size);
  try {
    const auto att = make_attention(kSpecs[size % (sizeof kSpecs / sizeof kSpecs[0])]);
    const SafetensorsFile f = SafetensorsFile::open(input.path());
    const Tensor q = f.get_f32("q");
    const bool shared_qk = att->capabilities().shared_qk;
    const Tensor k = shared_qk && !f.has("k") ? Tensor() : f.get_f32("k");
    const Tensor v = f.get_f32("v");
    const std::vector<int32_t> qlen = lengths(f, "query_lengths"), klen = lengths(f, "key_lengths");
    const Tensor bias = f.has("bias") ? f.get_f32("bias") : Tensor();
    const Tensor dout = f.has("do") ? f.get_f32("do") : Tensor();

    AttentionInputs in;
    in.q = q.view();
    in.k = k.defined() ? k.view() : q.view();
    in.v = v.view();
    in.query_lengths = qlen;
    in.key_lengths = klen;
    in.causal = size % 7 == 3;
    if (bias.defined()) in.bias = bias.view();
    AttentionState state;  // a stateful variant's layer state, fresh from its seed
    in.state = &state;
    // The output takes its shape from q and v when they have rank 4; otherwise the library must
    // refuse the inputs before it looks at the output.
    const bool r4 = q.rank() == 4 && v.rank() == 4;
    Tensor out(r4 ? Shape{q.dim(0), q.dim(1), q.dim(2), v.dim(3)} : Shape{1});  // (B, H, N, Dv)
    Context ctx = dout.defined() ? Context() : Context::for_inference();
    att->forward(in, out.view(), ctx);
    if (dout.defined()) {
      // backward accumulates (+=) into gradients shaped like q, k and v.
      Tensor dq(q.shape()), dk(in.k.shape), dv(v.shape());
      att->backward(in, out.view(), ctx, dout.view(), dq.view(), dk.view(), dv.view());
    }
  } catch (const Error&) {
  }
  return 0;
}
