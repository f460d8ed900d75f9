#!/usr/bin/env bash
# The examples as a user runs them (CTest: examples): each C++ example built by CMake
# (examples/CMakeLists.txt) and each Python example, from the repository root, where
# ../shared/data is the real data (CLATTN_DATA points elsewhere: the examples' paths are rewritten
# to it in a scratch copy); then the README's blocks that quote them are checked against the files.
# Usage: run.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
bin=unused
source "$src/tests/cli/lib.sh"
export PYTHONPATH=$build/python PYTHONDONTWRITEBYTECODE=1
cd "$src"

# expect_output DESCRIPTION NEEDLE CMD...: exit 0 and stdout holds NEEDLE
expect_output() {
  local what=$1 needle=$2; shift 2
  local t0=$SECONDS
  if "$@" >"$dir/out" 2>"$dir/err" && grep -q -- "$needle" "$dir/out"; then
    ok
    echo "ok: $what ($((SECONDS - t0)) s): $(head -c 200 "$dir/out" | tr '\n' ' ')"
  else
    bad "$what: exit $?, stdout: $(head -c 400 "$dir/out"), stderr: $(tail -c 600 "$dir/err")"
  fi
}

# A Python example with ../shared/data replaced by $data when that is elsewhere.
py_example() {
  local f=$1
  if [ "$(cd "$src/../shared/data" 2>/dev/null && pwd)" = "$(cd "$data" 2>/dev/null && pwd)" ]; then
    echo "$src/examples/$f"
  else
    sed "s|\.\./shared/data|$data|g" "$src/examples/$f" >"$dir/$f"
    echo "$dir/$f"
  fi
}

expect_output "examples/attention.cpp" "improved-clustered" "$build/example_attention"
expect_output "examples/numpy_attention.py" "improved-clustered" /usr/bin/python3 "$(py_example numpy_attention.py)"
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  expect_output "examples/torch_module.py" "loss after 30 steps" /usr/bin/python3 "$(py_example torch_module.py)"
else
  bad "examples/torch_module.py: PyTorch is not installed (Debian: python3-torch; scripts/install-deps.sh)"
fi
if need_data "examples on real models" stories260k/model.safetensors kwt1/model.safetensors \
     tinyshakespeare/input.txt; then
  expect_output "examples/approximate_model.cpp" "agreement with full attention" "$build/example_approximate_model" "$data"
  # From another folder without the data argument: a message saying where to run it, exit 1 (it
  # ended in an uncaught exception).
  (cd "$dir" && "$build/example_approximate_model" >"$dir/out" 2>"$dir/err")
  rc=$?
  if [ "$rc" = 1 ] && grep -q "run it from the repository root beside ../shared/data" "$dir/err"; then ok
  else bad "example_approximate_model from another folder: exit $rc, stderr: $(head -c 300 "$dir/err")"; fi
  expect_output "examples/approximate_kwt1.py" "agreement 0.9" /usr/bin/python3 "$(py_example approximate_kwt1.py)"
  expect_output "examples/char_lm.py" "ROMEO:" /usr/bin/python3 "$(py_example char_lm.py)"
fi
if /usr/bin/python3 "$src/tests/examples/readme_blocks.py" "$src" >"$dir/blocks" 2>&1; then ok; else bad "$(cat "$dir/blocks")"; fi
cat "$dir/blocks"
finish "examples: "
