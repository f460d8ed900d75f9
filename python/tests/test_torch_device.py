"""The tensor-op path of clattn.torch (python/clattn/_device.py), forced on CPU tensors with
backend="torch": outputs and gradients against the C++ kernels on the same inputs (same planes
and clusters, so agreement to float rounding), the paper's exact limits, the entry points, and
the errors. On a machine with a GPU the same tests run there too (the device cases)."""
import math

import pytest

torch = pytest.importorskip("torch")
import clattn  # noqa: E402
import clattn._device as dv  # noqa: E402
import clattn.torch as ct  # noqa: E402
from conftest import rand  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30))


def run(spec, backend, q, k, v, do, device="cpu", **kw):
    """Output and gradients (o, dq, dk, dv) on CPU, from leaves copied to `device`."""
    leaves = [t.detach().to(device).requires_grad_() for t in (q, k, v)]
    o = ct.attention(clattn.Attention(spec), *leaves, backend=backend, **kw)
    o.backward(do.to(device))
    return [t.detach().cpu() for t in (o, *(x.grad for x in leaves))]


def reference_full(q, k, v, causal=False, key_lengths=None, query_lengths=None):
    """Softmax attention as plain PyTorch ops, the clattn contract's masks (0 where nothing is seen)."""
    B, H, N, D = q.shape
    Hkv, M = k.shape[1], k.shape[2]
    k = k.repeat_interleave(H // Hkv, dim=1)
    v = v.repeat_interleave(H // Hkv, dim=1)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    i, j = torch.arange(N).view(N, 1), torch.arange(M).view(1, M)
    mask = torch.ones(B, 1, N, M, dtype=torch.bool)
    if causal:
        mask = mask & (j <= i + (M - N))
    if key_lengths is not None:
        mask = mask & (j.view(1, 1, 1, M) < torch.as_tensor(key_lengths).view(B, 1, 1, 1))
    if query_lengths is not None:
        mask = mask & (i.view(1, 1, N, 1) < torch.as_tensor(query_lengths).view(B, 1, 1, 1))
    return torch.softmax(s.masked_fill(~mask, -1e30), -1) * mask @ v


# B 2, GQA (H 4 over Hkv 2), cross attention (N != M), odd sizes; specs that reach each clustering
# rule: k-means (default bits), fewer distinct codes than clusters (bits=3), many k-means rounds on
# short codes, bits=64 (the sign bit of the packed code), positional, another seed and step.
SPECS = [
    "clustered:clusters=12",
    "improved-clustered:clusters=12,topk=8",
    "clustered:clusters=12,bits=3",
    "improved-clustered:clusters=9,bits=6,iterations=25,seed=11",
    "clustered:clusters=20,bits=64,hash_bias=false",
    "improved-clustered:clusters=7,topk=5,clustering=positional",
    "full",
]
MASKS = [dict(), dict(query_lengths=[113, 60], key_lengths=[65, 97])]


@pytest.mark.parametrize("mask", MASKS, ids=["plain", "lengths"])
@pytest.mark.parametrize("spec", SPECS)
def test_outputs_and_gradients_equal_the_cpp_kernels(spec, mask):
    B, H, Hkv, N, M, D = 2, 4, 2, 113, 97, 16
    q, k, v = rand(B, H, N, D, seed=1, scale=1.5), rand(B, Hkv, M, D, seed=2), rand(B, Hkv, M, D, seed=3)
    do = rand(B, H, N, D, seed=4)
    want = run(spec, "cpp", q, k, v, do, step=5, **mask)
    got = run(spec, "torch", q, k, v, do, step=5, **mask)
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, want):
        assert torch.isfinite(a).all(), name
        assert rel(a, b) <= 1e-4, f"{spec} {name}: relative error {rel(a, b):.2e}"
    if mask:  # padded query rows are exactly 0
        assert got[0][1, :, 60:].abs().max() == 0


@pytest.mark.parametrize("step", [0, 1, 7])
def test_clusters_are_the_cpp_kernels_clusters(step):
    # Plain clustered attention copies one row per cluster, so rows that are equal in the C++
    # output are the C++ clusters: the torch path must group the queries in exactly the same way.
    B, H, N, M, D = 1, 2, 400, 150, 8
    q, k, v = rand(B, H, N, D, seed=10 + step), rand(B, H, M, D, seed=11), rand(B, H, M, D, seed=12)
    spec = "clustered:clusters=25,seed=3"
    o = ct.attention(clattn.Attention(spec), q, k, v, step=step, backend="cpp")
    p = dv.Params(clattn.Attention(spec).spec)
    assign, ce = dv.clusters(p, q.reshape(B * H, N, D), [N] * (B * H), step, 0)
    for h in range(H):
        _, cpp_ids = torch.unique(o[0, h], dim=0, return_inverse=True)  # (N,) id of each distinct row
        pairs = torch.unique(torch.stack([cpp_ids, assign[h]]), dim=1)
        assert ce[h] == 25
        assert pairs.shape[1] == int(cpp_ids.max()) + 1 == int(assign[h].max()) + 1  # a bijection


def test_other_seed_or_step_gives_other_clusters():
    q = rand(1, 1, 300, 8, seed=20)
    p = dv.Params(clattn.Attention("clustered:clusters=10").spec)
    a0, _ = dv.clusters(p, q[0], [300], 0, 0)
    a1, _ = dv.clusters(p, q[0], [300], 1, 0)
    assert not torch.equal(a0, a1)


def test_clusters_equal_to_queries_is_full_attention():
    # The paper's limit: C = N puts every query in its own cluster, which is exact attention.
    B, H, N, D = 2, 2, 50, 16
    q, k, v = rand(B, H, N, D, seed=30), rand(B, H, N, D, seed=31), rand(B, H, N, D, seed=32)
    do = rand(B, H, N, D, seed=33)
    got = run(f"clustered:clusters={N}", "torch", q, k, v, do)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = reference_full(*leaves)
    o.backward(do)
    for a, b in zip(got, [o.detach()] + [t.grad for t in leaves]):
        assert rel(a, b) <= 1e-5


def test_topk_covering_the_keys_is_full_attention():
    # Improved clustered with topk = M recomputes every query on every key: exact attention,
    # whatever the clusters (here 4 of them), with key padding.
    B, H, N, M, D = 2, 2, 70, 40, 16
    q, k, v = rand(B, H, N, D, seed=40), rand(B, H, M, D, seed=41), rand(B, H, M, D, seed=42)
    do = rand(B, H, N, D, seed=43)
    got = run(f"improved-clustered:clusters=4,topk={M}", "torch", q, k, v, do, key_lengths=[M, 23])
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = reference_full(*leaves, key_lengths=[M, 23])
    o.backward(do)
    for a, b in zip(got, [o.detach()] + [t.grad for t in leaves]):
        assert rel(a, b) <= 1e-5


def test_full_causal_cross_and_lengths_equal_the_cpp_kernels():
    B, H, N, M, D = 2, 2, 40, 57, 16
    q, k, v = rand(B, H, N, D, seed=50), rand(B, 1, M, D, seed=51), rand(B, 1, M, D, seed=52)
    do = rand(B, H, N, D, seed=53)
    kw = dict(causal=True, key_lengths=[57, 30], query_lengths=[40, 33])
    for a, b in zip(run("full", "torch", q, k, v, do, **kw), run("full", "cpp", q, k, v, do, **kw)):
        assert rel(a, b) <= 1e-5


@pytest.mark.parametrize("spec", ["clustered:clusters=5", "improved-clustered:clusters=5,topk=4", "full"])
def test_empty_sequences_give_zero_rows_and_finite_gradients(spec):
    B, H, N, D = 3, 2, 20, 8
    q, k, v = rand(B, H, N, D, seed=45), rand(B, H, N, D, seed=46), rand(B, H, N, D, seed=47)
    do = rand(B, H, N, D, seed=48)
    kw = dict(query_lengths=[0, 20, 9], key_lengths=[20, 0, 4])
    got, want = run(spec, "torch", q, k, v, do, **kw), run(spec, "cpp", q, k, v, do, **kw)
    for a, b in zip(got, want):
        assert torch.isfinite(a).all() and rel(a, b) <= 1e-4
    assert got[0][:2].abs().max() == 0


@pytest.mark.parametrize("case", ["causal N > M", "bias"])
def test_full_rows_that_see_no_key_are_zero_without_nan(case):
    # Causal with N > M leaves the first N − M queries without keys; a bias row of −inf too. Their
    # output is 0 and no NaN reaches the gradients of the other rows.
    B, H, N, M, D = 1, 2, 30, 21, 8
    q, k, v = rand(B, H, N, D, seed=55), rand(B, H, M, D, seed=56), rand(B, H, M, D, seed=57)
    do = rand(B, H, N, D, seed=58)
    kw = dict(causal=True) if case == "causal N > M" else dict(bias=rand(N, M, seed=59).index_fill(0, torch.tensor([3]), float("-inf")))
    got, want = run("full", "torch", q, k, v, do, **kw), run("full", "cpp", q, k, v, do, **kw)
    for a, b in zip(got, want):
        assert torch.isfinite(a).all() and rel(a, b) <= 1e-5
    assert got[0][0, :, 3].abs().max() == 0


def test_small_blocks_give_the_same_result():
    # Long sequences run in blocks (centroid rows, query rows, hashing rows): force many tiny
    # blocks and the result must not change.
    B, H, N, M, D = 1, 2, 150, 130, 8
    q, k, v = rand(B, H, N, D, seed=60), rand(B, H, M, D, seed=61), rand(B, H, M, D, seed=62)
    do = rand(B, H, N, D, seed=63)
    spec = "improved-clustered:clusters=10,topk=6"
    want = run(spec, "torch", q, k, v, do)
    old = dv.set_block_budget(300, "cpu")
    try:
        got = run(spec, "torch", q, k, v, do)
    finally:
        dv.set_block_budget(old, "cpu")
    for a, b in zip(got, want):
        assert rel(a, b) <= 1e-6


@pytest.mark.parametrize("spec", ["full", "clustered:clusters=1024", "improved-clustered:clusters=64,topk=32"])
def test_no_allocation_grows_as_n_squared(spec):
    # With blocks of 2^14 elements no single allocation of forward or backward may approach one
    # (N, N) float32 matrix (4 MiB here), not even at C = N; the default CPU budget (2^23) would
    # allocate whole (N, N) score blocks, and fails this check.
    N = 1024
    q, k, v = (rand(1, 1, N, 16, seed=s).requires_grad_() for s in (100, 101, 102))
    old = dv.set_block_budget(1 << 14, "cpu")
    try:
        with torch.autograd.profiler.profile(profile_memory=True) as prof:
            o = ct.attention(clattn.Attention(spec), q, k, v, backend="torch")
            o.sum().backward()
    finally:
        dv.set_block_budget(old, "cpu")
    largest = max(e.cpu_memory_usage for e in prof.function_events)
    assert 0 < largest < N * N * 4 // 8, largest


def _walk_reference(codes, valid, dist, cent, empty):
    """The C++ re-seeding loop, transcribed: farthest first (lower index on ties), skipping codes
    any centroid holds at that moment, a pointer that never goes back."""
    out = cent.clone()
    for g in range(codes.shape[0]):
        order = sorted((i for i in range(codes.shape[1]) if valid[g, i]), key=lambda i: (-float(dist[g, i]), i))
        nxt = 0
        for c in range(cent.shape[1]):
            if not empty[g, c]:
                continue
            held = set(out[g].tolist())
            while nxt < len(order) and int(codes[g, order[nxt]]) in held:
                nxt += 1
            if nxt < len(order):
                out[g, c] = codes[g, order[nxt]]
                nxt += 1
    return out


def test_empty_cluster_reseeding_follows_the_kernels_walk():
    # Empty clusters are rare on real inputs: exercise the rule on made-up states, including old
    # codes of empty clusters among the candidates (the order-dependent case).
    g = torch.Generator().manual_seed(70)
    for trial in range(40):
        G, N, C = 3, 30, 8
        codes = torch.randint(0, 12, (G, N), generator=g)
        valid = torch.rand(G, N, generator=g) < 0.9
        dist = torch.randint(0, 4, (G, N), generator=g).float()
        cent = torch.randint(0, 12, (G, C), generator=g)
        empty = torch.rand(G, C, generator=g) < 0.4
        got = dv._reseed_empty(codes, valid, dist, cent, empty)
        assert torch.equal(got, _walk_reference(codes, valid, dist, cent, empty)), trial


def test_sdpa_and_multihead_attention_take_the_torch_path():
    B, H, L, E = 2, 2, 64, 16
    q, k, v = rand(B, H, L, E, seed=80), rand(B, H, L, E, seed=81), rand(B, H, L, E, seed=82)
    mask = torch.ones(B, 1, 1, L, dtype=torch.bool)
    mask[1, ..., 40:] = False  # key padding
    spec = "improved-clustered:clusters=6,topk=8"
    a = ct.scaled_dot_product_attention(q, k, v, attn_mask=mask, spec=spec, step=2, backend="torch")
    b = ct.scaled_dot_product_attention(q, k, v, attn_mask=mask, spec=spec, step=2, backend="cpp")
    assert rel(a, b) <= 1e-5
    torch.manual_seed(0)
    m1 = ct.MultiheadAttention(32, 4, batch_first=True, spec=spec, backend="torch").eval()
    m2 = ct.MultiheadAttention(32, 4, batch_first=True, spec=spec).eval()
    m2.load_state_dict(m1.state_dict())
    x = rand(2, 50, 32, seed=83)
    kpm = torch.zeros(2, 50, dtype=torch.bool)
    kpm[0, 30:] = True
    assert rel(m1(x, x, x, key_padding_mask=kpm)[0], m2(x, x, x, key_padding_mask=kpm)[0]) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs(device, dtype):
    # bf16/fp16 storage with float32 softmax statistics: the output keeps the input's dtype and
    # stays within the storage precision of the C++ result on the same (rounded) inputs, whose
    # hashes are the same (the projection is float32 on every device).
    B, H, N, D = 1, 2, 96, 16
    q, k, v = (rand(B, H, N, D, seed=s).to(dtype) for s in (90, 91, 92))
    spec = "improved-clustered:clusters=8,topk=8"
    want = ct.attention(clattn.Attention(spec), q.float(), k.float(), v.float(), backend="cpp")
    leaves = [t.to(device).requires_grad_() for t in (q, k, v)]
    o = ct.attention(clattn.Attention(spec), *leaves, backend="torch")
    o.float().sum().backward()
    assert o.dtype == dtype and o.device.type == device
    assert all(t.grad is not None and t.grad.dtype == dtype for t in leaves)
    assert rel(o.float().cpu(), want) <= (1e-2 if dtype == torch.bfloat16 else 2e-3)


@pytest.mark.parametrize("device", DEVICES[1:])
def test_device_equals_cpp_kernels(device):
    B, H, N, D = 2, 4, 300, 32
    q, k, v = rand(B, H, N, D, seed=95), rand(B, H, N, D, seed=96), rand(B, H, N, D, seed=97)
    do = rand(B, H, N, D, seed=98)
    for spec in ("clustered:clusters=20", "improved-clustered:clusters=20,topk=16"):
        want = run(spec, "cpp", q, k, v, do)
        got = run(spec, "auto", q, k, v, do, device=device)
        for a, b in zip(got, want):
            assert rel(a, b) <= 1e-3


def test_errors_name_the_problem():
    q = rand(1, 2, 16, 8, seed=99)
    att = clattn.Attention("clustered:clusters=4")
    with pytest.raises(ValueError, match="causal 'clustered'.*C\\+\\+ kernels"):
        ct.attention(att, q, q, q, causal=True, backend="torch")
    with pytest.raises(ValueError, match="'local'.*C\\+\\+ kernels on CPU tensors only"):
        ct.attention(clattn.Attention("local:window=4"), q, q, q, backend="torch")
    with pytest.raises(ValueError, match="backend must be one of auto, cpp, torch"):
        ct.attention(att, q, q, q, backend="cuda")
    with pytest.raises(ValueError, match="backend must be one of"):
        ct.Attention("full", backend="gpu")
    with pytest.raises(ValueError, match="key_lengths\\[0\\] must be in \\[0, 16\\], got 17"):
        ct.attention(att, q, q, q, key_lengths=[17], backend="torch")
    with pytest.raises(ValueError, match="H % Hkv must be 0"):
        ct.attention(att, q, rand(1, 3, 16, 8, seed=1), rand(1, 3, 16, 8, seed=2), backend="torch")
    with pytest.raises(TypeError, match="q must be float32"):
        ct.attention(att, q.to(torch.int32), q, q, backend="torch")
    with pytest.raises(ValueError, match="an additive bias is not supported by clustered"):
        ct.attention(att, q, q, q, bias=torch.zeros(16, 16), backend="torch")
    with pytest.raises(ValueError, match="must be a CPU tensor"):  # the C++ kernels, forced, on a
        ct.attention(att, q.to("meta"), q.to("meta"), q.to("meta"), backend="cpp")  # tensor off the CPU


def _bad_inputs():
    """(name, spec, q, k, v, extra keyword arguments): inputs the C++ kernels refuse."""
    q, k, v = rand(1, 2, 16, 8, seed=70), rand(1, 2, 12, 8, seed=71), rand(1, 2, 12, 8, seed=72)

    def poke(t, idx, x):
        t = t.clone()
        t[idx] = x
        return t

    bias = rand(16, 12, seed=73)
    cases = []
    for spec in ("full", "improved-clustered:clusters=4,topk=4", "clustered:clusters=4"):
        cases += [
            ("nan q", spec, poke(q, (0, 1, 3, 4), float("nan")), k, v, {}),
            ("inf k", spec, q, poke(k, (0, 0, 11, 7), float("inf")), v, {}),
            ("-inf v", spec, q, k, poke(v, (0, 1, 0, 0), float("-inf")), {}),
            ("q.k past float", spec, q * 1e19, k * 1e19, v, {}),
            ("v sums past float", spec, q, k, v * 1e36, {}),
            ("key lengths", spec, q, k, v, {"key_lengths": [13]}),
            ("query lengths count", spec, q, k, v, {"query_lengths": [1, 2]}),
            ("gqa", spec, q, k[:, :1].expand(1, 3, 12, 8).contiguous(), v[:, :1].expand(1, 3, 12, 8).contiguous(), {}),
            ("head dim", spec, q, k[..., :4].contiguous(), v, {}),
            ("kv rows", spec, q, k, v[:, :, :11].contiguous(), {}),
            ("bias", spec, q, k, v, {"bias": bias}),  # refused by the clustered variants
        ]
    cases += [
        ("bias (1, M)", "full", q, k, v, {"bias": bias[:1]}),
        ("bias (N, 1)", "full", q, k, v, {"bias": bias[:, :1]}),
        ("+inf bias", "full", q, k, v, {"bias": poke(bias, (2, 3), float("inf"))}),
        ("nan bias", "full", q, k, v, {"bias": poke(bias, (5, 0), float("nan"))}),
        ("bias past float", "full", q, k, v, {"bias": bias * 1e37}),
    ]
    return [c for c in cases if not (c[0] == "bias" and c[1] == "full")]


@pytest.mark.parametrize("case", _bad_inputs(), ids=lambda c: f"{c[0]}-{c[1].split(':')[0]}")
def test_bad_inputs_get_the_cpp_kernels_error_on_both_backends(case):
    """The tensor-op path checks its inputs by the C++ kernels' rules, with their messages: one
    NaN query used to spread to its whole cluster, a (1, M) bias broadcast, +inf bias rows came
    out 0 and q·k past float overflowed silently."""
    name, spec, q, k, v, kw = case
    att = clattn.Attention(spec)
    errors = {}
    for backend in ("cpp", "torch"):
        with pytest.raises(ValueError) as e:
            ct.attention(att, q, k, v, backend=backend, **kw)
        errors[backend] = str(e.value)
    assert errors["torch"] == errors["cpp"], errors
    assert spec.split(":")[0] in errors["cpp"]


def test_mixed_dtypes_and_empty_sequences_run_as_on_the_cpp_kernels():
    q, k, v = rand(1, 2, 16, 8, seed=74), rand(1, 2, 12, 8, seed=75), rand(1, 2, 12, 8, seed=76)
    for spec in ("full", "improved-clustered:clusters=4,topk=4"):
        att = clattn.Attention(spec)
        # k and v in another dtype than q: computed in q's dtype, the output in q's dtype.
        got = ct.attention(att, q, k.double(), v.half(), backend="torch")
        want = ct.attention(att, q, k.double(), v.half(), backend="cpp")
        assert got.dtype == want.dtype == torch.float32
        assert rel(got, want) <= 2e-3
        for qq, kk, vv in ((q[:, :, :0], k, v), (q, k[:, :, :0], v[:, :, :0])):
            leaves = [t.clone().requires_grad_() for t in (qq, kk, vv)]
            outs = [ct.attention(att, *leaves, backend=b) for b in ("torch", "cpp")]
            assert outs[0].shape == outs[1].shape and not outs[0].any() and not outs[1].any()
            outs[0].sum().backward()
            assert all(t.grad is not None and not t.grad.any() for t in leaves)


def _penalty_gradients(fn, q, k, v):
    """Gradients of a gradient penalty, |d(Σ o²)/dq|², which needs the second derivative."""
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    (gq,) = torch.autograd.grad(fn(*leaves).square().sum(), leaves[0], create_graph=True)
    gq.square().sum().backward()
    return [t.grad for t in leaves]


@pytest.mark.parametrize("backend", ["cpp", "torch"])
@pytest.mark.parametrize("spec", ["improved-clustered:clusters=3,topk=4", "improved-clustered:clusters=12,topk=4"])
def test_double_backward_of_improved_clustered_raises_on_both_backends(spec, backend):
    """The member stage's backward reads the saved log-sum-exp as a constant: taken with
    create_graph=True it gave second derivatives off by ~1 (C = N, exact attention, showed it).
    Both backends refuse with the same message; first-order gradients are unchanged."""
    q, k, v = (rand(1, 2, 12, 4, seed=s) for s in (60, 61, 62))
    att = clattn.Attention(spec)
    with pytest.raises(RuntimeError, match="clattn's attention is differentiable once"):
        _penalty_gradients(lambda a, b, c: ct.attention(att, a, b, c, backend=backend), q, k, v)
    _, dq, _, _ = run(spec, backend, q, k, v, rand(1, 2, 12, 4, seed=63))
    assert torch.isfinite(dq).all() and dq.abs().sum() > 0


def test_double_backward_of_full_and_clustered_on_the_torch_path_is_autograds():
    """full and clustered have no backward of their own on the tensor-op path: their second
    derivatives are autograd's, equal to those of the same attention written as plain PyTorch
    ops (gradgradcheck does not apply: the statistics are float32 whatever the input dtype)."""
    B, H, N, D = 1, 2, 12, 4
    q, k, v = (rand(B, H, N, D, seed=s) for s in (64, 65, 66))
    spec = "clustered:clusters=3"
    assign, _ = dv.clusters(dv.Params(clattn.Attention(spec).spec), q.reshape(B * H, N, D), [N] * (B * H), 0, 0)
    onehot = torch.nn.functional.one_hot(assign, 3).float().view(B, H, N, 3)  # constant, as the clusters

    def reference_clustered(q, k, v):
        qc = (onehot.transpose(-1, -2) @ q) / onehot.sum(2).clamp(min=1).unsqueeze(-1)  # centroid means
        return onehot @ reference_full(qc, k, v)

    for spec, reference in (("full", reference_full), (f"clustered:clusters={N}", reference_full),
                            (spec, reference_clustered)):
        att = clattn.Attention(spec)
        got = _penalty_gradients(lambda a, b, c: ct.attention(att, a, b, c, backend="torch"), q, k, v)
        want = _penalty_gradients(reference, q, k, v)
        for a, b in zip(got, want):
            assert rel(a, b) <= 1e-5, (spec, rel(a, b))


def test_the_tensor_op_variants_are_the_registrys_torch_ops():
    # Python's dispatch reads the capability; no list of its own.
    from clattn import _device
    want = tuple(v["name"] for v in clattn.variants() if v["capabilities"]["torch_ops"])
    assert _device.SUPPORTED == want == ("full", "clustered", "improved-clustered")
    assert not clattn.Attention("local:window=8").capabilities["torch_ops"]
    q = torch.randn(1, 1, 8, 4)
    with pytest.raises(ValueError, match="torch_ops capability"):
        clattn.torch.attention(clattn.torch.Attention("local:window=8").attention, q, q, q, backend="torch")
    # The parameters come from the canonical spec the registry wrote, defaults included.
    p = _device.Params(clattn.Attention("improved-clustered:clusters=7,topk=5").spec)
    assert (p.clusters, p.topk, p.bits, p.iterations, p.hash_bias, p.seed) == (7, 5, 63, 10, True, 0)
    p = _device.Params(clattn.Attention("clustered:clusters=3,clustering=positional").spec)
    assert p.positional and p.clusters == 3 and p.bits == 0
