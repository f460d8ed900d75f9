"""clattn.torch.scaled_dot_product_attention and clattn.torch.MultiheadAttention against PyTorch's
own math: values and gradients of softmax attention written as PyTorch ops (torch 1.13 has no
F.scaled_dot_product_attention), and torch.nn.MultiheadAttention itself, whose state_dict loads.
What clattn cannot do as PyTorch does is refused by name."""
import copy
import math

import pytest

torch = pytest.importorskip("torch")
import clattn.torch as ct  # noqa: E402
from conftest import rand  # noqa: E402


def sdpa_reference(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """PyTorch 2.x's documented reference implementation of scaled_dot_product_attention."""
    L, S = q.size(-2), k.size(-2)
    scale = 1 / math.sqrt(q.size(-1)) if scale is None else scale
    bias = torch.zeros(L, S, dtype=q.dtype)
    if is_causal:
        bias = bias.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            bias = bias.masked_fill(~attn_mask, float("-inf"))
        else:
            bias = attn_mask + bias
    w = torch.softmax(q @ k.transpose(-2, -1) * scale + bias, dim=-1)
    return w @ v


def leaves(*ts):
    return [t.clone().requires_grad_(True) for t in ts]


def check(got_fn, want_fn, ts, atol=2e-5):
    """Values and gradients (of a random projection of the output) agree."""
    a, b = leaves(*ts), leaves(*ts)
    got, want = got_fn(*a), want_fn(*b)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=atol), (got - want).abs().max()
    w = rand(*got.shape, seed=99)
    (got * w).sum().backward()
    (want * w).sum().backward()
    for x, y in zip(a, b):
        assert torch.allclose(x.grad, y.grad, atol=atol), (x.grad - y.grad).abs().max()


B, H, L, S, E = 2, 3, 17, 17, 8


@pytest.mark.parametrize("dims", [3, 4])
def test_sdpa_plain_causal_scale(dims):
    shape = (B, L, E) if dims == 3 else (B, H, L, E)
    q, k, v = rand(*shape, seed=1), rand(*shape, seed=2), rand(*shape, seed=3)
    check(lambda q, k, v: ct.scaled_dot_product_attention(q, k, v), sdpa_reference, (q, k, v))
    check(lambda q, k, v: ct.scaled_dot_product_attention(q, k, v, is_causal=True),
          lambda q, k, v: sdpa_reference(q, k, v, is_causal=True), (q, k, v))
    check(lambda q, k, v: ct.scaled_dot_product_attention(q, k, v, scale=0.3),
          lambda q, k, v: sdpa_reference(q, k, v, scale=0.3), (q, k, v))


def test_sdpa_masks():
    q, k, v = rand(B, H, L, E, seed=4), rand(B, H, S + 5, E, seed=5), rand(B, H, S + 5, E, seed=6)
    M = S + 5
    lengths = torch.tensor([M, 9])
    padding = (torch.arange(M).view(1, M) < lengths.view(B, 1)).view(B, 1, 1, M)  # True takes part
    additive = rand(L, M, seed=7)
    holes = torch.rand(B, 1, L, M, generator=torch.Generator().manual_seed(8)) > 0.3
    holes[..., 0] = True                                   # every query sees a key (PyTorch: NaN otherwise)
    cases = [padding, padding.float().log(), additive, holes, additive.masked_fill(~holes[0, 0], float("-inf"))]
    for m in cases:
        check(lambda q, k, v, m=m: ct.scaled_dot_product_attention(q, k, v, attn_mask=m),
              lambda q, k, v, m=m: sdpa_reference(q, k, v, attn_mask=m), (q, k, v))
    # L != S with is_causal: aligned top-left, as PyTorch
    check(lambda q, k, v: ct.scaled_dot_product_attention(q, k, v, is_causal=True),
          lambda q, k, v: sdpa_reference(q, k, v, is_causal=True), (q, k, v))


