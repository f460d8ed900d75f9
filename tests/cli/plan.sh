#!/usr/bin/env bash
# The plan search (`clattn approx --target`) on KWT-1's FSDD clips, and plan files: written by the
# search, read back by --plan wherever a plan is accepted, and refused by name when malformed.
# Usage: bash tests/cli/plan.sh /path/to/clattn
set -u
bin=${1:?usage: plan.sh /path/to/clattn}
source "$(dirname "$0")/lib.sh"

# --- usage errors first, before any model is read
expect_exit 2 "target with attention" "searches for a plan" "$bin" approx --model x --features y --target 0.99 --attention full
expect_exit 2 "neither target nor plan" "give at least one --attention" "$bin" approx --model x --features y
echo '{"layers": ["full"]}' >"$dir/noplan.json"
expect_error "plan file without plan" "needs a string field" "$bin" generate --model x --plan "$dir/noplan.json"
echo '{"plan": "full;clusterd:clusters=3"}' >"$dir/badspec.json"
expect_error "plan file with a bad spec" "clusterd" "$bin" bench-model --random-bert --plan "$dir/badspec.json"
# A plan file's "layers" (one spec per layer of the model it was searched for) is the plan: a model
# of another depth refuses it instead of repeating its last spec, and a "plan" that disagrees with it
# is refused by layer.
echo '{"plan": "full;local:window=16", "layers": ["full", "local:window=16"]}' >"$dir/two.json"
expect_error "plan file for another depth" "names every layer" "$bin" bench-model --random-bert --layers 4 \
  --lengths 64 --repeat 1 --plan "$dir/two.json"
echo '{"plan": "full;local:window=16", "layers": ["full", "full", "local:window=16", "local:window=16"]}' >"$dir/four.json"
expect_error "plan and layers disagree" "gives layer 1 'local:window=16' but" \
  "$bin" bench-model --random-bert --layers 4 --lengths 64 --repeat 1 --plan "$dir/four.json"
echo '{"plan": "full;local:window=16", "layers": ["full", "local:window=16", "local:window=16", "local:window=16"]}' >"$dir/four.json"
expect_ok "plan file for this depth" "$bin" bench-model --random-bert --layers 4 --lengths 64 --repeat 1 --plan "$dir/four.json"
echo '{"plan": ' >"$dir/trunc.json"
expect_error "truncated plan file" "not valid JSON" "$bin" eval --checkpoint x --plan "$dir/trunc.json"
expect_error "missing plan file" "missing.json" "$bin" approx --model x --features y --plan "$dir/missing.json"

