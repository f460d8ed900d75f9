"""RoBERTa and DistilBERT checkpoints as transformers writes them: tiny models in the exact folder
layout (tensor names and shapes, F32 safetensors, config.json with every field transformers puts
there, the sharded index form), read by clattn.load_model and compared with an independent NumPy
forward in float64 that follows transformers' modeling_roberta.py / modeling_distilbert.py."""
import json
import math

import numpy as np
import pytest

import clattn

H, HEADS, F, LAYERS, VOCAB, LABELS = 32, 4, 48, 2, 50, 3


def rng_tensor(rng, shape, scale=0.3, offset=0.0):
    return (offset + scale * rng.standard_normal(shape)).astype(np.float32)


def linear(rng, out, inp, scale=0.3):
    return rng_tensor(rng, (out, inp), scale), rng_tensor(rng, (out,), 0.1)


def layer_norm(rng):
    return rng_tensor(rng, (H,), 0.1, 1.0), rng_tensor(rng, (H,), 0.1)


def write_folder(path, config, tensors, shards=1):
    """config.json and the weights, one file or `shards` files with transformers' index."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if shards == 1:
        clattn.write_safetensors(path / "model.safetensors", tensors, {"format": "pt"})
        return
    names = sorted(tensors)
    weight_map, total = {}, 0
    for i in range(shards):
        part = {n: tensors[n] for n in names[i::shards]}
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        clattn.write_safetensors(path / fname, part, {"format": "pt"})
        weight_map.update({n: fname for n in part})
        total += sum(t.nbytes for t in part.values())
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")


# ---- checkpoints

ROBERTA_CONFIG = {
    "_name_or_path": "tiny-roberta", "architectures": ["RobertaForSequenceClassification"],
    "attention_probs_dropout_prob": 0.1, "bos_token_id": 0, "classifier_dropout": None, "eos_token_id": 2,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": H, "initializer_range": 0.02,
    "intermediate_size": F, "layer_norm_eps": 1e-05, "max_position_embeddings": 40, "model_type": "roberta",
    "num_attention_heads": HEADS, "num_hidden_layers": LAYERS, "pad_token_id": 1,
    "position_embedding_type": "absolute", "problem_type": "single_label_classification",
    "torch_dtype": "float32", "transformers_version": "4.44.2", "type_vocab_size": 1, "use_cache": True,
    "vocab_size": VOCAB, "id2label": {"0": "NEG", "1": "NEU", "2": "POS"},
    "label2id": {"NEG": 0, "NEU": 1, "POS": 2},
}

DISTIL_CONFIG = {
    "_name_or_path": "tiny-distilbert", "activation": "gelu", "architectures": ["DistilBertForSequenceClassification"],
    "attention_dropout": 0.1, "dim": H, "dropout": 0.1, "hidden_dim": F, "initializer_range": 0.02,
    "max_position_embeddings": 40, "model_type": "distilbert", "n_heads": HEADS, "n_layers": LAYERS,
    "pad_token_id": 0, "qa_dropout": 0.1, "seq_classif_dropout": 0.2, "sinusoidal_pos_embds": False,
    "tie_weights_": True, "torch_dtype": "float32", "transformers_version": "4.44.2", "vocab_size": VOCAB,
    "id2label": {"0": "A", "1": "B", "2": "C"}, "label2id": {"A": 0, "B": 1, "C": 2},
}


def roberta_tensors(seed, classifier=True):
    rng = np.random.default_rng(seed)
    t = {}
    e = "roberta.embeddings."
    t[e + "word_embeddings.weight"] = rng_tensor(rng, (VOCAB, H))
    t[e + "position_embeddings.weight"] = rng_tensor(rng, (40, H))
    t[e + "token_type_embeddings.weight"] = rng_tensor(rng, (1, H))
    t[e + "LayerNorm.weight"], t[e + "LayerNorm.bias"] = layer_norm(rng)
    for layer in range(LAYERS):
        p = f"roberta.encoder.layer.{layer}."
        for n in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            t[p + n + ".weight"], t[p + n + ".bias"] = linear(rng, H, H)
        t[p + "attention.output.LayerNorm.weight"], t[p + "attention.output.LayerNorm.bias"] = layer_norm(rng)
        t[p + "intermediate.dense.weight"], t[p + "intermediate.dense.bias"] = linear(rng, F, H)
        t[p + "output.dense.weight"], t[p + "output.dense.bias"] = linear(rng, H, F)
        t[p + "output.LayerNorm.weight"], t[p + "output.LayerNorm.bias"] = layer_norm(rng)
    if classifier:
        t["classifier.dense.weight"], t["classifier.dense.bias"] = linear(rng, H, H)
        t["classifier.out_proj.weight"], t["classifier.out_proj.bias"] = linear(rng, LABELS, H)
    return t


def distil_tensors(seed):
    rng = np.random.default_rng(seed)
    t = {}
    e = "distilbert.embeddings."
    t[e + "word_embeddings.weight"] = rng_tensor(rng, (VOCAB, H))
    t[e + "position_embeddings.weight"] = rng_tensor(rng, (40, H))
    t[e + "LayerNorm.weight"], t[e + "LayerNorm.bias"] = layer_norm(rng)
    for layer in range(LAYERS):
        p = f"distilbert.transformer.layer.{layer}."
        for n in ("attention.q_lin", "attention.k_lin", "attention.v_lin", "attention.out_lin"):
            t[p + n + ".weight"], t[p + n + ".bias"] = linear(rng, H, H)
        t[p + "sa_layer_norm.weight"], t[p + "sa_layer_norm.bias"] = layer_norm(rng)
        t[p + "ffn.lin1.weight"], t[p + "ffn.lin1.bias"] = linear(rng, F, H)
        t[p + "ffn.lin2.weight"], t[p + "ffn.lin2.bias"] = linear(rng, H, F)
        t[p + "output_layer_norm.weight"], t[p + "output_layer_norm.bias"] = layer_norm(rng)
    t["pre_classifier.weight"], t["pre_classifier.bias"] = linear(rng, H, H)
    t["classifier.weight"], t["classifier.bias"] = linear(rng, LABELS, H)
    return t


# ---- the NumPy reference (float64)

def ln(x, g, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def gelu(x):  # the erf form ("gelu" in transformers)
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def lin(x, w, b):
    return x @ w.astype(np.float64).T + b.astype(np.float64)


def attention(x, wq, bq, wk, bk, wv, bv, length):
    """Multi-head self-attention of one sequence x (T, H); keys past `length` masked out."""
    T = x.shape[0]
    dh = H // HEADS
    q = lin(x, wq, bq).reshape(T, HEADS, dh).transpose(1, 0, 2)
    k = lin(x, wk, bk).reshape(T, HEADS, dh).transpose(1, 0, 2)
    v = lin(x, wv, bv).reshape(T, HEADS, dh).transpose(1, 0, 2)
    s = q @ k.transpose(0, 2, 1) / math.sqrt(dh)
    s[:, :, length:] = -np.inf
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ v).transpose(1, 0, 2).reshape(T, H)


def roberta_reference(t, ids, length, classifier=True, positions_from=2):
    w = {k: v.astype(np.float64) for k, v in t.items()}
    e = "roberta.embeddings."
    T = len(ids)
    # modeling_roberta.create_position_ids_from_input_ids: padding_idx + 1 + index for real tokens
    # (BERT, read through this function too: from 0).
    pos = np.arange(T) + positions_from
    x = w[e + "word_embeddings.weight"][ids] + w[e + "position_embeddings.weight"][pos] + \
        w[e + "token_type_embeddings.weight"][0]
    x = ln(x, w[e + "LayerNorm.weight"], w[e + "LayerNorm.bias"], 1e-5)
    for layer in range(LAYERS):
        p = f"roberta.encoder.layer.{layer}."
        g = lambda n: (w[p + n + ".weight"], w[p + n + ".bias"])  # noqa: E731
        a = attention(x, *g("attention.self.query"), *g("attention.self.key"), *g("attention.self.value"), length)
        x = ln(lin(a, *g("attention.output.dense")) + x, *g("attention.output.LayerNorm"), 1e-5)
        h = gelu(lin(x, *g("intermediate.dense")))
        x = ln(lin(h, *g("output.dense")) + x, *g("output.LayerNorm"), 1e-5)
    if not classifier:
        return x
    # RobertaClassificationHead: <s> -> dense -> tanh -> out_proj.
    c = np.tanh(lin(x[0], w["classifier.dense.weight"], w["classifier.dense.bias"]))
    return lin(c, w["classifier.out_proj.weight"], w["classifier.out_proj.bias"])


def distil_reference(t, ids, length):
    x = distil_hidden(t, ids, length)
    w = {k: v.astype(np.float64) for k, v in t.items()}
    # DistilBertForSequenceClassification: hidden[:, 0] -> pre_classifier -> ReLU -> classifier.
    c = np.maximum(lin(x[0], w["pre_classifier.weight"], w["pre_classifier.bias"]), 0.0)
    return lin(c, w["classifier.weight"], w["classifier.bias"])


def distil_hidden(t, ids, length):
    w = {k: v.astype(np.float64) for k, v in t.items()}
    e = "distilbert.embeddings."
    x = w[e + "word_embeddings.weight"][ids] + w[e + "position_embeddings.weight"][np.arange(len(ids))]
    x = ln(x, w[e + "LayerNorm.weight"], w[e + "LayerNorm.bias"], 1e-12)
    for layer in range(LAYERS):
        p = f"distilbert.transformer.layer.{layer}."
        g = lambda n: (w[p + n + ".weight"], w[p + n + ".bias"])  # noqa: E731
        a = attention(x, *g("attention.q_lin"), *g("attention.k_lin"), *g("attention.v_lin"), length)
        x = ln(lin(a, *g("attention.out_lin")) + x, *g("sa_layer_norm"), 1e-12)
        h = gelu(lin(x, *g("ffn.lin1")))
        x = ln(lin(h, *g("ffn.lin2")) + x, *g("output_layer_norm"), 1e-12)
    return x


def close(got, want, rel=1e-4):
    return np.abs(got - want).max() <= rel * max(np.abs(want).max(), 1e-30)


# ---- tests

IDS = np.array([[0, 5, 17, 42, 9, 33, 2, 8, 11, 3, 30, 2],
                [0, 21, 7, 49, 2, 1, 1, 1, 1, 1, 1, 1]], dtype=np.int32)  # row 1: 5 tokens, then <pad>
LENGTHS = [12, 5]


@pytest.mark.parametrize("shards", [1, 3])
def test_roberta_classifier_matches_numpy(tmp_path, shards):
    t = roberta_tensors(1)
    write_folder(tmp_path / "roberta", ROBERTA_CONFIG, t, shards)
    m = clattn.load_model(str(tmp_path / "roberta"))
    assert isinstance(m, clattn.Encoder) and m.head == "classify"
    # 40 position rows, the first pad_token_id + 1 = 2 never used: 38 positions.
    assert m.config["max_positions"] == 38
    logits = m.forward(IDS, lengths=LENGTHS)
    assert logits.shape == (2, LABELS)
    for b in range(2):
        want = roberta_reference(t, IDS[b, :LENGTHS[b]], LENGTHS[b])
        assert close(logits[b], want), (b, logits[b], want)
    # The whole context: 38 tokens reach the last position row; 39 are refused by name.
    long_ids = (np.arange(38) % 45 + 3).astype(np.int32)
    assert close(m.forward(long_ids), roberta_reference(t, long_ids, 38))
    with pytest.raises(ValueError, match="max_position"):
        m.forward(np.full(39, 5, dtype=np.int32))


def test_roberta_encoder_without_head_gives_hidden_states(tmp_path):
    t = roberta_tensors(2, classifier=False)
    cfg = dict(ROBERTA_CONFIG, architectures=["RobertaModel"])
    for k in ("id2label", "label2id", "problem_type"):
        cfg.pop(k)
    write_folder(tmp_path / "roberta", cfg, t)
    m = clattn.load_model(str(tmp_path / "roberta"))
    assert m.head is None
    hidden = m.forward(IDS[:1])
    assert hidden.shape == (1, 12, H)
    assert close(hidden[0], roberta_reference(t, IDS[0], 12, classifier=False))


@pytest.mark.parametrize("shards", [1, 2])
def test_distilbert_classifier_matches_numpy(tmp_path, shards):
    t = distil_tensors(3)
    write_folder(tmp_path / "distil", DISTIL_CONFIG, t, shards)
    m = clattn.load_model(str(tmp_path / "distil"))
    assert m.head == "classify" and m.config["max_positions"] == 40
    logits = m.forward(IDS, lengths=LENGTHS)
    for b in range(2):
        assert close(logits[b], distil_reference(t, IDS[b, :LENGTHS[b]], LENGTHS[b]))
    with pytest.raises(ValueError, match="token_types"):  # DistilBERT has no token types
        m.forward(IDS, token_types=np.ones_like(IDS))


@pytest.mark.parametrize("family", ["roberta", "distilbert"])
def test_every_attention_and_per_layer_plans_run(tmp_path, family):
    if family == "roberta":
        write_folder(tmp_path / family, ROBERTA_CONFIG, roberta_tensors(4))
    else:
        write_folder(tmp_path / family, DISTIL_CONFIG, distil_tensors(4))
    m = clattn.load_model(str(tmp_path / family))
    full = m.forward(IDS, lengths=LENGTHS)
    # C = N clusters and top-k = M keys are full attention (the paper's limits), so they agree.
    for spec in ("clustered:clusters=12", "improved-clustered:clusters=2,topk=12", "topk:topk=12"):
        m.set_attention(spec)
        assert np.abs(m.forward(IDS, lengths=LENGTHS) - full).max() < 1e-4, spec
    ran = 0
    for v in clattn.variants():
        if not v["capabilities"]["key_lengths"]:  # padded batches need key lengths
            continue
        m.set_attention(v["example"])
        out = m.forward(IDS, lengths=LENGTHS)
        assert out.shape == full.shape and np.isfinite(out).all(), v["example"]
        ran += 1
    assert ran >= 8
    m.set_attention("full;improved-clustered:clusters=3,topk=4")
    assert m.attention_specs[0].startswith("full") and m.attention_specs[1].startswith("improved")
    assert np.isfinite(m.forward(IDS, lengths=LENGTHS)).all()


def test_family_configs_and_weights_that_disagree_are_refused(tmp_path):
    t = roberta_tensors(5)
    bad = dict(t)
    del bad["roberta.encoder.layer.1.output.dense.bias"]
    write_folder(tmp_path / "missing", ROBERTA_CONFIG, bad)
    with pytest.raises(RuntimeError, match="output.dense.bias"):
        clattn.load_model(str(tmp_path / "missing"))
    write_folder(tmp_path / "pad", dict(ROBERTA_CONFIG, pad_token_id=39), t)
    with pytest.raises(RuntimeError, match="pad_token_id"):
        clattn.load_model(str(tmp_path / "pad"))
    write_folder(tmp_path / "relu", dict(DISTIL_CONFIG, activation="relu"), distil_tensors(5))
    with pytest.raises(RuntimeError, match="activation"):
        clattn.load_model(str(tmp_path / "relu"))
    write_folder(tmp_path / "tok", dict(ROBERTA_CONFIG, architectures=["RobertaForTokenClassification"]), t)
    with pytest.raises(RuntimeError, match="RobertaForTokenClassification"):
        clattn.load_model(str(tmp_path / "tok"))
    d = {k: v for k, v in distil_tensors(5).items() if k != "distilbert.transformer.layer.0.ffn.lin1.weight"}
    write_folder(tmp_path / "d", DISTIL_CONFIG, d)
    with pytest.raises(RuntimeError, match="ffn.lin1.weight"):
        clattn.load_model(str(tmp_path / "d"))


MLM_HEAD = {  # family: (dense, LayerNorm, output bias, LayerNorm eps, architecture)
    "bert": ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm", "cls.predictions.bias", 1e-5,
             "BertForMaskedLM"),
    "roberta": ("lm_head.dense", "lm_head.layer_norm", "lm_head.bias", 1e-5, "RobertaForMaskedLM"),
    "distilbert": ("vocab_transform", "vocab_layer_norm", "vocab_projector.bias", 1e-12, "DistilBertForMaskedLM"),
}


def mlm_checkpoint(family, seed):
    """A masked-LM checkpoint of `family` as transformers saves it (the tied decoder not stored)."""
    rng = np.random.default_rng(seed)
    if family == "distilbert":
        t, cfg, pre = distil_tensors(seed), dict(DISTIL_CONFIG), "distilbert."
        for k in ("pre_classifier.weight", "pre_classifier.bias", "classifier.weight", "classifier.bias"):
            del t[k]
    else:
        t, cfg = roberta_tensors(seed, classifier=False), dict(ROBERTA_CONFIG)
        pre = "roberta."
        if family == "bert":  # the same layers under bert., with two token types and positions from 0
            t = {("bert." + k[len("roberta."):]): v for k, v in t.items()}
            t["bert.embeddings.token_type_embeddings.weight"] = rng_tensor(rng, (2, H))
            cfg.update(model_type="bert", type_vocab_size=2)
            cfg.pop("pad_token_id")
            pre = "bert."
    dense, norm, bias, _, arch = MLM_HEAD[family]
    t[dense + ".weight"], t[dense + ".bias"] = linear(rng, H, H)
    t[norm + ".weight"], t[norm + ".bias"] = layer_norm(rng)
    t[bias] = rng_tensor(rng, (VOCAB,), 0.1)
    for k in ("id2label", "label2id", "problem_type"):
        cfg.pop(k, None)
    cfg["architectures"] = [arch]
    return t, cfg, pre


def mlm_reference(family, t, pre, ids, length):
    dense, norm, bias, eps, _ = MLM_HEAD[family]
    if family == "distilbert":
        x = distil_hidden(t, ids, length)
    else:
        x = roberta_reference({("roberta." + k[len(pre):] if k.startswith(pre) else k): v for k, v in t.items()}, ids,
                              length, classifier=False, positions_from=2 if family == "roberta" else 0)
    w = {k: v.astype(np.float64) for k, v in t.items()}
    h = ln(gelu(lin(x, w[dense + ".weight"], w[dense + ".bias"])), w[norm + ".weight"], w[norm + ".bias"], eps)
    return h @ w[pre + "embeddings.word_embeddings.weight"].T + w[bias]


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert"])
def test_config_fields_that_change_the_maths_are_refused(tmp_path, family):
    """Fields transformers honours and these encoders do not implement are refused by name, not
    loaded and ignored: relative position embeddings, a decoder or cross-attention BERT, and an
    untied masked-LM output layer (its stored decoder weights would be dropped)."""
    t, cfg, _ = mlm_checkpoint(family, 21)
    write_folder(tmp_path / "ok", cfg, t)
    clattn.load_model(str(tmp_path / "ok"))  # the same folder without the fields loads
    changes = [(dict(tie_word_embeddings=False), "tie_word_embeddings")]
    if family != "distilbert":
        changes += [(dict(position_embedding_type="relative_key_query"), "position_embedding_type"),
                    (dict(position_embedding_type="relative_key"), "position_embedding_type"),
                    (dict(is_decoder=True), "is_decoder"),
                    (dict(add_cross_attention=True), "add_cross_attention")]
    for change, word in changes:
        folder = tmp_path / (word + str(len(list(tmp_path.iterdir()))))
        write_folder(folder, dict(cfg, **change), t)
        with pytest.raises(RuntimeError, match=word):
            clattn.load_model(str(folder))
    # Explicitly absolute positions and tied embeddings are what the encoders compute.
    if family != "distilbert":
        write_folder(tmp_path / "abs", dict(cfg, position_embedding_type="absolute", tie_word_embeddings=True,
                                            is_decoder=False), t)
        clattn.load_model(str(tmp_path / "abs"))


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert"])
def test_masked_lm_heads_match_numpy_and_save_back(tmp_path, family):
    t, cfg, pre = mlm_checkpoint(family, 13)
    write_folder(tmp_path / family, cfg, t)
    m = clattn.load_model(str(tmp_path / family))
    assert m.head == "mlm"
    logits = m.forward_mlm(IDS, lengths=LENGTHS)
    assert logits.shape == (2, 12, VOCAB)
    for b in range(2):
        n = LENGTHS[b]
        assert close(logits[b, :n], mlm_reference(family, t, pre, IDS[b, :n], n)), b
    m.save(tmp_path / "out")
    saved = clattn.read_safetensors(str(tmp_path / "out" / "model.safetensors"))
    assert sorted(saved) == sorted(t)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == cfg["architectures"]


@pytest.mark.parametrize("family", ["roberta", "distilbert"])
def test_saved_checkpoint_keeps_the_family_layout(tmp_path, family):
    """save() writes the tensor names and config fields transformers reads, and loads back equal."""
    t = roberta_tensors(6) if family == "roberta" else distil_tensors(6)
    cfg = ROBERTA_CONFIG if family == "roberta" else DISTIL_CONFIG
    write_folder(tmp_path / "in", cfg, t)
    m = clattn.load_model(str(tmp_path / "in"))
    m.set_attention("full;clustered:clusters=3")
    m.save(tmp_path / "out")
    saved = clattn.read_safetensors(str(tmp_path / "out" / "model.safetensors"))
    assert sorted(saved) == sorted(t)
    for name in t:
        assert np.array_equal(saved[name], t[name]), name
    out_cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    keys = (["model_type", "dim", "n_layers", "n_heads", "hidden_dim", "vocab_size", "max_position_embeddings"]
            if family == "distilbert" else
            ["model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
             "vocab_size", "max_position_embeddings", "pad_token_id", "type_vocab_size"])
    for k in keys:
        assert out_cfg[k] == cfg[k], k
    assert out_cfg["architectures"] == cfg["architectures"] and out_cfg["id2label"] == cfg["id2label"]
    again = clattn.load_model(str(tmp_path / "out"))
    assert again.attention_specs[1].startswith("clustered")
    assert np.array_equal(again.forward(IDS, lengths=LENGTHS), m.forward(IDS, lengths=LENGTHS))


# ---- GPT-2

GPT2_POS = 24
GPT2_CONFIG = {
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
    "bos_token_id": VOCAB - 1, "embd_pdrop": 0.1, "eos_token_id": VOCAB - 1, "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": GPT2_POS, "n_embd": H, "n_head": HEADS,
    "n_inner": None, "n_layer": LAYERS, "n_positions": GPT2_POS, "reorder_and_upcast_attn": False,
    "resid_pdrop": 0.1, "scale_attn_by_inverse_layer_idx": False, "scale_attn_weights": True,
    "summary_activation": None, "summary_first_dropout": 0.1, "summary_proj_to_labels": True,
    "summary_type": "cls_index", "summary_use_proj": True,
    "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
    "torch_dtype": "float32", "transformers_version": "4.44.2", "use_cache": True, "vocab_size": VOCAB,
}


def gpt2_tensors(seed, prefix="transformer.", mask_buffers=False):
    """GPT2LMHeadModel's tensors (prefix "transformer.", lm_head tied and not stored), or the
    original gpt2 files' (no prefix, with the attn.bias causal-mask buffers)."""
    rng = np.random.default_rng(seed)
    F4 = 4 * H
    t = {prefix + "wte.weight": rng_tensor(rng, (VOCAB, H)), prefix + "wpe.weight": rng_tensor(rng, (GPT2_POS, H))}
    for layer in range(LAYERS):
        p = f"{prefix}h.{layer}."
        t[p + "ln_1.weight"], t[p + "ln_1.bias"] = layer_norm(rng)
        # Conv1D: weight (in, out), y = x @ W + b.
        t[p + "attn.c_attn.weight"], t[p + "attn.c_attn.bias"] = rng_tensor(rng, (H, 3 * H)), rng_tensor(rng, (3 * H,), 0.1)
        t[p + "attn.c_proj.weight"], t[p + "attn.c_proj.bias"] = rng_tensor(rng, (H, H)), rng_tensor(rng, (H,), 0.1)
        t[p + "ln_2.weight"], t[p + "ln_2.bias"] = layer_norm(rng)
        t[p + "mlp.c_fc.weight"], t[p + "mlp.c_fc.bias"] = rng_tensor(rng, (H, F4)), rng_tensor(rng, (F4,), 0.1)
        t[p + "mlp.c_proj.weight"], t[p + "mlp.c_proj.bias"] = rng_tensor(rng, (F4, H), 0.15), rng_tensor(rng, (H,), 0.1)
        if mask_buffers:
            t[p + "attn.bias"] = np.tril(np.ones((GPT2_POS, GPT2_POS), np.float32))[None, None]
            t[p + "attn.masked_bias"] = np.array(-1e4, np.float32)
    t[prefix + "ln_f.weight"], t[prefix + "ln_f.bias"] = layer_norm(rng)
    return t


def gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gpt2_reference(t, ids, prefix="transformer."):
    """modeling_gpt2.GPT2LMHeadModel in float64: logits (T, vocab) of one sequence."""
    w = {k: v.astype(np.float64) for k, v in t.items()}
    T, dh = len(ids), H // HEADS
    x = w[prefix + "wte.weight"][ids] + w[prefix + "wpe.weight"][np.arange(T)]
    causal = np.triu(np.full((T, T), -np.inf), 1)
    for layer in range(LAYERS):
        p = f"{prefix}h.{layer}."
        a = ln(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], 1e-5)
        qkv = a @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (qkv[:, i * H:(i + 1) * H].reshape(T, HEADS, dh).transpose(1, 0, 2) for i in range(3))
        s = q @ k.transpose(0, 2, 1) / math.sqrt(dh) + causal
        pr = np.exp(s - s.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        ctx = (pr @ v).transpose(1, 0, 2).reshape(T, H)
        x = x + ctx @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        m = ln(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], 1e-5)
        x = x + gelu_new(m @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]) @ w[p + "mlp.c_proj.weight"] + \
            w[p + "mlp.c_proj.bias"]
    x = ln(x, w[prefix + "ln_f.weight"], w[prefix + "ln_f.bias"], 1e-5)
    return x @ w[prefix + "wte.weight"].T  # the tied LM head


