// Tokenizer on Hugging Face's WordPiece (bert-base-uncased) and byte-level BPE (gpt2) files of
// ../shared/data/tokenizers (skipped without the data, failed in CI). Expected ids are the
// published examples of the data README, and hand derivations read off the files' vocab and
// merges (token strings in the comments: "Ġ" is GPT-2's stand-in for the space byte, "Ċ" for \n,
// "ĉ" for \t, "Âł" the two bytes of U+00A0). python/tests/test_tokenizer_hf.py compares whole
// corpora against reference implementations; this file pins the cases one by one, plus the
// templates, added tokens, decoders, RoBERTa's processor and the errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "clattn/error.h"
#include "clattn/rng.h"
#include "clattn/tokenizer.h"
#include "text/tokenizer_parts.h"
#include "common/data.h"

namespace clattn {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;
using Ids = std::vector<int32_t>;
using testing::data_dir;
using testing::read_file;

std::string load_error(const std::string& text) {
  try {
    Tokenizer::from_json(text, "bad.json");
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

class Gpt2 : public ::testing::Test {
 protected:
  void SetUp() override {
    CLATTN_NEED_DATA("tokenizers/gpt2/tokenizer.json");
    path_ = data_dir() / "tokenizers" / "gpt2" / "tokenizer.json";
    tok_ = std::make_unique<Tokenizer>(Tokenizer::from_file(path_.string()));
  }
  Ids ids(std::string_view s) const { return tok_->encoding(s).ids; }
  fs::path path_;
  std::unique_ptr<Tokenizer> tok_;
};

class Bert : public ::testing::Test {
 protected:
  void SetUp() override {
    CLATTN_NEED_DATA("tokenizers/bert-base-uncased/tokenizer.json");
    path_ = data_dir() / "tokenizers" / "bert-base-uncased" / "tokenizer.json";
    tok_ = std::make_unique<Tokenizer>(Tokenizer::from_file(path_.string()));
  }
  Ids ids(std::string_view s) const { return tok_->encoding(s).ids; }
  fs::path path_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(Gpt2, PublishedExample) {
  EXPECT_THAT(ids("Hello world"), ElementsAreArray(Ids{15496, 995}));  // Hello Ġworld
  EXPECT_EQ(tok_->token(995), "\u0120world");
  EXPECT_EQ(tok_->vocab_size(), 50257);
  EXPECT_THAT(tok_->encode("Hello world"), ElementsAreArray(Ids{15496, 995}));  // nothing added
}

TEST_F(Gpt2, HandDerived) {
  EXPECT_THAT(ids("don't"), ElementsAreArray(Ids{9099, 470}));        // don 't
  EXPECT_THAT(ids("I'll"), ElementsAreArray(Ids{40, 1183}));          // I 'll
  EXPECT_THAT(ids("I'LL"), ElementsAreArray(Ids{40, 6, 3069}));       // I ' LL: contractions are lowercase
  EXPECT_THAT(ids("123456"), ElementsAreArray(Ids{10163, 29228}));    // 123 456
  EXPECT_THAT(ids("a   b"), ElementsAreArray(Ids{64, 220, 220, 275}));  // a Ġ Ġ Ġb: the last space joins b
  EXPECT_THAT(ids("\n\n"), ElementsAreArray(Ids{628}));               // ĊĊ
  EXPECT_THAT(ids("a\tb"), ElementsAreArray(Ids{64, 197, 65}));       // a ĉ b
  EXPECT_THAT(ids("caf\u00e9"), ElementsAreArray(Ids{66, 1878, 2634}));           // c af Ã©
  EXPECT_THAT(ids("cafe\u0301"), ElementsAreArray(Ids{66, 8635, 136, 223}));      // c afe Ì ģ: NFD stays NFD
  EXPECT_THAT(ids("\U0001F600"), ElementsAreArray(Ids{47249, 222}));              // ðŁĺ Ģ
  EXPECT_THAT(ids("\u65e5\u672c"), ElementsAreArray(Ids{33768, 98, 17312, 105}));  // æĹ ¥ æľ ¬
  // U+00A0 and U+3000 are \s for Oniguruma: each is a piece of its own, not joined to "b".
  EXPECT_THAT(ids("a\u00a0b"), ElementsAreArray(Ids{64, 1849, 65}));       // a Âł b
  EXPECT_THAT(ids("a\u3000b"), ElementsAreArray(Ids{64, 5099, 222, 65}));  // a ãĢ Ģ b
  EXPECT_THAT(ids(""), ElementsAreArray(Ids{}));
}

TEST_F(Gpt2, AddedTokenAndDecode) {
  EXPECT_THAT(ids("a<|endoftext|>b"), ElementsAreArray(Ids{64, 50256, 65}));
  EXPECT_NE(tok_->encode("a<|endoftext|>b"), (Ids{64, 50256, 65}));  // the literal form spells it out
  EXPECT_EQ(tok_->decode(Ids{64, 50256, 65}), "ab");
  EXPECT_EQ(tok_->decode(Ids{64, 50256, 65}, /*skip_special_tokens=*/false), "a<|endoftext|>b");
  for (const char* s : {"Hello world", "  lead\n\n\ttabs  ", "caf\u00e9 cafe\u0301 \U0001F600 \u65e5\u672c", "don't I'LL"}) {
    const Ids e = ids(s);
    EXPECT_EQ(tok_->decode(e), s);
    std::string streamed;
    for (size_t i = 0; i < e.size(); ++i) streamed += tok_->decode_piece(i ? e[i - 1] : -1, e[i]);
    EXPECT_EQ(streamed, s);
  }
  // Half a character: the lossy decode gives U+FFFD, as from_utf8_lossy.
  EXPECT_EQ(tok_->decode(Ids{47249}), "\uFFFD");
}

TEST_F(Gpt2, RobertaProcessing) {
  json j = json::parse(read_file(path_));
  j["post_processor"] = {{"type", "RobertaProcessing"}, {"sep", {"<|endoftext|>", 50256}},
                         {"cls", {"<|endoftext|>", 50256}}, {"trim_offsets", true}, {"add_prefix_space", false}};
  const Tokenizer t = Tokenizer::from_json(j.dump(), "roberta.json");
  EXPECT_THAT(t.encoding("Hello world").ids, ElementsAreArray(Ids{50256, 15496, 995, 50256}));
  const Encoding e = t.encoding("Hello", std::string_view("world"));
  EXPECT_THAT(e.ids, ElementsAreArray(Ids{50256, 15496, 50256, 50256, 6894, 50256}));  // world without Ġ
  EXPECT_THAT(e.type_ids, ElementsAreArray(Ids{0, 0, 0, 0, 0, 0}));
  // Llama 3 style: a Sequence of ByteLevel and the processor that adds tokens gives the same.
  json seq = j;
  seq["post_processor"] = {{"type", "Sequence"},
                           {"processors", json::array({json{{"type", "ByteLevel"}, {"trim_offsets", false}},
                                                       j["post_processor"]})}};
  const Tokenizer s = Tokenizer::from_json(seq.dump(), "sequence.json");
  EXPECT_THAT(s.encoding("Hello", std::string_view("world")).ids, ElementsAreArray(e.ids));
  seq["post_processor"]["processors"].push_back(j["post_processor"]);
  EXPECT_THAT(load_error(seq.dump()), HasSubstr("post_processor.processors[2]: a second processor"));
  j["pre_tokenizer"]["add_prefix_space"] = true;  // RoBERTa-style files: " world" then
  const Tokenizer spaced = Tokenizer::from_json(j.dump(), "roberta.json");
  EXPECT_THAT(spaced.encoding("world", std::nullopt, false).ids, ElementsAreArray(Ids{995}));
}

TEST_F(Bert, PublishedExamples) {
  EXPECT_THAT(ids("i like strawberries"), ElementsAreArray(Ids{101, 1045, 2066, 13137, 20968, 102}));
  EXPECT_THAT(tok_->encoding("unaffable", std::nullopt, false).ids, ElementsAreArray(Ids{14477, 20961, 3468}));
  EXPECT_EQ(tok_->token(14477), "una");
  EXPECT_EQ(tok_->token(20961), "##ffa");
  EXPECT_EQ(tok_->token(3468), "##ble");
}

// Cut to max_length as Hugging Face truncates one sequence: the text's tokens shortened, [CLS] and
// [SEP] kept (transformers: tokenizer("i like strawberries", truncation=True, max_length=4)).
TEST_F(Bert, TruncationKeepsTheSpecialTokens) {
  bool cut = true;
  EXPECT_THAT(tok_->encode("i like strawberries", true, 6, &cut), ElementsAreArray(Ids{101, 1045, 2066, 13137, 20968, 102}));
  EXPECT_FALSE(cut);
  EXPECT_THAT(tok_->encode("i like strawberries", true, 4, &cut), ElementsAreArray(Ids{101, 1045, 2066, 102}));
  EXPECT_TRUE(cut);
  EXPECT_THAT(tok_->encode("i like strawberries", true, 3, &cut), ElementsAreArray(Ids{101, 1045, 102}));
  EXPECT_THROW(tok_->encode("i like", true, 2, &cut), Error);  // no room beside [CLS] [SEP]
}

// encode_batch: padded to the longest with [PAD] = 0 on the right, masks beside; a pair cut
// LongestFirst (transformers: tokenizer("i like strawberries", "hello", truncation=True, max_length=7)).
TEST_F(Bert, EncodeBatchPadsAndMasks) {
  const std::vector<std::string> texts{"i like strawberries", "hello"};
  const BatchEncoding b = tok_->encode_batch(texts);
  ASSERT_EQ(b.B, 2);
  ASSERT_EQ(b.T, 6);
  EXPECT_THAT(b.ids, ElementsAreArray(Ids{101, 1045, 2066, 13137, 20968, 102, 101, 7592, 102, 0, 0, 0}));
  EXPECT_THAT(b.attention_mask, ElementsAreArray(Ids{1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0}));
  EXPECT_THAT(b.special_tokens_mask, ElementsAreArray(Ids{1, 0, 0, 0, 0, 1, 1, 0, 1, 1, 1, 1}));
  const std::vector<std::string> a{"i like strawberries"}, p{"hello"};
  BatchOptions o;
  o.max_length = 7;
  o.padding = Padding{.multiple_of = 8, .left = true};
  const BatchEncoding c = tok_->encode_batch(a, p, o);
  EXPECT_THAT(c.ids, ElementsAreArray(Ids{0, 101, 1045, 2066, 13137, 102, 7592, 102}));
  EXPECT_THAT(c.type_ids, ElementsAreArray(Ids{0, 0, 0, 0, 0, 0, 1, 1}));
  EXPECT_EQ(c.truncated, 1);
  EXPECT_EQ(tok_->token_to_id("[MASK]"), 103);
  EXPECT_EQ(tok_->token_to_id("not a token"), -1);
}

// The lengths tokenizers' truncate_encodings gives a pair at max_length 7 (its own unit test:
// texts of 0, 2, 4 and 8 tokens), on the byte tokenizer (one token a byte, no special tokens).
TEST(Truncation, PairLengthsAsTokenizers) {
  const Tokenizer t = Tokenizer::bytes();
  const std::map<int, std::string> text{{0, ""}, {2, "ab"}, {4, "cdef"}, {8, "ghijklmn"}};
  // {first, second} -> {first kept, second kept}
  const std::map<std::pair<int, int>, std::pair<int, int>> want{
      {{0, 0}, {0, 0}}, {{0, 2}, {0, 2}}, {{0, 4}, {0, 4}}, {{0, 8}, {0, 7}}, {{2, 0}, {2, 0}}, {{2, 2}, {2, 2}},
      {{2, 4}, {2, 4}}, {{2, 8}, {2, 5}}, {{4, 0}, {4, 0}}, {{4, 2}, {4, 2}}, {{4, 4}, {3, 4}}, {{4, 8}, {3, 4}},
      {{8, 0}, {7, 0}}, {{8, 2}, {5, 2}}, {{8, 4}, {4, 3}}, {{8, 8}, {3, 4}}};
  BatchOptions o;
  o.max_length = 7;
  for (const auto& [in, kept] : want) {
    const std::vector<std::string> a{text.at(in.first)}, b{text.at(in.second)};
    const BatchEncoding e = t.encode_batch(a, b, o);
    int n0 = 0, n1 = 0;
    for (int64_t i = 0; i < e.lengths[0]; ++i) (e.type_ids[static_cast<size_t>(i)] ? n1 : n0) += 1;
    EXPECT_EQ(std::make_pair(n0, n1), kept) << in.first << " + " << in.second;
    EXPECT_EQ(e.truncated, in.first + in.second > 7 ? 1 : 0);
  }
}

// Strategies and direction: only_first / only_second cut that text alone, left cuts from the start.
TEST(Truncation, StrategiesAndDirection) {
  const Tokenizer t = Tokenizer::bytes();
  const auto run = [&](std::string a, std::string b, Truncation tr) {
    BatchOptions o;
    o.truncation = tr;
    const bool single = b.empty();
    const std::vector<std::string> x{std::move(a)}, y{std::move(b)};
    const BatchEncoding e = single ? t.encode_batch(x, {}, o) : t.encode_batch(x, y, o);
    return std::string(e.ids.begin(), e.ids.begin() + e.lengths[0]);
  };
  EXPECT_EQ(run("abcdefgh", "", {.max_length = 5}), "abcde");
  EXPECT_EQ(run("abcdefgh", "", {.max_length = 5, .left = true}), "defgh");
  EXPECT_EQ(run("abcdef", "xyz", {.max_length = 5, .strategy = TruncationStrategy::only_first}), "abxyz");
  EXPECT_EQ(run("abc", "uvwxyz", {.max_length = 5, .strategy = TruncationStrategy::only_second}), "abcuv");
  EXPECT_EQ(run("abc", "uvwxyz", {.max_length = 5, .strategy = TruncationStrategy::only_second, .left = true}), "abcyz");
  EXPECT_EQ(run("abcdef", "uvwxyz", {.max_length = 7, .left = true}), "defwxyz");  // 3 + 4, the tails
  // only_first cannot make room from a text of 2 when 4 must go; only_second needs a pair.
  EXPECT_THAT([&] { run("ab", "uvwxyz", {.max_length = 4, .strategy = TruncationStrategy::only_first}); },
              ThrowsMessage<Error>(HasSubstr("only_first must cut 4 tokens from a text of 2")));
  BatchOptions o;
  o.truncation = Truncation{.max_length = 3, .strategy = TruncationStrategy::only_second};
  const std::vector<std::string> one{"abcdef"};
  EXPECT_THAT([&] { t.encode_batch(one, {}, o); }, ThrowsMessage<Error>(HasSubstr("only_second needs a text pair")));
}

// Overflowing windows as tokenizers' Encoding::truncate makes them: its own case (5 tokens cut to
// 4 with stride 2: 1 2 3 4, then 3 4 5), from the left, and every combination for a cut pair.
TEST(Truncation, OverflowingWindows) {
  const Tokenizer t = Tokenizer::bytes();
  const auto rows = [&](std::vector<std::string> a, std::vector<std::string> b, Truncation tr) {
    BatchOptions o;
    o.truncation = tr;
    o.overflowing = true;
    const BatchEncoding e = t.encode_batch(a, b, o);
    std::vector<std::string> out;
    for (int64_t r = 0; r < e.B; ++r)
      out.push_back(std::to_string(e.sample[static_cast<size_t>(r)]) + ":" +
                    std::string(e.ids.begin() + r * e.T, e.ids.begin() + r * e.T + e.lengths[static_cast<size_t>(r)]));
    EXPECT_EQ(e.truncated, std::count_if(a.begin(), a.end(), [&](const std::string& x) {
                return static_cast<int64_t>(x.size()) > tr.max_length;
              }));  // the single texts' cuts
    return out;
  };
  using S = std::vector<std::string>;
  EXPECT_EQ(rows({"abcde"}, {}, {.max_length = 4, .stride = 2}), (S{"0:abcd", "0:cde"}));
  EXPECT_EQ(rows({"abcde", "xy", "abcdefgh"}, {}, {.max_length = 3}), (S{"0:abc", "0:de", "1:xy", "2:abc", "2:def", "2:gh"}));
  EXPECT_EQ(rows({"abcde"}, {}, {.max_length = 4, .left = true, .stride = 2}), (S{"0:bcde", "0:abc"}));
  EXPECT_EQ(rows({"abcdefgh"}, {}, {.max_length = 3, .left = true}), (S{"0:fgh", "0:cde", "0:ab"}));
  // A pair cut to 3 + 3 with stride 1: windows abc cde ef and uvw wxy yz, combined in tokenizers' order.
  BatchOptions o;
  o.truncation = Truncation{.max_length = 6, .stride = 1};
  o.overflowing = true;
  const std::vector<std::string> a{"abcdef"}, b{"uvwxyz"};
  const BatchEncoding e = t.encode_batch(a, b, o);
  S got;
  for (int64_t r = 0; r < e.B; ++r)
    got.push_back(std::string(e.ids.begin() + r * e.T, e.ids.begin() + r * e.T + e.lengths[static_cast<size_t>(r)]));
  EXPECT_EQ(got, (S{"abcuvw", "cdeuvw", "cdewxy", "cdeyz", "efuvw", "efwxy", "efyz", "abcwxy", "abcyz"}));
  EXPECT_EQ(e.truncated, 1);
  // A stride that leaves a window no new token is refused; nothing cut, nothing added.
  o.truncation = Truncation{.max_length = 6, .stride = 3};
  EXPECT_THAT([&] { t.encode_batch(a, b, o); }, ThrowsMessage<Error>(HasSubstr("stride 3 must be below the 3 tokens")));
  EXPECT_EQ(rows({"abc"}, {}, {.max_length = 3, .stride = 2}), (S{"0:abc"}));
}

// The file's truncation section: read, applied by encoding() and encode_batch as tokenizers'
// encode applies it, max_length overriding its length; bad sections are named.
TEST_F(Bert, TheFilesTruncationSectionIsHonoured) {
  std::ifstream in(path_);
  json j = json::parse(in);
  j["truncation"] = {{"direction", "Left"}, {"max_length", 5}, {"strategy", "LongestFirst"}, {"stride", 2}};
  const Tokenizer t = Tokenizer::from_json(j.dump(), "truncating.json");
  ASSERT_TRUE(t.truncation().has_value());
  EXPECT_EQ(t.truncation()->max_length, 5);
  EXPECT_TRUE(t.truncation()->left);
  EXPECT_EQ(t.truncation()->stride, 2);
  // i like strawberries = 1045 2066 13137 20968: the last 3 beside [CLS] [SEP].
  EXPECT_THAT(t.encoding("i like strawberries").ids, ElementsAreArray(Ids{101, 2066, 13137, 20968, 102}));
  const std::vector<std::string> texts{"i like strawberries", "hello"};
  const BatchEncoding b = t.encode_batch(texts);
  EXPECT_THAT(b.ids, ElementsAreArray(Ids{101, 2066, 13137, 20968, 102, 101, 7592, 102, 0, 0}));
  EXPECT_EQ(b.truncated, 1);
  BatchOptions o;
  o.max_length = 4;  // the length over the section, still from the left
  EXPECT_THAT(t.encode_batch(texts, {}, o).ids, ElementsAreArray(Ids{101, 13137, 20968, 102, 101, 7592, 102, 0}));
  EXPECT_THAT(t.encode("i like strawberries"), ElementsAreArray(Ids{101, 1045, 2066, 13137, 20968, 102}));  // not cut
  for (const auto& [bad, why] : std::vector<std::pair<json, std::string>>{
           {{{"max_length", 0}}, "truncation.max_length must be an integer >= 1"},
           {{{"max_length", 8}, {"strategy", "Shortest"}}, "truncation.strategy must be"},
           {{{"max_length", 8}, {"direction", "Up"}}, "truncation.direction must be"},
           {{{"max_length", 8}, {"stride", 8}}, "truncation.stride must be an integer in [0, max_length)"},
           {json::array(), "truncation must be an object or null"}}) {
    j["truncation"] = bad;
    EXPECT_THAT([&] { Tokenizer::from_json(j.dump(), "bad.json"); }, ThrowsMessage<Error>(HasSubstr(why))) << bad.dump();
  }
}

TEST_F(Bert, HandDerived) {
  const auto plain = [&](std::string_view s) { return tok_->encoding(s, std::nullopt, false).ids; };
  EXPECT_THAT(plain("Don't"), ElementsAreArray(Ids{2123, 1005, 1056}));     // don ' t
  EXPECT_THAT(plain("I'LL"), ElementsAreArray(Ids{1045, 1005, 2222}));      // i ' ll
  EXPECT_THAT(plain("123456"), ElementsAreArray(Ids{13138, 19961, 2575}));  // 123 ##45 ##6
  EXPECT_THAT(plain("a   b\n\nc\td"), ElementsAreArray(Ids{1037, 1038, 1039, 1040}));
  EXPECT_THAT(plain("caf\u00e9"), ElementsAreArray(Ids{7668}));   // cafe: accents stripped
  EXPECT_THAT(plain("cafe\u0301"), ElementsAreArray(Ids{7668}));  // NFD gives the same
  EXPECT_THAT(plain("\U0001F600"), ElementsAreArray(Ids{100}));   // [UNK]
  EXPECT_THAT(plain("\u65e5\u672c\u8a9e"), ElementsAreArray(Ids{1864, 1876, 1950}));  // 日 本 語, split
  EXPECT_THAT(plain(std::string(100, 'a')), ::testing::Not(ElementsAreArray(Ids{100})));
  EXPECT_THAT(plain(std::string(101, 'a')), ElementsAreArray(Ids{100}));  // over 100 chars
  EXPECT_THAT(plain("a\u00a0b\u3000c"), ElementsAreArray(Ids{1037, 1038, 1039}));
  EXPECT_THAT(plain("Hello, World!"), ElementsAreArray(Ids{7592, 1010, 2088, 999}));
}

TEST_F(Bert, PairsAndAddedTokens) {
  const Encoding e = tok_->encoding("i like", std::string_view("strawberries"));
  EXPECT_THAT(e.ids, ElementsAreArray(Ids{101, 1045, 2066, 102, 13137, 20968, 102}));
  EXPECT_THAT(e.type_ids, ElementsAreArray(Ids{0, 0, 0, 0, 1, 1, 1}));
  const Encoding raw = tok_->encoding("i like", std::string_view("strawberries"), false);
  EXPECT_THAT(raw.ids, ElementsAreArray(Ids{1045, 2066, 13137, 20968}));
  EXPECT_THAT(raw.type_ids, ElementsAreArray(Ids{0, 0, 1, 1}));
  // [MASK] is not normalized: found in the raw text, while "[mask]" is five pieces.
  EXPECT_THAT(tok_->encoding("i [MASK] it", std::nullopt, false).ids, ElementsAreArray(Ids{1045, 103, 2009}));
  EXPECT_THAT(tok_->encoding("[mask]", std::nullopt, false).ids, ElementsAreArray(Ids{1031, 7308, 1033}));
  EXPECT_THAT(tok_->encoding("i [MASK]", std::nullopt, false, /*literal=*/true).ids,
              ElementsAreArray(Ids{1045, 1031, 7308, 1033}));
}

// Each BertNormalizer switch on its own, ids read off the vocab: "caf" 24689 exists but "##é" does
// not, so an unstripped "café" is [UNK] 100; "cafe" 7668, "hello" 7592, no "H"; "ab" 11113;
// "日" 1864, "本" 1876, "##本" 30402.
TEST_F(Bert, NormalizerSwitches) {
  const json good = json::parse(read_file(path_));
  const auto with = [&](const char* key, json value) {
    json j = good;
    j["normalizer"][key] = std::move(value);
    return Tokenizer::from_json(j.dump(), "switches.json");
  };
  const auto plain = [](const Tokenizer& t, std::string_view s) { return t.encoding(s, std::nullopt, false).ids; };
  const Tokenizer keep_accents = with("strip_accents", false);
  EXPECT_THAT(plain(keep_accents, "caf\u00e9"), ElementsAreArray(Ids{100}));
  EXPECT_THAT(plain(keep_accents, "CAFE"), ElementsAreArray(Ids{7668}));
  const Tokenizer cased = with("lowercase", false);  // strip_accents null follows: no stripping
  EXPECT_THAT(plain(cased, "hello"), ElementsAreArray(Ids{7592}));
  EXPECT_THAT(plain(cased, "Hello"), ElementsAreArray(Ids{100}));
  EXPECT_THAT(plain(cased, "cafe\u0301"), ElementsAreArray(Ids{100}));
  json j = good;
  j["normalizer"]["lowercase"] = false;
  j["normalizer"]["strip_accents"] = true;
  EXPECT_THAT(plain(Tokenizer::from_json(j.dump(), "switches.json"), "caf\u00e9"), ElementsAreArray(Ids{7668}));
  EXPECT_THAT(plain(*tok_, std::string("a\0b", 3)), ElementsAreArray(Ids{11113}));  // NUL dropped
  EXPECT_THAT(plain(with("clean_text", false), std::string("a\0b", 3)), ElementsAreArray(Ids{100}));
  EXPECT_THAT(plain(*tok_, "\u65e5\u672c"), ElementsAreArray(Ids{1864, 1876}));
  EXPECT_THAT(plain(with("handle_chinese_chars", false), "\u65e5\u672c"), ElementsAreArray(Ids{1864, 30402}));
}

// Older BERT files carry BertProcessing instead of the template: the same ids and type ids.
TEST_F(Bert, BertProcessing) {
  json j = json::parse(read_file(path_));
  j["post_processor"] = {{"type", "BertProcessing"}, {"sep", {"[SEP]", 102}}, {"cls", {"[CLS]", 101}}};
  const Tokenizer t = Tokenizer::from_json(j.dump(), "bert_processing.json");
  for (const auto& [a, b] : {std::pair{"i like", "strawberries"}, std::pair{"", "x"}}) {
    const Encoding want = tok_->encoding(a, std::string_view(b)), got = t.encoding(a, std::string_view(b));
    EXPECT_THAT(got.ids, ElementsAreArray(want.ids));
    EXPECT_THAT(got.type_ids, ElementsAreArray(want.type_ids));
    EXPECT_THAT(t.encoding(a).ids, ElementsAreArray(tok_->encoding(a).ids));
  }
}

TEST_F(Bert, Decode) {
  EXPECT_EQ(tok_->decode(ids("i like strawberries")), "i like strawberries");
  EXPECT_EQ(tok_->decode(ids("unaffable")), "unaffable");
  EXPECT_EQ(tok_->decode(ids("Hello, World!")), "hello, world!");  // cleanup: " ," and " !"
  EXPECT_EQ(tok_->decode(ids("i like"), false), "[CLS] i like [SEP]");
  const Ids e = ids("Hello, unaffable world!");
  std::string streamed;
  for (size_t i = 0; i < e.size(); ++i) streamed += tok_->decode_piece(i ? e[i - 1] : -1, e[i]);
  EXPECT_EQ(streamed, tok_->decode(e));
}

TEST_F(Bert, InvalidUtf8IsAnError) {
  for (const std::string bad : {"\xFF", "ab\xC3", "\xED\xA0\x80"}) {
    try {
      tok_->encoding(bad);
      ADD_FAILURE() << "encoded invalid UTF-8";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("UTF-8"));
    }
  }
  EXPECT_THROW(tok_->encoding("ok", std::string_view("\xFF")), Error);
}

TEST_F(Bert, MalformedFiles) {
  const json good = json::parse(read_file(path_));
  const auto with = [&](auto edit) {
    json j = good;
    edit(j);
    return load_error(j.dump());
  };
  const auto expect = [](const std::string& msg, const std::string& part) {
    EXPECT_THAT(msg, HasSubstr("bad.json"));
    EXPECT_THAT(msg, HasSubstr(part));
  };
  EXPECT_EQ(load_error(good.dump()), "");
  expect(with([](json& j) { j["model"].erase("unk_token"); }), "model.unk_token");
  expect(with([](json& j) { j["model"]["unk_token"] = "[NOPE]"; }), "not in model.vocab");
  expect(with([](json& j) { j["model"]["max_input_chars_per_word"] = -1; }), "max_input_chars_per_word");
  expect(with([](json& j) { j["model"]["continuing_subword_prefix"] = 3; }), "continuing_subword_prefix");
  expect(with([](json& j) { j["normalizer"]["lowercase"] = "yes"; }), "normalizer.lowercase");
  expect(with([](json& j) { j["normalizer"]["type"] = "NFKC"; }), "\"NFKC\" is not supported");
  expect(with([](json& j) { j["pre_tokenizer"]["type"] = "Whitespace"; }), "pre_tokenizer \"Whitespace\"");
  expect(with([](json& j) { j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"use_regex", 1}}; }), "pre_tokenizer.use_regex");
  expect(with([](json& j) { j["decoder"]["cleanup"] = 1; }), "decoder.cleanup");
  expect(with([](json& j) { j["post_processor"]["pair"][3]["Sequence"]["id"] = "C"; }), "post_processor.pair[3]");
  expect(with([](json& j) { j["post_processor"]["special_tokens"]["[SEP]"]["ids"] = {40000}; }), "[SEP]");
  expect(with([](json& j) { j["post_processor"]["single"][1]["Sequence"]["type_id"] = -2; }), "type_id");
  expect(with([](json& j) { j["post_processor"]["single"][1]["Sequence"]["type_id"] = uint64_t{1} << 40; }),
         "type_id 1099511627776 is past the largest token type id");
  expect(with([](json& j) { j["post_processor"] = {{"type", "RobertaProcessing"}, {"sep", {"[SEP]", 99999}}, {"cls", {"[CLS]", 101}}}; }),
         "post_processor.sep id 99999 is out of range");
  expect(with([](json& j) { j["added_tokens"][0]["lstrip"] = "no"; }), "added_tokens[0].lstrip");
  // Without a pair template, a pair is an Error at encode time.
  json j = good;
  j["post_processor"].erase("pair");
  const Tokenizer t = Tokenizer::from_json(j.dump(), "bad.json");
  EXPECT_THROW(t.encoding("a", std::string_view("b")), Error);
}

// Added-token options on a small WordPiece file written here (no real file uses them).
TEST(TokenizerHf, AddedTokenOptions) {
  json vocab = {{"[UNK]", 0}, {"a", 1}, {"b", 2}, {"x", 3}};
  const auto make = [&](bool single_word, bool lstrip, bool rstrip) {
    json added = json::array({json{{"id", 4}, {"content", "<m>"}, {"single_word", single_word}, {"lstrip", lstrip},
                                   {"rstrip", rstrip}, {"normalized", false}, {"special", true}}});
    json j = {{"model", {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"vocab", vocab}}},
              {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
              {"added_tokens", added}};
    return Tokenizer::from_json(j.dump(), "options.json");
  };
  const auto enc = [](const Tokenizer& t, std::string_view s) { return t.encoding(s, std::nullopt, false).ids; };
  // Not split out, "<m>" is three words (< and > are punctuation), each [UNK].
  EXPECT_THAT(enc(make(false, false, false), "a<m>b"), ElementsAreArray(Ids{1, 4, 2}));
  EXPECT_THAT(enc(make(true, false, false), "a<m>b"), ElementsAreArray(Ids{1, 0, 0, 0, 2}));  // inside a word
  EXPECT_THAT(enc(make(true, false, false), "a <m> b"), ElementsAreArray(Ids{1, 4, 2}));
  EXPECT_THAT(enc(make(false, true, true), "a  <m>  b"), ElementsAreArray(Ids{1, 4, 2}));
  EXPECT_EQ(make(false, false, false).decode(Ids{1, 4, 2}, false), "a <m> b");
}

// WordPiece looks up no candidate longer than the longest vocab entry: the same pieces as the
// greedy search from the word's end (longest = every length), in O(length · longest) lookups, so a
// file's max_input_chars_per_word cannot make a long word cubic (8000 characters: 32 M lookups of
// up to 8 kB each before).
TEST(TokenizerHf, WordPieceLookupsAreLinearInTheWord) {
  const std::map<std::string, int32_t> vocab = {{"[UNK]", 0}, {"a", 1}, {"##a", 2}, {"ab", 3}, {"##b", 4},
                                                {"##ab", 5}, {"b", 6}, {"\xc3\xa9", 7}, {"##\xc3\xa9" "a", 8}};
  int64_t calls = 0;
  const tok::IdOf id_of = [&](std::string_view w) {
    ++calls;
    const auto it = vocab.find(std::string(w));
    return it == vocab.end() ? -1 : it->second;
  };
  size_t longest = 0;
  for (const auto& [t, id] : vocab) longest = std::max(longest, t.size());
  Rng r(5);
  const char* parts[] = {"a", "b", "\xc3\xa9", "c"};  // c is in no entry: such words are [UNK]
  for (int w = 0; w < 300; ++w) {
    std::string word;
    const int64_t n = 1 + static_cast<int64_t>(r.below(12, 0, static_cast<uint64_t>(w)));
    for (int64_t i = 0; i < n; ++i) word += parts[r.below(w % 5 == 0 ? 4 : 3, 1, static_cast<uint64_t>(w * 64 + i))];
    std::vector<int32_t> fast, plain;
    tok::wordpiece(word, "##", 1000, 0, longest, id_of, fast);
    tok::wordpiece(word, "##", 1000, 0, SIZE_MAX, id_of, plain);
    EXPECT_EQ(fast, plain) << word;
  }
  const std::string word(8000, 'a');
  std::vector<int32_t> out;
  calls = 0;
  tok::wordpiece(word, "##", 100000, 0, longest, id_of, out);
  ASSERT_EQ(out.size(), 8000u);
  EXPECT_EQ(out[0], 1);
  EXPECT_EQ(out[7999], 2);
  EXPECT_LE(calls, static_cast<int64_t>(longest) * 8000);
  // Through a file that allows such words.
  json v = json::object();
  for (const auto& [t, id] : vocab) v[t] = id;
  const json j = {{"model", {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"vocab", v}, {"max_input_chars_per_word", 1000000}}},
                  {"pre_tokenizer", {{"type", "BertPreTokenizer"}}}};
  const std::vector<int32_t> ids = Tokenizer::from_json(j.dump(), "long.json").encoding(std::string(64000, 'a'), std::nullopt, false).ids;
  ASSERT_EQ(ids.size(), 64000u);
  EXPECT_EQ(ids[1], 2);
}

