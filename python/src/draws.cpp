// The random draws of clustered attention, for the tensor-op version in python/clattn/_device.py:
// the LSH planes and the positions the Hamming k-means seeds its centroids from, both from
// clattn's own generator with the streams the C++ kernels use (src/attention/clustered/clustered.cpp),
// so the same spec, seed and step give the same planes and the same clusters on any device. And
// the token sampler of generation with its draw, for tests that hold it to an independent one.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include "clattn/model.h"
#include "clattn/rng.h"
#include "common.h"

namespace clattn::py {

namespace {

// The kernels' rng streams: (step, purpose, head), purpose 0 the planes, 1 the k-means draws.
uint64_t stream_of(uint64_t step, uint64_t purpose, uint64_t head) { return ((step * 4 + purpose) << 32) + head; }

pb::tuple lsh_planes(uint64_t seed, uint64_t step, int bits, int64_t D, bool hash_bias) {
  if (bits < 1 || bits > 64) throw pb::value_error("lsh planes: bits must be in [1, 64], got " + std::to_string(bits));
  if (D < 1) throw pb::value_error("lsh planes: the feature dim must be >= 1, got " + std::to_string(D));
  const Rng rng(seed);
  const uint64_t stream = stream_of(step, 0, 0);
  pb::array_t<float> planes({static_cast<pb::ssize_t>(bits), static_cast<pb::ssize_t>(D)});  // (bits, D)
  pb::array_t<float> thresholds(static_cast<pb::ssize_t>(bits));                          // (bits)
  float* a = planes.mutable_data();
  for (int64_t i = 0; i < bits * D; ++i) a[i] = rng.normal(stream, static_cast<uint64_t>(i));
  float* t = thresholds.mutable_data();
  for (int b = 0; b < bits; ++b) t[b] = hash_bias ? rng.normal(stream, static_cast<uint64_t>(bits * D + b)) : 0.f;
  return pb::make_tuple(planes, thresholds);
}

// The first `count` positions of the seeded partial Fisher-Yates shuffle that hamming_kmeans
// draws its initial centroids from, for each head t (stream (step, 1, t)) over its n[t] valid
// queries; -1 past n[t].
pb::array_t<int64_t> kmeans_picks(uint64_t seed, uint64_t step, const std::vector<int64_t>& heads,
                                  const std::vector<int64_t>& n, int64_t count) {
  if (heads.size() != n.size()) throw pb::value_error("kmeans picks: heads and n differ in length");
  if (count < 0) throw pb::value_error("kmeans picks: count must be >= 0");
  const Rng rng(seed);
  pb::array_t<int64_t> out({static_cast<pb::ssize_t>(heads.size()), static_cast<pb::ssize_t>(count)});  // (T, count)
  int64_t* o = out.mutable_data();
  std::vector<int64_t> pick;
  for (size_t x = 0; x < heads.size(); ++x) {
    const int64_t nv = n[x];
    const uint64_t stream = stream_of(step, 1, static_cast<uint64_t>(heads[x]));
    pick.resize(static_cast<size_t>(std::max<int64_t>(nv, 0)));
    std::iota(pick.begin(), pick.end(), int64_t{0});
    for (int64_t t = 0; t < count; ++t) {
      if (t >= nv) {
        o[static_cast<int64_t>(x) * count + t] = -1;
        continue;
      }
      const int64_t j = t + static_cast<int64_t>(rng.below(static_cast<uint64_t>(nv - t), stream, static_cast<uint64_t>(t)));
      std::swap(pick[static_cast<size_t>(t)], pick[static_cast<size_t>(j)]);
      o[static_cast<int64_t>(x) * count + t] = pick[static_cast<size_t>(t)];
    }
  }
  return out;
}

int32_t sample(pb::array_t<float, pb::array::c_style | pb::array::forcecast> logits, uint64_t step,
               const std::vector<int32_t>& history, const SamplingOptions& so) {
  if (logits.ndim() != 1) throw pb::value_error("sample: logits must be 1-D (vocab)");
  try {
    return sample_token(std::span<const float>(logits.data(), static_cast<size_t>(logits.size())), so, step, history);
  } catch (const Error& e) {
    throw pb::value_error(e.what());
  }
}

}  // namespace

void bind_draws(pb::module_& m) {
  m.def("_sample_uniform", [](uint64_t seed, uint64_t step) { return Rng(seed).uniform(step, 0); }, pb::arg("seed"),
        pb::arg("step"), "The uniform number in [0, 1) draw `step` of generation's sampler takes at this seed");
  m.def(
      "_sample_token",
      [](pb::array_t<float, pb::array::c_style | pb::array::forcecast> logits, uint64_t step,
         const std::vector<int32_t>& history, float temperature, int64_t top_k, float top_p, float min_p,
         float repeat_penalty, float frequency_penalty, float presence_penalty, int64_t repeat_last_n, uint64_t seed) {
        SamplingOptions so;
        so.temperature = temperature;
        so.top_k = top_k;
        so.top_p = top_p;
        so.min_p = min_p;
        so.repeat_penalty = repeat_penalty;
        so.frequency_penalty = frequency_penalty;
        so.presence_penalty = presence_penalty;
        so.repeat_last_n = repeat_last_n;
        so.seed = seed;
        return sample(logits, step, history, so);
      },
      pb::arg("logits"), pb::arg("step"), pb::arg("history") = std::vector<int32_t>{}, pb::kw_only(),
      pb::arg("temperature") = 0.f, pb::arg("top_k") = 0, pb::arg("top_p") = 1.f, pb::arg("min_p") = 0.f,
      pb::arg("repeat_penalty") = 1.f, pb::arg("frequency_penalty") = 0.f, pb::arg("presence_penalty") = 0.f,
      pb::arg("repeat_last_n") = 64, pb::arg("seed") = 0,
      "clattn::sample_token on logits (vocab,): the token generation's sampler picks at draw `step`");
  m.def("_lsh_planes", &lsh_planes, pb::arg("seed"), pb::arg("step"), pb::arg("bits"), pb::arg("D"),
        pb::arg("hash_bias"),
        "(planes (bits, D), thresholds (bits,)) float32: the LSH hyperplanes clustered attention hashes "
        "with at this seed and step");
  m.def("_kmeans_picks", &kmeans_picks, pb::arg("seed"), pb::arg("step"), pb::arg("heads"), pb::arg("n"),
        pb::arg("count"),
        "(T, count) int64: per head index b*H+h with n valid queries, the first count positions the Hamming "
        "k-means draws its initial centroids from (-1 past n)");
}

}  // namespace clattn::py
