"""Generation's sampler set (penalties, temperature, top-k, top-p, min-p, the seeded draw), stop
strings and the context shift: each held to an independent NumPy version, on random logits and on
stories260k's real ones."""
import json

import numpy as np
import pytest

import clattn
from clattn import _clattn
from conftest import data_dir

OPTION_SETS = [
    dict(temperature=0.0),
    dict(temperature=0.0, repeat_penalty=1.5),
    dict(temperature=0.8),
    dict(temperature=1.0, top_k=5),
    dict(temperature=0.7, top_p=0.6),
    dict(temperature=1.3, min_p=0.2),
    dict(temperature=1.0, repeat_penalty=1.3, repeat_last_n=8),
    dict(temperature=0.9, frequency_penalty=0.7, presence_penalty=0.4),
    dict(temperature=1.0, repeat_penalty=0.8, repeat_last_n=-1),
    dict(temperature=1.1, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.1, frequency_penalty=0.2,
         presence_penalty=0.1, repeat_last_n=16),
]


def numpy_sample(logits, history, step, seed=0, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0,
                 repeat_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0, repeat_last_n=64):
    """The documented sampler (clattn/model.h, SamplingOptions), written from its description."""
    f32 = np.float32
    l = np.asarray(logits, np.float32).copy()
    penalised = repeat_penalty != 1 or frequency_penalty != 0 or presence_penalty != 0
    if repeat_last_n != 0 and penalised and len(history):
        recent = np.asarray(history if repeat_last_n < 0 else history[-repeat_last_n:])
        ids, counts = np.unique(recent, return_counts=True)
        x = l[ids]
        x = np.where(x > 0, x / f32(repeat_penalty), x * f32(repeat_penalty)).astype(f32)
        l[ids] = x - (counts.astype(f32) * f32(frequency_penalty) + f32(presence_penalty))
    if temperature == 0:
        return int(np.argmax(l))
    order = np.lexsort((np.arange(len(l)), -l.astype(np.float64)))  # by decreasing logit, then id
    if top_k > 0:
        order = order[:top_k]
    p = np.exp((l[order].astype(np.float64) - float(l[order[0]])) / float(f32(temperature)))
    mass = np.cumsum(p / p.sum())
    reach = np.nonzero(mass >= float(f32(top_p)))[0]
    keep = int(reach[0]) + 1 if len(reach) else len(p)
    keep = max(1, int(np.sum(p[:keep] >= float(f32(min_p)) * p[0])))
    r = float(_clattn._sample_uniform(seed, step)) * p[:keep].sum()
    acc = np.cumsum(p[:keep])
    hit = np.nonzero(r < acc)[0]
    return int(order[hit[0] if len(hit) else keep - 1])


