#!/usr/bin/env bash
# Everything a GPU machine should check, in one run:
#   build     configure and build (Release, CUDA on, sm_90 unless CMAKE_CUDA_ARCHITECTURES is
#             set in the environment's cache), then the static checks of the compiled kernels
#             (scripts/check-cuda-binary.sh);
#   test      the GPU parity suite (JUnit XML), then the CPU suite (ctest);
#   sanitize  the GPU suite under compute-sanitizer memcheck (with EMBROPE_GPU_SWEEP=reduced:
#             the sweep's 1- and 64-token cases) and racecheck (every case but the sweep);
#   bench     the benchmark on the GPU (JSON; medians of 5 repetitions);
#   compare   when PyTorch is importable, the side-by-side comparison with the peers
#             (benchmarks/compare/compare.py, through the Python package, whose extension the
#             build step builds when python3 has nanobind; wheels for Liger-Kernel and
#             FlashInfer are installed from .whl/ when present, see
#             benchmarks/compare/README.md).
# Logs and JSON go to the directory given as argument, or $OUT, or ./gpu-check-out.
#   scripts/gpu-check.sh [OUT_DIR] [--quick] [--steps=build,test,sanitize,bench,compare]
# --quick shortens the benchmark and the comparison (a first try of the whole script).
# --steps runs a subset (default: all); every step but build builds first if needed (ninja
# does nothing when the build is current). Where one command may run only ~10 minutes, split
# the work into calls on the same machine: --steps=build alone (an H200 machine's 16 threads
# once took 9.5 minutes for it, waiting on one unit since split in three), then
# --steps=test,sanitize, then --steps=bench, then --steps=compare. EMBROPE_COMPARE=0 skips the
# comparison.
# Without network: unpack the dependencies first with shared/tools/offline-deps.sh into
# .deps/ (git-ignored); this script uses .deps/root/usr when it exists.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-check-out}
quick=
steps=build,test,sanitize,bench,compare
for arg in "$@"; do
  case $arg in
    --quick) quick=--quick ;;
    --steps=*) steps=${arg#--steps=} ;;
    -*) echo "gpu-check: unknown option $arg" >&2; exit 2 ;;
    *) out=$arg ;;
  esac
done
wants() { [[ ",$steps," == *",$1,"* ]]; }
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
# The Python extension too, for the comparison, when python3 can build it (nanobind and the
# interpreter's headers); otherwise the comparison says so and the rest runs as before.
python_args=()
if python3 -m nanobind --cmake_dir >/dev/null 2>&1 && python3 -c "import os, sysconfig, sys
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))"; then
  python_args=(-DEMBROPE_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)")
fi
step configure cmake --preset cuda -B $build \
  "${prefix_args[@]}" "${python_args[@]}" || { say "gpu-check: FAILED (configure)"; exit 1; }
step build cmake --build $build -j "$(nproc)" || { say "gpu-check: FAILED (build)"; exit 1; }
step static-checks scripts/check-cuda-binary.sh $build
gpu_tests=$build/tests/gpu/embrope_gpu_tests

if wants test; then
  step gpu-tests "$gpu_tests" -r junit -o "$out/gpu-tests.xml"
  # The hidden cases (rows wider than a capped grid; several GB).
  step gpu-wide-tests "$gpu_tests" "[gpu_wide]"
  [ -f "$out/gpu-tests.xml" ] && grep -o "<testsuite [^>]*>" "$out/gpu-tests.xml" | tee -a "$log"
  # gpu_parity is the suite just run; the CPU suite is the rest.
  step cpu-tests ctest --test-dir $build --output-on-failure -j "$(nproc)" \
    -E 'install_consumer|gpu_parity'
fi

if wants sanitize; then
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  # The sanitizers slow every launch down: memcheck runs every case with the sweep reduced to
  # its decode token counts, racecheck every case but the sweep.
  EMBROPE_GPU_SWEEP=reduced step memcheck "$sanitizer" --tool memcheck \
    --error-exitcode 1 --log-file "$out/memcheck.log" "$gpu_tests"
  step racecheck "$sanitizer" --tool racecheck --error-exitcode 1 \
    --log-file "$out/racecheck.log" "$gpu_tests" "~[sweep]"
  # One file for both tools' reports (fewer files to carry back).
  for tool in memcheck racecheck; do
    echo "=== compute-sanitizer --tool $tool"
    cat "$out/$tool.log" 2>/dev/null
  done >"$out/sanitizer.log"
  rm -f "$out/memcheck.log" "$out/racecheck.log"
  tail -n 2 "$out/sanitizer.log" | tee -a "$log"
fi

if wants bench; then
  # 0.05 s of GPU time per repetition: decode calls run thousands of times, prefill ones
  # dozens; the median of 5 repetitions is reported.
  bench_args=(--device=gpu --benchmark_out="$out/bench.json" --benchmark_out_format=json
    --benchmark_min_time=0.05 --benchmark_repetitions=5 --benchmark_report_aggregates_only=true)
  # --quick: the main cases; otherwise the whole sweep.
  [ -z "$quick" ] && bench_args+=(--full)
  step benchmark "$build/benchmarks/embrope-bench" "${bench_args[@]}"
  # The table and plot (the torch eager column is the comparison step's business).
  step bench_report python3 benchmarks/report.py "$out/bench.json" --out "$out/bench" --no-torch \
    --command "scripts/gpu-check.sh $*"
fi

if wants compare; then
  if [ "${EMBROPE_COMPARE:-1}" != 0 ] && python3 -c "import torch" >/dev/null 2>&1; then
    if compgen -G ".whl/*.whl" >/dev/null; then
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/embrope-site \
        .whl/*.whl >>"$log" 2>&1 && export PYTHONPATH="/tmp/embrope-site:${PYTHONPATH:-}"
    fi
    # The package from this checkout: its Python files beside the extension just built (which
    # finds libembrope in the build tree).
    package=$(pwd)/$build/python-package
    rm -rf "$package" && mkdir -p "$package/embrope" && cp python/embrope/*.py "$package/embrope/"
    if cp "$build"/python/_embrope*.so "$package/embrope/" 2>>"$log"; then
      export PYTHONPATH="$package:${PYTHONPATH:-}"
      compare_args=(--out "$out")
      [ -n "$quick" ] && compare_args+=(--tokens 1,64,16384 --embed-tokens 16384 --skip compile)
      PYTHONUNBUFFERED=1 step compare python3 benchmarks/compare/compare.py "${compare_args[@]}"
    else
      say "compare: FAILED (no Python extension in $build: python3 needs nanobind and its headers)"
      status=1
    fi
  else
    say "compare: skipped (EMBROPE_COMPARE=0 or no PyTorch)"
  fi
fi

say "gpu-check: $([ $status -eq 0 ] && echo PASSED || echo FAILED)"
exit $status
