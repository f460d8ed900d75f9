"""clattn from Python: the C++ library's attention variants on NumPy arrays, its models, and a
PyTorch adapter (``clattn.torch``, imported on demand, only when PyTorch is installed).

    import numpy as np, clattn
    att = clattn.Attention("improved-clustered:clusters=100")
    o = att.forward(q, k, v)              # q (B, H, N, D), k, v (B, Hkv, M, D) float32
    dq, dk, dv = att.backward(do)         # gradients of the last forward

Specs, capabilities and messages are the library's (see ``clattn.variants()`` and the README).
Errors: ValueError for bad specs, shapes, lengths and values; TypeError for dtypes that are not
floating point; RuntimeError for anything else clattn refuses.
"""
from ._clattn import (  # noqa: F401
    Attention,
    Call,
    Decoder,
    Encoder,
    Tokenizer,
    Trainer,
    __version__,
    compare_logits,
    config,
    evaluate,
    get_num_threads,
    load_model,
    read_plan,
    read_safetensors,
    search_plan,
    set_num_threads,
    variants,
    write_safetensors,
)

__all__ = [
    "Attention", "Call", "Decoder", "Encoder", "Tokenizer", "Trainer", "__version__", "compare_logits", "config", "evaluate", "get_num_threads", "load_model",
    "read_plan", "read_safetensors", "search_plan", "set_num_threads", "variants", "write_safetensors",
]