def test_sdpa_masks_as_lengths_and_causal_for_any_variant():
    """Key padding at the end and the causal mask reach non-full variants as lengths and the causal
    flag: with clusters covering every query, clustered attention is exact."""
    q, k, v = rand(B, H, L, E, seed=9), rand(B, H, L, E, seed=10), rand(B, H, L, E, seed=11)
    pad = torch.arange(L).view(1, L) < torch.tensor([L, 11]).view(B, 1)
    causal_pad = pad.view(B, 1, 1, L) & torch.ones(L, L, dtype=torch.bool).tril()
    spec = "improved-clustered:clusters=64,topk=64"
    for m in (pad.view(B, 1, 1, L), causal_pad):
        check(lambda q, k, v, m=m: ct.scaled_dot_product_attention(q, k, v, attn_mask=m, spec=spec),
              lambda q, k, v, m=m: sdpa_reference(q, k, v, attn_mask=m), (q, k, v), atol=5e-5)


def test_sdpa_refusals():
    q = rand(1, 1, 8, 4, seed=12)
    with pytest.raises(ValueError, match="dropout_p=0.1 is not supported"):
        ct.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
    holes = torch.ones(8, 8, dtype=torch.bool)
    holes[3, 5] = False
    with pytest.raises(ValueError, match="'clustered:clusters=2.*cannot take this attn_mask.*only 'full'"):
        ct.scaled_dot_product_attention(q, q, q, attn_mask=holes, spec="clustered:clusters=2")
    with pytest.raises(ValueError, match="not both"):
        ct.scaled_dot_product_attention(q, q, q, attn_mask=holes, is_causal=True)
    with pytest.raises(ValueError, match="takes no scale"):
        ct.scaled_dot_product_attention(q, q, q, scale=0.5, spec="reformer")
    with pytest.raises(ValueError, match="4-D"):
        ct.scaled_dot_product_attention(q[0, 0], q[0, 0], q[0, 0])
    with pytest.raises(ValueError, match="did you mean 'clustered'"):
        ct.scaled_dot_product_attention(q, q, q, spec="clusterd:clusters=2")


def torch_mha(embed, heads, **kw):
    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(embed, heads, **kw)
    with torch.no_grad():                                  # non-zero biases, so they are checked too
        for name, p in m.named_parameters():
            if "bias" in name:
                p.copy_(torch.randn(p.shape) * 0.1)
    return m


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("kv", [None, (6, 10)])
def test_mha_matches_torch(batch_first, kv):
    Emb, Hd = 12, 3
    kdim, vdim = kv if kv else (None, None)
    ref = torch_mha(Emb, Hd, batch_first=batch_first, kdim=kdim, vdim=vdim).eval()
    ours = ct.MultiheadAttention(Emb, Hd, batch_first=batch_first, kdim=kdim, vdim=vdim).eval()
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    ours.load_state_dict(ref.state_dict())                 # strict: the same keys and shapes
    Lq, Sk, N = 7, 9, 2
    shape = (lambda n, l, e: (n, l, e)) if batch_first else (lambda n, l, e: (l, n, e))
    x = rand(*shape(N, Lq, Emb), seed=20)
    kk = rand(*shape(N, Sk, kdim or Emb), seed=21)
    vv = rand(*shape(N, Sk, vdim or Emb), seed=22)
    kpm = torch.arange(Sk).view(1, Sk) >= torch.tensor([Sk, 5]).view(N, 1)   # True: padding
    am = torch.zeros(Lq, Sk).masked_fill(torch.rand(Lq, Sk, generator=torch.Generator().manual_seed(3)) > 0.8,
                                         float("-inf"))
    am[:, 0] = 0
    for kw in [{}, {"key_padding_mask": kpm}, {"attn_mask": am}, {"attn_mask": am < 0}]:
        out, w = ours(x, kk, vv, need_weights=False, **kw)
        want, _ = ref(x, kk, vv, need_weights=False, **kw)
        assert w is None
        assert torch.allclose(out, want, atol=2e-5), (kw.keys(), (out - want).abs().max())
    # Gradients of every parameter and input
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    out, _ = ours(xs[0], kk, vv, key_padding_mask=kpm, need_weights=False)
    want, _ = ref(xs[1], kk, vv, key_padding_mask=kpm, need_weights=False)
    w = rand(*out.shape, seed=23)
    (out * w).sum().backward()
    (want * w).sum().backward()
    assert torch.allclose(xs[0].grad, xs[1].grad, atol=2e-5)
    for (n, p), (_, r) in zip(ours.named_parameters(), ref.named_parameters()):
        assert torch.allclose(p.grad, r.grad, atol=5e-5), (n, (p.grad - r.grad).abs().max())


