#!/usr/bin/env bash
# The whole test suite, as CI runs it: dependencies (idempotent), a warnings-as-errors Release
# build with every CTest suite, the install/consumer checks (tests/install/run.sh), the kernel
# suites again on the AVX2 copy of the kernels when the CPU has AVX-512, then under AddressSanitizer +
# UndefinedBehaviorSanitizer (skip that with CLATTN_SKIP_SANITIZE=1 for a quick local run), then
# the fuzzing and ThreadSanitizer stages (skip with CLATTN_SKIP_FUZZ=1). The real data
# (../shared/data or CLATTN_DATA) is required: a suite that cannot find it fails instead of
# skipping (CLATTN_REQUIRE_DATA=0 lets a local run skip those cases).
set -euo pipefail
cd "$(dirname "$0")/.."

# The command line, the Python bindings, the benchmarks and the fuzz targets build on the public
# headers (include/clattn/) and their own local headers only; their targets do not see src/, and
# this names any file that includes an internal header before a build would fail on it.
src_dirs=$(cd src && ls -d -- */ | tr -d / | paste -sd'|' -)
if hits=$(grep -rnE "^[[:space:]]*#[[:space:]]*include[[:space:]]*[\"<](\.\./)*(src/)?($src_dirs)/" \
            tools python bench fuzz --include='*.h' --include='*.hpp' --include='*.cpp' --include='*.cc'); then
  echo "error: tools/, python/, bench/ and fuzz/ may include only include/clattn/ headers (and their own);" \
    "these include src/ headers:" >&2
  echo "$hits" >&2
  exit 1
fi

bash scripts/install-deps.sh
export CLATTN_REQUIRE_DATA=${CLATTN_REQUIRE_DATA:-1}

jobs=${CLATTN_JOBS:-2}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

cmake -S . -B build-test -G Ninja -DCMAKE_BUILD_TYPE=Release -DCLATTN_WERROR=ON >/dev/null
cmake --build build-test -j "$jobs"

(cd build-test && ctest --output-on-failure --timeout 900)

# Install rules and consumers: `cmake --install` of the build above into a temporary prefix (not
# a second compile of the same sources), a program built against it with find_package(clattn) and
# with pkg-config, and clattn as an add_subdirectory() subproject.
CLATTN_JOBS=$jobs bash tests/install/run.sh "$PWD" "$PWD/build-test"

# One build runs every ISA (include/clattn/cpu.h): the suites that reach the per-ISA kernels
# (src/core/isa.h: tiles and k-means) run each ISA this CPU has in one process (ScopedIsa), and
# tests/cli/run.sh runs the command line under each CLATTN_ISA.

if [ "${CLATTN_SKIP_SANITIZE:-0}" != 1 ]; then
  # -O1 keeps the sanitized suite quick; -g1 (line tables: file:line in every report) compiles a
  # third faster than full debug info; the command line at -O0 compiles in half the time (CLI11 is
  # header-only) and runs the library's code as fast. The bench micro-benchmarks and the examples
  # would only be compiled here (their runs are in the Release pass), so they are left out.
  # The suites run CLATTN_JOBS at a time on one thread each: the Release pass above ran them on
  # two, and the thread-count suites still run every variant at 1-4 threads here (they set the
  # count themselves); two one-thread processes keep both cores busy where one two-thread process
  # waits at its barriers.
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
    -DCLATTN_WERROR=ON -DCLATTN_SANITIZE="address;undefined" -DCLATTN_BUILD_BENCH=OFF \
    -DCLATTN_BUILD_EXAMPLES=OFF -DCLATTN_TEST_THREADS=1 -DCLATTN_CLI_FLAGS=-O0 >/dev/null
  cmake --build build-asan -j "$jobs"
  (cd build-asan && OMP_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=1 ctest -j "$jobs" --output-on-failure --timeout 1800)
fi

if [ "${CLATTN_SKIP_FUZZ:-0}" != 1 ]; then
  # clang builds (docs/reliability.md): every libFuzzer target for 30 s from its seed
  # corpus under ASan + UBSan, then ThreadSanitizer over the threaded kernels' and the API's
  # concurrency tests. Only the targets needed are built.
  bash scripts/fuzz.sh "${CLATTN_FUZZ_SECONDS:-30}"
  bash scripts/tsan.sh
fi
