#!/usr/bin/python3
"""Exact attention against clattn's tensor-op clustered attention on one device (clattn/_device.py).

sdpa: torch.nn.functional.scaled_dot_product_attention where the torch has it (FlashAttention on a
GPU), else clattn's tensor-op `full` (softmax attention over blocks of query rows, O(N·D) memory).
The clattn rows run clattn.torch.attention(..., backend="torch") on the same (B, H, N, D) tensors;
with --cpp on a CPU the C++ kernels run beside them.
forward: under torch.no_grad(); forward+backward: o.backward(do) with q, k, v requiring grad.
One warm-up call, then the median of --repeat calls. Peak memory: on a GPU
torch.cuda.max_memory_allocated over the call; on the CPU the process's peak resident set over
one more call (VmHWM after resetting it through /proc/self/clear_refs), inputs and libraries
included, with glibc's mmap threshold at 64 KiB for that call so that freed blocks leave at once
(else they stay resident and the figure is several times the memory in use; the timed calls run
with it at 32 MiB, where glibc's own adjustment takes it, since page faults on every block
would slow them).
Sizes above --max-n are skipped (default 16384 on a CPU, where N = 262144 would take hours), and
exact attention above --max-full-n (its time grows as N²).

    PYTHONPATH=build/python /usr/bin/python3 python/bench_device.py                  # GPU if present
    PYTHONPATH=build/python /usr/bin/python3 python/bench_device.py --device cpu --max-n 8192 --cpp
"""
import argparse
import ctypes
import os
import statistics
import sys
import time

# Run as a file, Python puts python/ first on sys.path, where the source package (without the
# built extension) would shadow the one on PYTHONPATH.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _here]

import torch

import clattn
import clattn.torch as ct

HAS_SDPA = hasattr(torch.nn.functional, "scaled_dot_product_attention")


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed blocks glibc kept would count as resident
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return 0


def peak_bytes(device):
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def mmap_threshold(nbytes):
    """glibc's M_MMAP_THRESHOLD (mallopt -3); nothing elsewhere."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, int(nbytes))
    except (OSError, AttributeError):
        pass


def measure(fn, repeat, device):
    """(median ms, peak GiB) of fn(); None when it does not fit in memory."""
    try:
        on_cpu = device.type == "cpu"
        if on_cpu:
            mmap_threshold(32 << 20)
        fn()
        sync(device)
        ms, peak = [], 0
        for _ in range(repeat):
            reset_peak(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            ms.append(1e3 * (time.perf_counter() - t0))
            peak = max(peak, peak_bytes(device))
        if on_cpu:
            mmap_threshold(64 << 10)
            reset_peak(device)
            fn()
            peak = peak_bytes(device)
            mmap_threshold(32 << 20)
        return statistics.median(ms), peak / 2**30
    except RuntimeError as e:  # torch.cuda.OutOfMemoryError is a RuntimeError
        if "out of memory" not in str(e).lower():
            raise
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--lengths", default="4096,16384,65536,262144")
    ap.add_argument("--max-n", type=int, default=None, help="skip longer sequences (default: 16384 on a CPU)")
    ap.add_argument("--max-full-n", type=int, default=None,
                    help="skip exact attention above this N (default: no limit on a GPU, 8192 on a CPU)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--dtype", default=None, help="bfloat16, float16 or float32 (default: bfloat16 on a GPU, "
                                                   "float32 on a CPU)")
    ap.add_argument("--specs", default="clustered:clusters=100;improved-clustered:clusters=100,topk=32",
                    help="';'-separated clattn specs run as tensor ops")
    ap.add_argument("--cpp", action="store_true", help="also time the C++ kernels (CPU tensors, float32)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="CPU threads of torch and clattn")
    ap.add_argument("--modes", default="forward,backward")
    a = ap.parse_args()
    device = torch.device(a.device)
    on_cpu = device.type == "cpu"
    max_n = a.max_n if a.max_n is not None else (16384 if on_cpu else 1 << 62)
    max_full = a.max_full_n if a.max_full_n is not None else (8192 if on_cpu else 1 << 62)
    dtype = getattr(torch, a.dtype) if a.dtype else (torch.float32 if on_cpu else torch.bfloat16)
    if a.threads:
        torch.set_num_threads(a.threads)
        clattn.set_num_threads(a.threads)
    torch.manual_seed(0)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else clattn.config()["cpu"]
    exact = "sdpa" if HAS_SDPA and not on_cpu else ("sdpa (cpu)" if HAS_SDPA else "full (tensor ops)")
    print(f"{where}; torch {torch.__version__}, clattn {clattn.__version__}; B={a.batch} H={a.heads} D={a.dim} "
          f"{str(dtype).replace('torch.', '')}, {torch.get_num_threads()} CPU threads; median of {a.repeat}; "
          f"ms (peak GiB)")
    print("| N | attention | forward | forward+backward | fwd+bwd / exact |")
    print("|---|---|---|---|---|")
    modes = a.modes.split(",")
    rows = [("exact", exact, None)] + [("torch", s, s) for s in a.specs.split(";") if s]
    if a.cpp and on_cpu:
        rows += [("cpp", f"{s} (C++ kernels)", s) for s in a.specs.split(";") if s]
    for n in map(int, a.lengths.split(",")):
        if n > max_n:
            print(f"| {n} | (skipped: above --max-n {max_n}) | | | |")
            continue
        shape = (a.batch, a.heads, n, a.dim)
        q, k, v, do = (torch.randn(shape, device=device, dtype=dtype) for _ in range(4))
        base = None
        for kind, label, spec in rows:
            if kind == "exact" and n > max_full:
                print(f"| {n} | {label} | (skipped: above --max-full-n {max_full}) | | |")
                continue
            if kind == "exact":
                if HAS_SDPA:
                    def call(x, y, z):
                        return torch.nn.functional.scaled_dot_product_attention(x, y, z)
                else:
                    att = clattn.Attention("full")

                    def call(x, y, z):
                        return ct.attention(att, x, y, z, backend="torch")
                xs = (q, k, v)
            else:
                att = clattn.Attention(spec)
                backend = "cpp" if kind == "cpp" else "torch"

                def call(x, y, z, att=att, backend=backend):
                    return ct.attention(att, x, y, z, backend=backend)
                xs = (q, k, v) if kind == "torch" else tuple(t.float() for t in (q, k, v))
            cells = []
            for mode in ("forward", "backward"):
                if mode not in modes:
                    cells.append(None)
                    continue
                if mode == "forward":
                    def fn():
                        with torch.no_grad():
                            call(*xs)
                else:
                    leaves = [t.detach().clone().requires_grad_() for t in xs]
                    g = do.to(xs[0].dtype)

                    def fn(leaves=leaves, g=g):
                        for t in leaves:
                            t.grad = None
                        call(*leaves).backward(g)
                cells.append(measure(fn, a.repeat, device))
            fb = cells[1]
            if kind == "exact":
                base = fb
            ratio = f"{fb[0] / base[0]:.3f}" if fb and base and kind != "exact" else ""
            text = ["" if c is None and m not in modes else ("out of memory" if c is None else f"{c[0]:.1f} ({c[1]:.2f})")
                    for c, m in zip(cells, ("forward", "backward"))]
            print(f"| {n} | {label} | {text[0]} | {text[1]} | {ratio} |", flush=True)
        del q, k, v, do
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
