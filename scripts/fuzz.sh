#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (AddressSanitizer + UndefinedBehaviorSanitizer,
# coverage-instrumented library) and runs each for a given time. Usage:
#   scripts/fuzz.sh [SECONDS_PER_TARGET (30)] [TARGET ...]     e.g. scripts/fuzz.sh 600 safetensors
# Targets: spec, safetensors, config, tokenizer, checkpoint, attend, plot (and listops when fuzz/ has
# it). Each starts from its seed corpus fuzz/corpus/<target>/ (read only), with the dictionary
# fuzz/<target>.dict when there is one (plot's: gnuplot metacharacters); new inputs go to
# $BUILD/corpus/<target>/, crashes to $BUILD/artifacts/. A finding is a reproducer: rerun it with
#   $BUILD/fuzz/fuzz_<target> <file>
# and turn it into a regression test. Exit status 1 when any target found a crash, leak or timeout.
# Environment: CLATTN_FUZZ_BUILD (build dir, default build-fuzz), CLATTN_JOBS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}
shift || true
build=${CLATTN_FUZZ_BUILD:-build-fuzz}
jobs=${CLATTN_JOBS:-2}
all=(spec safetensors config tokenizer checkpoint attend plot)
[ -f fuzz/fuzz_listops.cpp ] && all+=(listops)
if [ $# -gt 0 ]; then targets=("$@"); else targets=("${all[@]}"); fi

# -O1 as the sanitized CI build, with line tables only (file:line in every report, a third less
# compile time than full debug info); only the library and the targets (no CLI, tests, bench, install).
cmake -S . -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" -DCLATTN_WERROR=ON \
  -DCLATTN_SANITIZE="address;undefined;fuzzer-no-link" -DCLATTN_FUZZ=ON -DCLATTN_BUILD_TESTS=OFF \
  -DCLATTN_BUILD_BENCH=OFF -DCLATTN_BUILD_CLI=OFF -DCLATTN_INSTALL=OFF -DCLATTN_BUILD_PYTHON=OFF >/dev/null
cmake --build "$build" -j "$jobs" --target "${targets[@]/#/fuzz_}"

mkdir -p "$build/artifacts"
# Runs target $1 into its log; its exit status says whether it found anything.
run_target() {
  local t=$1 dict=()
  mkdir -p "$build/corpus/$t"
  [ -f "fuzz/$t.dict" ] && dict=("-dict=fuzz/$t.dict")
  # One thread: the kernels' OpenMP teams add nothing to coverage and slow each input down.
  # rss 2 GB, 10 s per input: a spec or file that makes clattn allocate or loop by a number it
  # reads, rather than by the data it has, is a finding too.
  OMP_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$build/fuzz/fuzz_$t" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -max_len=65536 \
      -print_final_stats=1 -artifact_prefix="$build/artifacts/$t-" "${dict[@]}" \
      "$build/corpus/$t" "fuzz/corpus/$t" >"$build/fuzz_$t.log" 2>&1
}

# libFuzzer runs on one core, so the targets run CLATTN_JOBS at a time (each keeps its own core and
# its full time): the stage takes ceil(targets / jobs) x SECONDS.
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  rm -f "$build/fuzz_$t.rc"
  (if run_target "$t"; then echo 0; else echo 1; fi >"$build/fuzz_$t.rc") &
done
wait

status=0
total_execs=0
summary=""
for t in "${targets[@]}"; do
  log="$build/fuzz_$t.log"
  if [ "$(cat "$build/fuzz_$t.rc" 2>/dev/null)" = 0 ]; then
    result=ok
  else
    result=FAILED
    status=1
    tail -n 60 "$log"
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1 || true)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo ?)
  total_execs=$((total_execs + ${execs:-0}))
  summary+=$(printf '%-12s %-6s %10s executions  coverage %s\n' "$t" "$result" "${execs:-0}" "$cov")$'\n'
done
printf 'fuzz: %s s per target, %s at a time\n%s' "$secs" "$jobs" "$summary"
echo "fuzz: $total_execs executions in all"
exit $status
