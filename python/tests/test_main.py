"""`python3 -m clattn` (python/clattn/__main__.py): the package's version and machine facts, the
same line `clattn --version` prints, JSON, the variants and the usage. Run as a user would, in a
subprocess of this interpreter, with this environment (PYTHONPATH names the package under test)."""
import json
import os
import shutil
import subprocess
import sys

import clattn


def run_module(*args, **env):
    return subprocess.run([sys.executable, "-m", "clattn", *args], capture_output=True, text=True,
                          env=dict(os.environ, **env))


def test_facts_are_those_of_config_and_the_cli(cli):
    r = run_module()
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"clattn {clattn.__version__} (Python package {os.path.dirname(os.path.abspath(clattn.__file__))})", lines[0]
    c = clattn.config()
    assert lines[1].startswith(c["cpu"] or c["cpu_vendor"]) and f"ISA {c['isa']}" in lines[1], lines[1]
    # The C++ command's --version, in the same environment: its second and third lines are the
    # same facts, word for word.
    v = cli("--version")
    assert v.returncode == 0, v.stderr
    assert lines[1:3] == v.stdout.splitlines()[1:3], (r.stdout, v.stdout)
    assert f"Python {sys.version.split()[0]} ({sys.executable})" in r.stdout
    assert "--help" in lines[-1]


def test_a_refused_isa_still_reports_the_facts_and_the_reason():
    # CLATTN_ISA naming an ISA this CPU lacks: both reports print the facts with the reason in the
    # ISA field, the same words, instead of a traceback (or no version).
    wanted = "avx512" if "avx512" not in clattn.config()["isas_supported"] else "sse9"
    r = run_module(CLATTN_ISA=wanted)
    assert r.returncode == 0, r.stderr
    assert f"ISA none (CLATTN_ISA={wanted}" in r.stdout, r.stdout
    exe = os.environ.get("CLATTN_BIN") or shutil.which("clattn")
    assert exe, "set CLATTN_BIN to the clattn command (CTest does)"
    v = subprocess.run([exe, "--version"], capture_output=True, text=True,
                       env=dict(os.environ, CLATTN_ISA=wanted))
    assert v.returncode == 0, v.stderr
    assert v.stdout.splitlines()[0].startswith("clattn ") and r.stdout.splitlines()[1] == v.stdout.splitlines()[1]


def test_json_is_config_and_more():
    # A thread count other than the suites' 2: the report gives the process's own.
    r = run_module("--json", OMP_NUM_THREADS="3")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    c = clattn.config()
    for key in c:
        if key != "threads":
            assert d[key] == c[key], key
    assert d["threads"] == 3
    assert d["python"] == sys.executable
    assert isinstance(d["torch_installed"], bool)


def test_variants_and_help():
    r = run_module("--variants")
    assert r.returncode == 0, r.stderr
    assert [ln.split()[0] for ln in r.stdout.splitlines()] == [v["name"] for v in clattn.variants()]
    h = run_module("--help")
    assert h.returncode == 0, h.stderr
    assert "usage:" in h.stdout and "clattn.Attention(" in h.stdout
    # The command line is the C++ program's, and the help says this package does not ship it.
    assert "C++ program `clattn`" in h.stdout and "not part of this package" in h.stdout
    bad = run_module("--no-such-option")
    assert bad.returncode == 2 and "unrecognized arguments" in bad.stderr


def test_capabilities_are_the_cli_json_flag_for_flag(cli):
    # One serialization (capability_list in the library): the same names, order and values.
    r = cli("variants", "-o", "json")
    assert r.returncode == 0, r.stderr
    by_cli = {v["name"]: v["capabilities"] for v in json.loads(r.stdout)["variants"]}
    for v in clattn.variants():
        assert list(v["capabilities"].items()) == list(by_cli[v["name"]].items()), v["name"]
        assert list(clattn.Attention(v["example"]).capabilities) == list(by_cli[v["name"]])
    full = by_cli["full"]
    assert full["trainable"] and full["decode"] and full["half_cache"] and not full["decode_queries"]
    assert by_cli["clustered"]["decode_queries"] and not by_cli["reformer"]["decode"]


def test_search_plan_with_python_metric_and_cost():
    # Layer 1 is the sensitive one: it keeps the dearer candidate (the same case as the C++
    # PlanSearch.TakesTheCheapestCandidateEachLayerAffords).
    cost = {"full": 10.0, "cheap": 2.0, "mid": 5.0}
    damage = [{"cheap": 0.01, "mid": 0.005}, {"cheap": 0.2, "mid": 0.02}, {"cheap": 0.02, "mid": 0.01}]

    def evaluate(plan):
        return 1 - sum(damage[i][s] for i, s in enumerate(plan.split(";")) if s != "full")

    notes = []
    f = clattn.search_plan(3, ["mid", "cheap"], evaluate, cost.__getitem__, 0.94, unit="GOP", on_note=notes.append)
    assert f["plan"] == "cheap;mid;cheap" and f["layers"] == ["cheap", "mid", "cheap"]
    assert f["attention_cost"] == 9 and f["full_cost"] == 30 and f["evaluations"] == 8
    assert f["evaluated"][0] == {"plan": "full;full;full", "cost": 30.0, "value": 1.0}
    assert any("layer 1 -> mid" in n for n in notes)
    # A Python exception inside a callback reaches the caller as itself.
    def broken(plan):
        raise KeyError("no data")
    try:
        clattn.search_plan(1, ["cheap"], broken, cost.__getitem__, 0.5)
        raise AssertionError("the callback's error was swallowed")
    except KeyError:
        pass


def test_compare_logits_against_numpy():
    # The metrics `clattn approx` searches on, against a float64 NumPy statement of each.
    import numpy as np
    rng = np.random.default_rng(7)
    ref = rng.normal(0, 3, (50, 12)).astype(np.float32)
    apx = (ref + rng.normal(0, 1.5, ref.shape)).astype(np.float32)
    labels = rng.integers(-1, 12, 50)
    got = clattn.compare_logits(ref, apx, labels)

    def log_softmax(x):
        x = x.astype(np.float64)
        m = x.max(axis=1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))
    la, lb = log_softmax(ref), log_softmax(apx)
    assert got["agreement"] == np.mean(ref.argmax(1) == apx.argmax(1))
    has = labels >= 0
    assert got["accuracy"] == np.mean(apx.argmax(1)[has] == labels[has])
    assert abs(got["kl"] - np.mean((np.exp(la) * (la - lb)).sum(1))) < 1e-12
    assert got["max_diff"] == np.abs(ref.astype(np.float64) - apx).max()
    assert clattn.compare_logits(ref, ref)["accuracy"] is None
    # A float64 view of every other row is read as the rows it names.
    assert clattn.compare_logits(ref.astype(np.float64)[::2], apx[::2]) == clattn.compare_logits(ref[::2].copy(), apx[::2].copy())
    for bad, what in [((ref, apx[:3]), "of one shape"), ((ref, apx, labels[:4]), "4 labels for 50 rows"),
                      ((ref, apx, np.full(50, 12)), "outside [0, 12)")]:
        try:
            clattn.compare_logits(*bad)
            raise AssertionError("accepted " + what)
        except ValueError as e:
            assert what in str(e), str(e)
