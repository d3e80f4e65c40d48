#!/usr/bin/env bash
# Downloads the peer libraries of compare.py as wheels into .whl/ (ignored by git) on a
# machine with network access, for a GPU machine without it. Wheels are only downloaded,
# never installed here, and never committed.
#
#   benchmarks/compare/fetch-wheels.sh          # liger-kernel and flashinfer-python only
#   benchmarks/compare/fetch-wheels.sh --deps   # also the packages FlashInfer imports that a
#                                               # plain torch + triton machine lacks
#
# The target interpreter is CPython 3.12 on x86_64 Linux (PYTHON_VERSION=3.13 etc. to change).
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
dest=.whl
py="${PYTHON_VERSION:-3.12}"
mkdir -p "$dest"
platform_args=(--only-binary=:all: --python-version "$py" --implementation cp
               --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
               --platform manylinux2014_x86_64)

# --no-deps: both would otherwise pull torch/triton/CUDA wheels the GPU machine already has.
python3 -m pip download --no-deps "${platform_args[@]}" -d "$dest" liger-kernel flashinfer-python

if [[ "${1:-}" == "--deps" ]]; then
  # What `import flashinfer.rope` needs beyond torch, triton and numpy (flashinfer/__init__
  # imports most of the package). Pinned loosely to flashinfer-python's own requirements.
  python3 -m pip download --no-deps "${platform_args[@]}" -d "$dest" \
    "apache-tvm-ffi>=0.1.11,<0.2" einops ninja nvidia-ml-py tabulate click
fi
ls -l "$dest"
