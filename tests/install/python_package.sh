#!/usr/bin/env bash
# `pip install .` and `python3 -m build --wheel --no-isolation` of the clattn Python package
# (pyproject.toml, setup.py, python/pep517/clattn_backend.py), as a user runs them, into a fresh
# venv with the system's packages (NumPy from Debian): no package index is reached, and the
# extension comes from the given build tree (CLATTN_BUILD_DIR), so nothing is compiled twice.
# Then the installed package imports from the venv and runs an attention.
# Usage: python_package.sh SOURCE_DIR BUILD_DIR   (registered with CTest as python_package)
set -uo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# A copy of what packaging reads, so that nothing this script does can touch the checkout, and
# so that what packaging leaves in a source tree is seen (left_in_src).
mkdir -p "$work/src"
(cd "$src" && cp -r pyproject.toml setup.py README.md LICENSE CMakeLists.txt python "$work/src/")
rm -rf "$work/src/python/tests"
export CLATTN_BUILD_DIR=$build PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# setuptools' scratch (an egg-info, build/lib.*, build/bdist.*) must not stay in the source: in a
# checkout it would be python/clattn.egg-info and files inside the CMake tree build/.
left_in_src() {
  local left
  left=$(cd "$work/src" && find . \( -name '*.egg-info' -o -name build -o -name dist \) -prune -print | sort)
  if [ -z "$left" ]; then ok; else bad "$1 left in the source tree:" $left; fi
}

/usr/bin/python3 -m venv --system-site-packages "$work/venv" || { bad "python3 -m venv (Debian: python3-venv)"; exit 1; }
if "$work/venv/bin/python" -m pip install -q "$work/src" >"$work/pip.log" 2>&1; then ok; else
  bad "pip install . failed:"; tail -n 30 "$work/pip.log"; fi
left_in_src "pip install ."
# No console script: `clattn` on PATH stays the C++ command; `python -m clattn` reports the package.
if [ ! -e "$work/venv/bin/clattn" ]; then ok; else bad "pip install . installed a clattn command into the venv"; fi
if (cd "$work" && "$work/venv/bin/python" -m clattn) >"$work/main.log" 2>&1 &&
   head -n 1 "$work/main.log" | grep -q "^clattn [0-9.]* (Python package $work/venv/"; then ok; else
  bad "python -m clattn from the venv:"; tail -n 10 "$work/main.log"; fi
# An interpreter that cannot import NumPy (here a venv without the system's packages; a pyenv
# python3 is another) is refused before anything is built, naming the interpreter that works.
if /usr/bin/python3 -m venv "$work/bare" >/dev/null 2>&1; then
  if "$work/bare/bin/python" -m pip install -q "$work/src" >"$work/bare.log" 2>&1; then
    bad "pip install . with a python3 that has no NumPy succeeded"
  elif grep -q "cannot import NumPy" "$work/bare.log" &&
       grep -q "Install with /usr/bin/python3" "$work/bare.log"; then ok; else
    bad "pip install . with a python3 without NumPy failed without saying why:"; tail -n 15 "$work/bare.log"; fi
  left_in_src "a refused pip install ."
else bad "python3 -m venv (without system site packages)"; fi
# Another source (here a copy with one Python file changed) with this build tree: refused, since
# it would install this tree's extension under that source's files and version.
cp -r "$work/src" "$work/other"
echo "# changed" >>"$work/other/python/clattn/__init__.py"
if "$work/venv/bin/python" -m pip install -q "$work/other" >"$work/other.log" 2>&1; then
  bad "pip install of another source with CLATTN_BUILD_DIR of this one succeeded"
elif grep -q "whose python/clattn differs" "$work/other.log"; then ok; else
  bad "pip install of another source failed without naming the difference:"; tail -n 10 "$work/other.log"; fi
cd "$work"
if "$work/venv/bin/python" - "$work/venv" <<'PY'
import sys, numpy as np, clattn
from importlib import metadata
venv = sys.argv[1]
assert clattn.__file__.startswith(venv), f"clattn imported from {clattn.__file__}, not the venv"
q = np.ones((1, 1, 8, 4), np.float32)
assert clattn.Attention("full").forward(q, q, q).shape == q.shape
md = metadata.metadata("clattn")
assert md["Version"] == clattn.__version__, (md["Version"], clattn.__version__)
assert md["License"] == "MIT", md["License"]
assert any("MIT License" in c for c in md.get_all("Classifier")), md.get_all("Classifier")
print("venv import ok:", clattn.__file__, md["Version"], md["License"])
PY
then ok; else bad "the installed package does not import or run from the venv"; fi

if /usr/bin/python3 -m build --wheel --no-isolation --outdir "$work/dist" "$work/src" >"$work/build.log" 2>&1; then
  whl=$(ls "$work/dist"/clattn-*.whl 2>/dev/null | head -n 1)
  if [ -n "$whl" ] && /usr/bin/python3 - "$whl" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
assert any(n.startswith("clattn/_clattn") and n.endswith(".so") for n in names), names
for f in ("clattn/__init__.py", "clattn/torch.py", "clattn/_torch_nn.py"):
    assert f in names, (f, names)
assert any(n.endswith(".dist-info/LICENSE") for n in names), names
assert "clattn/__main__.py" in names, names
# No console script (no entry points at all): `clattn` is the C++ command's name.
assert not any(n.endswith(".dist-info/entry_points.txt") for n in names), names
print("wheel ok:", sys.argv[1].rsplit("/", 1)[-1])
PY
  then ok; else bad "the wheel lacks the extension, a module or the LICENSE, or has entry points"; fi
  left_in_src "python3 -m build --wheel"
else
  bad "python3 -m build --wheel --no-isolation failed (Debian: python3-build):"; tail -n 30 "$work/build.log"
fi
echo "python package: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
