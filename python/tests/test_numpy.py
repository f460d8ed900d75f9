"""The NumPy API: results bit for bit equal to `clattn attend`, arrays used in place, conversions,
the registry, threads and the GIL."""
import threading

import numpy as np
import pytest

import clattn
from conftest import randn

# Specs sized for small inputs, covering every registered variant (test_registry_covered checks).
SPECS = [
    "full",
    "full:scale=0.3",
    "clustered:clusters=6",
    "improved-clustered:clusters=6,topk=12",
    "local:window=16",
    "linear",
    "topk:topk=9",
    "smyrf:hashes=2,q_cluster=16,k_cluster=16,seed=5",
    "reformer:rounds=2,chunk=16",
    "routing:clusters=4",
    "conditional-full:length_limit=64,improved-clustered:clusters=6,topk=12",
]


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def case_options(caps, n, m):
    """make-inputs options and forward kwargs exercising every mask the variant honours."""
    make, attend, kw = [], [], {}
    if caps["cross"] and not caps["shared_qk"]:
        make += ["--m", m]
    if caps["query_lengths"]:
        make += ["--query-lengths", f"{n},{n // 2 + 1}"]
    if caps["key_lengths"]:
        mm = m if caps["cross"] and not caps["shared_qk"] else n
        make += ["--key-lengths", f"{mm - 3},{mm // 3}"]
    if caps["bias"]:
        make += ["--with-bias"]
    if caps["gqa"] and not caps["shared_qk"]:
        make += ["--kv-heads", 2]
    if caps["shared_qk"]:
        make += ["--shared-qk"]
    if caps["causal"]:
        attend += ["--causal"]
        kw["causal"] = True
    if caps["stochastic"]:
        attend += ["--step", 7]
        kw["step"] = 7
    return make, attend, kw


@pytest.mark.parametrize("spec", SPECS)
def test_equals_cli_bit_for_bit(spec, cli, tmp_path):
    att = clattn.Attention(spec)
    caps = att.capabilities
    n, m = 150, 170
    make, attend, kw = case_options(caps, n, m)
    grad = ["--with-grad"] if caps["trainable"] else []
    inp, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    r = cli("make-inputs", "--output", inp, "--batch", 2, "--heads", 4, "--n", n, "--dim", 16, "--seed", 3,
            *make, *grad)
    assert r.returncode == 0, r.stderr
    r = cli("attend", "--spec", spec, "--input", inp, "--output", out, "--threads", 2, *attend)
    assert r.returncode == 0, r.stderr
    x, ref = clattn.read_safetensors(inp), clattn.read_safetensors(out)
    o = att.forward(x["q"], x.get("k"), x["v"], query_lengths=x.get("query_lengths"),
                    key_lengths=x.get("key_lengths"), bias=x.get("bias"), **kw)
    assert att.last_copies == []
    assert o.dtype == np.float32 and o.shape == ref["o"].shape
    assert np.array_equal(bits(o), bits(ref["o"])), f"{spec}: max diff {np.abs(o - ref['o']).max()}"
    if grad:
        dq, dk, dv = att.backward(x["do"])
        for name, g in (("dq", dq), ("dk", dk), ("dv", dv)):
            assert np.array_equal(bits(g), bits(ref[name])), f"{spec} {name}: max diff {np.abs(g - ref[name]).max()}"


def test_registry_covered():
    names = {v["name"] for v in clattn.variants()}
    assert names == {s.split(":")[0] for s in SPECS}
    for v in clattn.variants():
        assert clattn.Attention(v["example"]).spec.startswith(v["name"])
        assert set(v) == {"name", "params", "summary", "example", "capabilities", "parameters"}


def test_float32_used_in_place_by_pointer():
    rng = np.random.default_rng(0)
    q, k, v = randn(rng, 1, 2, 33, 8), randn(rng, 1, 2, 40, 8), randn(rng, 1, 2, 40, 8)
    att = clattn.Attention("full")
    out = np.full((1, 2, 33, 8), np.nan, dtype=np.float32)
    o = att.forward(q, k, v, out=out)
    assert att.last_copies == []
    assert o.__array_interface__["data"][0] == out.__array_interface__["data"][0]
    assert not np.isnan(out).any()
    # Gradients accumulate (+=) into given arrays, in place.
    dq, dk, dv = (np.ones_like(a) for a in (q, k, v))
    rq, rk, rv = att.backward(np.ones_like(o), dq=dq, dk=dk, dv=dv)
    assert rq is dq and rk is dk and rv is dv
    g = clattn.Attention("full")
    g.forward(q, k, v)
    eq, ek, ev = g.backward(np.ones_like(o))
    # (dk sums partial products over query tiles into the given array: equal up to rounding.)
    for got, fresh in ((dq, eq), (dk, ek), (dv, ev)):
        assert np.allclose(got, fresh + 1, rtol=0, atol=1e-6)


