#!/usr/bin/env bash
# The README's build: the dependencies (idempotent: nothing happens when they are present), then
# the library, the `clattn` command and the Python package in build/ (or $CLATTN_BUILD_DIR).
# Incremental: an existing build tree is never configured again by hand (`cmake --build` reruns
# CMake itself when a CMakeLists.txt changed) and only what changed is compiled, so running this
# again after a `git pull` costs seconds, not a full build. Tests and micro-benchmarks are left to
# scripts/test.sh and -DCLATTN_BUILD_BENCH=ON. $CLATTN_JOBS sets the parallelism (2).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh build
build=${CLATTN_BUILD_DIR:-build}
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCLATTN_BUILD_TESTS=OFF -DCLATTN_BUILD_BENCH=OFF
fi
# The C++ examples too (build/example_*), which the README runs; absent when CLATTN_BUILD_EXAMPLES is off.
targets=(clattn_cli clattn_python)
grep -q '^CLATTN_BUILD_EXAMPLES:BOOL=ON' "$build/CMakeCache.txt" && targets+=(clattn_examples)
cmake --build "$build" -j "${CLATTN_JOBS:-2}" --target "${targets[@]}"
echo "build: $build/clattn, the examples and the Python package $build/python/clattn are up to date"
