"""clattn.Tokenizer and language models trained by clattn: the byte-level tokenizer.json every
lm / mlm checkpoint carries maps text to exactly its bytes, Decoder.generate continues a prompt
(also the pretrained stories260k, through its BPE tokenizer), and an mlm checkpoint's head gives
logits for masked positions."""
import json

import numpy as np
import pytest

import clattn
from conftest import data_dir


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text("".join(f"ROMEO: line {i}, the quick brown fox {i * 7 % 13}\n" for i in range(400)))
    return path


def tiny(task, text, checkpoint, **extra):
    kw = dict(layers=1, dim=32, heads=2, ff=64, seq=32, batch=4, steps=30, warmup=2, lr=1e-2, eval_every=30,
              eval_examples=4)
    kw.update(extra)
    return clattn.Trainer(task, data=str(text), checkpoint=str(checkpoint), **kw)


def test_byte_tokenizer_is_the_bytes():
    t = clattn.Tokenizer.bytes()
    assert t.is_bytes and t.vocab_size == 258 and t.bos_id == -1 and t.eos_id == -1
    s = "ROMEO: é€ \n\t"
    ids = t.encode(s)
    assert ids.dtype == np.int32
    assert list(ids) == list(s.encode("utf-8"))            # ids are the bytes, nothing added
    assert t.decode(ids) == s
    assert t.decode([256, *ids, 257]) == s                 # <pad> and <mask> are special: skipped
    assert t.token(256) == "<pad>" and t.token(257) == "<mask>" and t.token(65) == "<0x41>"
    assert b"".join(t.decode_piece(-1 if i == 0 else ids[i - 1], x) for i, x in enumerate(ids)) == s.encode()
    with pytest.raises(ValueError, match="out of range"):
        t.decode([258])


def test_stories260k_tokenizer_is_not_bytes():
    t = clattn.Tokenizer(data_dir() / "stories260k")
    assert not t.is_bytes and t.vocab_size == 512 and t.bos_id == 1
    assert t.encode("Once upon a time")[0] == 1 and t.decode(t.encode("Once upon a time")) == "Once upon a time"


def test_trained_lm_generates_from_its_folder(text, tmp_path):
    clattn.set_num_threads(1)
    t = tiny("lm", text, tmp_path / "run")
    t.run()
    best = tmp_path / "run" / "best"
    doc = json.loads((best / "tokenizer.json").read_text())
    assert doc["model"]["byte_fallback"] and len(doc["model"]["vocab"]) == 256
    m = clattn.load_model(best)
    assert isinstance(m, clattn.Decoder) and m.tokenizer is not None and m.tokenizer.is_bytes
    out = m.generate("ROMEO:", 24)
    assert isinstance(out, str) and len(out.encode()) == 24          # greedy, no EOS in a byte model
    assert out == m.generate("ROMEO:", 24)                            # reproducible
    ids = m.generate(m.tokenizer.encode("ROMEO:"), 24)                # ids in, ids out
    assert bytes(ids.astype(np.uint8)).decode() == out
    sampled = [m.generate("ROMEO:", 24, temperature=1.0, top_k=20, seed=s) for s in (1, 2)]
    assert sampled[0] == m.generate("ROMEO:", 24, temperature=1.0, top_k=20, seed=1)
    assert sampled[0] != sampled[1]
    with pytest.raises(ValueError, match="no BOS"):
        m.generate("", 4)
    with pytest.raises(ValueError, match="context"):
        m.generate("ROMEO:", 100)                                     # seq 32 is the model's context
    # save_model writes the tokenizer too
    t.save_model(str(tmp_path / "saved"))
    assert clattn.load_model(tmp_path / "saved").tokenizer.is_bytes


def test_stories260k_generate_matches_reference():
    """Greedy from BOS gives the published story's tokens (ids in, ids out) and, as text, their decoding."""
    m = clattn.load_model(data_dir() / "stories260k")
    lines = (data_dir() / "stories260k" / "reference_greedy_200.txt").read_text().splitlines()
    want = [int(x) for x in lines[lines.index("# token ids:") + 1].split()][:40]
    got = m.generate(np.array([1], np.int32), 40, stop_at_eos=False)
    assert list(got) == want
    assert m.generate("", 40, stop_at_eos=False) == m.tokenizer.decode(want)


def test_mlm_head_predicts_masked_positions(text, tmp_path):
    clattn.set_num_threads(1)
    t = tiny("mlm", text, tmp_path / "mlm", steps=60)
    t.run()
    m = clattn.load_model(tmp_path / "mlm" / "best")
    assert isinstance(m, clattn.Encoder) and m.head == "mlm" and m.tokenizer.is_bytes
    ids = m.tokenizer.encode("ROMEO: the quick brown fox 6\n")           # 29 bytes: within seq 32
    masked = ids.copy()
    masked[1:4] = 257                                                  # <mask>
    logits = m.forward_mlm(masked)
    assert logits.shape == (len(ids), m.config["vocab"]) and np.isfinite(logits).all()
    batched = m.forward_mlm(np.stack([masked, masked]), lengths=[len(ids), len(ids) - 3])
    assert batched.shape == (2, len(ids), m.config["vocab"])
    assert np.allclose(batched[0], logits, atol=1e-5)
    # A classifier or headless model refuses it, by name
    kwt = clattn.load_model(data_dir() / "kwt1")
    with pytest.raises(Exception, match="mlm|masked"):
        kwt.forward_mlm(np.array([1, 2, 3]))
