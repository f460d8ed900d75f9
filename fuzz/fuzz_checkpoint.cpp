// Checkpoints: a folder with config.json and model.safetensors loaded as a Decoder (LLaMA) or an
// Encoder (BERT, KWT), then one short forward. Loading must refuse missing, misshapen or
// mistyped weights with a clattn::Error. Input: a 4-byte little-endian length, that many bytes of
// config.json, then model.safetensors.
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "clattn/error.h"
#include "clattn/model.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace clattn;
  if (size < 4 || size > (8 << 20)) return 0;
  const uint32_t n = static_cast<uint32_t>(data[0]) | static_cast<uint32_t>(data[1]) << 8 |
                     static_cast<uint32_t>(data[2]) << 16 | static_cast<uint32_t>(data[3]) << 24;
  if (n > size - 4) return 0;
  const std::string& dir = fuzz::scratch_dir();
  fuzz::write_file(dir + "/config.json", std::string_view(reinterpret_cast<const char*>(data + 4), n));
  fuzz::write_file(dir + "/model.safetensors",
                   std::string_view(reinterpret_cast<const char*>(data + 4 + n), size - 4 - n));
  ModelConfig cfg;
  try {
    cfg = read_model_config(dir + "/config.json");
  } catch (const Error&) {
    return 0;
  }
  // Three tokens (ids below the vocabulary; the forward refuses others) or one clip of features.
  const int32_t top = static_cast<int32_t>(std::min<int64_t>(std::max<int64_t>(cfg.vocab, 1), 3));
  const std::vector<int32_t> tokens{0, 1 % top, 2 % top};
  try {
    if (cfg.model_type == "llama") {
      auto dec = Decoder::load(dir);
      (void)dec->forward(tokens, 1, 3);
    } else {
      auto enc = Encoder::load(dir);
      const ModelConfig& c = enc->config();
      if (c.input_dim > 0) {
        if (c.num_patches * c.input_dim <= (1 << 16)) {
          Tensor feats(Shape{1, c.num_patches, c.input_dim});  // zeros
          (void)enc->forward_features(feats.view());
        }
      } else {
        (void)enc->forward_tokens(tokens, 1, 3);
      }
    }
  } catch (const Error&) {
  }
  return 0;
}
