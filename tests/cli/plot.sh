#!/usr/bin/env bash
# The pictures: `clattn bench --plot`, `clattn plot --bench / --logs` and `clattn inspect` each
# write a PNG of the expected size (signature and IHDR width/height checked); wrong arguments exit 2
# with a message; a missing or failing gnuplot exits 1 naming the package (gnuplot-nox). inspect
# runs on make-inputs files and on KWT-1 features and stories260k tokens from the real data
# (lib.sh: need_data). Needs gnuplot with pngcairo (scripts/install-deps.sh installs gnuplot-nox).
# Usage: bash tests/cli/plot.sh /path/to/clattn
set -u
bin=${1:?usage: plot.sh /path/to/clattn}
source "$(dirname "$0")/lib.sh"

# be32 FILE OFFSET: the big-endian 32-bit unsigned integer at OFFSET
be32() {
  local b
  read -r -a b <<<"$(od -An -t u1 -j "$2" -N 4 "$1")"
  echo $(((b[0] << 24) | (b[1] << 16) | (b[2] << 8) | b[3]))
}
# expect_png DESCRIPTION FILE WIDTH HEIGHT: a PNG (signature, IHDR first) of that size
expect_png() {
  local what=$1 file=$2 w=$3 h=$4
  if [ ! -s "$file" ]; then bad "$what: $file missing or empty"; return; fi
  local sig ihdr
  sig=$(od -An -t x1 -N 8 "$file" | tr -d ' \n')
  ihdr=$(od -An -c -j 12 -N 4 "$file" | tr -d ' \n')
  if [ "$sig" != "89504e470d0a1a0a" ] || [ "$ihdr" != "IHDR" ]; then bad "$what: $file is not a PNG ($sig $ihdr)"; return; fi
  local gw gh
  gw=$(be32 "$file" 16)
  gh=$(be32 "$file" 20)
  [ "$gw" = "$w" ] && [ "$gh" = "$h" ] && ok || bad "$what: $file is ${gw}x${gh}, expected ${w}x${h}"
}

if ! command -v gnuplot >/dev/null; then
  echo "FAIL: gnuplot is not installed (Debian package gnuplot-nox; scripts/install-deps.sh)"
  exit 1
fi

# --- bench --plot and plot --bench ---------------------------------------------------------------
small=(--attention 'full;linear;clustered:clusters=4' --lengths 64,128 --heads 2 --dim 16 --repeat 1 --threads 2)
expect_ok "bench --plot" "$bin" bench "${small[@]}" --plot "$dir/bench.png" --json "$dir/fwd.json"
expect_png "bench --plot" "$dir/bench.png" 1400 640
expect_ok "bench forward+backward causal json" "$bin" bench --attention 'full;linear' --lengths 64,128 --heads 2 \
  --dim 16 --repeat 1 --backward --causal --json "$dir/bwd.json"
expect_ok "plot --bench two files" "$bin" plot --bench "$dir/fwd.json" "$dir/bwd.json" --output "$dir/overlay.png"
expect_png "plot --bench overlay" "$dir/overlay.png" 1400 640
expect_ok "bench -o jsonl" "$bin" bench "${small[@]}" -o jsonl
cp "$dir/out" "$dir/rows.jsonl"
expect_ok "plot --bench jsonl rows" "$bin" plot --bench "$dir/rows.jsonl" --output "$dir/rows.png"
expect_png "plot --bench jsonl" "$dir/rows.png" 1400 640
printf '{"machine":{},"results":[{"spec":"full","n":64,"ms_median":null,"error":"boom"}]}\n' >"$dir/failed.json"
expect_exit 1 "plot --bench with only failed rows" "no bench result" "$bin" plot --bench "$dir/failed.json" --output "$dir/x.png"
printf 'not json\n' >"$dir/garbage.json"
expect_exit 1 "plot --bench on garbage" "line 1" "$bin" plot --bench "$dir/garbage.json" --output "$dir/x.png"
expect_exit 1 "plot --bench on a missing file" "cannot open: No such file" "$bin" plot --bench "$dir/none.json" --output "$dir/x.png"

