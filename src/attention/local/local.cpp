// `local` (sliding-window softmax attention): query i, at key position p = i + (M − N), attends
// the keys with |p − j| <= window/2, or with causal the last `window` positions p − window < j <= p.
// It runs on the full-attention kernels with a band (src/attention/full/): the forward visits only
// the key tiles that meet a query tile's band and packs those few panels itself, the backward only
// the query tiles that meet a key tile's band, so time and memory are O(N · window · D).
#include "attention/full/full.h"
#include "attention/registry.h"

namespace clattn {

std::unique_ptr<Attention> make_local(const Spec& spec) {
  SpecReader r(spec);
  r.require("window", "local:window=256");
  const int64_t window = r.get_int("window", 0, 1, int64_t{1} << 40);
  const double scale = r.get_float("scale", 0.0, 1e-6, 1e6, "1/sqrt(Dk)");
  r.finish();
  return make_full_attention(static_cast<float>(scale), window);
}

}  // namespace clattn
