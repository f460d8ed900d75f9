// The encode pipeline of Tokenizer (see include/clattn/tokenizer.h): added tokens split out of the
// text, normalizer, pre-tokenizer and model per piece, the post-processor's template around.
//
// The BPE merge loop is the one of tokenizers' `Word::merge_all`: symbols in a doubly linked list
// over an array, candidate pairs in a binary heap ordered by (merge rank, position), stale
// candidates dropped when popped. Each merge pushes at most two candidates, so a text of n code
// points costs O(n log n) even when the whole text is a single "word" (no pre-tokenizer, as in the
// Llama family). To keep the heap small and in cache, the text is first cut where the merges
// provably cannot join (before "▁" in Llama vocabularies, see Impl::can_start), which gives the
// same ids: 1.1 MB of tiny-shakespeare encodes in ~60 ms instead of ~240 ms with one heap.
#include <algorithm>
#include <cstdio>

#include "clattn/threads.h"
#include "text/tokenizer_impl.h"
#include "text/unicode.h"

namespace clattn {

using namespace tok;  // NOLINT: this file implements tok's pipeline for Impl
using unicode::utf8_len;

void Tokenizer::Impl::bpe(std::string_view text, std::vector<int32_t>& out, std::vector<uint32_t>* at_out) const {
  if (text.empty()) return;
  if (ignore_merges) {
    if (const int32_t id = model_id(text); id >= 0) {
      out.push_back(id);
      if (at_out) at_out->push_back(0);
      return;
    }
  }
  // Symbols: one per code point (or per byte when byte fallback splits it), linked both ways;
  // at: the byte each starts at (only with at_out).
  std::vector<int32_t> sym, prev, next;
  std::vector<uint32_t> at;
  sym.reserve(text.size());
  bool last_unk = false;
  for (size_t i = 0; i < text.size();) {
    const size_t len = utf8_len(text, i);  // the caller validated the text
    const unsigned char c0 = static_cast<unsigned char>(text[i]);
    const int32_t id = len == 1 ? ascii[c0] : model_id(text.substr(i, len));
    if (id >= 0) {
      sym.push_back(id);
      if (at_out) at.push_back(static_cast<uint32_t>(i));
      last_unk = false;
    } else if (byte_fallback) {
      for (size_t k = i; k < i + len; ++k) {
        const unsigned char b = static_cast<unsigned char>(text[k]);
        if (byte_token[b] < 0) {
          char t[8];
          std::snprintf(t, sizeof t, "<0x%02X>", b);
          bad("byte_fallback needs the token \"", t, "\" for the character ", quoted(text.substr(i, len)),
              " (normalized byte offset ", i, "), but model.vocab lacks it");
        }
        sym.push_back(byte_token[b]);
        if (at_out) at.push_back(static_cast<uint32_t>(k));
      }
      last_unk = false;
    } else {
      if (unk < 0) bad("the character ", quoted(text.substr(i, len)), " is not in model.vocab and there is no unk_token");
      if (!(fuse_unk && last_unk)) {
        sym.push_back(unk);
        if (at_out) at.push_back(static_cast<uint32_t>(i));
      }
      last_unk = true;
    }
    i += len;
  }

  // Cut the text before every symbol that no merge can join to its left (see can_start): each
  // piece is merged on its own with a small heap that stays in cache. The result is the same as
  // one heap over the whole text, since pieces never interact and each keeps its (rank, pos) order.
  const int32_t n = static_cast<int32_t>(sym.size());
  prev.resize(static_cast<size_t>(n));
  next.resize(static_cast<size_t>(n));
  std::vector<int32_t> starts;  // first symbol of each piece
  for (int32_t i = 0; i < n; ++i) {
    const bool cut = i == 0 || can_start[static_cast<size_t>(sym[static_cast<size_t>(i)])];
    if (cut) starts.push_back(i);
    prev[static_cast<size_t>(i)] = cut ? -1 : i - 1;
    next[static_cast<size_t>(i)] = i + 1 < n && !can_start[static_cast<size_t>(sym[static_cast<size_t>(i) + 1])] ? i + 1 : -1;
  }
  struct Cand {
    int32_t rank, pos, new_id;
  };
  // Heap order: the top is the lowest rank, then the leftmost position.
  const auto after = [](const Cand& x, const Cand& y) { return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos; };
  std::vector<Cand> heap;
  const auto push = [&](int32_t pos, int32_t right) {
    if (const MergeRule* r = rule(sym[static_cast<size_t>(pos)], sym[static_cast<size_t>(right)])) {
      heap.push_back({r->rank, pos, r->new_id});
      std::push_heap(heap.begin(), heap.end(), after);
    }
  };
  for (const int32_t first : starts) {
    heap.clear();
    for (int32_t i = first; next[static_cast<size_t>(i)] >= 0; ++i) push(i, i + 1);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), after);
      const Cand c = heap.back();
      heap.pop_back();
      const size_t p = static_cast<size_t>(c.pos);
      if (sym[p] < 0 || next[p] < 0) continue;  // absorbed by a merge, or now last
      const size_t q = static_cast<size_t>(next[p]);
      // Stale unless the pair still merges into the same token (an equal result implies the same
      // pair: a changed neighbour always changes the covered span).
      const MergeRule* r = rule(sym[p], sym[q]);
      if (!r || r->new_id != c.new_id) continue;
      sym[p] = c.new_id;
      sym[q] = -1;
      next[p] = next[q];
      if (next[q] >= 0) prev[static_cast<size_t>(next[q])] = c.pos;
      if (prev[p] >= 0) push(prev[p], c.pos);
      if (next[p] >= 0) push(c.pos, next[p]);
    }
    // A piece's first symbol is never absorbed (a merge keeps the left position).
    for (int32_t i = first; i >= 0; i = next[static_cast<size_t>(i)]) {
      out.push_back(sym[static_cast<size_t>(i)]);
      if (at_out) at_out->push_back(at[static_cast<size_t>(i)]);
    }
  }
}

