#!/usr/bin/env bash
# Input files that could hang or exhaust the CLI, and the messages that name what is wrong: a FIFO
# (or device, or directory) where a file is read is refused at once, never waited on (every command
# runs under `timeout`, so a hang fails the check instead of the suite); /dev/zero and oversized
# files are refused by type or size; a tokenizer whose steps grow text exponentially is refused at
# load; config fields out of range, wrong model folders and token sequences past a model's context
# are named; approx prints full attention's own row and says when a causal clustered plan is
# inactive; bench-model estimates a random BERT's memory before building it.
# Usage: bash tests/cli/inputs.sh /path/to/clattn
set -u
bin=${1:?usage: inputs.sh /path/to/clattn}
source "$(dirname "$0")/lib.sh"
t() { timeout 60 "$@"; }  # exit 124 (a failed expectation) instead of a hang

expect_ok "make-inputs" "$bin" make-inputs --output "$dir/in.safetensors" --heads 2 --n 40 --dim 8 --with-grad
mkfifo "$dir/fifo"

# --- FIFOs, devices and directories where a file is read.
expect_exit 1 "attend --input FIFO" "not a regular file (a FIFO)" t "$bin" attend --spec full --input "$dir/fifo" \
  --output "$dir/o.safetensors"
expect_exit 1 "attend --input /dev/zero" "not a regular file (a character device)" t "$bin" attend --spec full \
  --input /dev/zero --output "$dir/o.safetensors"
expect_exit 1 "attend --input directory" "not a regular file (a directory)" t "$bin" attend --spec full \
  --input "$dir" --output "$dir/o.safetensors"
expect_exit 1 "plot --bench FIFO" "FIFO" t "$bin" plot --bench "$dir/fifo" --output "$dir/x.png"
expect_exit 1 "plot --bench /dev/zero" "character device" t "$bin" plot --bench /dev/zero --output "$dir/x.png"
expect_exit 1 "plot --logs FIFO" "FIFO" t "$bin" plot --logs "$dir/fifo" --output "$dir/x.png"
expect_exit 1 "train --data FIFO" "FIFO" t "$bin" train --task mlm --data "$dir/fifo" --steps 1
# A bench JSON above the size limit is refused before it is read (a sparse file: no disk used).
truncate -s 70M "$dir/huge.json"
expect_exit 1 "plot --bench of 70 MB" "accepted" t "$bin" plot --bench "$dir/huge.json" --output "$dir/x.png"

# --- model folders: the reason a file cannot be read, FIFOs in every place a model is read from.
mkdir -p "$dir/empty" "$dir/noperm"
expect_exit 1 "--model without config.json" "No such file or directory" t "$bin" generate --model "$dir/empty" --tokens 1
printf 'x' >"$dir/plainfile"
expect_exit 1 "--model that is a file" "Not a directory" t "$bin" generate --model "$dir/plainfile" --tokens 1
if [ "$(id -u)" != 0 ]; then
  echo '{}' >"$dir/noperm/config.json"
  chmod 000 "$dir/noperm/config.json"
  expect_exit 1 "--model with an unreadable config.json" "Permission denied" t "$bin" generate --model "$dir/noperm" --tokens 1
fi
if need_data "model files as FIFOs" stories260k kwt1; then
  st=$data/stories260k
  mkdir "$dir/m1" "$dir/m2" "$dir/m3" "$dir/m4" "$dir/m5"
  mkfifo "$dir/m1/config.json"
  expect_exit 1 "config.json FIFO" "FIFO" t "$bin" generate --model "$dir/m1" --tokens 1
  cp "$st/config.json" "$st/tokenizer.json" "$dir/m2/" && mkfifo "$dir/m2/model.safetensors"
  expect_exit 1 "model.safetensors FIFO" "FIFO" t "$bin" generate --model "$dir/m2" --tokens 1
  cp "$st/config.json" "$st/model.safetensors" "$dir/m3/" && mkfifo "$dir/m3/tokenizer.json"
  expect_exit 1 "tokenizer.json FIFO" "FIFO" t "$bin" generate --model "$dir/m3" --tokens 1
  cp "$st/config.json" "$st/model.safetensors" "$dir/m4/" && ln -s /dev/zero "$dir/m4/tokenizer.json"
  expect_exit 1 "tokenizer.json -> /dev/zero" "character device" t "$bin" generate --model "$dir/m4" --tokens 1
  # A sharded checkpoint: a FIFO shard, then a shard linked to a file of another format.
  cp "$st/config.json" "$st/tokenizer.json" "$dir/m5/"
  printf '{"weight_map":{"model.embed_tokens.weight":"a.safetensors"}}' >"$dir/m5/model.safetensors.index.json"
  mkfifo "$dir/m5/a.safetensors"
  expect_exit 1 "shard FIFO" "FIFO" t "$bin" generate --model "$dir/m5" --tokens 1
  rm "$dir/m5/a.safetensors" && ln -s "$st/tokenizer.json" "$dir/m5/a.safetensors"
  expect_exit 1 "shard linked to a JSON file" "not a safetensors file (a symlink to" t "$bin" generate --model "$dir/m5" --tokens 1
  grep -q "a.safetensors" "$dir/err" && ok || bad "the shard error does not name the shard: $(cat "$dir/err")"
  expect_exit 1 "approx --token-file FIFO" "FIFO" t "$bin" approx --model "$st" --token-file "$dir/fifo" --attention full
  expect_exit 1 "approx --text FIFO" "FIFO" t "$bin" approx --model "$st" --text "$dir/fifo" --attention full
  expect_exit 1 "approx --text /dev/zero" "character device" t "$bin" approx --model "$st" --text /dev/zero --attention full

  # A tokenizer whose normalizer doubles the text forty times (13 KB of JSON, 2^40 growth).
  mkdir "$dir/m6" && cp "$st/config.json" "$st/model.safetensors" "$dir/m6/"
  python3 - "$st/tokenizer.json" "$dir/m6/tokenizer.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