# --- plot --logs on synthetic train logs ---------------------------------------------------------
for run in full clustered; do
  {
    echo "{\"config\":{\"attention\":\"$run:clusters=8\",\"task\":\"mlm\"},\"metric\":\"bpc\"}"
    for s in 1 2 3 4 5 6 7 8 9 10; do
      echo "{\"step\":$s,\"loss\":$(awk -v s=$s 'BEGIN{print 3/s+1}'),\"lr\":0.001,\"ms\":12.5,\"tokens_per_s\":1000,\"unknown\":[1,2]}"
      if [ $((s % 5)) -eq 0 ]; then echo "{\"step\":$s,\"eval_loss\":2.0,\"eval_metric\":$(awk -v s=$s 'BEGIN{print 4/s+1}'),\"elapsed_s\":$((s * 3))}"; fi
    done
    printf '{"step":11,"loss":1.'  # a run killed mid-line
  } >"$dir/$run.jsonl"
done
expect_ok "plot --logs" "$bin" plot --logs "$dir/full.jsonl" "$dir/clustered.jsonl" --output "$dir/logs.png"
expect_png "plot --logs" "$dir/logs.png" 1500 520
grep -q "not JSON objects skipped" "$dir/err" && ok || bad "plot --logs does not say it skipped the torn line: $(cat "$dir/err")"
printf '{"step":1,"loss":2.0}\n{"step":2,"loss":1.5}\n' >"$dir/bare.jsonl"  # no header, no eval lines
expect_ok "plot --logs without header or eval" "$bin" plot --logs "$dir/bare.jsonl" --output "$dir/bare.png"
expect_png "plot --logs bare" "$dir/bare.png" 1500 520
printf '{"hello":1}\nnot json\n' >"$dir/empty.jsonl"
expect_exit 1 "plot --logs with no usable line" "no usable line" "$bin" plot --logs "$dir/empty.jsonl" --output "$dir/x.png"

# --- usage errors and a missing gnuplot ----------------------------------------------------------
expect_exit 2 "plot with neither input" "exactly one of" "$bin" plot --output "$dir/x.png"
expect_exit 2 "plot with both inputs" "exactly one of" "$bin" plot --bench "$dir/fwd.json" --logs "$dir/bare.jsonl" --output "$dir/x.png"
expect_exit 2 "plot without --output" "out" "$bin" plot --bench "$dir/fwd.json"
expect_exit 2 "plot --output not a png" ".png" "$bin" plot --bench "$dir/fwd.json" --output "$dir/x.txt"
expect_exit 2 "bench --plot not a png" ".png" "$bin" bench "${small[@]}" --plot "$dir/x.svg"
expect_exit 1 "CLATTN_GNUPLOT=/nonexistent" "gnuplot-nox" env CLATTN_GNUPLOT=/nonexistent "$bin" plot --bench "$dir/fwd.json" --output "$dir/x.png"
expect_exit 1 "no gnuplot on PATH" "gnuplot-nox" env PATH=/nonexistent "$bin" plot --logs "$dir/bare.jsonl" --output "$dir/x.png"
expect_exit 1 "bench --plot without gnuplot fails before the sweep" "gnuplot-nox" env CLATTN_GNUPLOT=/nonexistent \
  "$bin" bench "${small[@]}" --plot "$dir/x.png"
grep -q "ms_median" "$dir/out" && bad "bench ran its sweep before failing on the missing gnuplot" || ok
expect_exit 1 "a gnuplot that fails" "exit status 1" env CLATTN_GNUPLOT=/bin/false "$bin" plot --logs "$dir/bare.jsonl" --output "$dir/x.png"
expect_exit 1 "inspect without gnuplot" "gnuplot-nox" env CLATTN_GNUPLOT=/nonexistent "$bin" inspect --input "$dir/none" \
  --attention full --output "$dir/x.png"