void Tokenizer::Impl::check_utf8(std::string_view text, const char* what) const {
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_len(text, i);
    if (n == 0) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned>(static_cast<unsigned char>(text[i])));
      fail("tokenizer ", name, ": encode needs valid UTF-8 ", what, ": the byte ", hex, " at offset ", i,
           " does not start a valid character");
    }
    i += n;
  }
}

std::string Tokenizer::Impl::normalize(std::string_view text) const {
  std::string norm(text);
  for (const Step& s : normalizer) {
    if (s.kind == StepKind::Prepend && !norm.empty()) norm.insert(0, s.to);
    if (s.kind == StepKind::Replace) replace_all(norm, s.from, s.to);
    if (s.kind == StepKind::Bert) norm = tok::bert_normalize(norm, s.bert);
  }
  return norm;
}

void Tokenizer::Impl::normalize_aligned(std::string_view text, int64_t base, Aligned& out) const {
  out.text.assign(text);
  out.align.clear();
  out.align.reserve(text.size());
  for (size_t i = 0; i < text.size();) {  // each byte belongs to its whole character
    const size_t n = utf8_len(text, i);
    out.align.insert(out.align.end(), n, {base + static_cast<int64_t>(i), base + static_cast<int64_t>(i + n)});
    i += n;
  }
  Aligned next;
  for (const Step& s : normalizer) {
    if (out.text.empty()) break;
    if (s.kind == StepKind::Prepend) {  // the prefix stands where the first character stands
      out.align.insert(out.align.begin(), s.to.size(), out.align.front());
      out.text.insert(0, s.to);
    } else if (s.kind == StepKind::Replace) {
      if (s.from.empty() || out.text.find(s.from) == std::string::npos) continue;
      // tokenizers removes each match and inserts the content after it: the content takes the
      // alignment of the match's last byte.
      next.text.clear();
      next.align.clear();
      size_t i = 0;
      for (size_t j; (j = out.text.find(s.from, i)) != std::string::npos; i = j + s.from.size()) {
        next.text.append(out.text, i, j - i);
        next.align.insert(next.align.end(), out.align.begin() + static_cast<std::ptrdiff_t>(i),
                          out.align.begin() + static_cast<std::ptrdiff_t>(j));
        next.text.append(s.to);
        next.align.insert(next.align.end(), s.to.size(), out.align[j + s.from.size() - 1]);
      }
      next.text.append(out.text, i, std::string::npos);
      next.align.insert(next.align.end(), out.align.begin() + static_cast<std::ptrdiff_t>(i), out.align.end());
      std::swap(out, next);
    } else if (s.kind == StepKind::Bert) {
      // Every BertNormalizer step maps one code point to zero or more (see bert_normalize), so a
      // character's output is bert_normalize of it alone, aligned where it stood.
      next.text.clear();
      next.align.clear();
      for (size_t i = 0; i < out.text.size();) {
        const size_t n = utf8_len(out.text, i);
        const std::string piece = tok::bert_normalize(std::string_view(out.text).substr(i, n), s.bert);
        next.text += piece;
        next.align.insert(next.align.end(), piece.size(), out.align[i]);
        i += n;
      }
      std::swap(out, next);
    }
  }
}

