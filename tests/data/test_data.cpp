// Tasks of include/clattn/data.h: ListOps (evaluator against the real test set, generator window,
// determinism), masked and causal character modelling (windows, masks, held-out split), errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "clattn/data.h"
#include "clattn/error.h"
#include "clattn/rng.h"
#include "common/data.h"
#include "data/listops.h"

namespace clattn {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Ids = std::vector<int32_t>;

using testing::data_dir;

// A file in a per-test temporary folder, removed with it.
class TempDir {
 public:
  TempDir() {
    dir_ = fs::temp_directory_path() /
           ("clattn_data_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~TempDir() { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) const {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

 private:
  fs::path dir_;
};

Ids tok(const std::string& s) {
  Ids ids;
  std::string bad;
  EXPECT_TRUE(listops::tokenize(s, ids, bad)) << bad;
  return ids;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

Ids row(const Batch& b, int64_t r) { return Ids(b.ids.begin() + r * b.T, b.ids.begin() + (r + 1) * b.T); }

// ---------------------------------------------------------------- ListOps

TEST(ListOps, EvaluatorFollowsLra) {
  EXPECT_EQ(listops::evaluate(tok("7")), 7);
  EXPECT_EQ(listops::evaluate(tok("[MIN 4 2 9 ]")), 2);
  EXPECT_EQ(listops::evaluate(tok("[MAX 4 2 9 ]")), 9);
  EXPECT_EQ(listops::evaluate(tok("[SM 9 9 5 ]")), 3);
  EXPECT_EQ(listops::evaluate(tok("[MED 1 9 4 ]")), 4);
  // int(np.median([3, 4])) = int(3.5) = 3; [0, 9] -> 4; [1, 2, 8, 9] -> int(5.0) = 5.
  EXPECT_EQ(listops::evaluate(tok("[MED 4 3 ]")), 3);
  EXPECT_EQ(listops::evaluate(tok("[MED 9 0 ]")), 4);
  EXPECT_EQ(listops::evaluate(tok("[MED 9 1 8 2 ]")), 5);
  // Parentheses are the Nangia/LRA binarisation and carry nothing.
  EXPECT_EQ(tok("( ( ( [MAX 2 ) 9 ) ] )"), tok("[MAX 2 9 ]"));
  EXPECT_EQ(listops::evaluate(tok("[SM [MAX 1 [MIN 8 7 ] ] 5 [MED 2 2 3 ] ]")), 4);
}

TEST(ListOps, EvaluatorRefusesMalformed) {
  EXPECT_THAT(error_of([] { listops::evaluate(tok("[MIN 4 2")); }), HasSubstr("left open"));
  EXPECT_THAT(error_of([] { listops::evaluate(tok("4 2")); }), HasSubstr("follows a complete"));
  EXPECT_THAT(error_of([] { listops::evaluate(tok("[MIN ]")); }), HasSubstr("no argument"));
  EXPECT_THAT(error_of([] { listops::evaluate(tok("]")); }), HasSubstr("closes no operator"));
  EXPECT_THAT(error_of([] { listops::evaluate(Ids{}); }), HasSubstr("one value"));
  EXPECT_THAT(error_of([] { listops::evaluate(Ids{listops::kMin, 99}); }), HasSubstr("id 99"));
  Ids ids;
  std::string bad;
  EXPECT_FALSE(listops::tokenize("[MIN 4 [FIRST 2 ] ]", ids, bad));
  EXPECT_EQ(bad, "[FIRST");
}

// Every label of the original test set is what the evaluator computes (MED as int(np.median)).
TEST(ListOps, RealTestSetLabelsAgreeWithEvaluator) {
  CLATTN_NEED_DATA("listops/test_d20s.tsv");
  const fs::path tsv = data_dir() / "listops" / "test_d20s.tsv";
  std::ifstream f(tsv);
  std::string line;
  int64_t n = 0, agree = 0;
  std::vector<int64_t> per_label(10, 0);
  while (std::getline(f, line)) {
    const size_t tab = line.find('\t');
    ASSERT_NE(tab, std::string::npos);
    const int label = std::stoi(line.substr(0, tab));
    agree += listops::evaluate(tok(line.substr(tab + 1))) == label;
    ++per_label[static_cast<size_t>(label)];
    ++n;
  }
  EXPECT_EQ(n, 10000);
  EXPECT_EQ(agree, n);
  for (int64_t c : per_label) EXPECT_GT(c, 0);

  // The task reads the same examples: every row's label is its expression's value, padded with 0.
  auto task = make_task({.kind = "listops", .data = tsv.string()});
  EXPECT_EQ(task->kind(), TaskKind::classify);
  EXPECT_EQ(task->vocab(), listops::kVocab);
  EXPECT_EQ(task->classes(), 10);
  EXPECT_EQ(task->eval_skipped(4096), 0);
  const auto batches = task->eval_batches(512, 1024, 0);
  int64_t rows = 0;
  for (const Batch& b : batches) {
    ASSERT_EQ(b.T, 1024);
    for (int64_t r = 0; r < b.B; ++r, ++rows) {
      const int64_t len = b.lengths[static_cast<size_t>(r)];
      const Ids ids = row(b, r);
      ASSERT_GE(len, 1);
      ASSERT_EQ(listops::evaluate(ids.data(), len), b.targets[static_cast<size_t>(r)]);
      for (int64_t t = len; t < b.T; ++t) ASSERT_EQ(ids[static_cast<size_t>(t)], task->pad_id());
    }
  }
  EXPECT_EQ(rows + task->eval_skipped(1024), 10000);
  EXPECT_EQ(batches.back().B, rows - 512 * static_cast<int64_t>(batches.size() - 1));
  // Shorter T leaves the long expressions out, and says how many.
  const int64_t skipped = task->eval_skipped(64);
  EXPECT_GT(skipped, 0);
  int64_t kept = 0;
  for (const Batch& b : task->eval_batches(1000, 64, 0)) kept += b.B;
  EXPECT_EQ(kept + skipped, 10000);
  int64_t limited = 0;
  for (const Batch& b : task->eval_batches(7, 4096, 100)) limited += b.B;
  EXPECT_EQ(limited, 100);
}

TEST(ListOps, GeneratorHonoursWindowAndLabels) {
  auto task = make_task({.kind = "listops", .seed = 3, .min_length = 40, .max_length = 120});
  std::vector<int64_t> per_label(10, 0);
  for (uint64_t step = 0; step < 20; ++step) {
    const Batch b = task->train_batch(10, 100, step);  // T = 100 caps the window at 100
    ASSERT_EQ(b.ids.size(), 1000u);
    for (int64_t r = 0; r < b.B; ++r) {
      const int64_t len = b.lengths[static_cast<size_t>(r)];
      ASSERT_GE(len, 40);
      ASSERT_LE(len, 100);
      const Ids ids = row(b, r);
      const int label = b.targets[static_cast<size_t>(r)];
      ASSERT_EQ(listops::evaluate(ids.data(), len), label);
      ++per_label[static_cast<size_t>(label)];
      for (int64_t t = len; t < b.T; ++t) ASSERT_EQ(ids[static_cast<size_t>(t)], listops::kPad);
    }
  }
  int classes = 0;
  for (int64_t c : per_label) classes += c > 0;
  EXPECT_GE(classes, 8);
}

TEST(ListOps, DefaultWindowIsLras) {
  auto task = make_task({.kind = "listops", .seed = 1});
  const Batch b = task->train_batch(3, 2048, 0);
  for (int32_t len : b.lengths) {
    EXPECT_GE(len, 500);
    EXPECT_LE(len, 2000);
  }
  // The LRA tree: depth at most 10 (9 nested operators), 2..10 arguments per operator.
  const Ids ids = row(b, 0);
  int depth = 0, deepest = 0;
  for (int64_t t = 0; t < b.lengths[0]; ++t) {
    const int32_t id = ids[static_cast<size_t>(t)];
    if (id >= listops::kMin && id <= listops::kSm) deepest = std::max(deepest, ++depth);
    if (id == listops::kEnd) --depth;
  }
  EXPECT_LE(deepest, 9);
  EXPECT_THAT(error_of([&] { task->train_batch(2, 400, 0); }), HasSubstr("minimum expression length 500"));
}

TEST(ListOps, BatchesArePureFunctionsOfStep) {
  auto a = make_task({.kind = "listops", .seed = 9, .min_length = 20, .max_length = 60});
  auto b = make_task({.kind = "listops", .seed = 9, .min_length = 20, .max_length = 60});
  auto c = make_task({.kind = "listops", .seed = 10, .min_length = 20, .max_length = 60});
  const Batch a5 = a->train_batch(8, 64, 5);
  (void)a->train_batch(8, 64, 4);
  EXPECT_EQ(a->train_batch(8, 64, 5).ids, a5.ids);
  EXPECT_EQ(b->train_batch(8, 64, 5).ids, a5.ids);
  EXPECT_EQ(b->train_batch(8, 64, 5).targets, a5.targets);
  EXPECT_NE(a->train_batch(8, 64, 6).ids, a5.ids);
  EXPECT_NE(c->train_batch(8, 64, 5).ids, a5.ids);
  // Row r does not depend on the batch size.
  const Batch small = a->train_batch(3, 64, 5);
  for (int64_t r = 0; r < 3; ++r) EXPECT_EQ(row(small, r), row(a5, r));
  // The generated held-out set is fixed and apart from the training batches.
  const auto e1 = a->eval_batches(16, 64, 50), e2 = b->eval_batches(16, 64, 50);
  ASSERT_EQ(e1.size(), 4u);
  EXPECT_EQ(e1.back().B, 2);
  std::set<Ids> held;
  for (size_t i = 0; i < e1.size(); ++i) {
    EXPECT_EQ(e1[i].ids, e2[i].ids);
    for (int64_t r = 0; r < e1[i].B; ++r) held.insert(row(e1[i], r));
  }
  for (uint64_t s = 0; s < 10; ++s) {
    const Batch t = a->train_batch(8, 64, s);
    for (int64_t r = 0; r < 8; ++r) EXPECT_EQ(held.count(row(t, r)), 0u) << "step " << s;
  }
}

TEST(ListOps, BadFilesNameFileAndLine) {
  TempDir tmp;
  const auto err = [&](const std::string& text) {
    const std::string p = tmp.write("bad.tsv", text);
    return error_of([&] { make_task({.kind = "listops", .data = p}); });
  };
  EXPECT_THAT(err("3\t[MIN 3 4 ]\n7\t[MAX 7 ]\nx\t[MIN 3 ]\n"), HasSubstr("bad.tsv:3: the label must be one digit"));
  EXPECT_THAT(err("3\t[MIN 3 4 ]\n3 [MIN 3 4 ]\n"), HasSubstr("bad.tsv:2: expected two tab-separated"));
  EXPECT_THAT(err("3\t[MIN 3 [FOO 4 ] ]\n"), HasSubstr("bad.tsv:1: unknown token '[FOO'"));
  EXPECT_THAT(err("3\t[MIN 3 4\n"), HasSubstr("bad.tsv:1: malformed expression"));
  EXPECT_THAT(err("3\t\n"), HasSubstr("bad.tsv:1: empty expression"));
  EXPECT_THAT(err("\n\n"), HasSubstr("no examples"));
  EXPECT_THAT(err(""), HasSubstr("no examples"));
  EXPECT_THAT(error_of([&] { make_task({.kind = "listops", .data = tmp.path("none.tsv")}); }),
              HasSubstr("none.tsv': cannot open: No such file or directory"));
  // LRA's own files: a Source/Target header, expression first; blank lines and CRLF are fine.
  const std::string lra = tmp.write("lra.tsv", "Source\tTarget\r\n( [MAX 2 9 ) ]\t9\r\n\r\n[SM 5 6 ]\t1\r\n");
  auto task = make_task({.kind = "listops", .data = lra});
  const auto batches = task->eval_batches(8, 16, 0);
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0].targets, (Ids{9, 1}));
  EXPECT_EQ(batches[0].lengths, (Ids{4, 4}));
  EXPECT_THAT(error_of([] { make_task({.kind = "listops", .min_length = 10, .max_length = 5}); }),
              HasSubstr("1 <= min <= max"));
}

// ---------------------------------------------------------------- text tasks

// Random printable bytes: every 24-byte substring occurs once, so a window's place is findable.
std::string random_text(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::string s(static_cast<size_t>(n), ' ');
  for (int64_t i = 0; i < n; ++i) s[static_cast<size_t>(i)] = static_cast<char>('!' + rng.below(90, 0, static_cast<uint64_t>(i)));
  return s;
}

// Where the row's original text (ids with target bytes restored) starts in the file, or -1.
int64_t locate(const std::string& text, const Batch& b, int64_t r, bool mlm) {
  std::string w(static_cast<size_t>(b.T), ' ');
  for (int64_t t = 0; t < b.T; ++t) {
    const size_t i = static_cast<size_t>(r * b.T + t);
    w[static_cast<size_t>(t)] = static_cast<char>(mlm && b.targets[i] >= 0 ? b.targets[i] : b.ids[i]);
  }
  const size_t at = text.find(w);
  return at == std::string::npos ? -1 : static_cast<int64_t>(at);
}

TEST(Text, MlmWindowsMasksAndSplit) {
  TempDir tmp;
  const std::string text = random_text(20000, 4);
  const std::string path = tmp.write("t.txt", text);
  auto task = make_task({.kind = "mlm", .data = path, .seed = 2});
  EXPECT_EQ(task->kind(), TaskKind::mlm);
  EXPECT_EQ(task->vocab(), 258);
  const int64_t T = 100, train_end = 20000 - 2000;
  int64_t targets = 0, masked = 0, random = 0, kept = 0, rows = 0;
  for (uint64_t step = 0; step < 40; ++step) {
    const Batch b = task->train_batch(8, T, step);
    ASSERT_EQ(b.ids.size(), 800u);
    ASSERT_EQ(b.targets.size(), 800u);
    for (int64_t r = 0; r < b.B; ++r, ++rows) {
      EXPECT_EQ(b.lengths[static_cast<size_t>(r)], T);
      const int64_t at = locate(text, b, r, true);
      ASSERT_GE(at, 0) << "step " << step << " row " << r;
      EXPECT_LE(at + T, train_end);  // never reaches the held-out tail
      int64_t here = 0;
      for (int64_t t = 0; t < T; ++t) {
        const size_t i = static_cast<size_t>(r * T + t);
        if (b.targets[i] < 0) {
          EXPECT_EQ(b.ids[i], static_cast<unsigned char>(text[static_cast<size_t>(at + t)]));
          continue;
        }
        ++here;
        if (b.ids[i] == 257) ++masked;
        else if (b.ids[i] == b.targets[i]) ++kept;
        else ++random;
      }
      EXPECT_EQ(here, 15);  // round(0.15 * 100) per window
      targets += here;
    }
  }
  // 80 / 10 / 10 over 4,800 targets (a random byte equal to the original counts as kept).
  EXPECT_NEAR(static_cast<double>(masked) / targets, 0.8, 0.03);
  EXPECT_NEAR(static_cast<double>(random) / targets, 0.1, 0.02);
  EXPECT_NEAR(static_cast<double>(kept) / targets, 0.1, 0.02);
  EXPECT_EQ(rows, 320);
  // Deterministic per step, different across steps and seeds.
  EXPECT_EQ(task->train_batch(4, T, 7).ids, task->train_batch(4, T, 7).ids);
  EXPECT_EQ(task->train_batch(4, T, 7).targets, task->train_batch(4, T, 7).targets);
  EXPECT_NE(task->train_batch(4, T, 7).ids, task->train_batch(4, T, 8).ids);
  auto other = make_task({.kind = "mlm", .data = path, .seed = 3});
  EXPECT_NE(other->train_batch(4, T, 7).ids, task->train_batch(4, T, 7).ids);

  // Held-out: windows tile the last 2,000 bytes with stride T, fixed, masks included.
  const auto eval = task->eval_batches(6, T, 0);
  ASSERT_EQ(eval.size(), 4u);  // 20 windows in batches of 6
  EXPECT_EQ(eval.back().B, 2);
  int64_t w = 0;
  for (const Batch& b : eval)
    for (int64_t r = 0; r < b.B; ++r, ++w) EXPECT_EQ(locate(text, b, r, true), train_end + w * T);
  EXPECT_EQ(w, 20);
  EXPECT_EQ(task->eval_batches(6, T, 0)[1].ids, eval[1].ids);
  EXPECT_EQ(task->eval_batches(6, T, 9).size(), 2u);
}

TEST(Text, MaskRateFollowsOption) {
  TempDir tmp;
  const std::string path = tmp.write("t.txt", random_text(5000, 1));
  auto task = make_task({.kind = "mlm", .data = path, .mask_prob = 0.5f});
  const Batch b = task->train_batch(2, 64, 0);
  EXPECT_EQ(std::count_if(b.targets.begin(), b.targets.end(), [](int32_t t) { return t >= 0; }), 64);
  auto tiny = make_task({.kind = "mlm", .data = path, .mask_prob = 0.001f});
  const Batch c = tiny->train_batch(1, 8, 0);  // at least one target per window
  EXPECT_EQ(std::count_if(c.targets.begin(), c.targets.end(), [](int32_t t) { return t >= 0; }), 1);
  EXPECT_THAT(error_of([&] { make_task({.kind = "mlm", .data = path, .mask_prob = 0.f}); }),
              HasSubstr("mask probability"));
}

TEST(Text, LmTargetsAreNextBytes) {
  TempDir tmp;
  const std::string text = random_text(3000, 8);
  auto task = make_task({.kind = "lm", .data = tmp.write("t.txt", text), .seed = 5});
  EXPECT_EQ(task->kind(), TaskKind::lm);
  const int64_t T = 50, train_end = 2700;
  for (uint64_t step = 0; step < 20; ++step) {
    const Batch b = task->train_batch(4, T, step);
    for (int64_t r = 0; r < b.B; ++r) {
      const int64_t at = locate(text, b, r, false);
      ASSERT_GE(at, 0);
      EXPECT_LE(at + T + 1, train_end);
      for (int64_t t = 0; t < T; ++t)
        EXPECT_EQ(b.targets[static_cast<size_t>(r * T + t)], static_cast<unsigned char>(text[static_cast<size_t>(at + t + 1)]));
    }
  }
  // (300 - 51) / 50 + 1 = 5 windows of 51 bytes with stride 50 in the 300 held-out bytes.
  const auto eval = task->eval_batches(100, T, 0);
  ASSERT_EQ(eval.size(), 1u);
  ASSERT_EQ(eval[0].B, 5);
  for (int64_t r = 0; r < 5; ++r) {
    EXPECT_EQ(locate(text, eval[0], r, false), train_end + r * T);
    EXPECT_EQ(eval[0].targets[static_cast<size_t>(r * T + T - 1)], static_cast<unsigned char>(text[static_cast<size_t>(train_end + r * T + T)]));
  }
}

TEST(Text, ErrorsNameTheFileAndTheNeed) {
  TempDir tmp;
  EXPECT_THAT(error_of([&] { make_task({.kind = "mlm", .data = tmp.path("missing.txt")}); }),
              HasSubstr("missing.txt': cannot open: No such file or directory"));
  EXPECT_THAT(error_of([&] { make_task({.kind = "lm", .data = tmp.write("empty.txt", "")}); }),
              HasSubstr("empty.txt: empty file"));
  EXPECT_THAT(error_of([&] { make_task({.kind = "mlm", .data = fs::temp_directory_path().string()}); }),
              HasSubstr("not a regular file (a directory)"));
  EXPECT_THAT(error_of([&] { make_task({.kind = "lm"}); }), HasSubstr("needs a text file"));
  EXPECT_THAT(error_of([&] { make_task({.kind = "listopz"}); }), HasSubstr("unknown task 'listopz'"));
  // 600 bytes: 540 for training, 60 held out. lm with T = 59 needs 60-byte windows: fits exactly.
  auto task = make_task({.kind = "lm", .data = tmp.write("short.txt", random_text(600, 2))});
  EXPECT_NO_THROW(task->check_length(59));
  EXPECT_EQ(task->eval_batches(4, 59, 0).size(), 1u);
  EXPECT_THAT(error_of([&] { task->train_batch(1, 60, 0); }), HasSubstr("held-out part"));
  EXPECT_THAT(error_of([&] { task->eval_batches(1, 600, 0); }), HasSubstr("training part"));
  EXPECT_THAT(error_of([&] { task->train_batch(1, 0, 0); }), HasSubstr("sequence length must be"));
  auto one = make_task({.kind = "mlm", .data = tmp.write("one.txt", "x")});
  EXPECT_THAT(error_of([&] { one->check_length(1); }), HasSubstr("held-out part (the last 10 %, 0 of 1 bytes)"));
}

TEST(Text, TinyShakespeareAtPaperLength) {
  CLATTN_NEED_DATA("tinyshakespeare/input.txt");
  const fs::path p = data_dir() / "tinyshakespeare" / "input.txt";
  auto task = make_task({.kind = "mlm", .data = p.string(), .seed = 1});
  const int64_t size = static_cast<int64_t>(fs::file_size(p)), held = size / 10;
  int64_t windows = 0;
  for (const Batch& b : task->eval_batches(16, 2048, 0)) windows += b.B;
  EXPECT_EQ(windows, (held - 2048) / 2048 + 1);
  const Batch b = task->train_batch(2, 2048, 100);
  EXPECT_EQ(task->decode(b.ids[0]).size() >= 1, true);
  EXPECT_EQ(task->decode(257), "<mask>");
  EXPECT_EQ(task->decode(10), "\\x0a");
}

}  // namespace
}  // namespace clattn