GPT2_IDS = np.array([[VOCAB - 1, 3, 17, 42, 9, 33, 2, 8, 11, 3, 30, 2, 5, 19, 23, 40],
                     [VOCAB - 1, 21, 7, 44, 2, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]], dtype=np.int32)
GPT2_LENGTHS = [16, 6]


@pytest.mark.parametrize("layout", ["lm_head_model_sharded", "original_gpt2_files"])
def test_gpt2_matches_numpy_and_decode_equals_prefill(tmp_path, layout):
    prefix = "transformer." if layout.startswith("lm_head") else ""
    t = gpt2_tensors(7, prefix, mask_buffers=not prefix)
    cfg = GPT2_CONFIG if prefix else dict(GPT2_CONFIG, architectures=["GPT2Model"])
    write_folder(tmp_path / "gpt2", cfg, t, shards=2 if prefix else 1)
    m = clattn.load_model(str(tmp_path / "gpt2"))
    assert isinstance(m, clattn.Decoder) and m.config["max_positions"] == GPT2_POS
    assert m.config["kind"] == "gpt2" and "gpt2" in clattn.load_model.__doc__
    logits = m.forward(GPT2_IDS, lengths=GPT2_LENGTHS)
    assert logits.shape == (2, 16, VOCAB)
    for b in range(2):
        n = GPT2_LENGTHS[b]
        assert close(logits[b, :n], gpt2_reference(t, GPT2_IDS[b, :n], prefix)), b
    # KV-cache decoding: a 5-token prompt, then one token at a time, equals the full forward.
    m.start(GPT2_POS)
    assert close(m.prefill(GPT2_IDS[0, :5]), logits[0, 4])
    for i in range(5, 16):
        assert close(m.step(int(GPT2_IDS[0, i])), logits[0, i]), i
    # The 24 learned positions are the context: a 25th is refused by name, never read past the table.
    full = (np.arange(GPT2_POS) % 40).astype(np.int32)
    assert close(m.forward(full), gpt2_reference(t, full, prefix))
    with pytest.raises(ValueError, match=r"\(n_positions\)"):  # GPT-2's own name of the field
        m.forward(np.zeros(GPT2_POS + 1, np.int32))
    m.start(GPT2_POS + 8)
    m.prefill(full)
    with pytest.raises((ValueError, RuntimeError), match="n_positions"):
        m.step(3)


