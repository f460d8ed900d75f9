#!/usr/bin/env bash
# Regenerates the tables of docs/approximation.md: pretrained KWT-1 and stories260k run with full
# attention and with each approximation, no retraining. Usage: bash docs/approximation.sh [BUILD]
# (BUILD defaults to ./build); results go to docs/results/*.json and stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build}/clattn
data=${CLATTN_DATA:-../shared/data}
out=docs/results
mkdir -p "$out"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
for set in fsdd_test espeak_keywords; do
  echo "== KWT-1, $set"
  "$bin" approx --model "$data/kwt1" --features "$data/kwt1/features_$set.safetensors" --seeds 5 \
    --attention 'clustered:clusters=25' \
    --attention 'improved-clustered:clusters=25,topk=32' \
    --attention 'smyrf:hashes=2,q_cluster=32,k_cluster=32' \
    --attention 'routing:clusters=10' \
    --attention 'topk:topk=32' \
    --attention 'local:window=32' \
    --attention 'linear' \
    --json "$out/kwt1_$set.json"
done
echo "== KWT-1, fsdd_test: clusters and topk"
"$bin" approx --model "$data/kwt1" --features "$data/kwt1/features_fsdd_test.safetensors" --seeds 5 \
  --attention 'clustered:clusters=10' --attention 'clustered:clusters=50' \
  --attention 'improved-clustered:clusters=10,topk=32' --attention 'improved-clustered:clusters=50,topk=32' \
  --attention 'improved-clustered:clusters=25,topk=16' --attention 'improved-clustered:clusters=25,topk=64' \
  --json "$out/kwt1_fsdd_curve.json"
echo "== KWT-1, fsdd_test: what limits improved-clustered-25 (hash bits, bias, k-means rounds, positional clusters)"
"$bin" approx --model "$data/kwt1" --features "$data/kwt1/features_fsdd_test.safetensors" --seeds 5 \
  --attention 'improved-clustered:clusters=25,topk=32,bits=32' \
  --attention 'improved-clustered:clusters=25,topk=32,bits=16' \
  --attention 'improved-clustered:clusters=25,topk=32,hash_bias=false' \
  --attention 'improved-clustered:clusters=25,topk=32,iterations=30' \
  --attention 'improved-clustered:clusters=25,topk=32,clustering=positional' \
  --attention 'clustered:clusters=25,clustering=positional' \
  --json "$out/kwt1_fsdd_ablation.json"
echo "== stories260k, causal: 200 reference positions and 512 generated ones (1 thread)"
# The model's context is 512: the default block=512 would keep these sequences inside one block
# (exact), so the clustered rows use blocks of 32-64 to exercise the approximation. segment=block
# is one cluster set per block ("25 clusters per block"); without segment=, segments double from
# one block up to 8 blocks (the default rule).
causal=(
  --attention 'improved-clustered:clusters=25,topk=32,block=64,segment=64'
  --attention 'improved-clustered:clusters=25,topk=32,block=64'
  --attention 'improved-clustered:clusters=25,topk=32,block=32'
  --attention 'improved-clustered:clusters=8,topk=16,block=64,segment=64'
  --attention 'clustered:clusters=25,block=64,segment=64'
  --attention 'topk:topk=32'
  --attention 'local:window=64'
  --attention 'smyrf:hashes=2,q_cluster=32,k_cluster=32'
  --attention 'routing:clusters=8,centroids=ema'
  --attention 'linear'
)
OMP_NUM_THREADS=1 "$bin" approx --model "$data/stories260k" --token-file "$data/stories260k/reference_logits.safetensors" \
  --seeds 5 "${causal[@]}" --json "$out/stories260k.json"
# 512 positions the model wrote itself (greedy, full attention), read back through the tokenizer.
OMP_NUM_THREADS=1 "$bin" generate --model "$data/stories260k" --tokens 511 > "$out/stories260k_generated.txt"
OMP_NUM_THREADS=1 "$bin" approx --model "$data/stories260k" --text "$out/stories260k_generated.txt" \
  --seeds 5 "${causal[@]}" --json "$out/stories260k_generated.json"

# A causal character LM trained with full attention at N = 2048 (docs/training.sh's lm-full,
# checkpoint in runs/): 8 held-out windows of tiny-shakespeare (the last 10 % of the file, as the
# training task holds them out), every position predicted.
runs=${CLATTN_RUNS:-runs}
if [ -d "$runs/lm-full/best" ]; then
  echo "== causal character LM (runs/lm-full/best), N = 2048, 8 held-out windows"
  /usr/bin/python3 - "$data/tinyshakespeare/input.txt" "$runs/shakespeare_heldout_2048.safetensors" <<'PY'
import json, struct, sys
import numpy as np
text = open(sys.argv[1], "rb").read()
held = len(text) // 10
start, T = len(text) - held, 2048
ids = np.stack([np.frombuffer(text[start + w * T:start + (w + 1) * T], np.uint8) for w in range(8)]).astype(np.int32)
tgt = np.stack([np.frombuffer(text[start + w * T + 1:start + (w + 1) * T + 1], np.uint8) for w in range(8)]).astype(np.int32)
header, blobs, off = {}, [], 0
for name, a in (("tokens", ids), ("targets", tgt)):
    header[name] = {"dtype": "I32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
    off += a.nbytes
    blobs.append(a.tobytes())
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
  OMP_NUM_THREADS=2 "$bin" approx --model "$runs/lm-full/best" --token-file "$runs/shakespeare_heldout_2048.safetensors" --seeds 3 \
    --attention 'improved-clustered:clusters=25,topk=32' \
    --attention 'improved-clustered:clusters=25,topk=32,block=256' \
    --attention 'improved-clustered:clusters=25,topk=32,block=128' \
    --attention 'improved-clustered:clusters=25,topk=32,block=256,segment=256' \
    --attention 'clustered:clusters=25' \
    --attention 'topk:topk=32' \
    --attention 'local:window=256' \
    --attention 'local:window=512' \
    --attention 'smyrf:hashes=2,q_cluster=32,k_cluster=32' \
    --attention 'routing:clusters=8,centroids=ema' \
    --attention 'linear' \
    --json "$out/shakespeare_lm_2048.json"
else
  echo "== causal character LM: no $runs/lm-full/best (run docs/training.sh first); skipped"
fi
