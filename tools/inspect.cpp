// `clattn inspect`: one head's attention matrix, exact and approximate, as pictures (gnuplot).
//
// The queries and keys come from a real model (--model: layer L's q and k after the projections,
// and RoPE in decoders, captured from a forward with full attention in every layer, so the picture
// isolates the approximation at that layer) or from an `attend` input file (--input).
//
// The exact matrix is computed in double: softmax(q·kᵀ/sqrt(D)) with the run's masks. The
// approximate one is reconstructed for display only: every variant's output is linear in V once
// its discrete choices (hashes, clusters, top-k sets, buckets) are made, and those depend only on
// q, k, the spec's seed and the step. So running the variant with V = 64 one-hot columns at a time
// (V = I[:, j0:j0+64], Dv = 64) gives O = A·V = columns j0..j0+63 of its matrix A, exactly, for
// any variant, and the kernels keep never holding N x M. The command checks the claim on the run's
// real V (max |A·V − attention(q, k, v)| is printed). Quadratic by design: N, M <= 2048.
//
// Cluster ids are Attention::query_groups of the training Context the forwards filled (the same
// partition backward would use): clusters of clustered / improved-clustered (causal: each segment
// of positions has its own clusters, numbered segment after segment), routing's clusters (a query
// in several takes the first), SMYRF's round-0 clusters, Reformer's round-0 chunks. Clusters are
// renumbered by their mean position, so a clustering that follows position draws a staircase in
// the second picture and one that follows content draws a scatter; R² (the share of the variance
// of the position explained by the cluster) says it in one number.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "cli_util.h"
#include "clattn/attention.h"
#include "clattn/error.h"
#include "clattn/model.h"
#include "clattn/threads.h"
#include "clattn/safetensors.h"
#include "clattn/spec.h"
#include "commands.h"
#include "progress.h"
#include "plot_util.h"

namespace clattn::cli {
namespace {

constexpr int64_t kMaxInspect = 2048;  // N and M: the pictures are N x M
constexpr int64_t kBlock = 64;         // one-hot columns per forward
constexpr int64_t kMaxCells = 512;     // heatmap cells per axis; larger matrices are mean-pooled
constexpr int kWidth = 1500, kHeight = 560, kClusterWidth = 900, kClusterHeight = 600;

struct InspectOptions {
  std::string model, features, tokens, input, attention, out, clusters_out;
  int64_t index = 0, layer = 0, head = 0;
  bool causal = false;
  int threads = 0;
};

// One head's problem: q (1, H, N, D), k, v (1, Hkv, M, D) contiguous, masks of that example.
struct Problem {
  Tensor q, k, v;
  std::vector<int32_t> qlen, klen;  // [1] or empty
  bool causal = false;
  uint64_t step = 0;
  bool from_model = false;
  std::string source;  // for the title
};

Tensor batch_row(const Tensor& t, int64_t b) {  // (B, ...) -> (1, ...)
  ConstView v = t.view();
  v.data += b * v.stride(0);
  v.shape.dims[0] = 1;
  return Tensor::from(v);
}

Problem from_model(const InspectOptions& o) {
  const int given = !o.features.empty() + !o.tokens.empty();
  usage_check(given == 1, "inspect: with --model give exactly one of --features FILE or --token-file FILE");
  const ModelKind kind = model_kind(o.model);
  AttentionCapture cap;
  cap.layer = o.layer;
  Problem p;
  p.from_model = true;
  auto check_layer = [&](const ModelConfig& c) {
    usage_check(o.layer < c.layers, "inspect: --layer ", o.layer, " is out of range: the model has ", c.layers,
                " layers (0..", c.layers - 1, ")");
    usage_check(o.head < c.heads, "inspect: --head ", o.head, " is out of range: the model has ", c.heads,
                " heads (0..", c.heads - 1, ")");
  };
  if (kind == ModelKind::kwt) {
    usage_check(!o.features.empty(), "inspect: a KWT model takes --features FILE --index I");
    auto enc = Encoder::load(o.model);
    check_layer(enc->config());
    const SafetensorsFile f = SafetensorsFile::open(o.features);
    check(f.has("features"), "inspect: '", o.features, "' has no tensor 'features' [n, patches, dim]");
    const Tensor all = f.get_f32("features");
    check(all.rank() == 3, "inspect: 'features' must be [n, patches, dim], got ", all.shape());
    usage_check(o.index < all.dim(0), "inspect: --index ", o.index, " is out of range: '", o.features, "' holds ",
                all.dim(0), " examples");
    enc->set_capture(&cap);
    (void)enc->forward_features(batch_row(all, o.index).view());
    p.source = std::filesystem::path(o.model).filename().string() + " on " +
               std::filesystem::path(o.features).filename().string() + " #" + std::to_string(o.index);
  } else {
    usage_check(!o.tokens.empty(), "inspect: a token model takes --token-file FILE (integer 'tokens' [T] or [B, T])");
    // The token files of `clattn approx`: integer 'tokens' [T] or [B, T]; --index picks the row.
    const SafetensorsFile f = SafetensorsFile::open(o.tokens);
    check(f.has("tokens"), "inspect: '", o.tokens, "' has no integer tensor 'tokens' ([T] or [B, T])");
    const TensorInfo& info = f.info("tokens");
    check(info.shape.size() == 1 || info.shape.size() == 2, "inspect: 'tokens' must be [T] or [B, T]");
    const int64_t B = info.shape.size() == 2 ? info.shape[0] : 1, T = info.shape.back();
    usage_check(o.index < B, "inspect: --index ", o.index, " is out of range: '", o.tokens, "' holds ", B, " rows");
    check(T >= 1 && T <= kMaxInspect, "inspect: ", T, " tokens: the pictures are N x N, so N must be in [1, ",
          kMaxInspect, "]");
    const std::vector<int32_t> all = f.get_i32("tokens");
    const std::vector<int32_t> ids(all.begin() + o.index * T, all.begin() + (o.index + 1) * T);
    if (kind == ModelKind::llama) {
      auto dec = Decoder::load(o.model);
      check_layer(dec->config());
      check_context(T, dec->config().max_positions, "inspect: '" + o.tokens + "'", positions_field(dec->config()));
      dec->set_capture(&cap);
      (void)dec->forward(ids, 1, T);
    } else {
      auto enc = Encoder::load(o.model);
      check_layer(enc->config());
      check_context(T, enc->config().max_positions, "inspect: '" + o.tokens + "'");
      enc->set_capture(&cap);
      (void)enc->forward_tokens(ids, 1, T);
    }
    p.source = std::filesystem::path(o.model).filename().string() + " on " +
               std::filesystem::path(o.tokens).filename().string() +
               (B > 1 ? " #" + std::to_string(o.index) : std::string());
  }
  check(cap.q.defined(), "inspect: layer ", o.layer, " was not captured");
  p.q = std::move(cap.q);
  p.k = std::move(cap.k);
  p.v = std::move(cap.v);
  p.causal = cap.causal;
  p.step = cap.step;
  p.source += ", layer " + std::to_string(o.layer);
  return p;
}

Problem from_input(const InspectOptions& o) {
  const SafetensorsFile f = SafetensorsFile::open(o.input);
  for (const char* n : {"q", "k", "v"})
    check(f.has(n), "inspect: '", o.input, "' has no tensor '", n, "' (make one with clattn make-inputs)");
  Problem p;
  const Tensor q = f.get_f32("q"), k = f.get_f32("k"), v = f.get_f32("v");
  check(q.rank() == 4 && k.rank() == 4 && v.rank() == 4, "inspect: q, k, v must be (B, H, N, D)");
  usage_check(o.index < q.dim(0), "inspect: --index ", o.index, " is out of range: '", o.input, "' holds ",
              q.dim(0), " examples");
  usage_check(o.head < q.dim(1), "inspect: --head ", o.head, " is out of range: q has ", q.dim(1), " heads");
  check(k.dim(0) == q.dim(0) && v.dim(0) == q.dim(0), "inspect: q, k, v must have the same batch");
  p.q = batch_row(q, o.index);
  p.k = batch_row(k, o.index);
  p.v = batch_row(v, o.index);
  for (const auto& [name, dst] : {std::pair{"query_lengths", &p.qlen}, std::pair{"key_lengths", &p.klen}}) {
    if (!f.has(name)) continue;
    const std::vector<int32_t> all = f.get_i32(name);
    check(static_cast<int64_t>(all.size()) == q.dim(0), "inspect: '", name, "' must have B = ", q.dim(0), " entries");
    dst->assign(1, all[static_cast<size_t>(o.index)]);
  }
  if (f.has("bias")) std::fprintf(stderr, "inspect: note: the file's additive bias is not drawn (full only)\n");
  p.causal = o.causal;
  p.source = std::filesystem::path(o.input).filename().string() +
             (q.dim(0) > 1 ? " #" + std::to_string(o.index) : std::string());
  return p;
}

// The exact attention matrix of head h (N, M) in double: softmax over visible keys, rows of
// padded queries and queries with no visible key are 0.
std::vector<float> exact_matrix(const Problem& p, int64_t h) {
  const int64_t H = p.q.dim(1), Hkv = p.k.dim(1), N = p.q.dim(2), M = p.k.dim(2), D = p.q.dim(3);
  const int64_t hk = h / (H / Hkv);
  const int64_t nq = p.qlen.empty() ? N : p.qlen[0], nk = p.klen.empty() ? M : p.klen[0];
  const double s = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<float> A(static_cast<size_t>(N * M), 0.f);
  const float* q = p.q.data() + h * N * D;
  const float* k = p.k.data() + hk * M * D;
  parallel_for(nq, [&](int64_t i) {
    const int64_t last = std::min(nk, p.causal ? i + (M - N) + 1 : nk);  // keys [0, last)
    if (last <= 0) return;
    std::vector<double> z(static_cast<size_t>(last));
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < last; ++j) {
      double dot = 0;
      for (int64_t e = 0; e < D; ++e) dot += static_cast<double>(q[i * D + e]) * k[j * D + e];
      z[static_cast<size_t>(j)] = s * dot;
      mx = std::max(mx, s * dot);
    }
    for (double& x : z) sum += x = std::exp(x - mx);
    for (int64_t j = 0; j < last; ++j) A[static_cast<size_t>(i * M + j)] = static_cast<float>(z[static_cast<size_t>(j)] / sum);
  });
  return A;
}

struct Approx {
  std::vector<float> A;        // (N, M) head h's matrix
  std::vector<int32_t> group;  // (N) group of each query, -1 none; empty when no query is in one
  std::string group_word;      // what a group is (QueryGroups::kind)
  double check_err = 0, check_scale = 0;  // max |A·V − O| and max |O| on the real V
};

Approx approx_matrix(const Problem& p, const Attention& att, int64_t h) {
  const int64_t H = p.q.dim(1), Hkv = p.k.dim(1), N = p.q.dim(2), M = p.k.dim(2), D = p.q.dim(3);
  AttentionInputs in;
  in.q = p.q.view();
  in.k = att.capabilities().shared_qk ? p.q.view() : p.k.view();
  in.causal = p.causal;
  in.query_lengths = p.qlen;
  in.key_lengths = p.klen;
  in.step = p.step;
  AttentionState state;  // routing's centroids, made from the seed once and shared by every call
  in.state = &state;
  Context ctx(Mode::training);  // keeps the discrete choices, read by query_groups
  Approx a;
  a.A.assign(static_cast<size_t>(N * M), 0.f);
  Tensor onehot(Shape{1, Hkv, M, kBlock});  // (1, Hkv, M, 64)
  Tensor out(Shape{1, H, N, kBlock});       // (1, H, N, 64)
  for (int64_t j0 = 0; j0 < M; j0 += kBlock) {
    onehot.fill(0.f);
    for (int64_t g = 0; g < Hkv; ++g)
      for (int64_t c = 0; c < kBlock && j0 + c < M; ++c) onehot.data()[(g * M + j0 + c) * kBlock + c] = 1.f;
    in.v = onehot.view();
    att.forward(in, out, ctx);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t c = 0; c < kBlock && j0 + c < M; ++c)
        a.A[static_cast<size_t>(i * M + j0 + c)] = out.data()[(h * N + i) * kBlock + c];
  }
  // The partition the forwards used (the same for every V): the groups of head h's queries.
  QueryGroups g = att.query_groups(in, ctx, 0, h);
  if (std::any_of(g.ids.begin(), g.ids.end(), [](int32_t x) { return x >= 0; })) {
    a.group = std::move(g.ids);
    a.group_word = std::move(g.kind);
  }
  // The claim checked on the real values: A·V equals the variant's output.
  in.v = p.v.view();
  const int64_t Dv = p.v.dim(3), hk = h / (H / Hkv);
  Tensor o(Shape{1, H, N, Dv});
  Context ctx2(Mode::inference);
  att.forward(in, o, ctx2);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t e = 0; e < Dv; ++e) {
      double acc = 0;
      for (int64_t j = 0; j < M; ++j) acc += static_cast<double>(a.A[static_cast<size_t>(i * M + j)]) * p.v.data()[(hk * M + j) * Dv + e];
      const double y = o.data()[(h * N + i) * Dv + e];
      a.check_err = std::max(a.check_err, std::abs(acc - y));
      a.check_scale = std::max(a.check_scale, std::abs(y));
    }
  (void)D;
  return a;
}