def test_gpt2_runs_every_causal_attention_and_saves_its_layout(tmp_path):
    t = gpt2_tensors(8)
    write_folder(tmp_path / "gpt2", GPT2_CONFIG, t)
    m = clattn.load_model(str(tmp_path / "gpt2"))
    full = m.forward(GPT2_IDS, lengths=GPT2_LENGTHS)
    ran = 0
    for v in clattn.variants():
        caps = v["capabilities"]
        if not (caps["causal"] and caps["key_lengths"]):
            continue
        m.set_attention(v["example"])
        out = m.forward(GPT2_IDS, lengths=GPT2_LENGTHS)
        assert out.shape == full.shape and np.isfinite(out).all(), v["example"]
        ran += 1
    assert ran >= 3
    m.set_attention("full;clustered:clusters=3")
    m.save(tmp_path / "out")
    saved = clattn.read_safetensors(str(tmp_path / "out" / "model.safetensors"))
    assert sorted(saved) == sorted(t)  # prefixed names, no lm_head (tied)
    for name in t:
        assert np.array_equal(saved[name], t[name]), name  # Conv1D matrices back as (in, out)
    out_cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    for k in ("model_type", "n_embd", "n_layer", "n_head", "n_positions", "vocab_size", "architectures"):
        assert out_cfg[k] == GPT2_CONFIG[k], k
    again = clattn.load_model(str(tmp_path / "out"))
    assert np.array_equal(again.forward(GPT2_IDS, lengths=GPT2_LENGTHS), m.forward(GPT2_IDS, lengths=GPT2_LENGTHS))


