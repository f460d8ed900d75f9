// Attention on your own tensors: forward and backward of any registered variant.
#include <clattn/attention.h>
#include <clattn/rng.h>
#include <cstdio>

int main() {
  const clattn::Shape shape{1, 8, 2048, 64};                     // (B, H, N, D)
  clattn::Tensor q(shape), k(shape), v(shape), dout(shape), o(shape), dq(shape), dk(shape), dv(shape);
  clattn::Tensor* random[] = {&q, &k, &v, &dout};
  clattn::Rng rng(7);
  for (uint64_t s = 0; s < 4; ++s)
    for (int64_t i = 0; i < random[s]->numel(); ++i) random[s]->data()[i] = rng.normal(s, i);

  auto att = clattn::make_attention("improved-clustered:clusters=100");
  clattn::AttentionInputs in;                                    // views of the tensors: no copy
  in.q = q, in.k = k, in.v = v, in.causal = true;
  clattn::Context ctx;                                           // what backward needs
  att->forward(in, o, ctx);                                      // o (B, H, N, D)
  att->backward(in, o, ctx, dout, dq, dk, dv);                   // dq, dk, dv += gradients
  std::printf("%s: o[0] = %g, dq[0] = %g\n", att->name().c_str(), o.data()[0], dq.data()[0]);
}
