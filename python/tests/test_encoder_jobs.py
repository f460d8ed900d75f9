"""An encoder's everyday jobs: `clattn classify` / `embed` and Encoder.classify / embed, on a tiny
DistilBERT with the real bert-base-uncased tokenizer (held to the float64 NumPy forward of
test_families.py) and on KWT-1's FSDD clips."""
import json
import shutil

import numpy as np
import pytest

import clattn
from conftest import data_dir
from test_families import DISTIL_CONFIG, H, distil_hidden, distil_reference, distil_tensors, write_folder

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hello, world!", "naïve café résumé",
         "a " * 60 + "end"]  # the last is past the 40 positions: cut, keeping [SEP]


def distilbert(tmp_path):
    """A tiny DistilBERT classifier over bert-base-uncased's 30522 tokens, its tokenizer beside it."""
    tok_dir = data_dir() / "tokenizers" / "bert-base-uncased"
    vocab = 30522
    t = distil_tensors(8)
    t["distilbert.embeddings.word_embeddings.weight"] = (
        0.3 * np.random.default_rng(9).standard_normal((vocab, H))).astype(np.float32)
    cfg = dict(DISTIL_CONFIG, vocab_size=vocab)
    folder = tmp_path / "distil"
    write_folder(folder, cfg, t)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_dir / f, folder / f)
    return folder, t


def reference_ids(tok, text, context=40):
    """[CLS] tokens [SEP], the tokens cut so that the whole fits the context (HF's truncation)."""
    ids = list(tok.encode(text))
    return ids if len(ids) <= context else ids[:context - 1] + [ids[-1]]


def test_classify_and_embed_equal_the_numpy_forward(tmp_path):
    folder, t = distilbert(tmp_path)
    m = clattn.load_model(folder)
    tok = m.tokenizer
    got = m.classify(TEXTS, batch=3)  # two batches, padded to their longest
    assert [g["label"] for g in got] == [["A", "B", "C"][g["id"]] for g in got]
    for text, g in zip(TEXTS, got):
        ids = reference_ids(tok, text)
        logits = distil_reference(t, np.array(ids), len(ids))
        p = np.exp(logits - logits.max())
        p /= p.sum()
        assert g["id"] == int(np.argmax(logits)) and abs(g["score"] - p.max()) < 1e-4
    assert reference_ids(tok, TEXTS[3])[-1] == tok.encode("")[-1]  # [SEP] kept at the cut
    for pooling in ("mean", "cls"):
        e = m.embed(TEXTS, pooling=pooling, batch=2)
        assert e.shape == (len(TEXTS), H) and e.dtype == np.float32
        for i, text in enumerate(TEXTS):
            ids = reference_ids(tok, text)
            h = distil_hidden(t, np.array(ids), len(ids))
            want = h.mean(0) if pooling == "mean" else h[0]
            assert np.abs(e[i] - want).max() <= 1e-4 * np.abs(want).max()
    with pytest.raises(ValueError, match="pooling must be mean or cls"):
        m.embed(TEXTS, pooling="max")


def test_classify_and_embed_commands_equal_python(tmp_path, cli):
    folder, _ = distilbert(tmp_path)
    m = clattn.load_model(folder)
    text = tmp_path / "lines.txt"
    text.write_text("\n".join(TEXTS[:2]) + "\n\n" + "\n".join(TEXTS[2:]) + "\n")  # a blank line is skipped
    r = cli("classify", "--model", folder, "--text", text, "--batch", "2")
    assert r.returncode == 0, r.stderr
    rows = [ln.split("\t") for ln in r.stdout.splitlines()]
    want = m.classify(TEXTS)
    assert [x[0] for x in rows] == [w["label"] for w in want]
    assert all(abs(float(x[1]) - w["score"]) < 1e-4 for x, w in zip(rows, want))
    assert "1 of 4 lines were longer than the model's context" in r.stderr
    r = cli("classify", "--model", folder, "--text", text, "-o", "jsonl", "--attention", "local:window=8")
    assert r.returncode == 0, r.stderr
    assert [json.loads(x)["item"] for x in r.stdout.splitlines()] == [0, 1, 2, 3]
    for out in ("e.safetensors", "e.jsonl"):
        r = cli("embed", "--model", folder, "--text", text, "--pooling", "cls", "--output", tmp_path / out)
        assert r.returncode == 0, r.stderr
    got = clattn.read_safetensors(tmp_path / "e.safetensors")["embeddings"]
    assert np.allclose(got, m.embed(TEXTS, pooling="cls"), atol=1e-6)
    rows = [json.loads(x) for x in (tmp_path / "e.jsonl").read_text().splitlines()]
    assert np.allclose(np.array([x["embedding"] for x in rows]), got, atol=1e-6)
    # Refusals: a decoder, an output onto the input, a bad format, a KWT model given text.
    assert cli("classify", "--model", data_dir() / "stories260k", "--text", text).returncode == 2
    assert cli("embed", "--model", folder, "--text", text, "--output", text).returncode == 2
    assert cli("embed", "--model", folder, "--text", text, "--output", tmp_path / "e.txt").returncode == 2
    assert cli("classify", "--model", folder, "--text", text, "-o", "csv").returncode == 2


def test_kwt_classifies_fsdd_clips(tmp_path, cli):
    kwt = data_dir() / "kwt1"
    feats = kwt / "features_fsdd_test.safetensors"
    r = cli("classify", "--model", kwt, "--features", feats, "-o", "jsonl", "--batch", "64")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    f = clattn.read_safetensors(feats)
    logits = clattn.load_model(kwt).forward_features(f["features"])
    assert [x["id"] for x in rows] == list(np.argmax(logits, 1))
    labels = f["labels"]
    accuracy = np.mean([x["id"] == y for x, y in zip(rows, labels)])
    assert accuracy == pytest.approx(279 / 300)  # the folder's README: 93.0 % with full attention
    assert rows[0]["label"] == "_unknown_"


def test_bench_model_times_a_bert_family_checkpoint_on_random_ids(tmp_path, cli):
    folder, _ = distilbert(tmp_path)
    out = tmp_path / "bm.json"
    r = cli("bench-model", "--model", folder, "--lengths", "16,40", "--attention", "full", "--attention",
            "local:window=8", "--repeat", "2", "--threads", "1", "--json", out)
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["results"]
    assert sorted((x["attention"], x["n"]) for x in rows) == [("full", 16), ("full", 40), ("local:window=8", 16),
                                                              ("local:window=8", 40)]
    assert all(0 <= x["outside_percent"] <= 100 and x["ms_median"] > 0 for x in rows), rows
    r = cli("bench-model", "--model", folder, "--lengths", "64")
    assert r.returncode == 1 and "exceeds the model's context of 40" in r.stderr, r.stderr
    r = cli("bench-model", "--model", folder, "--features", data_dir() / "kwt1" / "features_fsdd_test.safetensors")
    assert r.returncode == 2 and "--features is for KWT models" in r.stderr, r.stderr
