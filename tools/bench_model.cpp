// `clattn bench-model`: a whole model's speed with each attention plan — milliseconds, tokens/s,
// the share of time outside attention and its GFLOP/s against the machine's sgemm rate, and the
// peak memory a forward adds (the first plan's exactly; later plans may reuse memory freed before
// them, so theirs is a lower bound). Models: a BERT-shaped encoder with random weights at any length
// (--random-bert), a KWT checkpoint on a feature set, or a LLaMA checkpoint (prefill and decode).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>

#include "bench_util.h"
#include "cli_util.h"
#include "clattn/error.h"
#include "clattn/gemm.h"
#include "clattn/model.h"
#include "clattn/parallel.h"
#include "clattn/rng.h"
#include "clattn/safetensors.h"
#include "commands.h"

namespace clattn::cli {
namespace {

struct BenchModelOptions {
  std::string model, features, lengths = "16384";
  bool random_bert = false;
  int64_t layers = 4, hidden = 256, heads = 4, ffn = 1024, batch = 0, decode = 128;
  std::vector<std::string> attention{"full"};
  int repeat = 3, threads = 0;
};

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void run_bench_model(const BenchModelOptions& o) {
  set_threads(checked_threads(o.threads, "bench-model"));
  check_size(o.repeat, 1, kMaxCount, "bench-model: --repeat");
  check_size(o.layers, 1, kMaxCount, "bench-model: --layers");
  check_size(o.hidden, 1, kMaxCount, "bench-model: --hidden");
  check_size(o.heads, 1, kMaxCount, "bench-model: --heads");
  check_size(o.ffn, 1, kMaxCount, "bench-model: --ffn");
  check_size(o.batch, 0, kMaxCount, "bench-model: --batch (0: the default)");
  check_size(o.decode, 0, kMaxCount, "bench-model: --decode");
  const std::vector<int64_t> lengths_given = bench::parse_lengths(o.lengths, "bench-model");
  usage_check(o.random_bert != !o.model.empty(), "bench-model: give exactly one of --model DIR and --random-bert");
  if (o.random_bert)
    for (const int64_t n : lengths_given)
      check_elements({std::max<int64_t>(o.batch, 1), n, std::max(o.hidden, o.ffn)},
                     "bench-model: activations (B, N, max(hidden, ffn))");
  bench::prime_threads_and_blas();
  const double peak = measure_sgemm_gflops(2048, 3);
  std::printf("sgemm 2048: %.1f GFLOP/s, %d threads\n", peak, max_threads());
  std::printf("%-56s %7s %6s %10s %10s %11s %9s %10s %8s\n", "attention", "N", "B", "ms_median", "ms_min",
              "tokens/s", "outside%", "GFLOP/s", "rss MB");
  auto report = [&](const std::string& plan, int64_t n, int64_t B, std::vector<double> ms, double attn_ms,
                    double outside_flops, int64_t rss_kib) {
    const bench::TimeStats st = bench::summarise(std::move(ms));
    const double outside_ms = std::max(st.median - attn_ms, 1e-9);
    std::printf("%-56s %7lld %6lld %10.1f %10.1f %11.0f %8.1f%% %10.1f %8.1f\n", plan.c_str(), static_cast<long long>(n),
                static_cast<long long>(B), st.median, st.min, static_cast<double>(n * B) / st.median * 1e3,
                100.0 * outside_ms / st.median, outside_flops / outside_ms * 1e-6, static_cast<double>(rss_kib) / 1024.0);
    std::fflush(stdout);
  };
  auto timed = [&](auto&& fn, double& attn_ms, int64_t& rss_kib, const auto& attn) {
    bench::reset_peak_rss();
    const int64_t before = bench::read_status_kib("VmRSS");
    fn();  // warm-up: sizes the activations and workspaces, as a first real call would
    std::vector<double> ms;
    double attn_sum = 0;
    for (int r = 0; r < o.repeat; ++r) {
      const double t0 = now_ms();
      fn();
      ms.push_back(now_ms() - t0);
      attn_sum += attn();
    }
    attn_ms = attn_sum / o.repeat;
    rss_kib = bench::read_status_kib("VmHWM") - before;
    return ms;
  };

  if (o.random_bert || model_kind(o.model) != ModelKind::llama) {
    std::unique_ptr<Encoder> enc;
    Tensor features;
    std::vector<int64_t> lengths;
    if (o.random_bert) {
      lengths = lengths_given;
      ModelConfig c;
      c.hidden = o.hidden;
      c.layers = o.layers;
      c.heads = o.heads;
      c.ffn = o.ffn;
      c.vocab = 30522;
      c.max_positions = *std::max_element(lengths.begin(), lengths.end());
      c.eps = 1e-12f;
      enc = Encoder::random_bert(c, 0);
    } else {
      enc = Encoder::load(o.model);
      check(!o.features.empty(), "bench-model: a KWT model needs --features FILE");
      features = SafetensorsFile::open(o.features).get_f32("features");
      lengths = {enc->config().num_patches + 1};
    }
    const ModelConfig& c = enc->config();
    for (const int64_t n : lengths) {
      // KWT: the whole feature set in batches of --batch clips (default: one batch of all).
      const int64_t B = o.random_bert ? std::max<int64_t>(o.batch, 1)
                                      : (o.batch > 0 ? std::min(o.batch, features.dim(0)) : features.dim(0));
      std::vector<int32_t> ids(static_cast<size_t>(B * n));
      const Rng rng(1);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(c.vocab), 0, i));
      // Linear layers per token per layer: q, k, v, o (H x H) and the two FFN matrices.
      const double flops = 2.0 * static_cast<double>(B * n) * c.layers * (4.0 * c.hidden * c.hidden + 2.0 * c.hidden * c.ffn);
      for (const std::string& plan : o.attention) {
        enc->set_attention(plan);
        check_memory(enc->forward_bytes(B, n), detail::concat("bench-model: ", plan, " at N = ", n));
        double attn_ms = 0, run_attn = 0;  // run_attn: attention time of the latest pass
        int64_t rss = 0;
        auto ms = timed([&] {
          run_attn = 0;
          if (o.random_bert) {
            (void)enc->forward_tokens(ids, B, n);
            run_attn = enc->last_attention_ms();
            return;
          }
          for (int64_t b0 = 0; b0 < features.dim(0); b0 += B) {
            const int64_t nb = std::min(B, features.dim(0) - b0);
            ConstView part = features.view();
            part.data += b0 * part.stride(0);
            part.shape = Shape{nb, features.dim(1), features.dim(2)};
            (void)enc->forward_features(part);
            run_attn += enc->last_attention_ms();
          }
        }, attn_ms, rss, [&] { return run_attn; });
        // A KWT pass covers the whole set: report it as one batch of all its clips.
        report(plan, n, o.random_bert ? B : features.dim(0), std::move(ms), attn_ms,
               o.random_bert ? flops : flops / static_cast<double>(B) * static_cast<double>(features.dim(0)), rss);
      }
    }
    return;
  }
  // Decoder: prefill of N tokens, then --decode tokens one at a time through the KV cache.
  auto dec = Decoder::load(o.model);
  const ModelConfig& c = dec->config();
  for (const int64_t n : lengths_given) {
    check(n + o.decode <= c.max_positions, "bench-model: N + --decode (", n + o.decode, ") exceeds the context ", c.max_positions);
    std::vector<int32_t> ids(static_cast<size_t>(n));
    const Rng rng(1);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(c.vocab), 0, i));
    const double per_token = 2.0 * c.layers * (2.0 * c.hidden * c.heads * c.head_dim + 2.0 * c.hidden * c.kv_heads * c.head_dim + 3.0 * c.hidden * c.ffn);
    for (const std::string& plan : o.attention) {
      dec->set_attention(plan);
      double attn_ms = 0;
      int64_t rss = 0;
      auto ms = timed([&] {
        dec->start(n + o.decode);
        (void)dec->prefill(ids);
      }, attn_ms, rss, [&] { return dec->last_attention_ms(); });
      report(plan + " (prefill)", n, 1, std::move(ms), attn_ms, per_token * static_cast<double>(n) + 2.0 * c.hidden * c.vocab, rss);
      if (o.decode == 0) continue;
      std::vector<double> dms;
      double dattn = 0;
      for (int r = 0; r < o.repeat + 1; ++r) {
        dec->start(n + o.decode);
        std::vector<float> l = dec->prefill(ids);
        double a = 0;
        const double t0 = now_ms();
        for (int64_t t = 0; t < o.decode; ++t) {
          l = dec->step(sample_token(l, SamplingOptions{}, static_cast<uint64_t>(t)));
          a += dec->last_attention_ms();
        }
        if (r > 0) {  // the first round is the warm-up
          dms.push_back((now_ms() - t0) / static_cast<double>(o.decode));
          dattn += a / static_cast<double>(o.decode) / o.repeat;
        }
      }
      report(plan + " (decode, per token)", 1, 1, std::move(dms), dattn, per_token + 2.0 * c.hidden * c.vocab, 0);
    }
  }
}

}  // namespace

