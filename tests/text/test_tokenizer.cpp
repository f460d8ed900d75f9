// Tokenizer: the real stories260k tokenizer.json against its reference generation (decode of the 200
// reference ids, encode of the reference text), hand-checked strings (ids from an independent
// llama2.c-style score-based encoder run on vocab.json), a short O(n^2) reference BPE beside the
// fast merge loop over every line of tiny-shakespeare, streaming pieces, the BOS / EOS
// configuration, and every malformed file or argument the loader and the API must refuse.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "clattn/error.h"
#include "clattn/tokenizer.h"
#include "common/data.h"

namespace clattn {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using Ids = std::vector<int32_t>;

using testing::data_dir;
using testing::read_file;

// The stories260k tokenizer and its reference story (skipped without the data, failed in CI).
class Stories : public ::testing::Test {
 protected:
  void SetUp() override {
    CLATTN_NEED_DATA("stories260k/tokenizer.json", "stories260k/reference_greedy_200.txt");
    dir_ = data_dir() / "stories260k";
    tok_ = std::make_unique<Tokenizer>(Tokenizer::from_file((dir_ / "tokenizer.json").string()));
    json_text_ = read_file(dir_ / "tokenizer.json");
    // reference_greedy_200.txt: "# ..." comment, "# token ids:", one line of ids, "# decoded:", then
    // the decoded text, which the file ends with one newline that is not part of it.
    const std::string ref = read_file(dir_ / "reference_greedy_200.txt");
    const std::string ids_tag = "# token ids:\n", text_tag = "# decoded:\n";
    const size_t a = ref.find(ids_tag), b = ref.find(text_tag);
    ASSERT_NE(a, std::string::npos);
    ASSERT_NE(b, std::string::npos);
    std::istringstream is(ref.substr(a + ids_tag.size(), b - a - ids_tag.size()));
    for (int32_t x; is >> x;) ref_ids_.push_back(x);
    ref_text_ = ref.substr(b + text_tag.size());
    ASSERT_EQ(ref_ids_.size(), 200u);
    ASSERT_FALSE(ref_text_.empty());
    ASSERT_EQ(ref_text_.back(), '\n');
    ref_text_.pop_back();
  }
  const Tokenizer& tok() const { return *tok_; }