[ -e "$dir/x.png" ] && bad "a failed plot left $dir/x.png behind" || ok

# --- inspect on attend input files --------------------------------------------------------------
expect_ok "make-inputs" "$bin" make-inputs --output "$dir/in.safetensors" --batch 2 --heads 2 --n 150 --dim 16 --seed 5
expect_ok "inspect clustered" "$bin" inspect --input "$dir/in.safetensors" --index 1 --head 1 \
  --attention clustered:clusters=6 --output "$dir/cl.png"
expect_png "inspect heatmaps" "$dir/cl.png" 1500 560
expect_png "inspect clusters (derived name)" "$dir/cl-clusters.png" 900 600
grep -q "^clusters: 6, R2 of position" "$dir/out" && ok || bad "inspect clustered summary: $(cat "$dir/out")"
grep -q "reconstruction check" "$dir/err" && ok || bad "inspect prints no reconstruction check: $(cat "$dir/err")"
expect_ok "inspect full" "$bin" inspect --input "$dir/in.safetensors" --attention full --output "$dir/full.png"
awk '/mean row L1/ { exit !($NF < 1e-5) }' "$dir/out" && ok || bad "full's reconstruction differs from exact: $(cat "$dir/out")"
[ -e "$dir/full-clusters.png" ] && bad "full made a cluster picture" || ok
grep -q "no cluster picture" "$dir/err" && ok || bad "inspect full does not say why there is no cluster picture"
# Every causal-capable variant with masks (reformer shares q and k), and an explicit clusters file.
expect_ok "make-inputs masks" "$bin" make-inputs --output "$dir/m.safetensors" --batch 2 --heads 4 --kv-heads 2 --n 90 \
  --dim 8 --query-lengths 90,61 --key-lengths 90,61
for spec in smyrf:q_cluster=16,k_cluster=16 routing:clusters=4,centroids=ema topk:topk=8 local:window=16 linear \
  improved-clustered:clusters=5,topk=8; do
  causal=--causal
  case $spec in improved-clustered*) causal= ;; esac
  expect_ok "inspect $spec" "$bin" inspect --input "$dir/m.safetensors" --index 1 --head 3 $causal --attention "$spec" \
    --output "$dir/v.png" --clusters-output "$dir/v_c.png"
  expect_png "inspect $spec" "$dir/v.png" 1500 560
done
expect_png "inspect improved-clustered clusters" "$dir/v_c.png" 900 600
# Causal clustered: each block of positions has its own clusters (numbered block after block).
expect_ok "inspect causal clustered" "$bin" inspect --input "$dir/m.safetensors" --causal --head 2 \
  --attention clustered:clusters=4,block=32 --output "$dir/cc.png"
expect_png "inspect causal clustered" "$dir/cc.png" 1500 560
expect_png "inspect causal clustered clusters" "$dir/cc-clusters.png" 900 600
# clusters >= segment: every row is attended exactly, so no query is in a cluster and no cluster picture is drawn.
expect_ok "inspect causal clustered, every row exact" "$bin" inspect --input "$dir/m.safetensors" --causal --head 2 \
  --attention clustered:clusters=300,block=32 --output "$dir/ex.png"
