"""The judging half of scripts/check-cuda-binary.sh: reads the resource usage and the SASS of
the machine code in libembrope.so (`cuobjdump -res-usage` and `cuobjdump -sass`, the two files
the script writes) and prints one line per kernel; exits non-zero on any failure.
Usage: check_cuda_binary.py RESOURCE_USAGE SASS_LISTING

Both come from the code the library ships, as ptxas built it with the build's own options
(--fmad false among them). A register spill needs a stack frame and shows in the SASS as local
loads and stores (LDL / STL), so STACK:0 and no LDL / STL mean no spills."""
import re
import subprocess
import sys

# Kernels whose stack frame is the device math library's, not theirs: the exact argument
# reduction of sin/cos for large arguments (Payne-Hanek) keeps its table in local memory.
# The frame must be exactly what the math library's code needs (40 bytes on every build so
# far, nvcc 13.0): the SASS check for local memory cannot apply to this kernel, so a spill
# shows only as a different frame. A toolkit that changes the library's frame fails here too;
# check its SASS for spills (STL / LDL outside the reduction) before changing the number.
LOCAL_MEMORY_ALLOWED = {
    "build_rope_cache_kernel": ("double sin/cos of any finite angle (libdevice's exact "
                                "reduction); runs once per cos/sin table", 40),
}


# Register ceilings: the registers a thread uses decide how many threads an SM holds, and so
# how many bytes a memory-bound kernel keeps in flight. Measured on an H100: the bfloat16 RoPE
# fast path at 122 registers (3 resident blocks of 160 threads per SM) ran at 52% of a copy of
# its bytes, at 48 registers at 80% (benchmarks/results/gpu-2026-11-26-h100/). Every
# rope_vector_kernel instantiation but those for chunks straddling mrope streams (", true>",
# which carry the pair-by-pair fallback and run only for such sections) stays within 64.
REGISTER_CEILINGS = [
    (re.compile(r"rope_vector_kernel<(?!.*, true>)"), 64,
     "the RoPE fast path (above 64 registers an SM holds under half its threads)"),
]


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return dict(zip(names, out.stdout.splitlines()))


def allowed(pretty):
    """(reason, its stack bytes) for a kernel with a stack frame of the math library's."""
    for kernel, allowance in LOCAL_MEMORY_ALLOWED.items():
        if kernel in pretty:
            return allowance
    return None, 0


def is_library(pretty):
    return pretty.startswith(("void cub::", "cub::", "void thrust::", "thrust::"))


def by_architecture(listing):
    """(architecture, text) for each cubin of a cuobjdump listing: a library built for several
    architectures (CMAKE_CUDA_ARCHITECTURES "80;90") holds a cubin per architecture, each headed
    "arch = sm_NN", with the same kernel names in each; every one is judged on its own."""
    parts = re.split(r"^arch = (\S+)$", listing, flags=re.M)
    return zip(parts[1::2], parts[2::2])


# cuobjdump -res-usage, per function of each cubin:
#  Function _Z...:
#   REG:40 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:568 TEXTURE:0 SURFACE:0 SAMPLER:0
# STACK is the function's frame, including what it calls that is not inlined. Keys are
# (architecture, mangled name).
report = {}
registers = {}
for arch, text in by_architecture(open(sys.argv[1]).read()):
    for m in re.finditer(
            r"Function ([^\s:]+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", text):
        key = (arch, m.group(1))
        reg, stack, local = int(m.group(2)), int(m.group(3)), int(m.group(4))
        report[key] = max(report.get(key, 0), stack + local)
        registers[key] = max(registers.get(key, 0), reg)
bodies = {}
for arch, text in by_architecture(open(sys.argv[2]).read()):
    for block in re.split(r"\n\s*Function : ", text)[1:]:
        name, _, body = block.partition("\n")
        bodies[(arch, name.strip())] = body
keys = set(report) | set(bodies)
pretty = demangle(sorted({name for _, name in keys}))
architectures = sorted({arch for arch, _ in keys})

failures = 0
vector_checked = {"rope_vector_kernel": 0, "embed_kernel (vectorised)": 0}
for key in sorted(keys, key=lambda k: (pretty[k[1]], k[0])):
    arch, name = key
    title = pretty[name]
    if len(architectures) > 1:
        title = f"[{arch}] {title}"
    if is_library(pretty[name]):
        print(f"note   {title[:110]}: CUB's kernel, {report.get(key, 0)} B stack (not judged)")
        continue
    problems = []
    stack = report.get(key)
    reason, stack_allowed = allowed(title)
    if stack is None:
        problems.append("not in the resource usage")
    elif stack != stack_allowed:
        problems.append(f"{stack} B stack frame (local memory: spills or arrays)" +
                        (f", not the {stack_allowed} B of {reason}" if reason else ""))
    for pattern, ceiling, why in REGISTER_CEILINGS:
        used = registers.get(key)
        if pattern.search(title) and (used is None or used > ceiling):
            problems.append(f"{used} registers, over the ceiling of {ceiling} for {why}")
    body = bodies.get(key, "")
    if not body:
        problems.append("no SASS")
    elif not reason and re.search(r"\b(LDL|STL)(\.[A-Z0-9.]+)?\s", body):
        problems.append("local memory loads or stores in SASS")
    kind = None
    if "rope_vector_kernel" in title:
        kind = "rope_vector_kernel"
    # embed_kernel<T, W, G, kSinusoidal[, kQuantized]>: W > 1 is the 16-byte path.
    m = re.search(r"embed_kernel<[^,]+, (\d+), (\d+), (true|false)(, (true|false))?>", title)
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
ours = sum(1 for _, name in keys if not is_library(pretty[name]))
print(f"check-cuda-binary: {ours} embrope kernels ({', '.join(architectures)}), "
      f"{sum(vector_checked.values())} fast-path instantiations checked for 128-bit accesses, "
      f"{failures} failures")
sys.exit(1 if failures else 0)