  fs::path dir_;
  std::unique_ptr<Tokenizer> tok_;
  std::string json_text_, ref_text_;
  Ids ref_ids_;
};

TEST_F(Stories, Basics) {
  EXPECT_EQ(tok().vocab_size(), 512);
  EXPECT_EQ(tok().bos_id(), 1);
  EXPECT_EQ(tok().eos_id(), 2);
  EXPECT_EQ(tok().token(0), "<unk>");
  EXPECT_EQ(tok().token(13), "<0x0A>");
  EXPECT_EQ(tok().token(403), "\u2581Once");
  EXPECT_EQ(tok().token(511), "\u200a");
}

TEST_F(Stories, DecodeReference) {
  EXPECT_EQ(tok().decode(ref_ids_), ref_text_);
  Ids with_bos{1};
  with_bos.insert(with_bos.end(), ref_ids_.begin(), ref_ids_.end());
  EXPECT_EQ(tok().decode(with_bos), ref_text_);  // BOS is special: skipped
}

// README (scripts/make_tokenizer.py) states the greedy ids are the canonical tokenization of the
// text, so HF's encode(text) is exactly [BOS] + ids, not just some tokenization that decodes back.
TEST_F(Stories, EncodeReference) {
  Ids want{1};
  want.insert(want.end(), ref_ids_.begin(), ref_ids_.end());
  EXPECT_THAT(tok().encode(ref_text_), ElementsAreArray(want));
  EXPECT_THAT(tok().encode(ref_text_, /*add_bos=*/false), ElementsAreArray(ref_ids_));
  EXPECT_EQ(tok().decode(tok().encode(ref_text_)), ref_text_);
}

// Expected ids from a llama2.c-style encoder (highest-score pair first) over vocab.json: a
// different algorithm that the README says agrees with HF's rank order on this vocab.
TEST_F(Stories, HandChecked) {
  EXPECT_THAT(tok().encode(""), ElementsAreArray(Ids{1}));
  EXPECT_THAT(tok().encode("", false), ElementsAreArray(Ids{}));
  EXPECT_THAT(tok().encode(" "), ElementsAreArray(Ids{1, 410, 410}));  // "▁▁" is not a token
  EXPECT_THAT(tok().encode("  "), ElementsAreArray(Ids{1, 410, 410, 410}));
  EXPECT_THAT(tok().encode("Hello world"), ElementsAreArray(Ids{1, 346, 306, 414, 263, 304, 341}));
  EXPECT_THAT(tok().encode("Once upon a time"), ElementsAreArray(Ids{1, 403, 407, 261, 378}));
  EXPECT_THAT(tok().encode("a\n\nb"), ElementsAreArray(Ids{1, 261, 13, 13, 430}));
  for (const char* s : {"", " ", "  ", "Hello world", "a\n\nb", " lead and trail "})
    EXPECT_EQ(tok().decode(tok().encode(s)), s) << s;
}

// é is a vocab character; 日本 and the emoji are not, so they become their UTF-8 bytes.
TEST_F(Stories, NonAsciiUsesByteFallback) {
  const std::string s = "Caf\u00e9\n\u65e5\u672c \U0001F642";
  const Ids want{1, 410, 457, 412, 431, 485, 13, 233, 154, 168, 233, 159, 175, 410, 243, 162, 156, 133};
  EXPECT_THAT(tok().encode(s), ElementsAreArray(want));
  EXPECT_EQ(tok().token(233), "<0xE6>");
  EXPECT_EQ(tok().decode(want), s);
  const std::string mixed = "\u00e9t\u00e9 \u00fcber na\u00efve \u2014 \u201cquoted\u201d\t\r\n\U0001F600!";
  EXPECT_EQ(tok().decode(tok().encode(mixed)), mixed);
}

// Special tokens in the text are plain characters for encode(text, add_bos) and encoding(...,
// literal = true); encoding() splits them out as tokenizers does (see tokenizer.h).
TEST_F(Stories, SpecialTokensInTextAreLiteral) {
  const Ids ids = tok().encode("<s></s><unk>");
  EXPECT_THAT(ids, ElementsAreArray(Ids{1, 410, 504, 419, 505, 504, 492, 419, 505, 504, 379, 433, 505}));
  EXPECT_EQ(tok().decode(ids), "<s></s><unk>");
  EXPECT_THAT(tok().encoding("<s></s><unk>", std::nullopt, true, /*literal=*/true).ids, ElementsAreArray(ids));
  EXPECT_THAT(tok().encoding("<s></s><unk>").ids, ElementsAreArray(Ids{1, 1, 2, 0}));
  // Each piece between added tokens is normalized on its own, so each gets the "▁" prefix.
  EXPECT_THAT(tok().encoding("Once<s>Once").ids, ElementsAreArray(Ids{1, 403, 1, 403}));
}

TEST_F(Stories, DecodeSkipsSpecialsAndReplacesBadBytes) {
  EXPECT_EQ(tok().decode(Ids{1, 403, 2}), "Once");
  EXPECT_EQ(tok().decode(Ids{}), "");
  // A byte run that is not UTF-8 decodes to one U+FFFD per byte, as tokenizers' ByteFallback.
  EXPECT_EQ(tok().decode(Ids{233, 154, 403}), "\uFFFD\uFFFD Once");
  EXPECT_EQ(tok().decode(Ids{403, 233, 154, 168}), "Once\u65e5");
  // Only the first leading space is stripped, once, for the whole sequence.
  EXPECT_EQ(tok().decode(Ids{410, 410, 403}), "  Once");
  EXPECT_EQ(tok().decode(Ids{35, 403}), " Once");  // <0x20> then "▁Once": the byte space goes
}

TEST_F(Stories, StreamingPiecesConcatenateToDecode) {
  const auto stream = [&](const Ids& ids) {
    std::string s;
    int32_t prev = -1;
    for (int32_t id : ids) {
      s += tok().decode_piece(prev, id);
      prev = id;
    }
    return s;
  };
  const Ids ref = tok().encode(ref_text_);
  EXPECT_EQ(stream(ref), tok().decode(ref));
  EXPECT_EQ(stream(ref_ids_), tok().decode(ref_ids_));
  const Ids hello = tok().encode("Hello world, said the \"little\" dog.\nThe end.");
  EXPECT_EQ(stream(hello), tok().decode(hello));
  // Byte pieces are raw bytes, so a character split over pieces still concatenates exactly.
  const Ids uni = tok().encode("x \u65e5\u672c\U0001F642 y");
  EXPECT_EQ(stream(uni), tok().decode(uni));
  EXPECT_EQ(tok().decode_piece(403, 233), "\xE6");
  EXPECT_EQ(tok().decode_piece(1, 403), "Once");
  EXPECT_EQ(tok().decode_piece(-1, 403), "Once");
  EXPECT_EQ(tok().decode_piece(261, 403), " Once");
  EXPECT_EQ(tok().decode_piece(403, 1), "");
  EXPECT_EQ(tok().decode_piece(403, 13), "\n");
}

// The short, obviously right HF BPE: code points (bytes for unknown ones), then repeatedly merge the
// leftmost pair of lowest rank, rescanning the whole list each time.
class ReferenceBpe {
 public:
  explicit ReferenceBpe(const json& root) {
    for (const auto& [t, id] : root["model"]["vocab"].items()) vocab_[t] = id.get<int32_t>();
    int32_t rank = 0;
    for (const json& m : root["model"]["merges"]) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      rank_[{s.substr(0, sp), s.substr(sp + 1)}] = rank++;
    }
  }
  Ids encode(const std::string& text) const {
    std::string norm;
    if (!text.empty()) norm = "\u2581";
    for (char c : text) norm += c == ' ' ? std::string("\u2581") : std::string(1, c);
    std::vector<std::string> sym;
    for (size_t i = 0; i < norm.size();) {
      const unsigned char c = static_cast<unsigned char>(norm[i]);
      const size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
      const std::string ch = norm.substr(i, n);
      if (vocab_.count(ch)) {
        sym.push_back(ch);
      } else {
        for (char b : ch) {
          char t[8];
          std::snprintf(t, sizeof t, "<0x%02X>", static_cast<unsigned char>(b));
          sym.push_back(t);
        }
      }
      i += n;
    }
    for (;;) {
      size_t best = sym.size();
      int32_t best_rank = 0;
      for (size_t i = 0; i + 1 < sym.size(); ++i) {
        auto it = rank_.find({sym[i], sym[i + 1]});
        if (it != rank_.end() && (best == sym.size() || it->second < best_rank)) best = i, best_rank = it->second;
      }
      if (best == sym.size()) break;
      sym[best] += sym[best + 1];
      sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
    Ids out{1};
    for (const std::string& s : sym) out.push_back(vocab_.at(s));
    return out;
  }

 private:
  std::map<std::string, int32_t> vocab_;
  std::map<std::pair<std::string, std::string>, int32_t> rank_;
};

TEST_F(Stories, MatchesReferenceBpe) {
  CLATTN_NEED_DATA("tinyshakespeare/input.txt");
  const ReferenceBpe ref(json::parse(json_text_));
  EXPECT_THAT(tok().encode(ref_text_), ElementsAreArray(ref.encode(ref_text_)));
  const fs::path shakespeare = data_dir() / "tinyshakespeare" / "input.txt";
  std::istringstream lines(read_file(shakespeare));
  int checked = 0;
  for (std::string line; std::getline(lines, line); ++checked)
    ASSERT_THAT(tok().encode(line), ElementsAreArray(ref.encode(line))) << "line " << checked << ": " << line;
  EXPECT_GT(checked, 30000);
  for (const std::string s : {"the the the", "aaaaaaaaaaaaaaaa", "\u00e9\u00e9\u00e9 \u65e5\u00e9\u65e5",
                              "  x  y   z ", "Lily's mom's \"friend\" \u2014 wow\u2026"})
    EXPECT_THAT(tok().encode(s), ElementsAreArray(ref.encode(s))) << s;
}

// The fast path cuts the text before characters that no merge can join leftwards ("▁" here). Give
// the vocab a merge across a space, ranked first, and it must stop cutting there and still match.
TEST_F(Stories, MergeAcrossSpaceDisablesCuts) {
  CLATTN_NEED_DATA("tinyshakespeare/input.txt");
  json root = json::parse(json_text_);
  root["model"]["vocab"]["e\u2581t"] = 512;
  root["model"]["merges"].insert(root["model"]["merges"].begin(), "e \u2581t");
  const Tokenizer t = Tokenizer::from_json(root.dump(), "cross.json");
  const ReferenceBpe ref(root);
  const Ids ids = t.encode("the tall tree");
  EXPECT_THAT(ids, ElementsAreArray(ref.encode("the tall tree")));
  EXPECT_NE(std::find(ids.begin(), ids.end(), 512), ids.end());
  EXPECT_EQ(t.decode(ids), "the tall tree");
  std::istringstream lines(read_file(data_dir() / "tinyshakespeare" / "input.txt"));
  int n = 0;
  for (std::string line; std::getline(lines, line); ++n) {
    if (n % 4 == 0) {
      ASSERT_THAT(t.encode(line), ElementsAreArray(ref.encode(line))) << "line " << n << ": " << line;
    }
  }
}

// The whole 1.1 MB file as one text (one BPE "word": no pre-tokenizer) round-trips.
TEST_F(Stories, ShakespeareRoundTrip) {
  CLATTN_NEED_DATA("tinyshakespeare/input.txt");
  const std::string text = read_file(data_dir() / "tinyshakespeare" / "input.txt");
  ASSERT_GT(text.size(), 1000000u);
  const Ids ids = tok().encode(text);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_LT(ids.size(), text.size() * 2 / 3);  // the merges did compress (165 story-tuned merges: not much)
  EXPECT_EQ(tok().decode(ids), text);
}

// The same vocab with merges as [left, right] pairs gives the same tokenizer.
TEST_F(Stories, PairMergesFormat) {
  json root = json::parse(json_text_);
  json pairs = json::array();
  for (const json& m : root["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    pairs.push_back({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  root["model"]["merges"] = pairs;
  const Tokenizer t = Tokenizer::from_json(root.dump(), "pairs.json");
  EXPECT_EQ(t.encode(ref_text_), tok().encode(ref_text_));
}

TEST_F(Stories, Config) {
  // No config and the file's template: BOS, no EOS.
  const Tokenizer plain = Tokenizer::from_json(json_text_, "t.json");
  EXPECT_THAT(plain.encode("a"), ElementsAreArray(Ids{1, 261}));
  EXPECT_THAT(plain.encode("a", false), ElementsAreArray(Ids{261}));
  const Tokenizer eos = Tokenizer::from_json(json_text_, "t.json", R"({"add_eos_token": true})");
  EXPECT_THAT(eos.encode("a"), ElementsAreArray(Ids{1, 261, 2}));
  EXPECT_THAT(eos.encode("a", false), ElementsAreArray(Ids{261, 2}));
  const Tokenizer none = Tokenizer::from_json(json_text_, "t.json", R"({"add_bos_token": false})");
  EXPECT_THAT(none.encode("a"), ElementsAreArray(Ids{261}));
  const Tokenizer other = Tokenizer::from_json(json_text_, "t.json", R"({"bos_token": {"content": "</s>"}, "add_bos_token": true})");
  EXPECT_EQ(other.bos_id(), 2);
  EXPECT_THAT(other.encode("a"), ElementsAreArray(Ids{2, 261}));
  // Without a post-processor the default is still BOS only.
  json root = json::parse(json_text_);
  root["post_processor"] = nullptr;
  EXPECT_THAT(Tokenizer::from_json(root.dump(), "t.json").encode("a"), ElementsAreArray(Ids{1, 261}));

  // from_file reads tokenizer_config.json beside the file and names it in its errors.
  const fs::path tmp = fs::temp_directory_path() / ("clattn_tok_" + std::to_string(getpid()));
  fs::create_directories(tmp);
  fs::copy_file(dir_ / "tokenizer.json", tmp / "tokenizer.json", fs::copy_options::overwrite_existing);
  std::ofstream(tmp / "tokenizer_config.json") << R"({"add_bos_token": false, "add_eos_token": true})";
  EXPECT_THAT(Tokenizer::from_file((tmp / "tokenizer.json").string()).encode("a"), ElementsAreArray(Ids{261, 2}));
  std::ofstream(tmp / "tokenizer_config.json") << R"({"add_eos_token": "yes"})";
  try {
    Tokenizer::from_file((tmp / "tokenizer.json").string());
    ADD_FAILURE() << "a malformed config loaded";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr((tmp / "tokenizer_config.json").string()));
    EXPECT_THAT(e.what(), HasSubstr("add_eos_token"));
  }
  fs::remove_all(tmp);
}

// The message of the Error that loading throws, "" when it loads. Any other exception fails: the
// contract is that everything wrong with a file is a clattn::Error.
std::string load_error(const std::string& text, const std::string& config = "") {
  try {
    Tokenizer::from_json(text, "bad.json", config);
    return "";
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a clattn::Error: " << e.what();
    return "?";
  }
}

TEST_F(Stories, MalformedFiles) {
  const json good = json::parse(json_text_);
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
  expect(load_error("this is not json"), "not valid JSON");
  expect(load_error(json_text_.substr(0, json_text_.size() / 2)), "not valid JSON");
  expect(load_error(""), "not valid JSON");
  expect(load_error("[1, 2]"), "top level");
  expect(with([](json& j) { j.erase("model"); }), "\"model\" is missing");
  expect(with([](json& j) { j["model"] = 3; }), "\"model\" must be an object");
  expect(with([](json& j) { j["model"].erase("vocab"); }), "model.vocab is missing");
  expect(with([](json& j) { j["model"]["vocab"] = json::array(); }), "model.vocab must be an object");
  expect(with([](json& j) { j["model"]["vocab"] = json::object(); }), "model.vocab is empty");
  expect(with([](json& j) { j["model"].erase("merges"); }), "model.merges is missing");
  expect(with([](json& j) { j["model"]["merges"] = "a b"; }), "model.merges must be an array");
  expect(with([](json& j) { j["model"]["type"] = "Unigram"; }), "only \"BPE\" and \"WordPiece\"");
  expect(with([](json& j) { j["model"]["vocab"]["e"] = 512; }), "out of range [0, 512)");
  expect(with([](json& j) { j["model"]["vocab"]["e"] = -1; }), "out of range");
  expect(with([](json& j) { j["model"]["vocab"]["e"] = "7"; }), "must be an integer id");
  expect(with([](json& j) { j["model"]["vocab"]["e"] = 412; }), "both have id 412");
  expect(with([](json& j) { j["model"]["merges"].push_back("q \u2603"); }), "\"\u2603\", which is not in model.vocab");
  expect(with([](json& j) { j["model"]["merges"].push_back("Z Z"); }), "\"ZZ\", which is not in model.vocab");
  expect(with([](json& j) { j["model"]["merges"].push_back("a b c"); }), "exactly one space");
  expect(with([](json& j) { j["model"]["merges"].push_back(json::array({"a"})); }), "model.merges[165]");
  expect(with([](json& j) { j["model"]["unk_token"] = "<nope>"; }), "model.unk_token");
  expect(with([](json& j) { j["model"]["dropout"] = 0.1; }), "model.dropout");
  expect(with([](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}}; }), "pre_tokenizer \"Metaspace\"");
  expect(with([](json& j) { j["normalizer"]["normalizers"][1]["pattern"] = {{"Regex", " "}}; }), "Regex");
  expect(with([](json& j) { j["decoder"]["decoders"][0] = {{"type", "Metaspace"}}; }), "\"Metaspace\" is not supported");
  expect(with([](json& j) { j["post_processor"] = {{"type", "Foo"}}; }), "post_processor \"Foo\" is not supported");
  expect(with([](json& j) { j["post_processor"] = {{"type", "BertProcessing"}}; }), "post_processor.cls must be");
  expect(with([](json& j) { j["added_tokens"][1]["content"] = "<bos>"; }), "added_tokens[1]");
  expect(with([](json& j) { j["added_tokens"].push_back({{"id", 600}, {"content", "<pad>"}}); }),
         "next free id is 512");
  // Sequences nested 15 000 deep overflowed the stack (SIGSEGV); 32 levels load, 33 are refused.
  const auto nested = [&](const char* chain, const char* list, int depth) {
    return with([&](json& j) {  // built top-down: each level one push_back, not a copy of the rest
      json top = {{"type", "Sequence"}, {list, json::array()}};
      json* cur = &top;
      for (int d = 1; d < depth; ++d) {
        (*cur)[list].push_back(json{{"type", "Sequence"}, {list, json::array()}});
        cur = &(*cur)[list][0];
      }
      (*cur)[list].push_back(j[chain]);
      j[chain] = std::move(top);
    });
  };
  EXPECT_EQ(nested("normalizer", "normalizers", 31), "");
  expect(nested("normalizer", "normalizers", 33), "normalizer: Sequence nested more than 32 deep");
  // Not thousands deep here: the test's own json dump recurses, and AddressSanitizer's frames
  // overflow the stack there (the loader stops at 33 whatever the depth).
  expect(nested("decoder", "decoders", 40), "decoder: Sequence nested more than 32 deep");
  expect(load_error(json_text_, "{not json"), "(tokenizer_config.json): not valid JSON");
  expect(load_error(json_text_, R"({"bos_token": "<nope>"})"), "bos_token");

