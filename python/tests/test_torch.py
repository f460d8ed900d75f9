"""clattn.torch: gradients against PyTorch's autograd of plain softmax attention (full), a
directional finite-difference check of every trainable variant, use inside a model, no copies."""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import clattn  # noqa: E402
import clattn.torch as ct  # noqa: E402
from conftest import rand  # noqa: E402


def reference(q, k, v, causal=False, query_lengths=None, key_lengths=None, bias=None, scale=None):
    """Softmax attention as PyTorch ops (autograd differentiates it); the clattn contract's masks:
    padded query rows and queries that see no key give 0."""
    B, H, N, D = q.shape
    Hkv, M = k.shape[1], k.shape[2]
    k = k.repeat_interleave(H // Hkv, dim=1)
    v = v.repeat_interleave(H // Hkv, dim=1)
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else D ** -0.5)
    if bias is not None:
        s = s + bias
    i = torch.arange(N).view(N, 1)
    j = torch.arange(M).view(1, M)
    mask = torch.ones(B, 1, N, M, dtype=torch.bool)
    if causal:
        mask = mask & (j <= i + (M - N))
    if key_lengths is not None:
        mask = mask & (j.view(1, 1, 1, M) < torch.as_tensor(key_lengths).view(B, 1, 1, 1))
    if query_lengths is not None:
        mask = mask & (i.view(1, 1, N, 1) < torch.as_tensor(query_lengths).view(B, 1, 1, 1))
    p = torch.softmax(s.masked_fill(~mask, -1e30), dim=-1) * mask
    return p @ v


FULL_CASES = [
    dict(name="plain", N=37, M=37, H=4, Hkv=4),
    dict(name="causal", N=64, M=64, H=4, Hkv=4, causal=True),
    dict(name="causal cross", N=20, M=45, H=2, Hkv=2, causal=True),
    dict(name="lengths", N=40, M=50, H=2, Hkv=2, query_lengths=[40, 17], key_lengths=[33, 50]),
    dict(name="causal lengths gqa", N=48, M=48, H=4, Hkv=2, causal=True, query_lengths=[48, 30],
         key_lengths=[20, 48]),
    dict(name="bias", N=30, M=31, H=2, Hkv=1, bias=True),
]


@pytest.mark.parametrize("case", FULL_CASES, ids=[c["name"] for c in FULL_CASES])
def test_full_gradients_match_pytorch_autograd(case):
    B, D = 2, 16
    q = rand(B, case["H"], case["N"], D, seed=1).requires_grad_()
    k = rand(B, case["Hkv"], case["M"], D, seed=2).requires_grad_()
    v = rand(B, case["Hkv"], case["M"], D, seed=3).requires_grad_()
    bias = rand(case["N"], case["M"], seed=4) if case.get("bias") else None
    kw = dict(causal=case.get("causal", False), query_lengths=case.get("query_lengths"),
              key_lengths=case.get("key_lengths"))
    do = rand(B, case["H"], case["N"], D, seed=5)
    o = ct.Attention("full")(q, k, v, bias=bias, **kw)
    o.backward(do)
    got = [t.grad.clone() for t in (q, k, v)]
    # The reference in float64, as PyTorch's own autograd computes it.
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = reference(q64, k64, v64, bias=None if bias is None else bias.double(), **kw)
    ref.backward(do.double())
    assert torch.allclose(o.double(), ref, atol=2e-6, rtol=1e-5)
    for name, g, r in zip("qkv", got, (q64.grad, k64.grad, v64.grad)):
        err = (g.double() - r).abs().max().item()
        assert err <= 2e-5 * max(1.0, r.abs().max().item()), f"d{name}: max error {err}"


def test_float64_tensors_are_promoting():
    """float64 tensors are computed in float32 and cast back: exactly the float32 results, cast."""
    x64 = [rand(1, 2, 20, 8, seed=6 + i).double().requires_grad_() for i in range(3)]
    x32 = [t.detach().float().requires_grad_() for t in x64]
    o64, o32 = ct.Attention("full")(*x64), ct.Attention("full")(*x32)
    assert o64.dtype == torch.float64 and torch.equal(o64.float(), o32)
    o64.sum().backward()
    o32.sum().backward()
    for a, b in zip(x64, x32):
        assert a.grad.dtype == torch.float64 and torch.equal(a.grad.float(), b.grad)


# Every trainable variant, at a size where its discrete choices (clusters, hashes, top-k sets) are
# not flipped by the +-eps perturbations below (fixed seeds: a pass is reproducible).
VARIANT_SPECS = [
    "full",
    "clustered:clusters=4,block=16",
    "improved-clustered:clusters=4,topk=8,block=16",
    "local:window=8",
    "linear",
    "topk:topk=8",
    "smyrf:q_cluster=16,k_cluster=16",
    "reformer:chunk=16",
    "routing:clusters=4",
    "conditional-full:length_limit=16,improved-clustered:clusters=4,topk=8,block=16",
]


def test_variant_list_covers_the_registry():
    assert {s.split(":")[0] for s in VARIANT_SPECS} == {v["name"] for v in clattn.variants()}


@pytest.mark.parametrize("spec", VARIANT_SPECS)
def test_every_trainable_variant_directional_derivatives(spec):
    """<grad, u> against (f(x + eps u) - f(x - eps u)) / (2 eps), f = sum(o * W) in float64, for
    three rows of each of q, k and v; the same step each call holds the random draws fixed."""
    att = ct.Attention(spec, step=3)
    caps = att.capabilities
    if not caps["trainable"]:
        pytest.skip(f"{spec} has no backward")
    B, H, N, D = 1, 2, 48, 8
    shared = caps["shared_qk"]
    q = rand(B, H, N, D, seed=10).requires_grad_()
    k = None if shared else rand(B, H, N, D, seed=11).requires_grad_()
    v = rand(B, H, N, D, seed=12).requires_grad_()
    causal = caps["causal"] and spec != "linear"
    w = rand(B, H, N, D, seed=13).double()  # f = sum(o * w)

    def f(qq, kk, vv):
        with torch.no_grad():
            return (att(qq, kk, vv, causal=causal).double() * w).sum().item()

    o = att(q, k, v, causal=causal)
    (o.double() * w).sum().backward()
    g = torch.Generator().manual_seed(40)
    checks = [(name, x, r) for name, x in (("q", q), ("k", k), ("v", v)) if x is not None for r in range(3)]
    for name, x, r in checks:
        # Along one row (h, i) of x at a time: only the choices that row takes part in can flip.
        u = torch.zeros(x.shape)
        h, i = int(torch.randint(H, (1,), generator=g)), int(torch.randint(N, (1,), generator=g))
        u[0, h, i] = torch.randn(D, generator=g)
        args = {"q": q.detach(), "k": None if k is None else k.detach(), "v": v.detach()}

        def fd(eps):
            plus, minus = dict(args), dict(args)
            plus[name] = args[name] + eps * u
            minus[name] = args[name] - eps * u
            return (f(plus["q"], plus["k"], plus["v"]) - f(minus["q"], minus["k"], minus["v"])) / (2 * eps)

        an = (x.grad.double() * u.double()).sum().item()
        tol = 1e-2 * max(1.0, abs(an))
        # A discrete choice flipped inside [x - eps u, x + eps u] shows as a jump: the difference
        # quotients at eps and eps / 2 disagree. Compare at the largest eps where they agree.
        for eps in (1e-3, 3e-4, 1e-4, 3e-5):
            a, b = fd(eps), fd(eps / 2)
            if abs(a - b) <= tol:
                break
        else:
            pytest.fail(f"{spec} d{name} row {(h, i)}: a discrete choice flips at every eps tried")
        assert abs(b - an) <= tol, f"{spec} d{name} row {(h, i)}: finite difference {b} (eps {eps / 2}), backward {an}"


class Block(torch.nn.Module):
    """A pre-LN self-attention block whose attention is a module argument."""

    def __init__(self, attn, dim=32, heads=4):
        super().__init__()
        torch.manual_seed(0)
        self.heads, self.attn = heads, attn
        self.norm = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):  # x (B, N, dim)
        B, N, C = x.shape
        qkv = self.qkv(self.norm(x)).view(B, N, 3, self.heads, C // self.heads)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # (B, H, N, D) views
        o = self.attn(q, k, v, causal=True)
        return x + self.proj(o.transpose(1, 2).reshape(B, N, C))


class TorchSoftmax(torch.nn.Module):
    def forward(self, q, k, v, causal=False):
        return reference(q, k, v, causal=causal)


def test_in_place_of_a_models_attention():
    x = rand(2, 50, 32, seed=30)
    ours, theirs = Block(ct.Attention("full")), Block(TorchSoftmax())
    ours(x).square().mean().backward()
    theirs(x).square().mean().backward()
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6, rtol=1e-4), name


