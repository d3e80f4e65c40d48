"""scripts/check_cuda_binary.py on a library built for two architectures: each architecture's
machine code is judged on its own (a kernel's name is the same in every cubin)."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.ci_required

# Named like the RoPE fast path, which must move 16 bytes per access: its sm_90 code does, its
# sm_80 code moves 4.
FIXTURE = r"""
template <typename T, int kVec, bool kMrope>
__global__ void rope_vector_kernel(T* x) {
#if __CUDA_ARCH__ >= 900
  float4 v = reinterpret_cast<float4*>(x)[threadIdx.x];
  v.x += 1.0f;
  v.w += 1.0f;
  reinterpret_cast<float4*>(x)[threadIdx.x] = v;
#else
  x[threadIdx.x] += 1.0f;
#endif
}
template __global__ void rope_vector_kernel<float, 4, false>(float*);
"""


def _tool(name: str, install: bool = False) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/local/cuda/bin")
    if found is None and install:  # as scripts/check-cuda-binary.sh does
        subprocess.run(["bash", "scripts/install-deps.sh", "--cuda-tools"], cwd=ROOT,
                       check=True, capture_output=True)
    if found is None:
        found = next((str(p) for p in (ROOT / ".deps" / "cuda-tools").glob(f"nvidia/*/bin/{name}")),
                     None)
    if found is None:
        pytest.skip(f"{name} is not installed (the CUDA toolkit)")
    return found


def test_every_architecture_is_judged(tmp_path):
    nvcc = _tool("nvcc")
    cuobjdump = _tool("cuobjdump", install=True)
    nvdisasm_dir = os.path.dirname(_tool("nvdisasm", install=True))
    source = tmp_path / "fixture.cu"
    source.write_text(FIXTURE)
    library = tmp_path / "libfixture.so"
    subprocess.run([nvcc, "-shared", "-Xcompiler", "-fPIC", "-gencode",
                    "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
                    str(source), "-o", str(library)], check=True, capture_output=True)
    env = dict(os.environ, PATH=f"{nvdisasm_dir}:{os.environ['PATH']}")
    for flag, name in (("-res-usage", "resources.txt"), ("-sass", "sass.txt")):
        listing = subprocess.run([cuobjdump, flag, str(library)], check=True,
                                 capture_output=True, text=True, env=env).stdout
        (tmp_path / name).write_text(listing)
    judged = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_cuda_binary.py"),
                             str(tmp_path / "resources.txt"), str(tmp_path / "sass.txt")],
                            capture_output=True, text=True)
    lines = judged.stdout.splitlines()
    sm80 = [line for line in lines if "[sm_80]" in line and "rope_vector_kernel" in line]
    sm90 = [line for line in lines if "[sm_90]" in line and "rope_vector_kernel" in line]
    assert len(sm80) == 1 and sm80[0].startswith("FAIL"), judged.stdout
    assert "no 128-bit global load" in sm80[0] and "no 128-bit global store" in sm80[0]
    assert len(sm90) == 1 and sm90[0].startswith("ok"), judged.stdout
    assert judged.returncode == 1
