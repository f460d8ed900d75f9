#!/usr/bin/env bash
# Sequence parallelism under Open MPI, end to end (docs/sequence-parallel.md): `mpirun -np R
# clattn attend --sequence-parallel` writes what one process writes (o, dq, dk, dv within 1e-5 of
# the largest value) for full (ring, causal and not), clustered and improved-clustered, over R = 2,
# 3 and 4, GQA, padding and a length that does not split evenly; variants that cannot run split,
# and a bias, are refused with a message naming why. `bench-model --sequence-parallel` runs the
# encoder and the decoder's prefill split, with -o and --json rows that carry bytes_per_layer, and
# `train --sequence-parallel` (and --sequence-ranks, data parallel across groups) repeats one
# process's losses to 1e-4, while what cannot run split is refused.
# Usage: bash tests/cli/seq_parallel.sh /path/to/clattn
set -u
bin=${1:?usage: seq_parallel.sh /path/to/clattn}
source "$(dirname "$0")/lib.sh"
command -v mpirun >/dev/null || { bad "mpirun not found (scripts/install-deps.sh installs openmpi-bin)"; finish "seq_parallel: "; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMPI_MCA_rmaps_base_oversubscribe=1
mpi() { local np=$1; shift; timeout 300 mpirun --oversubscribe -np "$np" "$@"; }
compare="/usr/bin/python3 $(dirname "$0")/st_compare.py"

in=$dir/in.safetensors
padded=$dir/padded.safetensors
expect_ok "make-inputs" "$bin" make-inputs --output "$in" --batch 2 --heads 4 --kv-heads 2 --n 1000 --dim 16 --with-grad
expect_ok "make-inputs with padding" "$bin" make-inputs --output "$padded" --batch 2 --heads 2 --n 333 --dim 8 \
  --with-grad --query-lengths 333,170 --key-lengths 333,170 --seed 5

# split SPEC FILE CAUSAL NP...: one process, then each R; every tensor within 1e-5.
split() {
  local spec=$1 file=$2 causal=$3 np; shift 3
  local ref=$dir/ref.safetensors
  expect_ok "$spec one process" "$bin" attend --spec "$spec" $causal --threads 1 --input "$file" --output "$ref"
  for np in "$@"; do
    local out=$dir/sp$np.safetensors
    rm -f "$out"
    expect_ok "$spec $causal R = $np" mpi "$np" "$bin" attend --sequence-parallel --spec "$spec" $causal --threads 1 \
      --input "$file" --output "$out"
    grep -q "split over $np ranks" "$dir/err" && ok || bad "$spec R = $np: no summary line: $(head -c 300 "$dir/err")"
    # Times rounded to 2 decimals, as the one-process line has them.
    grep -Eq "forward [0-9]+\.[0-9]{2} ms(, backward [0-9]+\.[0-9]{2} ms)?, rank 0" "$dir/err" && ok ||
      bad "$spec R = $np: times not rounded: $(head -c 300 "$dir/err")"
    $compare "$ref" "$out" 1e-5 o dq dk dv >"$dir/cmp" 2>&1 && ok || bad "$spec $causal R = $np: $(cat "$dir/cmp")"
  done
}
split full "$in" "" 2 3 4
split full "$in" --causal 2 3
split full "$padded" --causal 2
split clustered:clusters=10 "$in" "" 2 3
split improved-clustered:clusters=10,topk=16 "$in" "" 2 4
split improved-clustered:clusters=6,topk=8 "$padded" "" 3

# Refusals: a variant without a split form, causal clustering, a bias.
expect_error "local refused" "does not run with the sequence split" mpi 2 "$bin" attend --sequence-parallel --spec local:window=8 --input "$in" \
  --output "$dir/x.safetensors"
expect_error "causal clustered refused" "causal" mpi 2 "$bin" attend --sequence-parallel --spec clustered:clusters=4 --causal \
  --input "$in" --output "$dir/x.safetensors"
expect_ok "make-inputs with bias" "$bin" make-inputs --output "$dir/bias.safetensors" --n 64 --dim 8 --with-bias
expect_error "bias refused" "bias" mpi 2 "$bin" attend --sequence-parallel --spec full --input "$dir/bias.safetensors" \
  --output "$dir/x.safetensors"
[ -e "$dir/x.safetensors" ] && bad "a refused run wrote its output" || ok

# The overflow rule and the input checks hold for the whole sequence: a value, dout row or NaN in
# rank 1's rows alone is refused by every rank, with the message one process gives (no rank waits
# forever for a peer that refused).
scale="/usr/bin/python3 $(dirname "$0")/st_scale.py"
big=$dir/big.safetensors
expect_ok "make-inputs 301" "$bin" make-inputs --output "$dir/in301.safetensors" --heads 2 --n 301 --dim 16 --with-grad
for spec in clustered:clusters=3 improved-clustered:clusters=3,topk=4 full; do
  $scale "$dir/in301.safetensors" "$big" v:200:1e36
  expect_error "$spec: one process, huge v" "value-sum bound" "$bin" attend --spec "$spec" --input "$big" --output "$dir/x.safetensors"
  expect_error "$spec: R = 2, huge v on rank 1" "value-sum bound" mpi 2 "$bin" attend --sequence-parallel --spec "$spec" \
    --input "$big" --output "$dir/x.safetensors"
  [ "$(grep -c 'value-sum bound' "$dir/err")" -ge 2 ] && ok || bad "$spec: not every rank named the bound: $(head -c 600 "$dir/err")"
  $scale "$dir/in301.safetensors" "$big" do:200:1e35
  expect_error "$spec: R = 2, huge dout on rank 1" "gradient-sum bound" mpi 2 "$bin" attend --sequence-parallel --spec "$spec" \
    --input "$big" --output "$dir/x.safetensors"
done
$scale "$dir/in301.safetensors" "$big" q:200:nan
expect_error "R = 2, NaN on rank 1" "rank 1 refused the call" mpi 2 "$bin" attend --sequence-parallel --spec clustered:clusters=3 \
  --input "$big" --output "$dir/x.safetensors"
[ -e "$dir/x.safetensors" ] && bad "a refused run wrote its output" || ok

# bench-model: the encoder split over the ranks; its rows carry the ranks and the bytes per layer.
bm=("$bin" bench-model --random-bert --layers 2 --hidden 32 --heads 2 --ffn 64 --lengths 512 --repeat 1 --threads 1)
expect_ok "bench-model split" mpi 2 "${bm[@]}" --sequence-parallel --attention full \
  --attention 'improved-clustered:clusters=8,topk=8' --json "$dir/bm.json" -o csv
head -1 "$dir/out" | grep -q '^attention,mode,n,batch,ranks,ms_median' && ok || bad "bench-model -o csv header: $(head -1 "$dir/out")"
[ "$(grep -c '^"improved-clustered\|^full' "$dir/out")" = 2 ] && ok || bad "bench-model -o csv rows: $(cat "$dir/out")"
/usr/bin/python3 - "$dir/bm.json" >"$dir/cmp" 2>&1 <<'PY' && ok || bad "bench-model --json: $(cat "$dir/cmp")"
import json, sys
rows = json.load(open(sys.argv[1]))["results"]
assert len(rows) == 2, rows
full, ic = rows
assert full["ranks"] == 2 and ic["ranks"] == 2, rows
# ring attention sends K and V (and their rows' log-sum-exp terms) around: at least the other
# rank's K/V per layer; clustered attention sends per-cluster sums, independent of N.
assert full["bytes_per_layer"] >= 2 * 256 * 32 * 4, full
assert 0 < ic["bytes_per_layer"] < full["bytes_per_layer"], rows
assert full["peak_rss_mb_per_rank"] > 0, full
PY
expect_ok "bench-model decoder prefill split" mpi 2 "$bin" bench-model --model "$data/stories260k" --lengths 64 \
  --repeat 1 --threads 1 --sequence-parallel -o jsonl
[ "$(grep -c '"mode":"prefill"' "$dir/out")" = 1 ] && ok || bad "split decoder: expected one prefill row: $(cat "$dir/out")"
grep -q 'decoding after a split prefill' "$dir/err" && ok || bad "split decoder: no note on decode: $(cat "$dir/err")"
expect_error "bench-model under mpirun without --sequence-parallel" "sequence-parallel" mpi 2 "${bm[@]}"

# Ranks started with different commands or inputs end together, naming what differs, before any
# collective (other lengths corrupted the heap; other specs hung; other inputs gave one output).
mpmd() { timeout 120 mpirun --oversubscribe -np 1 "$@"; }
bmr=(bench-model --random-bert --layers 1 --repeat 1 --threads 1 --sequence-parallel)
expect_error "bench-model ranks with other lengths" "the ranks were started with different command line: rank(s) 1" \
  mpmd "$bin" "${bmr[@]}" --lengths 256 : -np 1 "$bin" "${bmr[@]}" --lengths 512
expect_error "attend ranks with other specs" "different command line" \
  mpmd "$bin" attend --sequence-parallel --spec full --threads 1 --input "$in" --output "$dir/a.safetensors" : \
  -np 1 "$bin" attend --sequence-parallel --spec clustered:clusters=3 --threads 1 --input "$in" --output "$dir/a.safetensors"
# The same command line in two folders whose in.safetensors differ (as on two nodes).
mkdir -p "$dir/r0" "$dir/r1" && cp "$in" "$dir/r0/in.safetensors"
expect_ok "make-inputs other values" "$bin" make-inputs --output "$dir/r1/in.safetensors" --batch 2 --heads 4 --kv-heads 2 \
  --n 1000 --dim 16 --with-grad --seed 9
at=(attend --sequence-parallel --spec full --threads 1 --input in.safetensors --output out.safetensors)
expect_error "attend ranks with other input files" "different --input: rank(s) 1" \
  mpmd --wdir "$dir/r0" "$(readlink -f "$bin")" "${at[@]}" : -np 1 --wdir "$dir/r1" "$(readlink -f "$bin")" "${at[@]}"

# train: one sequence split over the ranks gives one process's losses (to rounding), alone and
# with data parallelism across groups of ranks; what cannot run split is refused.
text=$dir/text.txt
for i in $(seq 1 600); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7 % 13))"; done >"$text"
lm=(train --task lm --data "$text" --layers 2 --dim 16 --heads 2 --ff 32 --seq 96 --eval-examples 8 --warmup 2
    --threads 1 --batch 4 --steps 4 --eval-every 2)
