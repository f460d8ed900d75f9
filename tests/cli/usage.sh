#!/usr/bin/env bash
# The first hour of a user: usage errors that put the useful line first and exit 2, spec errors
# that name the unknown parameter or variant and the nearest one, one option vocabulary (old
# names still work, with a note), `clattn variants`, defaults in --help, the live status line
# (only on a terminal), and language models trained by `clattn train` that generate and approx
# read without further files (their byte-level tokenizer.json).
# Usage: bash tests/cli/usage.sh /path/to/clattn
set -u
bin=${1:?usage: usage.sh /path/to/clattn}
source "$(dirname "$0")/lib.sh"
# first_line_has DESCRIPTION NEEDLE: the first stderr line of the last command holds NEEDLE
first_line_has() {
  if head -n 1 "$dir/err" | grep -qF -- "$2"; then ok; else bad "$1: first line: $(head -n 1 "$dir/err")"; fi
}

# --- spec errors: named, with the nearest name, exit 2, the registry's line first
expect_exit 2 "unknown spec parameter" "unknown parameter 'cluster' (did you mean 'clusters'?)" \
  "$bin" bench --attention 'clustered:cluster=10' --lengths 64
first_line_has "unknown spec parameter first" "unknown parameter 'cluster' (did you mean 'clusters'?)"
expect_exit 2 "misspelt variant" "did you mean 'clustered'?" "$bin" attend --spec clusterd --input x --output y
first_line_has "misspelt variant first" "unknown attention 'clusterd'"
expect_exit 2 "missing required parameter" "clusters is required" "$bin" approx --model x --features y --attention clustered
expect_exit 2 "bad spec in a plan" "did you mean 'full'?" "$bin" generate --model x --attention 'full;fulll'
expect_exit 2 "bad spec value" "bits must be in \\[1, 64\\]" "$bin" bench-model --random-bert --attention 'clustered:clusters=4,bits=99'
expect_exit 2 "empty plan item" "is empty" "$bin" bench --attention 'full;;local:window=8' --lengths 64

# --- CLI11's own lines come after clattn's
expect_exit 2 "misspelt option with a stray value" "did you mean --lengths?" "$bin" bench 1024 --lenghts 64
first_line_has "misspelt option first" "unknown option '--lenghts' of bench: did you mean --lengths?"
expect_exit 2 "a command's option before the command" "put the command first" "$bin" --attention full
first_line_has "option before the command first" "'--attention' is an option of a command"
if grep -q "unknown command 'full'" "$dir/err"; then bad "the option's value was taken for a command: $(cat "$dir/err")"; else ok; fi
expect_exit 2 "no command" "give a command: approx" "$bin"
first_line_has "no command first" "give a command"

# --- one vocabulary: files are --output / --input / --token-file; the old names are refused
expect_ok "bench -o json" "$bin" bench --attention full --lengths 32 --heads 1 --dim 8 --repeat 1 --no-error -o json
/usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["results"][0]["n"] == 32' "$dir/out" && ok || bad "bench -o json: $(head -c 300 "$dir/out")"
expect_exit 2 "bench --output-format (a 0.2 name)" "--output-format" "$bin" bench --lengths 32 --output-format json
expect_exit 2 "plot --out (a 0.2 name)" "--out" "$bin" plot --bench x.json --out x.png
expect_exit 2 "a format that does not exist" "format" "$bin" bench --lengths 32 -o yaml
for cmd in "approx --token-file" "inspect --token-file" "inspect --output" "inspect --clusters-output" "plot --output" "eval --format" "bench-model --format"; do
  set -- $cmd
  "$bin" "$1" --help >"$dir/help" 2>&1
  grep -qF -- "$2" "$dir/help" && ok || bad "clattn $1 --help does not list $2"
done
"$bin" approx --help >"$dir/help" 2>&1
if grep -qE -- '^ *--tokens ' "$dir/help"; then bad "approx --help still lists --tokens (a file)"; else ok; fi

# --- every default in --help
"$bin" bench-model --help >"$dir/help" 2>&1
for d in 16384 1024 128; do grep -q "$d" "$dir/help" && ok || bad "bench-model --help does not show the default $d"; done
"$bin" generate --help >"$dir/help" 2>&1
grep -qE -- '--tokens.*128' "$dir/help" && ok || bad "generate --help does not show --tokens 128: $(grep -- --tokens "$dir/help")"
"$bin" train --help >"$dir/help" 2>&1
grep -qE -- '--steps.*1000' "$dir/help" && ok || bad "train --help does not show --steps 1000"

# --- clattn variants: the registry, its parameters and capabilities
expect_ok "variants" "$bin" variants
for v in full clustered improved-clustered reformer routing smyrf topk local linear conditional-full; do
  grep -q "^$v " "$dir/out" && ok || bad "variants does not list $v"
