#!/usr/bin/env bash
# End-to-end checks of `clattn train` and `clattn eval` on tiny models (2 layers, dim 16, seq 64):
# the JSON-lines log, checkpoints loadable by eval and by the inference loaders (approx), exact
# resumption after a --time-budget stop and after SIGKILL (every logged loss bit-identical to an
# uninterrupted run's), and the error paths (exit 2 usage, 1 runtime, never a signal).
# Needs only bash and coreutils. Usage: bash tests/cli/train.sh /path/to/clattn
set -u
bin=${1:?usage: train.sh /path/to/clattn}
source "$(dirname "$0")/lib.sh"
# losses LOG: "step loss" of every training line (keys are written sorted: loss before step)
losses() { grep '"loss"' "$1" | sed -E 's/.*"loss":([^,]*),.*"step":([0-9]+),.*/\2 \1/'; }
# same_losses WHAT REF LOG STEPS: every (step, loss) of LOG is REF's, and LOG has steps 1..STEPS
same_losses() {
  local what=$1 ref=$2 log=$3 steps=$4
  losses "$ref" | sort -u >"$dir/ref.txt"
  losses "$log" | sort -u >"$dir/got.txt"
  local extra missing
  extra=$(comm -13 "$dir/ref.txt" "$dir/got.txt" | head -3)
  missing=$(comm -23 <(seq 1 "$steps" | sort -u) <(cut -d' ' -f1 "$dir/got.txt" | sort -u) | head -3)
  if [ -z "$extra" ] && [ -z "$missing" ]; then ok
  else bad "$what: losses differ from the uninterrupted run ($extra) or steps missing ($missing)"; fi
}

text=$dir/text.txt
for i in $(seq 1 1500); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7 % 13))"; done >"$text"
# One thread: on a loaded machine OpenMP teams wait for descheduled peers (40x slower seen).
model=(--layers 2 --dim 16 --heads 2 --ff 32 --batch 4 --warmup 2 --threads 1)
tiny=("${model[@]}" --seq 64)

# --- Warnings at start: a run without --checkpoint throws its model away; a warm-up longer than
# the run never reaches --lr. Neither when the run keeps its model and warms up within it.
expect_ok "train without --checkpoint" "$bin" train --task lm --data "$text" --layers 2 --dim 16 --heads 2 \
  --ff 32 --batch 4 --threads 1 --seq 64 --steps 2 --warmup 5
grep -q "warning: no --checkpoint DIR: the trained model will not be saved" "$dir/err" && ok ||
  bad "no warning without --checkpoint: $(head -c 300 "$dir/err")"
grep -q "warning: --warmup 5 is longer than --steps 2" "$dir/err" && ok ||
  bad "no warning for --warmup > --steps: $(head -c 300 "$dir/err")"
expect_ok "train with --checkpoint" "$bin" train --task lm --data "$text" "${tiny[@]}" --steps 2 \
  --checkpoint "$dir/warned"
grep -q "warning" "$dir/err" && bad "unexpected warning: $(head -c 300 "$dir/err")" || ok

# --- generate runs a checkpoint with the plan it was trained with (as Python's load_model does);
# --attention replaces it.
expect_ok "train lm with a plan" "$bin" train --task lm --data "$text" "${tiny[@]}" --steps 2 \
  --attention "improved-clustered:clusters=2,topk=4" --checkpoint "$dir/planned"
expect_ok "generate, trained plan" "$bin" generate --model "$dir/planned/latest" --prompt "line" --tokens 3
grep -q "^generate: improved-clustered:clusters=2,topk=4" "$dir/err" && ok ||
  bad "generate did not run the trained plan: $(head -c 300 "$dir/err")"
expect_ok "generate, --attention full" "$bin" generate --model "$dir/planned/latest" --prompt "line" --tokens 3 \
  --attention full
grep -q "^generate: full;" "$dir/err" && ok || bad "generate --attention full: $(head -c 300 "$dir/err")"

# --- What is trained is what is logged: --init logs the checkpoint's sizes (not the defaults,
# dim 128); a resumed run whose latest/config.json and weights were swapped for another model's is
# refused; a checkpoint whose weights hold more layers than its config says is refused by name.
"$bin" train --task lm --data "$text" "${tiny[@]}" --steps 2 --checkpoint "$dir/arch2" >/dev/null 2>&1
expect_ok "train --init" "$bin" train --task lm --data "$text" --init "$dir/arch2/latest" --seq 64 --batch 4 --warmup 1 \
  --threads 1 --steps 2 --log "$dir/init.jsonl"