  // A byte-fallback token missing is an error once a character needs it, naming the token.
  json j = good;
  j["model"]["vocab"].erase("<0xE6>");
  j["model"]["vocab"]["<0xE6>renamed"] = 233;
  const Tokenizer t = Tokenizer::from_json(j.dump(), "bad.json");
  EXPECT_THAT(t.encode("fine"), ElementsAreArray(tok().encode("fine")));
  try {
    t.encode("\u65e5");
    ADD_FAILURE() << "encoded without <0xE6>";
  } catch (const Error& e) {
    expect(e.what(), "<0xE6>");
  }
  EXPECT_THROW(Tokenizer::from_file((dir_ / "no_such_tokenizer.json").string()), Error);
}

TEST_F(Stories, BadArguments) {
  EXPECT_THROW(tok().decode(Ids{1, 512}), Error);
  EXPECT_THROW(tok().decode(Ids{-1}), Error);
  EXPECT_THROW(tok().token(512), Error);
  EXPECT_THROW(tok().token(-1), Error);
  EXPECT_THROW(tok().decode_piece(1, 512), Error);
  EXPECT_THROW(tok().decode_piece(512, 3), Error);
  EXPECT_THROW(tok().decode_piece(1, -1), Error);
  for (const std::string bad : {"\xFF", "ab\xC3", "\xC0\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80"}) {
    try {
      tok().encode(bad);
      ADD_FAILURE() << "encoded invalid UTF-8";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("UTF-8"));
    }
  }
}

