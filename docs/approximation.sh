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
causal=(
  --attention 'improved-clustered:clusters=25,topk=32,block=64'
  --attention 'improved-clustered:clusters=25,topk=32,block=128'
  --attention 'improved-clustered:clusters=8,topk=16,block=64'
  --attention 'improved-clustered:clusters=8,topk=32,block=32'
  --attention 'clustered:clusters=25,block=64'
  --attention 'topk:topk=32'
  --attention 'local:window=64'
  --attention 'smyrf:hashes=2,q_cluster=32,k_cluster=32'
  --attention 'routing:clusters=8'
  --attention 'linear'
)
OMP_NUM_THREADS=1 "$bin" approx --model "$data/stories260k" --tokens "$data/stories260k/reference_logits.safetensors" \
  --seeds 5 "${causal[@]}" --json "$out/stories260k.json"
# 512 positions the model wrote itself (greedy, full attention), read back through the tokenizer.
OMP_NUM_THREADS=1 "$bin" generate --model "$data/stories260k" --tokens 511 > "$out/stories260k_generated.txt"
OMP_NUM_THREADS=1 "$bin" approx --model "$data/stories260k" --text "$out/stories260k_generated.txt" \
  --seeds 5 "${causal[@]}" --json "$out/stories260k_generated.json"
