"""Shared fixtures of the clattn Python tests (run by CTest as `python`, see python/CMakeLists.txt).

CTest sets PYTHONPATH to the build tree's python/ folder, CLATTN_BIN to the clattn command (for the
bit-for-bit comparison with `clattn attend`) and CLATTN_SOURCE_DIR; CLATTN_DATA overrides the real
data folder (default: the source tree's ../shared/data), whose absence skips the tests that read it
(fails them in CI: data_required).
"""
import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

import clattn

SOURCE_DIR = pathlib.Path(os.environ.get("CLATTN_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))


def data_required():
    """Missing data fails rather than skips: CLATTN_REQUIRE_DATA when set (scripts/test.sh sets 1;
    0 turns it off), else whether CI is set. "", "0" and "false" count as unset."""
    v = os.environ.get("CLATTN_REQUIRE_DATA") or os.environ.get("CI") or ""
    return v not in ("", "0", "false")


def data_dir():
    """The real data folder. Without it the calling test is skipped with one line naming
    CLATTN_DATA, or fails where the data is required (data_required)."""
    d = pathlib.Path(os.environ.get("CLATTN_DATA") or SOURCE_DIR.parent / "shared" / "data")
    if not d.is_dir():
        msg = f"real data not found: {d} is missing (set CLATTN_DATA to the shared data folder)"
        if data_required():
            pytest.fail(msg + "; required here: CI or CLATTN_REQUIRE_DATA is set", pytrace=False)
        pytest.skip(msg)
    return d


@pytest.fixture(scope="session")
def cli():
    """Runs the clattn command; fails (never skips) when it cannot be found."""
    exe = os.environ.get("CLATTN_BIN") or shutil.which("clattn")
    assert exe, "set CLATTN_BIN to the clattn command (CTest does)"

    def run(*args):
        r = subprocess.run([exe, *map(str, args)], capture_output=True, text=True)
        return r
    return run


@pytest.fixture(autouse=True)
def two_threads():
    """Every test on 2 threads, as the C++ suites (OMP_NUM_THREADS=2)."""
    clattn.set_num_threads(2)
    yield


def randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def rand(*shape, seed, scale=1.0):
    """A float32 torch tensor of standard normals times `scale`, the same for the same seed (a
    generator of its own: the global torch seed is left alone). torch is imported here, not at the
    top, so that the NumPy suites run without it."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float32) * scale
