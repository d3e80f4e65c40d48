#!/usr/bin/env bash
# Builds embrope with its tests and runs them: the C++ suite (ctest; the GPU parity suite
# reports "skipped" where no GPU is usable), then the Python package, installed with pip into
# .venv from this checkout, and its pytest suite. CUDA sources are compiled when nvcc is found
# (EMBROPE_CUDA=AUTO), in both builds.
#   scripts/test.sh [BUILD_DIR] [extra cmake arguments...]
# The configuration is CMakePresets.json's "default"; the -D arguments reach the Python build
# too (scikit-build-core's cmake.args).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
scripts/install-deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake --preset default -B "$build" "$@"
cmake --build "$build" -j "$jobs"
ctest --test-dir "$build" --output-on-failure -j "$jobs"

# The Python package: pip install . (incremental in $build/python, without build isolation so
# that it reuses .venv's nanobind and scikit-build-core), then pytest against the installed
# package, not the source tree.
scripts/install-deps.sh --python
cmake_args=()
for arg in "$@"; do
  [[ $arg == -D* ]] && cmake_args+=("-Ccmake.args=$arg")
done
.venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation \
  -Cbuild-dir="$build/python" "${cmake_args[@]}" .
.venv/bin/python -m pytest tests/python -q -p no:cacheprovider
