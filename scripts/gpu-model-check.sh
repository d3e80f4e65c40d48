#!/usr/bin/env bash
# The GPU memory model of every CUDA kernel against its committed thresholds
# (benchmarks/model/thresholds.md, scripts/check_gpu_model.py).
#
#   scripts/gpu-model-check.sh [BUILD_DIR] [--update]
#
# Runs the emulated device's coalescing profiler (profile.sh of the emulator beside the
# checkout, ../shared/tools/simt, or $EMBROPE_SIMT_DIR) on the model shapes of
# docs/performance.md: every global access of every kernel grouped per warp and instruction,
# joined with ptxas (registers, occupancy) and the SASS (loads in flight) into a Little's-law
# model of an H100. BUILD_DIR (default build-model) holds the emulator build, and its
# profile/ the report. --update tightens the thresholds where kernels got better.
# Needs nvcc and nvdisasm (the CUDA toolkit, or scripts/install-deps.sh --cuda-tools).
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-model
update=()
for arg in "$@"; do
  case $arg in
    --update) update=(--update) ;;
    *) build=$arg ;;
  esac
done
simt=${EMBROPE_SIMT_DIR:-$(cd .. && pwd)/shared/tools/simt}
if [ ! -x "$simt/profile.sh" ]; then
  echo "gpu-model-check: no emulated device (profile.sh) in $simt" >&2
  exit 1
fi
export PATH="$PATH:/usr/local/cuda/bin"
if ! command -v nvcc >/dev/null 2>&1; then
  echo "gpu-model-check: no nvcc: the model needs ptxas and the SASS" >&2
  exit 1
fi
nvdisasm=$(command -v nvdisasm || true)
if [ -z "$nvdisasm" ]; then
  scripts/install-deps.sh --cuda-tools >/dev/null
  nvdisasm=$(find .deps/cuda-tools -path '*/bin/nvdisasm' 2>/dev/null | head -n 1)
fi
if [ -z "$nvdisasm" ]; then
  echo "gpu-model-check: no nvdisasm (CUDA toolkit, or PyPI nvidia-cuda-nvdisasm)" >&2
  exit 1
fi
mkdir -p "$build"
"$simt/profile.sh" . --build-dir "$build" --out "$build/profile" --nvdisasm "$nvdisasm" \
  >"$build/profile.log" 2>&1 || { tail -n 40 "$build/profile.log"; exit 1; }
# The profiler's own test (kernels with known answers) first, then every case ran.
if ! grep -q "^All tests passed" "$build/profile/selftest.log"; then
  tail -n 20 "$build/profile/selftest.log"
  exit 1
fi
if grep -q "FAILED" "$build/profile/cases.log"; then
  grep "FAILED" "$build/profile/cases.log"
  exit 1
fi
python3 scripts/check_gpu_model.py "$build/profile/report.md" benchmarks/model/thresholds.md \
  "${update[@]}"
