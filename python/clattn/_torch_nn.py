"""PyTorch's attention entry points with clattn underneath (re-exported by ``clattn.torch``).

``scaled_dot_product_attention`` has the signature and semantics of
``torch.nn.functional.scaled_dot_product_attention`` (PyTorch 2.x) plus ``spec=``;
``MultiheadAttention`` takes ``torch.nn.MultiheadAttention``'s constructor and forward
arguments plus ``spec=``, with the same parameters (a torch module's ``state_dict`` loads into
it). What clattn cannot do as PyTorch does is refused with a ValueError naming it, never
approximated silently:

- ``dropout_p > 0`` (``dropout > 0``): dropout acts on the attention weights, an (L, S) matrix
  clattn never forms.
- ``need_weights=True``: the same matrix. The default here is False, and the forward still
  returns ``(output, None)``, so ``out, _ = mha(x, x, x)`` works unchanged.
- Masks. Every mask is read as what it means: padding at the end of the keys becomes clattn's
  key lengths, a lower-triangular mask (L == S) its causal flag, both together both — which every
  variant that honours them takes. Any other mask (holes, per-head patterns, additive values
  other than 0 and -inf) is an additive bias, which only ``full`` takes; another variant refuses
  it by name. ``is_causal`` with L != S follows PyTorch (the mask is aligned top-left), which is
  again a bias.
- A query whose keys are all masked gets a zero output (PyTorch gives NaN).
- ``add_bias_kv`` and ``add_zero_attn`` are refused.

Both take ``backend=`` ("auto", "cpp", "torch"): tensors off the CPU run full, clustered and
improved-clustered as PyTorch tensor operations on their device (_device.py), CPU tensors the C++
kernels unless "torch" is asked for.

Stochastic variants (clustered hashing, Reformer, SMYRF, routing) draw from their ``seed=`` and
a step. ``MultiheadAttention`` advances its ``step`` after every forward in training mode
(``module.train()``), so each training step sees fresh draws, and keeps it in evaluation mode;
``MultiheadAttention(..., step=s)`` fixes it at s (never advanced), and ``set_step(model, s)``
sets every clattn module of a model at once (e.g. when resuming at step s). The step is an
attribute, not part of the ``state_dict`` (which stays exactly PyTorch's).
"""
import math

import torch

from . import _clattn, _device
from ._torch_ops import Attention, attention

__all__ = ["MultiheadAttention", "scaled_dot_product_attention", "set_step"]

_cache = {}


def _spec_with_scale(spec, scale):
    """The spec with scale= set (None leaves the variant's default, 1/sqrt(E))."""
    if scale is None:
        return spec
    scale = float(scale)
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale must be a positive finite number, got {scale}")
    name, _, params = spec.partition(":")
    keys = [p.split("=", 1)[0] for p in params.split(",") if "=" in p] if params else []
    if "scale" in keys:
        raise ValueError(f"scale={scale} and the spec '{spec}' both set the scale; give one")
    accepted = [p["key"] for v in _clattn.variants() if v["name"] == name for p in v["parameters"]]
    if accepted and "scale" not in accepted:
        raise ValueError(f"the attention '{name}' takes no scale (its logits are its own); leave scale=None")
    return f"{spec}{',' if params else ':'}scale={scale!r}"


def _attention_for(spec, scale):
    key = (spec, scale)
    att = _cache.get(key)
    if att is None:
        if len(_cache) > 64:
            _cache.clear()
        att = _cache[key] = _clattn.Attention(_spec_with_scale(spec, scale))
    return att


def _no_dropout(p, name="dropout_p"):
    if p is None or float(p) == 0.0:
        return
    raise ValueError(f"clattn.torch: {name}={p} is not supported: dropout acts on the attention weights, an "
                     f"(L, S) matrix clattn never forms; pass {name}=0.0 (regularise with dropout elsewhere)")


