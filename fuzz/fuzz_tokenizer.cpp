// tokenizer.json (and tokenizer_config.json): from_json must refuse a malformed file with a
// clattn::Error; a tokenizer it accepts must encode (literally, and as a pair with added tokens
// split out), decode and stream a fixed text safely.
// Input: the tokenizer.json, optionally followed by "\n#config\n" and a tokenizer_config.json.
#include <cstdint>
#include <string_view>

#include "clattn/error.h"
#include "clattn/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace clattn;
  if (size > (1 << 20)) return 0;
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  constexpr std::string_view kSep = "\n#config\n";
  const size_t cut = all.find(kSep);
  const std::string_view json = all.substr(0, cut);
  const std::string_view config = cut == std::string_view::npos ? std::string_view() : all.substr(cut + kSep.size());
  try {
    const Tokenizer t = Tokenizer::from_json(json, "fuzz/tokenizer.json", config);
    for (std::string_view text : {"Once upon a time, there was a little girl.", "", " \n\t\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 x",
                                  "\xff\xfe"}) {
      try {
        const std::vector<int32_t> ids = t.encode(text, true);
        (void)t.decode(ids);
        // The HF-parity path too: added tokens split out, a pair through the template.
        const Encoding e = t.encoding(text, std::string_view("a [MASK] <s></s><|endoftext|> b"));
        (void)t.decode(e.ids, /*skip_special_tokens=*/false);
        int32_t prev = -1;
        for (int32_t id : ids) {
          (void)t.decode_piece(prev, id);
          prev = id;
        }
      } catch (const Error&) {
      }
    }
    const int64_t v = t.vocab_size();
    for (int32_t id : {int32_t{-1}, int32_t{0}, static_cast<int32_t>(v - 1), static_cast<int32_t>(v)}) {
      try {
        (void)t.token(id);
        (void)t.decode_piece(-1, id);
        const int32_t one[1] = {id};
        (void)t.decode(one);
      } catch (const Error&) {
      }
    }
  } catch (const Error&) {
  }
  return 0;
}
