"""clattn.Trainer: the library's training loop from a script — a tiny model trains, a run stopped
by its time budget resumes with the uninterrupted run's losses bit for bit, and its checkpoint
loads as a model whose forward runs."""
import math

import numpy as np
import pytest

import clattn


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("".join(f"line {i}: the quick brown fox {i * 7 % 13}\n" for i in range(400)))
    return path


def options(text, checkpoint, **extra):
    return dict(task="lm", data=str(text), layers=2, dim=16, heads=2, ff=32, seq=32, batch=2, steps=6,
                warmup=2, eval_every=3, eval_examples=4, checkpoint=str(checkpoint),
                attention="improved-clustered:clusters=3,topk=4,block=8", **extra)


def test_trains_resumes_bit_exact_and_loads(text, tmp_path):
    clattn.set_num_threads(1)
    ref = []
    t = clattn.Trainer(**options(text, tmp_path / "ref"))
    t.on_step = lambda r: ref.append(r["loss"])
    evals = []
    t.on_eval = evals.append
    assert t.run() == "steps"
    assert t.steps_done == 6 and len(ref) == 6
    assert [e["step"] for e in evals] == [3, 6]
    assert evals[0]["metric"] == "bits_per_char" and math.isfinite(evals[-1]["value"])
    assert ref[-1] < ref[0]

    got = []
    stopped = clattn.Trainer(**options(text, tmp_path / "tb", time_budget=1e-9))
    stopped.on_step = lambda r: got.append(r["loss"])
    assert stopped.run() == "time_budget" and stopped.steps_done == 1
    del stopped
    resumed = clattn.Trainer(**options(text, tmp_path / "tb", time_budget=1e-9, resume=True))
    assert resumed.resumed and resumed.start_step == 1
    # step() by hand: the same losses as run() would give.
    while resumed.steps_done < 6:
        got.append(resumed.step()["loss"])
    assert got == ref  # bit for bit

    # sequence_ranks=-1 splits each sequence over every rank: alone, the run it always was.
    split = []
    t = clattn.Trainer(**options(text, tmp_path / "sp", sequence_ranks=-1))
    t.on_step = lambda r: split.append(r["loss"])
    t.run()
    assert split == ref

    model = clattn.load_model(tmp_path / "ref" / "best")
    logits = model.forward(np.arange(1, 20, dtype=np.int32))
    assert logits.shape == (19, 258) and np.isfinite(logits).all()


def test_bad_options_are_errors(text, tmp_path):
    with pytest.raises(RuntimeError, match="unknown task"):
        clattn.Trainer(task="nope", data=str(text))
    with pytest.raises(RuntimeError, match="resume"):
        clattn.Trainer(task="lm", data=str(text), resume=True)
    with pytest.raises(TypeError):
        clattn.Trainer(task="lm", data=str(text), layer=3)
