#!/usr/bin/env bash
# End-to-end checks of the clattn CLI: attend round trips and every error path exits non-zero with
# a message, never a crash. Usage: bash tests/cli/run.sh /path/to/clattn
set -u
bin=${1:?usage: run.sh /path/to/clattn}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# expect_ok DESCRIPTION CMD...: exit 0
expect_ok() {
  local what=$1; shift
  if "$@" >"$dir/out" 2>"$dir/err"; then ok; else bad "$what (exit $?): $(cat "$dir/err")"; fi
}
# expect_error DESCRIPTION NEEDLE CMD...: exit in [1, 127] and stderr mentions NEEDLE
expect_error() {
  local what=$1 needle=$2; shift 2
  "$@" >"$dir/out" 2>"$dir/err"
  local rc=$?
  if [ "$rc" -ge 1 ] && [ "$rc" -lt 128 ] && grep -qi -- "$needle" "$dir/err"; then ok
  else bad "$what: exit $rc, stderr: $(head -c 400 "$dir/err")"; fi
}

expect_ok "make-inputs" "$bin" make-inputs --output "$dir/in.safetensors" --batch 2 --heads 4 --kv-heads 2 --n 70 --m 90 --dim 16 --with-grad
expect_ok "attend full fwd+bwd" "$bin" attend --spec full --input "$dir/in.safetensors" --output "$dir/out.safetensors"
expect_ok "attend full causal" "$bin" attend --spec full:scale=0.2 --causal --input "$dir/in.safetensors" --output "$dir/out2.safetensors"
expect_ok "attend improved-clustered" "$bin" attend --spec improved-clustered:clusters=5,topk=4 --input "$dir/in.safetensors" --output "$dir/out3.safetensors"
# The output is itself a valid input to a second run (round trip through the reader).
[ -s "$dir/out.safetensors" ] && ok || bad "no output written"
ls "$dir" | grep -q '\.tmp\.' && bad "temporary file left behind" || ok

expect_error "missing input" "cannot open" "$bin" attend --spec full --input "$dir/nope.safetensors" --output "$dir/x.safetensors"
head -c 1000 "$dir/in.safetensors" >"$dir/trunc.safetensors"
expect_error "truncated input" "safetensors" "$bin" attend --spec full --input "$dir/trunc.safetensors" --output "$dir/x.safetensors"
printf '\xff\xff\xff\xff\xff\xff\xff\x7f{}' >"$dir/lying.safetensors"
expect_error "absurd header length" "header length" "$bin" attend --spec full --input "$dir/lying.safetensors" --output "$dir/x.safetensors"
expect_error "bad spec" "unknown attention" "$bin" attend --spec fulll --input "$dir/in.safetensors" --output "$dir/x.safetensors"
expect_error "bad parameter" "unknown parameter" "$bin" attend --spec full:foo=1 --input "$dir/in.safetensors" --output "$dir/x.safetensors"
expect_error "causal refused" "causal" "$bin" attend --spec clustered:clusters=3 --causal --input "$dir/in.safetensors" --output "$dir/x.safetensors"
expect_error "missing tensor" "no tensor 'q'" "$bin" attend --spec full --input "$dir/out.safetensors" --output "$dir/x.safetensors"
expect_error "bench bad lengths" "lengths" "$bin" bench --lengths 64,abc
expect_ok "bench smoke" "$bin" bench --attention 'full;clustered:clusters=4;improved-clustered:clusters=4,topk=8' --lengths 64,200 --heads 2 --dim 16 --repeat 2 --backward --json "$dir/b.json"
grep -q '"results"' "$dir/b.json" && ok || bad "bench json has no results"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