if need_data "plan search on KWT-1" kwt1/model.safetensors kwt1/features_fsdd_test.safetensors; then
  kwt=$data/kwt1
  # The first 40 FSDD clips (20 calibrate, 20 held out): the search runs a few dozen forwards, and
  # the sanitized build runs this test too.
  fsdd=$dir/fsdd40.safetensors
  # cut SRC DST FIRST COUNT: rows [FIRST, FIRST + COUNT) of every tensor of a safetensors file.
  cut() {
  /usr/bin/python3 - "$@" <<'PY'
import json, struct, sys
first, count = int(sys.argv[3]), int(sys.argv[4])
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head, body = json.loads(raw[8:8 + n]), raw[8 + n:]
out, parts, at = {}, [], 0
for name, t in sorted(((k, v) for k, v in head.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"][0]):
    a, b = t["data_offsets"]
    row = (b - a) // t["shape"][0]
    keep = row * count
    out[name] = {"dtype": t["dtype"], "shape": [count] + t["shape"][1:], "data_offsets": [at, at + keep]}
    parts.append(body[a + row * first:a + row * first + keep])
    at += keep
h = json.dumps(out).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(h)) + h + b"".join(parts))
PY
  }
  cut "$kwt/features_fsdd_test.safetensors" "$fsdd" 0 40 || bad "could not cut the FSDD subset"
  cut "$kwt/features_fsdd_test.safetensors" "$dir/held.safetensors" 20 20 || bad "could not cut the held-out clips"
  expect_exit 2 "bad metric" "--metric must be" "$bin" approx --model "$kwt" --features "$fsdd" --target 0.9 --metric top5
  expect_exit 2 "target out of range" "--target must be in" "$bin" approx --model "$kwt" --features "$fsdd" --target 1.5
  # A length whose timing would take hours, or more memory than the machine has, is refused with
  # the estimate before anything is timed.
  expect_error "length past an hour" "would take about" "$bin" approx --model "$kwt" --features "$fsdd" --target 0.9 --length 1000000
  expect_error "length past memory" "approx: timing 'clustered" "$bin" approx --model "$kwt" --features "$fsdd" --target 0.9 --length 60000000 --candidates 'clustered:clusters=25'
  # Two candidates priced by their work models at N = 2048 (no timing: the plan is the same on any
  # machine, loaded or not, so what it holds can be asserted), a target the cheap one reaches on
  # most layers; run twice, the same plan and costs.
  cands='clustered:clusters=25;improved-clustered:clusters=25,topk=32'
  for run in 1 2; do
    expect_ok "search $run" "$bin" approx --model "$kwt" --features "$fsdd" --target 0.97 --length 2048 --threads 2 \
      --candidates "$cands" --cost work --plan-out "$dir/plan$run.json"
  done
  cp "$dir/plan1.json" "$dir/plan.json"
  grep -q "^plan: " "$dir/out" && grep -q "held out (20)" "$dir/out" && grep -q "GOP per forward" "$dir/out" && ok ||
    bad "search report: $(head -c 800 "$dir/out")"
  /usr/bin/python3 - "$dir/plan1.json" "$dir/plan2.json" <<'PY' && ok || bad "plan.json: $(head -c 600 "$dir/plan.json")"
import json, sys
d, again = (json.load(open(f)) for f in sys.argv[1:3])
assert (d["layers"], d["costs"], d["calibration"]) == (again["layers"], again["costs"], again["calibration"]), (d, again)
cands = ["clustered:clusters=25", "improved-clustered:clusters=25,topk=32"]
assert d["cost"] == "work" and d["cost_unit"] == "GOP" and set(d["costs"]) == {"full", *cands}, d
assert 0 < d["costs"]["clustered:clusters=25"] < d["costs"]["improved-clustered:clusters=25,topk=32"] < d["costs"]["full"], d
# Every evaluated plan is recorded with its cost and metric (the first is full attention), and the
# calibration data by name and hash.
ev = d["evaluations"]
assert ev[0]["plan"] == ";".join(["full"] * 12) and abs(ev[0]["cost"] - d["full_attention_cost"]) < 1e-9 * d["full_attention_cost"], ev[0]
assert any(e["plan"] == d["plan"] for e in ev) and all(set(e) == {"plan", "cost", "value"} for e in ev), ev
assert d["calibration"]["data"].endswith(".safetensors") and "hash" in d["calibration"]["data_hash"], d["calibration"]
assert d["calibration"]["data_hash"] == again["calibration"]["data_hash"]
layers = d["layers"]
assert len(layers) == 12 and d["plan"] == ";".join(layers), d
assert all(l in ("full", "clustered:clusters=25", "improved-clustered:clusters=25,topk=32") for l in layers), layers
assert any(l != "full" for l in layers), "nothing approximated at a 0.97 target"
assert d["calibration"]["items"] == 20 and d["calibration"]["value"] >= 0.97, d["calibration"]
assert d["held_out"]["items"] == 20 and 0 <= d["held_out"]["agreement"] <= 1
assert d["length"] == 2048 and 0 < d["attention_cost_ratio"] < 1, d
PY
  # The plan the search returned, measured again on the held-out clips alone (the last 20) by
  # approx itself, not read from the search's report: the same agreement.
  expect_ok "the plan re-measured on the held-out clips" "$bin" approx --model "$kwt" --features "$dir/held.safetensors" \
    --plan "$dir/plan.json" --repeat 1 --json "$dir/held.json"
  /usr/bin/python3 - "$dir/plan.json" "$dir/held.json" <<'PY' && ok || bad "held-out re-measure: $(head -c 600 "$dir/held.json")"
