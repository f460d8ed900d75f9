"""Tokenizer.encode_batch as Hugging Face tokenizers' encode_batch: masks, padding (longest, fixed,
multiple, left, the file's section), truncation (LongestFirst for pairs), vocabulary lookups; on
the real bert-base-uncased and gpt2 files. Expected values are derived here from single-text
encodings and the rules, independently of the batch code."""
import itertools
import json
import shutil
import time

import numpy as np
import pytest

import clattn
from conftest import data_dir

TEXTS = ["i like strawberries", "Hello, World!", "", "unaffable naïve café " * 3, "a"]


def bert():
    return clattn.Tokenizer(data_dir() / "tokenizers" / "bert-base-uncased" / "tokenizer.json")


def cut(a, b, budget, pair, strategy="longest_first", left=False):
    """tokenizers' truncate_encodings: the texts' tokens a and b kept within budget."""
    if len(a) + len(b) <= budget:
        return a, b
    if strategy == "longest_first" and not pair:
        na, nb = budget, 0
    elif strategy == "longest_first":
        if 2 * min(len(a), len(b)) <= budget:  # the shorter whole, the longer the rest
            na, nb = (len(a), budget - len(a)) if len(a) <= len(b) else (budget - len(b), len(b))
        else:  # half each; the odd one to the longer, the second on ties
            half = budget // 2
            na, nb = (budget - half, half) if len(a) > len(b) else (half, budget - half)
    else:
        excess = len(a) + len(b) - budget
        if len(a if strategy == "only_first" else b) <= excess:
            raise ValueError("too short")  # tokenizers: SequenceTooShort
        na, nb = (len(a) - excess, len(b)) if strategy == "only_first" else (len(a), len(b) - excess)
    keep = (lambda x, n: x[len(x) - n:] if n else []) if left else (lambda x, n: x[:n])
    return keep(a, na), keep(b, nb)


