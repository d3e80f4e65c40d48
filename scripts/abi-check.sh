#!/usr/bin/env bash
# The C ABI of libembrope against the committed baseline abi/libembrope.abi (libabigail's
# abidw / abidiff; docs/abi.md):
#   scripts/abi-check.sh [BUILD_DIR]           build the library with debug info and compare
#   scripts/abi-check.sh --update [BUILD_DIR]  write the baseline (with a raised
#                                              EMBROPE_ABI_VERSION, or a compatible addition)
# Compared: the embrope_* functions and every type they reach (abi/c-api.suppr); the C++ API
# is a source-level interface. Structs grown by fields appended at their end are compatible
# (struct_size: abi/compare.suppr); the opaque handles' internals are not compared
# (abi/opaque.suppr). Fails when
#   - the SONAME differs from the baseline's: the version was raised without regenerating
#     the baseline (or the baseline without the version);
#   - abidiff finds an incompatible change (a removed function, a struct or signature that
#     changed) under the same SONAME: raise EMBROPE_ABI_VERSION in include/embrope/version.h and
#     regenerate, or make the change compatible (docs/abi.md).
# Every field of the baseline's structs keeps its offset and type, a new field starts past the
# previous sizeof, and every enumerator keeps its value (scripts/abi_layout_check.py: abidiff's
# compatible mode lets a retyped field or a renumbered enumerator of a grown struct through).
# A compatible change (an added function, a field appended to a struct) fails too until the
# baseline is regenerated with it (--update, which refuses an incompatible change under the
# same SONAME), so that each change is compared with the one before.
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

# abidiff's status is a bit field: 1 error, 2 usage error, 4 a change, 8 an incompatible one.
# compatible: baseline -> current without added functions and appended struct fields;
# exact: any difference at all (the opaque handles' internals aside; --harmless: an added
# enumerator too, so that the baseline holds it and a later renumbering is seen).
compare() {
  local mode=$1 status
  local options=(--suppressions abi/opaque.suppr --no-show-locs)
  if [ "$mode" = compatible ]; then
    options+=(--suppressions abi/compare.suppr --no-added-syms)
  else
    options+=(--harmless)
  fi
  set +e
  abidiff "${options[@]}" "$baseline" "$current" >"$build/abidiff-$mode.txt"
  status=$?
  set -e
  if (( status & 3 )); then
    cat "$build/abidiff-$mode.txt"
    echo "abi-check: abidiff failed (status $status)"
    exit 1
  fi
  # What abidiff's compatible mode lets through: retyped, moved or removed fields of a grown
  # struct, a field in the old tail padding, renumbered enumerators.
  if [ "$mode" = compatible ] &&
    ! python3 scripts/abi_layout_check.py "$baseline" "$current" >>"$build/abidiff-$mode.txt"; then
    return 1
  fi
  return $(( status == 0 ? 0 : 1 ))
}
same_soname() { [ -f "$baseline" ] && [ "$(soname "$current")" = "$(soname "$baseline")" ]; }

if [ "$update" = 1 ]; then
  if same_soname && ! compare compatible; then
    cat "$build/abidiff-compatible.txt"
    echo "abi-check: not updated: this change is incompatible under the same SONAME"
    echo "  $(soname "$current"): raise EMBROPE_ABI_VERSION in include/embrope/version.h first (docs/abi.md)"
    exit 1
  fi
  cp "$current" "$baseline"
  echo "abi-check: wrote $baseline ($(soname "$baseline"), $(grep -c '<elf-symbol' "$baseline") functions)"
  exit 0
fi
[ -f "$baseline" ] || { echo "abi-check: no $baseline (scripts/abi-check.sh --update)"; exit 1; }
if ! same_soname; then
  echo "abi-check: the library's SONAME is $(soname "$current"), the baseline's $(soname "$baseline"):"
  echo "  regenerate the baseline with the version (scripts/abi-check.sh --update)"
  exit 1
fi
if ! compare compatible; then
  cat "$build/abidiff-compatible.txt"
  echo "abi-check: the C ABI changed incompatibly under the same SONAME $(soname "$current")."
  echo "  Make it compatible (append struct fields past the previous sizeof, add functions:"
  echo "  docs/abi.md), or raise EMBROPE_ABI_VERSION in include/embrope/version.h and run"
  echo "  scripts/abi-check.sh --update"
  exit 1
fi
if ! compare exact; then
  cat "$build/abidiff-exact.txt"
  echo "abi-check: a compatible change (above) that the baseline does not hold: run"
  echo "  scripts/abi-check.sh --update and commit the baseline with the change, so that the"
  echo "  next change is compared with this one"
  exit 1
fi
echo "abi-check: the C ABI equals the baseline ($(soname "$current"))"