t["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "Replace", "pattern": {"String": "a"}, "content": "aa"}] * 40}
json.dump(t, open(sys.argv[2], "w"))
PY
  expect_exit 1 "exponential normalizer" "can grow a text" t "$bin" generate --model "$dir/m6" --prompt "a cat" --tokens 1

  # Config fields out of range are named with their range.
  mkdir "$dir/m7" && cp "$st/model.safetensors" "$st/tokenizer.json" "$dir/m7/"
  for bad_scale in 1e300 -0.5; do
    python3 - "$st/config.json" "$dir/m7/config.json" "$bad_scale" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["attention_scale"] = float(sys.argv[3])
json.dump(c, open(sys.argv[2], "w"))
PY
    expect_exit 1 "attention_scale $bad_scale" '"attention_scale"' t "$bin" generate --model "$dir/m7" --tokens 1
    grep -q "out of range" "$dir/err" && ok || bad "attention_scale $bad_scale: $(cat "$dir/err")"
  done

  # Tokens past the model's context (512): refused by approx and inspect, truncated with a note by
  # approx --text.
  python3 - "$dir/long.safetensors" <<'PY'
import json, struct, sys
n = 2000
h = json.dumps({"tokens": {"dtype": "I32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + struct.pack("<%di" % n, *([1] + [(7 * i) % 500 + 3 for i in range(1, n)])))
PY
  expect_exit 1 "approx --token-file past the context" "past the model's context of 512" t "$bin" approx --model "$st" \
    --token-file "$dir/long.safetensors" --attention full
  expect_exit 1 "inspect --token-file past the context" "past the model's context of 512" t "$bin" inspect --model "$st" \
    --token-file "$dir/long.safetensors" --attention full --output "$dir/x.png"
  for i in $(seq 1 400); do echo "Once upon a time there was a little cat named Tom."; done >"$dir/long.txt"
  expect_ok "approx --text longer than the context" t "$bin" approx --model "$st" --text "$dir/long.txt" --attention full
  grep -q "note: .* the first 512 (the model's context) are used" "$dir/err" && ok || bad "no truncation note: $(cat "$dir/err")"

  # approx: full attention's own row first; a causal clustered plan whose block covers the sequence says so.
  expect_ok "approx baseline and inactive note" t "$bin" approx --model "$st" --token-file "$st/reference_logits.safetensors" \
    --attention 'improved-clustered:clusters=4' --attention 'improved-clustered:clusters=4,block=64' --json "$dir/a.json"
  head -3 "$dir/out" | tail -1 | grep -q "^full (baseline) .* 1.0000 " && ok || bad "no baseline row first: $(cat "$dir/out")"
  [ "$(grep -c "approximation is inactive" "$dir/err")" = 1 ] && grep -q "block of 512 positions covers the whole sequence of 200" "$dir/err" &&
    ok || bad "inactive note (once, for block 512 only): $(cat "$dir/err")"
  grep -q '"baseline"' "$dir/a.json" && ok || bad "approx --json has no baseline"
  # One timed call: the accuracy is what is checked. These two read regular files, so no `t`
  # bound: under ASan at one thread on a 2-core AVX2 EPYC one KWT-1 forward of the 100 clips takes
  # 18 s, and baseline + plan (a warm-up and a timed call each) passed 60 s; ctest's bound holds.
  expect_ok "approx kwt baseline accuracy" "$bin" approx --model "$data/kwt1" \
    --features "$data/kwt1/features_espeak_keywords.safetensors" --attention full --repeat 1
  grep -q "^full (baseline) .* 1.0000 *0.8700 " "$dir/out" && ok || bad "KWT-1 baseline accuracy (87 %): $(cat "$dir/out")"
  # The -o formats of every results command: jsonl rows (the baseline marked, no text forms), csv.
  expect_ok "approx -o jsonl" "$bin" approx --model "$data/kwt1" \
    --features "$data/kwt1/features_espeak_keywords.safetensors" --attention full --repeat 1 -o jsonl
  /usr/bin/python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; assert len(r)==2 and r[0]["baseline"] is True and r[0]["spec"]=="full" and "label" not in r[0] and r[1]["agreement"]==1.0 and r[1]["accuracy"]==0.87, r' \
    "$dir/out" && ok || bad "approx -o jsonl: $(cat "$dir/out")"
  expect_exit 2 "approx --target -o json" "--target prints its search as text" t "$bin" approx --model "$data/kwt1" \
    --features "$data/kwt1/features_espeak_keywords.safetensors" --target 0.9 -o json
fi

# --- bench-model: a random BERT too large for memory is refused with the estimate, before building it.
expect_exit 1 "bench-model --layers 100000000" "GB available" t "$bin" bench-model --random-bert --layers 100000000 \
  --lengths 128 --repeat 1
grep -q "parameters of a random BERT of 100000000 layers" "$dir/err" && ok || bad "bench-model estimate: $(cat "$dir/err")"

finish "inputs cli: "
