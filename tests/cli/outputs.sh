#!/usr/bin/env bash
# One rule for every command that writes files: an output is never one of the command's inputs, a
# file inside a model folder it reads, or another of its outputs — by any name (another spelling,
# a symlink, a hard link). Each refusal is a usage error (exit 2) that leaves the input untouched.
# Models are copied into the scratch folder first: a refusal that failed must never write into
# the shared data.
# Usage: bash tests/cli/outputs.sh /path/to/clattn
set -u
bin=${1:?usage: outputs.sh /path/to/clattn}
source "$(dirname "$0")/lib.sh"

# expect_refused DESCRIPTION NEEDLE FILE CMD...: exit 2 naming NEEDLE, and FILE unchanged
expect_refused() {
  local what=$1 needle=$2 file=$3; shift 3
  local before
  before=$(sha256sum <"$file")
  expect_exit 2 "$what" "$needle" "$@"
  [ "$(sha256sum <"$file")" = "$before" ] && ok || bad "$what: '$file' was changed"
}

# --- files that need no model: attend, plot, bench, train
expect_ok "make-inputs" "$bin" make-inputs --output "$dir/in.safetensors" --n 8 --dim 4 --heads 1
ln "$dir/in.safetensors" "$dir/hard.safetensors"
expect_refused "attend --output a hard link of --input" "is the command's input --input" "$dir/in.safetensors" \
  "$bin" attend --spec full --input "$dir/in.safetensors" --output "$dir/hard.safetensors"
printf '{"n": 1}\n' >"$dir/bench.png"
expect_refused "plot --output onto a --bench file" "is the command's input --bench" "$dir/bench.png" \
  "$bin" plot --bench "$dir/bench.png" --output "$dir/bench.png"
ln -s "$dir/bench.png" "$dir/link.png"
expect_refused "plot --output through a symlink" "is the command's input --bench" "$dir/bench.png" \
  "$bin" plot --bench "$dir/link.png" --output "$dir/bench.png"
expect_exit 2 "bench --json and --plot one file" "is also --json" \
  "$bin" bench --attention full --lengths 16 --json "$dir/out.png" --plot "$dir/out.png"
printf 'some text for a tiny language model\n' >"$dir/text.txt"
expect_refused "train --log onto --data" "is the command's input --data" "$dir/text.txt" \
  "$bin" train --task lm --data "$dir/text.txt" --steps 1 --log "$dir/text.txt"

# --- a model folder and its feature set (KWT-1)
if need_data "outputs onto a KWT model's inputs" kwt1/model.safetensors kwt1/features_speech_commands.safetensors; then
  m=$dir/kwt1
  mkdir "$m"
  cp "$data/kwt1/config.json" "$data/kwt1/model.safetensors" "$m/"
  cp "$data/kwt1/features_speech_commands.safetensors" "$dir/f.safetensors"
  chmod u+w "$m"/* "$dir/f.safetensors"
  f=$dir/f.safetensors
  expect_refused "approx --json onto --features" "approx: --json '$f' is the command's input --features '$f'" "$f" \
    "$bin" approx --model "$m" --features "$f" --attention full --json "$f"
  expect_refused "approx --json onto --features by another spelling" "is the command's input --features" "$f" \
    "$bin" approx --model "$m" --features "$f" --attention full --json "$dir/./nowhere/../f.safetensors"
  ln "$f" "$dir/f_hard.safetensors"
  expect_refused "approx --json onto a hard link of --features" "is the command's input --features" "$f" \
    "$bin" approx --model "$m" --features "$f" --attention full --json "$dir/f_hard.safetensors"
  expect_refused "approx --plan-out into the model folder" "is inside the command's input --model" "$m/config.json" \
    "$bin" approx --model "$m" --features "$f" --target 0.9 --plan-out "$m/config.json"
  ln -s "$m" "$dir/mlink"
  expect_refused "approx --plan-out into the model folder through a symlink" "is inside the command's input --model" \
    "$m/config.json" "$bin" approx --model "$dir/mlink" --features "$f" --target 0.9 --plan-out "$m/config.json"
  ln "$m/model.safetensors" "$dir/weights_hard.safetensors"
  expect_refused "approx --json onto a hard link of the model's weights" "a file of the command's input --model" \
    "$m/model.safetensors" "$bin" approx --model "$m" --features "$f" --attention full --json "$dir/weights_hard.safetensors"
  expect_refused "bench-model --json onto --features" "is the command's input --features" "$f" \
    "$bin" bench-model --model "$m" --features "$f" --json "$f"
  expect_refused "inspect --output into the model folder" "is inside the command's input --model" "$m/config.json" \
    "$bin" inspect --model "$m" --features "$f" --attention clustered:clusters=4 --output "$m/config.png"
  expect_exit 2 "inspect --output and --clusters-output one file" "is also --output" \
    "$bin" inspect --model "$m" --features "$f" --attention clustered:clusters=4 --output "$dir/a.png" --clusters-output "$dir/a.png"
  echo '{"plan": "full"}' >"$dir/plan.json"
  expect_refused "approx --plan-out onto its --plan" "is the command's input --plan" "$dir/plan.json" \
    "$bin" approx --model "$m" --features "$f" --plan "$dir/plan.json" --json "$dir/plan.json"
fi

finish "cli outputs: "