// Clusters renumbered by increasing mean position; returns R² of position explained by cluster.
double renumber_by_position(std::vector<int32_t>& g) {
  const int32_t C = g.empty() ? 0 : *std::max_element(g.begin(), g.end()) + 1;
  std::vector<double> sum(static_cast<size_t>(C), 0), cnt(static_cast<size_t>(C), 0);
  double all = 0, n = 0;
  for (size_t i = 0; i < g.size(); ++i)
    if (g[i] >= 0) {
      sum[static_cast<size_t>(g[i])] += static_cast<double>(i);
      cnt[static_cast<size_t>(g[i])] += 1;
      all += static_cast<double>(i);
      n += 1;
    }
  std::vector<int32_t> ids;
  for (int32_t c = 0; c < C; ++c)
    if (cnt[static_cast<size_t>(c)] > 0) ids.push_back(c);
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return sum[static_cast<size_t>(a)] / cnt[static_cast<size_t>(a)] < sum[static_cast<size_t>(b)] / cnt[static_cast<size_t>(b)];
  });
  std::vector<int32_t> rank(static_cast<size_t>(C), -1);
  for (size_t r = 0; r < ids.size(); ++r) rank[static_cast<size_t>(ids[r])] = static_cast<int32_t>(r);
  double tot = 0, within = 0;
  const double mean = n > 0 ? all / n : 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i] < 0) continue;
    const double m = sum[static_cast<size_t>(g[i])] / cnt[static_cast<size_t>(g[i])];
    tot += (static_cast<double>(i) - mean) * (static_cast<double>(i) - mean);
    within += (static_cast<double>(i) - m) * (static_cast<double>(i) - m);
    g[i] = rank[static_cast<size_t>(g[i])];
  }
  return tot > 0 ? 1.0 - within / tot : 1.0;
}

// (N, M) mean-pooled by f x f blocks (edge blocks average what they hold).
std::vector<float> pool(const std::vector<float>& A, int64_t N, int64_t M, int64_t f, int64_t& pn, int64_t& pm) {
  pn = (N + f - 1) / f;
  pm = (M + f - 1) / f;
  std::vector<float> out(static_cast<size_t>(pn * pm), 0.f);
  for (int64_t r = 0; r < pn; ++r)
    for (int64_t c = 0; c < pm; ++c) {
      double s = 0;
      int64_t n = 0;
      for (int64_t i = r * f; i < std::min(N, (r + 1) * f); ++i)
        for (int64_t j = c * f; j < std::min(M, (c + 1) * f); ++j, ++n) s += A[static_cast<size_t>(i * M + j)];
      out[static_cast<size_t>(r * pm + c)] = static_cast<float>(s / static_cast<double>(n));
    }
  return out;
}

std::string fmt(const char* f, double x) {
  char b[64];
  std::snprintf(b, sizeof b, f, x);
  return b;
}

// Distinct colours for cluster ids (as 0xRRGGBB, drawn with `lc rgb variable`): matplotlib's
// tab20 with its ten strong colours first, then hues spread by the golden angle at three
// saturation / brightness levels. Ids repeat colours only past kColours, and the picture says so.
constexpr int32_t kColours = 60;