head -1 "$dir/init.jsonl" | grep -q '"dim":16' && head -1 "$dir/init.jsonl" | grep -q '"layers":2' && ok ||
  bad "--init log header does not name the checkpoint's sizes: $(head -c 300 "$dir/init.jsonl")"
"$bin" train --task lm --data "$text" --layers 1 --dim 16 --heads 2 --ff 32 --batch 4 --warmup 2 --threads 1 --seq 64 \
  --steps 2 --checkpoint "$dir/arch1" >/dev/null 2>&1
cp "$dir/arch2/latest/config.json" "$dir/arch2/latest/model.safetensors" "$dir/arch1/latest/"
expect_error "resume with a swapped model" "has 2 layers, dim 16, 2 heads, ff 32; the run's options say 1 layers" \
  "$bin" train --task lm --data "$text" --layers 1 --dim 16 --heads 2 --ff 32 --batch 4 --warmup 2 --threads 1 --seq 64 \
  --steps 2 --checkpoint "$dir/arch1" --resume
cp -r "$dir/arch2/latest" "$dir/arch_lying"
sed -i 's/"num_hidden_layers": 2/"num_hidden_layers": 1/' "$dir/arch_lying/config.json"
expect_error "--init with more layers in the weights" "belongs to layer 1, but config.json has 1 layers" \
  "$bin" train --task lm --data "$text" --init "$dir/arch_lying" --seq 64 --batch 4 --threads 1 --steps 2

# --- mlm: the log's lines and fields; eval reproduces the logged evaluation.
expect_ok "train mlm" "$bin" train --task mlm --data "$text" "${tiny[@]}" --steps 12 --eval-every 6 \
  --checkpoint "$dir/mlm" --log "$dir/mlm.jsonl"
log=$dir/mlm.jsonl
[ "$(head -1 "$log" | grep -c '"config":{.*"task":"mlm"')" = 1 ] && grep -q '"attention":"full"' <(head -1 "$log") && ok ||
  bad "log header: $(head -c 300 "$log")"
n=$(grep -c '"loss"' "$log")
[ "$n" = 12 ] && ok || bad "12 training lines expected, got $n"
for key in step loss lr ms tokens_per_s; do
  [ "$(grep '"loss"' "$log" | grep -c "\"$key\":[0-9.e+-]*[,}]")" = 12 ] && ok || bad "training lines lack \"$key\""
done
[ "$(grep -c '"eval_loss"' "$log")" = 2 ] && ok || bad "2 evaluation lines expected: $(grep eval_loss "$log")"
for key in step eval_loss eval_metric elapsed_s; do
  [ "$(grep '"eval_loss"' "$log" | grep -c "\"$key\":[0-9.e+-]*[,}]")" = 2 ] && ok || bad "evaluation lines lack \"$key\""
done
grep -q '"end":"steps"' "$log" && ok || bad "no end line"
[ "$(grep -vc '^{.*}$' "$log")" = 0 ] && ok || bad "a log line is not one JSON object"
for f in latest/model.safetensors latest/config.json latest/optimizer.safetensors latest/train_state.json best/model.safetensors; do
  [ -s "$dir/mlm/$f" ] && ok || bad "checkpoint file $f missing"
done
grep -q '"clattn_head": "mlm"' "$dir/mlm/latest/config.json" && ok || bad "config.json: no clattn_head"
last_eval=$(grep '"eval_loss"' "$log" | tail -1 | sed -E 's/.*"eval_loss":([^,]*),.*/\1/')
expect_ok "eval mlm" "$bin" eval --checkpoint "$dir/mlm/latest" -o json --threads 1
grep -q "\"eval_loss\": $last_eval," "$dir/out" && ok || bad "eval gives another loss than the run's last evaluation ($last_eval): $(cat "$dir/out")"
expect_ok "eval mlm, two attentions" "$bin" eval --checkpoint "$dir/mlm" --attention full \
  --attention improved-clustered:clusters=3,topk=8 --threads 1
[ "$(grep -c 'bits_per_char\|^full \|^improved-clustered' "$dir/out")" = 3 ] && ok || bad "eval table: $(cat "$dir/out")"