def expected(tok, texts, pairs=None, max_length=0, length=0, multiple=0, left=False, pad_id=0,
             strategy="longest_first", cut_left=False):
    """The batch from encoding() of each text and the documented rules."""
    n_special = len(tok.encode("", None if pairs is None else ""))
    rows = []
    for i, t in enumerate(texts):
        p = None if pairs is None else pairs[i]
        a = list(tok.encode(t, add_special_tokens=False))
        b = [] if p is None else list(tok.encode(p, add_special_tokens=False))
        if max_length:
            a, b = cut(a, b, max_length - n_special, p is not None, strategy, cut_left)
        # the template around the kept tokens, from the specials-only encoding
        full, types = tok.encoding(t, p)
        head = list(tok.encode("", None if p is None else "", add_special_tokens=True))
        # BERT: [CLS] A [SEP] (B [SEP]); type 0 then 1
        ids = [head[0]] + a + [head[1]] + (b + [head[2]] if p is not None else [])
        tt = [0] * (len(a) + 2) + ([1] * (len(b) + 1) if p is not None else [])
        sp = [1] + [0] * len(a) + [1] + ([0] * len(b) + [1] if p is not None else [])
        if not max_length:
            assert ids == list(full) and tt == list(types)
        rows.append((ids, tt, sp))
    T = length or max(len(r[0]) for r in rows)
    if multiple:
        T = -(-T // multiple) * multiple
    out = {k: np.zeros((len(rows), T), np.int32) for k in ("input_ids", "attention_mask", "token_type_ids",
                                                          "special_tokens_mask")}
    for i, (ids, tt, sp) in enumerate(rows):
        n = len(ids)
        at = slice(T - n, T) if left else slice(0, n)
        out["input_ids"][i] = pad_id
        out["special_tokens_mask"][i] = 1
        out["input_ids"][i, at] = ids
        out["token_type_ids"][i, at] = tt
        out["special_tokens_mask"][i, at] = sp
        out["attention_mask"][i, at] = 1
    return out


def same(got, want):
    for k, v in want.items():
        assert np.array_equal(got[k], v), (k, got[k], v)


@pytest.mark.parametrize("kw", [dict(), dict(pad_to_multiple_of=8), dict(padding_side="left"), dict(length=20),
                                dict(pad_id=7, padding_side="left", pad_to_multiple_of=4)])
def test_padding_and_masks_equal_the_rules(kw):
    tok = bert()
    got = tok.encode_batch(TEXTS, **kw)
    want = expected(tok, TEXTS, length=kw.get("length", 0), multiple=kw.get("pad_to_multiple_of", 0),
                    left=kw.get("padding_side") == "left", pad_id=kw.get("pad_id", 0))
    same(got, want)
    assert list(got["lengths"]) == [int(m.sum()) for m in want["attention_mask"]] and got["truncated"] == 0


def test_truncation_keeps_the_special_tokens_and_cuts_pairs_longest_first():
    tok = bert()
    # transformers: tokenizer("i like strawberries", "hello", truncation=True, max_length=7)
    got = tok.encode_batch(["i like strawberries"], ["hello"], max_length=7)
    assert list(got["input_ids"][0]) == [101, 1045, 2066, 13137, 102, 7592, 102]
    assert list(got["token_type_ids"][0]) == [0, 0, 0, 0, 0, 1, 1]
    assert list(got["special_tokens_mask"][0]) == [1, 0, 0, 0, 1, 0, 1] and got["truncated"] == 1
    pairs = ["hello there my friend", "x", "", "y z", "a b c d e f"]
    cuts = 0
    for m in (6, 9, 12):
        same(tok.encode_batch(TEXTS, pairs, max_length=m), expected(tok, TEXTS, pairs, max_length=m))
        got = tok.encode_batch(TEXTS, max_length=m)
        same(got, expected(tok, TEXTS, max_length=m))
        assert got["input_ids"].shape[1] <= m
        for strategy, side, (a, b) in itertools.product(("only_first", "only_second"), ("left", "right"),
                                                       ((TEXTS, pairs), (pairs, TEXTS))):
            kw = dict(max_length=m + 6, truncation_strategy=strategy, truncation_side=side)
            try:
                want = expected(tok, a, b, max_length=m + 6, strategy=strategy, cut_left=side == "left")
            except ValueError:  # a text too short to make the room
                with pytest.raises(ValueError, match="too short"):
                    tok.encode_batch(a, b, **kw)
                continue
            same(tok.encode_batch(a, b, **kw), want)
            cuts += 1
        same(tok.encode_batch(TEXTS, max_length=m, truncation_side="left"), expected(tok, TEXTS, max_length=m, cut_left=True))
    assert cuts == 12  # only_first on (texts, pairs), only_second on (pairs, texts): both sides, 3 lengths
    with pytest.raises(ValueError, match="leaves no room"):
        tok.encode_batch(TEXTS, max_length=2)
    with pytest.raises(ValueError, match="only_second needs a text pair"):
        tok.encode_batch(["a b c d e f g"], max_length=5, truncation_strategy="only_second")
    with pytest.raises(ValueError, match="need max_length"):
        tok.encode_batch(TEXTS, truncation_side="left")
    with pytest.raises(ValueError, match="one pair per text"):
        tok.encode_batch(TEXTS, ["x"])
    with pytest.raises(ValueError, match="longer than the fixed padding length"):
        tok.encode_batch(TEXTS, length=4)


def test_the_files_padding_section_is_honoured(tmp_path):
    src = data_dir() / "tokenizers" / "bert-base-uncased"
    j = json.loads((src / "tokenizer.json").read_text())
    j["padding"] = {"strategy": {"Fixed": 16}, "direction": "Left", "pad_to_multiple_of": None, "pad_id": 0,
                    "pad_type_id": 0, "pad_token": "[PAD]"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(j))
    shutil.copy(src / "tokenizer_config.json", tmp_path / "tokenizer_config.json")
    tok = clattn.Tokenizer(tmp_path / "tokenizer.json")
    assert tok.padding == {"length": 16, "pad_to_multiple_of": None, "direction": "left", "pad_id": 0, "pad_type_id": 0}
    same(tok.encode_batch(TEXTS[:2]), expected(tok, TEXTS[:2], length=16, left=True))
    same(tok.encode_batch(TEXTS[:2], length=0, padding_side="right"), expected(tok, TEXTS[:2]))  # overridden
    j["padding"]["strategy"] = "Sometimes"
    (tmp_path / "tokenizer.json").write_text(json.dumps(j))
    with pytest.raises(ValueError, match="padding.strategy must be"):
        clattn.Tokenizer(tmp_path / "tokenizer.json")


def test_vocabulary_lookups():
    tok = bert()
    assert tok.token_to_id("[CLS]") == 101 and tok.token_to_id("##berries") == 20968
    assert tok.token_to_id("no-such-token") is None
    assert tok.id_to_token(13137) == "straw" and tok.id_to_token(10 ** 6) is None
    v = tok.get_vocab()
    assert len(v) == len(tok) == 30522 and v["[SEP]"] == 102
    gpt2 = clattn.Tokenizer(data_dir() / "tokenizers" / "gpt2" / "tokenizer.json")
    assert gpt2.token_to_id("<|endoftext|>") == 50256 and gpt2.id_to_token(50256) == "<|endoftext|>"


def test_batch_encoding_of_tiny_shakespeare_lines_equals_single_texts_and_reports_its_speed():
    tok = clattn.Tokenizer(data_dir() / "tokenizers" / "gpt2" / "tokenizer.json")
    lines = [ln for ln in (data_dir() / "tinyshakespeare" / "input.txt").read_text().splitlines() if ln][:8000]
    t0 = time.perf_counter()
    singles = [tok.encode(ln) for ln in lines]
    t1 = time.perf_counter()
    got = tok.encode_batch(lines, threads=2)
    t2 = time.perf_counter()
    for i in range(0, len(lines), 97):
        n = got["lengths"][i]
        assert list(got["input_ids"][i, :n]) == list(singles[i])
    print(f"\nencode_batch of {len(lines)} lines: {(t1 - t0) / (t2 - t1):.2f}x the single-text loop "
          f"({t1 - t0:.3f} s vs {t2 - t1:.3f} s, 2 threads)")


def test_the_files_truncation_section_is_honoured(tmp_path):
    src = data_dir() / "tokenizers" / "bert-base-uncased"
    j = json.loads((src / "tokenizer.json").read_text())
    j["truncation"] = {"direction": "Left", "max_length": 6, "strategy": "LongestFirst", "stride": 0}
    (tmp_path / "tokenizer.json").write_text(json.dumps(j))
    shutil.copy(src / "tokenizer_config.json", tmp_path / "tokenizer_config.json")
    tok = clattn.Tokenizer(tmp_path / "tokenizer.json")
    assert tok.truncation == {"max_length": 6, "strategy": "longest_first", "direction": "left", "stride": 0}
    plain = bert()  # the rules read untruncated encodings: tok's own encode() applies its section
    assert plain.truncation is None
    same(tok.encode_batch(TEXTS), expected(plain, TEXTS, max_length=6, cut_left=True))
    same(tok.encode_batch(TEXTS, max_length=9, truncation_side="right"), expected(plain, TEXTS, max_length=9))
    body = list(plain.encode(TEXTS[3], add_special_tokens=False))
    assert list(tok.encode(TEXTS[3])) == [101] + body[-4:] + [102]  # encode applies it, as tokenizers' does


def test_overflowing_windows_as_transformers_return_overflowing_tokens():
    # transformers: tokenizer(texts, truncation=True, max_length=m, stride=s,
    # return_overflowing_tokens=True): each cut text gives windows of m - 2 tokens, neighbours
    # sharing s, each between [CLS] and [SEP]; overflow_to_sample_mapping names the text.
    tok = bert()
    for m, s, side in [(6, 0, "right"), (6, 2, "right"), (9, 3, "left")]:
        got = tok.encode_batch(TEXTS, max_length=m, stride=s, truncation_side=side, return_overflowing_tokens=True)
        want_rows, want_map = [], []
        for i, t in enumerate(TEXTS):
            body = list(tok.encode(t, add_special_tokens=False))
            w = m - 2
            if len(body) <= w:
                spans = [(0, len(body))]
            elif side == "right":
                spans = []
                for start in range(0, len(body), w - s):
                    spans.append((start, min(start + w, len(body))))
                    if start + w >= len(body):
                        break
            else:
                spans, stop = [], len(body)
                while True:
                    spans.append((max(0, stop - w), stop))
                    if stop <= w:
                        break
                    stop -= w - s
            for a, b in spans:
                want_rows.append([101] + body[a:b] + [102])
                want_map.append(i)
        assert list(got["overflow_to_sample_mapping"]) == want_map, (m, s, side)
        rows = [list(r[:n]) for r, n in zip(got["input_ids"], got["lengths"])]
        assert rows == want_rows, (m, s, side)
        assert got["truncated"] == sum(len(tok.encode(t, add_special_tokens=False)) > m - 2 for t in TEXTS)
    assert "overflow_to_sample_mapping" not in tok.encode_batch(TEXTS, max_length=6)
    with pytest.raises(ValueError, match="stride 4 must be below the 4 tokens"):
        tok.encode_batch(TEXTS, max_length=6, stride=4, return_overflowing_tokens=True)
