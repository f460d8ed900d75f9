"""The PEP 517 build backend of `pip install .` and `python3 -m build`: setuptools (Debian's
python3-setuptools and python3-wheel) driven by setup.py, which builds the extension with CMake.

Why a backend of our own, in the tree: pip builds in an isolated environment whose build
requirements it downloads from a package index, and hides the system's site-packages from it.
This project's machines reach no Python index, so the build requires nothing from one
(pyproject.toml: requires = []), and this module finds the interpreter's own setuptools and wheel
when isolation hid them, then hands every hook to setuptools.build_meta.

Before a wheel is built it checks the interpreter (check_interpreter): the extension is compiled
against one Python and its NumPy, Debian's /usr/bin/python3 unless the build tree says otherwise,
and a python3 that is another installation (pyenv, conda, a venv without the system's packages)
is refused at once with the command that works, rather than after a build or by a pip resolver
that finds no NumPy.
"""
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
DEBIAN_PYTHON = "/usr/bin/python3"

# What an interpreter is, asked of it in a process of its own: the hook's process has Debian's
# dist-packages on sys.path when _find_setuptools put them there, so its NumPy proves nothing.
_PROBE = """
import json, sys, sysconfig
try:
    import numpy
    np = numpy.__version__
except Exception:
    np = None
print(json.dumps(dict(prefix=sys.base_prefix, suffix=sysconfig.get_config_var("EXT_SUFFIX"),
                      version=sys.version.split()[0], numpy=np)))
"""


def _clean_env():
    # As setup.py's: without pip's isolation, which hides the system's site-packages.
    env = dict(os.environ)
    for k in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME"):
        env.pop(k, None)
    return env


def _probe(exe):
    try:
        r = subprocess.run([exe, "-c", _PROBE], env=_clean_env(), capture_output=True, text=True, timeout=120)
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def _build_python():
    """The build tree setup.py will use (CLATTN_BUILD_DIR, else build/ when configured) and the
    interpreter its extension is compiled for (CMake's Python3_EXECUTABLE); None for either when
    there is none (setup.py then configures build/ for this interpreter)."""
    build = Path(os.environ.get("CLATTN_BUILD_DIR") or ROOT / "build")
    cache = build / "CMakeCache.txt"
    if not cache.is_file():
        return None, None
    for line in cache.read_text(errors="replace").splitlines():
        if line.startswith("Python3_EXECUTABLE:"):
            return build, line.split("=", 1)[1] or None
    return build, None


def check_interpreter():
    """Refuse, before anything is built, an interpreter the extension cannot be built for or
    would not run under: one that cannot import NumPy (the extension is compiled against it and
    imports it), or another installation than the one the build tree compiles for (another base
    prefix or extension suffix: a pyenv 3.11 has Debian's suffix but not its packages)."""
    mine = _probe(sys.executable)
    if mine is None:
        return  # an interpreter that cannot even be asked: left to the build's own errors
    build, exe = _build_python()
    theirs = _probe(exe) if exe else None
    problems = []
    if mine["numpy"] is None:
        problems.append("it cannot import NumPy, which the extension is compiled against and imports")
    if theirs and (mine["prefix"], mine["suffix"]) != (theirs["prefix"], theirs["suffix"]):
        problems.append(f"the build tree {build} compiles the extension for {exe} (Python {theirs['version']} "
                        f"installed in {theirs['prefix']}), another installation")
    if not problems:
        return
    good = exe if theirs and theirs["numpy"] else DEBIAN_PYTHON
    raise SystemExit(
        f"error: clattn's Python package cannot be built with {sys.executable} (Python {mine['version']} "
        f"installed in {mine['prefix']}):\n"
        + "".join(f"  - {p}{';' if i + 1 < len(problems) else '.'}\n" for i, p in enumerate(problems))
        + "The extension is built for Debian's Python with its NumPy and pybind11 (python3-dev python3-numpy "
        "python3-pybind11; scripts/install-deps.sh), and the python3 first on PATH may be another installation "
        f"(pyenv, conda, a venv without the system's packages). Install with {good} (--clear replaces a .venv "
        "another Python made, which fails in ensurepip otherwise):\n"
        f"  {good} -m venv --clear --system-site-packages .venv && .venv/bin/pip install .")

def _find_setuptools():
    try:
        import setuptools  # noqa: F401
        import wheel  # noqa: F401
        return
    except ImportError:
        pass
    # The base interpreter's package folders: Debian's dist-packages (python3-setuptools,
    # python3-wheel), then the generic purelib of the base prefix.
    base = sys.base_prefix
    candidates = [os.path.join(base, "lib", "python3", "dist-packages"),
                  sysconfig.get_paths(vars={"base": base, "platbase": base})["purelib"]]
    for p in candidates:
        if os.path.isdir(p) and p not in sys.path:
            sys.path.append(p)
    try:
        import setuptools  # noqa: F401
        import wheel  # noqa: F401
    except ImportError as e:
        # An interpreter of another installation lacks them too (a pyenv python3 under pip's
        # isolation sees neither its own packages nor Debian's): say that, which is the cause.
        check_interpreter()
        raise RuntimeError("clattn's Python package builds with setuptools and wheel (Debian: python3-setuptools "
                           "python3-wheel; scripts/install-deps.sh installs them): " + str(e)) from e


_find_setuptools()

from setuptools import build_meta as _meta  # noqa: E402

build_sdist = _meta.build_sdist
prepare_metadata_for_build_wheel = _meta.prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    check_interpreter()
    return _meta.build_wheel(wheel_directory, config_settings, metadata_directory)


def get_requires_for_build_wheel(config_settings=None):
    # The first hook pip and build call for a wheel: the place to refuse before any work.
    check_interpreter()
    # setuptools.build_meta would ask for "wheel", which is already importable here (and no
    # index is reachable to install it from).
    return []


def get_requires_for_build_sdist(config_settings=None):
    # An sdist is the sources only: it needs neither NumPy nor the build tree's interpreter.
    return []
