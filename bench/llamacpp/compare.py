#!/usr/bin/python3
"""clattn against llama.cpp on the same LLaMA model, the same machine and thread count.

llama.cpp is what people run for LLaMA-family decoders on a CPU, so it is the reference for
clattn's prefill and decode speed. This script:

  1. installs llama.cpp's prebuilt CPU library from the npm package node-llama-cpp (pinned 3.21.1,
     llama.cpp commit 5b4ebc5; setup.sh) and builds llbench.cpp against it, once per folder;
  2. converts the model folder to GGUF (hf2gguf.py: F32, or F16 2-D weights with --gguf-f16);
  3. times llama.cpp (flash attention off and on) and clattn bench-model (each --attention plan):
     prefill tokens/s at each --prefill length, decode ms/token after each --decode-after prompt;
  4. prints one table, medians with the range of the timed runs, and the CPU it ran on.

Without --model it builds the random LLaMA of make_random_llama.py (hidden 512, 8 layers, 8 heads
of 64, FFN 1408, vocab 512, context 65536, f32). Run it on a quiet machine: both programs spread
every product over all the threads, and another process on a core slows them several times.

usage: bench/llamacpp/compare.py [--model DIR] [--threads 2] [--prefill 2048,8192]
           [--decode-after 512,8192] [--decode 64] [--repeat 3] [--kv f16|f32]
           [--attention full ...] [--clattn-kv f32,f16] [--clattn build/clattn] [--work build/llamacpp]
           [--clattn-weights f32,f16] [--fa 0,1] [--no-warmup] [--json OUT]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def run(cmd, **kw):
    cmd = [str(c) for c in cmd]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"compare.py: {' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return r.stdout


def cpu_name():
    try:
        out = subprocess.run(["lscpu"], stdout=subprocess.PIPE, text=True).stdout
        m = re.search(r"^Model name:\s*(.+)$", out, re.M)
        return m.group(1).strip() if m else "unknown CPU"
    except OSError:
        return "unknown CPU"


def llbench(exe, gguf, n, decode, fa, kv, threads, repeat, warmup=True):
    """Per-run (prefill tok/s, decode ms/token) of llama.cpp; one warm-up run is dropped (warmup)."""
    out = run([exe, gguf, "--n", n, "--decode", decode, "--ctx", n + decode, "--batch", 2048, "--ubatch", 2048,
               "--fa", fa, "--kv", kv, "--threads", threads, "--repeat", repeat + int(warmup)])
    runs = []
    for line in out.splitlines():
        m = re.match(r"run (\d+): prefill \d+ tokens [\d.]+ ms \(([\d.]+) tok/s\)(?:.*?([\d.]+) ms/token)?", line)
        if m and int(m.group(1)) >= int(warmup):
            runs.append((float(m.group(2)), float(m.group(3)) if m.group(3) else None))
    if len(runs) != repeat:
        sys.exit(f"compare.py: llbench printed {len(runs)} timed runs, expected {repeat}:\n{out}")
    return runs


def clattn_rows(exe, model, n, decode, plan, kv, weights, threads, repeat):
    """clattn bench-model's JSON rows (prefill, and decode when decode > 0) for one plan, cache and
    weight storage."""
    with tempfile.TemporaryDirectory() as d:
        js = Path(d) / "r.json"
        run([exe, "bench-model", "--model", model, "--lengths", n, "--decode", decode, "--attention", plan,
             "--kv-cache", kv, "--threads", threads, "--repeat", repeat, "--json", js]
            + (["--weights", weights] if weights != "f32" else []))
        doc = json.loads(js.read_text())
    return {r["mode"]: r for r in doc["results"]}, doc["machine"]


def cell(values):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    med = statistics.median(values)
    lo, hi = min(values), max(values)
    fmt = "{:.0f}" if med >= 100 else "{:.1f}" if med >= 10 else "{:.2f}"
    if fmt.format(lo) == fmt.format(hi):
        return fmt.format(med)
    return f"{fmt.format(med)} ({fmt.format(lo)}–{fmt.format(hi)})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="LLaMA folder in Hugging Face layout (default: the random model, built once)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", default="2048,8192", help="prompt lengths for the prefill rows")
    ap.add_argument("--decode-after", default="512,8192", help="prompt lengths the decode rows start after")
    ap.add_argument("--decode", type=int, default=64, help="tokens decoded per decode row")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per cell, after one warm-up")
    ap.add_argument("--kv", default="f16", choices=["f16", "f32"], help="llama.cpp's KV cache type")
    ap.add_argument("--gguf-f16", action="store_true", help="convert 2-D weights to F16 for llama.cpp")
    ap.add_argument("--attention", action="append", help="clattn plan, repeatable (default: full)")
    ap.add_argument("--clattn-kv", default="f32,f16",
                    help="clattn KV cache types, comma-separated: a column per plan and type (16-bit: full, local)")
    ap.add_argument("--clattn-weights", default="f32",
                    help="comma list of clattn weight storages (f32, f16, bf16; compare f16 with --gguf-f16)")
    ap.add_argument("--clattn", default=str(ROOT / "build" / "clattn"))
    ap.add_argument("--work", default=str(ROOT / "build" / "llamacpp"),
                    help="folder for node-llama-cpp, llbench, the random model and the GGUF files")
    ap.add_argument("--fa", default="0,1", help="llama.cpp flash attention settings to time (0 off, 1 on)")
    ap.add_argument("--no-warmup", action="store_true",
                    help="time llama.cpp's first run too (a prompt of 32768 tokens takes minutes per run)")
    ap.add_argument("--json", help="also write the table's numbers as JSON to this file")
    a = ap.parse_args()
    plans = [(p, kv, w) for p in (a.attention or ["full"]) for kv in a.clattn_kv.split(",") if kv
             for w in a.clattn_weights.split(",") if w]
    lengths = lambda s: [int(x) for x in s.split(",") if x]
    prefill, after = lengths(a.prefill), lengths(a.decode_after)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    if not Path(a.clattn).is_file():
        sys.exit(f"compare.py: no clattn binary at {a.clattn} (build first, or give --clattn)")

    print("setting up llama.cpp (node-llama-cpp 3.21.1) ...", file=sys.stderr)
    exe = run(["bash", HERE / "setup.sh", work / "node"]).strip().splitlines()[-1]
    model = Path(a.model) if a.model else work / "random-llama"
    if not a.model and not (model / "model.safetensors").is_file():
        run([sys.executable, HERE / "make_random_llama.py", model])
    gguf = work / (model.name + (".f16" if a.gguf_f16 else "") + ".gguf")
    src = model / "model.safetensors"
    if not gguf.is_file() or (src.is_file() and gguf.stat().st_mtime < src.stat().st_mtime):
        run([sys.executable, HERE / "hf2gguf.py", model, gguf] + (["--f16"] if a.gguf_f16 else []))

    fas = [int(x) for x in a.fa.split(",") if x]
    name = lambda p, kv, w: f"clattn {p}, {kv} cache" + (f", {w} weights" if w != "f32" else "")
    cols = [f"llama.cpp fa {fa}" for fa in fas] + [name(p, kv, w) for p, kv, w in plans]
    table, raw, machine = [], [], None
    # A decode run prefills its prompt first: a prefill row of the same length takes its figures
    # from those runs instead of prefilling again (at 32768 tokens, minutes per run).
    ll_runs, cl_runs = {}, {}

    def ll(n, d, fa):
        key = (n, fa)
        if key not in ll_runs or (d > 0 and ll_runs[key][0] == 0):
            ll_runs[key] = (d, llbench(exe, gguf, n, d, fa, a.kv, a.threads, a.repeat, not a.no_warmup))
        return ll_runs[key][1]

    for kind, ns in (("prefill", prefill), ("decode", after)):
        for n in ns:
            d = a.decode if kind == "decode" else 0
            label = f"prefill {n} tokens, tok/s" if kind == "prefill" else f"decode {d} tokens after {n}, ms/token"
            row = [label]
            for fa in fas:
                print(f"{label}: llama.cpp fa {fa}", file=sys.stderr)
                runs = ll(n, a.decode if kind == "prefill" and n in after else d, fa)
                vals = [r[0] if kind == "prefill" else r[1] for r in runs]
                row.append(cell(vals))
                raw.append({"row": label, "who": f"llama.cpp fa {fa}", "runs": vals})
            for p, kv, w in plans:
                print(f"{label}: {name(p, kv, w)}", file=sys.stderr)
                key = (n, p, kv, w)  # as llama.cpp's: a decode run's prefill serves the prefill row
                if key not in cl_runs or (d > 0 and "decode" not in cl_runs[key][0]):
                    dd = a.decode if kind == "prefill" and n in after else d
                    cl_runs[key] = clattn_rows(a.clattn, model, n, dd, p, kv, w, a.threads, a.repeat)
                rows, machine = cl_runs[key]
                r = rows[kind]
                if kind == "prefill":  # tok/s from the slowest, median and fastest run
                    vals = [n / (r[k] * 1e-3) for k in ("ms_max", "ms_median", "ms_min")]
                else:
                    vals = [r["ms_min"], r["ms_median"], r["ms_max"]]
                row.append(cell(vals))
                raw.append({"row": label, "who": name(p, kv, w), "runs": vals, "clattn": r})
            table.append(row)

    print(f"\n{cpu_name()}, {a.threads} threads; model {model}; llama.cpp KV cache {a.kv}, batch = ubatch = 2048, "
          f"GGUF {'F16' if a.gguf_f16 else 'F32'} weights; clattn {machine['clattn']['commit'] if machine else '?'} "
          f"(sgemm {machine['sgemm_gflops']:.0f} GFLOP/s, read {machine['read_gbs']:.1f} GB/s); medians of {a.repeat} "
          f"(range)\n")
    widths = [max(len(r[i]) for r in table + [[""] + cols]) for i in range(len(cols) + 1)]
    head = [""] + cols
    print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in table:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
    if a.json:
        Path(a.json).write_text(json.dumps({"cpu": cpu_name(), "threads": a.threads, "model": str(model),
                                            "kv": a.kv, "machine": machine, "cells": raw}, indent=1) + "\n")


if __name__ == "__main__":
    main()