int32_t group_colour(int32_t id) {
  static constexpr int32_t kTab20[20] = {0x1f77b4, 0xff7f0e, 0x2ca02c, 0xd62728, 0x9467bd, 0x8c564b, 0xe377c2,
                                         0x7f7f7f, 0xbcbd22, 0x17becf, 0xaec7e8, 0xffbb78, 0x98df8a, 0xff9896,
                                         0xc5b0d5, 0xc49c94, 0xf7b6d2, 0xc7c7c7, 0xdbdb8d, 0x9edae5};
  id %= kColours;
  if (id < 20) return kTab20[id];
  const int32_t k = id - 20;
  const double h = std::fmod(0.13 + 0.6180339887 * k, 1.0) * 6;
  const double sat[3] = {0.85, 0.55, 1.0}, val[3] = {0.6, 0.92, 0.8};
  const double S = sat[k % 3], V = val[k % 3];
  const double f = h - std::floor(h), pp = V * (1 - S), q = V * (1 - S * f), t = V * (1 - S * (1 - f));
  double r = V, g = t, b = pp;
  switch (static_cast<int>(h) % 6) {
    case 1: r = q, g = V, b = pp; break;
    case 2: r = pp, g = V, b = t; break;
    case 3: r = pp, g = q, b = V; break;
    case 4: r = t, g = pp, b = V; break;
    case 5: r = V, g = pp, b = q; break;
    default: break;
  }
  auto byte = [](double x) { return static_cast<int32_t>(std::lround(std::clamp(x, 0.0, 1.0) * 255)); };
  return byte(r) << 16 | byte(g) << 8 | byte(b);
}

