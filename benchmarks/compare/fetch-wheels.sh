#!/usr/bin/env bash
# Downloads the peer libraries of compare.py as wheels into .whl/ at the repository root
# (ignored by git), on a machine with network access, for a GPU machine without it. Nothing
# is installed here.
#
#   benchmarks/compare/fetch-wheels.sh                # liger-kernel and flashinfer-python
#   benchmarks/compare/fetch-wheels.sh --deps         # + what `import flashinfer.rope` needs
#                                                     #   beyond torch, triton, numpy, packaging
#   benchmarks/compare/fetch-wheels.sh --deps --matplotlib   # + matplotlib for compare.png
#
# Targets CPython 3.12 on x86_64 Linux; PYTHON_VERSION=3.13 (etc.) for another interpreter.
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
dest=.whl
py="${PYTHON_VERSION:-3.12}"
mkdir -p "$dest"
download() {
  # --no-deps: resolving for another platform would otherwise also fetch torch, triton and
  # the CUDA wheels that the GPU machine already has.
  python3 -m pip download --no-deps --only-binary=:all: --python-version "$py" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$dest" "$@"
}

download liger-kernel flashinfer-python
for arg in "$@"; do
  case "$arg" in
    --deps)
      # Found by importing flashinfer.rope with only torch and triton present: tvm_ffi, then
      # requests (and its urllib3, idna, certifi), pynvml, tqdm. ninja runs FlashInfer's
      # JIT build of its RoPE kernel at the first call (nvcc comes from the CUDA toolkit).
      download "apache-tvm-ffi>=0.1.11,<0.2" requests urllib3 idna certifi charset-normalizer \
        nvidia-ml-py tqdm ninja packaging ;;
    --matplotlib)
      download matplotlib contourpy cycler fonttools kiwisolver pillow pyparsing \
        python-dateutil six packaging numpy ;;
    *) echo "unknown option $arg" >&2; exit 2 ;;
  esac
done
ls -l "$dest"