done
grep -q "clusters (required)" "$dir/out" && ok || bad "variants does not mark clusters as required"
expect_ok "variants clustered" "$bin" variants clustered
grep -qE '^bits +int +63 +\[1, 64\]' "$dir/out" && ok || bad "variants clustered: no 'bits int 63 [1, 64]' row: $(cat "$dir/out")"
expect_ok "variants -o json" "$bin" variants -o json
/usr/bin/python3 - "$dir/out" <<'PY' && ok || bad "variants -o json: $(head -c 300 "$dir/out")"
import json, sys
d = {v["name"]: v for v in json.load(open(sys.argv[1]))["variants"]}
assert d["full"]["capabilities"]["causal"] and d["full"]["capabilities"]["decode"]
assert d["reformer"]["capabilities"]["decode"] is False  # its keys are its queries
# Sequence parallelism is a capability: full splits with and without the mask, clustered without.
split = {n: (v["capabilities"]["splits_sequence"], v["capabilities"]["splits_sequence_causal"]) for n, v in d.items()}
assert split["full"] == (True, True) and split["clustered"] == (True, False), split
assert split["improved-clustered"] == (True, False) and split["local"] == (False, False), split
assert [n for n, s in split.items() if s[0]] == ["full", "clustered", "improved-clustered"], split
assert not d["linear"]["parameters"]
c = {p["key"]: p for p in d["clustered"]["parameters"]}
assert c["clusters"]["required"] and c["clusters"]["default"] is None
assert c["bits"]["default"] == "63" and c["bits"]["range"] == "[1, 64]", c["bits"]
assert c["clustering"]["range"] == "lsh|positional"
PY
expect_exit 2 "variants of a misspelt name" "did you mean 'clustered'?" "$bin" variants clusterd

# --- the live status line: only on a terminal (forced here), never in redirected output
small=(bench --attention 'full;local:window=8' --lengths 32,64 --heads 1 --dim 8 --repeat 1 --no-error)
expect_ok "bench, stderr redirected" "$bin" "${small[@]}"
if grep -q $'\r' "$dir/err"; then bad "a status line in redirected stderr"; else ok; fi
expect_ok "bench with the status line" env CLATTN_PROGRESS=1 "$bin" "${small[@]}"
grep -q 'clattn bench: \[4/4\] local:window=8 N=64 fwd' "$dir/err" && ok || bad "no status line: $(tr '\r' '\n' <"$dir/err" | head -c 400)"
grep -q "ETA" "$dir/err" && ok || bad "the status line has no ETA: $(tr '\r' '\n' <"$dir/err" | head -c 400)"
if grep -q $'\r' "$dir/out"; then bad "the status line reached stdout"; else ok; fi

# --- language models trained here carry their tokenizer: generate, approx --text, eval
if need_data "trained language models" tinyshakespeare/input.txt; then
  text=$data/tinyshakespeare/input.txt
  run=(--seq 32 --batch 2 --steps 2 --warmup 1 --eval-every 2 --eval-examples 4 --threads 1)
  tiny=(--layers 1 --dim 32 --heads 2 "${run[@]}")
  expect_ok "train lm" "$bin" train --task lm --data "$text" "${tiny[@]}" --checkpoint "$dir/lm"
  for f in best/tokenizer.json latest/tokenizer.json; do [ -f "$dir/lm/$f" ] && ok || bad "lm checkpoint has no $f"; done
  expect_ok "generate from the trained lm" "$bin" generate --model "$dir/lm/best" --prompt "ROMEO:" --tokens 16 --threads 1
  head -c 6 "$dir/out" | grep -q "ROMEO:" && ok || bad "generate output does not start with the prompt: $(head -c 100 "$dir/out")"
  [ "$(head -n 1 "$dir/out" | wc -c)" -ge 10 ] && ok || bad "generate made no text: $(cat "$dir/out")"
  expect_exit 2 "generate without a prompt from a byte model" "no BOS" "$bin" generate --model "$dir/lm/best" --tokens 4
  head -c 2000 "$text" >"$dir/prompt.txt"
  expect_ok "approx --text on the trained lm" "$bin" approx --model "$dir/lm/best" --text "$dir/prompt.txt" --attention full
  grep -q "32 predictions" "$dir/out" && ok || bad "approx --text: $(head -c 300 "$dir/out")"
  expect_ok "eval of the lm keeps bits per character" "$bin" eval --checkpoint "$dir/lm" -o json --threads 1
  grep -q '"metric": "bits_per_char"' "$dir/out" && ok || bad "eval metric: $(head -c 300 "$dir/out")"
  expect_ok "train lm from the checkpoint (--init)" "$bin" train --task lm --data "$text" "${run[@]}" --init "$dir/lm/best" --checkpoint "$dir/lm2"
  grep -q '"metric": *"bits_per_char"\|bits_per_char' "$dir/lm2/latest/train_state.json" && ok || bad "fine-tuning a byte model left byte mode: $(cat "$dir/lm2/latest/train_state.json")"
  expect_ok "train mlm" "$bin" train --task mlm --data "$text" "${tiny[@]}" --checkpoint "$dir/mlm"
  [ -f "$dir/mlm/best/tokenizer.json" ] && ok || bad "mlm checkpoint has no tokenizer.json"
fi
finish "cli usage: "