expect_png "inspect causal clustered, every row exact" "$dir/ex.png" 1500 560
[ -e "$dir/ex-clusters.png" ] && bad "inspect drew clusters where every row is exact" || ok
grep -q "no cluster picture" "$dir/err" && ok || bad "inspect does not say why there is no cluster picture: $(cat "$dir/err")"
expect_exit 1 "inspect reformer on grouped heads" "same heads" "$bin" inspect --input "$dir/m.safetensors" --attention reformer --output "$dir/x.png"
expect_ok "inspect reformer causal" "$bin" inspect --input "$dir/in.safetensors" --causal --attention reformer:chunk=16 --output "$dir/rf.png"
expect_png "inspect reformer" "$dir/rf.png" 1500 560
expect_png "inspect reformer chunks" "$dir/rf-clusters.png" 900 600
expect_exit 2 "inspect --head out of range" "out of range" "$bin" inspect --input "$dir/in.safetensors" --head 2 --attention full --output "$dir/x.png"
expect_exit 2 "inspect --index out of range" "out of range" "$bin" inspect --input "$dir/in.safetensors" --index 2 --attention full --output "$dir/x.png"
expect_exit 2 "inspect with --model and --input" "exactly one of" "$bin" inspect --input "$dir/in.safetensors" --model "$dir" --attention full --output "$dir/x.png"
expect_exit 2 "inspect with a bad spec" "attention" "$bin" inspect --input "$dir/in.safetensors" --attention clusterd --output "$dir/x.png"
expect_exit 2 "inspect without --attention" "attention" "$bin" inspect --input "$dir/in.safetensors" --output "$dir/x.png"
expect_exit 2 "inspect --output not a png" ".png" "$bin" inspect --input "$dir/in.safetensors" --attention full --output "$dir/x.jpg"
expect_exit 2 "inspect --layer -1" "layer" "$bin" inspect --input "$dir/in.safetensors" --layer -1 --attention full --output "$dir/x.png"
expect_ok "make-inputs long" "$bin" make-inputs --output "$dir/long.safetensors" --heads 1 --n 2100 --dim 4
expect_exit 1 "inspect refuses N > 2048" "2048" "$bin" inspect --input "$dir/long.safetensors" --attention full --output "$dir/x.png"
expect_exit 1 "inspect on a missing file" "none" "$bin" inspect --input "$dir/none" --attention full --output "$dir/x.png"

# --- inspect on the real models ------------------------------------------------------------------
if need_data "inspect on the real models" kwt1 stories260k; then
  expect_ok "inspect KWT-1" "$bin" inspect --model "$data/kwt1" --features "$data/kwt1/features_fsdd_test.safetensors" \
    --index 3 --layer 5 --head 0 --attention improved-clustered:clusters=25 --output "$dir/kwt.png"
  expect_png "inspect KWT-1" "$dir/kwt.png" 1500 560
  expect_png "inspect KWT-1 clusters" "$dir/kwt-clusters.png" 900 600
  expect_ok "inspect stories260k" "$bin" inspect --model "$data/stories260k" --token-file \
    "$data/stories260k/reference_logits.safetensors" --layer 2 --head 5 --attention routing:clusters=8,centroids=ema --output "$dir/st.png"
  expect_png "inspect stories260k" "$dir/st.png" 1500 560
  expect_png "inspect stories260k clusters" "$dir/st-clusters.png" 900 600
  expect_exit 2 "inspect --layer past the model" "5 layers" "$bin" inspect --model "$data/stories260k" --token-file \
    "$data/stories260k/reference_logits.safetensors" --layer 5 --attention full --output "$dir/x.png"
  expect_exit 1 "inspect reformer on a model" "reformer" "$bin" inspect --model "$data/stories260k" --token-file \
    "$data/stories260k/reference_logits.safetensors" --attention reformer --output "$dir/x.png"
  expect_exit 2 "inspect KWT with --tokens" "features" "$bin" inspect --model "$data/kwt1" --token-file \
    "$data/stories260k/reference_logits.safetensors" --attention full --output "$dir/x.png"
fi