class Recorder:
    """Stands in for a clattn.Attention to see the Call the adapter makes."""

    def __init__(self, spec):
        self.att, self.calls = clattn.Attention(spec), []

    def new_call(self, backward=True):
        self.calls.append(self.att.new_call(backward))
        return self.calls[-1]


def test_no_copy_for_float32_tensors_and_head_major_views():
    rec = Recorder("full")
    x = rand(2, 40, 3, 16, seed=31)                   # (B, N, H, D)
    q = x.transpose(1, 2).requires_grad_()            # (B, H, N, D) view, last stride 1
    o = ct.attention(rec, q, q, q, causal=True)
    assert rec.calls[-1].last_copies == []
    o.sum().backward()
    assert rec.calls[-1].last_copies == []
    with torch.no_grad():
        ct.attention(rec, q, q, q)
    assert rec.calls[-1].last_copies == []


def test_inference_under_no_grad_keeps_no_backward_state():
    rec = Recorder("full")
    q = rand(1, 2, 16, 8, seed=32)
    with torch.no_grad():
        a = ct.attention(rec, q, q, q)
    b = ct.attention(rec, q.clone().requires_grad_(), q, q)
    assert torch.equal(a, b.detach())
    with pytest.raises(RuntimeError, match="inference"):
        rec.calls[0].backward(np.ones((1, 2, 16, 8), np.float32))


