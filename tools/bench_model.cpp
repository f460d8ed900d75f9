// `clattn bench-model`: a whole model's speed with each attention plan — milliseconds, tokens/s,
// the share of time outside attention and its GFLOP/s against the machine's sgemm rate, and the
// peak memory a forward adds (the first plan's exactly; later plans may reuse memory freed before
// them, so theirs is a lower bound). Models: a BERT-shaped encoder with random weights at any length
// (--random-bert), a KWT checkpoint on a feature set, or a LLaMA checkpoint (prefill and decode).
//
// --sequence-parallel under mpirun: every rank runs the same command and holds its part of each
// sequence (Model::set_sequence_parallel); a row's times are the slowest rank's, its memory the
// largest rank's, and bytes_per_layer what one rank sends per layer and forward (the largest).
// comm_wait_ms is the time a rank was blocked on communication per call (the largest); for plans
// of ring attention only, ring_hidden_percent is the share of the ring's transfers the compute
// hid: 1 − wait / the same transfers timed alone (ring_transfer_ms). Rank 0 prints and writes
// --json.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <numeric>
#include <optional>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "cli_util.h"
#include "clattn/attention.h"
#include "clattn/cpu.h"
#include "clattn/comm.h"
#include "clattn/error.h"
#include "clattn/gemm.h"
#include "clattn/model.h"
#include "clattn/threads.h"
#include "clattn/rng.h"
#include "clattn/safetensors.h"
#include "clattn/seq_parallel.h"
#include "commands.h"
#include "result_table.h"
#include "progress.h"
#include "version.h"

