#!/usr/bin/python3
"""Writes the seed corpora of fuzz/corpus/<target>/ (small valid inputs the fuzzers mutate).
Run from the repository root: /usr/bin/python3 fuzz/make_seeds.py. Deterministic (fixed seed)."""
import json, os, struct
import numpy as np

rng = np.random.default_rng(16)
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
DATA = "/work/shared/data"


def safetensors(tensors, metadata=None):
    """tensors: {name: np.ndarray (float32/float16/int32/int64) or ('BF16', uint16 array)}."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        if isinstance(t, tuple):
            dtype, arr = t
        else:
            arr = t
            dtype = {np.float32: "F32", np.float16: "F16", np.int32: "I32", np.int64: "I64"}[arr.dtype.type]
        b = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def put(target, name, data):
    d = os.path.join(root, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def randn(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# spec strings
for i, s in enumerate([
        "full", "full:scale=0.125", "local:window=3", "linear", "topk:topk=4",
        "clustered:clusters=3", "clustered:clusters=2,clustering=positional,iterations=3",
        "improved-clustered:clusters=2,topk=3", "smyrf:hashes=2,q_cluster=4,k_cluster=3",
        "reformer:rounds=2,chunk=4", "routing:clusters=2,mode=train,decay=0.9",
        "conditional-full:length_limit=4,improved-clustered:clusters=2,topk=2",
        "conditional-full:length_limit=64,conditional-full:length_limit=4,linear"]):
    put("spec", f"spec{i:02d}", s)

# safetensors files
put("safetensors", "f32", safetensors({"a": randn(2, 3), "b": randn(4)}, {"format": "pt"}))
put("safetensors", "mixed", safetensors({"h": randn(3, 2).astype(np.float16),
                                          "bf": ("BF16", (randn(5).view(np.uint32) >> 16).astype(np.uint16)),
                                          "i": np.arange(6, dtype=np.int32).reshape(2, 3),
                                          "l": np.arange(3, dtype=np.int64)}))
put("safetensors", "empty", safetensors({"e": np.zeros((0, 4), np.float32), "s": np.float32([1.5])}))

# attend inputs: q (B,H,N,D), k, v (B,Hkv,M,D), lengths, bias, do
B, H, N, D = 2, 2, 9, 4
q, k, v = randn(B, H, N, D), randn(B, 1, 7, D), randn(B, 1, 7, D)
put("attend", "qkv", safetensors({"q": q, "k": randn(B, H, N, D), "v": randn(B, H, N, D)}))
put("attend", "gqa_cross_lengths", safetensors({"q": q, "k": k, "v": v, "query_lengths": np.int32([9, 4]),
                                                "key_lengths": np.int32([7, 2])}))
put("attend", "bias_grad", safetensors({"q": q, "k": randn(B, H, N, D), "v": randn(B, H, N, D),
                                        "bias": randn(N, N), "do": randn(B, H, N, D)}))
put("attend", "shared_qk", safetensors({"q": q, "v": randn(B, H, N, D), "do": randn(B, H, N, D)}))

# config.json
for name in ["stories260k", "kwt1"]:
    with open(f"{DATA}/{name}/config.json", "rb") as f:
        put("config", name, f.read())
bert_cfg = {"architectures": ["BertForSequenceClassification"], "model_type": "bert", "hidden_size": 8,
            "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 12, "vocab_size": 16,
            "max_position_embeddings": 8, "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu",
            "num_labels": 2, "id2label": {"0": "no", "1": "yes"}}
put("config", "bert", json.dumps(bert_cfg))
llama_cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8,
             "intermediate_size": 12, "num_hidden_layers": 1, "num_attention_heads": 2,
             "num_key_value_heads": 1, "head_dim": 4, "vocab_size": 16, "max_position_embeddings": 16,
             "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
             "bos_token_id": 1, "eos_token_id": 2}
put("config", "llama", json.dumps(llama_cfg))

# tokenizer.json [+ "\n#config\n" + tokenizer_config.json]
with open(f"{DATA}/stories260k/tokenizer.json", "rb") as f:
    tok = f.read()
with open(f"{DATA}/stories260k/tokenizer_config.json", "rb") as f:
    tok_cfg = f.read()
put("tokenizer", "stories260k", tok + b"\n#config\n" + tok_cfg)
put("tokenizer", "stories260k_plain", tok)
# Nested Sequence normalizers and decoders at the depth bound and one past it (the loader refuses
# more than 32 levels: deeper nesting overflowed the stack): the fuzzer mutates around both.
def nested(depth):
    t = json.loads(tok)
    for chain, key in (("normalizer", "normalizers"), ("decoder", "decoders")):
        for _ in range(depth):
            t[chain] = {"type": "Sequence", key: [t[chain]]}
    return json.dumps(t)
put("tokenizer", "nested_31", nested(31))
put("tokenizer", "nested_40", nested(40))


# The WordPiece and byte-level families, cut to their first ids (and the merges among them) so the
# seeds stay small: every normalizer, pre-tokenizer, post-processor and decoder type they use.
def cut(path, keep):
    with open(path, "rb") as f:
        t = json.load(f)
    vocab = {k: v for k, v in t["model"]["vocab"].items() if v < keep}
    t["model"]["vocab"] = vocab
    if "merges" in t["model"]:
        pairs = [m.split(" ") if isinstance(m, str) else m for m in t["model"]["merges"]]
        t["model"]["merges"] = [" ".join(m) for m in pairs if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]
    t["added_tokens"] = [a for a in t["added_tokens"] if a["id"] < keep]
    return t
bert = cut(f"{DATA}/tokenizers/bert-base-uncased/tokenizer.json", 1100)
put("tokenizer", "bert_wordpiece", json.dumps(bert))
gpt2 = cut(f"{DATA}/tokenizers/gpt2/tokenizer.json", 600)
gpt2["added_tokens"] = [{"id": 600, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                         "rstrip": False, "normalized": True, "special": True},
                        {"id": 601, "content": "<mask>", "single_word": True, "lstrip": True,
                         "rstrip": False, "normalized": False, "special": True}]
gpt2["post_processor"] = {"type": "RobertaProcessing", "sep": ["<|endoftext|>", 600], "cls": ["<|endoftext|>", 600],
                          "trim_offsets": True, "add_prefix_space": True}
put("tokenizer", "gpt2_bytelevel", json.dumps(gpt2))

# checkpoints: 4-byte length, config.json, model.safetensors
def checkpoint(cfg, tensors):
    c = json.dumps(cfg).encode()
    return struct.pack("<I", len(c)) + c + safetensors(tensors)

Hd, F, V = 8, 12, 16
llama = {"model.embed_tokens.weight": randn(V, Hd, scale=0.1), "model.norm.weight": np.ones(Hd, np.float32),
         "model.layers.0.self_attn.q_proj.weight": randn(8, Hd, scale=0.1),
         "model.layers.0.self_attn.k_proj.weight": randn(4, Hd, scale=0.1),
         "model.layers.0.self_attn.v_proj.weight": randn(4, Hd, scale=0.1),
         "model.layers.0.self_attn.o_proj.weight": randn(Hd, 8, scale=0.1),
         "model.layers.0.mlp.gate_proj.weight": randn(F, Hd, scale=0.1),
         "model.layers.0.mlp.up_proj.weight": randn(F, Hd, scale=0.1),
         "model.layers.0.mlp.down_proj.weight": randn(Hd, F, scale=0.1),
         "model.layers.0.input_layernorm.weight": np.ones(Hd, np.float32),
         "model.layers.0.post_attention_layernorm.weight": np.ones(Hd, np.float32)}
put("checkpoint", "llama", checkpoint(llama_cfg, llama))
bert = {"bert.embeddings.word_embeddings.weight": randn(V, Hd), "bert.embeddings.position_embeddings.weight": randn(8, Hd),
        "bert.embeddings.token_type_embeddings.weight": randn(2, Hd),
        "bert.embeddings.LayerNorm.weight": np.ones(Hd, np.float32), "bert.embeddings.LayerNorm.bias": np.zeros(Hd, np.float32)}
p = "bert.encoder.layer.0."
for n in ["query", "key", "value"]:
    bert[p + f"attention.self.{n}.weight"] = randn(Hd, Hd, scale=0.1)
    bert[p + f"attention.self.{n}.bias"] = randn(Hd, scale=0.1)
bert.update({p + "attention.output.dense.weight": randn(Hd, Hd, scale=0.1), p + "attention.output.dense.bias": randn(Hd),
             p + "attention.output.LayerNorm.weight": np.ones(Hd, np.float32), p + "attention.output.LayerNorm.bias": np.zeros(Hd, np.float32),
             p + "intermediate.dense.weight": randn(F, Hd, scale=0.1), p + "intermediate.dense.bias": randn(F),
             p + "output.dense.weight": randn(Hd, F, scale=0.1), p + "output.dense.bias": randn(Hd),
             p + "output.LayerNorm.weight": np.ones(Hd, np.float32), p + "output.LayerNorm.bias": np.zeros(Hd, np.float32),
             "bert.pooler.dense.weight": randn(Hd, Hd, scale=0.1), "bert.pooler.dense.bias": randn(Hd),
             "classifier.weight": randn(2, Hd), "classifier.bias": randn(2)})
put("checkpoint", "bert", checkpoint(bert_cfg, bert))
# plot inputs: the first byte picks the reader (even: bench result, odd: training log).
bench_row = {"spec": "full", "batch": 1, "heads": 2, "kv_heads": 2, "dim": 16, "n": 64, "m": 64, "causal": False,
             "mode": "fwd", "threads": 1, "repeat": 1, "ms_median": 1.5, "ms_min": 1.2, "ms_max": 2.0, "rss_mb": 0.5}
rows = [dict(bench_row, n=n, ms_median=n / 40, ms_min=n / 50, ms_max=n / 30) for n in (64, 128)]
rows.append(dict(bench_row, spec="clustered:clusters=4", mode="fwdbwd", causal=True))
rows.append(dict(bench_row, spec="topk:topk=4", ms_median=None, ms_min=None, ms_max=None, error="boom"))
put("plot", "bench_json", b"\x00" + json.dumps({"machine": {"cpu": "x", "sgemm_gflops": 50, "threads": 2},
                                                  "results": rows}, indent=2).encode())
put("plot", "bench_jsonl", b"\x02" + "".join(json.dumps(r) + "\n" for r in rows).encode())
log = [{"config": {"attention": "improved-clustered:clusters=4", "task": "mlm"}, "attention": "full", "resume_step": 0},
       {"step": 1, "loss": 3.5, "lr": 1e-3, "ms": 10}, {"step": 2, "loss": 3.1, "lr": 1e-3, "ms": 10},
       {"step": 2, "eval_loss": 3.0, "eval_metric": 4.3, "metric": "bits_per_char", "elapsed_s": 0.5},
       {"end": "steps", "step": 2, "elapsed_s": 0.6}]
put("plot", "log", b"\x01" + "".join(json.dumps(r) + "\n" for r in log).encode() + b'{"step":3,"lo')

print("seeds written under", root)