def test_in_place_change_after_forward_is_refused():
    q = rand(1, 2, 16, 8, seed=33).requires_grad_()
    q2 = q * 1
    o = ct.Attention("full")(q2, q2, q2)
    q2.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        o.sum().backward()


def test_freed_storage_refused_not_read():
    q = rand(1, 2, 16, 8, seed=37)
    k = rand(1, 2, 16, 8, seed=38)
    qg = q.clone().requires_grad_()
    o = ct.Attention("full")(qg, k, k)
    # Freeing k's memory under the call's feet: PyTorch refuses while the call's NumPy view of it
    # lives (the adapter would refuse a changed storage in backward otherwise).
    with pytest.raises(RuntimeError, match="not resizable"):
        k.storage().resize_(0)
    o.sum().backward()
    assert torch.isfinite(qg.grad).all()


def test_adapter_errors():
    att = ct.Attention("full")
    q = rand(1, 2, 8, 4, seed=34)
    with pytest.raises(ValueError, match="q must have rank 4|must be \\(B, H, N, D\\)"):
        att(q[0], q[0], q[0])
    with pytest.raises(TypeError, match="floating-point"):
        att(q.long(), q, q)
    with pytest.raises(ValueError, match="bias gets no gradient"):
        att(q, q, q, bias=torch.zeros(8, 8, requires_grad=True))
    with pytest.raises(ValueError, match="batch|B ="):
        att(q, rand(2, 2, 8, 4, seed=35), rand(2, 2, 8, 4, seed=36))


