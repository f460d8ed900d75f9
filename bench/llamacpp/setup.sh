#!/usr/bin/env bash
# Installs llama.cpp's prebuilt CPU library from the npm package node-llama-cpp (pinned 3.21.1:
# llama.cpp commit 5b4ebc5, CPU variants haswell … sapphirerapids and zen4, chosen by llama.cpp at
# run time) into DIR and builds llbench (llbench.cpp) against it. Nothing is compiled from
# llama.cpp's source: its headers come from the git bundle inside the package. Needs npm (Debian
# package `npm`) and the npm registry; ~730 MB. Idempotent. Prints the path of llbench.
#   usage: setup.sh [DIR]   (default build/llamacpp/node)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-$here/../../build/llamacpp/node}
command -v npm >/dev/null || { echo "setup.sh: npm is needed (apt-get install npm)" >&2; exit 1; }
mkdir -p "$dir" && cd "$dir"
[ -f package.json ] || npm init -y >/dev/null
[ -d node_modules/@node-llama-cpp/linux-x64 ] || npm i -E --no-audit --no-fund node-llama-cpp@3.21.1 >npm.log 2>&1 ||
  { echo "setup.sh: npm install failed, see $dir/npm.log" >&2; exit 1; }
bins=$dir/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
[ -d src ] || git clone -q node_modules/node-llama-cpp/llama/gitRelease.bundle src
if [ ! -x llbench ] || [ "$here/llbench.cpp" -nt llbench ]; then
  g++ -O2 -std=c++17 -DLLB_DEFAULT_BINS="\"$bins\"" "$here/llbench.cpp" -I "$bins" -I src/include -I src/ggml/include \
    -L "$bins" -l:libllama.v0.4.0.so -l:libggml.v0.4.0.so -l:libggml-base.so -Wl,-rpath,"$bins" -o llbench
fi
echo "$dir/llbench"