void draw(const Problem& p, const std::string& spec, int64_t h, const std::vector<float>& F, const Approx& a,
          double r2, const InspectOptions& o, const std::string& clusters_out) {
  const int64_t N = p.q.dim(2), M = p.k.dim(2);
  const int64_t f = (std::max(N, M) + kMaxCells - 1) / kMaxCells;
  std::vector<float> diff(F.size());
  double l1 = 0, dmax = 0;
  for (size_t x = 0; x < F.size(); ++x) {
    diff[x] = a.A[x] - F[x];
    l1 += std::abs(diff[x]);
  }
  int64_t pn = 0, pm = 0;
  const std::vector<float> pf = pool(F, N, M, f, pn, pm), pa = pool(a.A, N, M, f, pn, pm), pd = pool(diff, N, M, f, pn, pm);
  for (const float d : pd) dmax = std::max(dmax, static_cast<double>(std::abs(d)));
  if (dmax < 1e-6) dmax = 1e-6;
  auto logw = [](std::vector<float> v) {  // log10 of the weight, floored at 1e-4 (and at 0)
    for (float& x : v) x = std::log10(std::max(x, 1e-4f));
    return v;
  };
  plot::TempDir dir;
  const std::string ff = dir.write_floats("full.bin", logw(pf)), fa = dir.write_floats("approx.bin", logw(pa)),
                    fd = dir.write_floats("diff.bin", pd);
  const std::string arr = " binary array=(" + std::to_string(pm) + "," + std::to_string(pn) +
                          ") format='%float32' dx=" + std::to_string(f) + " dy=" + std::to_string(f) +
                          " origin=(" + fmt("%g", 0.5 * static_cast<double>(f) - 0.5) + "," +
                          fmt("%g", 0.5 * static_cast<double>(f) - 0.5) + ")";
  const std::string range = "set xrange [-0.5:" + std::to_string(M) + "-0.5]\nset yrange [" + std::to_string(N) +
                            "-0.5:-0.5]\n";
  const double row_l1 = l1 / static_cast<double>(N);
  std::string title = p.source + ", head " + std::to_string(h) + ", N = " + std::to_string(N) +
                      (M != N ? ", M = " + std::to_string(M) : std::string()) + (p.causal ? ", causal" : "") +
                      "\n" + spec + ": mean row L1 |A - A_full| = " + fmt("%.3g", row_l1);
  if (f > 1) title += " (cells are means of " + std::to_string(f) + " x " + std::to_string(f) + " entries)";
  std::string s = "set terminal pngcairo size " + std::to_string(kWidth) + "," + std::to_string(kHeight) +
                  " font 'DejaVu Sans,10'\nset termoption noenhanced\nset output " +
                  plot::quote(dir.file("plot.png")) + "\n";
  s += "set multiplot title " + plot::quote(title) + " font ',11'\n";
  s += "set tmargin at screen 0.83\nset bmargin at screen 0.10\nset tics out nomirror\n" + range;
  const bool strip = !a.group.empty();
  if (strip) {  // the cluster of each query, along the query axis of the first heatmap
    std::string g;
    for (const int32_t x : a.group) g += std::to_string(x < 0 ? -1 : group_colour(x)) + "\n";
    const std::string fg = dir.write("groups_strip.dat", g);
    s += "set lmargin at screen 0.045\nset rmargin at screen 0.06\nunset colorbox\nset xrange [0:1]\n"
         "unset xtics\nset ylabel 'query position'\nset title " + plot::quote(a.group_word) + "\n";
    s += "plot " + plot::quote(fg) + " using (0.5):0:(1.0):(1.0):($1 < 0 ? 1/0 : $1) with boxxyerror fill solid "
         "noborder lc rgb variable notitle\n";
    s += "unset ylabel\nset xtics\nset ytics format ''\n" + range;
  } else {
    s += "set ylabel 'query position'\n";
  }
  s += "set palette maxcolors 0\nset palette cubehelix start 0.5 cycles -1.2 saturation 1.2 negative\nset cbrange [-4:0]\n"
       "set cbtics ('1e-4' -4, '1e-3' -3, '0.01' -2, '0.1' -1, '1' 0)\nset xlabel 'key position'\n";
  s += "set lmargin at screen 0.065\nset rmargin at screen 0.325\nunset colorbox\n";
  s += "set title 'full attention (weight, log scale)'\nplot " + plot::quote(ff) + arr + " with image notitle\n";
  s += "set ytics format ''\nunset ylabel\nset lmargin at screen 0.36\nset rmargin at screen 0.62\n"
       "set colorbox user origin screen 0.625, screen 0.10 size screen 0.01, screen 0.73\n";
  s += "set title " + plot::quote("approximation (" + parse_spec(spec).name + ")") + "\nplot " + plot::quote(fa) + arr +
       " with image notitle\n";
  s += "set palette positive defined (-1 '#2166ac', 0 '#f7f7f7', 1 '#b2182b')\nset palette maxcolors 0\n"
       "set cbrange [" + fmt("%g", -dmax) + ":" + fmt("%g", dmax) + "]\nset cbtics auto\nset format cb '%.2g'\n"
       "set lmargin at screen 0.69\nset rmargin at screen 0.935\n"
       "set colorbox user origin screen 0.94, screen 0.10 size screen 0.01, screen 0.73\n";
  s += "set title 'approximation - full'\nplot " + plot::quote(fd) + arr + " with image notitle\n";
  s += "unset multiplot\n";
  plot::run_gnuplot(dir, s, o.out);
  std::fprintf(stderr, "inspect: wrote %s (%d x %d)\n", o.out.c_str(), kWidth, kHeight);

  if (!strip) return;
  std::string g;
  for (size_t i = 0; i < a.group.size(); ++i)
    if (a.group[i] >= 0) g += std::to_string(i) + " " + std::to_string(a.group[i]) + " " + std::to_string(group_colour(a.group[i])) + "\n";
  const std::string fg = dir.write("groups.dat", g);
  const int32_t C = *std::max_element(a.group.begin(), a.group.end()) + 1;
  std::string c = "set terminal pngcairo size " + std::to_string(kClusterWidth) + "," + std::to_string(kClusterHeight) +
                  " font 'DejaVu Sans,10'\nset termoption noenhanced\nset output " +
                  plot::quote(dir.file("plot.png")) + "\nset grid\n";
  c += "set title " + plot::quote(p.source + ", head " + std::to_string(h) + "\n" + spec + "\n" +
                                  std::to_string(C) + " " + a.group_word + "s; the " + a.group_word +
                                  " explains R2 = " + fmt("%.2f", r2) +
                                  " of the variance of the position (1: blocks of positions, 0: position-blind)" +
                                  (C > kColours ? "; colours repeat every " + std::to_string(kColours) + " " +
                                                      a.group_word + "s"
                                                : std::string())) + "\n";
  c += "set xlabel 'query position'\nset ylabel " +
       plot::quote(a.group_word + " (numbered by mean position)") + "\n";
  c += "set xrange [-1:" + std::to_string(N) + "]\nset yrange [-0.5:" + std::to_string(C) + "-0.5]\nunset colorbox\n";
  c += "plot " + plot::quote(fg) + " using 1:2:3 with points pt 7 ps 0.8 lc rgb variable notitle\n";
  plot::run_gnuplot(dir, c, clusters_out);
  std::fprintf(stderr, "inspect: wrote %s (%d x %d)\n", clusters_out.c_str(), kClusterWidth, kClusterHeight);
}

