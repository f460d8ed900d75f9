"""Errors: ValueError for bad specs, shapes and values, TypeError for non-float dtypes,
RuntimeError otherwise; clattn's own message, equal to what `clattn attend` prints; no crash."""
import gc

import numpy as np
import pytest

import clattn
from conftest import randn


def cli_message(r):
    """The message of `clattn: error: <message>` on the CLI's stderr, or of a spec the CLI refused
    while parsing its options (`clattn: usage error: --spec: <message>`)."""
    assert r.returncode != 0
    prefixes = ("clattn: error: ", "clattn: usage error: --spec: ")
    lines = [ln[len(p):] for ln in r.stderr.splitlines() for p in prefixes if ln.startswith(p)]
    assert lines, r.stderr
    return lines[-1]


@pytest.mark.parametrize("spec", ["bogus", "full:scale=-1", "clustered", "local:window=4,window=5",
                                  "full:scael=0.1", "conditional-full:length_limit", "full: scale=1"])
def test_bad_spec_is_value_error_with_the_cli_message(spec, cli, tmp_path):
    with pytest.raises(ValueError) as e:
        clattn.Attention(spec)
    r = cli("attend", "--spec", spec, "--input", tmp_path / "none.safetensors", "--output", tmp_path / "o.safetensors")
    assert r.returncode == 2, r.stderr  # a usage error, refused before the input is read
    assert str(e.value) == cli_message(r)


def bad_inputs():
    """(name, spec, tensors, causal): inputs that break the attention contract."""
    rng = np.random.default_rng(0)
    q, k, v = randn(rng, 2, 4, 10, 8), randn(rng, 2, 4, 12, 8), randn(rng, 2, 4, 12, 8)
    nan_q = q.copy()
    nan_q[1, 2, 3, 4] = np.nan
    inf_v = v.copy()
    inf_v[0, 0, 11, 7] = np.inf
    return [
        ("batch", "full", dict(q=q, k=randn(rng, 3, 4, 12, 8), v=randn(rng, 3, 4, 12, 8)), False),
        ("head dim", "full", dict(q=q, k=randn(rng, 2, 4, 12, 4), v=v), False),
        ("kv rows", "full", dict(q=q, k=k, v=randn(rng, 2, 4, 11, 8)), False),
        ("gqa", "full", dict(q=q, k=randn(rng, 2, 3, 12, 8), v=randn(rng, 2, 3, 12, 8)), False),
        ("nan", "full", dict(q=nan_q, k=k, v=v), False),
        ("inf", "improved-clustered:clusters=2", dict(q=q, k=k, v=inf_v), False),
        ("key lengths", "full", dict(q=q, k=k, v=v, key_lengths=np.array([12, 13], np.int32)), False),
        ("query lengths count", "full", dict(q=q, k=k, v=v, query_lengths=np.array([1, 2, 3], np.int32)), False),
        ("bias shape", "full", dict(q=q, k=k, v=v, bias=randn(rng, 10, 11)), False),
        ("bias unsupported", "local:window=4", dict(q=q, k=k, v=v, bias=randn(rng, 10, 12)), False),
        ("shared qk", "reformer", dict(q=q, k=randn(rng, 2, 4, 10, 8), v=randn(rng, 2, 4, 10, 8)), False),
    ]


@pytest.mark.parametrize("name,spec,tensors,causal", bad_inputs(), ids=[c[0] for c in bad_inputs()])
def test_bad_inputs_value_error_with_the_cli_message(name, spec, tensors, causal, cli, tmp_path):
    att = clattn.Attention(spec)
    with pytest.raises(ValueError) as e:
        att.forward(tensors["q"], tensors["k"], tensors["v"], query_lengths=tensors.get("query_lengths"),
                    key_lengths=tensors.get("key_lengths"), bias=tensors.get("bias"), causal=causal)
    if name == "shared qk":  # `clattn attend` checks this itself first, in its own words
        assert "shared-QK" in str(e.value)
        return
    inp = tmp_path / "in.safetensors"
    clattn.write_safetensors(inp, tensors)
    r = cli("attend", "--spec", spec, "--input", inp, "--output", tmp_path / "o.safetensors",
            *(["--causal"] if causal else []))
    assert str(e.value) == cli_message(r)