def test_mha_self_attention_causal_and_unbatched():
    ref = torch_mha(8, 2).eval()
    ours = ct.MultiheadAttention(8, 2).eval()
    ours.load_state_dict(ref.state_dict())
    x = rand(11, 3, 8, seed=30)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(11)
    want, _ = ref(x, x, x, attn_mask=causal, need_weights=False)
    for kw in [{"attn_mask": causal}, {"attn_mask": causal, "is_causal": True}, {"is_causal": True}]:
        if "attn_mask" not in kw and "is_causal" in kw:
            got, _ = ours(x, x, x, is_causal=True)
        else:
            got, _ = ours(x, x, x, **kw)
        assert torch.allclose(got, want, atol=2e-5)
    got1, _ = ours(x[:, 0], x[:, 0], x[:, 0], attn_mask=causal)      # unbatched (L, E)
    assert torch.allclose(got1, want[:, 0], atol=2e-5)


def test_mha_in_a_torch_transformer_layer_with_a_clustered_spec():
    """Where torch.nn.MultiheadAttention stands: the layer calls it with need_weights=False."""
    torch.manual_seed(1)
    layer = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
    layer.self_attn = ct.MultiheadAttention(16, 2, batch_first=True, spec="improved-clustered:clusters=4,topk=4")
    x = rand(2, 40, 16, seed=31).requires_grad_(True)
    pad = torch.arange(40).view(1, 40) >= torch.tensor([40, 25]).view(2, 1)
    y = layer(x, src_key_padding_mask=pad)
    y[~pad].sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


def test_mha_step_advances_in_training_and_can_be_fixed():
    x = rand(30, 1, 8, seed=40)
    m = ct.MultiheadAttention(8, 2, spec="clustered:clusters=3,seed=5")
    m.train()
    a, _ = m(x, x, x)
    b, _ = m(x, x, x)
    assert m.step == 2
    assert not torch.equal(a, b)                          # fresh hashing planes each training step
    m.eval()
    c, _ = m(x, x, x)
    d, _ = m(x, x, x)
    assert m.step == 2 and torch.equal(c, d)               # evaluation keeps the step
    fixed = ct.MultiheadAttention(8, 2, spec="clustered:clusters=3,seed=5", step=7)
    fixed.load_state_dict(m.state_dict())
    fixed.train()
    e, _ = fixed(x, x, x)
    f, _ = fixed(x, x, x)
    assert fixed.step == 7 and torch.equal(e, f)
    ct.set_step(torch.nn.Sequential(m, fixed), 7)
    m.eval()
    g, _ = m(x, x, x)
    assert m.step == 7 and torch.equal(g, e)               # same weights, same step, same draws


def test_mha_refusals():
    with pytest.raises(ValueError, match="dropout=0.1 is not supported"):
        ct.MultiheadAttention(8, 2, dropout=0.1)
    with pytest.raises(ValueError, match="add_bias_kv"):
        ct.MultiheadAttention(8, 2, add_bias_kv=True)
    m = ct.MultiheadAttention(8, 2)
    x = rand(4, 1, 8, seed=41)
    with pytest.raises(ValueError, match="need_weights=True"):
        m(x, x, x, need_weights=True)


