// The context shift on a decoder's cache (Decoder::shift, generate's rotate and reencode shifts):
// a one-layer LLaMA, whose cached keys and values depend only on each token and its position,
// computes after a shift exactly what a fresh prefill of the window computes (up to the rounding
// of one more rotation), for full and local attention, grouped heads, f32 and 16-bit caches, and
// causal clustered attention (its derived state rebuilt from the moved rows); GPT-2's learned
// positions are refused with the reason, and generate's shifts keep the tokens before the first
// shift. stories260k's multi-layer shift is held to a float64 NumPy statement of llama.cpp's in
// python/tests/test_generate.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "clattn/error.h"
#include "clattn/model.h"

namespace clattn {
namespace {

ModelConfig one_layer_llama() {
  ModelConfig c;
  c.kind = ModelKind::llama;
  c.model_type = "llama";
  c.hidden = 64;
  c.layers = 1;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.ffn = 96;
  c.vocab = 97;
  c.max_positions = 400;
  return c;
}

std::unique_ptr<Decoder> decoder(const ModelConfig& c, uint64_t seed) {
  std::unique_ptr<Model> m = Model::create(c, TaskKind::lm, seed);
  auto* d = dynamic_cast<Decoder*>(m.get());
  EXPECT_NE(d, nullptr);
  (void)m.release();
  return std::unique_ptr<Decoder>(d);
}

std::vector<int32_t> tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    t[static_cast<size_t>(i)] = static_cast<int32_t>((static_cast<uint64_t>(i) * 2654435761u + seed * 40503u) % static_cast<uint64_t>(vocab));
  return t;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

// One layer: shift(keep, discard) then steps give the logits of a prefill of the window then the
// same steps. Shifts that start in, end at and cross the 64-key panels; keep 0; a shift of all
// but the kept tokens.
TEST(ContextShift, OneLayerEqualsAPrefillOfTheWindow) {
  const ModelConfig c = one_layer_llama();
  auto dec = decoder(c, 11);
  auto fresh = decoder(c, 11);
  const std::vector<int32_t> seq = tokens(300, c.vocab, 3);
  struct Case {
    const char* plan;
    KVCacheType cache;
    int64_t n, keep, discard;
    double tol;
  };
  const std::vector<Case> cases = {
      {"full", KVCacheType::f32, 300, 1, 149, 1e-6},   {"full", KVCacheType::f32, 130, 0, 64, 1e-6},
      {"full", KVCacheType::f32, 65, 3, 61, 1e-6},     {"full", KVCacheType::f32, 200, 5, 1, 1e-6},
      {"local:window=32", KVCacheType::f32, 300, 1, 100, 1e-6},
      {"full", KVCacheType::f16, 300, 1, 149, 3e-6},   {"full", KVCacheType::bf16, 130, 2, 70, 3e-5},
      {"improved-clustered:clusters=8,topk=16,block=32,segment=64", KVCacheType::f32, 300, 1, 120, 1e-6},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(::testing::Message() << k.plan << " " << kv_cache_type_name(k.cache) << " n " << k.n << " keep "
                                      << k.keep << " discard " << k.discard);
    for (Decoder* d : {dec.get(), fresh.get()}) {
      d->set_attention(k.plan);
      d->set_kv_cache(k.cache);
      d->start(c.max_positions);
    }
    (void)dec->prefill(std::span<const int32_t>(seq.data(), static_cast<size_t>(k.n)));
    dec->shift(k.keep, k.discard);
    EXPECT_EQ(dec->position(), k.n - k.discard);
    std::vector<int32_t> window(seq.begin(), seq.begin() + k.keep);
    window.insert(window.end(), seq.begin() + k.keep + k.discard, seq.begin() + k.n);
    (void)fresh->prefill(window);
    // The rows held are the window's: a 16-bit cache rounds the rotated keys once more, which a
    // fresh cache does not (its bound is that rounding through the layer).
    for (const int32_t next : {5, 17, 42}) {
      const std::vector<float> got = dec->step(next), want = fresh->step(next);
      EXPECT_LE(max_diff(got, want), k.tol) << "after a step of " << next;
    }
  }
}

// Two layers keep what the dropped tokens left in the second layer's keys and values: no longer a
// prefill of the window, so the shift is not a disguised re-encode.
TEST(ContextShift, DeeperLayersKeepTheDroppedTokensInView) {
  ModelConfig c = one_layer_llama();
  c.layers = 2;
  auto dec = decoder(c, 12);
  auto fresh = decoder(c, 12);
  const std::vector<int32_t> seq = tokens(200, c.vocab, 4);
  dec->start(c.max_positions);
  fresh->start(c.max_positions);
  (void)dec->prefill(seq);
  dec->shift(1, 99);
  std::vector<int32_t> window(seq.begin(), seq.begin() + 1);
  window.insert(window.end(), seq.begin() + 100, seq.end());
  (void)fresh->prefill(window);
  EXPECT_GT(max_diff(dec->step(7), fresh->step(7)), 1e-3);
}

TEST(ContextShift, RefusalsNameTheReason) {
  auto dec = decoder(one_layer_llama(), 13);
  auto says = [](auto&& f, const std::string& what) {
    try {
      f();
      ADD_FAILURE() << "not refused: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  says([&] { dec->shift(0, 1); }, "call start() and prefill() before shift()");
  dec->start(64);
  const std::vector<int32_t> seq = tokens(20, 97, 5);
  (void)dec->prefill(seq);
  says([&] { dec->shift(0, 0); }, "discard >= 1");
  says([&] { dec->shift(-1, 3); }, "keep >= 0");
  says([&] { dec->shift(10, 11); }, "within the 20 cached positions");
  EXPECT_EQ(dec->position(), 20);  // refused shifts leave the cache as it was
  EXPECT_TRUE(dec->can_shift());

  ModelConfig g = one_layer_llama();
  g.model_type = "gpt2";
  g.kv_heads = g.heads;
  g.tie_embeddings = true;
  g.gelu_tanh = true;
  auto gpt2 = decoder(g, 14);
  EXPECT_FALSE(gpt2->can_shift());
  gpt2->start(64);
  (void)gpt2->prefill(seq);
  says([&] { gpt2->shift(1, 5); }, "learned absolute positions");
  GenerateControl control;
  control.context_shift = ContextShift::rotate;
  control.keep = 1;
  g.max_positions = 32;
  auto small = decoder(g, 14);
  const std::vector<int32_t> prompt = tokens(4, 97, 6);
  says([&] { (void)generate(*small, prompt, 40, SamplingOptions{}, -1, {}, nullptr, control); },
       "use the reencode shift");
  // auto falls back to the reencode shift for learned positions.
  control.context_shift = ContextShift::automatic;
  GenerateStats st;
  EXPECT_EQ(generate(*small, prompt, 40, SamplingOptions{}, -1, {}, &st, control).size(), 40u);
  EXPECT_EQ(st.shifted_by, ContextShift::reencode);
  EXPECT_GE(st.shifts, 1);

  EXPECT_EQ(parse_context_shift("Rotate"), ContextShift::rotate);
  EXPECT_EQ(parse_context_shift("auto"), ContextShift::automatic);
  EXPECT_THROW(parse_context_shift("shift"), Error);
  EXPECT_THROW(parse_context_shift(""), Error);
}

// generate's rotate shift: the tokens before the first shift are those of a run that never
// shifts, each shift is one Decoder::shift then a step (no prefill), and the whole run equals a
// loop of start/prefill/step/shift written here from the documented rule.
TEST(ContextShift, GenerateRotatesAsTheDocumentedLoop) {
  ModelConfig c = one_layer_llama();
  c.layers = 2;
  c.max_positions = 64;
  auto dec = decoder(c, 15);
  const std::vector<int32_t> prompt = tokens(6, c.vocab, 7);
  GenerateControl control;
  control.context_shift = ContextShift::rotate;
  control.keep = 2;
  GenerateStats st;
  const std::vector<int32_t> out = generate(*dec, prompt, 150, SamplingOptions{}, -1, {}, &st, control);
  ASSERT_EQ(out.size(), 150u);
  EXPECT_EQ(st.shifted_by, ContextShift::rotate);
  EXPECT_EQ(st.steps, 149);  // every token after the first is a step, shifts included
  const std::vector<int32_t> plain = generate(*dec, prompt, 58, SamplingOptions{}, -1);
  EXPECT_TRUE(std::equal(plain.begin(), plain.end(), out.begin()));

  auto argmax = [](const std::vector<float>& l) {
    return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
  };
  dec->start(c.max_positions);
  std::vector<float> logits = dec->prefill(prompt);
  std::vector<int32_t> loop;
  int64_t shifts = 0;
  double context = 0;
  while (true) {
    const int32_t next = argmax(logits);
    loop.push_back(next);
    if (loop.size() == out.size()) break;
    if (dec->position() == c.max_positions) {
      dec->shift(control.keep, (c.max_positions - control.keep) / 2);
      ++shifts;
    }
    context += static_cast<double>(dec->position());
    logits = dec->step(next);
  }
  EXPECT_EQ(loop, out);
  EXPECT_EQ(shifts, st.shifts);
  EXPECT_DOUBLE_EQ(st.mean_context, context / 149);  // what the GB/s figure of a step is taken at
}

}  // namespace
}  // namespace clattn