def test_python_side_checks():
    rng = np.random.default_rng(1)
    q = randn(rng, 1, 2, 8, 4)
    att = clattn.Attention("full")
    with pytest.raises(ValueError, match=r"q must have rank 4 \(B, H, N, Dk\), got shape \(2, 8, 4\)"):
        att.forward(q[0], q, q)
    with pytest.raises(ValueError, match="v is missing"):
        att.forward(q, q, None)
    with pytest.raises(TypeError, match="q must be a floating-point array.*int64"):
        att.forward(q.astype(np.int64), q, q)
    with pytest.raises(TypeError, match="complex"):
        att.forward(q, q.astype(np.complex64), q)
    with pytest.raises(TypeError, match="query_lengths must hold integers"):
        att.forward(q, q, q, query_lengths=np.array([1.5]))
    with pytest.raises(ValueError, match="query_lengths must be 1-D"):
        att.forward(q, q, q, query_lengths=np.array([[1]]))
    with pytest.raises(ValueError, match="does not fit in int32"):
        att.forward(q, q, q, key_lengths=[2**40])
    with pytest.raises(TypeError):
        att.forward("q", q, q)
    with pytest.raises(ValueError, match="out must have shape"):
        att.forward(q, q, q, out=np.zeros((1, 2, 8, 5), np.float32))
    with pytest.raises(ValueError, match="read-only"):
        ro = np.zeros((1, 2, 8, 4), np.float32)
        ro.flags.writeable = False
        att.forward(q, q, q, out=ro)


def test_causal_refused_by_a_variant_that_cannot_honour_it():
    rng = np.random.default_rng(2)
    q = randn(rng, 1, 2, 16, 4)
    refusing = [v["example"] for v in clattn.variants() if not v["capabilities"]["causal"]]
    for spec in refusing:
        with pytest.raises(ValueError, match="causal"):
            clattn.Attention(spec).forward(q, q, q, causal=True)


def test_backward_errors():
    rng = np.random.default_rng(3)
    q = randn(rng, 1, 2, 8, 4)
    att = clattn.Attention("full")
    with pytest.raises(RuntimeError, match="backward needs a successful forward"):
        att.backward(q)
    o = att.forward(q, q, q)
    with pytest.raises(ValueError, match="do must have the output's shape"):
        att.backward(o[:, :1])
    bad = o.copy()
    bad[0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN|Inf|finite"):
        att.backward(bad)
    # A failed forward leaves nothing to differentiate.
    with pytest.raises(ValueError):
        att.forward(q, q[:, :1, :3], q)
    with pytest.raises(RuntimeError, match="backward needs a successful forward"):
        att.backward(o)
    inf = clattn.Attention("full", backward=False)
    inf.forward(q, q, q)
    with pytest.raises(RuntimeError, match="inference"):
        inf.backward(o)
    nt = clattn.Attention("linear")
    if not nt.capabilities["trainable"]:
        nt.forward(q, q, q)
        with pytest.raises(RuntimeError):
            nt.backward(o)


def test_freed_arrays_are_kept_alive():
    """backward after the caller dropped every array of the forward reads the arrays the call kept."""
    rng = np.random.default_rng(4)
    q, k, v = randn(rng, 1, 2, 30, 8), randn(rng, 1, 2, 30, 8), randn(rng, 1, 2, 30, 8)
    ref = clattn.Attention("full")
    ref.forward(q, k, v)
    want = ref.backward(np.ones((1, 2, 30, 8), np.float32))
    att = clattn.Attention("full")
    att.forward(q.copy(), k.copy(), v.copy())  # the only references are the call's
    gc.collect()
    junk = [np.full((1, 2, 30, 8), 7, np.float32) for _ in range(50)]  # reuse freed memory, if any
    got = att.backward(np.ones((1, 2, 30, 8), np.float32))
    del junk
    assert all(np.array_equal(a, b) for a, b in zip(want, got))


@pytest.mark.parametrize("spec", [v["example"] for v in clattn.variants()])
@pytest.mark.parametrize("shape", [(0, 2, 8, 4), (1, 0, 8, 4), (1, 2, 0, 4), (1, 2, 8, 0)])
def test_zero_sizes_no_crash(spec, shape):
    q = np.zeros(shape, np.float32)
    att = clattn.Attention(spec)
    try:
        o = att.forward(q, q, q)
    except ValueError:
        return
    assert o.shape == shape


def test_model_errors(tmp_path):
    with pytest.raises(RuntimeError):
        clattn.load_model(str(tmp_path / "missing"))
    from conftest import data_dir
    m = clattn.load_model(str(data_dir() / "stories260k"))
    with pytest.raises(ValueError, match="unknown attention"):
        m.set_attention("bogus")
    non_causal = [v["example"] for v in clattn.variants() if not v["capabilities"]["causal"]]
    if non_causal:
        with pytest.raises(ValueError):
            m.set_attention(non_causal[0])
    assert m.attention_specs[0].startswith("full")  # a refused plan leaves the old one
    with pytest.raises(ValueError, match="outside the vocabulary"):
        m.forward(np.array([1, 2, 512]))
    with pytest.raises(TypeError):
        m.forward(np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="lengths"):
        m.forward(np.array([[1, 2], [3, 4]]), lengths=[1, 3])