namespace clattn::cli {
namespace {

using nlohmann::ordered_json;

struct BenchModelOptions {
  std::string model, features, lengths = "16384";
  bool random_bert = false, sequence_parallel = false;
  int64_t layers = 4, hidden = 256, heads = 4, ffn = 1024, batch = 0, decode = 128;
  std::vector<std::string> attention{"full"}, plan_files;
  int repeat = 3, threads = 0;
  std::string json, format = "text", kv_cache = "f32", weights = "f32";
};

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Whether every layer runs full attention (ring attention when split).
bool all_ring(const Model& m) {
  for (const std::string& s : m.attention_specs())
    if (s.rfind("full", 0) != 0) return false;
  return true;
}

// The attention's useful work in one forward of B sequences of n (Attention::work, summed over
// the layers' specs): what its GFLOP/s column divides by.
double attention_flops(const Model& m, int64_t B, int64_t n, bool causal) {
  const ModelConfig& c = m.config();
  const AttentionDims d{B, c.heads, c.kv_heads, n, n, c.head_dim, c.head_dim};
  double f = 0;
  for (const std::string& s : m.attention_specs()) f += make_attention(s)->work(d, causal, Mode::inference).flops();
  return f;
}

std::vector<Column> columns(const BenchModelOptions& o, int plan_width) {
  std::vector<Column> c = {{"attention", "attention", "", plan_width, true},
                           {"mode", "mode", "", 8, true},
                           {"N", "n", "", 8},
                           {"B", "batch", "", 4}};
  if (o.sequence_parallel) c.push_back({"ranks", "ranks", "", 5});
  c.insert(c.end(), {{"ms_median", "ms_median", "%.1f", 10},
                     {"ms_min", "ms_min", "%.1f", 10},
                     {"tokens/s", "tokens_per_s", "%.0f", 11},
                     {"outside%", "outside_percent", "%.1f", 8},
                     {"GFLOP/s", "outside_gflops", "%.1f", 9},
                     {"attn GF/s", "attention_gflops", "%.1f", 9},
                     {"attn %peak", "attention_peak_fraction", "%.4f", 10, false, true},
                     {"GB/s", "read_gbs", "%.1f", 7},
                     {"%bw", "bandwidth_fraction", "%.4f", 7, false, true},
                     {"rss MB", "rss_mb", "%.1f", 9}});
  if (o.sequence_parallel)
    c.insert(c.end(), {{"rank MB", "peak_rss_mb_per_rank", "%.1f", 9},
                       {"bytes/layer", "bytes_per_layer", "%.0f", 12},
                       {"wait ms", "comm_wait_ms", "%.1f", 9},
                       {"hidden%", "ring_hidden_percent", "%.1f", 8}});
  return c;
}

void run_bench_model(const BenchModelOptions& o) {
  // Under mpirun ranks given other lengths corrupted the heap (buffers of other sizes exchanged):
  // they must agree first.
  {
    std::vector<std::pair<std::string, std::string>> inputs{{"--features", o.features}};
    if (!o.model.empty())
      for (const char* f : {"config.json", "model.safetensors"})
        inputs.emplace_back(std::string("--model ") + f, (std::filesystem::path(o.model) / f).string());
    for (const std::string& p : o.plan_files) inputs.emplace_back("--plan", p);
    check_cli_ranks_agree("bench-model", inputs);
  }
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
  usage_check(parse_weight_type(o.weights) == WeightType::f32 || !o.random_bert, "bench-model: --weights ", o.weights,
              " is for checkpoints (--model); --random-bert runs with f32 weights");
  std::vector<PathArg> inputs{{"--model", o.model, true}, {"--features", o.features}};
  for (const PathArg& p : path_args("--plan", o.plan_files)) inputs.push_back(p);
  check_outputs("bench-model", {{"--json", o.json}}, inputs);
  if (o.random_bert)
    for (const int64_t n : lengths_given)
      check_elements({std::max<int64_t>(o.batch, 1), n, std::max(o.hidden, o.ffn)},
                     "bench-model: activations (B, N, max(hidden, ffn))");
  Communicator& comm = world();
  Communicator* split = o.sequence_parallel ? &comm : nullptr;
  const int R = comm.size();
  const bool lead = comm.rank() == 0;
  usage_check(o.sequence_parallel || R == 1, "bench-model: ", R,
              " ranks would each run the whole benchmark; under mpirun give --sequence-parallel");
  // A plan read from a --plan file is shown in the table by the file's name (a 12-layer plan is
  // hundreds of characters); the JSON keeps the plan itself beside it.
  std::map<std::string, std::string> plan_file_of;
  for (const std::string& f : o.plan_files) plan_file_of[read_plan_file(f)] = std::filesystem::path(f).filename().string();
  const auto shown = [&](const std::string& plan) {
    const auto it = plan_file_of.find(plan);
    return it == plan_file_of.end() ? plan : it->second;
  };
  int plan_width = 9;
  for (const std::string& p : o.attention) plan_width = std::max(plan_width, static_cast<int>(shown(p).size()));
  const ResultTable table(o.format, columns(o, plan_width));
  bench::prime_threads_and_blas();
  const double peak = measure_sgemm_gflops(2048, 3);
  const double read_gbs = measure_read_gbs();
  FILE* pre = lead ? table.preamble() : nullptr;
  if (pre) {
    bench::print_machine(pre, peak, read_gbs, max_threads());
    if (o.sequence_parallel)
      std::fprintf(pre, "sequence parallel: %s; each sequence split over %d ranks\n", comm.name().c_str(), R);
    std::fflush(pre);  // before the long work, also when stdout is a pipe
  }
  ordered_json doc = {{"machine",
                       {{"cpu", bench::cpu_model()},
                        {"cores", available_processors()},
                        {"cpu_flags", cpu_features().flags()},
                        {"isa", isa_name(active_isa())},
                        {"gemm", gemm_backend().name},
                        {"gemm_kernel", gemm_backend().kernel},
                        {"sgemm_gflops", peak},
                        {"read_gbs", read_gbs},
                        {"threads", max_threads()},
                        {"ranks", R},
                        {"clattn", {{"version", kVersion}, {"commit", kCommit}}},
                        {"date", bench::utc_now_iso8601()}}},
                      {"results", ordered_json::array()}};
  auto write_json = [&] {
    if (lead && !o.json.empty()) bench::write_file_atomic(o.json, doc.dump(2) + "\n");
  };
  write_json();  // an unwritable path fails before the first case
  // A missing or unreadable model, or a KWT model without its features, fails before the table
  // header: no empty table above an error.
  const ModelKind kind = o.random_bert ? ModelKind::bert : model_kind(o.model);
  const bool llama = kind == ModelKind::llama;
  // A BERT-family checkpoint (BERT, RoBERTa, DistilBERT) runs on random ids of its vocabulary at
  // --lengths, as --random-bert does; KWT on its feature clips.
  const bool tokens = o.random_bert || kind == ModelKind::bert;
  check(tokens || llama || !o.features.empty(), "bench-model: a KWT model needs --features FILE");
  usage_check(o.features.empty() || kind == ModelKind::kwt, "bench-model: --features is for KWT models; '", o.model,
              "' runs on random ids at --lengths");
  if (lead) table.header();
  // Units: each (length, plan) forward or prefill, and each decode sweep.
  const int64_t units = static_cast<int64_t>((tokens || llama ? lengths_given.size() : 1) * o.attention.size()) *
                        (llama && o.decode > 0 && !(o.sequence_parallel && R > 1) ? 2 : 1);
  Progress progress("bench-model", units, lead);
  int64_t done = 0;
  std::string current;  // the case running now

  // One row: times are the slowest rank's, memory the largest rank's (one rank: its own).
  auto report = [&](const std::string& plan, const char* mode, int64_t n, int64_t B, std::vector<double> ms,
                    double attn_ms, double total_flops, double attn_flops, double bytes_read, int64_t rss_kib, int64_t layers, double bytes, double wait_ms,
                    bool ring) {
    double worst[4] = {static_cast<double>(rss_kib), static_cast<double>(bench::read_status_kib("VmHWM")), bytes, wait_ms};
    comm.all_reduce_max(worst, 4);
    std::optional<double> hidden;
    if (o.sequence_parallel && ring && R > 1 && worst[2] > 0) {
      const double alone = ring_transfer_ms(comm, static_cast<size_t>(worst[2] / (R - 1))) * static_cast<double>(layers);
      hidden = 100.0 * std::max(0.0, 1.0 - worst[3] / std::max(alone, 1e-9));
    }
    const bench::TimeStats st = bench::summarise(std::move(ms));
    const double outside_ms = std::max(st.median - attn_ms, 1e-9);
    ordered_json r = {{"attention", shown(plan)},
                      {"plan", plan},
                      {"mode", mode},
                      {"n", n},
                      {"batch", B},
                      {"ranks", o.sequence_parallel ? R : 1},
                      {"threads", max_threads()},
                      {"repeat", o.repeat},
                      {"layers", layers},
                      {"ms_median", st.median},
                      {"ms_min", st.min},
                      {"ms_max", st.max},
                      {"tokens_per_s", static_cast<double>(n * B) / st.median * 1e3},
                      {"attention_ms", attn_ms},
                      {"outside_percent", 100.0 * outside_ms / st.median},
                      {"outside_gflops", total_flops / outside_ms * 1e-6},
                      {"attention_gflops", attn_flops > 0 && attn_ms > 0 ? ordered_json(attn_flops / attn_ms * 1e-6) : ordered_json(nullptr)},
                      {"attention_peak_fraction", attn_flops > 0 && attn_ms > 0 ? ordered_json(attn_flops / attn_ms * 1e-6 / peak) : ordered_json(nullptr)},
                      {"bytes_read", bytes_read > 0 ? ordered_json(bytes_read) : ordered_json(nullptr)},
                      {"read_gbs", bytes_read > 0 ? ordered_json(bytes_read / st.median * 1e-6) : ordered_json(nullptr)},
                      {"bandwidth_fraction", bytes_read > 0 ? ordered_json(bytes_read / st.median * 1e-6 / read_gbs) : ordered_json(nullptr)},
                      {"rss_mb", worst[0] / 1024.0},
                      {"peak_rss_mb_per_rank", o.sequence_parallel ? ordered_json(worst[1] / 1024.0) : ordered_json(nullptr)},
                      {"bytes_per_layer", o.sequence_parallel ? ordered_json(worst[2]) : ordered_json(nullptr)},
                      {"comm_wait_ms", o.sequence_parallel ? ordered_json(worst[3]) : ordered_json(nullptr)},
                      {"ring_hidden_percent", hidden ? ordered_json(*hidden) : ordered_json(nullptr)}};
    ++done;
    if (!lead) return;
    progress.above([&] { table.row(r); });
    doc["results"].push_back(std::move(r));
    write_json();
  };
  // Warm-up, then `repeat` timed calls; each call's time is the slowest rank's. Returns the times,
  // the attention time of the median call (of the middle two for an even count: the time outside
  // attention is then the median call's, not a mean that one slow call moves), the peak memory the
  // calls added and the bytes one rank sent per call.
  struct Timing {
    std::vector<double> ms;
    double attn_ms = 0, bytes_per_call = 0, wait_ms = 0;
    int64_t rss_kib = 0;
  };
  auto timed = [&](auto&& fn, const auto& attn) {
    Timing t;
    bench::reset_peak_rss();
    const int64_t before = bench::read_status_kib("VmRSS");
    progress.set(done, current + ", warm-up");
    fn();  // warm-up: sizes the activations and workspaces, as a first real call would
    reset_sequence_parallel_traffic();
    std::vector<double> attn_ms;  // (repeat) each call's attention time
    for (int r = 0; r < o.repeat; ++r) {
      progress.set(done, detail::concat(current, ", call ", r + 1, "/", o.repeat));
      comm.barrier();
      const double t0 = now_ms();
      fn();
      double ms = now_ms() - t0;
      comm.all_reduce_max(&ms, 1);
      t.ms.push_back(ms);
      attn_ms.push_back(attn());
    }
    std::vector<size_t> by_time(t.ms.size());
    std::iota(by_time.begin(), by_time.end(), size_t{0});
    std::stable_sort(by_time.begin(), by_time.end(), [&](size_t a, size_t b) { return t.ms[a] < t.ms[b]; });
    const size_t mid = by_time.size() / 2;
    t.attn_ms = by_time.size() % 2 ? attn_ms[by_time[mid]] : 0.5 * (attn_ms[by_time[mid - 1]] + attn_ms[by_time[mid]]);
    t.rss_kib = bench::read_status_kib("VmHWM") - before;
    const SeqParallelTraffic traffic = sequence_parallel_traffic();
    t.bytes_per_call = static_cast<double>(traffic.bytes) / o.repeat;
    t.wait_ms = traffic.wait_ms / o.repeat;
    return t;
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
      // The parameters are allocated by random_bert, before any forward_bytes estimate: check them
      // first (per layer q, k, v, o and the two FFN matrices with biases and two LayerNorms; the
      // word, position and type embeddings).
      const double H = static_cast<double>(c.hidden), F = static_cast<double>(c.ffn);
      const double params = static_cast<double>(c.layers) * (4 * H * H + 2 * H * F + 9 * H + F) +
                            (static_cast<double>(c.vocab) + static_cast<double>(c.max_positions) + 4) * H;
      check_memory(4 * params, detail::concat("bench-model: the parameters of a random BERT of ", c.layers,
                                              " layers (hidden ", c.hidden, ", ffn ", c.ffn, ")"));
      enc = Encoder::random_bert(c, 0);
    } else {
      LoadOptions lo;
      lo.weights = parse_weight_type(o.weights);
      enc = Encoder::load(o.model, lo);
      if (tokens) {
        lengths = lengths_given;
        const int64_t ctx = enc->config().max_positions;
        for (const int64_t n : lengths)
          check(ctx <= 0 || n <= ctx, "bench-model: --lengths ", n, " exceeds the model's context of ", ctx,
                " positions (max_position_embeddings)");
      } else {
        check(!o.features.empty(), "bench-model: a KWT model needs --features FILE");
        features = SafetensorsFile::open(o.features).get_f32("features");
        lengths = {enc->config().num_patches + 1};
      }
    }
    enc->set_sequence_parallel(split);
    const ModelConfig& c = enc->config();
    for (const int64_t n : lengths) {
      // KWT: the whole feature set in batches of --batch clips (default: one batch of all).
      const int64_t B = tokens ? std::max<int64_t>(o.batch, 1)
                                      : (o.batch > 0 ? std::min(o.batch, features.dim(0)) : features.dim(0));
      std::vector<int32_t> ids(static_cast<size_t>(B * n));
      const Rng rng(1);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(c.vocab), 0, i));
      // Linear layers per token per layer: q, k, v, o (H x H) and the two FFN matrices.
      const double flops = 2.0 * static_cast<double>(B * n) * c.layers * (4.0 * c.hidden * c.hidden + 2.0 * c.hidden * c.ffn);
      for (const std::string& plan : o.attention) {
        enc->set_attention(plan);
        check_memory(enc->forward_bytes(B, n), detail::concat("bench-model: ", plan, " at N = ", n));
        current = detail::concat(plan, " N=", n, " B=", B);
        double run_attn = 0;  // attention time of the latest pass
        Timing t = timed([&] {
          run_attn = 0;
          if (tokens) {
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
        }, [&] { return run_attn; });
        // A KWT pass covers the whole set: report it as one batch of all its clips.
        report(plan, "forward", n, tokens ? B : features.dim(0), std::move(t.ms), t.attn_ms,
               tokens ? flops : flops / static_cast<double>(B) * static_cast<double>(features.dim(0)),
               attention_flops(*enc, tokens ? B : features.dim(0), n, false), 0, t.rss_kib,
               c.layers, t.bytes_per_call / static_cast<double>(c.layers), t.wait_ms, all_ring(*enc));
      }
    }
    progress.finish();
    table.end(doc);
    return;
  }
  // Decoder: prefill of N tokens, then --decode tokens one at a time through the KV cache (not
  // after a split prefill, whose cache is spread over the ranks).
  LoadOptions lo;
  lo.weights = parse_weight_type(o.weights);
  auto dec = Decoder::load(o.model, lo);
  dec->set_sequence_parallel(split);
  dec->set_kv_cache(parse_kv_cache_type(o.kv_cache));
  const bool decode = o.decode > 0 && !(o.sequence_parallel && R > 1);
  if (pre && o.decode > 0 && !decode)
    std::fprintf(pre, "bench-model: no decode rows: decoding after a split prefill is not supported\n");
  const ModelConfig& c = dec->config();
  for (const int64_t n : lengths_given) {
    check(n + o.decode <= c.max_positions, "bench-model: N + --decode (", n + o.decode, ") exceeds the context ", c.max_positions);
    std::vector<int32_t> ids(static_cast<size_t>(n));
    const Rng rng(1);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(c.vocab), 0, i));
    const double per_token = 2.0 * c.layers * (2.0 * c.hidden * c.heads * c.head_dim + 2.0 * c.hidden * c.kv_heads * c.head_dim + 3.0 * c.hidden * c.ffn);
    for (const std::string& plan : o.attention) {
      dec->set_attention(plan);
      current = detail::concat(plan, " prefill N=", n);
      Timing t = timed([&] {
        dec->start(n + o.decode);
        (void)dec->prefill(ids);
      }, [&] { return dec->last_attention_ms(); });
      report(plan, "prefill", n, 1, std::move(t.ms), t.attn_ms, per_token * static_cast<double>(n) + 2.0 * c.hidden * c.vocab,
             attention_flops(*dec, 1, n, true), 0, t.rss_kib, c.layers, t.bytes_per_call / static_cast<double>(c.layers), t.wait_ms, all_ring(*dec));
      if (!decode) continue;
      std::vector<double> dms;
      double dattn = 0;
      for (int r = 0; r < o.repeat + 1; ++r) {
        progress.set(done, r == 0 ? detail::concat(plan, " decode ", o.decode, " tokens, warm-up")
                                  : detail::concat(plan, " decode ", o.decode, " tokens, run ", r, "/", o.repeat));
        dec->start(n + o.decode);
        std::vector<float> l = dec->prefill(ids);
        double a = 0;
        const double t0 = now_ms();
        for (int64_t s = 0; s < o.decode; ++s) {
          l = dec->step(sample_token(l, SamplingOptions{}, static_cast<uint64_t>(s)));
          a += dec->last_attention_ms();
        }
        if (r > 0) {  // the first round is the warm-up
          dms.push_back((now_ms() - t0) / static_cast<double>(o.decode));
          dattn += a / static_cast<double>(o.decode) / o.repeat;
        }
      }
      // Bytes a step must read, at the mean context of the sweep.
      const double step_bytes = dec->step_bytes(static_cast<double>(n) + static_cast<double>(o.decode + 1) / 2);
      report(plan, "decode", 1, 1, std::move(dms), dattn, per_token + 2.0 * c.hidden * c.vocab, 0, step_bytes, 0,
             c.layers, 0, 0, false);
    }
  }
  progress.finish();
  table.end(doc);
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
  sub->add_option("--lengths", o->lengths, "sequence lengths (random BERT) or prompt lengths (decoder), comma-separated")
      ->capture_default_str();
  sub->add_option("--layers", o->layers, "random BERT: layers")->capture_default_str();
  sub->add_option("--hidden", o->hidden, "random BERT: hidden size")->capture_default_str();
  sub->add_option("--heads", o->heads, "random BERT: heads")->capture_default_str();
  sub->add_option("--ffn", o->ffn, "random BERT: feed-forward size")->capture_default_str();
  sub->add_option("--batch", o->batch, "random BERT: batch (0 = 1); KWT: clips per forward (0 = all)")->capture_default_str();
  sub->add_option("--decode", o->decode, "decoder: tokens decoded after the prefill")->capture_default_str();
  add_kv_cache_option(sub, o->kv_cache);
  add_weights_option(sub, o->weights);
  sub->add_option("--attention", o->attention, "attention plan, repeatable")->check(spec_validator())->capture_default_str();
  add_plan_file_option(sub, o->attention, &o->plan_files);
  sub->add_option("--repeat", o->repeat, "timed runs after one warm-up")->capture_default_str();
  sub->add_flag("--sequence-parallel", o->sequence_parallel,
                "under mpirun, split every sequence across the ranks (encoder forward, decoder prefill); rows "
                "add the ranks, each rank's peak memory and the bytes one rank sends per layer");
  sub->add_option("--json", o->json, "also write the results as JSON to this file (atomically)");
  add_format_option(sub, o->format);
  add_threads_option(sub, o->threads, "bench-model");
  sub->callback([o] { run_bench_model(*o); });
}

}  // namespace clattn::cli
