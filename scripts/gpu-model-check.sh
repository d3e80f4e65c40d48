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
#
# profile.sh builds the emulator with -DSIMT_PROFILE=ON; a BUILD_DIR configured so before
# (.ci/run's, shared with the parity suite) is reused without rebuilding its kernel units.
# The nvcc side (sm_90 cubins with -lineinfo and ptxas -v, disassembled with nvdisasm -g) is
# compiled here, one unit per core at once and beside the emulated cases, rather than by
# profile.sh one after another when they are done: the three quantized lookup units take
# 60-100 s each. Its flags are profile.sh's.
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
out=$build/profile
mkdir -p "$out"

# ptxas's report and the SASS of every kernel unit (runtime.cu has no kernels), compiled in
# the background while the emulator runs the cases (on one core).
rm -rf "$out/nvcc"
mkdir -p "$out/nvcc"
compile_unit() {  # compile_unit UNIT.cu: OUT/nvcc/UNIT.{cubin,ptxas.log,nvdis}
  local name
  name=$(basename "$1" .cu)
  nvcc -DFMT_HEADER_ONLY=1 -Iinclude -O3 -DNDEBUG -arch=sm_90 -fmad=false -std=c++17 \
    -lineinfo -Xptxas -v -cubin -x cu "$1" -o "$out/nvcc/$name.cubin" \
    >"$out/nvcc/$name.ptxas.log" 2>&1 ||
    { tail -n 20 "$out/nvcc/$name.ptxas.log"; echo "gpu-model-check: nvcc failed on $1"; return 1; }
  "$nvdisasm" -g -c "$out/nvcc/$name.cubin" >"$out/nvcc/$name.nvdis"
}
export -f compile_unit
export out nvdisasm
units=()
for cu in cuda/*.cu; do
  [ "$cu" = cuda/runtime.cu ] || units+=("$cu")
done
printf '%s\n' "${units[@]}" | xargs -P "$(nproc)" -I{} bash -c 'compile_unit {}' \
  >"$out/nvcc/compile.log" 2>&1 &
nvcc_pid=$!

"$simt/profile.sh" . --build-dir "$build" --out "$out" --no-nvcc >"$build/profile.log" 2>&1 ||
  { tail -n 40 "$build/profile.log"; kill "$nvcc_pid" 2>/dev/null; exit 1; }
wait "$nvcc_pid" || { cat "$out/nvcc/compile.log"; exit 1; }
ptxas=()
sass=()
for cu in "${units[@]}"; do
  name=$(basename "$cu" .cu)
  ptxas+=("$out/nvcc/$name.ptxas.log")
  sass+=("$out/nvcc/$name.nvdis")
done
python3 "$simt/coalesce_report.py" "$out/profile.json" --ptxas "${ptxas[@]}" \
  --sass "${sass[@]}" --details --check >"$out/report.md"
head -n 3 "$out/report.md"
# The profiler's own test (kernels with known answers) first, then every case ran.
if ! grep -q "^All tests passed" "$out/selftest.log"; then
  tail -n 20 "$out/selftest.log"
  exit 1
fi
if grep -q "FAILED" "$out/cases.log"; then
  grep "FAILED" "$out/cases.log"
  exit 1
fi
python3 scripts/check_gpu_model.py "$out/report.md" benchmarks/model/thresholds.md \
  "${update[@]}"
