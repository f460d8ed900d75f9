// ListOps pieces shared by the task (listops.cpp) and its tests: the vocabulary, the evaluator,
// the tokenizer of the Nangia/LRA text form and the LRA generator (see include/clattn/data.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "clattn/data.h"
#include "clattn/rng.h"

namespace clattn::listops {

inline constexpr int32_t kPad = 0;
inline constexpr int32_t kDigit0 = 1;  // digits d -> kDigit0 + d
inline constexpr int32_t kMin = 11, kMax = 12, kMed = 13, kSm = 14, kEnd = 15;
inline constexpr int64_t kVocab = 16;
inline constexpr int kMaxDepth = 10, kMaxArgs = 10;
inline constexpr float kLeafProb = 0.75f;

// The token's text ("7", "[MIN", "]", "<pad>").
std::string token_text(int32_t id);

// The value 0..9 of a whole expression (prefix form, operators closed by kEnd). Throws
// clattn::Error naming the token position when the sequence is not exactly one expression.
int evaluate(const int32_t* ids, int64_t n);
inline int evaluate(const std::vector<int32_t>& ids) {
  return evaluate(ids.data(), static_cast<int64_t>(ids.size()));
}

// Space-separated tokens of the text form; "(" and ")" are dropped. Returns false (with `bad` set
// to the offending token) on an unknown token.
bool tokenize(std::string_view text, std::vector<int32_t>& out, std::string& bad);

// A generated expression whose length lies in [min_len, max_len], by rejection; draws from
// (rng, stream) at indices first, first + 1, ... only, so it is a pure function of them. `out` is
// overwritten; returns its label.
int generate(const Rng& rng, uint64_t stream, uint64_t first, int64_t min_len, int64_t max_len,
             std::vector<int32_t>& out);

}  // namespace clattn::listops
