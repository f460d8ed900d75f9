#!/usr/bin/env python3
"""Tables of docs/training.md from the logs of docs/training.sh (docs/results/training/).

Usage: python3 docs/training_summary.py [RESULTS_DIR]. Prints Markdown: per run the steps done in
the budget, the median step time, the last and the best evaluation; then the swap matrices.
"""
import glob
import json
import os
import statistics
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "results", "training")


def read(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return rows


def runs(prefix):
    out = []
    for path in sorted(glob.glob(os.path.join(root, prefix + "-*.jsonl"))):
        rows = read(path)
        steps = [r for r in rows if "loss" in r and "ms" in r]
        evals = [r for r in rows if "eval_loss" in r]
        head = next((r for r in rows if "attention" in r and "eval_loss" not in r), {})
        if not steps or not evals:
            continue
        higher_better = evals[-1].get("metric") == "accuracy"
        best = max(evals, key=lambda r: r["eval_metric"]) if higher_better else min(evals, key=lambda r: r["eval_metric"])
        out.append({
            "name": os.path.basename(path)[:-6],
            "attention": head.get("attention", evals[-1].get("attention", "?")),
            "steps": steps[-1]["step"] + 1,
            "ms": statistics.median(r["ms"] for r in steps),
            "last": evals[-1],
            "best": best,
            "metric": evals[-1].get("metric", "metric"),
        })
    return out


for prefix, title in (("mlm", "Masked character LM (tiny-shakespeare, N = 2048)"),
                      ("lm", "Causal character LM (tiny-shakespeare, N = 2048)"),
                      ("listops", "ListOps (trained on generated, evaluated on test_d20s.tsv)")):
    rs = runs(prefix)
    if not rs:
        continue
    m = rs[0]["metric"]
    print(f"\n### {title}\n")
    print(f"| run | attention | steps in budget | median ms/step | last {m} (at s) | best {m} |")
    print("|---|---|---|---|---|---|")
    for r in rs:
        print(f"| {r['name']} | `{r['attention']}` | {r['steps']} | {r['ms']:.0f} | "
              f"{r['last']['eval_metric']:.3f} ({r['last']['elapsed_s']:.0f}) | {r['best']['eval_metric']:.3f} |")

for path in sorted(glob.glob(os.path.join(root, "swap-*.json"))):
    try:
        data = json.load(open(path))
    except (OSError, json.JSONDecodeError):
        continue
    rows = data if isinstance(data, list) else data.get("results", [])
    print(f"\n### Swap matrix: {os.path.basename(path)[5:-5]} evaluated with every attention\n")
    print("| evaluated with | loss | bits per character |")
    print("|---|---|---|")
    for r in rows:
        print(f"| `{r['attention']}` | {r['eval_loss']:.4f} | {r['eval_metric']:.4f} |")