def _read_mask(mask, B, H, L, S, device):
    """A PyTorch SDPA mask (bool: True takes part; float: added) broadcast to (B, H, L, S):
    (allowed bool or None, additive float or None) — additive only when the mask holds values
    other than 0 and -inf."""
    if mask.dtype == torch.bool:
        allowed = mask
        additive = None
    elif mask.is_floating_point():
        if mask.requires_grad:  # said here: further down it is clattn's bias, an argument the caller never passed
            raise ValueError("clattn.torch: attn_mask gets no gradient (clattn's backward treats it as a constant); "
                             "pass attn_mask.detach()")
        m = mask.detach()
        pure = bool(((m == 0) | (m == float("-inf"))).all())
        allowed = (m == 0) if pure else None
        additive = None if pure else mask
    else:
        raise TypeError(f"attn_mask must be bool or floating point, got {mask.dtype}")
    try:
        if allowed is not None:
            allowed = allowed.expand(B, H, L, S)
        if additive is not None:
            additive = additive.expand(B, H, L, S)
    except RuntimeError as e:
        raise ValueError(f"attn_mask of shape {tuple(mask.shape)} does not broadcast to (B, H, L, S) = "
                         f"{(B, H, L, S)}") from e
    return allowed, additive


def _as_lengths_and_causal(allowed, L, S):
    """(key_lengths (B,) int32 or None, causal) when `allowed` is key padding at the end and/or the
    lower-triangular mask; None when it is neither."""
    B = allowed.shape[0]
    last = allowed[:, 0, L - 1, :]                       # (B, S): the last query sees every unpadded key
    lengths = last.sum(-1)
    prefix = torch.arange(S, device=allowed.device).unsqueeze(0) < lengths.unsqueeze(1)  # (B, S)
    if not bool((last == prefix).all()):
        return None
    want = prefix[:, None, None, :].expand(B, 1, L, S)
    for causal in ([False, True] if L == S else [False]):
        w = want & torch.ones(L, S, dtype=torch.bool, device=allowed.device).tril() if causal else want
        if bool((allowed == w).all()):
            padded = bool((lengths < S).any())
            return (lengths.to(torch.int32) if padded else None), causal
    return None


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 *, spec="full", step=0, backend="auto"):
    """torch.nn.functional.scaled_dot_product_attention through clattn's `spec` (default full).

    query (B, H, L, E) or (B, L, E); key (B, Hkv, S, E) or (B, S, E); value likewise with Ev:
    returns (B, H, L, Ev) (or (B, L, Ev)). H may be a multiple of Hkv (grouped-query attention).
    attn_mask: bool (True takes part) or float (added), broadcast to (B, H, L, S). `step` is the
    random step of stochastic variants. backend: "auto" (C++ kernels for CPU tensors, tensor
    operations on other devices), "cpp" or "torch". See the module docstring for what is refused.
    """
    _no_dropout(dropout_p)
    _device.check_backend(backend)
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    dims = query.dim()
    if dims not in (3, 4) or key.dim() != dims or value.dim() != dims:
        raise ValueError(f"query, key and value must all be 4-D (B, H, L, E) or all 3-D (B, L, E); got shapes "
                         f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    if dims == 3:
        q, k, v = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
    else:
        q, k, v = query, key, value
    out = _sdpa(_attention_for(spec, scale), q, k, v, attn_mask, is_causal, int(step), False, backend)
    return out.squeeze(1) if dims == 3 else out


def _sdpa(att, q, k, v, attn_mask, is_causal, step, train, backend="auto"):
    """scaled_dot_product_attention on 4-D tensors through the clattn.Attention `att`."""
    B, H, L, _ = q.shape
    S = k.shape[2]
    caps = att.capabilities
    kwargs = {"step": step, "train": train, "backend": backend}

    if attn_mask is not None and is_causal:
        raise ValueError("give attn_mask or is_causal, not both (as PyTorch)")
    if is_causal and L != S:
        # PyTorch's is_causal is aligned top-left: query i sees keys j <= i.
        attn_mask = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()
        is_causal = False
    out = None
    if attn_mask is None:
        out = attention(att, q, k, v, causal=bool(is_causal), **kwargs)
    else:
        allowed, additive = _read_mask(attn_mask, B, H, L, S, q.device)
        simple = _as_lengths_and_causal(allowed, L, S) if allowed is not None else None
        if simple is not None:
            lengths, causal = simple
            if lengths is not None and not caps["key_lengths"]:
                raise ValueError(f"clattn.torch: '{att.spec}' does not honour key padding (attn_mask)")
            out = attention(att, q, k, v, key_lengths=lengths, causal=causal, **kwargs)
        else:
            if not caps["bias"]:
                raise ValueError(
                    f"clattn.torch: '{att.spec}' cannot take this attn_mask: beyond key padding at the end and the "
                    f"causal (lower-triangular) mask, a mask is an additive bias, which only 'full' takes")
            if additive is None:
                additive = torch.zeros(allowed.shape, dtype=torch.float32, device=allowed.device).masked_fill(
                    ~allowed, float("-inf"))
            out = _with_bias(att, q, k, v, additive, kwargs)
    return out


def _with_bias(att, q, k, v, bias, kwargs):
    """clattn's bias is one (L, S) matrix per call: one call when it is the same for every batch
    item and head, else one call per batch item (and head) that differs."""
    B, H = q.shape[:2]
    Hkv = k.shape[1]
    bias = bias.to(torch.float32)
    if bool((bias == bias[:1, :1]).all()):
        return attention(att, q, k, v, bias=bias[0, 0], **kwargs)
    per_head = not bool((bias == bias[:, :1]).all())
    rows = []
    for b in range(B):
        if not per_head:
            rows.append(attention(att, q[b:b + 1], k[b:b + 1], v[b:b + 1], bias=bias[b, 0], **kwargs))
            continue
        heads = []
        for h in range(H):
            g = h // (H // Hkv)
            heads.append(attention(att, q[b:b + 1, h:h + 1], k[b:b + 1, g:g + 1], v[b:b + 1, g:g + 1],
                                   bias=bias[b, h], **kwargs))
        rows.append(torch.cat(heads, 1))
    return torch.cat(rows, 0)


class MultiheadAttention(torch.nn.Module):
    """torch.nn.MultiheadAttention with clattn's attention (`spec`, default full) inside.

    Same constructor and forward arguments, same parameters and state_dict keys (in_proj_weight or
    q/k/v_proj_weight, in_proj_bias, out_proj.weight/bias), same outputs — (attn_output, None).
    `step`: None (default) advances the random step of stochastic variants after each forward in
    training mode; an int fixes it. See the module docstring for what is refused.
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, device=None, dtype=None, *, spec="full", step=None,
                 backend="auto"):
        super().__init__()
        _no_dropout(dropout, "dropout")
        if add_bias_kv or add_zero_attn:
            raise ValueError("clattn.torch.MultiheadAttention: add_bias_kv and add_zero_attn are not supported")
        if embed_dim <= 0 or num_heads <= 0 or embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be a positive multiple of num_heads ({num_heads})")
        fk = {"device": device, "dtype": dtype}
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self.dropout, self.batch_first = 0.0, batch_first
        if self.kdim == embed_dim and self.vdim == embed_dim:
            self.in_proj_weight = torch.nn.Parameter(torch.empty((3 * embed_dim, embed_dim), **fk))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.q_proj_weight = torch.nn.Parameter(torch.empty((embed_dim, embed_dim), **fk))
            self.k_proj_weight = torch.nn.Parameter(torch.empty((embed_dim, self.kdim), **fk))
            self.v_proj_weight = torch.nn.Parameter(torch.empty((embed_dim, self.vdim), **fk))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = torch.nn.Parameter(torch.empty(3 * embed_dim, **fk))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = torch.nn.Linear(embed_dim, embed_dim, bias=bias, **fk)
        self.bias_k = self.bias_v = None
        self.add_zero_attn = False
        self.attention = Attention(spec, backend=backend)
        self.auto_step = step is None
        self.step = 0 if step is None else int(step)
        self._reset_parameters()

    def _reset_parameters(self):
        # PyTorch's own initialisation, so a fresh module starts as torch's would.
        if self.in_proj_weight is not None:
            torch.nn.init.xavier_uniform_(self.in_proj_weight)
        else:
            for w in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                torch.nn.init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            torch.nn.init.constant_(self.in_proj_bias, 0.0)
            torch.nn.init.constant_(self.out_proj.bias, 0.0)

    @property
    def spec(self):
        return self.attention.spec

    @property
    def _qkv_same_embed_dim(self):
        # torch.nn.TransformerEncoderLayer and TransformerEncoder, in eval mode without a gradient,
        # hand the whole layer to a fused kernel (torch._transformer_encoder_layer_fwd) that reads
        # in_proj_weight and computes exact attention itself, never calling this module. Of the
        # conditions gating it, this attribute is the one on self_attn that no user setting
        # changes (batch_first, bias, num_heads, the activation and eps are the model's; training
        # and grad mode the caller's), and both torch 1.x and 2.x test it before the fast path.
        # Always False and without a setter, so no assignment re-opens the fused path; the weights'
        # layout is told by in_proj_weight being None or not.
        return False

    def _project(self, query, key, value):
        E = self.embed_dim
        b = self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else (b[:E], b[E:2 * E], b[2 * E:])
        if self.in_proj_weight is not None:
            w = self.in_proj_weight
            wq, wk, wv = w[:E], w[E:2 * E], w[2 * E:]
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        F = torch.nn.functional
        return F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=False, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        if need_weights:
            raise ValueError("clattn.torch.MultiheadAttention: need_weights=True asks for the (L, S) attention "
                             "weights, which clattn never forms; pass need_weights=False (the output is the same)")
        unbatched = query.dim() == 2
        if unbatched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        if self.batch_first and not unbatched:
            query, key, value = (x.transpose(0, 1) for x in (query, key, value))
        # (L, B, E) from here, as PyTorch's functional form.
        L, B, _ = query.shape
        S = key.shape[0]
        H, D = self.num_heads, self.head_dim
        q, k, v = self._project(query, key, value)
        # (L, B, H, D) buffers viewed head-major (B, H, L, D): clattn reads them in place.
        q, k, v = (x.reshape(x.shape[0], B, H, D).permute(1, 2, 0, 3) for x in (q, k, v))
        mask = None
        if is_causal:
            attn_mask = None  # as PyTorch: is_causal says the mask is the causal one
        if attn_mask is not None:
            # MultiheadAttention's bool masks say what is NOT attended; SDPA's what is.
            m = attn_mask.logical_not() if attn_mask.dtype == torch.bool else attn_mask.to(torch.float32)
            if m.dim() == 3:
                m = m.reshape(B, H, L, S)
            mask = m
        if key_padding_mask is not None:
            kp = key_padding_mask
            kp = kp.logical_not() if kp.dtype == torch.bool else kp.to(torch.float32)
            kp = kp.reshape(B, 1, 1, S)
            if mask is None:
                mask = kp
            elif mask.dtype == torch.bool and kp.dtype == torch.bool:
                mask = mask & kp
            else:
                as_add = [x if x.dtype != torch.bool else
                          torch.zeros(x.shape, device=x.device).masked_fill(~x, float("-inf")) for x in (mask, kp)]
                mask = as_add[0] + as_add[1]
            if is_causal:
                causal = torch.ones(L, S, dtype=torch.bool, device=query.device).tril()
                mask = (mask & causal) if mask.dtype == torch.bool else mask.masked_fill(~causal, float("-inf"))
                is_causal = False
        step = self.step
        o = _sdpa(self.attention.attention, q, k, v, mask, is_causal, step, self.training, self.attention.backend)
        if self.training and self.auto_step:
            self.step = step + 1
        # (B, H, L, D) -> (L, B, E)
        o = o.permute(2, 0, 1, 3).reshape(L, B, self.embed_dim)
        o = self.out_proj(o)
        if self.batch_first and not unbatched:
            o = o.transpose(0, 1)
        if unbatched:
            o = o.squeeze(1)
        return o, None

    def extra_repr(self):
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, spec={self.spec!r}"


def set_step(module, step):
    """Sets the random step of every clattn module in `module` (MultiheadAttention and Attention),
    e.g. to resume training at `step`; MultiheadAttention keeps advancing from there in training
    mode unless it was built with a fixed step."""
    for m in module.modules():
        if isinstance(m, (MultiheadAttention, Attention)):
            m.step = int(step)
    return module
