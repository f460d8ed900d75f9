// The registry: every variant by name, with its parameters, listed explicitly so a static link
// never drops one. A variant registered here is complete: forward, backward, tests, benchmarks.
// Code outside the library (a test, a program's own variant) adds one with register_attention.
#include <sstream>

#include "attention/registry.h"
#include "clattn/attention.h"
#include "clattn/spec.h"

namespace clattn {

namespace {

std::vector<Registration>& table() {
  static std::vector<Registration> kAll = {
      {"full", "scale=<float>", "exact softmax attention, tiled (FlashAttention-2 style)", "full", make_full},
      {"clustered",
       "clusters=<int, required>, bits=63, iterations=10, hash_bias=true, clustering=lsh|positional, "
       "block=512 (causal), segment=8*block (causal, a multiple of block), scale=<float>, seed=0",
       "queries grouped by Hamming k-means on LSH codes; one attention per centroid (Vyas et al. 2020); "
       "causal: each block exact, its prefix through clusters of the previous segment's queries",
       "clustered:clusters=100", make_clustered},
      {"improved-clustered",
       "as clustered, plus topk=32",
       "clustered, with each query's exact attention on its centroid's top-k keys",
       "improved-clustered:clusters=100,topk=32", make_improved_clustered},
      {"local", "window=<int, required>, scale=<float>",
       "sliding-window softmax attention: |i - j| <= window/2 (causal: the last window positions)",
       "local:window=256", make_local},
      {"linear", "(no parameters)",
       "kernelised attention, phi(x) = elu(x) + 1 (Katharopoulos et al. 2020); causal by prefix sums",
       "linear", make_linear},
      {"topk", "topk=32, scale=<float>",
       "the oracle: each query's k best keys by exact score, softmax over them; O(N*M*D) time, O(N*k) memory",
       "topk:topk=32", make_topk},
      {"smyrf", "hashes=2, q_cluster=32 (<= 64), k_cluster=32, scale=<float>, seed=0",
       "asymmetric-LSH clusters of queries and keys, attention within clusters, rounds combined by log-sum-exp (Daras et al. 2020)",
       "smyrf:hashes=2,q_cluster=32,k_cluster=32", make_smyrf},
      {"reformer", "rounds=1, chunk=32 (<= 64), buckets=auto, seed=0",
       "shared-QK LSH attention: sorted buckets cut into chunks that attend themselves and the previous chunk (Kitaev et al. 2020); k must be q",
       "reformer:rounds=1,chunk=32", make_reformer},
      {"routing", "clusters=<int, required>, window=auto, iterations=10, centroids=kmeans|ema, decay=0.999, scale=<float>, seed=0",
       "queries and keys routed to shared centroids (spherical k-means or EMA); attention within each cluster's windows (Roy et al. 2020)",
       "routing:clusters=128", make_routing},
      {"conditional-full", "length_limit=512, then an inner spec",
       "full attention up to length_limit queries, the inner variant beyond",
       "conditional-full:length_limit=512,improved-clustered:clusters=100", make_conditional_full},
  };
  return kAll;
}

}  // namespace

const std::vector<Registration>& registrations() { return table(); }

void register_attention(Registration r) {
  check(!r.name.empty() && r.name.find_first_of(":,=;") == std::string::npos && r.make,
        "register_attention: a variant needs a name without ':', ',', '=' or ';' and a factory");
  for (const Registration& e : table())
    check(e.name != r.name, "register_attention: '", r.name, "' is already registered");
  const Spec example = parse_spec(r.example);
  check(example.name == r.name, "register_attention: the example spec '", r.example, "' does not name '", r.name, "'");
  (void)describe_parameters(r.make, example);  // the example builds, or this throws
  table().push_back(std::move(r));
}

std::unique_ptr<Attention> make_attention(std::string_view text) {
  const Spec spec = parse_spec(text);
  std::ostringstream names;
  std::vector<std::string> all;
  for (const Registration& r : registrations()) {
    names << (names.tellp() > 0 ? ", " : "") << r.name;
    all.push_back(r.name);
  }
  auto find = [](const std::string& name) -> const Registration* {
    for (const Registration& r : registrations())
      if (r.name == name) return &r;
    return nullptr;
  };
  const Registration* r = find(spec.name);
  check(r != nullptr, "unknown attention '", spec.name, "' in spec '", spec.text, "'",
        did_you_mean(spec.name, all), "; registered: ", names.str());
  if (!spec.inner.empty()) {
    check(r->name == "conditional-full", "spec '", spec.text, "': '", spec.inner,
          "' is not a key=value parameter (", r->name, " takes no inner spec)");
    // Checked here so that a parameter missing its '=' ("conditional-full:length_limit") is
    // reported against the spec the user wrote, not as an unknown attention 'length_limit'.
    const std::string inner_name = parse_spec(spec.inner).name;
    check(find(inner_name) != nullptr, "spec '", spec.text, "': '", spec.inner,
          "' is neither a key=value parameter nor an inner spec (unknown attention '", inner_name,
          "'", did_you_mean(inner_name, all), "; registered: ", names.str(), ")");
  }
  return r->make(spec);
}

std::vector<std::pair<std::string, bool>> capability_list(const Capabilities& c) {
  // A field added to Capabilities must be added here: the aggregate's size says when one was.
  static_assert(sizeof(Capabilities) == 15 * sizeof(bool), "capability_list must name every field of Capabilities");
  return {{"causal", c.causal},
          {"query_lengths", c.query_lengths},
          {"key_lengths", c.key_lengths},
          {"bias", c.bias},
          {"cross", c.cross},
          {"gqa", c.gqa},
          {"trainable", c.trainable},
          {"shared_qk", c.shared_qk},
          {"stochastic", c.stochastic},
          {"stateful", c.stateful},
          {"decode_queries", c.decode_queries},
          {"splits_sequence", c.splits_sequence},
          {"splits_sequence_causal", c.splits_sequence_causal},
          {"half_cache", c.half_cache},
          {"torch_ops", c.torch_ops},
          {"decode", c.causal && !c.shared_qk}};
}

std::vector<VariantInfo> registered_attentions() {
  std::vector<VariantInfo> out;
  for (const Registration& r : registrations()) {
    VariantInfo v{r.name, r.params, r.summary, r.example, {}, {}};
    std::unique_ptr<Attention> a;
    v.parameters = describe_parameters(r.make, parse_spec(r.example), &a);
    v.capabilities = a->capabilities();
    out.push_back(std::move(v));
  }
  return out;
}

}  // namespace clattn
