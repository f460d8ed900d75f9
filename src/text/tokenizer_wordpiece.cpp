// BERT's pipeline steps: BertNormalizer, BertPreTokenizer, WordPiece and its decoder (see
// tokenizer_parts.h; each follows the corresponding file of Hugging Face `tokenizers`).
#include <algorithm>

#include "text/tokenizer_parts.h"
#include "text/unicode.h"

namespace clattn::tok {

std::string bert_normalize(std::string_view text, const BertNormalizer& n) {
  namespace u = clattn::unicode;
  // Each step runs over the whole text in tokenizers' order: a lowercase mapping can yield a code
  // point that decomposes (and a decomposition one that lowercases), so the order is part of the
  // result.
  std::string cur;
  cur.reserve(text.size() + text.size() / 4);
  for (size_t i = 0; i < text.size();) {
    const char32_t c = u::next_cp(text, i);
    if (n.clean_text) {
      const bool ctrl = c != '\t' && c != '\n' && c != '\r' && u::is_other(c);
      if (c == 0 || c == 0xFFFD || ctrl) continue;
      if (c == '\t' || c == '\n' || c == '\r' || u::is_white_space(c)) {
        cur.push_back(' ');
        continue;
      }
    }
    if (n.handle_chinese_chars && u::is_cjk(c)) {
      cur.push_back(' ');
      u::append_utf8(cur, c);
      cur.push_back(' ');
      continue;
    }
    u::append_utf8(cur, c);
  }
  if (n.strip_accents) {
    std::string nfd;
    nfd.reserve(cur.size() + cur.size() / 4);
    for (size_t i = 0; i < cur.size();) u::append_nfd(nfd, u::next_cp(cur, i));
    cur.clear();
    for (size_t i = 0; i < nfd.size();) {
      const char32_t c = u::next_cp(nfd, i);
      if (!u::is_mark_nonspacing(c)) u::append_utf8(cur, c);
    }
  }
  if (n.lowercase) {
    std::string low;
    low.reserve(cur.size());
    for (size_t i = 0; i < cur.size();) u::append_lower(low, u::next_cp(cur, i));
    cur = std::move(low);
  }
  return cur;
}

namespace {

bool is_bert_punct(char32_t c) {
  return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126) ||
         clattn::unicode::is_punct(c);
}

}  // namespace

void bert_pre_tokenize(std::string_view text, std::vector<std::string_view>& words) {
  size_t start = std::string_view::npos;  // start of the word being read, npos between words
  for (size_t i = 0; i < text.size();) {
    const size_t at = i;
    const char32_t c = clattn::unicode::next_cp(text, i);
    const bool space = clattn::unicode::is_white_space(c) || c == '\t' || c == '\n' || c == '\r';
    const bool punct = !space && is_bert_punct(c);
    if (space || punct) {
      if (start != std::string_view::npos) words.push_back(text.substr(start, at - start));
      start = std::string_view::npos;
      if (punct) words.push_back(text.substr(at, i - at));
    } else if (start == std::string_view::npos) {
      start = at;
    }
  }
  if (start != std::string_view::npos) words.push_back(text.substr(start));
}

void wordpiece(std::string_view word, std::string_view prefix, int64_t max_chars, int32_t unk, size_t longest,
               const IdOf& id_of, std::vector<int32_t>& out, std::vector<uint32_t>* starts) {
  int64_t chars = 0;
  for (size_t i = 0; i < word.size(); i += clattn::unicode::utf8_len(word, i)) ++chars;
  if (chars > max_chars) {
    out.push_back(unk);
    if (starts) starts->push_back(0);
    return;
  }
  const size_t mark = out.size(), starts_mark = starts ? starts->size() : 0;
  std::string piece;  // prefix + candidate, rebuilt per try: at most `longest` bytes
  for (size_t start = 0; start < word.size();) {
    // The longest candidate any vocab entry can match, ending on a code point's first byte.
    const size_t head = start > 0 ? prefix.size() : 0;
    const size_t room = longest > head ? longest - head : 0;  // bytes a candidate may take
    size_t end = room >= word.size() - start ? word.size() : start + room;
    while (end > start && end < word.size() && (static_cast<unsigned char>(word[end]) & 0xC0) == 0x80) --end;
    int32_t found = -1;
    while (start < end) {
      piece.assign(start > 0 ? prefix : std::string_view{});
      piece.append(word.substr(start, end - start));
      if ((found = id_of(piece)) >= 0) break;
      // Back off one code point: find the start of the last one before end.
      do --end;
      while (end > start && (static_cast<unsigned char>(word[end]) & 0xC0) == 0x80);
    }
    if (found < 0) {  // some part matches nothing: the whole word is unknown
      out.resize(mark);
      out.push_back(unk);
      if (starts) {
        starts->resize(starts_mark);
        starts->push_back(0);
      }
      return;
    }
    out.push_back(found);
    if (starts) starts->push_back(static_cast<uint32_t>(start));
    start = end;
  }
}

namespace {

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  for (size_t i = 0; (i = s.find(from, i)) != std::string::npos; i += to.size()) s.replace(i, from.size(), to);
}

}  // namespace

std::string wordpiece_decode(std::vector<std::string> tokens, std::string_view prefix, bool cleanup) {
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::string& t = tokens[i];
    if (i != 0) {
      if (!prefix.empty() && t.compare(0, prefix.size(), prefix) == 0) {
        t.erase(0, prefix.size());
      } else {
        t = std::string(" ").append(t);  // not insert(0, ...): GCC 12 misreads it (-Wrestrict)
      }
    }
    if (cleanup) {
      // tokenizers' decoders::wordpiece::cleanup, in its order (it runs per token, so only a
      // token's own leading space can take part).
      static constexpr std::pair<std::string_view, std::string_view> kCleanup[] = {
          {" .", "."},     {" ?", "?"},    {" !", "!"},     {" ,", ","},     {" ' ", "'"},   {" n't", "n't"},
          {" 'm", "'m"},   {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
      for (const auto& [from, to] : kCleanup) replace_all(t, from, to);
    }
    out += t;
  }
  return out;
}

}  // namespace clattn::tok
