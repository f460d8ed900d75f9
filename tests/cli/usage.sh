#!/usr/bin/env bash
# The first hour of a user: the live status line of the long commands (only on a terminal).
# Usage: bash tests/cli/usage.sh /path/to/clattn
set -u
bin=${1:?usage: usage.sh /path/to/clattn}
source "$(dirname "$0")/lib.sh"

# --- the live status line: only on a terminal (forced here), never in redirected output
small=(bench --attention 'full;local:window=8' --lengths 32,64 --heads 1 --dim 8 --repeat 1 --no-error)
expect_ok "bench, stderr redirected" "$bin" "${small[@]}"
if grep -q $'\r' "$dir/err"; then bad "a status line in redirected stderr"; else ok; fi
expect_ok "bench with the status line" env CLATTN_PROGRESS=1 "$bin" "${small[@]}"
grep -q 'clattn bench: \[4/4\] local:window=8 N=64 fwd' "$dir/err" && ok || bad "no status line: $(tr '\r' '\n' <"$dir/err" | head -c 400)"
grep -q "ETA" "$dir/err" && ok || bad "the status line has no ETA: $(tr '\r' '\n' <"$dir/err" | head -c 400)"
if grep -q $'\r' "$dir/out"; then bad "the status line reached stdout"; else ok; fi

finish "cli usage: "
