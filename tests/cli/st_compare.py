#!/usr/bin/python3
"""Compare the F32 tensors of two safetensors files: st_compare.py A B TOL [NAME...].

Exits 0 when every named tensor (default: every tensor of A) is in B with the same shape and
max |a - b| <= TOL * max(1, max |a|); otherwise prints the first mismatch and exits 1."""
import json
import struct
import sys

import numpy as np


def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    body = raw[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32":
            continue
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(body[a:b], dtype="<f4").reshape(info["shape"])
    return out


def main():
    a_path, b_path, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
    a, b = load(a_path), load(b_path)
    names = sys.argv[4:] or sorted(a)
    for name in names:
        if name not in a or name not in b:
            print(f"{name}: missing from {a_path if name not in a else b_path}")
            return 1
        if a[name].shape != b[name].shape:
            print(f"{name}: shape {a[name].shape} vs {b[name].shape}")
            return 1
        scale = max(1.0, float(np.abs(a[name]).max(initial=0.0)))
        err = float(np.abs(a[name].astype(np.float64) - b[name]).max(initial=0.0))
        if not err <= tol * scale:
            print(f"{name}: max |a - b| = {err:.3g} > {tol:g} * {scale:.3g}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
