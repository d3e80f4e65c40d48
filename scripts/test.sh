#!/usr/bin/env bash
# Builds embrope with its tests and runs them (the GPU parity suite reports "skipped" where
# no GPU is usable). CUDA sources are compiled when nvcc is found (EMBROPE_CUDA=AUTO).
#   scripts/test.sh [BUILD_DIR] [extra cmake arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
scripts/install-deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$build" -j "$jobs"
ctest --test-dir "$build" --output-on-failure -j "$jobs"
