#!/usr/bin/env bash
# The C ABI of libembrope against the committed baseline abi/libembrope.abi (libabigail's
# abidw / abidiff; docs/abi.md):
#   scripts/abi-check.sh [BUILD_DIR]           build the library with debug info and compare
#   scripts/abi-check.sh --update [BUILD_DIR]  write the baseline (with a raised
#                                              EMBROPE_ABI_VERSION, or a compatible addition)
# Compared: the embrope_* functions and every type they reach (abi/c-api.suppr); the C++ API
# is a source-level interface. Structs grown by fields appended at their end are compatible
# (struct_size: abi/compare.suppr). Fails when
#   - the SONAME differs from the baseline's: the version was raised without regenerating
#     the baseline (or the baseline without the version);
#   - abidiff finds an incompatible change (a removed function, a struct or signature that
#     changed) under the same SONAME: raise EMBROPE_ABI_VERSION in CMakeLists.txt and
#     regenerate, or make the change compatible (docs/abi.md).
# A compatible change (an added function) passes and is printed: commit a regenerated
# baseline with it.
set -euo pipefail
cd "$(dirname "$0")/.."
update=0
if [ "${1:-}" = "--update" ]; then update=1; shift; fi
build=${1:-build-abi}
baseline=abi/libembrope.abi
for tool in abidw abidiff; do
  command -v "$tool" >/dev/null || { echo "abi-check: $tool missing (Debian: abigail-tools; scripts/install-deps.sh)"; exit 1; }
done

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DEMBROPE_CUDA=OFF \
  -DEMBROPE_BUILD_TESTS=OFF -DEMBROPE_BUILD_BENCHMARKS=OFF -DEMBROPE_BUILD_EXAMPLES=OFF \
  -DEMBROPE_BUILD_PYTHON=OFF >/dev/null
cmake --build "$build" --target embrope >/dev/null
current="$build/libembrope.abi"
abidw --exported-interfaces-only --suppressions abi/c-api.suppr --no-corpus-path \
  --no-show-locs "$build/libembrope.so" >"$current"
soname() { grep -o "soname='[^']*'" "$1" | head -1 | cut -d"'" -f2; }

if [ "$update" = 1 ]; then
  cp "$current" "$baseline"
  echo "abi-check: wrote $baseline ($(soname "$baseline"), $(grep -c '<elf-symbol' "$baseline") functions)"
  exit 0
fi
[ -f "$baseline" ] || { echo "abi-check: no $baseline (scripts/abi-check.sh --update)"; exit 1; }
if [ "$(soname "$current")" != "$(soname "$baseline")" ]; then
  echo "abi-check: the library's SONAME is $(soname "$current"), the baseline's $(soname "$baseline"):"
  echo "  regenerate the baseline with the version (scripts/abi-check.sh --update)"
  exit 1
fi
# Added functions are compatible: compared without them first, then listed.
set +e
abidiff --suppressions abi/compare.suppr --no-show-locs --no-added-syms "$baseline" "$current" \
  >"$build/abidiff.txt"
status=$?
set -e
if (( status & 3 )); then
  cat "$build/abidiff.txt"
  echo "abi-check: abidiff failed (status $status)"
  exit 1
fi
if (( status & 12 )); then
  cat "$build/abidiff.txt"
  echo "abi-check: the C ABI changed incompatibly under the same SONAME $(soname "$current")."
  echo "  Make it compatible (append struct fields past the previous sizeof, add functions:"
  echo "  docs/abi.md), or raise EMBROPE_ABI_VERSION in CMakeLists.txt and run"
  echo "  scripts/abi-check.sh --update"
  exit 1
fi
if ! abidiff --suppressions abi/compare.suppr --no-show-locs "$baseline" "$current" \
  >"$build/abidiff.txt"; then
  cat "$build/abidiff.txt"
  echo "abi-check: compatible additions (above): commit a baseline regenerated with --update"
else
  echo "abi-check: the C ABI equals the baseline ($(soname "$current"))"
fi
