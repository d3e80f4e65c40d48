#!/usr/bin/env bash
# Static checks of the compiled CUDA kernels of libembrope.so (no GPU needed):
#   1. the resource usage of the machine code the library ships (`cuobjdump -res-usage`: what
#      ptxas built with the build's own options): no kernel of embrope may use local memory (a
#      stack frame, where spilled registers go) except the one listed in
#      check_cuda_binary.py, whose bounded frame belongs to the device math library; register
#      ceilings for the RoPE fast path. CUB's own kernels are reported but not judged (their
#      code is CUB's).
#   2. the SASS in the library: no embrope kernel outside that list loads or stores local
#      memory, and the fast paths move 16 bytes per access: every instantiation of
#      rope_vector_kernel and of the vectorised embed_kernel (W > 1) has 128-bit global loads
#      and stores (LDG.E.128 / STG.E.128; float8 outputs: the chunk's 4 or 8 bytes in one
#      store) and no 8- or 16-bit global store (a vector split into element accesses would
#      show as those).
# Prints one line per kernel and exits non-zero on any failure.
#   scripts/check-cuda-binary.sh [BUILD_DIR]     (default: build)
# Judged: the machine code of each real architecture the library was built for (the default,
# sm_90, ships it); an architecture shipped as PTX alone is not judged. cuobjdump and nvdisasm
# (which `cuobjdump -sass` runs) come from the CUDA toolkit when it has them, else from PyPI
# (scripts/install-deps.sh --cuda-tools installs them into .deps/cuda-tools).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
# An installed build's libembrope.so.X.Y.Z, else a pip build's libembrope.so.N.
lib=$(find "$build" -maxdepth 1 -name 'libembrope.so.*.*.*' | head -n 1)
[ -n "$lib" ] || lib=$(find "$build" -maxdepth 1 -name 'libembrope.so.[0-9]*' | head -n 1)
[ -n "$lib" ] || lib="$build/libembrope.so"
if [ ! -f "$lib" ]; then
  echo "check-cuda-binary: no libembrope.so in $build" >&2
  exit 2
fi

export PATH="$PATH:/usr/local/cuda/bin"
if ! command -v cuobjdump >/dev/null 2>&1; then
  scripts/install-deps.sh --cuda-tools >/dev/null
  tools=$(find .deps/cuda-tools -path '*/bin/cuobjdump' 2>/dev/null | head -n 1)
  [ -n "$tools" ] && export PATH="$(cd "$(dirname "$tools")" && pwd):$PATH"
fi
for tool in cuobjdump nvdisasm c++filt; do
  if ! command -v $tool >/dev/null 2>&1; then
    echo "check-cuda-binary: no $tool (CUDA toolkit, PyPI nvidia-cuda-cuobjdump / -nvdisasm)" >&2
    exit 2
  fi
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cuobjdump -res-usage "$lib" >"$work/resources.txt"
if ! grep -q "REG:" "$work/resources.txt"; then
  echo "check-cuda-binary: $lib holds no GPU machine code (built without CUDA?)" >&2
  exit 2
fi
cuobjdump -sass "$lib" >"$work/sass.txt"

python3 scripts/check_cuda_binary.py "$work/resources.txt" "$work/sass.txt"
