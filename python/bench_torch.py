#!/usr/bin/python3
"""PyTorch's own attention against clattn.torch, same machine, same threads.

torch: plain softmax attention as PyTorch ops, softmax(q·kᵀ·s)·v (torch 1.13 has no
F.scaled_dot_product_attention; where a newer torch has it, it is timed instead, --torch auto). It
materialises the (N, N) scores of a head: when the scores of all heads would exceed --chunk-gib,
heads run one at a time (the backward then runs per head too), so that N = 16384 fits in memory.
clattn: clattn.torch.Attention(spec) on the same (B, H, N, D) float32 tensors.
forward: under torch.no_grad(); forward+backward: o.backward(do) with q, k, v requiring grad.
One warm-up call, then the median of --repeat calls.

    PYTHONPATH=build/python /usr/bin/python3 python/bench_torch.py --lengths 4096,16384
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

import torch

import clattn
import clattn.torch as ct

HAS_SDPA = hasattr(torch.nn.functional, "scaled_dot_product_attention")


def softmax_attention(q, k, v):
    s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    return torch.softmax(s, dim=-1) @ v


def torch_attention(q, k, v):
    if HAS_SDPA:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)
    return softmax_attention(q, k, v)


def timed(fn, repeat):
    fn()
    ms = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ms.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(ms)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="4096,16384")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--clattn", default="full;improved-clustered:clusters=100", help="';'-separated specs")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk-gib", type=float, default=1.0, help="run torch per head above this many GiB of scores")
    ap.add_argument("--modes", default="forward,backward")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    clattn.set_num_threads(a.threads)
    torch.manual_seed(0)
    label = "torch sdpa" if HAS_SDPA else "torch softmax"
    print(f"torch {torch.__version__}, clattn {clattn.__version__}; B={a.batch} H={a.heads} D={a.dim}, "
          f"{a.threads} threads, median of {a.repeat} (ms)")
    print("| N | attention | forward | forward+backward |")
    print("|---|---|---|---|")
    modes = a.modes.split(",")
    for n in map(int, a.lengths.split(",")):
        q, k, v, do = (torch.randn(a.batch, a.heads, n, a.dim) for _ in range(4))
        per_head = 4.0 * a.batch * a.heads * n * n / 2**30 > a.chunk_gib

        def run_torch(backward):
            heads = [slice(h, h + 1) for h in range(a.heads)] if per_head else [slice(None)]
            for hs in heads:
                if backward:
                    qq, kk, vv = (t[:, hs].detach().requires_grad_() for t in (q, k, v))
                    torch_attention(qq, kk, vv).backward(do[:, hs])
                else:
                    with torch.no_grad():
                        torch_attention(q[:, hs], k[:, hs], v[:, hs])

        rows = [(label + (", per head" if per_head else ""), run_torch)]
        for spec in a.clattn.split(";"):
            att = ct.Attention(spec)

            def run_clattn(backward, att=att):
                if backward:
                    qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
                    att(qq, kk, vv).backward(do)
                else:
                    with torch.no_grad():
                        att(q, k, v)
            rows.append((f"clattn {spec}", run_clattn))
        for name, fn in rows:
            f = timed(lambda: fn(False), a.repeat) if "forward" in modes else float("nan")
            b = timed(lambda: fn(True), a.repeat) if "backward" in modes else float("nan")
            print(f"| {n} | {name} | {f:.1f} | {b:.1f} |", flush=True)


if __name__ == "__main__":
    main()