import json, sys
d, m = (json.load(open(f)) for f in sys.argv[1:3])
row = [r for r in m["results"] if r["spec"] != "full"][0]
assert abs(row["agreement"] - d["held_out"]["agreement"]) < 1e-12, (row, d["held_out"])
PY
  # The search drawn: cost against agreement of every evaluated plan, its front and the choice.
  expect_ok "plot --plan-search" "$bin" plot --plan-search "$dir/plan.json" --output "$dir/search.png"
  /usr/bin/python3 -c 'import struct,sys; b=open(sys.argv[1],"rb").read(); assert b[:8]==b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", b[16:24])==(1100, 700) and len(b) > 20000, len(b)' \
    "$dir/search.png" && ok || bad "plot --plan-search: not the 1100 x 700 PNG: $(cat "$dir/err")"
  expect_error "plot --plan-search of a bench file" "is not a plan search" "$bin" plot --plan-search "$fsdd" --output "$dir/x.png"
  # The file is a plan wherever one is accepted: approx measures it as --attention would.
  expect_ok "approx --plan" "$bin" approx --model "$kwt" --features "$fsdd" --plan "$dir/plan.json" --repeat 1
  plan=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["plan"])' "$dir/plan.json")
  grep -qF "${plan:0:40}" "$dir/out" && ok || bad "approx --plan did not run the plan: $(head -c 600 "$dir/out")"
  # bench-model shows a plan file's plan by the file's name, and its JSON holds the plan itself.
  expect_ok "bench-model --plan" "$bin" bench-model --model "$kwt" --features "$fsdd" --plan "$dir/plan.json" --repeat 1 \
    --threads 1 --json "$dir/bm.json"
  grep -q "^plan.json " "$dir/out" && ok || bad "bench-model --plan: the row does not name plan.json: $(head -c 600 "$dir/out")"
  /usr/bin/python3 -c 'import json,sys; r=[x for x in json.load(open(sys.argv[1]))["results"] if x["attention"]=="plan.json"][0]; assert r["plan"].startswith(sys.argv[2]), r' \
    "$dir/bm.json" "${plan:0:40}" && ok || bad "bench-model --plan json: $(head -c 600 "$dir/bm.json")"
  # A KL bound: the metric's direction is at most. Costs timed here (the default), in ms.
  expect_ok "search by KL" "$bin" approx --model "$kwt" --features "$fsdd" --target 0.05 --metric kl --length 256 \
    --threads 2 --candidates 'clustered:clusters=25' --plan-out "$dir/kl.json"
  /usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["metric"]=="kl" and d["calibration"]["value"] <= 0.05 and d["cost"]=="timed" and d["cost_unit"]=="ms" and d["costs"]["full"] > 0, d' \
    "$dir/kl.json" && ok || bad "kl plan: $(head -c 400 "$dir/kl.json")"
  expect_exit 2 "bad cost" "--cost must be timed or work" "$bin" approx --model "$kwt" --features "$fsdd" --target 0.9 --cost fast
  # A target nothing reaches (a KL of exactly 0 from an approximation): said, the plan full attention.
  expect_ok "unreachable target" "$bin" approx --model "$kwt" --features "$fsdd" --target 0 --metric kl --length 256 \
    --threads 2 --candidates 'clustered:clusters=3' --plan-out "$dir/none.json"
  grep -q "cannot be met" "$dir/out" && ok || bad "unreachable target not said: $(tail -c 400 "$dir/out")"
fi
finish "cli plan: "