// The tokenizer.json of byte-level models (`clattn train --task lm/mlm`): ids are the bytes, nothing
// added, <pad>/<mask> skipped on decode, and the file read back is recognised as the byte mode.
TEST(Tokenizer, ByteLevelIsTheBytes) {
  const Tokenizer t = Tokenizer::bytes();
  EXPECT_TRUE(t.is_bytes());
  EXPECT_EQ(t.vocab_size(), 258);
  EXPECT_EQ(t.bos_id(), -1);
  EXPECT_EQ(t.eos_id(), -1);
  const std::string text = "ROMEO: \xC3\xA9 \xE2\x82\xAC\n";
  const Ids ids = t.encode(text);
  ASSERT_EQ(ids.size(), text.size());
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i], static_cast<unsigned char>(text[i]));
  Ids padded{256};
  padded.insert(padded.end(), ids.begin(), ids.end());
  padded.push_back(257);
  EXPECT_EQ(t.decode(padded), text);
  std::string streamed;
  for (size_t i = 0; i < ids.size(); ++i) streamed += t.decode_piece(i ? ids[i - 1] : -1, ids[i]);
  EXPECT_EQ(streamed, text);
  EXPECT_TRUE(Tokenizer::from_json(Tokenizer::byte_tokenizer_json(), "bytes").is_bytes());
  // A BPE tokenizer with merges (stories260k) is not the byte mode.
  EXPECT_FALSE(Tokenizer::from_file((data_dir() / "stories260k" / "tokenizer.json").string()).is_bytes());
}

}  // namespace
}  // namespace clattn