@pytest.mark.parametrize("spec", ["full", "improved-clustered:clusters=3,topk=4", "linear"])
def test_double_backward_raises_instead_of_dropping_the_second_order_term(spec):
    """A gradient taken with create_graph=True (for a gradient penalty, which needs the second
    derivative) would need clattn's backward to be differentiable; it is not, so the gradient call
    itself raises rather than return a gradient that autograd treats as a constant (which
    silently dropped the second-order term)."""
    att = ct.Attention(spec)
    q = rand(1, 2, 12, 4, seed=40).requires_grad_()
    k, v = rand(1, 2, 12, 4, seed=41).requires_grad_(), rand(1, 2, 12, 4, seed=42).requires_grad_()
    o = att(q, k, v)
    with pytest.raises(RuntimeError, match="differentiable once"):
        torch.autograd.grad(o.square().sum(), q, create_graph=True)
    # First-order use is unchanged.
    o2 = att(q, k, v)
    o2.sum().backward()
    assert torch.isfinite(q.grad).all()


def test_importing_torch_leaves_clattns_thread_count():
    """clattn owns its thread count (OMP_NUM_THREADS, else the processors it may use): importing
    torch — before or after clattn — and torch.set_num_threads lower the OpenMP setting of the
    calling thread to torch's count, and must not lower clattn's (Debian's torch: 1)."""
    import os
    import subprocess
    import sys

    script = """
import sys
order = sys.argv[1]
if order == "torch-first":
    import torch
import clattn
if order == "clattn-first":
    import torch
torch.set_num_threads(1)
import numpy as np
x = np.ones((1, 1, 64, 8), np.float32)
clattn.Attention("full").forward(x, x, x)
print(clattn.get_num_threads(), clattn.config()["threads"])
clattn.set_num_threads(1)
torch.set_num_threads(3)
print(clattn.get_num_threads())
"""
    env = dict(os.environ, OMP_NUM_THREADS="3")
    for order in ("torch-first", "clattn-first"):
        out = subprocess.run([sys.executable, "-c", script, order], env=env, capture_output=True, text=True,
                             check=True).stdout.split()
        assert out == ["3", "3", "1"], (order, out)


def test_output_changed_in_place_before_backward_is_refused():
    """The backward reads the forward's output (D_i = dO·O): an in-place edit of it (o += r) would
    change dq and dk silently. Autograd's saved-tensor version check refuses it, as for torch's
    own ops; an out-of-place edit and a float64 output (a converted copy) are fine."""
    q, k, v = (rand(1, 2, 30, 8, seed=s).requires_grad_() for s in (1, 2, 3))
    att = ct.Attention("improved-clustered:clusters=3,topk=4")
    o = att(q, k, v)
    o += 1.0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        o.sum().backward()
    (att(q, k, v) + 1.0).sum().backward()
    q64 = q.detach().double().requires_grad_()
    o64 = att(q64, k.double(), v.double())
    o64.sum().backward()
    assert q64.grad is not None and torch.isfinite(q64.grad).all()


def test_sdpa_gradient_with_create_graph_is_refused():
    """As for Attention: scaled_dot_product_attention(x, x, x) differentiated with create_graph=True
    returned a gradient with requires_grad=False, so a second-order loss lost its term silently."""
    x = rand(1, 2, 12, 8, seed=4).requires_grad_()
    for f in (lambda t: ct.scaled_dot_product_attention(t, t, t),):
        with pytest.raises(RuntimeError, match="differentiable once"):
            torch.autograd.grad(f(x).sum(), x, create_graph=True)
        (g,) = torch.autograd.grad(f(x).sum(), x)  # first order stays as it was
        assert torch.isfinite(g).all()


def test_causal_clustered_with_a_block_past_the_sequence_says_it_is_exact():
    # Its block covers the whole sequence: every position is attended exactly, and the call says so.
    q, k, v = (torch.randn(1, 2, 40, 16) for _ in range(3))
    att = clattn.torch.Attention("improved-clustered:clusters=4,topk=4,block=64")
    with pytest.warns(UserWarning, match="covers the whole causal sequence of 40"):
        out = att(q, k, v, causal=True)
    full = clattn.torch.Attention("full")(q, k, v, causal=True)
    assert torch.allclose(out, full, atol=1e-5)
    with warnings.catch_warnings():  # a block below the length clusters, and says nothing
        warnings.simplefilter("error")
        clattn.torch.Attention("improved-clustered:clusters=4,topk=4,block=16")(q, k, v, causal=True)
        att(q, k, v, causal=False)
