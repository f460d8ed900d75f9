#!/usr/bin/env bash
# Fine-tuning a pretrained model with clattn train --init: stories260k (a LLaMA story model with its
# own tokenizer) on tiny-shakespeare, with full attention and with causal improved-clustered, and
# the held-out loss before and after. Writes docs/results/finetune/*.{json,jsonl}.
# Usage: bash docs/finetune.sh BUILD_DIR [STEPS]   (from the repository root)
set -euo pipefail
bin=${1:?usage: finetune.sh BUILD_DIR [STEPS]}/clattn
steps=${2:-1000}
data=${CLATTN_DATA:-../shared/data}
out=docs/results/finetune
runs=${FINETUNE_RUNS:-runs/finetune}
mkdir -p "$out" "$runs"
text=$data/tinyshakespeare/input.txt
# Causal clustered attention is exact within a block (default 512 = stories260k's whole context),
# so the approximate plan uses blocks of 64: positions past the first block see their prefix
# through 16 clusters of the previous segment's queries plus each query's top 32 keys.
approx='improved-clustered:clusters=16,topk=32,block=64'
common=(--task lm --data "$text" --seq 512 --batch 4 --steps "$steps" --lr 1e-3 --warmup 50 --eval-every 250
        --eval-examples 0 --threads "${THREADS:-2}")
"$bin" eval --checkpoint "$data/stories260k" --task lm --data "$text" --seq 512 --batch 4 \
  --attention full --attention "$approx" -o json --threads "${THREADS:-2}" >"$out/before.json"
for name in full improved; do
  plan=full
  [ "$name" = improved ] && plan=$approx
  rm -rf "$runs/$name"
  "$bin" train --init "$data/stories260k" "${common[@]}" --attention "$plan" --checkpoint "$runs/$name" \
    --log "$out/$name.jsonl"
  "$bin" eval --checkpoint "$runs/$name/best" --attention full --attention "$approx" -o json \
    --threads "${THREADS:-2}" >"$out/after-$name.json"
done
