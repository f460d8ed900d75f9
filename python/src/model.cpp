// clattn.Encoder, clattn.Decoder and clattn.load_model: Hugging Face checkpoints (model.h) run
// with any per-layer attention plan, logits returned as NumPy arrays without a copy.
//
// Token ids and lengths are checked here (integers, ranks, ranges: ValueError) before the model
// runs; a bad attention plan is ValueError; a folder that cannot be loaded and anything the model
// refuses later is RuntimeError, with clattn's message. A model runs one forward at a time (a
// second thread waits, with the GIL released, as during the forward itself).
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <cmath>
#include <filesystem>
#include <functional>

#include <memory>
#include <mutex>
#include <string>

#include "clattn/error.h"
#include "clattn/model.h"
#include "clattn/tokenizer.h"
#include "common.h"

namespace clattn::py {

pb::object tokenizer_of_folder(const std::string& dir);  // tokenizer.cpp

namespace {

const char* kind_name(ModelKind k) {
  switch (k) {
    case ModelKind::bert: return "bert";
    case ModelKind::kwt: return "kwt";
    case ModelKind::llama: return "llama";
  }
  return "?";
}

pb::dict config_dict(const ModelConfig& c) {
  pb::dict d;
  // The family: GPT-2 runs on the LLaMA decoder's code but is not a LLaMA model.
  d["kind"] = c.model_type == "gpt2" ? "gpt2" : kind_name(c.kind);
  d["model_type"] = c.model_type;
  d["architecture"] = c.architecture;
  d["hidden"] = c.hidden;
  d["layers"] = c.layers;
  d["heads"] = c.heads;
  d["kv_heads"] = c.kv_heads;
  d["head_dim"] = c.head_dim;
  d["ffn"] = c.ffn;
  d["vocab"] = c.vocab;
  d["max_positions"] = c.max_positions;
  d["num_labels"] = c.num_labels;
  d["labels"] = c.labels;
  return d;
}

// Token ids: (T,) or (B, T) integers in [0, vocab), as a contiguous int32 copy.
struct Ids {
  pb::array_t<int32_t> ids;
  int64_t B = 0, T = 0;
  bool batched = false;
};

Ids ids_arg(pb::handle obj, int64_t vocab, const char* name) {
  pb::array a = pb::array::ensure(obj);
  if (!a) {
    PyErr_Clear();
    throw pb::type_error(std::string(name) + " must be an array of token ids");
  }
  if (a.size() == 0)  // before the dtype: [] arrives as float64
    throw pb::value_error(std::string(name) + " holds no token: shape " + shape_str(a));
  const char kind = a.dtype().kind();
  if (kind != 'i' && kind != 'u')
    throw pb::type_error(std::string(name) + " must hold integers, got dtype " + to_str(a.dtype()));
  if (a.ndim() != 1 && a.ndim() != 2)
    throw pb::value_error(std::string(name) + " must be (T,) or (B, T), got shape " + shape_str(a));
  Ids r;
  r.batched = a.ndim() == 2;
  r.B = r.batched ? a.shape(0) : 1;
  r.T = a.shape(a.ndim() - 1);
  if (r.B < 1 || r.T < 1) throw pb::value_error(std::string(name) + " holds no token: shape " + shape_str(a));
  auto wide = pb::array_t<int64_t, pb::array::c_style | pb::array::forcecast>::ensure(a);
  r.ids = pb::array_t<int32_t>(wide.size());
  for (pb::ssize_t i = 0; i < wide.size(); ++i) {
    const int64_t id = wide.data()[i];
    if (id < 0 || id >= vocab)
      throw pb::value_error(std::string(name) + ": token id " + std::to_string(id) + " at flat index " +
                            std::to_string(i) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    r.ids.mutable_data()[i] = static_cast<int32_t>(id);
  }
  return r;
}

pb::array_t<int32_t> lengths_arg(pb::handle obj, const Ids& ids, int32_t min_len) {
  pb::array_t<int32_t> len = int_arg(obj, "lengths");
  if (!len || len.size() == 0) return len;
  if (len.size() != ids.B)
    throw pb::value_error("lengths must have one entry per sequence (B = " + std::to_string(ids.B) + "), got " +
                          std::to_string(len.size()));
  for (pb::ssize_t b = 0; b < len.size(); ++b)
    if (len.data()[b] < min_len || len.data()[b] > ids.T)
      throw pb::value_error("lengths[" + std::to_string(b) + "] = " + std::to_string(len.data()[b]) + " must be in [" +
                            std::to_string(min_len) + ", T = " + std::to_string(ids.T) + "]");
  return len;
}

// (B, T, ...) logits of an unbatched (T,) input lose their leading 1.
pb::array unbatch(pb::array a, bool batched) {
  return batched ? a : pb::array(a[pb::int_(0)]);
}

void set_plan(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    throw_value_error(e.what());
  }
}

// Sequences longer than the model's learned or configured positions: ValueError, as the CLI.
void check_positions(const Ids& ids, const ModelConfig& c) {
  if (c.max_positions > 0 && ids.T > c.max_positions)
    throw pb::value_error("ids: " + std::to_string(ids.T) + " tokens exceed the model's " +
                          std::to_string(c.max_positions) + " positions (" + positions_field(c) + ")");
}

template <class M>
std::unique_ptr<M> load(const std::filesystem::path& dir, const LoadOptions& opt) {
  pb::gil_scoped_release nogil;
  return M::load(dir.string(), opt);
}

// The `weights` argument: 'f32', 'f16' or 'bf16' (ValueError naming them otherwise).
LoadOptions load_options(const std::string& weights) {
  LoadOptions o;
  try {
    o.weights = parse_weight_type(weights);
  } catch (const Error& e) {
    throw pb::value_error(e.what());
  }
  return o;
}

// tokenizer: the folder's tokenizer.json as a clattn.Tokenizer, or None.
struct PyDecoder {
  std::unique_ptr<Decoder> m;
  std::mutex mu;
  pb::object tokenizer = pb::none();
};
struct PyEncoder {
  std::unique_ptr<Encoder> m;
  std::mutex mu;
  pb::object tokenizer = pb::none();
};

template <class P, class M>
std::unique_ptr<P> load_with_tokenizer(const std::filesystem::path& dir, const std::string& weights = "f32") {
  const LoadOptions opt = load_options(weights);
  auto p = std::make_unique<P>();
  p->m = load<M>(dir, opt);
  p->tokenizer = tokenizer_of_folder(dir.string());
  return p;
}

// The folder's tokenizer of a text encoder, for its jobs on texts; ValueError without one.
template <class P>
const Tokenizer& encoder_tokenizer(P& p, const char* what) {
  if (p.tokenizer.is_none())
    throw pb::value_error(std::string(what) + ": this model's folder has no tokenizer.json (KWT takes features: "
                          "forward_features)");
  return p.tokenizer.template cast<const Tokenizer&>();
}

const char* head_name(const Model& m) { return m.has_head() ? task_kind_name(m.head()) : nullptr; }

// Runs f with the GIL released and the model's mutex held.
template <class P, class F>
auto run_locked(P& p, F&& f) {
  pb::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lock(p.mu);
  apply_threads();
  return f();
}

}  // namespace

void bind_model(pb::module_& m) {
  pb::class_<PyDecoder>(m, "Decoder", "A LLaMA-family decoder loaded from a Hugging Face folder")
      .def(pb::init([](const std::filesystem::path& dir, const std::string& weights) {
             return load_with_tokenizer<PyDecoder, Decoder>(dir, weights);
           }),
           pb::arg("path"), pb::kw_only(), pb::arg("weights") = "f32",
           "weights: how the linear layers' weights are held, 'f32' (default), 'f16' or 'bf16' (half the bytes a "
           "decode step reads; inference only: such a model does not train or save)")
      .def_property_readonly("weights", [](PyDecoder& p) { return std::string(weight_type_name(p.m->weights())); },
                             "How the linear layers' weights are held: 'f32', 'f16' or 'bf16'")
      .def_property_readonly("config", [](PyDecoder& p) { return config_dict(p.m->config()); })
      .def_property_readonly("tokenizer", [](PyDecoder& p) { return p.tokenizer; },
                             "The folder's tokenizer.json as a clattn.Tokenizer (None without one)")
      .def("generate", [](PyDecoder& p, pb::handle prompt, int64_t max_tokens, float temperature, int64_t top_k,
                          float top_p, int64_t seed, bool stop_at_eos, float min_p, float repeat_penalty,
                          float frequency_penalty, float presence_penalty, int64_t repeat_last_n,
                          std::vector<std::string> stop, pb::handle context_shift, int64_t keep) -> pb::object {
             if (seed < 0) throw pb::value_error("seed must be >= 0, got " + std::to_string(seed));
             if (max_tokens < 0) throw pb::value_error("max_tokens must be >= 0, got " + std::to_string(max_tokens));
             if (keep < -1) throw pb::value_error("keep must be >= 0 (None: the BOS, if any), got " + std::to_string(keep));
             SamplingOptions so;
             so.temperature = temperature;
             so.top_k = top_k;
             so.top_p = top_p;
             so.seed = static_cast<uint64_t>(seed);
             so.min_p = min_p;
             so.repeat_penalty = repeat_penalty;
             so.frequency_penalty = frequency_penalty;
             so.presence_penalty = presence_penalty;
             so.repeat_last_n = repeat_last_n;
             try {
               check_sampling(so);
               for (const std::string& x : stop) check(!x.empty(), "generate: a stop string must not be empty");
             } catch (const Error& e) {
               throw pb::value_error(e.what());
             }
             const bool text = pb::isinstance<pb::str>(prompt);
             const Tokenizer* tok = p.tokenizer.is_none() ? nullptr : &p.tokenizer.cast<const Tokenizer&>();
             std::vector<int32_t> ids;
             if (text) {
               if (!tok)
                 throw pb::value_error("generate: this model's folder has no tokenizer.json; pass the prompt as token ids");
               ids = tok->encode(prompt.cast<std::string>());
               if (ids.empty()) {
                 if (tok->bos_id() < 0)
                   throw pb::value_error("generate: the prompt is empty and the tokenizer has no BOS token to start from");
                 ids.push_back(tok->bos_id());
               }
             } else {
               const Ids in = ids_arg(prompt, p.m->config().vocab, "prompt");
               if (in.batched) throw pb::value_error("generate: the prompt is one sequence (T,), got a batch");
               ids.assign(in.ids.data(), in.ids.data() + in.ids.size());
             }
             // False / True (rotate where the model can, else reencode) or a mode's name.
             ContextShift shift = ContextShift::off;
             if (pb::isinstance<pb::bool_>(context_shift))
               shift = context_shift.cast<bool>() ? ContextShift::automatic : ContextShift::off;
             else if (pb::isinstance<pb::str>(context_shift))
               try {
                 shift = parse_context_shift(context_shift.cast<std::string>());
               } catch (const Error& e) {
                 throw pb::value_error(e.what());
               }
             else
               throw pb::type_error("context_shift must be a bool or one of 'off', 'auto', 'rotate', 'reencode'");
             const int64_t ctx = p.m->config().max_positions;
             if (shift == ContextShift::off && ctx > 0 && static_cast<int64_t>(ids.size()) + max_tokens > ctx)
               throw pb::value_error("generate: the prompt (" + std::to_string(ids.size()) + " tokens) and " +
                                     std::to_string(max_tokens) + " new tokens exceed the model's context of " +
                                     std::to_string(ctx) + " (context_shift=True continues past it)");
             if (!stop.empty() && !tok)
               throw pb::value_error("generate: stop strings need the folder's tokenizer.json to decode the tokens");
             const int32_t eos = stop_at_eos ? (tok ? tok->eos_id() : p.m->config().eos) : -1;
             if (text && tok->vocab_size() < p.m->config().vocab)
               throw pb::value_error("generate: the tokenizer has " + std::to_string(tok->vocab_size()) +
                                     " tokens, fewer than the model's vocabulary of " +
                                     std::to_string(p.m->config().vocab) + ": it cannot decode every id the model may "
                                     "produce; pass token ids, or use the model's own tokenizer");
             GenerateControl control;
             control.context_shift = shift;
             control.keep = keep >= 0 ? keep : (tok && tok->bos_id() >= 0 && ids.front() == tok->bos_id() ? 1 : 0);
             StopStrings stops(stop);
             int32_t last = ids.back();
             if (!stop.empty())
               control.stop = [&](std::span<const int32_t> made) {
                 const bool hit = stops.feed(tok->decode_piece(last, made.back()));
                 last = made.back();
                 return hit;
               };
             const std::vector<int32_t> out = run_locked(p, [&] {
               return generate(*p.m, ids, max_tokens, so, eos, {}, nullptr, control);
             });
             if (!text) return pb::array_t<int32_t>(static_cast<pb::ssize_t>(out.size()), out.data());
             // The continuation alone, as the streamed pieces after the prompt give it (cut before
             // a stop string).
             std::string s;
             if (!stop.empty()) {
               s = stops.text();
             } else {
               int32_t prev = ids.back();
               for (const int32_t id : out) {
                 s += tok->decode_piece(prev, id);
                 prev = id;
               }
             }
             PyObject* str = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
             if (!str) throw pb::error_already_set();
             return pb::reinterpret_steal<pb::str>(str);
           }, pb::arg("prompt"), pb::arg("max_tokens") = 128, pb::kw_only(), pb::arg("temperature") = 0.0f,
           pb::arg("top_k") = 0, pb::arg("top_p") = 1.0f, pb::arg("seed") = 0, pb::arg("stop_at_eos") = true,
           pb::arg("min_p") = 0.0f, pb::arg("repeat_penalty") = 1.0f, pb::arg("frequency_penalty") = 0.0f,
           pb::arg("presence_penalty") = 0.0f, pb::arg("repeat_last_n") = 64,
           pb::arg("stop") = std::vector<std::string>{}, pb::arg("context_shift") = pb::bool_(false), pb::arg("keep") = -1,
           "Continue a prompt through the KV cache: a str prompt (through the folder's tokenizer) gives the "
           "continuation's text; token ids give the new ids. temperature 0 is greedy; top_k, top_p, min_p, "
           "repeat_penalty, frequency_penalty, presence_penalty, repeat_last_n, seed as `clattn generate` (the "
           "order of clattn::SamplingOptions). stop: strings that end generation (the text ends before the "
           "first; token ids end with the token that completed it). context_shift: past the model's context, "
           "drop the oldest half of the tokens after `keep` (-1: the BOS, if the prompt starts with one): "
           "'rotate' keeps the KV cache and rotates its keys (RoPE models, as llama.cpp), 'reencode' encodes the "
           "window again (any model), True either ('rotate' where the model can)")
      .def("set_attention", [](PyDecoder& p, const std::string& plan) {
             set_plan([&] { run_locked(p, [&] { p.m->set_attention(plan); }); });
           }, pb::arg("plan"),
           "Attention of every layer: one spec, or ';'-separated specs per layer (the last repeats); "
           "each must honour a causal mask")
      .def_property_readonly("attention_specs", [](PyDecoder& p) { return p.m->attention_specs(); })
      .def("save", [](PyDecoder& p, const std::filesystem::path& dir) {
             run_locked(p, [&] { p.m->save(dir.string()); });
           }, pb::arg("dir"),
           "Write the model as a checkpoint folder (config.json + model.safetensors, atomically) in its "
           "family's naming, with its attention plan")
      .def("forward", [](PyDecoder& p, pb::handle ids_obj, pb::handle lengths) {
             const Ids ids = ids_arg(ids_obj, p.m->config().vocab, "ids");
             check_positions(ids, p.m->config());
             const auto len = lengths_arg(lengths, ids, 0);
             Tensor out = run_locked(p, [&] {
               return p.m->forward({ids.ids.data(), static_cast<size_t>(ids.ids.size())}, ids.B, ids.T, span_of(len));
             });
             return unbatch(to_numpy(std::move(out)), ids.batched);
           }, pb::arg("ids"), pb::kw_only(), pb::arg("lengths") = pb::none(),
           "Causal forward: logits (B, T, vocab) for ids (B, T), or (T, vocab) for ids (T,)")
      .def("start", [](PyDecoder& p, int64_t capacity) { run_locked(p, [&] { p.m->start(capacity); }); },
           pb::arg("capacity"), "Incremental decoding: clear the KV cache (capacity positions)")
      .def_property("kv_cache", [](PyDecoder& p) { return std::string(kv_cache_type_name(p.m->kv_cache())); },
                    [](PyDecoder& p, const std::string& t) {
                      KVCacheType k;
                      try {
                        k = parse_kv_cache_type(t);
                      } catch (const Error& e) {
                        throw pb::value_error(e.what());
                      }
                      run_locked(p, [&] { p.m->set_kv_cache(k); });
                    },
                    "KV cache storage of start() and generate(): 'f32' (default), 'f16' or 'bf16' (half the "
                    "bytes a decode step reads; full and local attention only; compute stays f32)")
      .def("prefill", [](PyDecoder& p, pb::handle ids_obj) {
             const Ids ids = ids_arg(ids_obj, p.m->config().vocab, "ids");
             if (ids.batched) throw pb::value_error("prefill takes one sequence (T,), got a batch");
             std::vector<float> l = run_locked(p, [&] {
               return p.m->prefill({ids.ids.data(), static_cast<size_t>(ids.ids.size())});
             });
             return pb::array_t<float>(static_cast<pb::ssize_t>(l.size()), l.data());
           }, pb::arg("ids"), "Run a prompt through the cache: logits of its last position (vocab)")
      .def("step", [](PyDecoder& p, int64_t id) {
             if (id < 0 || id >= p.m->config().vocab)
               throw pb::value_error("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                     std::to_string(p.m->config().vocab) + ")");
             std::vector<float> l = run_locked(p, [&] { return p.m->step(static_cast<int32_t>(id)); });
             return pb::array_t<float>(static_cast<pb::ssize_t>(l.size()), l.data());
           }, pb::arg("id"), "Append one token: logits of the new position (vocab)")
      .def("shift", [](PyDecoder& p, int64_t keep, int64_t discard) { run_locked(p, [&] { p.m->shift(keep, discard); }); },
           pb::arg("keep"), pb::arg("discard"),
           "Context shift on the KV cache (llama.cpp's): drop positions [keep, keep + discard), move the later "
           "ones down, their keys rotated by RoPE so they read as at their new positions (RoPE models)")
      .def_property_readonly("can_shift", [](PyDecoder& p) { return p.m->can_shift(); },
                             "Whether shift() runs: rotary positions (a GPT-2's learned ones: False)")
      .def_property_readonly("position", [](PyDecoder& p) { return p.m->position(); })
      .def_property_readonly("last_attention_ms", [](PyDecoder& p) { return p.m->last_attention_ms(); })
      .def("__repr__", [](PyDecoder& p) { return "clattn.Decoder(" + p.m->config().model_type + ")"; });

  pb::class_<PyEncoder>(m, "Encoder", "A BERT-style or KWT encoder loaded from a Hugging Face folder")
      .def(pb::init([](const std::filesystem::path& dir, const std::string& weights) {
             return load_with_tokenizer<PyEncoder, Encoder>(dir, weights);
           }),
           pb::arg("path"), pb::kw_only(), pb::arg("weights") = "f32",
           "weights: how the layers' matrices are held, 'f32' (default), 'f16' or 'bf16' (inference only)")
      .def_property_readonly("weights", [](PyEncoder& p) { return std::string(weight_type_name(p.m->weights())); },
                             "How the layers' matrices are held: 'f32', 'f16' or 'bf16'")
      .def_property_readonly("config", [](PyEncoder& p) { return config_dict(p.m->config()); })
      .def_property_readonly("tokenizer", [](PyEncoder& p) { return p.tokenizer; },
                             "The folder's tokenizer.json as a clattn.Tokenizer (None without one)")
      .def_property_readonly("head", [](PyEncoder& p) -> pb::object {
             const char* h = head_name(*p.m);
             return h ? pb::object(pb::str(h)) : pb::object(pb::none());
           }, "The task head: 'classify', 'mlm' (masked tokens) or None")
      .def("forward_mlm", [](PyEncoder& p, pb::handle ids_obj, pb::handle lengths) {
             if (!p.m->has_head() || p.m->head() != TaskKind::mlm)  // before the ids, read against a vocabulary
               throw pb::value_error(std::string("forward_mlm needs the masked-token head (a model trained with "
                                                 "--task mlm); this model has ") +
                                     (head_name(*p.m) ? head_name(*p.m) : "no head"));
             const Ids ids = ids_arg(ids_obj, p.m->config().vocab, "ids");
             check_positions(ids, p.m->config());
             const auto len = lengths_arg(lengths, ids, 1);
             Tensor out = run_locked(p, [&] {
               return p.m->forward_mlm({ids.ids.data(), static_cast<size_t>(ids.ids.size())}, ids.B, ids.T, span_of(len));
             });
             return unbatch(to_numpy(std::move(out)), ids.batched);
           }, pb::arg("ids"), pb::kw_only(), pb::arg("lengths") = pb::none(),
           "Masked-token model (trained with --task mlm): logits (B, T, vocab) for ids (B, T), or (T, vocab) for (T,); "
           "read them at the masked positions")
      .def("set_attention", [](PyEncoder& p, const std::string& plan) {
             set_plan([&] { run_locked(p, [&] { p.m->set_attention(plan); }); });
           }, pb::arg("plan"), "Attention of every layer: one spec, or ';'-separated specs per layer")
      .def_property_readonly("attention_specs", [](PyEncoder& p) { return p.m->attention_specs(); })
      .def("save", [](PyEncoder& p, const std::filesystem::path& dir) {
             run_locked(p, [&] { p.m->save(dir.string()); });
           }, pb::arg("dir"),
           "Write the model as a checkpoint folder (config.json + model.safetensors, atomically) in its "
           "family's naming (BERT, RoBERTa, DistilBERT, KWT), with its attention plan")
      .def("forward", [](PyEncoder& p, pb::handle ids_obj, pb::handle lengths, pb::handle types) {
             const Ids ids = ids_arg(ids_obj, p.m->config().vocab, "ids");
             check_positions(ids, p.m->config());
             const auto len = lengths_arg(lengths, ids, 1);
             Ids tt;
             if (!types.is_none()) {
               tt = ids_arg(types, std::max<int64_t>(p.m->config().type_vocab, 1), "token_types");
               if (tt.B != ids.B || tt.T != ids.T)
                 throw pb::value_error("token_types must have the shape of ids");
             }
             Tensor out = run_locked(p, [&] {
               std::span<const int32_t> ts;
               if (tt.ids) ts = {tt.ids.data(), static_cast<size_t>(tt.ids.size())};
               return p.m->forward_tokens({ids.ids.data(), static_cast<size_t>(ids.ids.size())}, ids.B, ids.T,
                                          span_of(len), ts);
             });
             pb::array a = to_numpy(std::move(out));
             return ids.batched || a.ndim() != 3 ? a : unbatch(a, false);
           }, pb::arg("ids"), pb::kw_only(), pb::arg("lengths") = pb::none(), pb::arg("token_types") = pb::none(),
           "BERT: classifier logits (B, labels), or without a classifier the last hidden state (B, T, hidden)")
      .def("forward_features", [](PyEncoder& p, pb::handle features) {
             const ModelConfig& c = p.m->config();
             FloatArg f = float_arg(features, "features", 3, "(B, patches, input_dim)");
             if (f.view.dim(1) != c.num_patches || f.view.dim(2) != c.input_dim || f.view.dim(0) < 1)
               throw pb::value_error("features must be (B >= 1, " + std::to_string(c.num_patches) + ", " +
                                     std::to_string(c.input_dim) + "), got " + f.view.shape.str());
             if (!f.view.contiguous()) f = float_arg(pb::array_t<float, pb::array::c_style>::ensure(f.keep), "features", 3, "");
             Tensor out = run_locked(p, [&] { return p.m->forward_features(f.view); });
             return to_numpy(std::move(out));
           }, pb::arg("features"), "KWT: logits (B, labels) for features (B, patches, input_dim)")
      .def("classify", [](PyEncoder& p, const std::vector<std::string>& texts, int64_t batch) {
             const Tokenizer& tok = encoder_tokenizer(p, "classify");
             if (p.m->config().num_labels < 1)
               throw pb::value_error("classify: this encoder has no classifier (num_labels is 0); embed() gives its "
                                     "pooled hidden states");
             if (batch < 1) throw pb::value_error("classify: batch must be >= 1, got " + std::to_string(batch));
             const std::vector<Classification> got =
                 run_locked(p, [&] { return classify_texts(*p.m, tok, texts, batch); });
             const std::vector<std::string>& names = p.m->config().labels;
             pb::list out;
             for (const Classification& c : got) {
               pb::dict d;
               d["id"] = c.label;
               d["label"] = static_cast<size_t>(c.label) < names.size() && !names[static_cast<size_t>(c.label)].empty()
                                ? names[static_cast<size_t>(c.label)] : std::to_string(c.label);
               d["score"] = c.score;
               out.append(d);
             }
             return out;
           }, pb::arg("texts"), pb::kw_only(), pb::arg("batch") = 32,
           "Classify texts through the folder's tokenizer: [{'id', 'label', 'score'}] per text, as `clattn classify` "
           "(batch texts per forward, padded; a text past the context cut keeping its closing special token)")
      .def("embed", [](PyEncoder& p, const std::vector<std::string>& texts, const std::string& pooling, int64_t batch) {
             const Tokenizer& tok = encoder_tokenizer(p, "embed");
             Pooling pool;
             try {
               pool = parse_pooling(pooling);
             } catch (const Error& e) {
               throw pb::value_error(e.what());
             }
             if (batch < 1) throw pb::value_error("embed: batch must be >= 1, got " + std::to_string(batch));
             Tensor e = run_locked(p, [&] { return embed_texts(*p.m, tok, texts, pool, batch); });
             return to_numpy(std::move(e));
           }, pb::arg("texts"), pb::kw_only(), pb::arg("pooling") = "mean", pb::arg("batch") = 32,
           "Pooled final hidden states of texts, (len(texts), hidden) float32: pooling 'mean' over each text's "
           "positions or 'cls' (its first), as `clattn embed`")
      .def_property_readonly("last_attention_ms", [](PyEncoder& p) { return p.m->last_attention_ms(); })
      .def("__repr__", [](PyEncoder& p) { return "clattn.Encoder(" + p.m->config().model_type + ")"; });

  m.def("read_plan", [](const std::filesystem::path& path) { return read_plan_file(path.string()); }, pb::arg("path"),
        "The attention plan of a plan file (`clattn approx --target` writes one), for set_attention()");
  m.def("load_model", [](const std::filesystem::path& dir, const std::string& weights) -> pb::object {
          (void)load_options(weights);  // a bad value is a ValueError before anything is read
          ModelKind kind;
          {
            pb::gil_scoped_release nogil;
            kind = model_kind(dir.string());
          }
          if (kind == ModelKind::llama) return pb::cast(load_with_tokenizer<PyDecoder, Decoder>(dir, weights));
          return pb::cast(load_with_tokenizer<PyEncoder, Encoder>(dir, weights));
        }, pb::arg("path"), pb::kw_only(), pb::arg("weights") = "f32",
        "A Decoder (llama, gpt2) or Encoder (bert, roberta, distilbert, kwt) from a Hugging Face folder, by its "
        "config.json. weights: the linear layers' weights as 'f32' (default), 'f16' or 'bf16' (inference only)");
}

}  // namespace clattn::py
