"""The interpreter check of the build backend (python/pep517/clattn_backend.py): an interpreter
of another installation than the build tree's is refused before anything is built, naming the
one that works. tests/install/python_package.sh runs `pip install .` itself, including the
refusal of an interpreter without NumPy; here the build tree's interpreter is a stand-in, so
that another installation can be shown on any machine."""
import importlib.util
import json
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
