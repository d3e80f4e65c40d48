#!/usr/bin/env bash
# Everything a GPU machine should check, in one run:
#   1. configure and build (Release, CUDA on, sm_90 unless CMAKE_CUDA_ARCHITECTURES is set);
#   2. the CPU suite (ctest) and the GPU parity suite;
#   3. the GPU suite again under compute-sanitizer memcheck and racecheck;
#   4. the benchmark on the GPU (JSON);
#   5. when PyTorch is importable, the side-by-side comparison with the peers
#      (benchmarks/compare/compare.py; wheels for Liger-Kernel and FlashInfer are installed
#      from .whl/ when present, see benchmarks/compare/README.md). EMBROPE_COMPARE=0 skips it.
# Logs and JSON go to the directory given as argument, or $OUT, or ./gpu-check-out.
# Without network: unpack the dependencies first with shared/tools/offline-deps.sh into
# .deps/ (git-ignored); this script uses .deps/root/usr when it exists.
#   scripts/gpu-check.sh [OUT_DIR] [--quick]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-gpu-check-out}}
quick=${2:-}
mkdir -p "$out"
out=$(cd "$out" && pwd)
log="$out/gpu-check.log"
: >"$log"
say() { echo "== $*" | tee -a "$log"; }
status=0
step() {  # step NAME COMMAND...: runs, logs, remembers failure
  local name=$1
  shift
  say "$name: $*"
  "$@" >>"$log" 2>&1
  local rc=$?
  say "$name: exit $rc"
  [ $rc -eq 0 ] || status=1
  return $rc
}

export PATH="$PATH:/usr/local/cuda/bin"
prefix_args=()
if [ -d .deps/root/usr ]; then
  deps=$(pwd)/.deps/root/usr
  prefix_args=(-DCMAKE_PREFIX_PATH="$deps")
  export LD_LIBRARY_PATH="$deps/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi

{
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1
  nvcc --version | tail -n 2
} >"$out/device.txt"
cat "$out/device.txt" | tee -a "$log"

build=build-gpu
step configure cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DEMBROPE_CUDA=ON \
  "${prefix_args[@]}" || { cp "$log" "$out/"; exit 1; }
step build cmake --build $build -j "$(nproc)" || exit 1

gpu_tests=$build/tests/gpu/embrope_gpu_tests
step gpu-tests "$gpu_tests" -r junit -o "$out/gpu-tests.xml"
"$gpu_tests" -r compact 2>&1 | tail -n 3 | tee -a "$log"
step cpu-tests ctest --test-dir $build --output-on-failure -j "$(nproc)" -E install_consumer

sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
# The sanitizers slow kernels down a lot: run every test case but the big sweep, plus a
# reduced sweep.
step memcheck "$sanitizer" --tool memcheck --error-exitcode 1 --log-file "$out/memcheck.log" \
  "$gpu_tests"
step racecheck "$sanitizer" --tool racecheck --error-exitcode 1 --log-file "$out/racecheck.log" \
  "$gpu_tests" "~[sweep]"
# One file for both tools' reports (fewer files to carry back).
for tool in memcheck racecheck; do
  echo "=== compute-sanitizer --tool $tool"
  cat "$out/$tool.log" 2>/dev/null
done >"$out/sanitizer.log"
rm -f "$out/memcheck.log" "$out/racecheck.log"

bench_args=(--device=gpu --benchmark_out="$out/bench.json" --benchmark_out_format=json
  --benchmark_repetitions=5 --benchmark_report_aggregates_only=true)
[ "$quick" = "--quick" ] && bench_args+=(--quick)
step benchmark "$build/benchmarks/embrope-bench" "${bench_args[@]}"

if [ "${EMBROPE_COMPARE:-1}" != 0 ] && python3 -c "import torch" >/dev/null 2>&1; then
  if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/embrope-site \
      .whl/*.whl >>"$log" 2>&1 && export PYTHONPATH="/tmp/embrope-site:${PYTHONPATH:-}"
  fi
  compare_args=(--lib "$build/libembrope.so" --out "$out")
  [ "$quick" = "--quick" ] && compare_args+=(--tokens 1,64,16384 --embed-tokens 16384 --skip compile)
  step compare python3 benchmarks/compare/compare.py "${compare_args[@]}"
else
  say "compare: skipped (EMBROPE_COMPARE=0 or no PyTorch)"
fi

say "gpu-check: $([ $status -eq 0 ] && echo PASSED || echo FAILED)"
exit $status
