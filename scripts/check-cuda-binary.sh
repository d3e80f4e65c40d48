#!/usr/bin/env bash
# Static checks of the compiled CUDA kernels of libembrope.so (no GPU needed):
#   1. ptxas's report: the PTX shipped in the library is assembled again for each of its
#      architectures with `ptxas -v`; no kernel of embrope may spill registers, and none may
#      use local memory (a stack frame) except the few listed below, whose frame belongs to
#      the device math library. CUB's own kernels are reported but not judged (their code
#      is CUB's).
#   2. the SASS in the library: no embrope kernel outside that list loads or stores local
#      memory, and the fast paths move 16 bytes per access: every instantiation of
#      rope_vector_kernel and of the vectorised embed_kernel (W > 1) has 128-bit global loads
#      and stores (LDG.E.128 / STG.E.128; float8 outputs: the chunk's 4 or 8 bytes in one
#      store) and no 8- or 16-bit global store (a vector split into element accesses would
#      show as those).
# Prints one line per kernel and exits non-zero on any failure.
#   scripts/check-cuda-binary.sh [BUILD_DIR]     (default: build)
# cuobjdump and nvdisasm come from the CUDA toolkit when it has them, else from PyPI
# (scripts/install-deps.sh --cuda-tools installs them into .deps/cuda-tools); ptxas from the
# toolkit.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
lib=$(find "$build" -maxdepth 1 -name 'libembrope.so.*.*.*' | head -n 1)
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
for tool in cuobjdump nvdisasm ptxas c++filt; do
  if ! command -v $tool >/dev/null 2>&1; then
    echo "check-cuda-binary: no $tool (CUDA toolkit, PyPI nvidia-cuda-cuobjdump / -nvdisasm)" >&2
    exit 2
  fi
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
lib=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")
(cd "$work" && cuobjdump -xptx all "$lib" >/dev/null)
if ! compgen -G "$work/*.ptx" >/dev/null; then
  echo "check-cuda-binary: $lib holds no PTX (built without CUDA?)" >&2
  exit 2
fi
for ptx in "$work"/*.ptx; do
  arch=$(sed -n 's/^\.target[[:space:]]*\(sm_[0-9a-z]*\).*/\1/p' "$ptx" | head -n 1)
  ptxas -arch="$arch" -v "$ptx" -o "$work/scratch.cubin" 2>>"$work/ptxas.txt"
done
cuobjdump -sass "$lib" >"$work/sass.txt"

python3 - "$work/ptxas.txt" "$work/sass.txt" <<'PY'
import re
import subprocess
import sys

# Kernels whose stack frame is the device math library's, not theirs: the exact argument
# reduction of sin/cos for large arguments (Payne-Hanek) keeps its table in local memory.
LOCAL_MEMORY_ALLOWED = {
    "build_rope_cache_kernel": "double sin/cos of any finite angle (libdevice's exact "
                               "reduction); runs once per cos/sin table",
}


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return dict(zip(names, out.stdout.splitlines()))


def allowed(pretty):
    if "build_rope_cache_kernel" in pretty:
        return LOCAL_MEMORY_ALLOWED["build_rope_cache_kernel"]
    return None


def is_library(pretty):
    return pretty.startswith(("void cub::", "cub::", "void thrust::", "thrust::"))


# ptxas's report, per entry function (kernel): the stack frame including what it calls
# ("cumulative stack size"), and the spills of the kernel and of its callees.
ptxas = open(sys.argv[1]).read()
report = {}
for chunk in ptxas.split("Compiling entry function '")[1:]:
    name = chunk.split("'", 1)[0]
    stack = stores = loads = 0
    for m in re.finditer(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes "
                         r"spill loads", chunk):
        stores += int(m.group(2))
        loads += int(m.group(3))
    own = re.search(r"Function properties for " + re.escape(name) + r"\n\s*(\d+) bytes stack", chunk)
    cumulative = re.search(r"(\d+) bytes cumulative stack size", chunk)
    stack = int(cumulative.group(1)) if cumulative else int(own.group(1)) if own else 0
    report[name] = (stack, stores, loads)
sass = open(sys.argv[2]).read()
bodies = {}
for block in re.split(r"\n\s*Function : ", sass)[1:]:
    name, _, body = block.partition("\n")
    bodies[name.strip()] = body
pretty = demangle(sorted(set(report) | set(bodies)))

failures = 0
vector_checked = {"rope_vector_kernel": 0, "embed_kernel (vectorised)": 0}
for name in sorted(pretty, key=lambda n: pretty[n]):
    title = pretty[name]
    if is_library(title):
        stack, stores, loads = report.get(name, (0, 0, 0))
        print(f"note   {title[:110]}: CUB's kernel, {stack} B stack, {stores} B spill stores "
              f"(not judged)")
        continue
    problems = []
    stack, stores, loads = report.get(name, (None, None, None))
    reason = allowed(title)
    if stack is None:
        problems.append("not in ptxas's report")
    else:
        if stores or loads:
            problems.append(f"spills ({stores} B stores, {loads} B loads)")
        if stack and not reason:
            problems.append(f"{stack} B stack frame (local memory)")
    body = bodies.get(name, "")
    if not body:
        problems.append("no SASS")
    elif not reason and re.search(r"\b(LDL|STL)(\.[A-Z0-9.]+)?\s", body):
        problems.append("local memory loads or stores in SASS")
    kind = None
    if "rope_vector_kernel" in title:
        kind = "rope_vector_kernel"
    m = re.search(r"embed_kernel<[^,]+, (\d+), (\d+), (true|false)>", title)
    if m and int(m.group(1)) > 1:
        kind = "embed_kernel (vectorised)"
    if kind:
        vector_checked[kind] += 1
        if not re.search(r"LDG\.E\.128", body):
            problems.append("no 128-bit global load (LDG.E.128)")
        if "Float8" in title:
            # Float8 outputs: a 16-byte input chunk of kVec elements is stored as kVec bytes,
            # one 64-bit store (16-bit inputs) or one 32-bit store (float32 inputs).
            wide = "float," not in title.split("<", 1)[1][:6]
            store = r"STG\.E\.64" if wide else r"STG\.E(\.STRONG\.[A-Z]+)?\s"
            if not re.search(store, body):
                problems.append(f"no {'64' if wide else '32'}-bit global store of the float8 chunk")
        elif not re.search(r"STG\.E\.128", body):
            problems.append("no 128-bit global store (STG.E.128)")
        if re.search(r"STG\.E\.(U8|S8|U16|S16)\s", body):
            problems.append("8- or 16-bit global stores (a vector split into elements)")
    if problems:
        failures += 1
        print(f"FAIL   {title[:150]}: " + "; ".join(problems))
    else:
        extra = f" (stack {stack} B: {reason})" if stack and reason else ""
        print(f"ok     {title[:150]}{extra}")
for kind, n in vector_checked.items():
    if n == 0:
        print(f"FAIL   no {kind} instantiation found")
        failures += 1
ours = sum(1 for n in pretty if not is_library(pretty[n]))
print(f"check-cuda-binary: {ours} embrope kernels, {sum(vector_checked.values())} fast-path "
      f"instantiations checked for 128-bit accesses, {failures} failures")
sys.exit(1 if failures else 0)
PY