mlm=(train --task mlm --data "$text" --layers 2 --dim 16 --heads 2 --ff 32 --seq 96 --eval-examples 8 --warmup 2
     --threads 1 --batch 4 --steps 4 --eval-every 2 --attention 'improved-clustered:clusters=6,topk=8')
figures() { grep -o '"eval_loss":[^,]*\|"grad_norm":[^,]*\|"loss":[^,]*' "$1" | cut -d: -f2; }
# close A B: the same number of figures, each within 1e-4 relative
close() {
  paste <(figures "$1") <(figures "$2") | awk 'BEGIN { n = 0; bad = 0 }
    { n++; d = $1 - $2; if (d < 0) d = -d; s = $2 < 0 ? -$2 : $2; if (d > 1e-4 * (s > 1 ? s : 1)) bad++ }
    END { exit !(n >= 8 && bad == 0) }'
}
for task in lm mlm; do
  eval "run=(\"\${$task[@]}\")"
  expect_ok "train $task one process" "$bin" "${run[@]}" --log "$dir/$task-1.jsonl"
  expect_ok "train $task split over 2" mpi 2 "$bin" "${run[@]}" --sequence-parallel --log "$dir/$task-2.jsonl"
  close "$dir/$task-1.jsonl" "$dir/$task-2.jsonl" && ok || bad "train $task split over 2: the losses differ: $(paste <(figures "$dir/$task-1.jsonl") <(figures "$dir/$task-2.jsonl") | head -5)"
  grep -q '"sequence_ranks":2' "$dir/$task-2.jsonl" && ok || bad "train $task: the log does not record sequence_ranks"
done
expect_ok "train mlm, 2 groups of 2" mpi 4 "$bin" "${mlm[@]}" --sequence-ranks 2 --log "$dir/mlm-4.jsonl"
close "$dir/mlm-1.jsonl" "$dir/mlm-4.jsonl" && ok || bad "train mlm 2 x 2: the losses differ"
expect_error "split with --reproducible" "reproducible" mpi 2 "$bin" "${lm[@]}" --sequence-parallel --reproducible
expect_error "split with dropout" "dropout" mpi 2 "$bin" "${lm[@]}" --sequence-parallel --dropout 0.1
expect_error "--sequence-ranks not dividing" "divide" mpi 2 "$bin" "${lm[@]}" --sequence-ranks 3
expect_error "causal clustering split" "cannot run with the sequence split" mpi 2 "$bin" "${lm[@]}" --sequence-parallel \
  --attention 'clustered:clusters=4'

finish "seq_parallel: "
