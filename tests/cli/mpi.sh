#!/usr/bin/env bash
# Data-parallel training under Open MPI, end to end (docs/distributed.md): `mpirun -np R clattn
# train` over shared memory on this machine gives the single process's losses, gradient norms and
# checkpoints bit for bit for R = 2, 3 (an uneven split of the batch) and 4, with the optimizer
# sharded (ZeRO-1) or not (--reproducible); a run resumes with another R; the all-reduce path
# (the default) repeats itself run to run; a rank killed with SIGKILL ends the whole job within 30 s, and the
# run resumes from its last checkpoint with the losses of an uninterrupted run; ranks started with
# different options end at start-up naming the option; a rank stopped with SIGSTOP ends the job
# through its peer's progress watchdog.
# Usage: bash tests/cli/mpi.sh /path/to/clattn
set -u
bin=${1:?usage: mpi.sh /path/to/clattn}
source "$(dirname "$0")/lib.sh"
command -v mpirun >/dev/null || { bad "mpirun not found (scripts/install-deps.sh installs openmpi-bin)"; finish "mpi: "; }
# As root (CI) Open MPI asks for its two consent variables; shared memory and self only.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMPI_MCA_rmaps_base_oversubscribe=1
mpi() { local np=$1; shift; timeout 300 mpirun --oversubscribe -np "$np" "$@"; }

text=$dir/text.txt
for i in $(seq 1 1500); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7 % 13))"; done >"$text"
model=(train --task lm --data "$text" --layers 2 --dim 16 --heads 2 --ff 32 --seq 64 --eval-examples 8 --warmup 2
       --threads 1 --attention 'improved-clustered:clusters=4,topk=8,block=16')
run=("${model[@]}" --batch 4 --steps 6 --eval-every 3 --reproducible)
# figures LOG: every step's loss and gradient norm and every evaluation's loss, exactly as logged
figures() { grep -o '"eval_loss":[^,]*\|"grad_norm":[^,]*\|"loss":[^,]*' "$1"; }
same_files() {  # WHAT DIR_A DIR_B: model and optimizer state bit for bit
  local what=$1 f
  for f in latest/model.safetensors latest/optimizer.safetensors best/model.safetensors; do
    cmp -s "$2/$f" "$3/$f" && ok || bad "$what: $f differs"
  done
}

expect_ok "R = 1" "$bin" "${run[@]}" --checkpoint "$dir/r1" --log "$dir/r1.jsonl"
figures "$dir/r1.jsonl" >"$dir/f1"
[ "$(wc -l <"$dir/f1")" = 14 ] && ok || bad "R = 1 logged $(wc -l <"$dir/f1") figures, expected 14"
for np in 2 3 4; do
  expect_ok "R = $np" mpi "$np" "$bin" "${run[@]}" --checkpoint "$dir/r$np" --log "$dir/r$np.jsonl"
  figures "$dir/r$np.jsonl" | cmp -s - "$dir/f1" && ok || bad "R = $np: the losses differ from R = 1"
  same_files "R = $np" "$dir/r1" "$dir/r$np"
  grep -q "\"ranks\":$np" "$dir/r$np.jsonl" && ok || bad "R = $np: the log does not record the ranks"
  grep '"comm_ms":' "$dir/r$np.jsonl" | grep -q '"comm_exposed_ms":' && ok || bad "R = $np: the log has no comm_ms, comm_exposed_ms"
done
expect_ok "R = 2, ZeRO-1" mpi 2 "$bin" "${run[@]}" --shard-optimizer --checkpoint "$dir/z2" --log "$dir/z2.jsonl"
figures "$dir/z2.jsonl" | cmp -s - "$dir/f1" && ok || bad "ZeRO-1: the losses differ from R = 1"
same_files "ZeRO-1" "$dir/r1" "$dir/z2"
expect_ok "R = 2, --no-overlap" mpi 2 "$bin" "${run[@]}" --no-overlap --log "$dir/no.jsonl"
figures "$dir/no.jsonl" | cmp -s - "$dir/f1" && ok || bad "--no-overlap: the losses differ from R = 1"
expect_ok "R = 1, --accum 4" "$bin" "${run[@]}" --accum 4 --checkpoint "$dir/a4" --log "$dir/a4.jsonl"
figures "$dir/a4.jsonl" | cmp -s - "$dir/f1" && ok || bad "--accum 4: the losses differ from R = 1"