void Tokenizer::Impl::tokenize_normalized(std::string_view norm, std::vector<int32_t>& out, const Offset* align,
                                          std::vector<Offset>* offsets) const {
  std::vector<uint32_t> starts;  // (ids of one word) the byte of the word each begins at
  // The model over one word; with align (the alignments of the word's first byte onwards, one per
  // byte of its source) each id's offsets. `source` maps a byte of the word to its source byte
  // (the identity but for byte-level pieces, whose characters each stand for one byte).
  const auto model = [&](std::string_view word, const Offset* walign, auto&& source) {
    starts.clear();
    std::vector<uint32_t>* st = walign ? &starts : nullptr;
    if (model_kind == ModelKind::Bpe) {
      bpe(word, out, st);
    } else {
      tok::wordpiece(word, wp_prefix, wp_max_chars, unk, wp_longest, [&](std::string_view w) { return model_id(w); },
                     out, st);
    }
    if (!walign) return;
    for (size_t k = 0; k < starts.size(); ++k) {
      const size_t b = source(starts[k]), e = k + 1 < starts.size() ? source(starts[k + 1]) : source(word.size());
      offsets->push_back({walign[b].first, walign[e - 1].second});
    }
  };
  const auto same = [](size_t b) { return b; };
  switch (pre) {
    case PreTokenizer::None:
      return model(norm, align, same);
    case PreTokenizer::Bert: {
      std::vector<std::string_view> words;  // views into norm
      tok::bert_pre_tokenize(norm, words);
      for (std::string_view w : words) model(w, align ? align + (w.data() - norm.data()) : nullptr, same);
      return;
    }
    case PreTokenizer::ByteLevel: {
      std::vector<std::string> words;  // byte characters: no longer views into norm
      if (!align) {
        tok::byte_level_split(norm, bl_prefix_space, bl_regex, words);
        for (const std::string& w : words) model(w, nullptr, same);
        return;
      }
      // The prefix space of add_prefix_space stands where the first character stands (as a
      // Prepend), so it is put in here, alignments and all.
      std::string spaced;
      std::vector<Offset> spaced_align;
      if (bl_prefix_space && !norm.empty() && norm[0] != ' ') {
        spaced = " ";
        spaced += norm;
        spaced_align.reserve(spaced.size());
        spaced_align.push_back(align[0]);
        spaced_align.insert(spaced_align.end(), align, align + norm.size());
        norm = spaced;
        align = spaced_align.data();
      }
      std::vector<size_t> piece_at;  // (words) the byte of norm each begins at
      tok::byte_level_split(norm, false, bl_regex, words, &piece_at);
      for (size_t w = 0; w < words.size(); ++w) {
        const std::string& word = words[w];
        // A byte of the piece to its source byte: the characters before it, one source byte each.
        std::vector<uint32_t> src(word.size() + 1);  // (bytes of the piece + 1)
        uint32_t c = 0;
        for (size_t i = 0; i < word.size(); ++i) {
          if ((static_cast<unsigned char>(word[i]) & 0xC0) != 0x80 && i > 0) ++c;
          src[i] = c;
        }
        src[word.size()] = c + (word.empty() ? 0 : 1);
        model(word, align + piece_at[w], [&](size_t b) { return static_cast<size_t>(src[b]); });
      }
      return;
    }
  }
}

