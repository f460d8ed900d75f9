#!/usr/bin/env bash
# Install and consumer checks: configures and builds clattn from the source dir $1, installs it
# with `cmake --install --prefix` into a temporary prefix, then
#   - builds tests/install/main.cpp against it with find_package(clattn) and with pkg-config, and
#     runs both (each must print "ok"); every public header must compile on its own;
#   - runs the installed `clattn --help`, and imports the installed Python package (when built);
#   - uses the clattn source as a subproject (add_subdirectory) of a parent project that has its own
#     tests/ folder: only the library's targets exist, the parent's build type is kept, no
#     GoogleTest, Google Benchmark or CLI11 is looked for, the parent's tests/ is never globbed,
#     and the parent's code compiles with what clattn::clattn passes on.
# Usage: bash tests/install/run.sh /path/to/clattn/source [BUILD_DIR]   (CLATTN_JOBS: build jobs,
# default 2). With BUILD_DIR (a configured and built tree of the same source, as scripts/test.sh
# passes its warnings-as-errors build), the install is made from it and nothing is compiled again.
set -u
src=$(cd "${1:?usage: run.sh /path/to/clattn/source [BUILD_DIR]}" && pwd)
given_build=${2:-}
jobs=${CLATTN_JOBS:-2}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok:   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
# step NAME CMD...: runs CMD with its output in $work/NAME.log, shown (tail) on failure.
step() {
  local name=$1 t0=$SECONDS rc=0; shift
  "$@" >"$work/$name.log" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then ok "$name ($((SECONDS - t0)) s)"; return 0; fi
  bad "$name (exit $rc, $((SECONDS - t0)) s):"; tail -n 30 "$work/$name.log" | sed 's/^/    /'; return 1
}
# check NAME CMD...: CMD (a test, silent) must succeed.
check() { local name=$1; shift; if "$@"; then ok "$name"; else bad "$name"; fi; }
# shellcheck disable=SC2317  # called through check
not() { ! "$@"; }
finish() {
  echo "$pass passed, $fail failed"
  [ "$fail" -eq 0 ]
  exit $?
}
# The directory of the OpenMP build of OpenBLAS the library was configured with.
blas_dir() { sed -n 's/^CLATTN_OPENBLAS:FILEPATH=//p' "$build/CMakeCache.txt" | xargs -r dirname; }
# loads_blas NAME EXE: EXE resolves libopenblas.so.0 from the configured (OpenMP) directory.
loads_blas() {
  local got
  got=$(ldd "$2" | awk '/libopenblas/ {print $3}')
  if [ -n "$got" ] && [ "$(dirname "$(readlink -f "$got")")" = "$(readlink -f "$(blas_dir)")" ]; then ok "$1"
  else bad "$1: libopenblas resolves to '$got', expected $(blas_dir)"; fi
}

# --- 1. build and install ---------------------------------------------------------------------
# Configured with the default prefix: the install below overrides it, so both packages must be
# relocatable. Tests and benchmarks off: `all` is then the library and the CLI, what install needs.
if [ -n "$given_build" ]; then
  build=$(cd "$given_build" && pwd)
  check "the given build tree is of this source" \
    test "$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")" = "$src"
  step build_up_to_date cmake --build "$build" -j "$jobs" || finish
else
  build=$work/build
  step configure cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCLATTN_BUILD_TESTS=OFF -DCLATTN_BUILD_BENCH=OFF || finish
  step build cmake --build "$build" -j "$jobs" || finish
  if grep -q 'warning:' "$work/build.log"; then bad "build has warnings"; grep 'warning:' "$work/build.log" | head; else ok "build has no warnings"; fi
fi
step install cmake --install "$build" --prefix "$prefix" || finish
libdir=$(sed -n 's/^CMAKE_INSTALL_LIBDIR:PATH=//p' "$build/CMakeCache.txt")
echo "      libdir: $libdir"
for f in "$libdir/libclattn.a" include/clattn/attention.h include/clattn/threads.h bin/clattn \
         "$libdir/cmake/clattn/clattnConfig.cmake" "$libdir/cmake/clattn/clattnConfigVersion.cmake" \
         "$libdir/cmake/clattn/clattnTargets.cmake" "$libdir/pkgconfig/clattn.pc" share/doc/clattn/LICENSE; do
  check "installed $f" test -f "$prefix/$f"
done
n_src=$(find "$src/include/clattn" -maxdepth 1 -name '*.h' | wc -l)
n_dst=$(find "$prefix/include/clattn" -maxdepth 1 -name '*.h' 2>/dev/null | wc -l)
check "all $n_src public headers installed ($n_dst)" test "$n_src" -eq "$n_dst"
check "no source-tree path in the CMake package" \
  not grep -rqF -e "$src/src" -e "$src/include" "$prefix/$libdir/cmake/clattn"

# --- 2. the installed CLI ---------------------------------------------------------------------
step cli_help "$prefix/bin/clattn" --help
loads_blas "installed clattn loads the OpenMP OpenBLAS" "$prefix/bin/clattn"

# The installed Python package (when built: pybind11 and NumPy found) imports from its folder
# and runs an attention with the OpenMP OpenBLAS.
pydir=$(sed -n 's/^CLATTN_PYTHON_INSTALL_DIR:STRING=//p' "$build/CMakeCache.txt")
if [ -n "$pydir" ]; then
  step python_import env -C "$work" PYTHONPATH="$prefix/$pydir" /usr/bin/python3 -c \
    'import numpy as np, clattn; q = np.ones((1, 1, 8, 4), np.float32); assert clattn.Attention("full").forward(q, q, q).shape == q.shape; assert "openblas-openmp" in clattn._clattn._blas_library() or "openmp" not in clattn._clattn._openblas_expected'
