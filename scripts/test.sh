#!/usr/bin/env bash
# Builds embrope with its tests and runs them: the C++ suite (ctest; the GPU parity suite
# reports "skipped" where no GPU is usable), then the Python package, installed with pip into
# .venv from this checkout, and its pytest suite. CUDA sources are compiled when nvcc is found
# (EMBROPE_CUDA=AUTO), in both builds.
#   scripts/test.sh [BUILD_DIR] [extra cmake arguments...]
# The configuration is CMakePresets.json's "default"; the -D arguments reach the Python build
# too (scikit-build-core's cmake.args). EMBROPE_PYTHON_WITHOUT_CUDA=1 builds the Python package
# without the CUDA kernels whatever they say: CI on a machine without a GPU sets it, since the
# C++ build has compiled the kernels once already (five minutes on two cores) and the package
# could run them nowhere.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
scripts/install-deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake --preset default -B "$build" "$@"
cmake --build "$build" -j "$jobs"
ctest --test-dir "$build" --output-on-failure -j "$jobs"

# The Python package: pip install . (incremental in $build/pip, without build isolation so
# that it reuses .venv's nanobind and scikit-build-core), then pytest against the installed
# package, not the source tree. ($build/python is the main build's own, with
# EMBROPE_BUILD_PYTHON=ON: two CMake trees in one directory would overwrite each other's
# install scripts.)
scripts/install-deps.sh --python
cmake_args=()
for arg in "$@"; do
  if [ "${EMBROPE_PYTHON_WITHOUT_CUDA:-0}" = 1 ] && [[ $arg == -DEMBROPE_CUDA=* ]]; then
    continue
  fi
  [[ $arg == -D* ]] && cmake_args+=("-Ccmake.args=$arg")
done
if [ "${EMBROPE_PYTHON_WITHOUT_CUDA:-0}" = 1 ]; then
  cmake_args+=("-Ccmake.args=-DEMBROPE_CUDA=OFF")
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation \
  -Cbuild-dir="$build/pip" "${cmake_args[@]}" .
.venv/bin/python -m pytest tests/python -q -rs -p no:cacheprovider
