// The variants' work models (Attention::work): the figures bench's GFLOP/s and %peak divide by.
// Checked against closed forms for the exact variants and against the paper's properties for the
// clustered family (C = N is full attention's work; improved adds to clustered's).
#include <gtest/gtest.h>

#include <string>

#include "clattn/attention.h"

namespace clattn {
namespace {

double flops(const std::string& spec, const AttentionDims& d, bool causal = false, Mode mode = Mode::inference) {
  return make_attention(spec)->work(d, causal, mode).flops();
}

TEST(Work, FullIsTheClassicCount) {
  const AttentionDims d{2, 8, 4, 1000, 700, 64, 32};
  EXPECT_DOUBLE_EQ(flops("full", d), 2.0 * 2 * 8 * 1000 * 700 * (64 + 32));
  // Causal with N > M: query i sees max(0, i + M - N + 1) keys.
  const AttentionDims s{1, 1, 1, 5, 3, 1, 1};
  EXPECT_DOUBLE_EQ(flops("full", s, true), 2.0 * (0 + 0 + 1 + 2 + 3) * 2);
  const AttentionDims sq{1, 1, 1, 4, 4, 1, 1};
  EXPECT_DOUBLE_EQ(flops("full", sq, true), 2.0 * (1 + 2 + 3 + 4) * 2);
  // Forward + backward: 3.5x the forward when Dk = Dv (FlashAttention's convention).
  const AttentionDims e{1, 2, 2, 64, 64, 16, 16};
  EXPECT_DOUBLE_EQ(flops("full", e, false, Mode::training), 3.5 * flops("full", e));
}

TEST(Work, LocalCountsItsBand) {
  const AttentionDims d{1, 1, 1, 10, 10, 1, 1};
  // |i - j| <= 1 over 10 positions: 3 keys each, 2 at the ends.
  EXPECT_DOUBLE_EQ(flops("local:window=2", d), 2.0 * 2 * (10 * 3 - 2));
  // Causal window 3: i - 3 < j <= i.
  EXPECT_DOUBLE_EQ(flops("local:window=3", d, true), 2.0 * 2 * (1 + 2 + 3 * 8));
}

TEST(Work, ClusteredProperties) {
  const AttentionDims d{1, 8, 8, 4096, 4096, 64, 64};
  // C >= N: every query its own cluster, which is full attention.
  EXPECT_DOUBLE_EQ(flops("clustered:clusters=4096", d), flops("full", d));
  const WorkModel c = make_attention("clustered:clusters=100")->work(d, false, Mode::inference);
  const WorkModel ic = make_attention("improved-clustered:clusters=100,topk=32")->work(d, false, Mode::inference);
  EXPECT_GT(ic.flops(), c.flops());
  EXPECT_DOUBLE_EQ(ic.int_ops(), c.int_ops());
  EXPECT_DOUBLE_EQ(c.int_ops(), 4096.0 * 100 * 11 * 8);  // N·C·(iterations + 1) per head
  // hashing N·D·bits·2 + centroid attention C·M·D·4 + top-k N·k·D·4 + correction C·k·Dv·2.
  const double per_head = 4096.0 * 64 * 63 * 2 + 4096.0 * 64 + 100.0 * 4096 * 64 * 4 + 4096.0 * 32 * 64 * 4 +
                          100.0 * 32 * 64 * 2;
  EXPECT_DOUBLE_EQ(ic.flops(), 8 * per_head);
  bool has_kmeans = false;
  for (const WorkStage& s : ic.stages) has_kmeans |= s.name == "k-means" && s.int_ops > 0;
  EXPECT_TRUE(has_kmeans);
  // Causal clusters >= segment: causal full attention.
  EXPECT_DOUBLE_EQ(flops("clustered:clusters=4096,block=512,segment=4096", d, true), flops("full", d, true));
  // Causal clustered costs far less than causal full at long N.
  const AttentionDims L{1, 1, 1, 32768, 32768, 64, 64};
  EXPECT_LT(flops("improved-clustered:clusters=25,topk=32", L, true), 0.2 * flops("full", L, true));
}

double decode(const std::string& spec, const AttentionDims& d, double context, double element = 4) {
  return make_attention(spec)->decode_bytes(d, context, element);
}

TEST(Work, DecodeStepBytes) {
  const AttentionDims d{1, 8, 4, 1, 0, 64, 64};
  const double row = 4.0 * 128 * 4;  // K and V of one position, 4 key/value heads, f32
  EXPECT_DOUBLE_EQ(decode("full", d, 1000), row * 1000);
  EXPECT_DOUBLE_EQ(decode("full", d, 1000, 2), row / 2 * 1000);
  EXPECT_DOUBLE_EQ(decode("topk:topk=32", d, 1000), row * 1000);  // it scores every key
  EXPECT_DOUBLE_EQ(decode("local:window=256", d, 1000), row * 256);
  EXPECT_DOUBLE_EQ(decode("local:window=256", d, 100), row * 100);
  // Within the first block, or with clusters >= segment, a step is causal full attention's.
  const std::string ic = "improved-clustered:clusters=100,topk=32,block=64,segment=512";
  EXPECT_DOUBLE_EQ(decode(ic, d, 64), row * 64);
  EXPECT_DOUBLE_EQ(decode("clustered:clusters=512,block=64,segment=512", d, 10000), row * 10000);
  // Position 9999 lies in the segment [9728, 10240) (starts 0, 64, 128, 256, 512, then every
  // 512): half a block in-block, one row of stream advance, 9728/512 rows of the segment's
  // restart, each query head's 32 gathered rows, one query row, the 100 centroids and one output.
  const double state = 4.0 * (64 + 100 * 64 + 64) * 8;
  EXPECT_DOUBLE_EQ(decode(ic, d, 10000), row * (32.5 + 1 + 19) + 4.0 * 128 * 32 * 8 + state);
  EXPECT_DOUBLE_EQ(decode("clustered:clusters=100,block=64,segment=512", d, 10000), row * (32.5 + 1 + 19) + state);
  // In the doubling segments the restart is one row a step: [256, 512) at position 300.
  EXPECT_DOUBLE_EQ(decode("clustered:clusters=100,block=64,segment=512", d, 301),
                   row * (32.5 + 1 + 1) + 4.0 * (64 + 100 * 64 + 64) * 8);
  // Far below causal full's at long contexts, and never above it.
  EXPECT_LT(decode(ic, d, 100000), 0.05 * decode("full", d, 100000));
  const AttentionDims tiny{1, 1, 1, 1, 0, 4, 4};
  for (const VariantInfo& v : registered_attentions()) {
    const std::unique_ptr<Attention> att = make_attention(v.example);
    if (!att->capabilities().causal) continue;
    for (const double ctx : {1.0, 65.0, 5000.0}) {
      EXPECT_GT(att->decode_bytes(tiny, ctx, 4), 0) << v.example;
      // Clustered adds its centroids (at most C·Dk floats per head) to what full reads.
      EXPECT_LE(att->decode_bytes(tiny, ctx, 4), decode("full", tiny, ctx) + 4.0 * (2 + 1000) * 4) << v.example;
    }
  }
}

TEST(Work, EveryVariantDeclaresItsWork) {
  for (const VariantInfo& v : registered_attentions()) {
    const std::unique_ptr<Attention> att = make_attention(v.example);
    for (const int64_t n : {1, 3, 64, 1000}) {
      const AttentionDims d{1, 2, 2, n, n, 16, 16};
      for (const bool causal : {false, true}) {
        if (causal && !att->capabilities().causal) continue;
        const WorkModel f = att->work(d, causal, Mode::inference);
        const WorkModel t = att->work(d, causal, Mode::training);
        EXPECT_GT(f.flops(), 0) << v.example << " n=" << n;
        EXPECT_GT(f.bytes(), 0) << v.example << " n=" << n;
        EXPECT_GT(t.flops(), f.flops()) << v.example << " n=" << n;
        // No variant's work exceeds what exact attention plus its own selection work could need.
        EXPECT_LE(f.flops(), 40 * flops("full", d) + 2.0 * 2 * n * 16 * 64 * 11) << v.example << " n=" << n;
        for (const WorkStage& s : t.stages) {
          EXPECT_FALSE(s.name.empty()) << v.example;
          EXPECT_GE(s.flops, 0) << v.example << " " << s.name;
          EXPECT_GE(s.int_ops, 0) << v.example << " " << s.name;
        }
      }
    }
  }
}

}  // namespace
}  // namespace clattn
