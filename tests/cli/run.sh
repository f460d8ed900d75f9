#!/usr/bin/env bash
# End-to-end checks of the clattn CLI: attend round trips (forward only, forward + backward, masks
# and bias) and every error path exits non-zero with a message, never a crash (exit >= 128 is a
# signal). Exit codes: 0 success, 1 runtime error, 2 usage error (expect_exit checks the exact one).
# Needs only bash and coreutils: inputs come from `clattn make-inputs` or are written by hand below.
# Usage: bash tests/cli/run.sh /path/to/clattn
set -u
bin=${1:?usage: run.sh /path/to/clattn}
source "$(dirname "$0")/lib.sh"
# header_of FILE: the JSON header of a safetensors file (8-byte little-endian length, then JSON)
header_of() {
  local n
  n=$(od -An -t u8 -N8 "$1" | tr -d ' ')
  tail -c +9 "$1" | head -c "$n"
}
# expect_tensors DESCRIPTION FILE NAMES...: the file holds exactly these tensors (and metadata)
expect_tensors() {
  local what=$1 file=$2; shift 2
  local got want
  got=$(header_of "$file" | grep -o '"[a-z_]*":{' | cut -d'"' -f2 | grep -vx __metadata__ | sort | tr '\n' ' ')
  want=$(printf '%s\n' "$@" | sort | tr '\n' ' ')
  [ "$got" = "$want" ] && ok || bad "$what: tensors '$got', expected '$want'"
}
# st_file FILE HEADER NBYTES: a hand-made safetensors file with NBYTES of zero data.
st_file() {
  local file=$1 header=$2 nbytes=$3 n=${#2} i hex=""
  for i in 0 1 2 3 4 5 6 7; do hex+=$(printf '\\x%02x' $(((n >> (8 * i)) & 255))); done
  { printf "$hex"; printf '%s' "$header"; head -c "$nbytes" /dev/zero; } >"$file"
}
# entry NAME DTYPE SHAPE BEGIN END: one header entry
entry() { printf '"%s":{"dtype":"%s","shape":[%s],"data_offsets":[%d,%d]}' "$@"; }

in=$dir/in.safetensors       # with do: forward and backward
fwd=$dir/fwd.safetensors     # without do: forward only
masked=$dir/masked.safetensors
expect_ok "make-inputs with grad" "$bin" make-inputs --output "$in" --batch 2 --heads 4 --kv-heads 2 --n 70 --m 90 --dim 16 --with-grad
grep -q "make-inputs: wrote $in: q (2, 4, 70, 16), k (2, 2, 90, 16), v (2, 2, 90, 16), do (2, 4, 70, 16)$" "$dir/err" && ok || bad "make-inputs summary line: $(cat "$dir/err")"
expect_ok "make-inputs forward only" "$bin" make-inputs --output "$fwd" --batch 1 --heads 2 --n 33 --dim 8 --seed 3
expect_ok "make-inputs masks and bias" "$bin" make-inputs --output "$masked" --batch 2 --heads 2 --n 40 --m 50 --dim 8 --with-grad --with-bias --query-lengths 40,17 --key-lengths 50,9
expect_tensors "make-inputs writes q, k, v, do" "$in" q k v do
expect_tensors "make-inputs writes lengths and bias" "$masked" q k v do bias query_lengths key_lengths

expect_ok "attend forward only" "$bin" attend --spec full --input "$fwd" --output "$dir/o_fwd.safetensors"
grep -q "attend: full on q (1, 2, 33, 8)" "$dir/err" && ok || bad "summary line: $(cat "$dir/err")"
expect_tensors "forward only writes o" "$dir/o_fwd.safetensors" o
expect_ok "attend full fwd+bwd" "$bin" attend --spec full --input "$in" --output "$dir/out.safetensors"
expect_tensors "fwd+bwd writes o, dq, dk, dv" "$dir/out.safetensors" o dq dk dv
header_of "$dir/out.safetensors" | grep -q '"shape":\[2,4,70,16\]' && ok || bad "o is not (2, 4, 70, 16)"
expect_ok "attend full causal" "$bin" attend --spec full:scale=0.2 --causal --input "$in" --output "$dir/out2.safetensors"
expect_ok "attend masks and bias" "$bin" attend --spec full --causal --input "$masked" --output "$dir/out_m.safetensors"
expect_ok "attend improved-clustered" "$bin" attend --spec improved-clustered:clusters=5,topk=4 --threads 2 --input "$in" --output "$dir/out3.safetensors"
expect_ok "attend improved-clustered again" "$bin" attend --spec improved-clustered:clusters=5,topk=4 --threads 2 --input "$in" --output "$dir/out4.safetensors"
cmp -s "$dir/out3.safetensors" "$dir/out4.safetensors" && ok || bad "same spec, seed and input gave different outputs"
ls "$dir" | grep -q '\.tmp\.' && bad "temporary file left behind" || ok

# One build, every ISA: the kernels' ISA is forced by CLATTN_ISA and refused by name when unknown
# or missing from this CPU; every ISA the CPU runs gives the same attend output (within the
# tolerance of the double reference, checked by st_compare.py); a user's OPENBLAS_CORETYPE naming
# kernels this CPU cannot run is replaced (OpenBLAS itself would die with SIGILL on the first
# product), and --version names the CPU, ISA, GEMM kernel and threads.
expect_ok "version names the machine" "$bin" --version
grep -q "ISA avx" "$dir/out" && grep -q "kernel, [0-9]* threads" "$dir/out" && grep -q "^Products: .*register tiles" "$dir/out" && ok || bad "--version: $(cat "$dir/out")"
expect_error "CLATTN_ISA unknown" "CLATTN_ISA=sse9 is not an instruction set" env CLATTN_ISA=sse9 "$bin" variants
expect_ok "CLATTN_ISA in capitals" env CLATTN_ISA=AVX2 "$bin" variants
# --version alone prints the version and the machine with a refused ISA, the reason in its place.
expect_ok "--version with a refused CLATTN_ISA" env CLATTN_ISA=sse9 "$bin" --version
grep -q "^clattn " "$dir/out" && grep -q "ISA none (CLATTN_ISA=sse9 is not an instruction set" "$dir/out" && ok || bad "--version under CLATTN_ISA=sse9: $(cat "$dir/out")"
isas=$("$bin" --version | grep -o 'ISA [a-z0-9]*' | head -n 1)
if grep -qw avx512f /proc/cpuinfo; then isa_list="avx2 avx512"; else
  isa_list="avx2"
  expect_error "CLATTN_ISA=avx512 without AVX-512" "lacks" env CLATTN_ISA=avx512 "$bin" variants
  expect_ok "OPENBLAS_CORETYPE=SkylakeX without AVX-512" env OPENBLAS_CORETYPE=SkylakeX "$bin" attend --spec full --input "$in" --output "$dir/o_skx.safetensors"
  /usr/bin/python3 "$(dirname "$0")/st_compare.py" "$dir/o_skx.safetensors" "$dir/out.safetensors" 1e-5 && ok || bad "OPENBLAS_CORETYPE=SkylakeX changed the output"
  env OPENBLAS_CORETYPE=SkylakeX "$bin" --version | grep -q "OPENBLAS_CORETYPE=SkylakeX needs an ISA this CPU lacks" && ok || bad "the replaced OPENBLAS_CORETYPE is not reported"
fi
# The Bulldozer family's kernels use AMD's FMA4 (no Intel CPU, no Zen): named on a CPU without it,
# each is replaced, said once with the feature it lacks, and the products stay right.
if ! grep -qw fma4 /proc/cpuinfo; then
  for core in Bulldozer Piledriver Steamroller Excavator; do
    expect_ok "OPENBLAS_CORETYPE=$core without FMA4" env OPENBLAS_CORETYPE=$core "$bin" attend --spec full --input "$in" --output "$dir/o_fma4.safetensors"
    /usr/bin/python3 "$(dirname "$0")/st_compare.py" "$dir/o_fma4.safetensors" "$dir/out.safetensors" 1e-5 && ok || bad "OPENBLAS_CORETYPE=$core changed the output"
    env OPENBLAS_CORETYPE=$core "$bin" --version | grep -q "OPENBLAS_CORETYPE=$core needs an ISA this CPU lacks (FMA4), replaced" && ok || bad "OPENBLAS_CORETYPE=$core: $(env OPENBLAS_CORETYPE=$core "$bin" --version 2>&1)"
  done
fi
env OPENBLAS_CORETYPE=bogus "$bin" --version >"$dir/v_bogus" 2>&1
grep -q "OPENBLAS_CORETYPE=bogus is not a kernel of OpenBLAS, replaced" "$dir/v_bogus" && ! grep -q "kept" "$dir/v_bogus" && ok || bad "OPENBLAS_CORETYPE=bogus: $(cat "$dir/v_bogus")"
for isa in $isa_list; do
  expect_ok "attend under CLATTN_ISA=$isa" env CLATTN_ISA=$isa "$bin" attend --spec improved-clustered:clusters=5,topk=4 --threads 2 --input "$in" --output "$dir/o_$isa.safetensors"
  /usr/bin/python3 "$(dirname "$0")/st_compare.py" "$dir/o_$isa.safetensors" "$dir/out3.safetensors" 1e-5 && ok || bad "CLATTN_ISA=$isa output differs ($isas is the default)"
done

# Broken files: each is refused with a message, never a crash.
expect_exit 1 "missing input (runtime error)" "cannot open" "$bin" attend --spec full --input "$dir/nope.safetensors" --output "$dir/x.safetensors"
head -c 1000 "$in" >"$dir/trunc.safetensors"
expect_error "truncated input" "safetensors" "$bin" attend --spec full --input "$dir/trunc.safetensors" --output "$dir/x.safetensors"
printf '\xff\xff\xff\xff\xff\xff\xff\x7f{}' >"$dir/lying.safetensors"
expect_error "absurd header length" "header length" "$bin" attend --spec full --input "$dir/lying.safetensors" --output "$dir/x.safetensors"
: >"$dir/empty.safetensors"
expect_error "empty file" "safetensors" "$bin" attend --spec full --input "$dir/empty.safetensors" --output "$dir/x.safetensors"
expect_error "missing tensor" "no tensor 'q'" "$bin" attend --spec full --input "$dir/out.safetensors" --output "$dir/x.safetensors"

# Hand-made inputs, q, k, v of shape (1, 1, 2, 4) (32 bytes each) plus one wrong tensor.
kv="$(entry k F32 1,1,2,4 32 64),$(entry v F32 1,1,2,4 64 96)"
st_file "$dir/h_ok.safetensors" "{$(entry q F32 1,1,2,4 0 32),$kv,$(entry key_lengths I32 1 96 100),$(entry bias F32 2,2 100 116)}" 116
expect_ok "hand-made input with lengths and bias" "$bin" attend --spec full --input "$dir/h_ok.safetensors" --output "$dir/h_out.safetensors"
st_file "$dir/h1.safetensors" "{$(entry q F32 1,2,4 0 32),$kv}" 96
expect_error "q of rank 3" "'q' must have rank 4" "$bin" attend --spec full --input "$dir/h1.safetensors" --output "$dir/x.safetensors"
st_file "$dir/h2.safetensors" "{$(entry q I32 1,1,2,4 0 32),$kv}" 96
expect_error "q of dtype I32" "I32" "$bin" attend --spec full --input "$dir/h2.safetensors" --output "$dir/x.safetensors"
st_file "$dir/h3.safetensors" "{$(entry q F32 1,1,2,4 0 32),$kv,$(entry key_lengths F32 1 96 100)}" 100
expect_error "key_lengths of dtype F32" "key_lengths" "$bin" attend --spec full --input "$dir/h3.safetensors" --output "$dir/x.safetensors"
st_file "$dir/h4.safetensors" "{$(entry q F32 1,1,2,4 0 32),$kv,$(entry query_lengths I32 1,1 96 100)}" 100
expect_error "query_lengths of rank 2" "must be I32 \[B\]" "$bin" attend --spec full --input "$dir/h4.safetensors" --output "$dir/x.safetensors"
st_file "$dir/h5.safetensors" "{$(entry q F32 1,1,2,4 0 32),$kv,$(entry bias F32 4 96 112)}" 112
expect_error "bias of rank 1" "'bias' must have rank 2" "$bin" attend --spec full --input "$dir/h5.safetensors" --output "$dir/x.safetensors"
st_file "$dir/h6.safetensors" "{$(entry q F32 1,1,2,4 0 32),$kv,$(entry do F32 1,1,2 96 104)}" 104
expect_error "do of rank 3" "'do' must have rank 4" "$bin" attend --spec full --input "$dir/h6.safetensors" --output "$dir/x.safetensors"

# Bad specs and inputs the attention itself refuses.
expect_error "bad spec" "unknown attention" "$bin" attend --spec fulll --input "$in" --output "$dir/x.safetensors"
expect_error "bad spec before bad file" "unknown attention" "$bin" attend --spec fulll --input "$dir/nope.safetensors" --output "$dir/x.safetensors"
expect_error "bad parameter" "unknown parameter" "$bin" attend --spec full:foo=1 --input "$in" --output "$dir/x.safetensors"
expect_error "out-of-range parameter" "must be in" "$bin" attend --spec full:scale=-1 --input "$in" --output "$dir/x.safetensors"
expect_error "malformed spec" "empty parameter" "$bin" attend --spec full:,scale=1 --input "$in" --output "$dir/x.safetensors"
expect_ok "clustered causal" "$bin" attend --spec clustered:clusters=3,block=16 --causal --input "$in" --output "$dir/x.safetensors"
expect_error "bias refused" "bias" "$bin" attend --spec clustered:clusters=3 --input "$masked" --output "$dir/x.safetensors"
# make-inputs refuses lengths out of [0, N] / [0, M] (usage errors); attend still refuses a file
# that has them (hand-made: key_lengths = 3 for M = 2).
expect_exit 2 "make-inputs key length beyond M" "--key-lengths value 2 (12) must be in \[0, 8\]" "$bin" make-inputs --output "$dir/long.safetensors" --batch 2 --heads 2 --n 8 --dim 4 --key-lengths 8,12
expect_exit 2 "make-inputs query length beyond N" "--query-lengths value 1 (70) must be in \[0, 64\]" "$bin" make-inputs --output "$dir/long.safetensors" --batch 2 --n 64 --query-lengths 70,-3
expect_exit 2 "make-inputs negative query length" "--query-lengths value 2 (-3)" "$bin" make-inputs --output "$dir/long.safetensors" --batch 2 --n 64 --query-lengths 10,-3
[ -e "$dir/long.safetensors" ] && bad "make-inputs wrote a file it refused" || ok
st_file "$dir/h_long.safetensors" "{$(entry q F32 1,1,2,4 0 32),$kv,$(entry key_lengths I32 1 96 100)}" 96
printf '\x03\x00\x00\x00' >>"$dir/h_long.safetensors"
expect_error "key length beyond M" "key_lengths" "$bin" attend --spec full --input "$dir/h_long.safetensors" --output "$dir/x.safetensors"
expect_error "make-inputs bad sizes" "heads" "$bin" make-inputs --output "$dir/x.safetensors" --heads 6 --kv-heads 4
expect_error "make-inputs lengths per batch" "one value per batch item" "$bin" make-inputs --output "$dir/x.safetensors" --batch 3 --key-lengths 1,2
expect_exit 2 "make-inputs absurd size" "--n must be in" "$bin" make-inputs --output "$dir/x.safetensors" --n 99999999999
expect_exit 2 "make-inputs huge tensor" "elements" "$bin" make-inputs --output "$dir/x.safetensors" --batch 100000 --n 100000
expect_exit 2 "missing --spec" "--spec" "$bin" attend --input "$in" --output "$dir/x.safetensors"
expect_exit 2 "--output is --input" "is the command's input" "$bin" attend --spec full --input "$in" --output "$in"
expect_exit 2 "--output is --input by another path" "is the command's input" "$bin" attend --spec full --input "$in" --output "$dir/./sub/../$(basename "$in")"
ln -s "$in" "$dir/link.safetensors"
expect_exit 2 "--output is --input through a symlink" "is the command's input" "$bin" attend --spec full --input "$dir/link.safetensors" --output "$in"
expect_tensors "--output is --input: input untouched" "$in" q k v do

# Conventions shared by every command: usage errors exit 2 with a hint, --version, --threads.
expect_exit 2 "unknown option" "did you mean --lengths?" "$bin" bench --lenghts 64
expect_exit 2 "unknown subcommand" "did you mean bench?" "$bin" bnch
expect_exit 2 "no subcommand" "give a command" "$bin"
expect_exit 2 "bad option value" "--n" "$bin" make-inputs --output "$dir/x.safetensors" --n abc
expect_ok "--version" "$bin" --version
grep -Eq '^clattn [0-9]+\.[0-9]+\.[0-9]+ \(commit [^)]+\)$' "$dir/out" && ok || bad "--version printed: $(cat "$dir/out")"
expect_ok "--help" "$bin" --help
grep -q "Exit codes: 0 success" "$dir/out" && ok || bad "--help does not list the exit codes"
for t in 0 -1; do
  expect_exit 2 "attend --threads $t" "--threads must be >= 1" "$bin" attend --threads "$t" --spec full --input "$fwd" --output "$dir/x.safetensors"
  expect_exit 2 "bench --threads $t" "--threads must be >= 1" "$bin" bench --threads "$t" --lengths 64
  expect_exit 2 "bench-model --threads $t" "--threads must be >= 1" "$bin" bench-model --random-bert --threads "$t"
done
expect_ok "attend --threads 100000" "$bin" attend --threads 100000 --spec full --input "$fwd" --output "$dir/t.safetensors"
grep -q "clattn attend: --threads 100000 capped at [0-9]* (the machine's processors)" "$dir/err" && ok || bad "no capping note: $(cat "$dir/err")"
expect_ok "bench --threads 100000" "$bin" bench --threads 100000 --attention full --lengths 64 --heads 1 --dim 8 --repeat 1
grep -q "clattn bench: --threads 100000 capped at" "$dir/err" && ok || bad "no capping note: $(cat "$dir/err")"
# Other processes on every core: the figures come with a note that names them and a thread count.
busy_pids=()
for _ in $(seq "$(nproc)") 1; do (while :; do :; done) & busy_pids+=($!); done
sleep 0.3
expect_ok "bench beside busy loops" "$bin" bench --attention full --lengths 64 --heads 1 --dim 8 --repeat 1
kill "${busy_pids[@]}" 2>/dev/null; wait "${busy_pids[@]}" 2>/dev/null
grep -q "^note: [0-9]* tasks\? of other processes running beside this one on [0-9]* processors" "$dir/out" "$dir/err" \
  && ok || bad "bench beside busy loops: no note: $(head -c 600 "$dir/out")"
expect_exit 2 "bench absurd length" "--lengths item 2 must be in" "$bin" bench --lengths 64,99999999999
expect_exit 2 "bench zero repeat" "--repeat must be in" "$bin" bench --repeat 0 --lengths 64

expect_error "bench bad lengths" "lengths" "$bin" bench --lengths 64,abc
expect_ok "bench smoke" "$bin" bench --attention 'full;clustered:clusters=4;improved-clustered:clusters=4,topk=8' --lengths 64,200 --heads 2 --dim 16 --repeat 2 --backward --json "$dir/b.json"
grep -q '"results"' "$dir/b.json" && ok || bad "bench json has no results"
grep -q '"machine"' "$dir/b.json" && grep -q '"cpu"' "$dir/b.json" && grep -q '"commit"' "$dir/b.json" && ok || bad "bench json machine: $(head -c 400 "$dir/b.json")"
grep -q '"kv_heads": 2' "$dir/b.json" && grep -q '"ms_max"' "$dir/b.json" && grep -q '"cos"' "$dir/b.json" && ok || bad "bench json rows lack the case or ms_max/cos"
# GFLOP/s and %peak for every variant, against its own work model, and the stage with most work.
grep -Eq '^full +64 +fwdbwd +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+% ' "$dir/out" && ok || bad "bench full row has no GFLOP/s: $(cat "$dir/out")"
grep -Eq '^clustered:clusters=4 +64 +fwdbwd +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+% .* (hashing|centroid attention)' "$dir/out" && ok || bad "bench clustered row has no GFLOP/s or stage: $(cat "$dir/out")"
grep -q '"work_flops": [0-9]' "$dir/b.json" && grep -q '"work_int_ops": [0-9]' "$dir/b.json" && grep -q '"largest_stage": "' "$dir/b.json" && ok || bad "bench json rows lack the work model"
expect_ok "bench -o csv" "$bin" bench --attention 'full;improved-clustered:clusters=4,topk=8' --lengths 64 --heads 2 --dim 16 --repeat 1 -o csv
head -n 1 "$dir/out" | grep -q '^spec,n,' && ok || bad "bench csv header: $(head -n 1 "$dir/out")"
[ "$(wc -l <"$dir/out")" -eq 3 ] && grep -q '^"improved-clustered:clusters=4,topk=8",64,' "$dir/out" && ok || bad "bench csv rows: $(cat "$dir/out")"
expect_ok "bench -o jsonl" "$bin" bench --attention 'full;topk:topk=8' --lengths 64,96 --heads 2 --kv-heads 1 --dim 16 --repeat 1 -o jsonl
[ "$(wc -l <"$dir/out")" -eq 4 ] && [ "$(grep -c '^{.*"kv_heads":1.*}$' "$dir/out")" -eq 4 ] && ok || bad "bench jsonl: $(cat "$dir/out")"
expect_ok "bench -o json" "$bin" bench --attention full --lengths 64 --heads 1 --dim 8 --repeat 1 -o json
head -n 1 "$dir/out" | grep -q '^{$' && tail -n 1 "$dir/out" | grep -q '^}$' && grep -q '"sgemm_gflops"' "$dir/out" && ok || bad "bench -o json: $(head -c 300 "$dir/out")"
expect_ok "bench -o md" "$bin" bench --attention 'full;local:window=16' --lengths 64 --heads 1 --dim 8 --repeat 1 -o md
head -n 1 "$dir/out" | grep -q '^| spec | n |' && grep -Eq '^\| local:window=16 \| 64 \| fwd \|.* [0-9.]+% \|.* attention \|$' "$dir/out" && ok || bad "bench -o md: $(cat "$dir/out")"
expect_exit 2 "bench bad -o" "--format: xml" "$bin" bench -o xml --lengths 64
# 'all' is every registered variant in one table (causal: those that honour it, the rest named).
expect_ok "bench all" "$bin" bench --attention all --lengths 96 --heads 2 --dim 16 --repeat 1 --json "$dir/all.json"
for v in full clustered improved-clustered local linear topk smyrf reformer routing conditional-full; do
  grep -q "\"spec\": \"$v" "$dir/all.json" && ok || bad "bench all has no $v row"
done
# Causal: every variant but routing's k-means example (causal routing needs centroids=ema), named.
expect_ok "bench all causal" "$bin" bench --attention all --causal --lengths 96 --heads 2 --dim 16 --repeat 1 --backward
[ "$(grep -c "left out" "$dir/err")" = 1 ] && grep -q "routing:clusters=128 left out" "$dir/err" && ok ||
  bad "bench all causal should leave out only k-means routing: $(cat "$dir/err")"

# attend: reformer takes q as its keys when the file has no k (and refuses a different k).
expect_ok "make-inputs for reformer" "$bin" make-inputs --output "$dir/r.safetensors" --heads 2 --n 40 --dim 8
expect_error "reformer with another k" "equal to q" "$bin" attend --spec reformer --input "$dir/r.safetensors" --output "$dir/x.safetensors"
expect_ok "make-inputs --shared-qk" "$bin" make-inputs --output "$dir/rq.safetensors" --heads 2 --n 40 --dim 8 --with-grad --shared-qk
expect_tensors "--shared-qk writes no k" "$dir/rq.safetensors" q v do
grep -q "no k (shared-QK" "$dir/err" && ok || bad "make-inputs --shared-qk summary: $(cat "$dir/err")"
expect_ok "attend reformer on --shared-qk inputs" "$bin" attend --spec reformer --input "$dir/rq.safetensors" --output "$dir/ro.safetensors"
expect_tensors "reformer fwd+bwd writes o, dq, dk, dv" "$dir/ro.safetensors" o dq dk dv
expect_error "full on --shared-qk inputs" "no tensor 'k'" "$bin" attend --spec full --input "$dir/rq.safetensors" --output "$dir/x.safetensors"
expect_exit 2 "--shared-qk with M != N" "--shared-qk" "$bin" make-inputs --output "$dir/x.safetensors" --n 40 --m 50 --shared-qk
expect_exit 2 "--shared-qk with Hkv != H" "--shared-qk" "$bin" make-inputs --output "$dir/x.safetensors" --heads 4 --kv-heads 2 --shared-qk
expect_ok "attend step" "$bin" attend --spec clustered:clusters=4 --step 3 --input "$dir/r.safetensors" --output "$dir/s3.safetensors"
expect_ok "attend step again" "$bin" attend --spec clustered:clusters=4 --step 3 --input "$dir/r.safetensors" --output "$dir/s3b.safetensors"
cmp -s <(tail -c +9 "$dir/s3.safetensors") <(tail -c +9 "$dir/s3b.safetensors") && ok || bad "same step, different output"

# Memory before allocation: requests that cannot fit are refused with the estimate (exit 1).
expect_exit 1 "bench too big for memory" "GB available" "$bin" bench --lengths 10000000 --attention full --heads 8 --dim 32
grep -q "needs about .* GB of memory, but this machine has .* GB available" "$dir/err" && ok || bad "bench memory refusal: $(cat "$dir/err")"
expect_exit 1 "bench workspace too big" "needs about" "$bin" bench --lengths 200000 --attention 'topk:topk=100000' --heads 8 --batch 16 --no-error

# Models (the real ones in ../shared/data; CLATTN_DATA overrides).
if need_data "the model commands" stories260k kwt1; then
  expect_ok "generate greedy" "$bin" generate --model "$data/stories260k" --tokens 20
  grep -q "^Once upon a time, there was a little girl named Lily" "$dir/out" && ok || bad "generate: $(head -c 200 "$dir/out")"
  grep -q "tokens/s" "$dir/err" && ok || bad "generate reports no tokens/s"
  expect_ok "generate sampled" "$bin" generate --model "$data/stories260k" --prompt "The cat" --tokens 10 --temperature 0.8 --top-k 20 --top-p 0.9 --seed 4 --attention 'full;local:window=32'
  expect_ok "generate causal clustered" "$bin" generate --model "$data/stories260k" --tokens 20 --attention 'improved-clustered:clusters=4,block=16'
  expect_error "generate too long" "context" "$bin" generate --model "$data/stories260k" --tokens 100000
  # docs/cli.md's classify command, as written there: one label and score per clip.
  expect_ok "classify kwt" "$bin" classify --model "$data/kwt1" --features "$data/kwt1/features_fsdd_test.safetensors" --attention 'clustered:clusters=25'
  [ "$(wc -l < "$dir/out")" -eq 300 ] && grep -q "^_unknown_	0\.[0-9]*$" "$dir/out" && ok || bad "classify kwt: $(head -c 300 "$dir/out")"
  # docs/cli.md's sampled and context-shifted commands, as written there.
  expect_ok "generate sampled with penalties" "$bin" generate --model "$data/stories260k" --prompt "Once upon a time" \
    --tokens 200 --temperature 0.8 --top-k 40 --top-p 0.95 --min-p 0.05 --repeat-penalty 1.1 --seed 3 --stop "The end"
  ! grep -q "The end" "$dir/out" && ok || bad "generate --stop showed its stop string: $(tail -c 300 "$dir/out")"
  expect_ok "generate --stop" "$bin" generate --model "$data/stories260k" --tokens 60 --stop "Lily"
  grep -q "named $" "$dir/out" && grep -q "stopped at a --stop string" "$dir/err" && ok ||
    bad "generate --stop Lily: $(head -c 300 "$dir/out") / $(cat "$dir/err")"
  expect_ok "generate --context-shift" "$bin" generate --model "$data/stories260k" --prompt "Once upon a time" --tokens 1200 --context-shift
  grep -q "3 context shifts by rotate, keeping 1" "$dir/err" && ok || bad "generate --context-shift: $(cat "$dir/err")"
  cp "$dir/out" "$dir/rotated"
  expect_ok "generate --context-shift=reencode" "$bin" generate --model "$data/stories260k" --prompt "Once upon a time" \
    --tokens 1200 --context-shift=reencode
  grep -q "3 context shifts by reencode, keeping 1" "$dir/err" && ! cmp -s "$dir/out" "$dir/rotated" && ok ||
    bad "generate --context-shift=reencode: $(cat "$dir/err")"
  expect_exit 2 "generate --context-shift=sideways" "context-shift" "$bin" generate --model "$data/stories260k" --context-shift=sideways
  expect_exit 2 "generate --min-p out of range" "generate: --min-p must be in \[0, 1\], got 2" \
    "$bin" generate --model "$data/stories260k" --min-p 2
  expect_exit 2 "generate empty --stop" "--stop must not be empty" "$bin" generate --model "$data/stories260k" --stop ""
  # A 16-bit KV cache keeps the greedy story; the summary names the read bandwidth.
  for kv in f16 BF16; do
    expect_ok "generate --kv-cache $kv" "$bin" generate --model "$data/stories260k" --tokens 20 --kv-cache $kv --attention 'full;local:window=8'
    grep -q "^Once upon a time, there was a little girl named Lily" "$dir/out" && ok || bad "generate --kv-cache $kv: $(head -c 200 "$dir/out")"
    grep -q "decode step .* ms, .* GB/s read = .*% of this machine's" "$dir/err" && ok || bad "generate --kv-cache $kv: no bandwidth line: $(cat "$dir/err")"
  done
  expect_ok "generate --kv-cache f16, causal clustered" "$bin" generate --model "$data/stories260k" --tokens 20 --kv-cache f16 --attention 'full;improved-clustered:clusters=4,topk=8,block=16'
  grep -q "decode step .* ms, .* GB/s read" "$dir/err" && ok || bad "generate --kv-cache f16 clustered: $(cat "$dir/err")"
  expect_error "f16 cache with linear" "read by full, local and causal clustered attention only" "$bin" generate --model "$data/stories260k" --tokens 5 --kv-cache f16 --attention linear
  expect_exit 2 "bad --kv-cache" "kv-cache" "$bin" generate --model "$data/stories260k" --kv-cache fp8
  expect_ok "bench-model --kv-cache f16" "$bin" bench-model --model "$data/stories260k" --lengths 16 --decode 4 --repeat 1 --kv-cache f16 -o json
  grep -q '"bandwidth_fraction": [0-9]' "$dir/out" && ok || bad "bench-model --kv-cache f16: no bandwidth_fraction: $(head -c 300 "$dir/out")"
  # 16-bit linear weights keep the greedy story too; bad values name the choices.
  for w in f16 BF16; do
    expect_ok "generate --weights $w" "$bin" generate --model "$data/stories260k" --tokens 20 --weights $w --kv-cache f16
    grep -q "^Once upon a time, there was a little girl named Lily" "$dir/out" && ok || bad "generate --weights $w: $(head -c 200 "$dir/out")"
  done
  expect_exit 2 "bad --weights" "f32,f16,bf16" "$bin" generate --model "$data/stories260k" --weights fp16
  expect_ok "bench-model --weights bf16" "$bin" bench-model --model "$data/stories260k" --lengths 16 --decode 4 --repeat 1 --weights bf16 -o json
  expect_error "bench-model --weights with --random-bert" "is for checkpoints" "$bin" bench-model --random-bert --layers 1 --hidden 32 --heads 2 --ffn 64 --lengths 16 --repeat 1 --weights f16
  expect_ok "approx --weights f16" "$bin" approx --model "$data/stories260k" --token-file "$data/stories260k/reference_logits.safetensors" --attention 'local:window=16' --weights f16
  expect_ok "approx decoder" "$bin" approx --model "$data/stories260k" --token-file "$data/stories260k/reference_logits.safetensors" --attention 'topk:topk=8' --attention 'local:window=16' --json "$dir/a.json"
  grep -q '"agreement"' "$dir/a.json" && grep -q '"ratio_to_full"' "$dir/a.json" && ok || bad "approx json: $(head -c 300 "$dir/a.json")"
  expect_ok "approx kwt seeds" "$bin" approx --model "$data/kwt1" --features "$data/kwt1/features_speech_commands.safetensors" --attention 'improved-clustered:clusters=25' --seeds 2
  grep -q "improved-clustered:clusters=25 .* 2 " "$dir/out" && ok || bad "approx kwt: $(cat "$dir/out")"
  # ms is the median of --repeat timed forwards after a warm-up; 0 is a usage error.
  expect_ok "approx --repeat 2" "$bin" approx --model "$data/kwt1" --features "$data/kwt1/features_speech_commands.safetensors" --attention full --repeat 2
  expect_exit 2 "approx --repeat 0" "--repeat" "$bin" approx --model "$data/kwt1" --features "$data/kwt1/features_speech_commands.safetensors" --attention full --repeat 0
  expect_error "approx no input" "exactly one of" "$bin" approx --model "$data/kwt1" --attention full
  expect_error "approx bad plan" "unknown attention" "$bin" approx --model "$data/kwt1" --features "$data/kwt1/features_speech_commands.safetensors" --attention 'full;fulll'
  expect_error "approx missing model" "config" "$bin" approx --model "$dir/nothing" --features "$data/kwt1/features_speech_commands.safetensors" --attention full
  : >"$dir/empty.txt"
  expect_error "approx empty --text" "needs at least 2" "$bin" approx --model "$data/stories260k" --text "$dir/empty.txt" --attention 'clustered:clusters=4'
  expect_ok "bench-model random bert" "$bin" bench-model --random-bert --layers 1 --hidden 32 --heads 2 --ffn 64 --lengths 128 --attention full --attention 'improved-clustered:clusters=8,topk=8' --repeat 1
  expect_ok "bench-model decoder" "$bin" bench-model --model "$data/stories260k" --lengths 32 --decode 8 --repeat 1 --json "$dir/bm.json"
  # Decode rows report the bytes a step reads against the measured read bandwidth; prefill rows
  # report the attention's GFLOP/s against its work model.
  python3 - "$dir/bm.json" <<'PY' && ok || bad "bench-model decode json lacks the bandwidth figures: $(head -c 600 "$dir/bm.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["machine"]["read_gbs"] > 0
rows = {r["mode"]: r for r in d["results"]}
assert rows["decode"]["bytes_read"] > 4 * 260000 and 0 < rows["decode"]["bandwidth_fraction"] < 10
assert rows["prefill"]["attention_gflops"] > 0 and rows["prefill"]["bytes_read"] is None
PY
  # A model that cannot run fails before the table's header: no empty table above the error.
  for args in "--model $dir/nothing" "--model $data/kwt1"; do
    expect_error "bench-model $args" "bench-model\|config" "$bin" bench-model $args --repeat 1
    grep -q "ms_median" "$dir/out" && bad "bench-model $args printed the table header before its error" || ok
  done
fi

if need_data "clattn tokenize" tokenizers/bert-base-uncased/tokenizer.json tokenizers/gpt2/tokenizer.json; then
  # docs/cli.md's tokenize command (its lines written here).
  printf 'Naïve café, and tea!\nhi there\n' > "$dir/text.txt"
  expect_ok "tokenize bert" "$bin" tokenize --tokenizer "$data/tokenizers/bert-base-uncased" --text "$dir/text.txt"
  python3 - "$dir/out" <<'PY' && ok || bad "tokenize bert: $(head -c 400 "$dir/out")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
text = "Naïve café, and tea!"
assert [r["item"] for r in rows] == [0, 1]
assert rows[0]["tokens"] == ["[CLS]", "naive", "cafe", ",", "and", "tea", "!", "[SEP]"]
assert [text[a:b] for a, b in rows[0]["offsets"][1:-1]] == ["Naïve", "café", ",", "and", "tea", "!"]
assert rows[0]["offsets"][0] == [0, 0] and rows[0]["special_tokens_mask"] == [1, 0, 0, 0, 0, 0, 0, 1]
PY
  printf 'and coffee?\nyou\n' > "$dir/pair.txt"
  expect_ok "tokenize gpt2 bytes, pairs" "$bin" tokenize --tokenizer "$data/tokenizers/gpt2/tokenizer.json" --text "$dir/text.txt" \
    --offsets bytes --max-length 3 --no-special --output "$dir/tok.jsonl"
  grep -q '"tokens":\["Na","Ã¯ve","ĠcafÃ©"\],.*"offsets":\[\[0,2\],\[2,6\],\[6,12\]\]' "$dir/tok.jsonl" && ok ||
    bad "tokenize gpt2: $(head -c 400 "$dir/tok.jsonl")"
  grep -q "1 truncated" "$dir/err" && ok || bad "tokenize gpt2 does not count the cut line: $(cat "$dir/err")"
  expect_ok "tokenize a pair" "$bin" tokenize --tokenizer "$data/tokenizers/bert-base-uncased" --text "$dir/text.txt" --pair "$dir/pair.txt"
  grep -q '"type_ids":\[0,0,0,0,1,1\]' "$dir/out" && ok || bad "tokenize --pair: $(tail -c 300 "$dir/out")"
  printf 'one\n' > "$dir/short.txt"
  expect_error "tokenize pair lines" "one pair line per text line" "$bin" tokenize --tokenizer "$data/tokenizers/gpt2" --text "$dir/text.txt" --pair "$dir/short.txt"
  expect_error "tokenize --offsets" "chars, bytes or none" "$bin" tokenize --tokenizer "$data/tokenizers/gpt2" --text "$dir/text.txt" --offsets words
  expect_error "tokenize no tokenizer" "cannot open" "$bin" tokenize --tokenizer "$dir/nothing" --text "$dir/text.txt"
fi

finish ""
