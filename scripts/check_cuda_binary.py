"""The judging half of scripts/check-cuda-binary.sh: reads ptxas -v's report and the SASS of
libembrope.so (the two files the script writes) and prints one line per kernel; exits non-zero
on any failure. Usage: check_cuda_binary.py PTXAS_REPORT SASS_LISTING"""
import re
import subprocess
import sys

# Kernels whose stack frame is the device math library's, not theirs: the exact argument
# reduction of sin/cos for large arguments (Payne-Hanek) keeps its table in local memory.
LOCAL_MEMORY_ALLOWED = {
    "build_rope_cache_kernel": "double sin/cos of any finite angle (libdevice's exact "
                               "reduction); runs once per cos/sin table",
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
    if "build_rope_cache_kernel" in pretty:
        return LOCAL_MEMORY_ALLOWED["build_rope_cache_kernel"]
    return None


def is_library(pretty):
    return pretty.startswith(("void cub::", "cub::", "void thrust::", "thrust::"))


# ptxas's report, per entry function (kernel): the stack frame including what it calls
# ("cumulative stack size"), and the spills of the kernel and of its callees.
ptxas = open(sys.argv[1]).read()
report = {}
registers = {}
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
    used = re.search(r"Used (\d+) registers", chunk)
    registers[name] = int(used.group(1)) if used else None
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
    for pattern, ceiling, why in REGISTER_CEILINGS:
        used = registers.get(name)
        if pattern.search(title) and (used is None or used > ceiling):
            problems.append(f"{used} registers, over the ceiling of {ceiling} for {why}")
    body = bodies.get(name, "")
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
ours = sum(1 for n in pretty if not is_library(pretty[n]))
print(f"check-cuda-binary: {ours} embrope kernels, {sum(vector_checked.values())} fast-path "
      f"instantiations checked for 128-bit accesses, {failures} failures")
sys.exit(1 if failures else 0)