namespace {

// \w for single_word added tokens: letters, numbers, nonspacing marks and '_' (the regex crate's
// \w also counts other marks and connector punctuation; see tokenizer.h).
bool is_word_char(char32_t c) {
  return c == '_' || (unicode::classes(c) & (unicode::kLetter | unicode::kNumber | unicode::kNonspacingMark));
}

// The code point that ends at byte `end` of valid UTF-8 text.
char32_t cp_before(std::string_view text, size_t end) {
  size_t b = end - 1;
  while (b > 0 && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
  return unicode::next_cp(text, b);
}

}  // namespace

thread_local std::vector<int32_t> tok::AddedTrie::path_;

void tok::AddedTrie::build(const std::vector<std::string>& contents) {
  edges_.clear();
  ends_.assign(1, {});
  for (uint32_t k = 0; k < contents.size(); ++k) {
    int32_t node = 0;
    for (const char c : contents[k]) {
      const auto [it, fresh] = edges_.try_emplace(key(node, static_cast<unsigned char>(c)), static_cast<int32_t>(ends_.size()));
      if (fresh) ends_.emplace_back();
      node = it->second;
    }
    ends_[static_cast<size_t>(node)].push_back(k);
  }
}

void Tokenizer::Impl::split_added(std::string_view text, bool normalized_pass, std::vector<Span>& out) const {
  size_t plain = 0;  // start of the plain text not yet emitted
  for (size_t i = 0; i < text.size();) {
    const int64_t k = added_trie.match(text, i, [&](uint32_t x) {
      const AddedToken& t = added[x];
      if (t.normalized != normalized_pass) return false;
      if (t.single_word) {  // a whole word only: no word character touching either end
        const size_t e = i + t.content.size();
        if (i > 0 && is_word_char(cp_before(text, i))) return false;
        size_t j = e;
        if (e < text.size() && is_word_char(unicode::next_cp(text, j))) return false;
      }
      return true;
    });
    const AddedToken* hit = k >= 0 ? &added[static_cast<size_t>(k)] : nullptr;
    if (!hit) {
      i += utf8_len(text, i);
      continue;
    }
    size_t start = i, end = i + hit->content.size();
    if (hit->lstrip) {  // the token takes the whitespace before it (not past the previous piece)
      while (start > plain) {
        size_t b = start - 1;
        while (b > plain && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
        size_t j = b;
        if (!unicode::is_white_space(unicode::next_cp(text, j))) break;
        start = b;
      }
    }
    if (hit->rstrip)
      for (size_t j = end; j < text.size();) {
        if (!unicode::is_white_space(unicode::next_cp(text, j))) break;
        end = j;
      }
    if (start > plain) out.push_back({plain, start, -1});
    out.push_back({start, end, hit->id});
    plain = i = end;
  }
  if (plain < text.size()) out.push_back({plain, text.size(), -1});
}

void Tokenizer::Impl::tokenize(std::string_view text, bool literal, std::vector<int32_t>& out,
                               std::vector<Offset>* offsets) const {
  // tokenizers' AddedVocabulary: tokens with normalized = false are found in the raw text, the
  // others in each remaining piece once normalized; what is left goes through the model.
  const bool split = !literal && !added.empty();
  if (!offsets) {
    if (!split) return tokenize_normalized(normalize(text), out);
    std::vector<Span> raw, inner;
    split_added(text, false, raw);
    for (const Span& r : raw) {
      if (r.id >= 0) {
        out.push_back(r.id);
        continue;
      }
      const std::string norm = normalize(text.substr(r.start, r.end - r.start));
      inner.clear();
      split_added(norm, true, inner);
      for (const Span& n : inner) {
        if (n.id >= 0) {
          out.push_back(n.id);
        } else {
          tokenize_normalized(std::string_view(norm).substr(n.start, n.end - n.start), out);
        }
      }
    }
    return;
  }
  // The same, the normalized pieces carrying their alignments.
  Aligned a;
  std::vector<Span> raw, inner;
  if (split) split_added(text, false, raw);
  else raw.push_back({0, text.size(), -1});
  for (const Span& r : raw) {
    if (r.id >= 0) {
      out.push_back(r.id);
      offsets->push_back({static_cast<int64_t>(r.start), static_cast<int64_t>(r.end)});
      continue;
    }
    normalize_aligned(text.substr(r.start, r.end - r.start), static_cast<int64_t>(r.start), a);
    inner.clear();
    if (split) split_added(a.text, true, inner);
    else if (!a.text.empty()) inner.push_back({0, a.text.size(), -1});
    for (const Span& n : inner) {
      if (n.id >= 0) {
        out.push_back(n.id);
        offsets->push_back({a.align[n.start].first, a.align[n.end - 1].second});
      } else {
        tokenize_normalized(std::string_view(a.text).substr(n.start, n.end - n.start), out, a.align.data() + n.start,
                            offsets);
      }
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos) const {
  const Impl& t = *impl_;
  t.check_utf8(text, "text");
  std::vector<int32_t> out;
  out.reserve(t.prefix.size() + text.size() / 3 + t.suffix.size() + 2);
  if (add_bos) out.insert(out.end(), t.prefix.begin(), t.prefix.end());
  t.tokenize(text, /*literal=*/true, out);
  out.insert(out.end(), t.suffix.begin(), t.suffix.end());
  return out;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos, int64_t max_length, bool* truncated) const {
  const Impl& t = *impl_;
  t.check_utf8(text, "text");
  const int64_t special = static_cast<int64_t>((add_bos ? t.prefix.size() : 0) + t.suffix.size());
  check(max_length > special, "tokenizer ", t.name, ": max_length ", max_length, " leaves no room for text beside the ",
        special, " special tokens");
  std::vector<int32_t> body;
  t.tokenize(text, /*literal=*/true, body);
  const bool cut = static_cast<int64_t>(body.size()) > max_length - special;
  if (cut) body.resize(static_cast<size_t>(max_length - special));
  if (truncated) *truncated = cut;
  std::vector<int32_t> out;
  out.reserve(body.size() + static_cast<size_t>(special));
  if (add_bos) out.insert(out.end(), t.prefix.begin(), t.prefix.end());
  out.insert(out.end(), body.begin(), body.end());
  out.insert(out.end(), t.suffix.begin(), t.suffix.end());
  return out;
}

Encoding Tokenizer::encoding(std::string_view text, std::optional<std::string_view> pair, bool add_special_tokens,
                             bool literal, bool offsets) const {
  const Impl& t = *impl_;
  t.check_utf8(text, "text");
  if (pair) t.check_utf8(*pair, "pair text");
  Impl::Tokens seq[2];
  seq[0].tracked = seq[1].tracked = offsets;
  t.tokenize(text, literal, seq[0].ids, offsets ? &seq[0].offsets : nullptr);
  if (pair) t.tokenize(*pair, literal, seq[1].ids, offsets ? &seq[1].offsets : nullptr);
  if (t.truncation) {
    const size_t n[2] = {seq[0].ids.size(), seq[1].ids.size()};
    const Impl::Window w = t.truncate(n, pair.has_value(), *t.truncation,
                                      add_special_tokens ? t.special_count(pair.has_value()) : 0, false)[0];
    for (int k = 0; k < 2; ++k) seq[k] = Impl::cut(seq[k], w[static_cast<size_t>(k)]);
  }
  return t.assemble(seq, pair.has_value(), add_special_tokens);
}

namespace {

// The windows [start, stop) of a text of n tokens cut to w, `stride` tokens shared by neighbours,
// first the one truncation keeps (tokenizers' Encoding::truncate): from the start (right) or the
// end (left), each w - stride after the last, until one reaches the other end.
std::vector<std::pair<size_t, size_t>> windows(size_t n, size_t w, size_t stride, bool left) {
  std::vector<std::pair<size_t, size_t>> out;
  if (w >= n) return {{0, n}};
  const size_t step = w - stride;
  if (!left) {
    for (size_t start = 0;; start += step) {
      out.push_back({start, std::min(start + w, n)});
      if (start + w >= n) break;
    }
  } else {
    for (size_t stop = n;; stop -= step) {
      out.push_back({stop > w ? stop - w : 0, stop});
      if (stop <= w) break;
    }
  }
  return out;
}

}  // namespace

std::vector<Tokenizer::Impl::Window> Tokenizer::Impl::truncate(const size_t (&len)[2], bool pair, const Truncation& tr,
                                                               int64_t special, bool overflowing) const {
  check(tr.max_length > special, "tokenizer ", name, ": max_length ", tr.max_length,
        " leaves no room for text beside the ", special, " special tokens");
  const size_t budget = static_cast<size_t>(tr.max_length - special);
  size_t n[2] = {len[0], pair ? len[1] : 0};
  if (n[0] + n[1] <= budget) return {{std::pair{size_t{0}, n[0]}, std::pair{size_t{0}, n[1]}}};
  const size_t excess = n[0] + n[1] - budget;
  if (tr.strategy == TruncationStrategy::longest_first) {
    if (!pair) {
      n[0] = budget;
    } else {
      // The shorter text is kept whole when the longer can make all the room; otherwise each gets
      // half the budget, the odd token going to the text that was longer (the second on ties).
      const int shorter = n[0] > n[1] ? 1 : 0;
      size_t a = n[shorter], b = a > budget ? a : std::max(a, budget - a);
      if (a + b > budget) {
        a = budget / 2;
        b = a + budget % 2;
      }
      n[shorter] = a;
      n[1 - shorter] = b;
    }
  } else {
    const int k = tr.strategy == TruncationStrategy::only_first ? 0 : 1;
    check(k == 0 || pair, "tokenizer ", name, ": truncation only_second needs a text pair");
    check(n[k] > excess, "tokenizer ", name, ": truncation ", k ? "only_second" : "only_first", " must cut ", excess,
          " tokens from a text of ", n[k], ": it is too short to make max_length ", tr.max_length);
    n[k] -= excess;
  }
  // Each text's windows (one, the whole text, when it is not cut); the first pair is the
  // truncated sequence, the others tokenizers' overflowing ones in its order: every later window
  // of the first text with the second's first window and then with each of its later ones, then
  // the first text's first window with each later window of the second.
  std::vector<std::pair<size_t, size_t>> w[2];
  for (int k = 0; k < 2; ++k) {
    const size_t whole = k == 0 || pair ? len[k] : 0;
    if (overflowing && n[k] < whole)
      check(static_cast<size_t>(tr.stride) < n[k], "tokenizer ", name, ": stride ", tr.stride,
            " must be below the ", n[k], " tokens a window of ", k ? "the second" : "the", " text keeps");
    w[k] = overflowing ? windows(whole, n[k], static_cast<size_t>(tr.stride), tr.left)
                       : std::vector<std::pair<size_t, size_t>>{tr.left ? std::pair{whole - std::min(n[k], whole), whole}
                                                                        : std::pair{size_t{0}, std::min(n[k], whole)}};
  }
  std::vector<Window> out{{w[0][0], w[1][0]}};
  for (size_t i = 1; i < w[0].size(); ++i)
    for (size_t j = 0; j < w[1].size(); ++j) out.push_back({w[0][i], w[1][j]});
  for (size_t j = 1; j < w[1].size(); ++j) out.push_back({w[0][0], w[1][j]});
  return out;
}

Tokenizer::Impl::Tokens Tokenizer::Impl::cut(const Tokens& t, std::pair<size_t, size_t> r) {
  const auto at = [](size_t i) { return static_cast<std::ptrdiff_t>(i); };
  Tokens out;
  out.tracked = t.tracked;
  out.ids.assign(t.ids.begin() + at(r.first), t.ids.begin() + at(r.second));
  if (t.tracked) out.offsets.assign(t.offsets.begin() + at(r.first), t.offsets.begin() + at(r.second));
  return out;
}

void Tokenizer::Impl::trim(const std::vector<int32_t>& ids, std::vector<Offset>& offsets) const {
  // tokenizers' byte_level::process_offsets: the spaces ("Ġ" or White_Space) a token starts and
  // ends with are left out of its offsets, but for the single one add_prefix_space put before the
  // first token; spaces are one byte each, so characters and bytes count alike.
  const auto space = [](char32_t c) { return c == tok::kByteLevelSpace || unicode::is_white_space(c); };
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string& tk = tokens[static_cast<size_t>(ids[i])];
    std::vector<char32_t> cps;
    for (size_t j = 0; j < tk.size();) cps.push_back(unicode::next_cp(tk, j));
    int64_t lead = 0, trail = 0;
    while (lead < static_cast<int64_t>(cps.size()) && space(cps[static_cast<size_t>(lead)])) ++lead;
    while (trail < static_cast<int64_t>(cps.size()) && space(cps[cps.size() - 1 - static_cast<size_t>(trail)])) ++trail;
    Offset& o = offsets[i];
    if (lead > 0) {
      if ((i == 0 || o.first == 0) && trim_prefix_space && lead == 1) lead = 0;
      o.first = std::min(o.first + lead, o.second);
    }
    if (trail > 0 && o.second >= trail) o.second = std::max(o.second - trail, o.first);
  }
}

Encoding Tokenizer::Impl::assemble(const Tokens (&seq)[2], bool pair, bool add_special_tokens) const {
  Encoding e;
  assemble(seq, pair, add_special_tokens, e);
  return e;
}

void Tokenizer::Impl::assemble(const Tokens (&seq)[2], bool pair, bool add_special_tokens, Encoding& e) const {
  e.ids.clear();
  e.type_ids.clear();
  e.special_tokens_mask.clear();
  e.sequence_ids.clear();
  e.offsets.clear();
  const bool track = seq[0].tracked;
  std::vector<Offset> trimmed[2];
  if (track && trim_offsets)
    for (int k = 0; k < 2; ++k) {
      trimmed[k] = seq[k].offsets;
      trim(seq[k].ids, trimmed[k]);
    }
  const auto put = [&](int k) {  // text k's ids
    e.ids.insert(e.ids.end(), seq[k].ids.begin(), seq[k].ids.end());
    e.sequence_ids.insert(e.sequence_ids.end(), seq[k].ids.size(), k);
    e.special_tokens_mask.insert(e.special_tokens_mask.end(), seq[k].ids.size(), 0);
    if (!track) return;
    const std::vector<Offset>& o = trim_offsets ? trimmed[k] : seq[k].offsets;
    e.offsets.insert(e.offsets.end(), o.begin(), o.end());
  };
  if (!add_special_tokens) {  // A then B, type ids 0 then 1, as tokenizers without its template
    for (int k = 0; k < (pair ? 2 : 1); ++k) {
      put(k);
      e.type_ids.insert(e.type_ids.end(), seq[k].ids.size(), k);
    }
  } else {
    if (pair && pair_tpl.empty())
      fail("tokenizer ", name, ": encode of a text pair needs post_processor.pair, which the file lacks");
    for (const TemplatePiece& p : pair ? pair_tpl : single_tpl) {
      if (p.seq >= 0) {
        put(p.seq);
        e.type_ids.insert(e.type_ids.end(), seq[p.seq].ids.size(), p.type_id);
        continue;
      }
      e.ids.insert(e.ids.end(), p.ids.begin(), p.ids.end());
      e.type_ids.insert(e.type_ids.end(), p.ids.size(), p.type_id);
      e.sequence_ids.insert(e.sequence_ids.end(), p.ids.size(), -1);
      e.special_tokens_mask.insert(e.special_tokens_mask.end(), p.ids.size(), 1);
      if (track) e.offsets.insert(e.offsets.end(), p.ids.size(), Offset{0, 0});
    }
  }
}

int64_t Tokenizer::Impl::special_count(bool pair) const {
  int64_t n = 0;
  for (const TemplatePiece& p : pair ? pair_tpl : single_tpl)
    if (p.seq < 0) n += static_cast<int64_t>(p.ids.size());
  return n;
}

BatchEncoding Tokenizer::encode_batch(std::span<const std::string> texts, std::span<const std::string> pairs,
                                      const BatchOptions& opt) const {
  const Impl& t = *impl_;
  check(pairs.empty() || pairs.size() == texts.size(), "tokenizer ", t.name, ": encode_batch has ", texts.size(),
        " texts and ", pairs.size(), " pairs (give one pair per text, or none)");
  check(opt.max_length >= 0, "tokenizer ", t.name, ": max_length must be >= 0 (0: no truncation), got ", opt.max_length);
  const bool pair = !pairs.empty();
  const int64_t special = opt.add_special_tokens ? t.special_count(pair) : 0;
  std::optional<Truncation> tr = opt.truncation ? opt.truncation : t.truncation;
  if (opt.max_length > 0) {
    if (!tr) tr = Truncation{};
    tr->max_length = opt.max_length;
  }

  const int64_t N = static_cast<int64_t>(texts.size());
  const bool offsets = opt.offsets != OffsetUnit::none;
  // Texts are independent: the team takes chunks of them (a text's cost varies with its length).
  // A chunk's rows go into flat arrays, and each thread assembles into one Encoding it reuses, so
  // that a batch of short texts allocates per chunk, not five vectors per text kept to the end.
  constexpr int64_t kChunk = 32;
  struct Chunk {
    std::vector<int32_t> ids, type_ids, special;  // its rows' cells one after another
    std::vector<int64_t> offsets;                  // (cells, 2) with opt.offsets
    std::vector<int32_t> lengths, sample;          // (rows)
    int64_t truncated = 0;                         // texts the cut shortened
  };
  std::vector<Chunk> chunks(static_cast<size_t>((N + kChunk - 1) / kChunk));
  auto encode_chunk = [&](int64_t c, Impl::Tokens (&seq)[2], Encoding& e) {
    Chunk& ch = chunks[static_cast<size_t>(c)];
    auto keep = [&](int64_t i) {  // e as the chunk's next row
      if (opt.offsets == OffsetUnit::chars)
        offsets_to_chars(e, texts[static_cast<size_t>(i)],
                         pair ? std::optional<std::string_view>(pairs[static_cast<size_t>(i)]) : std::nullopt);
      ch.ids.insert(ch.ids.end(), e.ids.begin(), e.ids.end());
      ch.type_ids.insert(ch.type_ids.end(), e.type_ids.begin(), e.type_ids.end());
      ch.special.insert(ch.special.end(), e.special_tokens_mask.begin(), e.special_tokens_mask.end());
      for (const auto& [first, second] : e.offsets) {
        ch.offsets.push_back(first);
        ch.offsets.push_back(second);
      }
      ch.lengths.push_back(static_cast<int32_t>(e.ids.size()));
      ch.sample.push_back(static_cast<int32_t>(i));
    };
    for (int64_t i = c * kChunk; i < std::min(N, (c + 1) * kChunk); ++i) {
      const size_t u = static_cast<size_t>(i);
      t.check_utf8(texts[u], "text");
      for (Impl::Tokens& s : seq) {
        s.ids.clear();
        s.offsets.clear();
        s.tracked = offsets;
      }
      t.tokenize(texts[u], opt.literal, seq[0].ids, offsets ? &seq[0].offsets : nullptr);
      if (pair) {
        t.check_utf8(pairs[u], "pair text");
        t.tokenize(pairs[u], opt.literal, seq[1].ids, offsets ? &seq[1].offsets : nullptr);
      }
      if (!tr) {
        t.assemble(seq, pair, opt.add_special_tokens, e);
        keep(i);
        continue;
      }
      const size_t n[2] = {seq[0].ids.size(), seq[1].ids.size()};
      bool cut = false;
      for (const Impl::Window& w : t.truncate(n, pair, *tr, special, opt.overflowing)) {
        const Impl::Tokens parts[2] = {Impl::cut(seq[0], w[0]), Impl::cut(seq[1], w[1])};
        cut |= parts[0].ids.size() + parts[1].ids.size() < n[0] + n[1];
        t.assemble(parts, pair, opt.add_special_tokens, e);
        keep(i);
      }
      ch.truncated += cut;
    }
  };
  const int team = opt.threads > 0 ? opt.threads : max_threads();
  const int64_t C = static_cast<int64_t>(chunks.size());
  FirstError err;
#pragma omp parallel num_threads(team) if (team > 1 && C > 1)
  {
    Impl::Tokens seq[2];  // this thread's, reused text after text
    Encoding e;
#pragma omp for schedule(dynamic, 1)
    for (int64_t c = 0; c < C; ++c) err.run([&] { encode_chunk(c, seq, e); });
  }
  err.rethrow();
  const Padding pad = opt.padding ? *opt.padding : t.padding.value_or(Padding{});
  check(pad.length >= 0 && pad.multiple_of >= 0, "tokenizer ", t.name, ": padding length and multiple must be >= 0");
  BatchEncoding out;
  int64_t T = pad.length;
  std::vector<int64_t> first_row(chunks.size() + 1, 0);  // (chunks + 1) each chunk's first row
  for (size_t c = 0; c < chunks.size(); ++c) {
    for (const int32_t n : chunks[c].lengths) {
      if (pad.length == 0) T = std::max<int64_t>(T, n);
      else check(n <= pad.length, "tokenizer ", t.name, ": a sequence of ", n,
                 " ids is longer than the fixed padding length ", pad.length, " (give max_length)");
    }
    out.lengths.insert(out.lengths.end(), chunks[c].lengths.begin(), chunks[c].lengths.end());
    out.sample.insert(out.sample.end(), chunks[c].sample.begin(), chunks[c].sample.end());
    out.truncated += chunks[c].truncated;
    first_row[c + 1] = first_row[c] + static_cast<int64_t>(chunks[c].lengths.size());
  }
  const int64_t B = first_row.back();
  out.B = B;
  if (pad.multiple_of > 0) T = (T + pad.multiple_of - 1) / pad.multiple_of * pad.multiple_of;
  out.T = T;
  const size_t cells = static_cast<size_t>(B * T);
  out.ids.resize(cells);
  out.type_ids.resize(cells);
  out.attention_mask.resize(cells);
  out.special_tokens_mask.resize(cells);
  if (offsets) out.offsets.resize(2 * cells);
  // Each chunk's rows whole, padding included, so that the team shares the writing.
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1 && C > 1)
  for (int64_t c = 0; c < C; ++c) {
    const Chunk& ch = chunks[static_cast<size_t>(c)];
    int64_t from = 0;  // the row's first cell in the chunk's arrays
    for (size_t r = 0; r < ch.lengths.size(); ++r) {
      const int64_t n = ch.lengths[r], row = (first_row[static_cast<size_t>(c)] + static_cast<int64_t>(r)) * T;
      const int64_t at = row + (pad.left ? T - n : 0);
      const auto row_of = [&](auto& v) { return v.begin() + row; };
      std::fill(row_of(out.ids), row_of(out.ids) + T, pad.pad_id);
      std::fill(row_of(out.type_ids), row_of(out.type_ids) + T, pad.pad_type_id);
      std::fill(row_of(out.attention_mask), row_of(out.attention_mask) + T, 0);
      std::fill(row_of(out.special_tokens_mask), row_of(out.special_tokens_mask) + T, 1);  // padding counts as special, as tokenizers' mask
      std::copy_n(ch.ids.begin() + from, n, out.ids.begin() + at);
      std::copy_n(ch.type_ids.begin() + from, n, out.type_ids.begin() + at);
      std::fill_n(out.attention_mask.begin() + at, n, 1);
      std::copy_n(ch.special.begin() + from, n, out.special_tokens_mask.begin() + at);
      if (offsets) {
        std::fill_n(out.offsets.begin() + 2 * row, 2 * T, 0);
        std::copy_n(ch.offsets.begin() + 2 * from, 2 * n, out.offsets.begin() + 2 * at);
      }
      from += n;
    }
  }
  return out;
}

void offsets_to_chars(Encoding& e, std::string_view text, std::optional<std::string_view> pair) {
  check(e.offsets.size() == e.ids.size() && e.sequence_ids.size() == e.ids.size(),
        "offsets_to_chars needs an Encoding with offsets (encoding(..., offsets = true))");
  // (bytes + 1) of each text: the code points that start before each byte
  std::vector<int64_t> chars[2];
  for (int k = 0; k < 2; ++k) {
    const std::string_view s = k == 0 ? text : pair.value_or(std::string_view{});
    std::vector<int64_t>& c = chars[k];
    c.resize(s.size() + 1);
    int64_t n = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      c[i] = n;
      if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) c[i] = n++;
    }
    c[s.size()] = n;
  }
  for (size_t i = 0; i < e.ids.size(); ++i) {
    const int32_t k = e.sequence_ids[i];
    if (k < 0) continue;
    check(k == 0 || pair, "offsets_to_chars: the Encoding has a pair's ids but no pair text was given");
    const std::vector<int64_t>& c = chars[k];
    auto& [first, second] = e.offsets[i];
    check(first >= 0 && second >= first && second < static_cast<int64_t>(c.size()),
          "offsets_to_chars: offsets [", first, ", ", second, ") lie outside a text of ", c.size() - 1, " bytes");
    first = c[static_cast<size_t>(first)];
    second = c[static_cast<size_t>(second)];
  }
}

}  // namespace clattn