def test_modules_deep_copy_pickle_and_clone_into_a_transformer_encoder():
    """copy.deepcopy (an EMA of the model), torch.save/torch.load of a whole model and
    nn.TransformerEncoder (which deep-copies its layer) rebuild the native attention from its
    spec and layer state; the copies compute what the original computes."""
    import io

    q, k, v = (rand(2, 2, 20, 8, seed=s) for s in (1, 2, 3))
    att = ct.Attention("improved-clustered:clusters=4,topk=3")
    for clone in (copy.deepcopy(att), _saved_and_loaded(att)):
        assert clone.attention is not att.attention and clone.spec == att.spec
        assert torch.equal(clone(q, k, v), att(q, k, v))
    # A stateful variant carries its layer state (routing's EMA centroids) into the copy.
    ema = ct.Attention("routing:clusters=2,centroids=ema")
    ema.train()
    ema(q, k, v)
    ema.eval()
    clone = copy.deepcopy(ema)
    assert set(clone.attention.state) == {"centroids"}
    assert torch.equal(torch.from_numpy(clone.attention.state["centroids"]),
                       torch.from_numpy(ema.attention.state["centroids"]))
    assert torch.equal(clone(q, k, v), ema(q, k, v))

    layer = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
    layer.self_attn = ct.MultiheadAttention(16, 2, batch_first=True, spec="clustered:clusters=3")
    enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = rand(2, 10, 16, seed=4)
    assert enc(x).shape == (2, 10, 16)
    buf = io.BytesIO()
    torch.save(enc, buf)
    buf.seek(0)
    assert torch.equal(torch.load(buf)(x), enc(x))


def _saved_and_loaded(module):
    import io

    buf = io.BytesIO()
    torch.save(module, buf)
    buf.seek(0)
    return torch.load(buf)


def test_grad_requiring_float_mask_is_refused_by_its_own_name():
    q = rand(1, 2, 6, 4, seed=50)
    mask = rand(6, 6, seed=51).requires_grad_()
    with pytest.raises(ValueError, match=r"attn_mask gets no gradient.*attn_mask\.detach\(\)"):
        ct.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    ct.scaled_dot_product_attention(q, q, q, attn_mask=mask.detach())


def _example_specs():
    import clattn

    return [v["example"] for v in clattn.variants()] + ["local:window=1"]


# Each spec's layer runs without a gradient as it runs with one, in every way torch's encoder
# modules are called for inference: torch's fused kernel, when it takes over, computes exact
# attention and never calls the module, which showed as local:window=1 equal to full attention.
@pytest.mark.parametrize("spec", _example_specs())
def test_mha_in_torch_encoder_modules_runs_clattn_without_a_gradient(spec):
    if ct.Attention(spec).capabilities["shared_qk"]:
        pytest.skip(f"'{spec}' shares queries and keys (k is q), which MultiheadAttention's separate "
                    f"query and key projections never give")
    E, Hd, N = 16, 2, 40
    torch.manual_seed(2)
    layer = torch.nn.TransformerEncoderLayer(E, Hd, dim_feedforward=32, dropout=0.0, batch_first=True).eval()
    torch_layer = copy.deepcopy(layer)                     # torch's own attention, the same weights
    layer.self_attn = ct.MultiheadAttention(E, Hd, batch_first=True, spec=spec, step=3)
    layer.self_attn.load_state_dict(torch_layer.self_attn.state_dict())
    layer.eval()
    x = rand(2, N, E, seed=50)
    pad = torch.arange(N).view(1, N) >= torch.tensor([N, 29]).view(2, 1)  # True: padding

    def without_gradient(module, *args, **kw):
        outs = []
        for mode in (torch.no_grad, torch.inference_mode):
            with mode():
                outs.append(module(*args, **kw).clone())
        return outs

    with torch.enable_grad():                              # the parameters want a gradient: no fast path
        want = layer(x)
    for got in without_gradient(layer, x):
        assert torch.allclose(got, want, atol=1e-5), (spec, (got - want).abs().max())
    for nested in (False, True):
        enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=nested).eval()
        with torch.enable_grad():
            want = enc(x, src_key_padding_mask=pad)
        for got in without_gradient(enc, x, src_key_padding_mask=pad):
            assert torch.allclose(got, want, atol=1e-5), (spec, nested, (got - want).abs().max())
    with torch.no_grad():
        exact = torch_layer(x)
        if spec == "full":                                 # the reference is the same layer
            assert torch.allclose(layer(x), exact, atol=1e-5)
        if spec == "local:window=1":                       # and what ran is not torch's exact attention
            assert (layer(x) - exact).abs().max() > 0.1


def test_mha_cannot_be_told_that_torch_may_fuse_it():
    """The attribute torch's encoder modules test before their fused path stays False."""
    m = ct.MultiheadAttention(8, 2)
    assert m._qkv_same_embed_dim is False
    with pytest.raises(AttributeError):
        m._qkv_same_embed_dim = True
    assert m._qkv_same_embed_dim is False