# --- strings from data, file names and paths never run as gnuplot code ------------------------------
# Every gnuplot metacharacter: backquotes (command substitution inside double quotes), both quotes,
# backslash, $ and @ (macros), ; and # (command and comment separators), a line break, CR, tab,
# NUL and enhanced-text markup. Each backquoted command would create a file in the working folder.
pw=$dir/pw
mkdir -p "$pw"
cat >"$pw/evil.jsonl" <<'END'
{"config":{"attention":"full`touch PWNED-log` \" \\ ' ; # @x $(touch PWNED-sh) {}^_ %s \n`touch PWNED-nl`\r\t\u0000 end","task":"mlm"},"metric":"bpc`touch PWNED-metric`'\"\n`touch PWNED-metric2`"}
{"step":1,"loss":2.0}
{"step":1,"eval_metric":1.5,"elapsed_s":1}
END
cat >"$pw/evil-bench.jsonl" <<'END'
{"spec":"full`touch PWNED-bench`' \" \\ \n`touch PWNED-bench2` @x $1","n":64,"ms_median":1.0,"ms_min":0.9,"ms_max":1.3,"rss_mb":1,"mode":"fwd`touch PWNED-mode`"}
{"spec":"full`touch PWNED-bench`' \" \\ \n`touch PWNED-bench2` @x $1","n":128,"ms_median":3.0,"ms_min":2.5,"ms_max":4.0,"rss_mb":2}
END
evil_name='r`touch PWNED-file`'"'"'"; #$x@y'
evil_tmp='tmp`touch PWNED-tmpdir`'"'"'"'
cp "$pw/evil.jsonl" "$pw/$evil_name.jsonl"
cp "$dir/in.safetensors" "$pw/$evil_name.safetensors"
mkdir -p "$pw/$evil_tmp"
cd "$pw" || exit 1  # gnuplot runs in clattn's working folder: a command would create its file here
expect_ok "plot --logs with metacharacters" "$bin" plot --logs evil.jsonl "$evil_name.jsonl" \
  --label 'lab`touch PWNED-label`'"'" --label x --output "$pw/logs.png"
expect_png "plot --logs with metacharacters" "$pw/logs.png" 1500 520
expect_ok "plot --bench with metacharacters" "$bin" plot --bench evil-bench.jsonl --output "$pw/b.png"
expect_png "plot --bench with metacharacters" "$pw/b.png" 1400 640
expect_ok "inspect with metacharacters in the path" "$bin" inspect --input "$evil_name.safetensors" \
  --attention clustered:clusters=4 --output "$pw/i.png"
expect_ok "TMPDIR with metacharacters" env TMPDIR="$pw/$evil_tmp" "$bin" plot --logs evil.jsonl --output "$pw/t.png"
if need_data "inspect on a model path with metacharacters" kwt1; then
  evil_model='kwt`touch PWNED-model`'"'"'"; #@x'
  ln -s "$data/kwt1" "$pw/$evil_model"
  expect_ok "inspect --model with metacharacters" "$bin" inspect --model "$evil_model" \
    --features "$data/kwt1/features_fsdd_test.safetensors" --attention improved-clustered:clusters=25 --output "$pw/m.png"
fi
cd - >/dev/null || exit 1
pwned=$(find "$pw" -maxdepth 1 -name 'PWNED*')
[ -z "$pwned" ] && ok || bad "gnuplot ran commands from data or paths: $pwned"

# --- plot --bench refuses files that are not bench results, named for what they are ---------------
printf '{"model":"m","results":[{"spec":"full","seeds":1,"agreement":1.0,"ms":3}]}\n' >"$dir/approx.json"
expect_exit 1 "plot --bench on an approx result" "is an approx result" "$bin" plot --bench "$dir/approx.json" --output "$dir/x.png"
printf '{"checkpoint":"c","task":"mlm","seq":64,"results":[{"attention":"full","eval_loss":1}]}\n' >"$dir/eval.json"
expect_exit 1 "plot --bench on an eval result" "is an eval result" "$bin" plot --bench "$dir/eval.json" --output "$dir/x.png"
printf '{"machine":{},"results":[{"attention":"full","mode":"forward","n":128,"ms_median":2}]}\n' >"$dir/bm.json"
expect_exit 1 "plot --bench on a bench-model result" "bench-model result" "$bin" plot --bench "$dir/bm.json" --output "$dir/x.png"
expect_exit 1 "plot --bench on a training log" "training log" "$bin" plot --bench "$dir/full.jsonl" --output "$dir/x.png"

