#!/usr/bin/env bash
# Installs embrope's build dependencies from Debian's packages when they are missing, and
# does nothing when they are present. The CUDA toolkit (nvcc) is used when found; it is not
# installed by this script.
#   scripts/install-deps.sh               install what is missing (needs root or sudo)
#   scripts/install-deps.sh --check       only report what is missing; exit 1 if anything is
#   scripts/install-deps.sh --cuda-tools  cuobjdump and nvdisasm for
#                                         scripts/check-cuda-binary.sh, from PyPI into
#                                         .deps/cuda-tools when the CUDA toolkit lacks them
#   scripts/install-deps.sh --python      the Python environment .venv for the package and
#                                         its tests: Python's venv and headers from Debian's
#                                         packages when missing, then pyproject.toml's `dev`
#                                         group from PyPI (nanobind, scikit-build-core, pytest,
#                                         numpy, torch, transformers, matplotlib, ...)
#   scripts/install-deps.sh --plot        only matplotlib and numpy into .venv (the
#                                         benchmark's plot), when they are missing
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--cuda-tools" ]; then
  if command -v cuobjdump >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/cuobjdump ] ||
    compgen -G ".deps/cuda-tools/nvidia/*/bin/cuobjdump" >/dev/null; then
    echo "install-deps: cuobjdump present"
    exit 0
  fi
  echo "install-deps: installing cuobjdump and nvdisasm from PyPI into .deps/cuda-tools"
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --target .deps/cuda-tools \
    "nvidia-cuda-cuobjdump>=13,<14" "nvidia-cuda-nvdisasm>=13,<14"
  exit 0
fi

apt_install() {
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "$@"
}

if [ "${1:-}" = "--python" ] || [ "${1:-}" = "--plot" ]; then
  python=${PYTHON:-python3}
  if ! command -v "$python" >/dev/null 2>&1; then apt_install python3; python=python3; fi
  # Debian splits venv/ensurepip and the C headers out of python3.
  missing=()
  "$python" -c "import venv, ensurepip" >/dev/null 2>&1 || missing+=(python3-venv)
  if [ "$1" = "--python" ]; then  # the extension's build needs Python's headers
    include=$("$python" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
    [ -f "$include/Python.h" ] || missing+=(python3-dev)
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: installing ${missing[*]}"
    apt_install "${missing[@]}"
  fi
  [ -x .venv/bin/python ] || "$python" -m venv .venv
  pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
  # Dependency groups (pyproject.toml) need pip 25.1 or later.
  "${pip[@]}" --upgrade "pip>=25.1"
  if [ "$1" = "--plot" ]; then
    "${pip[@]}" --group plot
  else
    "${pip[@]}" --group dev
  fi
  echo "install-deps: .venv ready ($(.venv/bin/python --version))"
  exit 0
fi

# package: a file it provides (checked instead of dpkg, so that a copy from elsewhere counts)
declare -A provides=(
  [cmake]=/usr/bin/cmake
  [ninja-build]=/usr/bin/ninja
  [g++]=/usr/bin/g++
  [pkg-config]=/usr/bin/pkg-config
  [libfmt-dev]=/usr/include/fmt/format.h
  [catch2]=/usr/include/catch2/catch.hpp
  [libdlpack-dev]=/usr/include/dlpack/dlpack.h
  [nlohmann-json3-dev]=/usr/include/nlohmann/json.hpp
  [libbenchmark-dev]=/usr/include/benchmark/benchmark.h
  # The fuzz build (fuzz/, .ci/run): clang with its libFuzzer and sanitizer runtimes, and
  # LLVM's OpenMP runtime for clang's -fopenmp.
  [clang]=/usr/bin/clang++
  [libclang-rt-14-dev]='/usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a'
  [libomp-14-dev]=/usr/lib/llvm-14/lib/libomp.so
  # The format check of .ci/run (.clang-format at the root).
  [clang-format]=/usr/bin/clang-format
  # The ABI check of .ci/run (scripts/abi-check.sh: abidw and abidiff of libabigail).
  [abigail-tools]=/usr/bin/abidiff
)

missing=()
for package in "${!provides[@]}"; do
  compgen -G "${provides[$package]}" >/dev/null || missing+=("$package")
done
# OpenMP comes with GCC (libgomp); nothing to install separately.

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all dependencies present"
  exit 0
fi
if [ "${1:-}" = "--check" ]; then
  echo "install-deps: missing: ${missing[*]}"
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
apt_install "${missing[@]}"
