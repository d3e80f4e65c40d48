#!/usr/bin/env bash
# The main job: builds embrope's benchmark and runs it, on the GPU when one is usable, else on
# the CPU, then prints one table and writes the JSON and a plot.
#   scripts/bench.sh [--full] [--device=auto|cpu|gpu] [Google Benchmark flags...]
# Without --full: the main cases (every op and dtype at the sizes that tell; about a minute
# on two cores). --full: the whole sweep of shapes and token counts.
# Output: $BENCH_OUT (default build-bench/bench): bench.json, bench.md, bench.png, raw.json,
# models.json (the end-to-end rows: HF models unpatched and patched, benchmarks/models.py).
# PyTorch eager is timed on the same cases when torch is installed (in .venv, or for the
# python3 on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-bench}
out=${BENCH_OUT:-$build/bench}
scripts/install-deps.sh
jobs=$(nproc 2>/dev/null || echo 2)

# CUDA kernels are built only when a GPU can run them: a CPU-only machine skips their
# compilation (most of the build's time).
cuda=OFF
device=auto
for arg in "$@"; do
  case $arg in --device=*) device=${arg#--device=} ;; esac
done
if [ "$device" != cpu ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null |
  grep -q '^GPU'; then
  cuda=AUTO
  export PATH="$PATH:/usr/local/cuda/bin"
fi
cmake --preset bench -B "$build" -DEMBROPE_CUDA=$cuda >/dev/null
cmake --build "$build" -j "$jobs" --target embrope-bench

# The report's Python: .venv's when there is one (torch there gives the eager column), with
# matplotlib for the plot.
python=python3
[ -x .venv/bin/python ] && python=.venv/bin/python
if ! "$python" -c "import matplotlib" >/dev/null 2>&1; then
  scripts/install-deps.sh --plot
  python=.venv/bin/python
fi

mkdir -p "$out"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ "$commit" != unknown ] && ! git diff --quiet HEAD 2>/dev/null; then commit="$commit-dirty"; fi
EMBROPE_BENCH_COMMIT=$commit "$build/benchmarks/embrope-bench" "$@" \
  --benchmark_out="$out/raw.json" --benchmark_out_format=json

# End to end: HF models unpatched and patched with embrope.transformers, when .venv has torch
# and transformers (scripts/test.sh or scripts/install-deps.sh --python puts them there).
# The package is installed from this checkout first (incremental in $build/pip).
models=()
if [ -x .venv/bin/python ] && .venv/bin/python -c "import torch, transformers" >/dev/null 2>&1; then
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation \
    -Cbuild-dir="$build/pip" -Ccmake.define.EMBROPE_CUDA=$cuda .
  .venv/bin/python benchmarks/models.py --out "$out/models.json"
  models=(--models "$out/models.json")
else
  echo "bench: no torch and transformers in .venv: no end-to-end model rows" \
    "(scripts/install-deps.sh --python installs them)" >&2
fi
"$python" benchmarks/report.py "$out/raw.json" --out "$out" --command "scripts/bench.sh $*" \
  "${models[@]}"
