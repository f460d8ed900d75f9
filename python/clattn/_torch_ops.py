"""The autograd Function and the nn.Module of clattn.torch (torch.py documents them); _torch_nn.py
builds PyTorch's own entry points on these."""
import warnings

import torch
from torch.autograd.function import once_differentiable

from . import _clattn, _device

__all__ = ["Attention", "AttentionFunction", "attention"]


def _as_numpy_f32(t, name):
    """A float32 CPU tensor readable in place by clattn (stride 1 in the last dim), and its NumPy view."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} must be a CPU tensor for the C++ kernels, got device {t.device} "
                         f"(backend='auto' or 'torch' runs full and the clustered variants on any device)")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    t = t.detach()
    if t.dtype != torch.float32:
        t = t.to(torch.float32)
    if t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        t = t.contiguous()
    return t, t.numpy()


def _nbytes(t):
    return t.storage().nbytes() if t.numel() else 0


def _lengths(x):
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return x


class AttentionFunction(torch.autograd.Function):
    """o = attention(q, k, v): forward and backward by one clattn Call.

    apply(attention, q, k, v, query_lengths, key_lengths, causal, bias, step, train, need_grad),
    attention a clattn.Attention; k may be None for shared-QK variants (the keys are q).
    """

    @staticmethod
    def forward(ctx, attention, q, k, v, query_lengths, key_lengths, causal, bias, step, train, need_grad):
        q32, qn = _as_numpy_f32(q, "q")
        if k is None or k is q:
            k32, kn = q32, (None if k is None else qn)
        else:
            k32, kn = _as_numpy_f32(k, "k")
        v32, vn = _as_numpy_f32(v, "v")
        bn = None
        if bias is not None:
            if bias.requires_grad:
                raise ValueError("clattn.torch: bias gets no gradient (it is a constant of the backward); "
                                 "pass bias.detach()")
            _, bn = _as_numpy_f32(bias, "bias")
        if q32.dim() != 4 or v32.dim() != 4:
            raise ValueError(f"clattn.torch: q and v must be (B, H, N, D) and (B, Hkv, M, Dv), got "
                             f"{tuple(q.shape)} and {tuple(v.shape)}")
        call = attention.new_call(backward=bool(need_grad))
        out = torch.empty((q32.shape[0], q32.shape[1], q32.shape[2], v32.shape[3]), dtype=torch.float32)
        call.forward(qn, kn, vn, query_lengths=_lengths(query_lengths), key_lengths=_lengths(key_lengths),
                     causal=bool(causal), bias=bn, step=int(step), train=bool(train), out=out.numpy())
        ctx.call = call
        # The call reads these float32 tensors again in backward: a storage freed or resized in
        # between (t.storage().resize_(0)) is refused there rather than read.
        ctx.buffers = [(t, t.data_ptr(), _nbytes(t)) for t in (q32, k32, v32)]
        ret = out if q.dtype == torch.float32 else out.to(q.dtype)
        # Saved so that autograd refuses a backward after q, k, v or the output changed in place
        # (the call reads them again: o += r before backward() would change dq and dk); the call
        # itself keeps their float32 NumPy views. A converted output is a copy the call never reads.
        ctx.save_for_backward(q, k if k is not None else q, v, ret)
        ctx.shapes = (q32.shape, k32.shape, v32.shape)
        ctx.dtypes = (q.dtype, None if k is None else k.dtype, v.dtype)
        ctx.k_none = k is None
        return ret

    @staticmethod
    def backward(ctx, do):
        # clattn's backward is not itself differentiable. With create_graph=True autograd runs
        # backward with grad mode on and would take the gradient returned here as a constant,
        # silently dropping every second-order term through it: refuse instead.
        if torch.is_grad_enabled():
            raise RuntimeError(_device.DIFFERENTIABLE_ONCE)
        return AttentionFunction._backward(ctx, do)

    @staticmethod
    @once_differentiable
    def _backward(ctx, do):
        call = ctx.call
        ctx.saved_tensors  # noqa: B018 -- raises if an input was modified in place since forward
        for t, ptr, nbytes in ctx.buffers:
            if t.data_ptr() != ptr or _nbytes(t) < nbytes:
                raise RuntimeError("clattn.torch: an input's storage was freed or resized between forward and "
                                   "backward; the backward reads the forward's inputs")
        _, don = _as_numpy_f32(do, "do")
        qs, ks, vs = ctx.shapes
        dq = torch.zeros(qs, dtype=torch.float32)
        dk = torch.zeros(ks, dtype=torch.float32)
        dv = torch.zeros(vs, dtype=torch.float32)
        call.backward(don, dq=dq.numpy(), dk=dk.numpy(), dv=dv.numpy())
        qd, kd, vd = ctx.dtypes
        if ctx.k_none:  # shared-QK: k was q, its gradient is q's
            dq += dk
            dk = None
        dq = dq.to(qd)
        dk = None if dk is None else dk.to(kd)
        dv = dv.to(vd)
        return None, dq, dk, dv, None, None, None, None, None, None, None


def _note_inactive_causal(spec, n):
    """Warns when a causal clustered spec's block covers the whole sequence: every position is then
    attended exactly (causal full attention, at more cost), as `clattn approx` notes too."""
    name, _, params = spec.partition(":")
    if name not in ("clustered", "improved-clustered"):
        return
    block = dict(p.split("=", 1) for p in params.split(",") if "=" in p).get("block")
    if block is not None and int(block) >= n:
        warnings.warn(
            f"clattn: {spec}: its block of {block} positions covers the whole causal sequence of {n}, so "
            f"every position is attended exactly (causal full attention): the approximation is inactive; "
            f"give block= below {n} to cluster", stacklevel=3)


def attention(att, q, k, v, *, query_lengths=None, key_lengths=None, causal=False, bias=None, step=0,
              train=False, backend="auto"):
    """Functional form: o = att(q, k, v) through autograd, att a clattn.Attention.

    backend: "auto" runs the C++ kernels on CPU tensors and the tensor-op version (_device.py:
    full, clustered, improved-clustered; same clusters) on tensors of any other device; "cpp" and
    "torch" force one (the C++ kernels read CPU tensors only).
    """
    if causal and isinstance(getattr(att, "spec", None), str):
        _note_inactive_causal(att.spec, q.shape[-2])
    if _device.wants_torch(backend, q, k, v):
        return _device.attention(att, q, k, v, query_lengths=query_lengths, key_lengths=key_lengths,
                                 causal=causal, bias=bias, step=step)
    need_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v))
    return AttentionFunction.apply(att, q, k, v, query_lengths, key_lengths, causal, bias, step, train,
                                   need_grad)


class Attention(torch.nn.Module):
    """clattn attention as a module: forward(q, k, v, *, query_lengths, key_lengths, causal, bias).

    q (B, H, N, Dk), k (B, Hkv, M, Dk) (None for shared-QK variants), v (B, Hkv, M, Dv) tensors;
    returns (B, H, N, Dv). No parameters of its own: attention has none (the projections around
    it are the model's). ``step`` is the random step of stochastic variants. ``backend`` as in
    ``attention``: CPU tensors run the C++ kernels, others the tensor-op version.
    """

    def __init__(self, spec, step=0, backend="auto"):
        super().__init__()
        _device.check_backend(backend)
        self.attention = _clattn.Attention(spec)
        self.step = step
        self.backend = backend

    @property
    def spec(self):
        return self.attention.spec

    @property
    def capabilities(self):
        return self.attention.capabilities

    def forward(self, q, k, v, *, query_lengths=None, key_lengths=None, causal=False, bias=None):
        return attention(self.attention, q, k, v, query_lengths=query_lengths, key_lengths=key_lengths,
                         causal=causal, bias=bias, step=self.step, train=self.training, backend=self.backend)

    def extra_repr(self):
        return repr(self.attention.spec)
