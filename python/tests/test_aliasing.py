"""Outputs given in place never alias what a call reads (refused with ValueError, for every
variant), and one Attention shared by threads gives each thread the gradient of its own forward."""
import threading

import numpy as np
import pytest

import clattn
from conftest import randn
from test_numpy import SPECS


def inputs(rng, n=24, d=8):
    q, k, v = (randn(rng, 1, 2, n, d) for _ in range(3))
    return q, k, v


def call_args(spec, q, k, v):
    """(q, k, v) as the variant takes them: a shared-QK variant reads q as its keys."""
    caps = clattn.Attention(spec).capabilities
    return (q, None if caps["shared_qk"] else k, v)


@pytest.mark.parametrize("spec", SPECS)
def test_out_aliasing_an_input_refused(spec):
    rng = np.random.default_rng(1)
    q, k, v = inputs(rng)
    att = clattn.Attention(spec)
    args = call_args(spec, q, k, v)
    for name, target in (("q", q), ("v", v)) + ((("k", k),) if args[1] is not None else ()):
        with pytest.raises(ValueError, match=f"out overlaps the memory of {name}"):
            att.forward(*args, out=target)
    # A view of v is still v's memory; a slice of one buffer beside v's slice is not.
    with pytest.raises(ValueError, match="overlaps the memory of v"):
        att.forward(*args, out=v[:, :, :, :])
    buf = np.zeros((1, 2, 2 * v.shape[2], v.shape[3]), np.float32)
    buf[:, :, : v.shape[2]] = v
    att.forward(args[0], args[1], buf[:, :, : v.shape[2]], out=buf[:, :, v.shape[2]:])
    # Inputs untouched, and a separate out still works.
    q0, v0 = q.copy(), v.copy()
    o = att.forward(*args)
    assert np.array_equal(q, q0) and np.array_equal(v, v0)
    mine = np.empty_like(o)
    att.forward(*args, out=mine)
    assert np.array_equal(mine, o)


@pytest.mark.parametrize("spec", SPECS)
def test_zero_stride_out_refused(spec):
    rng = np.random.default_rng(2)
    q, k, v = inputs(rng)
    att = clattn.Attention(spec)
    args = call_args(spec, q, k, v)
    base = np.zeros((1, 2, 1, v.shape[3]), np.float32)
    zero = np.lib.stride_tricks.as_strided(base, shape=(1, 2, q.shape[2], v.shape[3]),
                                           strides=(0,) + base.strides[1:2] + (0, 4), writeable=True)
    with pytest.raises(ValueError, match="out overlaps itself"):
        att.forward(*args, out=zero)


@pytest.mark.parametrize("spec", [s for s in SPECS if clattn.Attention(s).capabilities["trainable"]])
def test_gradient_aliasing_refused(spec):
    rng = np.random.default_rng(3)
    q, k, v = inputs(rng)
    att = clattn.Attention(spec)
    args = call_args(spec, q, k, v)
    o = att.forward(*args)
    do = randn(rng, *o.shape)
    ref = [g.copy() for g in att.backward(do)]
    zeros = lambda a: np.zeros_like(a)  # noqa: E731
    with pytest.raises(ValueError, match="dq overlaps the memory of do"):
        att.backward(do, dq=do)
    with pytest.raises(ValueError, match="dv overlaps the memory of v"):
        att.backward(do, dv=v)
    with pytest.raises(ValueError, match="overlaps the memory of q"):
        att.backward(do, dq=q)
    with pytest.raises(ValueError, match="overlaps the memory of out"):
        att.backward(do, dv=o)
    shared = zeros(q)
    with pytest.raises(ValueError, match="dk overlaps the memory of dq"):
        att.backward(do, dq=shared, dk=shared)
    base = np.zeros((1, 2, 1, q.shape[3]), np.float32)
    zero = np.lib.stride_tricks.as_strided(base, shape=q.shape, strides=(0, base.strides[1], 0, 4), writeable=True)
    with pytest.raises(ValueError, match="dq overlaps itself"):
        att.backward(do, dq=zero)
    # The refused calls changed nothing: separate arrays give the gradients as before.
    dq, dk, dv = zeros(q), zeros(k), zeros(v)
    got = att.backward(do, dq=dq, dk=dk, dv=dv)
    assert all(np.array_equal(a, b) for a, b in zip(got, ref))


@pytest.mark.parametrize("spec", ["full", "improved-clustered:clusters=6,topk=12", "linear"])
def test_threads_sharing_an_attention_get_their_own_gradients(spec):
    """Eight threads, one Attention: all forward, then all backward (a barrier between makes every
    forward happen before any backward). Each gets exactly its single-threaded gradients."""
    rng = np.random.default_rng(4)
    n_threads = 8
    cases = [(randn(rng, 1, 2, 40, 8), randn(rng, 1, 2, 40, 8), randn(rng, 1, 2, 40, 8), randn(rng, 1, 2, 40, 8))
             for _ in range(n_threads)]
    expected = []
    for q, k, v, do in cases:
        solo = clattn.Attention(spec)
        solo.forward(q, k, v)
        expected.append([g.copy() for g in solo.backward(do)])
    shared = clattn.Attention(spec)
    barrier = threading.Barrier(n_threads)
    got = [None] * n_threads

    def work(i):
        q, k, v, do = cases[i]
        shared.forward(q, k, v)
        barrier.wait()
        got[i] = shared.backward(do)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    matches = sum(all(np.array_equal(a, b) for a, b in zip(got[i], expected[i])) for i in range(n_threads))
    assert matches == n_threads


def test_backward_in_a_thread_without_a_forward_is_refused():
    rng = np.random.default_rng(5)
    q = randn(rng, 1, 2, 16, 8)
    att = clattn.Attention("full")
    att.forward(q, q, q)
    errors = []

    def other():
        try:
            att.backward(np.ones_like(q))
        except RuntimeError as e:
            errors.append(str(e))

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert errors and "needs a successful forward" in errors[0]
    att.backward(np.ones_like(q))  # this thread's own forward is still there
