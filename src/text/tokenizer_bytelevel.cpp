// GPT-2's byte-level steps: the ByteLevel pre-tokenizer (GPT-2's split pattern, written out by hand
// over code point classes) and the ByteLevel decoder. See tokenizer_parts.h.
#include <array>
#include <vector>

#include "text/tokenizer_parts.h"
#include "text/unicode.h"

namespace clattn::tok {
namespace {

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68 bytes
// (controls, space, U+007F..U+00A0, U+00AD) for U+0100.. in byte order, so that every byte is a
// visible character and a BPE vocabulary of strings covers all bytes.
struct ByteChars {
  std::array<std::string, 256> utf8;  // byte -> its character, as UTF-8
  std::array<int, 0x144> byte_of;     // character (< U+0144, all that are used) -> byte, -1 if none
  ByteChars() {
    byte_of.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const char32_t c = self ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
      clattn::unicode::append_utf8(utf8[static_cast<size_t>(b)], c);
      byte_of[c] = b;
    }
  }
};

const ByteChars& byte_chars() {
  static const ByteChars t;
  return t;
}

// The class of a code point as GPT-2's pattern sees it (Oniguruma: \s is White_Space, \p{L} and
// \p{N} the general categories).
enum class Cls { Space, Letter, Number, Other };
Cls cls_of(char32_t c) {
  const unsigned k = clattn::unicode::classes(c);
  if (k & clattn::unicode::kWhiteSpace) return Cls::Space;
  if (k & clattn::unicode::kLetter) return Cls::Letter;
  if (k & clattn::unicode::kNumber) return Cls::Number;
  return Cls::Other;
}

// Splits text by 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ (the
// first alternative that matches at each position, as a backtracking engine takes it); returns
// the byte offsets where pieces start, plus text.size().
std::vector<size_t> gpt2_split(std::string_view text) {
  std::vector<char32_t> cp;     // (n) code points
  std::vector<size_t> off;      // (n + 1) byte offset of each, then text.size()
  for (size_t i = 0; i < text.size();) {
    off.push_back(i);
    cp.push_back(clattn::unicode::next_cp(text, i));
  }
  off.push_back(text.size());
  const size_t n = cp.size();
  std::vector<Cls> cls(n);
  for (size_t i = 0; i < n; ++i) cls[i] = cls_of(cp[i]);
  const auto run = [&](size_t i, Cls k) {  // end of the run of class k starting at i
    while (i < n && cls[i] == k) ++i;
    return i;
  };
  std::vector<size_t> starts;
  for (size_t i = 0; i < n;) {
    starts.push_back(off[i]);
    size_t end = 0;
    if (cp[i] == '\'' && i + 1 < n) {
      const char32_t a = cp[i + 1], b = i + 2 < n ? cp[i + 2] : 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        end = i + 2;
      } else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
        end = i + 3;
      }
    }
    if (end == 0) {
      // ` ?X+` for X = \p{L}, \p{N}, [^\s\p{L}\p{N}]: an optional ' ' joins the run after it.
      const size_t j = cp[i] == ' ' && i + 1 < n && cls[i + 1] != Cls::Space ? i + 1 : i;
      if (cls[j] != Cls::Space) {
        end = run(j, cls[j]);
      } else {
        // \s+(?!\S): the whitespace run less its last character when a non-space follows (that
        // one then starts the next piece, e.g. " word"); \s+ when the run is one character.
        const size_t e = run(i, Cls::Space);
        end = e == n || e - i == 1 ? e : e - 1;
      }
    }
    i = end;
  }
  starts.push_back(text.size());
  return starts;
}

}  // namespace

void byte_level_split(std::string_view text, bool add_prefix_space, bool use_regex, std::vector<std::string>& pieces,
                      std::vector<size_t>* starts_out) {
  std::string spaced;
  const bool spacing = add_prefix_space && !text.empty() && text[0] != ' ';
  if (spacing) {
    spaced = " ";
    spaced += text;
    text = spaced;
  }
  if (text.empty()) return;
  const std::vector<size_t> starts = use_regex ? gpt2_split(text) : std::vector<size_t>{0, text.size()};
  const ByteChars& bc = byte_chars();
  for (size_t k = 0; k + 1 < starts.size(); ++k) {
    std::string p;
    p.reserve(2 * (starts[k + 1] - starts[k]));
    for (size_t i = starts[k]; i < starts[k + 1]; ++i) p += bc.utf8[static_cast<unsigned char>(text[i])];
    pieces.push_back(std::move(p));
    if (starts_out) starts_out->push_back(starts[k]);
  }
}

std::string byte_level_bytes(std::string_view t) {
  const ByteChars& bc = byte_chars();
  std::string mine;
  mine.reserve(t.size());
  for (size_t i = 0; i < t.size();) {
    const char32_t c = clattn::unicode::next_cp(t, i);
    const int b = c < bc.byte_of.size() ? bc.byte_of[c] : -1;
    if (b < 0) return std::string(t);
    mine.push_back(static_cast<char>(b));
  }
  return mine;
}

std::string byte_level_decode(const std::vector<std::string>& tokens) {
  std::string bytes;
  for (const std::string& t : tokens) bytes += byte_level_bytes(t);
  return clattn::unicode::utf8_lossy(bytes);
}

}  // namespace clattn::tok
