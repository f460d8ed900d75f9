#!/usr/bin/env bash
# Regenerates the equal-budget experiments of docs/training.md: the same model trained for the
# same wall-clock budget with different attentions, then evaluated with every attention (the
# swap matrix), and the figure. Usage: bash docs/training.sh [BUILD] [BUDGET_SECONDS] [LM_BUDGET]
# (BUILD defaults to ./build, the budget to 240 s per run, the causal LM pair's to the budget;
# docs/training.md's causal LM table used 600). Runs go two at a time, one thread
# each, so that a pair shares the machine alike; logs go to docs/results/training/*.jsonl,
# checkpoints to runs/ (not committed).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build}/clattn
budget=${2:-240}
lm_budget=${3:-$budget}
data=${CLATTN_DATA:-../shared/data}
out=docs/results/training
runs=${CLATTN_RUNS:-runs}
mkdir -p "$out" "$runs"
export OMP_NUM_THREADS=1

# The model of docs/training.md: 4 layers, hidden 128, 2 heads of 64, ff 256, batch 1, AdamW. The
# schedule is long (--steps 100000) so that the learning rate is the same for every variant over
# the budget: equal time, not equal steps, decides.
common=(--layers 4 --dim 128 --heads 2 --ff 256 --steps 100000 --lr 1e-3 --warmup 50
        --threads 1 --seed 1)

run() {  # name, then train arguments
  local name=$1; shift
  rm -rf "$runs/$name" "$out/$name.jsonl"
  "$bin" train "${common[@]}" --time-budget "${run_budget:-$budget}" --checkpoint "$runs/$name" \
    --log "$out/$name.jsonl" "$@" >"$out/$name.out" 2>&1
}
mlm=(--task mlm --data "$data/tinyshakespeare/input.txt" --seq 2048 --batch 1 --eval-every 40 --eval-examples 16)
ic='improved-clustered:clusters=100,topk=32'
cl='clustered:clusters=100'
rf='reformer:rounds=1,chunk=32'

echo "== masked character LM, N = 2048, $budget s each"
run mlm-full "${mlm[@]}" --attention full &
run mlm-improved "${mlm[@]}" --attention "$ic" &
wait
run mlm-clustered "${mlm[@]}" --attention "$cl" &
run mlm-reformer "${mlm[@]}" --attention "$rf" &
wait

echo "== swap matrix: each trained model evaluated with every attention"
evals=(--attention full --attention "$ic" --attention "$cl" --attention 'improved-clustered:clusters=25,topk=32'
       --attention 'topk:topk=32' --attention 'smyrf:hashes=2,q_cluster=64,k_cluster=64' --attention 'local:window=64'
       --attention linear --eval-examples 16 --threads 2 -o json)
for m in mlm-full mlm-improved; do
  OMP_NUM_THREADS=2 "$bin" eval --checkpoint "$runs/$m" "${evals[@]}" >"$out/swap-$m.json"
done

echo "== causal character LM, N = 2048, $lm_budget s each (causal improved-clustered at its defaults)"
lm=(--task lm --data "$data/tinyshakespeare/input.txt" --seq 2048 --batch 1 --eval-every 40 --eval-examples 16)
run_budget=$lm_budget run lm-full "${lm[@]}" --attention full &
run_budget=$lm_budget run lm-improved "${lm[@]}" --attention 'improved-clustered:clusters=25,topk=32' &
wait
for m in lm-full lm-improved; do
  OMP_NUM_THREADS=2 "$bin" eval --checkpoint "$runs/$m/best" --attention full \
    --attention 'improved-clustered:clusters=25,topk=32' --attention 'local:window=256' \
    --eval-examples 16 --threads 2 -o json >"$out/swap-$m.json"
done

echo "== ListOps: trained on generated expressions, evaluated on ../shared/data/listops"
lo=(--task listops --data "$data/listops/test_d20s.tsv" --seq 1024 --min-length 1 --max-length 1024
    --batch 8 --eval-every 100 --eval-examples 300)
run listops-full "${lo[@]}" --attention full &
run listops-improved "${lo[@]}" --attention "$ic" &
wait

echo "== figures"
"$bin" plot --logs "$out"/mlm-*.jsonl --output docs/images/training_mlm.png
"$bin" plot --logs "$out"/lm-*.jsonl --output docs/images/training_lm.png
"$bin" plot --logs "$out"/listops-*.jsonl --output docs/images/training_listops.png
