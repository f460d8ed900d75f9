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


def test_options_have_the_command_lines_ranges_and_memory_check(text, tmp_path):
    # One set of rules (check_train_options) for the command line and Python, named as Python spells
    # the options; an absurd size is refused before anything is allocated (it once ran to 24 GB).
    bad = {"layers": 10**7, "dim": 0, "heads": 3, "ff": -5, "batch": 0, "steps": 0, "eval_every": 0,
           "lr": float("nan"), "min_lr": 1.0, "clip": float("inf"), "weight_decay": -1.0, "dropout": 1.0,
           "mask_prob": 0.0, "time_budget": float("nan"), "accum": 0, "sequence_ranks": -5}
    for name, value in bad.items():
        with pytest.raises(RuntimeError, match=rf"train: .*\b{name}\b") as e:
            clattn.Trainer(task="lm", data=str(text), **{name: value})
        assert "--" not in str(e.value), (name, str(e.value))
    with pytest.raises(RuntimeError, match=r"min_length <= max_length"):
        clattn.Trainer(task="listops", min_length=50, max_length=10)
    with pytest.raises(RuntimeError, match=r"needs about .* GB of memory"):
        clattn.Trainer(task="lm", data=str(text), layers=1024, dim=65536, heads=1, ff=1 << 20)


def test_defaults_come_from_the_library_and_accum_overlap_are_there(text, tmp_path):
    sig = clattn.Trainer.__init__.__doc__.splitlines()[0]
    for default in ("layers: int = 2", "dim: int = 128", "steps: int = 1000", "lr: float = 0.001",
                    "mask_prob: float = 0.15,", "accum: int = 1", "overlap: bool = True"):
        assert default in sig, (default, sig)
    t = clattn.Trainer(**options(text, tmp_path / "run", accum=2, overlap=False))
    assert math.isfinite(t.step()["loss"])


def test_evaluate_repeats_the_runs_held_out_figures(text, tmp_path, cli):
    """clattn.evaluate and `clattn eval` are one library call: on a run's folder they read its
    task options from train_state.json and give the Trainer's own last held-out loss."""
    clattn.set_num_threads(1)
    t = clattn.Trainer(**options(text, tmp_path / "run"))
    evals = []
    t.on_eval = evals.append
    t.run()
    ev = clattn.evaluate(str(tmp_path / "run" / "latest"), eval_examples=4)  # the run's own held-out share
    assert ev["task"] == "lm" and ev["metric"] == "bits_per_char" and ev["seq"] == 32 and ev["batch"] == 2
    (row,) = ev["results"]
    assert row["attention"].startswith("improved-clustered") and row["examples"] == evals[-1]["examples"]
    assert row["loss"] == evals[-1]["loss"] and row["value"] == evals[-1]["value"]
    two = clattn.evaluate(str(tmp_path / "run" / "latest"), attention=["full", row["attention"]], eval_examples=4)
    assert [r["attention"] for r in two["results"]] == ["full", row["attention"]]
    assert two["results"][1]["loss"] == row["loss"]
    r = cli("eval", "--checkpoint", tmp_path / "run" / "latest", "-o", "json", "--threads", 1, "--eval-examples", 4)
    assert r.returncode == 0, r.stderr
    import json
    assert json.loads(r.stdout)["results"][0]["eval_loss"] == row["loss"]
    with pytest.raises(RuntimeError, match="holds no checkpoint"):
        clattn.evaluate(str(tmp_path / "none"))
    with pytest.raises(RuntimeError, match="does not fit"):
        clattn.evaluate(str(tmp_path / "run" / "latest"), task="listops")


def test_run_reports_progress_by_default_as_the_cli(text, tmp_path, capsys):
    clattn.set_num_threads(1)
    t = clattn.Trainer(**options(text, tmp_path / "p"))
    assert t.progress is True
    t.run()
    err = capsys.readouterr().err
    # Not a terminal here: whole lines, the first and last step always, each evaluation.
    assert "step 1/6  loss " in err and "step 6/6  loss " in err and " steps/s  ETA " in err, err
    assert "eval at step 3: loss " in err and "eval at step 6: loss " in err, err
    assert "\r" not in err
    quiet = clattn.Trainer(**options(text, tmp_path / "q", time_budget=1e-9))
    quiet.progress = False
    assert quiet.run() == "time_budget"
    assert capsys.readouterr().err == ""
    budget = clattn.Trainer(**options(text, tmp_path / "b", time_budget=1e-9))
    budget.run()
    assert "train: time budget of " in capsys.readouterr().err