def test_token_major_views_read_in_place():
    """(B, N, H, D) buffers transposed to (B, H, N, D) keep a unit innermost stride: no copy."""
    rng = np.random.default_rng(1)
    x = randn(rng, 2, 50, 3, 16)             # (B, N, H, D)
    q = x.transpose(0, 2, 1, 3)              # (B, H, N, D) view
    att = clattn.Attention("full")
    o = att.forward(q, q, q)
    assert att.last_copies == []
    c = np.ascontiguousarray(q)
    assert np.array_equal(bits(o), bits(clattn.Attention("full").forward(c, c, c)))


def test_conversions_are_copies_with_the_same_result():
    rng = np.random.default_rng(2)
    q, k, v = randn(rng, 1, 2, 20, 8), randn(rng, 1, 2, 20, 8), randn(rng, 1, 2, 20, 8)
    ref = clattn.Attention("full").forward(q, k, v)
    att = clattn.Attention("full")
    # float64 in: converted to float32 (exactly representable here), output float32.
    o = att.forward(q.astype(np.float64), k, v)
    assert att.last_copies == ["q"] and o.dtype == np.float32
    assert np.array_equal(bits(o), bits(ref))
    # A last dim with a stride other than one element: copied to C order.
    qt = np.ascontiguousarray(q.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    o = att.forward(qt, k, v)
    assert att.last_copies == ["q"]
    assert np.array_equal(bits(o), bits(ref))
    # Big-endian float32 and nested lists are converted too.
    o = att.forward(q.astype(">f4"), k.tolist(), v)
    assert att.last_copies == ["q", "k"]
    assert np.array_equal(bits(o), bits(ref))
    # float16: converted (values differ from the float32 input's, so only the dtype is checked).
    assert att.forward(q.astype(np.float16), k, v).dtype == np.float32


def test_shared_qk_k_none_is_q():
    rng = np.random.default_rng(3)
    q, v = randn(rng, 1, 2, 64, 8), randn(rng, 1, 2, 64, 8)
    a, b = clattn.Attention("reformer:chunk=16"), clattn.Attention("reformer:chunk=16")
    assert np.array_equal(bits(a.forward(q, None, v)), bits(b.forward(q, q, v)))


def test_stochastic_step_and_determinism():
    rng = np.random.default_rng(4)
    q, k, v = randn(rng, 1, 2, 128, 8), randn(rng, 1, 2, 128, 8), randn(rng, 1, 2, 128, 8)
    att = clattn.Attention("smyrf:q_cluster=16,k_cluster=16")
    o0, o0b, o1 = att.forward(q, k, v, step=0), att.forward(q, k, v, step=0), att.forward(q, k, v, step=1)
    assert np.array_equal(bits(o0), bits(o0b))
    assert not np.array_equal(o0, o1)


def test_stateful_routing_ema_state():
    rng = np.random.default_rng(5)
    q, k, v = randn(rng, 1, 2, 64, 8), randn(rng, 1, 2, 64, 8), randn(rng, 1, 2, 64, 8)
    att = clattn.Attention("routing:clusters=4,centroids=ema")
    assert att.capabilities["stateful"]
    att.forward(q, k, v)
    before = att.state
    assert list(before) == ["centroids"]  # made from the seed on first use
    att.forward(q, k, v, train=True)      # a training call moves the EMA centroids
    after = att.state
    assert not np.array_equal(before["centroids"], after["centroids"])
    att.forward(q, k, v)                  # an evaluation call only reads them
    assert np.array_equal(att.state["centroids"], after["centroids"])
    att.reset_state()
    assert att.state == {}


def test_threads():
    clattn.set_num_threads(1)
    assert clattn.get_num_threads() == 1
    rng = np.random.default_rng(6)
    q = randn(rng, 2, 2, 300, 16)
    one = clattn.Attention("full").forward(q, q, q)
    # Set in this thread, applied to calls from any thread.
    res = {}
    t = threading.Thread(target=lambda: res.setdefault("n", clattn.get_num_threads()))
    t.start()
    t.join()
    assert res["n"] == 1
    clattn.set_num_threads(2)
    two = clattn.Attention("full").forward(q, q, q)
    assert np.array_equal(bits(one), bits(two))  # full is deterministic across thread counts
    with pytest.raises(ValueError, match="n must be >= 1"):
        clattn.set_num_threads(0)


def test_gil_released_during_kernels():
    """Another Python thread runs while a forward is inside the kernels: it counts loop turns while
    the forward's thread is alive. With the GIL held for the whole forward it could only run in the
    moments before and after the kernel."""
    rng = np.random.default_rng(7)
    q = randn(rng, 1, 4, 2048, 64)
    att = clattn.Attention("full")
    clattn.set_num_threads(1)
    started = threading.Event()

    def work():
        started.set()
        for _ in range(3):
            att.forward(q, q, q)

    t = threading.Thread(target=work)
    t.start()
    started.wait()
    turns = 0
    while t.is_alive():
        turns += 1
    t.join()
    assert turns > 10000


def test_calls_are_independent():
    rng = np.random.default_rng(8)
    q1, q2 = randn(rng, 1, 2, 40, 8), randn(rng, 1, 2, 40, 8)
    att = clattn.Attention("full")
    c1, c2 = att.new_call(), att.new_call()
    c1.forward(q1, q1, q1)
    c2.forward(q2, q2, q2)
    do = np.ones((1, 2, 40, 8), np.float32)
    ref = clattn.Attention("full")
    ref.forward(q1, q1, q1)
    assert all(np.array_equal(a, b) for a, b in zip(c1.backward(do), ref.backward(do)))


def test_config_reports_the_machine_as_the_cli_does(cli):
    c = clattn.config()
    flags = open("/proc/cpuinfo").read().split("flags", 1)[1].split("\n", 1)[0].split()
    assert c["isa"] in c["isas_supported"].split()
    assert ("avx512" in c["isas_supported"]) == ("avx512f" in flags)
    assert c["gemm_verified"] is True
    assert "register tiles" in c["gemm_products"]
    assert c["gemm"].startswith("OpenBLAS") and c["gemm_kernel"]
    assert "openmp" in c["gemm_library"]
    assert c["threads"] == clattn.get_num_threads()
    r = cli("--version")
    assert r.returncode == 0, r.stderr
    version = r.stdout
    assert f"ISA {c['isa']}" in version and f"{c['gemm_kernel']} kernel" in version


def test_attention_pickles_with_its_spec_and_layer_state():
    import pickle

    a = clattn.Attention("routing:clusters=2,centroids=ema")
    x = np.random.default_rng(0).standard_normal((1, 2, 30, 8)).astype(np.float32)
    a.forward(x, x, x, train=True)
    b = pickle.loads(pickle.dumps(a))
    assert b.spec == a.spec and set(b.state) == {"centroids"}
    np.testing.assert_array_equal(b.state["centroids"], a.state["centroids"])
    np.testing.assert_array_equal(b.forward(x, x, x), a.forward(x, x, x))
    with pytest.raises(TypeError, match="centroids must be a floating-point array"):
        b.set_state({"centroids": "nope"})


@pytest.mark.parametrize("spec", ["clustered:clusters=3", "clustered:clusters=4", "clustered:clusters=3,seed=1",
                                  "improved-clustered:clusters=3,topk=4"])
@pytest.mark.parametrize("causal", [False, True])
def test_clustered_backward_stays_within_its_bound_at_huge_logits(spec, causal):
    # One query and one key scaled by 1e5 make logits near 1e10, where one float ulp is 1024: the
    # backward's recomputed centroid scores can round above the forward's log-sum-exp. Probabilities
    # are clamped at 1, so dV_l = Σ_j A_jl G_j keeps |dV| <= Σ_j |G_j| <= N·max|dO|. Before the clamp,
    # seed 3 with (query 0, key 300) gave max|dV| 1.5e6 against a bound of 1.2e3.
    H, N, D = 2, 301, 16
    if causal:
        spec += ",block=32,segment=64"
    for seed in range(12):
        for qi, ki in [(5, 5), (5, 7), (0, 300), (150, 3)]:
            rng = np.random.default_rng(seed)
            q, k, v, do = [rng.standard_normal((1, H, N, D), dtype=np.float32) for _ in range(4)]
            q[0, 0, qi] *= 1e5
            k[0, 0, ki] *= 1e5
            att = clattn.Attention(spec)
            att.forward(q, k, v, causal=causal, train=True)
            dq, dk, dv = att.backward(do)
            bound = N * np.abs(do).max()
            assert np.abs(dv).max() <= bound * 1.001, (seed, qi, ki, np.abs(dv).max(), bound)
            for g in (dq, dk, dv):
                assert np.isfinite(g).all(), (seed, qi, ki)
