#!/usr/bin/python3
"""Overhead of a clattn call from Python against the same call timed in C++.

Both run the same library in the same process on the same float32 inputs: `att.forward(q, k, v)`
timed with time.perf_counter (argument conversion, output allocation, GIL release included)
against `_time_forward_cpp`, a C++ loop around Attention::forward with one inference Context and
one output allocated up front. Calls are interleaved (Python, Python with out=, C++) so that noise
from other processes hits all three alike; medians are reported.

    PYTHONPATH=build/python /usr/bin/python3 python/bench_overhead.py --lengths 1024,16384
"""
import argparse
import os
import statistics
import sys
import time

# Run as a file, Python puts python/ first on sys.path, where the source package (without the
# built extension) would shadow the one on PYTHONPATH.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _here]

import numpy as np

import clattn
from clattn import _clattn


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--specs", default="full,improved-clustered:clusters=100", help="comma-separated specs")
    ap.add_argument("--lengths", default="1024,16384")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5, help="timed calls of each kind, after one warm-up")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    clattn.set_num_threads(a.threads)
    # A comma also separates a spec's parameters: split only before a registered name.
    names = {v["name"] for v in clattn.variants()}
    specs, cur = [], []
    for part in a.specs.split(","):
        if part.split(":")[0] in names and cur:
            specs.append(",".join(cur))
            cur = []
        cur.append(part)
    specs.append(",".join(cur))

    # The fixed cost of a call, which the noise of long calls hides: a (1, 1, 16, 64) forward,
    # many times, Python against C++.
    tiny = np.random.default_rng(1).standard_normal((1, 1, 16, a.dim), dtype=np.float32)
    att = clattn.Attention("full", backward=False)
    py, cpp = [], []
    for _ in range(2000):
        t0 = time.perf_counter()
        att.forward(tiny, tiny, tiny)
        py.append(1e6 * (time.perf_counter() - t0))
        cpp.append(1e3 * _clattn._time_forward_cpp(att, tiny, tiny, tiny, 1)[0])
    print(f"fixed cost of a Python call (full, N = 16, median of 2000): {statistics.median(py):.1f} us from "
          f"Python, {statistics.median(cpp):.1f} us in C++: {statistics.median(py) - statistics.median(cpp):.1f} us")
    print(f"B={a.batch} H={a.heads} D={a.dim}, {a.threads} threads, median of {a.repeat} calls (ms)")
    print("| spec | N | C++ | Python | Python, out= | overhead | overhead, out= |")
    print("|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for n in map(int, a.lengths.split(",")):
        q, k, v = (rng.standard_normal((a.batch, a.heads, n, a.dim), dtype=np.float32) for _ in range(3))
        out = np.empty_like(q)
        for spec in specs:
            att = clattn.Attention(spec, backward=False)
            att.forward(q, k, v)
            _clattn._time_forward_cpp(att, q, k, v, 1)
            py, py_out, cpp = [], [], []
            for _ in range(a.repeat):
                t0 = time.perf_counter()
                att.forward(q, k, v)
                py.append(1e3 * (time.perf_counter() - t0))
                t0 = time.perf_counter()
                att.forward(q, k, v, out=out)
                py_out.append(1e3 * (time.perf_counter() - t0))
                cpp += _clattn._time_forward_cpp(att, q, k, v, 1)
            c, p, po = statistics.median(cpp), statistics.median(py), statistics.median(py_out)
            print(f"| `{spec}` | {n} | {c:.2f} | {p:.2f} | {po:.2f} | {100 * (p / c - 1):+.2f} % "
                  f"| {100 * (po / c - 1):+.2f} % |", flush=True)


if __name__ == "__main__":
    main()