void run_inspect(const InspectOptions& o) {
  set_threads(checked_threads(o.threads, "inspect"));
  usage_check(o.model.empty() != o.input.empty(), "inspect: give exactly one of --model DIR or --input FILE");
  usage_check(!o.out.empty(), "inspect: --output PNG is required");
  usage_check(o.input.empty() || (o.features.empty() && o.tokens.empty()),
              "inspect: --features and --token-file go with --model, not --input");
  usage_check(o.model.empty() || !o.causal, "inspect: --causal is for --input (a model sets its own mask)");
  check_outputs("inspect", {{"--output", o.out}, {"--clusters-output", o.clusters_out}},
                {{"--model", o.model, true}, {"--features", o.features}, {"--token-file", o.tokens}, {"--input", o.input}});
  check_size(o.index, 0, kMaxCount, "inspect: --index");
  check_size(o.layer, 0, kMaxCount, "inspect: --layer");
  check_size(o.head, 0, kMaxCount, "inspect: --head");
  for (const std::string* out : {&o.out, &o.clusters_out}) {
    if (out->empty()) continue;
    const std::string ext = std::filesystem::path(*out).extension().string();
    usage_check(ext == ".png" || ext == ".PNG", "inspect: outputs must be .png files, got '", *out, "'");
  }
  std::unique_ptr<Attention> att;
  try {
    att = make_attention(o.attention);
  } catch (const Error& e) {
    usage_fail("inspect: --attention: ", e.what());
  }
  plot::find_gnuplot();  // before the model runs
  Progress progress("inspect", 3);
  progress.set(0, o.model.empty() ? "reading " + o.input : "forward of " + o.model + " with full attention");
  Problem p = o.model.empty() ? from_input(o) : from_model(o);
  const int64_t H = p.q.dim(1), Hkv = p.k.dim(1), N = p.q.dim(2), M = p.k.dim(2);
  check(N <= kMaxInspect && M <= kMaxInspect, "inspect: N = ", N, ", M = ", M, ": the pictures are N x M, so ",
        "both must be <= ", kMaxInspect, " (for longer sequences use a prefix)");
  check(Hkv >= 1 && H % Hkv == 0, "inspect: heads ", H, " must be a multiple of kv heads ", Hkv);
  if (p.from_model) {
    // The refusals a model would make at this layer (shared-QK keys, a causal mask, grouped heads).
    (void)make_plan_attentions({o.attention}, p.causal, H != Hkv);
  } else if (att->capabilities().shared_qk) {
    check(H == Hkv, "inspect: ", o.attention, " shares queries and keys (k = q), so q and v need the same heads; got ",
          H, " query heads and ", Hkv, " kv heads");
    progress.above([&] { std::fprintf(stderr, "inspect: note: %s shares queries and keys: k = q\n", o.attention.c_str()); });
    p.k = Tensor::from(p.q.view());
  }
  progress.set(1, detail::concat("exact matrix, ", N, " x ", M));
  const std::vector<float> F = exact_matrix(p, o.head);
  progress.set(2, detail::concat(att->name(), " matrix, ", N, " x ", M));
  Approx a = approx_matrix(p, *att, o.head);
  progress.finish();
  const double r2 = a.group.empty() ? 0 : renumber_by_position(a.group);
  const double rel = a.check_err / std::max(a.check_scale, 1e-30);
  std::fprintf(stderr, "inspect: %s, head %lld: reconstruction check max |A·V - attention(q, k, v)| = %.2e (%.1e of max |O|)\n",
               att->name().c_str(), static_cast<long long>(o.head), a.check_err, rel);
  check(rel < 1e-3, "inspect: the reconstructed matrix does not reproduce the variant's output (", rel,
        " relative): its output is not linear in V with choices fixed by q and k");
  double l1 = 0;
  for (size_t x = 0; x < F.size(); ++x) l1 += std::abs(static_cast<double>(a.A[x]) - F[x]);
  std::printf("mean row L1 |A - A_full| = %.6g\n", l1 / static_cast<double>(N));
  if (!a.group.empty()) std::printf("%ss: %d, R2 of position explained by %s = %.4f\n", a.group_word.c_str(),
                                    *std::max_element(a.group.begin(), a.group.end()) + 1, a.group_word.c_str(), r2);
  std::string clusters_out = o.clusters_out;
  if (clusters_out.empty()) {
    const std::filesystem::path op(o.out);
    clusters_out = (op.parent_path() / (op.stem().string() + "-clusters.png")).string();
  }
  if (a.group.empty())
    std::fprintf(stderr, "inspect: no cluster picture: %s groups no queries\n", att->name().c_str());
  draw(p, att->name(), o.head, F, a, r2, o, clusters_out);
}

}  // namespace

void add_inspect(CLI::App& app) {
  auto o = std::make_shared<InspectOptions>();
  CLI::App* sub = app.add_subcommand(
      "inspect", "Draw one head's attention matrix, exact and approximate, their difference and the "
                 "clusters of the queries (gnuplot; N <= 2048)");
  sub->add_option("--model", o->model, "model folder: q and k of --layer, from a forward with full attention");
  sub->add_option("--features", o->features, "KWT feature set (.safetensors 'features' [n, 98, 40]); see --index");
  sub->add_option("--token-file", o->tokens, "token model input: .safetensors with integer 'tokens' [T] or [B, T]");
  sub->add_option("--input", o->input, "an attend input file (clattn make-inputs) instead of a model");
  sub->add_option("--index", o->index, "example (row) of the features, tokens or input file")->capture_default_str();
  sub->add_option("--layer", o->layer, "layer of the model")->capture_default_str();
  sub->add_option("--head", o->head, "query head")->capture_default_str();
  sub->add_option("--attention", o->attention, "the approximation to draw beside full attention")
      ->required()
      ->check(spec_validator());
  sub->add_flag("--causal", o->causal, "--input: causal mask");
  sub->add_option("--output", o->out, "the heatmaps (PNG, required)");
  sub->add_option("--clusters-output", o->clusters_out,
                  "cluster against position (PNG; default: the --output name with -clusters)");
  add_threads_option(sub, o->threads, "inspect");
  sub->footer("Pictures are drawn by gnuplot with the pngcairo terminal ($CLATTN_GNUPLOT, else gnuplot on\n"
              "PATH); without it the command fails and names the package: gnuplot-nox.");
  sub->callback([o] { run_inspect(*o); });
}

}  // namespace clattn::cli
