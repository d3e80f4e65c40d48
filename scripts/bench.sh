#!/usr/bin/env bash
# Builds embrope and runs its benchmark: on the GPU when one is usable, else on the CPU.
#   scripts/bench.sh [embrope-bench arguments...]   e.g. --device=cpu --quick
# Writes the table to the terminal and JSON to build/bench.json (or $BENCH_JSON).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
scripts/install-deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$jobs" --target embrope-bench
json=${BENCH_JSON:-$build/bench.json}
"$build/benchmarks/embrope-bench" --benchmark_out="$json" --benchmark_out_format=json "$@"
echo "JSON: $json"