def test_gpt2_configs_it_cannot_honour_are_refused(tmp_path):
    t = gpt2_tensors(9)
    for change, word in ((dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
                         (dict(activation_function="relu"), "activation_function"),
                         (dict(tie_word_embeddings=False), "tie_word_embeddings"),
                         (dict(n_head=5), "n_head")):
        write_folder(tmp_path / word, dict(GPT2_CONFIG, **change), t)
        with pytest.raises(RuntimeError, match=word):
            clattn.load_model(str(tmp_path / word))
    bad = dict(t)
    bad["transformer.h.0.attn.c_attn.weight"] = bad["transformer.h.0.attn.c_attn.weight"].T.copy()  # (3H, H)
    write_folder(tmp_path / "shape", GPT2_CONFIG, bad)
    with pytest.raises(RuntimeError, match="c_attn.weight"):
        clattn.load_model(str(tmp_path / "shape"))


def test_read_plan_gives_a_plan_set_attention_takes(tmp_path):
    # Without "layers" the plan string as written; with it, every layer's spec ending in ';', which
    # only a model of that depth takes.
    (tmp_path / "plan.json").write_text(json.dumps({"plan": "full;clustered:clusters=3"}))
    plan = clattn.read_plan(tmp_path / "plan.json")
    assert plan == "full;clustered:clusters=3"
    write_folder(tmp_path / "d", DISTIL_CONFIG, distil_tensors(10))
    m = clattn.load_model(str(tmp_path / "d"))
    m.set_attention(plan)
    assert m.attention_specs[1].startswith("clustered")
    layers = ["full"] + ["clustered:clusters=3"] * (LAYERS - 1)
    (tmp_path / "exact.json").write_text(json.dumps({"plan": "full;clustered:clusters=3", "layers": layers}))
    exact = clattn.read_plan(tmp_path / "exact.json")
    assert exact == ";".join(layers) + ";"
    m.set_attention(exact)
    assert m.attention_specs[-1].startswith("clustered")
    (tmp_path / "deeper.json").write_text(json.dumps({"plan": "full", "layers": ["full"] * (LAYERS + 1)}))
    with pytest.raises(ValueError, match="names every layer"):
        m.set_attention(clattn.read_plan(tmp_path / "deeper.json"))
    (tmp_path / "bad.json").write_text(json.dumps({"plan": "full;nope"}))
    with pytest.raises(RuntimeError, match="nope"):
        clattn.read_plan(tmp_path / "bad.json")


# ---- with their real tokenizers, from the command line

def copy_tokenizer(src, dst):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (dst / name).write_bytes((src / name).read_bytes())


def test_gpt2_generates_from_text_through_its_byte_level_tokenizer(tmp_path, cli):
    from conftest import data_dir
    tok_dir = data_dir() / "tokenizers" / "gpt2"
    V = 50257
    rng = np.random.default_rng(11)
    t = gpt2_tensors(11)
    t["transformer.wte.weight"] = rng_tensor(rng, (V, H))
    cfg = dict(GPT2_CONFIG, vocab_size=V, bos_token_id=V - 1, eos_token_id=V - 1, n_positions=64, n_ctx=64)
    t["transformer.wpe.weight"] = rng_tensor(rng, (64, H))
    write_folder(tmp_path / "gpt2", cfg, t)
    copy_tokenizer(tok_dir, tmp_path / "gpt2")
    m = clattn.load_model(str(tmp_path / "gpt2"))
    prompt = m.tokenizer.encode("Hello world")
    assert list(prompt) == [15496, 995]  # the published GPT-2 ids: no BOS added
    # Greedy continuation through the KV cache equals argmax of the NumPy forward, token by token.
    new = m.generate(prompt, max_tokens=6, temperature=0)
    ids = list(prompt)
    for _ in range(6):
        ids.append(int(np.argmax(gpt2_reference(t, np.array(ids))[-1])))
    assert list(new) == ids[2:]
    # The command line prints the prompt, then the same continuation as text.
    r = cli("generate", "--model", tmp_path / "gpt2", "--prompt", "Hello world", "--tokens", 6, "--threads", 1)
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip("\n") == m.tokenizer.decode(np.array(ids, np.int32)), r.stdout
    r = cli("generate", "--model", tmp_path / "gpt2", "--prompt", "Hello world", "--tokens", 63)  # 2 + 63 > 64
    assert r.returncode != 0 and "context" in r.stderr


def test_distilbert_classifies_lines_through_wordpiece(tmp_path, cli):
    from conftest import data_dir
    tok_dir = data_dir() / "tokenizers" / "bert-base-uncased"
    V = 30522
    rng = np.random.default_rng(12)
    t = distil_tensors(12)
    t["distilbert.embeddings.word_embeddings.weight"] = rng_tensor(rng, (V, H))
    write_folder(tmp_path / "d", dict(DISTIL_CONFIG, vocab_size=V), t)
    copy_tokenizer(tok_dir, tmp_path / "d")
    lines = ["I like strawberries.", "", "Unaffable people, don't they?", "Café au lait ☕ 東京", "a b c d e f g"]
    (tmp_path / "lines.txt").write_text("\n".join(lines) + "\n")
    r = cli("approx", "--model", tmp_path / "d", "--text", tmp_path / "lines.txt", "--attention", "full",
            "--attention", "clustered:clusters=3", "--repeat", 1, "--json", tmp_path / "r.json")
    assert r.returncode == 0, r.stderr
    assert "4 predictions" in r.stdout, r.stdout
    res = json.loads((tmp_path / "r.json").read_text())["results"]
    assert res[0]["agreement"] == 1.0  # full against full
    # The same through Python: the template's ids, padded, classified with lengths.
    m = clattn.load_model(str(tmp_path / "d"))
    enc = [m.tokenizer.encode(s) for s in lines if s]
    assert list(enc[0]) == [101, 1045, 2066, 13137, 20968, 1012, 102]
    T = max(len(e) for e in enc)
    ids = np.zeros((4, T), np.int32)
    for i, e in enumerate(enc):
        ids[i, :len(e)] = e
    logits = m.forward(ids, lengths=[len(e) for e in enc])
    for i, e in enumerate(enc):
        assert close(logits[i], distil_reference(t, np.asarray(e), len(e)))