@pytest.mark.parametrize("opts", OPTION_SETS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_sampler_equals_an_independent_numpy_sampler(opts):
    rng = np.random.default_rng(11)
    V = 300
    for step in range(60):
        logits = (rng.standard_normal(V) * 2.5).astype(np.float32)
        history = list(rng.integers(0, V, size=int(rng.integers(0, 40))))
        history += list(np.argsort(-logits)[:3])  # the likely tokens seen recently: the penalties matter
        want = numpy_sample(logits, history, step, seed=5, **opts)
        assert _clattn._sample_token(logits, step, history, seed=5, **opts) == want, (step, opts)


def test_sampler_refuses_options_out_of_range_by_name():
    logits = np.zeros(8, np.float32)
    for bad, word in ((dict(min_p=2.0), "min_p must be in"), (dict(repeat_penalty=0.0), "repeat_penalty must be > 0"),
                      (dict(repeat_last_n=-2), "repeat_last_n must be >= -1"), (dict(top_p=0.0), "top_p"),
                      (dict(frequency_penalty=float("nan")), "frequency_penalty must be finite")):
        with pytest.raises(ValueError, match=word):
            _clattn._sample_token(logits, 0, [], temperature=1.0, **bad)
    with pytest.raises(ValueError, match="outside the vocabulary of 8"):
        _clattn._sample_token(logits, 0, [9], temperature=1.0, repeat_penalty=1.2)


@pytest.mark.parametrize("opts", OPTION_SETS[1:], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_generation_with_each_sampler_equals_numpy_on_stories260k(opts):
    """generate() against the same decode loop in Python, each token picked by the NumPy sampler
    from the model's own logits, the prompt and the tokens so far as the penalties' history."""
    m = clattn.load_model(data_dir() / "stories260k")
    prompt = m.tokenizer.encode("Once upon a time")
    n = 48
    got = list(m.generate(prompt, n, seed=7, stop_at_eos=False, **opts))
    m.start(len(prompt) + n)
    logits = m.prefill(prompt)
    seq, want = list(prompt), []
    for step in range(n):
        t = numpy_sample(logits, seq, step, seed=7, **opts)
        want.append(t)
        seq.append(t)
        if step + 1 < n:
            logits = m.step(t)
    assert got == want


def test_stop_strings_end_the_text_before_them():
    m = clattn.load_model(data_dir() / "stories260k")
    full = m.generate("Once upon", 60)
    assert "Lily" in full
    cut = m.generate("Once upon", 60, stop=["Lily", "never there"])
    assert cut == full[:full.index("Lily")] and cut.endswith("named ")
    ids = m.generate(m.tokenizer.encode("Once upon"), 60, stop=["Lily"])  # ids end with the token that completed it
    assert m.tokenizer.decode(list(ids)).rstrip().endswith("Lily") and len(ids) < 60
    assert m.generate("Once upon", 20, stop=["zzzz"]) == m.generate("Once upon", 20)
    with pytest.raises(ValueError, match="stop string must not be empty"):
        m.generate("Once upon", 5, stop=[""])


def test_context_shift_generates_past_the_context_and_reencodes_the_window():
    """stories260k has 512 positions. Past them, the reencode shift encodes the window (the BOS,
    then the newest half) again: the token after a shift is the model's greedy choice on that
    window alone."""
    m = clattn.load_model(data_dir() / "stories260k")
    ctx = m.config["max_positions"]
    prompt = m.tokenizer.encode("Once upon a time")
    assert prompt[0] == m.tokenizer.bos_id
    n = 700
    with pytest.raises(ValueError, match="context_shift=True"):
        m.generate(prompt, n)
    out = list(m.generate(prompt, n, context_shift="reencode", stop_at_eos=False))
    assert len(out) == n
    P = len(prompt)
    first = ctx - P  # out[first] is the token drawn when the cache is full
    # The tokens up to a full cache are those of a run that never shifts (first + 1 tokens end there).
    assert out[:first] == list(m.generate(prompt, first, stop_at_eos=False))
    assert out[:first + 1] == list(m.generate(prompt, first + 1, context_shift="reencode", stop_at_eos=False))
    seq = list(prompt) + out[:first + 1]
    discard = (ctx - 1) // 2
    window = seq[:1] + seq[1 + discard:]
    logits = m.forward(np.array([window], np.int32))  # (1, T, vocab), no cache
    assert out[first + 1] == int(np.argmax(logits[0, -1]))
    # keep is bounded by the context
    with pytest.raises(RuntimeError, match="leaves room for at most 510"):
        m.generate(prompt, n, context_shift=True, keep=600)


# ---- llama.cpp's context shift in float64 NumPy, from modeling_llama.py and llama.cpp's rule

def _rope(x, pos, theta):
    """Rotate-half RoPE of x (T, heads, hd) at positions pos (T,), in float64."""
    h = x.shape[-1] // 2
    ang = np.asarray(pos, np.float64)[:, None] * theta ** (-np.arange(h) * 2.0 / x.shape[-1])
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    return np.concatenate([x[..., :h] * c - x[..., h:] * s, x[..., h:] * c + x[..., :h] * s], axis=-1)


class _NumpyLlama:
    """A LLaMA decoder with a KV cache of pre-RoPE keys: a context shift drops cache entries and
    applies RoPE at the new positions directly (no composed rotations), as llama.cpp's shift
    means: every layer keeps the states it computed with the dropped tokens in view."""

    def __init__(self, folder):
        cfg = json.loads((folder / "config.json").read_text())
        t = clattn.read_safetensors(str(folder / "model.safetensors"))
        self.w = {k: np.asarray(v, np.float64) for k, v in t.items()}
        self.L, self.H, self.Hkv = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.hd, self.eps, self.theta = cfg["head_dim"], cfg["rms_norm_eps"], cfg["rope_theta"]
        self.kpre = [np.zeros((0, self.Hkv, self.hd)) for _ in range(self.L)]
        self.v = [np.zeros((0, self.Hkv, self.hd)) for _ in range(self.L)]

    def _norm(self, x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * g

    def feed(self, ids):
        """Appends ids after the cache (positions 0.. in cache order): the last position's logits."""
        w, hd, rep = self.w, self.hd, self.H // self.Hkv
        x = w["model.embed_tokens.weight"][np.asarray(ids)]
        T, start = len(ids), len(self.v[0])
        pos = np.arange(start, start + T)
        for l in range(self.L):
            a = f"model.layers.{l}."
            xn = self._norm(x, w[a + "input_layernorm.weight"])
            q = (xn @ w[a + "self_attn.q_proj.weight"].T).reshape(T, self.H, hd)
            self.kpre[l] = np.concatenate([self.kpre[l], (xn @ w[a + "self_attn.k_proj.weight"].T).reshape(T, self.Hkv, hd)])
            self.v[l] = np.concatenate([self.v[l], (xn @ w[a + "self_attn.v_proj.weight"].T).reshape(T, self.Hkv, hd)])
            M = len(self.v[l])
            k = np.repeat(_rope(self.kpre[l], np.arange(M), self.theta), rep, axis=1)  # (M, H, hd)
            v = np.repeat(self.v[l], rep, axis=1)
            s = np.einsum("thd,mhd->htm", _rope(q, pos, self.theta), k) / np.sqrt(hd)
            s = np.where(np.arange(M)[None, None, :] <= pos[None, :, None], s, -np.inf)
            p = np.exp(s - s.max(-1, keepdims=True))
            o = np.einsum("htm,mhd->thd", p / p.sum(-1, keepdims=True), v).reshape(T, self.H * hd)
            x = x + o @ w[a + "self_attn.o_proj.weight"].T
            xn = self._norm(x, w[a + "post_attention_layernorm.weight"])
            g, u = xn @ w[a + "mlp.gate_proj.weight"].T, xn @ w[a + "mlp.up_proj.weight"].T
            x = x + (g / (1 + np.exp(-g)) * u) @ w[a + "mlp.down_proj.weight"].T
        return self._norm(x[-1], w["model.norm.weight"]) @ w["lm_head.weight"].T

    def shift(self, keep, discard):
        for l in range(self.L):
            self.kpre[l] = np.concatenate([self.kpre[l][:keep], self.kpre[l][keep + discard:]])
            self.v[l] = np.concatenate([self.v[l][:keep], self.v[l][keep + discard:]])


def test_rotate_shift_is_llama_cpps_context_shift():
    """Decoder.shift on stories260k (5 layers, grouped heads) against the float64 NumPy decoder
    above: after a full 512-position cache drops the oldest half after the BOS, each next step's
    logits agree to 1e-4; they are not the re-encoded window's (the dropped tokens stay in view of
    the deeper layers); generate's rotate shift is that loop."""
    folder = data_dir() / "stories260k"
    m = clattn.load_model(folder)
    assert m.can_shift
    ctx = m.config["max_positions"]
    ref = _NumpyLlama(folder)
    prompt = m.tokenizer.encode("Once upon a time")
    seq = list(prompt) + list(m.generate(prompt, ctx - len(prompt), stop_at_eos=False))
    assert len(seq) == ctx
    m.start(ctx)
    got = m.prefill(np.array(seq, np.int32))
    want = ref.feed(seq)
    assert np.abs(got - want).max() < 1e-4
    keep, discard = 1, (ctx - 1) // 2
    m.shift(keep, discard)
    ref.shift(keep, discard)
    assert m.position == ctx - discard
    window = seq[:keep] + seq[keep + discard:]
    nxt = int(np.argmax(got))
    for _ in range(4):
        window.append(nxt)
        got, want = m.step(nxt), ref.feed([nxt])
        assert np.abs(got - want).max() < 1e-4
        reencoded = m.forward(np.array([window], np.int32))[0, -1]
        assert np.abs(got - reencoded).max() > 1e-2
        nxt = int(np.argmax(got))
    # generate(context_shift='rotate'), and True, run this shift when the cache fills.
    out = list(m.generate(prompt, ctx + 40, context_shift="rotate", stop_at_eos=False))
    assert out == list(m.generate(prompt, ctx + 40, context_shift=True, stop_at_eos=False))
    assert out[:ctx - len(prompt)] == seq[len(prompt):]
    m.start(ctx)
    logits = m.prefill(np.array(prompt, np.int32))
    loop = []
    while len(loop) < len(out):
        loop.append(int(np.argmax(logits)))
        if len(loop) == len(out):
            break
        if m.position == ctx:
            m.shift(keep, discard)
        logits = m.step(loop[-1])
    assert loop == out
    with pytest.raises(ValueError, match="off, auto, rotate or reencode"):
        m.generate(prompt, 5, context_shift="shift")
    with pytest.raises(TypeError, match="bool or one of"):
        m.generate(prompt, 5, context_shift=2)