# Resume with another number of ranks (and the optimizer sharded, then not).
expect_ok "stop after one step, R = 3, ZeRO-1" mpi 3 "$bin" "${run[@]}" --shard-optimizer --time-budget 1e-9 \
  --checkpoint "$dir/rs" --log "$dir/rs.jsonl"
expect_ok "resume with R = 2" mpi 2 "$bin" "${run[@]}" --resume --checkpoint "$dir/rs" --log "$dir/rs.jsonl"
grep -v '"eval_loss".*"step":1[,}]' "$dir/rs.jsonl" >"$dir/rs2.jsonl"
figures "$dir/rs2.jsonl" | sort -u | cmp -s - <(sort -u "$dir/f1") && ok || bad "resume with another R: the losses differ"
same_files "resume with another R" "$dir/r1" "$dir/rs"

# The all-reduce path: the same bits run to run for one R.
fast=("${model[@]}" --batch 4 --steps 6 --eval-every 3)
expect_ok "all-reduce, run 1" mpi 2 "$bin" "${fast[@]}" --log "$dir/n1.jsonl"
expect_ok "all-reduce, run 2" mpi 2 "$bin" "${fast[@]}" --log "$dir/n2.jsonl"
cmp -s <(figures "$dir/n1.jsonl") <(figures "$dir/n2.jsonl") && ok || bad "the all-reduce path differs run to run"
expect_ok "all-reduce, --accum 2, ZeRO-1" mpi 2 "$bin" "${fast[@]}" --accum 2 --shard-optimizer --log "$dir/n3.jsonl"
grep -q '"loss"' "$dir/n3.jsonl" && ok || bad "--accum 2 with ZeRO-1 logged no step"

# A rank killed with SIGKILL: the job ends (mpirun names the rank), never hangs; resume repeats
# the uninterrupted run's losses.
long=("${model[@]}" --batch 4 --steps 400 --eval-every 40 --reproducible)
expect_ok "reference, R = 1" "$bin" "${long[@]}" --log "$dir/ref.jsonl"
mpi 2 "$bin" "${long[@]}" --checkpoint "$dir/k" --log "$dir/k.jsonl" >"$dir/k.out" 2>&1 &
job=$!
for _ in $(seq 1 3000); do [ -f "$dir/k/latest/train_state.json" ] && break; sleep 0.01; done
victim=""
for p in $(pgrep -f -- "--checkpoint $dir/k"); do
  grep -qa OMPI_COMM_WORLD_RANK=1 "/proc/$p/environ" 2>/dev/null && victim=$p
done
t0=$SECONDS
if [ -n "$victim" ]; then
  kill -9 "$victim"
  wait "$job"
  rc=$?
  [ "$rc" -ne 0 ] && [ $((SECONDS - t0)) -le 30 ] && ok || bad "killed rank: exit $rc after $((SECONDS - t0)) s"
  grep -q "rank 1" "$dir/k.out" && ok || bad "killed rank: mpirun's message does not name it: $(tail -5 "$dir/k.out")"
else
  wait "$job"
  bad "killed rank: no rank 1 of the run was found to kill (the run ended, or never wrote its first checkpoint): $(tail -3 "$dir/k.out")"
fi
expect_ok "resume after the kill" mpi 2 "$bin" "${long[@]}" --resume --checkpoint "$dir/k" --log "$dir/k.jsonl"
# "step loss" of every training line (keys are written sorted: loss before step)
step_losses() { grep '"loss"' "$1" | sed -E 's/.*"loss":([^,]*),.*"step":([0-9]+).*/\2 \1/' | sort -u; }
step_losses "$dir/k.jsonl" >"$dir/kl"
step_losses "$dir/ref.jsonl" >"$dir/rl"
[ -z "$(comm -13 "$dir/rl" "$dir/kl")" ] && [ "$(wc -l <"$dir/kl")" -ge 400 ] && ok ||
  bad "resume after the kill: losses differ from the uninterrupted run: $(comm -13 "$dir/rl" "$dir/kl" | head -2)"

