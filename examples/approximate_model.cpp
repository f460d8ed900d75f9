// A pretrained model with a cheaper attention plan: stories260k (a LLaMA decoder from
// ../shared/data) on its 200 reference tokens, full attention against causal improved-clustered
// attention in every layer, then a story continued through the KV cache with that plan.
#include <clattn/model.h>
#include <clattn/safetensors.h>
#include <clattn/tokenizer.h>
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

int run(const std::string& dir) {
  auto model = clattn::Decoder::load(dir);
  const auto ids = clattn::SafetensorsFile::open(dir + "/reference_logits.safetensors").get_i32("tokens");
  const int64_t T = static_cast<int64_t>(ids.size()), V = model->config().vocab;

  const clattn::Tensor full = model->forward(ids, 1, T);         // (1, T, vocab) logits
  model->set_attention("improved-clustered:clusters=16,block=64");
  const clattn::Tensor approx = model->forward(ids, 1, T);
  int64_t agree = 0;
  for (int64_t t = 0; t < T; ++t) {
    const float *a = full.data() + t * V, *b = approx.data() + t * V;
    agree += std::max_element(a, a + V) - a == std::max_element(b, b + V) - b;
  }
  std::printf("next-token agreement with full attention: %lld of %lld\n", static_cast<long long>(agree),
              static_cast<long long>(T));

  const auto tok = clattn::Tokenizer::from_file(dir + "/tokenizer.json");
  std::vector<int32_t> story = tok.encode("Once upon a time");
  const auto more = clattn::generate(*model, story, 40, clattn::SamplingOptions{}, tok.eos_id());
  story.insert(story.end(), more.begin(), more.end());
  std::printf("%s\n", tok.decode(story).c_str());
  return 0;
}

int main(int argc, char** argv) {
  // The data folder: the argument, else ../shared/data as seen from the repository root.
  const std::string data = argc > 1 ? argv[1] : "../shared/data";
  try {
    return run(data + "/stories260k");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n(run it from the repository root beside ../shared/data, or give the data "
                 "folder: %s DATA_DIR)\n", argv[0], e.what(), argv[0]);
    return 1;
  }
}
