"""The PEP 517 build backend of `pip install .` and `python3 -m build`: setuptools (Debian's
python3-setuptools and python3-wheel) driven by setup.py, which builds the extension with CMake.

Why a backend of our own, in the tree: pip builds in an isolated environment whose build
requirements it downloads from a package index, and hides the system's site-packages from it.
This project's machines reach no Python index, so the build requires nothing from one
(pyproject.toml: requires = []), and this module finds the interpreter's own setuptools and wheel
when isolation hid them, then hands every hook to setuptools.build_meta unchanged.
"""
import os
import sys
import sysconfig


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
        raise RuntimeError("clattn's Python package builds with setuptools and wheel (Debian: python3-setuptools "
                           "python3-wheel; scripts/install-deps.sh installs them): " + str(e)) from e


_find_setuptools()

from setuptools import build_meta as _meta  # noqa: E402

build_wheel = _meta.build_wheel
build_sdist = _meta.build_sdist
prepare_metadata_for_build_wheel = _meta.prepare_metadata_for_build_wheel


def get_requires_for_build_wheel(config_settings=None):
    # setuptools.build_meta would ask for "wheel", which is already importable here (and no
    # index is reachable to install it from).
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []
