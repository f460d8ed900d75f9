#!/usr/bin/python3
"""A random-weight LLaMA in Hugging Face layout (config.json + model.safetensors + stories260k's tokenizer).

hidden 512, 8 layers, 8 heads of 64, 8 kv heads, ffn 1408, vocab 512, context 65536 (so a decode
after a 32768-token prompt fits), rope theta 10000, fp32, untied lm_head. Weights ~ N(0, 0.02) (HF
LlamaConfig.initializer_range), norms 1. The lm_head row of EOS (id 2) is zero, so greedy decoding
never stops early at EOS (its logit is 0 while 511 others are symmetric around 0).

usage: make_random_llama.py OUT_DIR [--seed S]
"""
import json
import shutil
import struct
import sys
from pathlib import Path

import numpy as np

# stories260k's tokenizer (vocab 512), from the shared data beside the repository.
TOK = Path(__file__).resolve().parents[3] / "shared" / "data" / "stories260k"


def write_safetensors(path, tensors):
    header, off = {}, 0
    for k, a in tensors.items():
        header[k] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for a in tensors.values():
            f.write(np.ascontiguousarray(a, "<f4").tobytes())


def main():
    out = Path(sys.argv[1])
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 0
    H, L, NH, NKV, HD, FF, V, CTX = 512, 8, 8, 8, 64, 1408, 512, 65536
    rng = np.random.default_rng(seed)
    r = lambda *s: (rng.standard_normal(s, dtype=np.float32) * 0.02)
    t = {"model.embed_tokens.weight": r(V, H)}
    for i in range(L):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = r(NH * HD, H)
        t[p + "self_attn.k_proj.weight"] = r(NKV * HD, H)
        t[p + "self_attn.v_proj.weight"] = r(NKV * HD, H)
        t[p + "self_attn.o_proj.weight"] = r(H, NH * HD)
        t[p + "mlp.gate_proj.weight"] = r(FF, H)
        t[p + "mlp.up_proj.weight"] = r(FF, H)
        t[p + "mlp.down_proj.weight"] = r(H, FF)
        t[p + "input_layernorm.weight"] = np.ones(H, np.float32)
        t[p + "post_attention_layernorm.weight"] = np.ones(H, np.float32)
    t["model.norm.weight"] = np.ones(H, np.float32)
    lm = r(V, H)
    lm[2] = 0.0
    t["lm_head.weight"] = lm
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(out / "model.safetensors", t)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
           "intermediate_size": FF, "num_hidden_layers": L, "num_attention_heads": NH,
           "num_key_value_heads": NKV, "head_dim": HD, "vocab_size": V, "max_position_embeddings": CTX,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None, "tie_word_embeddings": False,
           "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "bos_token_id": 1,
           "eos_token_id": 2, "pad_token_id": None, "torch_dtype": "float32", "use_cache": True}
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for f in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]:
        shutil.copy(TOK / f, out / f)
    tc = json.loads((out / "tokenizer_config.json").read_text())
    tc["model_max_length"] = CTX
    (out / "tokenizer_config.json").write_text(json.dumps(tc, indent=2) + "\n")
    n = sum(a.size for a in t.values())
    print(f"wrote {out}: {n/1e6:.2f} M parameters, {n*4/2**20:.1f} MiB")


if __name__ == "__main__":
    main()
