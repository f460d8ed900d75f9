// Unicode tables of the tokenizers: see unicode.h and scripts/gen_unicode_tables.py.
#include "text/unicode.h"

#include <algorithm>
#include <cstdint>
#include <iterator>

namespace clattn::unicode {
namespace {

struct ClassRange {
  char32_t first, last;
  unsigned bits;
};
struct Mapping {
  char32_t cp;
  char32_t to[3];  // 0-padded: the longest full lowercase mapping is 3 code points (U+0130 has 2)
};
struct Decomposition {
  char32_t cp;
  char32_t to[4];  // 0-padded: the longest full canonical decomposition is 4 code points
};

#include "text/unicode_tables.inc"

// Hangul syllables decompose arithmetically (Unicode §3.12), so the table leaves out 11172 rows.
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = 11172;

template <class T>
const T* find_cp(const T* begin, const T* end, char32_t c) {
  const T* it = std::lower_bound(begin, end, c, [](const T& e, char32_t x) { return e.cp < x; });
  return it != end && it->cp == c ? it : nullptr;
}

}  // namespace

size_t utf8_len(std::string_view s, size_t i) {
  if (i >= s.size()) return 0;
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const size_t avail = s.size() - i;
  const unsigned c = b(0);
  if (c < 0x80) return 1;
  size_t n;
  unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (avail < 2 || b(1) < lo || b(1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (k >= avail || b(k) < 0x80 || b(k) > 0xBF) return 0;
  return n;
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_len(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

char32_t next_cp(std::string_view s, size_t& i) {
  const size_t n = utf8_len(s, i);
  if (n == 0) {  // callers pass valid UTF-8; should one not, step on rather than loop forever
    ++i;
    return 0xFFFD;
  }
  const unsigned char c0 = static_cast<unsigned char>(s[i]);
  char32_t c = n == 1 ? c0 : n == 2 ? c0 & 0x1Fu : n == 3 ? c0 & 0x0Fu : c0 & 0x07u;
  for (size_t k = 1; k < n; ++k) c = c << 6 | (static_cast<unsigned char>(s[i + k]) & 0x3Fu);
  i += n;
  return c;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | c >> 6));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | c >> 12));
    out.push_back(static_cast<char>(0x80 | (c >> 6 & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | c >> 18));
    out.push_back(static_cast<char>(0x80 | (c >> 12 & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c >> 6 & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (const size_t n = utf8_len(s, i); n > 0) {
      out.append(s, i, n);
      i += n;
      continue;
    }
    // A maximal subpart of an ill-formed sequence (Unicode §3.9, what Rust and Python replace
    // with one U+FFFD each): the longest prefix of a valid sequence, at least one byte.
    size_t k = 1;
    const unsigned c = static_cast<unsigned char>(s[i]);
    const size_t need = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 1;
    for (; k < need && i + k < s.size(); ++k) {
      const unsigned b = static_cast<unsigned char>(s[i + k]);
      unsigned lo = 0x80, hi = 0xBF;
      if (k == 1 && c == 0xE0) lo = 0xA0;
      if (k == 1 && c == 0xED) hi = 0x9F;
      if (k == 1 && c == 0xF0) lo = 0x90;
      if (k == 1 && c == 0xF4) hi = 0x8F;
      if (b < lo || b > hi) break;
    }
    out.append("\xEF\xBF\xBD");
    i += k;
  }
  return out;
}

unsigned classes(char32_t c) {
  const auto* end = std::end(kRanges);
  const auto* it = std::upper_bound(std::begin(kRanges), end, c, [](char32_t x, const ClassRange& r) { return x < r.first; });
  if (it == std::begin(kRanges)) return 0;
  --it;
  return c <= it->last ? it->bits : 0;
}

bool is_cjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

void append_lower(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
    return;
  }
  const Mapping* m = find_cp(std::begin(kLower), std::end(kLower), c);
  if (!m) return append_utf8(out, c);
  for (char32_t x : m->to)
    if (x) append_utf8(out, x);
}

void append_nfd(std::string& out, char32_t c) {
  if (c < 0xC0) return append_utf8(out, c);  // nothing below U+00C0 decomposes
  if (c >= kSBase && c < kSBase + kSCount) {
    const char32_t s = c - kSBase;
    append_utf8(out, kLBase + s / kNCount);
    append_utf8(out, kVBase + s % kNCount / kTCount);
    if (s % kTCount) append_utf8(out, kTBase + s % kTCount);
    return;
  }
  const Decomposition* d = find_cp(std::begin(kNfd), std::end(kNfd), c);
  if (!d) return append_utf8(out, c);
  for (char32_t x : d->to)
    if (x) append_utf8(out, x);
}

const char* version() { return kUnicodeVersion; }

}  // namespace clattn::unicode