# Ranks started with different options or data (mpirun's MPMD form: one command per rank) end at
# start-up on every rank, naming the option, instead of hanging or training diverging copies.
base=(train --task lm --layers 2 --dim 16 --heads 2 --ff 32 --seq 64 --eval-examples 8 --warmup 2 --threads 1
      --batch 4 --eval-every 3)
# refused WHAT NEEDLE CMD...: CMD exits non-zero and its stderr has NEEDLE (both ranks call
# MPI_Abort, and mpirun's own exit status then depends on which abort it saw first)
refused() {
  local what=$1 needle=$2; shift 2
  "$@" >"$dir/out" 2>"$dir/err"
  local rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -qi -- "$needle" "$dir/err"; then ok
  else bad "$what: exit $rc, stderr: $(head -c 600 "$dir/err")"; fi
}
# mpmd "RANK 0 OPTIONS" "RANK 1 OPTIONS" (words without spaces)
# shellcheck disable=SC2086  # the options split into words
mpmd() { timeout 120 mpirun --oversubscribe -np 1 "$bin" "${base[@]}" $1 : -np 1 "$bin" "${base[@]}" $2; }
cp "$text" "$dir/text2.txt"
echo "one more line" >>"$dir/text2.txt"
refused "ranks with different --lr" "started with different lr: rank(s) 1 differ" \
  mpmd "--data $text --lr 1e-3" "--data $text --lr 2e-3"
refused "ranks with different --steps" "different steps" mpmd "--data $text --steps 6" "--data $text --steps 7"
refused "ranks with different --data" "different data" mpmd "--data $text" "--data $dir/text2.txt"
refused "ranks with different --attention" "different attention" \
  mpmd "--data $text" "--data $text --attention local:window=8"
refused "ranks with and without --reproducible" "different reproducible" \
  mpmd "--data $text" "--data $text --reproducible"
# What the ranks loaded is compared once loaded: under --reproducible the GEMM kernel (a rank on
# another OpenBLAS core changed the losses in the 10th digit without a word).
refused "--reproducible ranks on other GEMM kernels" "different GEMM kernel (--reproducible)" \
  timeout 120 mpirun --oversubscribe -np 1 env OPENBLAS_CORETYPE=Prescott "$bin" "${base[@]}" --data "$text" --reproducible \
  : -np 1 "$bin" "${base[@]}" --data "$text" --reproducible

# A rank stopped with SIGSTOP: its peer's progress watchdog (--comm-timeout) ends the job with a
# message naming the stalled exchange, instead of spinning for ever.
endless=("${model[@]}" --batch 4 --steps 100000000 --eval-every 100000000)
mpi 2 "$bin" "${endless[@]}" --comm-timeout 3 --log "$dir/w.jsonl" >"$dir/w.out" 2>&1 &
job=$!
for _ in $(seq 1 3000); do grep -q '"loss"' "$dir/w.jsonl" 2>/dev/null && break; sleep 0.01; done
victim=""
for p in $(pgrep -f -- "--log $dir/w.jsonl"); do
  grep -qa OMPI_COMM_WORLD_RANK=1 "/proc/$p/environ" 2>/dev/null && victim=$p
done
if [ -n "$victim" ]; then
  kill -STOP "$victim"
  t0=$SECONDS
  wait "$job"
  rc=$?
  kill -9 "$victim" 2>/dev/null
  [ "$rc" -ne 0 ] && [ $((SECONDS - t0)) -le 60 ] && ok || bad "stopped rank: exit $rc after $((SECONDS - t0)) s"
  grep -q "no progress for .* s waiting in" "$dir/w.out" && ok || bad "stopped rank: no watchdog message: $(tail -5 "$dir/w.out")"
else
  wait "$job"
  bad "stopped rank: no rank 1 process found to stop"
fi
expect_exit 2 "--comm-timeout -1" "comm-timeout must be" "$bin" "${fast[@]}" --comm-timeout -1
CLATTN_COMM_TIMEOUT=soon expect_exit 0 "CLATTN_COMM_TIMEOUT=soon: warned, default kept" "CLATTN_COMM_TIMEOUT='soon' is not" \
  mpi 2 "$bin" "${fast[@]}"

# Errors: every rank refuses the same way, and the job exits non-zero.
expect_exit 1 "batch smaller than the ranks" "cannot be split" mpi 3 "$bin" "${model[@]}" --batch 2 --steps 2
finish "mpi: "
