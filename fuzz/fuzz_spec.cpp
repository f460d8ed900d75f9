// Spec strings: parse_spec and make_attention must refuse anything malformed with a clattn::Error;
// a spec they accept must then run forward (and backward, when trainable) on a tiny input without
// crashing, reading out of bounds or allocating by its parameters rather than by the input.
#include <cstdint>
#include <string_view>

#include "clattn/attention.h"
#include "clattn/error.h"
#include "clattn/spec.h"

namespace {

using namespace clattn;

// A small fixed problem: B 1, H 2, N = M = 9, D 4; k = q so shared-QK variants run as well.
struct Problem {
  Tensor q{Shape{1, 2, 9, 4}}, v{Shape{1, 2, 9, 4}}, g{Shape{1, 2, 9, 4}};
  Problem() {
    for (int64_t i = 0; i < q.numel(); ++i) {
      q.data()[i] = static_cast<float>((i * 37 % 17) - 8) * 0.25f;
      v.data()[i] = static_cast<float>((i * 11 % 13) - 6) * 0.5f;
      g.data()[i] = static_cast<float>((i * 5 % 7) - 3);
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Problem p;
  if (size > 4096) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    (void)parse_spec(text);
  } catch (const Error&) {
  }
  std::unique_ptr<Attention> att;
  try {
    att = make_attention(text);
  } catch (const Error&) {
    return 0;
  }
  AttentionInputs in;
  in.q = p.q.view();
  in.k = p.q.view();
  in.v = p.v.view();
  AttentionState state;
  in.state = &state;
  try {
    Tensor out(Shape{1, 2, 9, 4});
    Context ctx;
    att->forward(in, out.view(), ctx);
    if (att->capabilities().trainable) {
      Tensor dq(Shape{1, 2, 9, 4}), dk(Shape{1, 2, 9, 4}), dv(Shape{1, 2, 9, 4});
      att->backward(in, out.view(), ctx, p.g.view(), dq.view(), dk.view(), dv.view());
    }
  } catch (const Error&) {
  }
  return 0;
}
