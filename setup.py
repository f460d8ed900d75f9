"""setuptools half of `pip install .` (pyproject.toml, python/pep517/clattn_backend.py): the
pure-Python files of python/clattn and the extension clattn._clattn, which CMake builds (target
clattn_python, python/CMakeLists.txt) exactly as the README's build does.

The CMake build tree, in this order:
  $CLATTN_BUILD_DIR    an existing configured tree (the test command passes its own, so installing
                       rebuilds nothing);
  build/               the README's tree when it is one of this source, reused incrementally;
  otherwise build/ is configured here with the README's options (library, CLI and Python package;
  no tests or micro-benchmarks). $CLATTN_JOBS sets the build's parallelism (2).
"""
import atexit
import hashlib
import os
import re
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "python" / "pep517"))
import build_progress  # noqa: E402  (python/pep517: CMake's progress on pip's terminal)


def version():
    m = re.search(r"project\(clattn VERSION ([0-9.]+)", (ROOT / "CMakeLists.txt").read_text())
    if not m:
        raise RuntimeError("setup.py: no 'project(clattn VERSION x.y.z' in CMakeLists.txt")
    return m.group(1)


def cache_value(build_dir, key):
    cache = Path(build_dir) / "CMakeCache.txt"
    if not cache.is_file():
        return None
    for line in cache.read_text(errors="replace").splitlines():
        if line.startswith(key + ":"):
            return line.split("=", 1)[1]
    return None


# What the extension is built from. A build tree of another source tree is accepted only when
# these are the same there (a copy of this checkout, as the packaging test makes, is; another
# checkout is not: it would install that checkout's extension under this one's version).
SOURCES = ("CMakeLists.txt", "python/src", "python/clattn", "src", "include")


def digest(path):
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(f for f in path.rglob("*") if f.is_file() and "__pycache__" not in f.parts)
    for f in files:
        h.update(str(f.relative_to(path) if f != path else f.name).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def check_same_sources(build, home):
    home = Path(home).resolve()
    if home == ROOT:
        return
    for rel in SOURCES:
        mine, theirs = ROOT / rel, home / rel
        if mine.exists() and (not theirs.exists() or digest(mine) != digest(theirs)):
            raise RuntimeError(f"{build} is the build tree of {home}, whose {rel} differs from {ROOT}'s: it would "
                               "install that source's extension as this one; give a build tree of this checkout "
                               "(CLATTN_BUILD_DIR)")


def clean_env():
    # pip's isolated build sets PYTHONPATH / PYTHONNOUSERSITE to hide the system's packages; CMake
    # runs the interpreter to find NumPy and pybind11, which must see them.
    env = dict(os.environ)
    for k in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME"):
        env.pop(k, None)
    return env


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        env = clean_env()
        terminal = build_progress.open_terminal()
        jobs = os.environ.get("CLATTN_JOBS", "2")
        given = os.environ.get("CLATTN_BUILD_DIR")
        if given:
            build = Path(given).resolve()
            home = cache_value(build, "CMAKE_HOME_DIRECTORY")
            if home is None:
                raise RuntimeError(f"CLATTN_BUILD_DIR={given} is not a configured CMake build tree of clattn")
            check_same_sources(build, home)
        else:
            build = ROOT / "build"
            home = cache_value(build, "CMAKE_HOME_DIRECTORY")
            if home is not None and Path(home).resolve() != ROOT:
                raise RuntimeError(f"{build} is the build tree of {home}, not of {ROOT}: set CLATTN_BUILD_DIR")
            if home is None:
                gen = ["-G", "Ninja"] if shutil.which("ninja") else []
                build_progress.run(["cmake", "-S", str(ROOT), "-B", str(build), *gen, "-DCMAKE_BUILD_TYPE=Release",
                                    "-DCLATTN_BUILD_TESTS=OFF", "-DCLATTN_BUILD_BENCH=OFF",
                                    f"-DPython3_EXECUTABLE={sys.executable}"], env, "configuring build/", terminal)
        build_progress.run(["cmake", "--build", str(build), "--target", "clattn_python", "-j", jobs], env,
                           f"building the extension in {build}", terminal)
        if terminal is not None:
            terminal.close()
        built = sorted((build / "python" / "clattn").glob("_clattn*.so"))
        if not built:
            raise RuntimeError(f"no clattn/_clattn*.so in {build}/python: was the Python package skipped at configure "
                               "time? It needs python3-dev, pybind11-dev and python3-numpy (scripts/install-deps.sh)")
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        match = [p for p in built if p.name == "_clattn" + suffix]
        if not match:
            raise RuntimeError(f"{built[0]} was built for another interpreter ({cache_value(build, 'Python3_EXECUTABLE')}); "
                               f"this one ({sys.executable}) loads _clattn{suffix}")
        dest = Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(match[0], dest)


# setuptools' own scratch goes to a temporary folder that is removed on exit: by default it would
# write python/clattn.egg-info into the checkout and build/lib.*, build/bdist.* into build/, which is
# the README's CMake build tree. The wheel, the metadata and the installed files go where the
# caller asks as before.
scratch = tempfile.mkdtemp(prefix="clattn-setuptools-")
atexit.register(shutil.rmtree, scratch, ignore_errors=True)

setup(version=version(), ext_modules=[Extension("clattn._clattn", sources=[])], cmdclass={"build_ext": CMakeBuild},
      options={"egg_info": {"egg_base": scratch}, "build": {"build_base": os.path.join(scratch, "build")}})