void add_bench_model(CLI::App& app) {
  auto o = std::make_shared<BenchModelOptions>();
  CLI::App* sub = app.add_subcommand(
      "bench-model",
      "Time a whole model with each attention plan: ms, tokens/s, share and GFLOP/s outside attention, peak memory");
  sub->add_option("--model", o->model, "model folder (KWT with --features, or LLaMA: prefill + decode)");
  sub->add_flag("--random-bert", o->random_bert, "a BERT-shaped encoder with random weights (sizes below)");
  sub->add_option("--features", o->features, "KWT feature set: all its clips are one batch");
  sub->add_option("--lengths", o->lengths, "sequence lengths (random BERT) or prompt lengths (decoder), comma-separated");
  sub->add_option("--layers", o->layers, "random BERT: layers (4)");
  sub->add_option("--hidden", o->hidden, "random BERT: hidden size (256)");
  sub->add_option("--heads", o->heads, "random BERT: heads (4)");
  sub->add_option("--ffn", o->ffn, "random BERT: feed-forward size (1024)");
  sub->add_option("--batch", o->batch, "random BERT: batch (1); KWT: clips per forward (default all)");
  sub->add_option("--decode", o->decode, "decoder: tokens decoded after the prefill (128)");
  sub->add_option("--attention", o->attention, "attention plan, repeatable (default full)");
  sub->add_option("--repeat", o->repeat, "timed runs after one warm-up (3)");
  add_threads_option(sub, o->threads, "bench-model");
  sub->callback([o] { run_bench_model(*o); });
}

}  // namespace clattn::cli
