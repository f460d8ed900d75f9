# Shared by the CLI test scripts (run.sh, train.sh, plot.sh): a scratch folder removed on exit,
# pass/fail counters, the expectation helpers and the real data. Source it after setting `bin`.
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
# The real models and data (README, "Real models and data"): CLATTN_DATA, else the source tree's
# ../shared/data.
data=${CLATTN_DATA:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/../shared/data}
# data_required: whether missing data is a failure rather than a skip: CLATTN_REQUIRE_DATA when
# set (scripts/test.sh sets 1; 0 turns it off), else whether CI is set. "0" and "false" are unset.
data_required() {
  local v=${CLATTN_REQUIRE_DATA:-${CI:-}}
  [ -n "$v" ] && [ "$v" != 0 ] && [ "$v" != false ]
}
# need_data WHAT PATH...: true when every PATH exists under $data. Otherwise prints one line naming
# CLATTN_DATA and returns false, so the caller skips WHAT; where the data is required
# (data_required) that line is a failure.
need_data() {
  local what=$1 p; shift
  for p in "$@"; do
    [ -e "$data/$p" ] && continue
    if data_required; then
      bad "$what: real data not found: $data/$p is missing (set CLATTN_DATA to the shared data folder; required here: CI or CLATTN_REQUIRE_DATA is set)"
    else
      echo "skipped $what: real data not found: $data/$p is missing (set CLATTN_DATA to the shared data folder)"
    fi
    return 1
  done
}
# finish LABEL: the summary line; the script's status is whether anything failed.
finish() {
  echo "$1$pass passed, $fail failed"
  [ "$fail" -eq 0 ]
}
