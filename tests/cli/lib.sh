# Shared by the CLI test scripts (run.sh, train.sh, plot.sh): a scratch folder removed on exit,
# pass/fail counters and the expectation helpers. Source it after setting `bin`.
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# expect_ok DESCRIPTION CMD...: exit 0
expect_ok() {
  local what=$1; shift
  if "$@" >"$dir/out" 2>"$dir/err"; then ok; else bad "$what (exit $?): $(head -c 600 "$dir/err")"; fi
}
# expect_error DESCRIPTION NEEDLE CMD...: exit in [1, 127], stderr says "error" and mentions NEEDLE
expect_error() {
  local what=$1 needle=$2; shift 2
  "$@" >"$dir/out" 2>"$dir/err"
  local rc=$?
  if [ "$rc" -ge 1 ] && [ "$rc" -lt 128 ] && grep -qi -- "error" "$dir/err" && grep -qi -- "$needle" "$dir/err"; then ok
  else bad "$what: exit $rc, stderr: $(head -c 600 "$dir/err")"; fi
}
# expect_exit CODE DESCRIPTION NEEDLE CMD...: exit exactly CODE and stderr mentions NEEDLE
expect_exit() {
  local code=$1 what=$2 needle=$3; shift 3
  "$@" >"$dir/out" 2>"$dir/err"
  local rc=$?
  if [ "$rc" -eq "$code" ] && grep -qi -- "$needle" "$dir/err"; then ok
  else bad "$what: exit $rc (expected $code), stderr: $(head -c 600 "$dir/err")"; fi
}
# finish LABEL: the summary line; the script's status is whether anything failed.
finish() {
  echo "$1$pass passed, $fail failed"
  [ "$fail" -eq 0 ]
}
