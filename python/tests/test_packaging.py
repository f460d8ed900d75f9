"""The interpreter check of the build backend (python/pep517/clattn_backend.py): an interpreter
of another installation than the build tree's is refused before anything is built, naming the
one that works. tests/install/python_package.sh runs `pip install .` itself, including the
refusal of an interpreter without NumPy; here the build tree's interpreter is a stand-in, so
that another installation can be shown on any machine. And the progress lines a first
`pip install .` writes on the terminal (python/pep517/build_progress.py), from a stand-in build."""
import importlib.util
import io
import json
import subprocess
import sys
import sysconfig

import pytest

from conftest import SOURCE_DIR


@pytest.fixture(scope="module")
def backend():
    spec = importlib.util.spec_from_file_location("clattn_backend", SOURCE_DIR / "python" / "pep517" / "clattn_backend.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_tree(tmp_path, python):
    build = tmp_path / "build"
    build.mkdir()
    (build / "CMakeCache.txt").write_text(f"CMAKE_HOME_DIRECTORY:INTERNAL={SOURCE_DIR}\n"
                                          f"Python3_EXECUTABLE:FILEPATH={python}\n")
    return build


def test_this_interpreter_is_accepted(backend, tmp_path, monkeypatch):
    monkeypatch.setenv("CLATTN_BUILD_DIR", str(build_tree(tmp_path, sys.executable)))
    backend.check_interpreter()


def test_another_installation_is_refused(backend, tmp_path, monkeypatch):
    # What a pyenv or conda Python of the same version says of itself: Debian's extension suffix,
    # another base prefix.
    other = tmp_path / "python3"
    facts = dict(prefix="/opt/other-python", suffix=sysconfig.get_config_var("EXT_SUFFIX"), version="3.11.9",
                 numpy="1.26.4")
    other.write_text(f"#!/bin/sh\necho '{json.dumps(facts)}'\n")
    other.chmod(0o755)
    build = build_tree(tmp_path, other)
    monkeypatch.setenv("CLATTN_BUILD_DIR", str(build))
    with pytest.raises(SystemExit) as e:
        backend.check_interpreter()
    msg = str(e.value)
    assert f"cannot be built with {sys.executable}" in msg, msg
    assert f"the build tree {build} compiles the extension for {other} (Python 3.11.9 installed in /opt/other-python)" \
        in msg, msg
    assert "cannot import NumPy" not in msg, msg
    assert f"Install with {other} (--clear" in msg, msg
    assert f"\n  {other} -m venv --clear --system-site-packages .venv && .venv/bin/pip install ." in msg, msg


@pytest.fixture(scope="module")
def progress():
    spec = importlib.util.spec_from_file_location("build_progress", SOURCE_DIR / "python" / "pep517" / "build_progress.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_build_progress_on_the_terminal(progress, tmp_path, monkeypatch):
    # A stand-in for Ninja: four steps, then one more line; the clock says 0 s at the start, then
    # 1, 6, 7, 13 and 14 s at the lines and 20 s at the end.
    build = tmp_path / "ninja.py"
    build.write_text("for i in range(1, 5):\n    print(f'[{i}/4] Building CXX object o{i}')\nprint('Linking')\n")
    clock = iter([0.0, 1.0, 6.0, 7.0, 13.0, 14.0, 20.0]).__next__
    terminal, out = io.StringIO(), io.StringIO()
    progress.run([sys.executable, str(build)], None, "building", terminal, every=5.0, clock=clock, out=out)
    assert out.getvalue().splitlines() == [f"[{i}/4] Building CXX object o{i}" for i in range(1, 5)] + ["Linking"]
    assert terminal.getvalue().splitlines() == ["clattn: building: 2/4 steps, 6 s", "clattn: building: 4/4 steps, 13 s",
                                                "clattn: building: done after 20 s (4/4 steps)"]
    # A failed build raises as check_call did, and says so on the terminal; Make's percentages.
    build.write_text("print('[ 40%] Building CXX object a')\nraise SystemExit(3)\n")
    terminal = io.StringIO()
    with pytest.raises(subprocess.CalledProcessError):
        progress.run([sys.executable, str(build)], None, "building", terminal, clock=iter([0.0, 1.0, 75.0]).__next__,
                     out=io.StringIO())
    assert terminal.getvalue() == "clattn: building: failed (exit 3) after 1 min 15 s (40 %)\n"
    monkeypatch.setenv("CLATTN_PROGRESS", "0")
    assert progress.open_terminal() is None