// The added tokens are found by one trie walk per position: longest first, file order within a
// length, the caller's conditions falling back to shorter ones; as many steps as the longest
// content that matches there, whatever the number of tokens sharing a first byte (10^5 such tokens
// took 0.42 ms per byte of text by a scan of them at every position).
TEST(TokenizerHf, AddedTokensAreOneTrieWalkPerPosition) {
  tok::AddedTrie trie;
  trie.build({"ab", "abc", "a", "abc", "b"});
  const auto all = [](uint32_t) { return true; };
  EXPECT_EQ(trie.match("abcd", 0, all), 1);
  EXPECT_EQ(trie.match("abcd", 0, [](uint32_t k) { return k != 1; }), 3);
  EXPECT_EQ(trie.match("abcd", 0, [](uint32_t k) { return k != 1 && k != 3; }), 0);
  EXPECT_EQ(trie.match("abcd", 0, [](uint32_t k) { return k == 2; }), 2);
  EXPECT_EQ(trie.match("abcd", 2, all), -1);
  EXPECT_EQ(trie.match("abcd", 1, all), 4);
  const auto name = [](int k) {  // "x1000kk" (GCC 12 warns falsely on "x" + std::string)
    std::string s(1, 'x');
    s += std::to_string(100000 + k);
    return s;
  };
  std::vector<std::string> many;
  for (int k = 0; k < 100000; ++k) many.push_back(name(k));
  trie.build(many);
  std::string text;
  while (text.size() < 40000) text += "xx x1x 123 ";
  text += "x100042";
  int64_t steps = 0, found = -1;
  for (size_t i = 0; i < text.size(); ++i) found = std::max(found, trie.match(text, i, all, &steps));
  EXPECT_EQ(found, 42);
  EXPECT_LE(steps, static_cast<int64_t>(2 * text.size()));
  // Through a file: 20000 added tokens sharing their first byte, split out of a 40 kB text.
  json added = json::array();
  for (int k = 0; k < 20000; ++k)
    added.push_back({{"id", 4 + k}, {"content", name(k)}, {"single_word", false},
                     {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", true}});
  const json j = {{"model", {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"vocab", {{"[UNK]", 0}, {"x", 1}, {"##x", 2}, {"1", 3}}}}},
                  {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
                  {"added_tokens", added}};
  const Tokenizer t = Tokenizer::from_json(j.dump(), "many.json");
  std::string body;
  while (body.size() < 40000) body += "xx 1 ";
  const std::vector<int32_t> ids = t.encoding(body + "x100007 x", std::nullopt, false).ids;
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids[ids.size() - 2], 4 + 7);
  EXPECT_EQ(ids.back(), 1);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 2);
}

}  // namespace
}  // namespace clattn