# --- bench pictures draw the spread: bars from ms_min to ms_max -------------------------------------
expect_ok "plot --bench keeping its script" env CLATTN_PLOT_KEEP="$dir/keep" "$bin" plot --bench "$pw/evil-bench.jsonl" \
  --output "$dir/spread.png"
grep -q "using 1:2:4:5 with yerrorlines" "$dir/keep/spread/plot.gp" && ok || bad "no error bars: $(grep plot "$dir/keep/spread/plot.gp")"
grep -q "^64 1 1 0.9 1.3$" "$dir/keep/spread/bench0.dat" && ok || bad "bench data without ms_min/ms_max: $(cat "$dir/keep/spread/bench0.dat")"

# --- plot --logs: runs of different metrics on separate rows; runs named by file and spec ----------
printf '{"config":{"attention":"full","task":"listops"},"metric":"accuracy"}\n{"step":1,"loss":2.3}\n{"step":1,"eval_metric":0.4,"metric":"accuracy","elapsed_s":2}\n' >"$dir/acc.jsonl"
expect_ok "plot --logs, two metrics" env CLATTN_PLOT_KEEP="$dir/keep" "$bin" plot --logs "$dir/full.jsonl" "$dir/acc.jsonl" \
  --output "$dir/two.png"
expect_png "plot --logs, two metrics: two rows" "$dir/two.png" 1500 1040
grep -q "2 metrics" "$dir/err" && ok || bad "plot --logs does not say it split the metrics: $(cat "$dir/err")"
grep -q "layout 2,3" "$dir/keep/two/plot.gp" && ok || bad "two metrics share a row: $(grep layout "$dir/keep/two/plot.gp")"
cp "$dir/full.jsonl" "$dir/again.jsonl"
expect_ok "plot --logs, one spec twice" env CLATTN_PLOT_KEEP="$dir/keep" "$bin" plot --logs "$dir/full.jsonl" "$dir/again.jsonl" \
  --output "$dir/same.png"
grep -q "title 'full:clusters=8 (full.jsonl)'" "$dir/keep/same/plot.gp" && grep -q "title 'full:clusters=8 (again.jsonl)'" \
  "$dir/keep/same/plot.gp" && ok || bad "two runs of one spec are not named by file: $(grep -o "title '[^']*'" "$dir/keep/same/plot.gp")"
expect_ok "plot --logs --label" env CLATTN_PLOT_KEEP="$dir/keep" "$bin" plot --logs "$dir/full.jsonl" "$dir/again.jsonl" \
  --label first --label second --output "$dir/lab.png"
grep -q "title 'full:clusters=8 (second)'" "$dir/keep/lab/plot.gp" && ok || bad "--label not in the legend"
expect_exit 2 "plot --label count" "once per --logs file" "$bin" plot --logs "$dir/full.jsonl" --label a --label b --output "$dir/x.png"

# --- inspect: as many colours as clusters ---------------------------------------------------------
expect_ok "inspect 25 clusters" env CLATTN_PLOT_KEEP="$dir/keep" "$bin" inspect --input "$dir/in.safetensors" --index 1 \
  --attention clustered:clusters=25 --output "$dir/c25.png"
clusters=$(awk '{print $2}' "$dir/keep/c25-clusters/groups.dat" | sort -u | wc -l)
colours=$(awk '{print $3}' "$dir/keep/c25-clusters/groups.dat" | sort -u | wc -l)
[ "$clusters" -ge 20 ] && [ "$colours" = "$clusters" ] && ok || bad "$clusters clusters drawn with $colours colours"

finish "plot.sh: "