fi

# --- 3. find_package consumer -----------------------------------------------------------------
if step cmake_consumer_configure cmake -S "$src/tests/install" -B "$work/consumer" -G Ninja \
     -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" &&
   step cmake_consumer_build cmake --build "$work/consumer"; then
  if step cmake_consumer_run "$work/consumer/consumer" && [ "$(tail -n 1 "$work/cmake_consumer_run.log")" = ok ]
  then ok "find_package consumer prints ok"; else bad "find_package consumer did not print ok"; fi
  loads_blas "find_package consumer loads the OpenMP OpenBLAS" "$work/consumer/consumer"
fi

# --- 4. pkg-config consumer -------------------------------------------------------------------
export PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
check "pkg-config --modversion clattn = 0.3.0" test "$(pkg-config --modversion clattn 2>&1)" = 0.3.0
echo "      pkg-config: $(pkg-config --cflags --libs clattn 2>&1)"
# shellcheck disable=SC2046  # the flags must split
if step pc_consumer_build g++ -Wall -Wextra -Werror -O2 "$src/tests/install/main.cpp" -o "$work/pc_consumer" \
     $(pkg-config --cflags --libs clattn); then
  if step pc_consumer_run "$work/pc_consumer" && [ "$(tail -n 1 "$work/pc_consumer_run.log")" = ok ]
  then ok "pkg-config consumer prints ok"; else bad "pkg-config consumer did not print ok"; fi
  loads_blas "pkg-config consumer loads the OpenMP OpenBLAS" "$work/pc_consumer"
fi
# Every public header stands alone on the installed include dir (no src/ or nlohmann includes).
mkdir -p "$work/headers"
for h in "$prefix"/include/clattn/*.h; do
  printf '#include <clattn/%s>\n' "$(basename "$h")" >"$work/headers/$(basename "$h" .h).cpp"
done
# shellcheck disable=SC2046
step headers_standalone g++ -fsyntax-only -Wall -Wextra -Werror $(pkg-config --cflags clattn) "$work"/headers/*.cpp

# --- 5. subproject ----------------------------------------------------------------------------
# The parent has its own tests/<area>/*.cpp that clattn must never glob (it would not compile).
parent=$work/parent
mkdir -p "$parent/tests/mine"
echo '#error "clattn globbed the parent project'"'"'s tests/ folder"' >"$parent/tests/mine/test_mine.cpp"
cp "$src/tests/install/main.cpp" "$parent/main.cpp"
cat >"$parent/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.22)
project(parent LANGUAGES CXX)
enable_testing()
add_subdirectory("$src" clattn)
add_executable(parent_app main.cpp)
target_link_libraries(parent_app PRIVATE clattn::clattn)
CMAKE
cache() { sed -n "s/^$2:[A-Z]*=//p" "$1/CMakeCache.txt"; }
if step subproject_configure cmake -S "$parent" -B "$work/sub" -G Ninja -DCMAKE_BUILD_TYPE=Debug; then
  check "subproject: parent's build type stays Debug" test "$(cache "$work/sub" CMAKE_BUILD_TYPE)" = Debug
  targets=$(cmake --build "$work/sub" --target help 2>&1)
  check "subproject: no test_* targets" test "$(grep -c 'test_' <<<"$targets")" -eq 0
  check "subproject: no CLI or bench targets" not grep -qE 'clattn_cli|clattn_bench' <<<"$targets"
  check "subproject: GoogleTest, Google Benchmark, CLI11 not looked for" \
    not grep -qE '^(GTest_DIR|benchmark_DIR|CLI11_DIR)' "$work/sub/CMakeCache.txt"
  check "subproject: no install rules for clattn" \
    not grep -q 'libclattn.a' "$work/sub/clattn/cmake_install.cmake"
  # clattn's warnings, -march=native and C++ standard stay on its own targets.
  cmd=$(cd "$work/sub" && ninja -t commands parent_app | grep 'main.cpp' | head -n 1)
  check "subproject: clattn's compile options do not leak into the parent" \
    not grep -qE -- '-march=native|-ffp-contract|-Wextra' <<<"$cmd"
  check "subproject: the parent gets C++20 and OpenMP from clattn::clattn" \
    grep -qE -- '-std=(c|gnu)\+\+(20|2a|23|2b) .*-fopenmp|-fopenmp .*-std=(c|gnu)\+\+(20|2a|23|2b)' <<<"$cmd"
  # The parent's own object compiles with what clattn::clattn passes on, and a library object
  # under the parent's build type. The library itself is not compiled here a second time: the
  # find_package and pkg-config consumers above link and run against the same sources, and a
  # whole Debug build of them would repeat the Release build's compile for no new check.
  step subproject_parent_compiles ninja -C "$work/sub" CMakeFiles/parent_app.dir/main.cpp.o
  step subproject_library_object_compiles ninja -C "$work/sub" clattn/CMakeFiles/clattn.dir/src/core/tensor.cpp.o
fi
# Asked for, the tests come from clattn's own tests/ (never the parent's), and a parent without a
# build type keeps none (configure only).
if step subproject_tests_configure cmake -S "$parent" -B "$work/sub-tests" -G Ninja -DCLATTN_BUILD_TESTS=ON; then
  check "subproject: empty build type is left empty" test -z "$(cache "$work/sub-tests" CMAKE_BUILD_TYPE)"
  targets=$(cmake --build "$work/sub-tests" --target help 2>&1)
  check "subproject with tests: clattn's test_core is there" grep -q 'test_core' <<<"$targets"
  check "subproject with tests: the parent's tests/ is not globbed" not grep -q 'test_mine' <<<"$targets"
fi

finish
