#!/usr/bin/env bash
# Installs clattn's dependencies from Debian's packages: `install-deps.sh build` what the README's
# build and its first command need (the library, the `clattn` command with Open MPI, the Python
# package, gnuplot for the pictures); `install-deps.sh` (the test command) everything, adding what
# only the tests, the micro-benchmarks, the sanitizer and fuzzing builds and the emulated-CPU check
# use (PyTorch, clang, QEMU, GoogleTest...: most of the download).
# Idempotent: when everything asked for is already present it exits without touching apt.
set -euo pipefail
mode=${1:-all}
case "$mode" in build|all) ;; *) echo "usage: install-deps.sh [build|all]" >&2; exit 2 ;; esac

# Why each package is here (also in docs/building.md):
#   cmake, ninja-build, g++      build
#   libopenblas-dev              cblas_sgemm for big products (hashing, centroid attention)
#   libopenblas0-openmp          the OpenMP build of OpenBLAS, so BLAS and our own OpenMP regions
#                                share one thread pool instead of fighting over 2 cores
#   nlohmann-json3-dev           safetensors headers, config.json, bench --json
#   libcli11-dev                 the clattn command line
#   libgtest-dev                 tests
#   libbenchmark-dev             micro-benchmarks in bench/
#   gnuplot-nox                  every picture (bench --plot, plot, inspect) is drawn by gnuplot's
#                                pngcairo terminal; we never rasterise by hand
#   python3-dev, pybind11-dev,   the `clattn` Python package (bindings built by the same CMake);
#   python3-pybind11,            Debian's python3 (/usr/bin/python3) is the interpreter it targets
#   python3-numpy, python3-pytest
#   python3-regex                the reference GPT-2 tokenizer of python/tests/test_tokenizer_hf.py
#                                (encoder.py's pattern needs \p{L} / \p{N}, which re lacks)
#   python3-torch                the clattn.torch adapter and its tests against PyTorch's autograd
#                                (about 30 s to install, so CI tests it)
#   python3-setuptools,          `pip install .` and `python3 -m build --wheel --no-isolation`
#   python3-wheel, python3-pip,  (pyproject.toml: setuptools drives CMake; no package index is
#   python3-build, python3-venv  reached), and the test that installs the package into a venv
#   clang, libomp-dev,           libFuzzer targets and the ThreadSanitizer build (TSan understands
#   libclang-rt-14-dev           LLVM's libomp, not libgomp)
#   qemu-user                    runs the binary on an emulated AVX2-only CPU (tests/cli/isa.sh):
#                                one build must run on every x86-64-v3 CPU
#   libopenmpi-dev, openmpi-bin  Open MPI: data-parallel training and sequence-parallel attention
#                                across ranks launched by mpirun (tested over shared memory)
packages=(cmake ninja-build g++ libopenblas-dev libopenblas0-openmp nlohmann-json3-dev libcli11-dev pkg-config
          gnuplot-nox python3-dev pybind11-dev python3-pybind11 python3-numpy python3-setuptools python3-wheel
          python3-pip python3-venv libopenmpi-dev openmpi-bin)
if [ "$mode" = all ]; then
  packages+=(libgtest-dev libbenchmark-dev python3-pytest python3-regex python3-torch python3-build
             clang libomp-dev libclang-rt-14-dev qemu-user)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