# --- lm: the checkpoint is a LLaMA folder the inference decoder loads (approx --token-file).
expect_ok "train lm" "$bin" train --task lm --data "$text" "${tiny[@]}" --steps 4 --eval-every 4 --checkpoint "$dir/lm"
printf '\x40\x00\x00\x00\x00\x00\x00\x00{"tokens":{"dtype":"I32","shape":[1,16],"data_offsets":[0,64]}} ' >"$dir/tok.safetensors"
head -c 64 /dev/zero >>"$dir/tok.safetensors"
expect_ok "approx loads the lm checkpoint" "$bin" approx --model "$dir/lm/latest" --token-file "$dir/tok.safetensors" \
  --attention full --threads 1
grep -q '"architectures"' "$dir/lm/latest/config.json" && grep -q 'LlamaForCausalLM' "$dir/lm/latest/config.json" && ok ||
  bad "lm config.json is not a LLaMA config"

# --- listops: generated training, the real test set held out (expressions longer than --seq left out).
if need_data "train listops" listops/test_d20s.tsv; then
  expect_ok "train listops" "$bin" train --task listops --data "$data/listops/test_d20s.tsv" "${tiny[@]}" \
    --min-length 8 --max-length 64 --steps 3 --eval-every 3 --eval-examples 40 --log "$dir/lo.jsonl"
  grep -q '"metric":"accuracy"' "$dir/lo.jsonl" && ok || bad "listops logs no accuracy"
  grep -q 'left out of evaluation' "$dir/err" && ok || bad "listops: no note on skipped examples"
fi

# --- fine-tuning (--init): a pretrained decoder on the text through its own tokenizer, whose files
# travel with the checkpoints so generate reads them; a KWT model on a feature set.
if need_data "train --init" stories260k/config.json kwt1/config.json kwt1/features_espeak_keywords.safetensors; then
  expect_ok "fine-tune stories260k" "$bin" train --task lm --init "$data/stories260k" --data "$text" --seq 64 --batch 2 \
    --steps 3 --eval-every 3 --eval-examples 4 --threads 1 --attention 'improved-clustered:clusters=4,topk=8,block=16' \
    --checkpoint "$dir/ft" --log "$dir/ft.jsonl"
  grep -q '"metric":"bits_per_token"' "$dir/ft.jsonl" && ok || bad "tokenized lm logs no bits_per_token"
  [ -s "$dir/ft/best/tokenizer.json" ] && [ -s "$dir/ft/best/tokenizer_config.json" ] && ok || bad "the tokenizer files are not in best/"
  grep -q '"num_key_value_heads": 4' "$dir/ft/best/config.json" && ok || bad "the fine-tuned config lost the architecture"
  expect_ok "generate from the fine-tuned model" "$bin" generate --model "$dir/ft/best" --prompt "ROMEO:" --tokens 8 --threads 1
  expect_ok "eval the fine-tuned model" "$bin" eval --checkpoint "$dir/ft" --attention full --threads 1
  expect_ok "fine-tune kwt1" "$bin" train --task features --init "$data/kwt1" \
    --data "$data/kwt1/features_espeak_keywords.safetensors" --batch 4 --steps 2 --eval-every 2 --threads 1 --checkpoint "$dir/kw"
  grep -q 'KWTForKeywordSpotting' "$dir/kw/best/config.json" && ok || bad "the fine-tuned KWT config: $(head -c 200 "$dir/kw/best/config.json")"
  expect_exit 2 "--init with sizes" "keeps the checkpoint's architecture" "$bin" train --task lm --init "$data/stories260k" \
    --data "$text" --layers 3
  expect_exit 1 "--init of an encoder for lm" "lm" "$bin" train --task lm --init "$data/kwt1" --data "$text"
  expect_exit 1 "features on a token model" "feature" "$bin" train --task features --init "$data/stories260k" \
    --data "$data/kwt1/features_espeak_keywords.safetensors"
fi
expect_exit 2 "features without --init" "--init" "$bin" train --task features --data "$text"

