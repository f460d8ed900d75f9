#!/usr/bin/env bash
# ThreadSanitizer pass: clang with LLVM's OpenMP runtime (libomp) and its Archer tool
# (libarcher.so, loaded through OMP_TOOL_LIBRARIES), which tells TSan about OpenMP's barriers,
# tasks and reductions, so that only real races are reported. Runs the threaded kernels' tests and
# the API's concurrency tests at several thread counts.
# OpenBLAS: the build Debian ships for OpenMP is linked against GNU libgomp, which TSan cannot see
# into; OPENBLAS_NUM_THREADS=1 keeps every sgemm on the calling thread (races inside OpenBLAS are not
# ours to find, and its own thread pool would otherwise be reported wholesale). scripts/tsan.supp
# silences what libomp and OpenBLAS do inside themselves (libomp's allocator reuses blocks between
# threads under its own locks, invisible to TSan).
# Usage: scripts/tsan.sh [gtest filter]. Environment: CLATTN_TSAN_BUILD (default build-tsan), CLATTN_JOBS.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${CLATTN_TSAN_BUILD:-build-tsan}
jobs=${CLATTN_JOBS:-2}
# The threaded paths: each variant's kernels through the registry suite at thread counts 1..4 and
# token-major views, one attention object from several threads, the thread-count rules, the
# parallel helpers' exception handling, and the sequence-split kernels with ranks as threads.
filter=${1:-'*SafeAcrossThreads*:*ThreadCounts*:*Deterministic*'}

archer=$(ls /usr/lib/llvm-*/lib/libarcher.so 2>/dev/null | sort -V | tail -1 || true)
[ -n "$archer" ] || { echo "tsan: libarcher.so not found (apt-get install libomp-dev)"; exit 1; }
cmake -S . -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" -DCLATTN_WERROR=ON -DCLATTN_SANITIZE=thread \
  -DCLATTN_BUILD_BENCH=OFF -DCLATTN_INSTALL=OFF -DCLATTN_BUILD_PYTHON=OFF >/dev/null
cmake --build "$build" -j "$jobs" --target test_attention test_core test_parallel
# halt_on_error: the first race fails the stage, with both stacks printed.
export OMP_TOOL_LIBRARIES=$archer OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=4
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 history_size=4 ignore_noninstrumented_modules=1 suppressions=$PWD/scripts/tsan.supp"
"$build/test_core" --gtest_filter='Parallel.*' --gtest_brief=1
"$build/test_attention" --gtest_filter="$filter" --gtest_brief=1
# The split kernels at 2-4 ranks as threads of one process (run_ranks_in_threads), each rank
# with an OpenMP team of two: the communicator's hand-offs and the kernels' teams together.
OMP_NUM_THREADS=2 "$build/test_parallel" --gtest_brief=1
