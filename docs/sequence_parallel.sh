#!/usr/bin/env bash
# Regenerates the figures of docs/sequence-parallel.md on one machine (Open MPI over shared
# memory): bytes per layer against N for ring, clustered and improved-clustered attention, parallel
# efficiency at N = 65536 (2 ranks x 1 thread against 1 rank x 2 threads), the share of ring
# attention's transfers its compute hides, the BERT-shaped encoder's forward at N = 1,048,576
# across 4 ranks, and a training step at N = 262,144 across 4 ranks. Results go to
# docs/results/sequence-parallel/ (JSON of `clattn bench-model --json`, train logs).
# Usage: bash docs/sequence_parallel.sh [BUILD] — run it on an otherwise idle machine; it takes
# about 15 minutes on 2 cores (the ring rows compute exact attention at N = 65536: 1 minute each).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build}/clattn
data=${CLATTN_DATA:-../shared/data}
out=docs/results/sequence-parallel
mkdir -p "$out"
# As root Open MPI asks for its two consent variables; shared memory and self only.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
mpi() { local np=$1; shift; mpirun --oversubscribe -np "$np" "$@"; }
ic='improved-clustered:clusters=100,topk=32'
cl='clustered:clusters=100'
# The BERT-shaped encoder of the scale demonstration: 4 layers, hidden 256, 4 heads of 64, FFN 1024.
bert=(bench-model --random-bert --hidden 256 --heads 4 --ffn 1024)

# Bytes per layer: every layer sends the same, so one layer measures it. Ring attention computes
# exact attention (O(N²)): measured at 65536, and its formula (docs) checked against it.
mpi 4 "$bin" "${bert[@]}" --layers 1 --lengths 65536,262144,1048576 --sequence-parallel --attention "$cl" \
  --attention "$ic" --repeat 1 --threads 1 --json "$out/bytes_r4.json" | tee "$out/bytes_r4.txt"
mpi 4 "$bin" "${bert[@]}" --layers 1 --lengths 65536 --sequence-parallel --attention full --repeat 1 --threads 1 \
  --json "$out/ring_r4.json" | tee "$out/ring_r4.txt"

# Ring attention's overlap, 2 ranks of one thread, N = 65536.
mpi 2 "$bin" "${bert[@]}" --layers 1 --lengths 65536 --sequence-parallel --attention full --repeat 1 --threads 1 \
  --json "$out/ring_r2.json" | tee "$out/ring_r2.txt"

# Parallel efficiency at N = 65536, improved-clustered, 4 layers: one rank of 2 threads against two
# ranks of one thread, alternated twice.
for round in 1 2; do
  "$bin" "${bert[@]}" --layers 4 --lengths 65536 --attention "$ic" --repeat 3 --threads 2 \
    --json "$out/eff_r1_$round.json" | tee "$out/eff_r1_$round.txt"
  mpi 2 "$bin" "${bert[@]}" --layers 4 --lengths 65536 --sequence-parallel --attention "$ic" --repeat 3 --threads 1 \
    --json "$out/eff_r2_$round.json" | tee "$out/eff_r2_$round.txt"
done

# Scale: the encoder's forward at N = 1,048,576 across 4 ranks.
mpi 4 "$bin" "${bert[@]}" --layers 4 --lengths 1048576 --sequence-parallel --attention "$ic" --repeat 1 --threads 1 \
  --json "$out/scale_1m.json" | tee "$out/scale_1m.txt"

# A training step of the same model at N = 262,144 across 4 ranks (masked characters of
# tiny-shakespeare, three copies end to end so that the held-out tenth holds a window of 262,144
# bytes: a demonstration of speed and memory, not of held-out quality).
big=${TMPDIR:-/tmp}/tinyshakespeare_x3.txt
cat "$data/tinyshakespeare/input.txt" "$data/tinyshakespeare/input.txt" "$data/tinyshakespeare/input.txt" >"$big"
rm -f "$out/train_262144.jsonl"
/usr/bin/time -v -o "$out/train_262144.time" mpirun --oversubscribe -np 4 "$bin" train --task mlm \
  --data "$big" --seq 262144 --batch 1 --steps 2 --warmup 1 --eval-every 2 \
  --eval-examples 1 --layers 4 --dim 256 --heads 4 --ff 1024 --attention "$ic" --sequence-parallel --shard-optimizer \
  --threads 1 \
  --log "$out/train_262144.jsonl" 2>&1 | tee "$out/train_262144.txt"