# --- exact resumption. Reference: one uninterrupted run.
run=(train --task lm --data "$text" "${tiny[@]}" --steps 300 --eval-every 20 --lr 3e-3)
expect_ok "reference run" "$bin" "${run[@]}" --checkpoint "$dir/ref" --log "$dir/ref.jsonl"
# A --time-budget stop (after the first step), then --resume to the end.
expect_ok "time-budget run" "$bin" "${run[@]}" --checkpoint "$dir/tb" --log "$dir/tb.jsonl" --time-budget 0.000001
grep -q '"end":"time_budget","step":1}' "$dir/tb.jsonl" && ok || bad "--time-budget did not stop after step 1: $(tail -2 "$dir/tb.jsonl")"
[ "$(grep -c '"eval_loss"' "$dir/tb.jsonl")" = 1 ] && ok || bad "--time-budget stop without its evaluation"
expect_ok "resume after time budget" "$bin" "${run[@]}" --checkpoint "$dir/tb" --log "$dir/tb.jsonl" --resume
same_losses "resume after --time-budget" "$dir/ref.jsonl" "$dir/tb.jsonl" 300
# SIGKILL once the first checkpoint exists, then --resume.
"$bin" "${run[@]}" --checkpoint "$dir/k9" --log "$dir/k9.jsonl" >/dev/null 2>&1 &
pid=$!
for _ in $(seq 1 2000); do [ -f "$dir/k9/latest/train_state.json" ] && break; sleep 0.01; done
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
if grep -q '"end"' "$dir/k9.jsonl"; then echo "note: the run ended before SIGKILL reached it; resume still checked"; fi
[ -f "$dir/k9/latest/train_state.json" ] && ok || bad "no checkpoint before the kill"
expect_ok "resume after SIGKILL" "$bin" "${run[@]}" --checkpoint "$dir/k9" --log "$dir/k9.jsonl" --resume
same_losses "resume after SIGKILL" "$dir/ref.jsonl" "$dir/k9.jsonl" 300
ls -a "$dir/k9" | grep -q '^\.tmp-\|^\.old-' && bad "leftover temporary checkpoint folders" || ok

# --- errors: usage (2) and runtime (1), each with a message.
expect_exit 2 "unknown task" "unknown task 'mlmx'" "$bin" train --task mlmx --data "$text"
expect_exit 1 "missing data" "cannot open" "$bin" train --task mlm --data "$dir/none.txt" "${tiny[@]}"
expect_exit 2 "mlm without data" "needs --data" "$bin" train --task lm
expect_exit 2 "seq 0" "--seq must be" "$bin" train --task mlm --data "$text" --seq 0
expect_exit 2 "dim not a multiple of heads" "multiple of --heads" "$bin" train --task mlm --data "$text" --dim 10 --heads 3
expect_exit 2 "negative lr" "--lr must be" "$bin" train --task mlm --data "$text" --lr -1
expect_exit 2 "resume without checkpoint" "needs --checkpoint" "$bin" train --task mlm --data "$text" --resume
expect_exit 2 "bad spec" "clustred" "$bin" train --task mlm --data "$text" "${tiny[@]}" --attention clustred --steps 1
expect_exit 1 "file shorter than a window" "held-out part" "$bin" train --task lm --data "$text" "${model[@]}" --seq 20000
expect_exit 1 "listops window above seq" "minimum expression length" "$bin" train --task listops "${tiny[@]}"
expect_exit 1 "run folder in use" "already holds a run" "$bin" train --task mlm --data "$text" "${tiny[@]}" --steps 2 \
  --checkpoint "$dir/mlm"
expect_exit 1 "resume with other options" "differ" "$bin" train --task mlm --data "$text" "${tiny[@]}" --steps 13 \
  --eval-every 6 --checkpoint "$dir/mlm" --resume
expect_exit 1 "eval of nothing" "holds no checkpoint" "$bin" eval --checkpoint "$dir/none"
expect_exit 1 "eval with the wrong task" "head does not fit" "$bin" eval --checkpoint "$dir/lm" --task mlm --data "$text"
expect_exit 2 "eval bad output" "--format: xml not in {text,md,csv,json,jsonl}" "$bin" eval --checkpoint "$dir/mlm" -o xml
# The formats of every results command (ResultTable): csv's header names the row's keys.
expect_ok "eval csv" "$bin" eval --checkpoint "$dir/mlm/latest" -o csv --threads 1
[ "$(head -1 "$dir/out")" = "attention,eval_loss,eval_metric,examples,seconds,metric,targets" ] && \
  grep -Eq '^full,[0-9.]+,[0-9.]+,[0-9]+,[0-9.]+,bits_per_char,[0-9]+$' "$dir/out" && ok || bad "eval -o csv: $(cat "$dir/out")"

# --- the log is an output like every other: no symlink, no FIFO, never an input (a usage error, as
# for every command's outputs), every write checked.
echo "precious" >"$dir/target.txt"
ln -s "$dir/target.txt" "$dir/link.jsonl"
expect_exit 1 "--log through a symlink" "symlink" "$bin" train --task mlm --data "$text" "${tiny[@]}" --steps 1 \
  --log "$dir/link.jsonl"
