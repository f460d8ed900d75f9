"""`python3 -m clattn`: what this clattn package runs with, and how to use it.

The command line of clattn (attend, bench, train, generate, ...) is the C++ program `clattn`,
which the Python package does not ship (the wheel holds the extension and these files only).
This module does not stand in for it: it prints the machine facts of `clattn.config()` (as
`clattn --version` does), where the package and its interpreter are, and where the command line
comes from. No console script is installed either, so that `clattn` on PATH is always the C++
program (docs/python.md, "Running the package").
"""
import argparse
import importlib.util
import json
import os
import shutil
import sys

import numpy as np

import clattn

EPILOG = """\
from Python:
  import numpy as np, clattn
  att = clattn.Attention("improved-clustered:clusters=100")
  o = att.forward(q, k, v)        # q (B, H, N, D), k, v (B, Hkv, M, D) float32
  dq, dk, dv = att.backward(do)   # the gradients of the last forward
  import clattn.torch             # PyTorch: attention, scaled_dot_product_attention, MultiheadAttention

The command line (clattn attend, bench, train, generate, ...) is the C++ program `clattn`,
which is not part of this package: the build's `build/clattn`, which `cmake --install build`
puts on PATH.
"""


def machine_summary(c):
    # The line of `clattn --version` (machine_summary() in the C++ library), from config().
    cpu = c["cpu"] or c["cpu_vendor"]
    isa = f"none ({c['isa_error']})" if c.get("isa_error") else c["isa"]
    return (f"{cpu} (family {c['cpu_family']} model {c['cpu_model']}), ISA {isa}, {c['gemm']} "
            f"{c['gemm_kernel']} kernel, {c['threads']} threads")


def facts():
    """config() and where this package, its interpreter and the C++ command are."""
    d = dict(clattn.config())
    d["package"] = os.path.dirname(os.path.abspath(clattn.__file__))
    d["python"] = sys.executable
    d["python_version"] = sys.version.split()[0]
    d["numpy"] = np.__version__
    # find_spec, not import: importing torch takes seconds and is not needed to say it is there.
    d["torch_installed"] = importlib.util.find_spec("torch") is not None
    d["cli"] = shutil.which("clattn")
    return d


def report(d):
    lines = [
        f"clattn {d['version']} (Python package {d['package']})",
        machine_summary(d),
        f"GEMM kernel: {d['gemm_kernel_reason']}",
        f"CPU features: {d['cpu_flags'] or '(none of note)'}; kernel ISAs supported: {d['isas_supported']}",
        f"Python {d['python_version']} ({d['python']}), NumPy {d['numpy']}, "
        + ("PyTorch installed (clattn.torch)" if d["torch_installed"] else "no PyTorch (clattn.torch unavailable)"),
        "command line: " + (f"{d['cli']} (the C++ clattn, found on PATH)" if d["cli"]
                            else "the C++ clattn is not on PATH (not part of this package: build/clattn, "
                                 "or cmake --install build)"),
    ]
    return "\n".join(lines)


def main(argv=None):
    prog = f"{os.path.basename(sys.executable) or 'python3'} -m clattn"
    p = argparse.ArgumentParser(
        prog=prog, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The clattn Python package: its version and the machine facts it runs with (CPU, the ISA "
                    "of its kernels, the GEMM backend and its kernel, the threads), as `clattn --version` "
                    "prints them.")
    p.add_argument("--json", action="store_true", help="print the facts as one JSON object (clattn.config() and more)")
    p.add_argument("--variants", action="store_true",
                   help="list the attention variants (clattn.variants()): name and summary")
    a = p.parse_args(argv)
    if a.variants:
        for v in clattn.variants():
            print(f"{v['name']:<20} {v['summary']}")
        return 0
    d = facts()
    print(json.dumps(d, indent=2, sort_keys=True) if a.json else report(d))
    if not a.json:
        print(f"\n{prog} --help: how to use the package; --variants: the attention variants")
    return 0


if __name__ == "__main__":
    sys.exit(main())