[ "$(cat "$dir/target.txt")" = precious ] && ok || bad "the symlink's target was overwritten"
mkfifo "$dir/fifo.jsonl"
expect_exit 1 "--log on a FIFO" "FIFO" timeout 60 "$bin" train --task mlm --data "$text" "${tiny[@]}" --steps 1 \
  --log "$dir/fifo.jsonl"
expect_exit 1 "eval --data on a FIFO" "FIFO" timeout 60 "$bin" eval --checkpoint "$dir/mlm" --data "$dir/fifo.jsonl"
sum_before=$(cksum <"$text")
expect_exit 2 "--log on the --data file" "is the command's input --data" "$bin" train --task mlm --data "$text" "${tiny[@]}" --steps 1 \
  --log "$text"
[ "$(cksum <"$text")" = "$sum_before" ] && ok || bad "the corpus was changed by a refused --log"
ln "$text" "$dir/hardlink.txt"
expect_exit 2 "--log on a hard link of the data" "is the command's input --data" "$bin" train --task mlm --data "$text" "${tiny[@]}" --steps 1 \
  --log "$dir/hardlink.txt"
[ "$(cksum <"$text")" = "$sum_before" ] && ok || bad "the corpus was changed through a hard link"
# A write that fails (the file-size limit, as a full disk would): an error, never exit 0 with a torn log.
expect_exit 1 "--log write error" "cannot write the log" bash -c 'trap "" XFSZ; ulimit -f 1; exec "$@"' _ "$bin" train \
  --task mlm --data "$text" "${tiny[@]}" --steps 40 --eval-every 40 --log "$dir/small.jsonl"

# --- one run per checkpoint folder: a second is refused and names the first's PID.
"$bin" train --task mlm --data "$text" "${tiny[@]}" --steps 100000 --eval-every 100000 --checkpoint "$dir/busy" \
  >/dev/null 2>&1 &
busy=$!
for _ in $(seq 1 3000); do [ -s "$dir/busy/.clattn-train.lock" ] && break; sleep 0.01; done
expect_exit 1 "a second run on one folder" "in use by PID $busy" "$bin" train --task mlm --data "$text" "${tiny[@]}" \
  --steps 2 --checkpoint "$dir/busy" --resume
kill "$busy" 2>/dev/null
wait "$busy" 2>/dev/null
expect_ok "the folder is free once the run ended" "$bin" train --task mlm --data "$text" "${tiny[@]}" --steps 2 \
  --eval-every 2 --checkpoint "$dir/busy" --resume

# --- a diverging run stops with the divergence, before any checkpoint holds its weights.
expect_exit 1 "--lr 1e20 diverges" "diverged at step" "$bin" train --task lm --data "$text" "${tiny[@]}" --steps 20 \
  --eval-every 1 --lr 1e20 --checkpoint "$dir/div"
grep -q "try a lower --lr" "$dir/err" && ok || bad "the divergence message does not suggest a lower --lr: $(cat "$dir/err")"
if [ -f "$dir/div/latest/model.safetensors" ]; then
  python3 - "$dir/div/latest/model.safetensors" <<'PY' && ok || bad "a checkpoint of the diverged run holds weights beyond 1e30"
import json, struct, sys, math
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
vals = struct.unpack("<%df" % ((len(b) - 8 - n) // 4), b[8 + n: 8 + n + (len(b) - 8 - n) // 4 * 4])
sys.exit(0 if all(math.isfinite(x) and abs(x) < 1e30 for x in vals) else 1)
PY
else ok; fi

# --- train_state.json fields are checked, named with their file and range.
cp -r "$dir/mlm" "$dir/badstate"
sed -i 's/"step": 12/"step": "12"/' "$dir/badstate/latest/train_state.json"
expect_exit 1 "train_state step as a string" '"step" must be an integer' "$bin" train --task mlm --data "$text" \
  "${tiny[@]}" --steps 13 --eval-every 6 --checkpoint "$dir/badstate" --resume
grep -q "train_state.json" "$dir/err" && ok || bad "the error does not name train_state.json: $(cat "$dir/err")"
sed -i 's/"seq": 64/"seq": 1e30/' "$dir/badstate/latest/train_state.json"
expect_exit 1 "eval with a float seq in train_state" '"seq" must be an integer' "$bin" eval --checkpoint "$dir/badstate/latest"
grep -q -- "-9223372036854775808" "$dir/err" && bad "1e30 shown as INT64_MIN" || ok

finish "train cli: "
