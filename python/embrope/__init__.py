"""embrope: token embeddings, absolute positions and rotary position embedding (RoPE).

Every op works on the caller's arrays without copying them: NumPy arrays (bfloat16 ones of
``ml_dtypes`` too), PyTorch tensors (CPU and CUDA), CuPy and JAX arrays, anything with
``__dlpack__``. New outputs are allocated
in the framework of the array they are shaped after. Errors are exceptions carrying the
library's message ("apply_rope: rotary_dim 130 exceeds head_dim 128"): InvalidArgumentError
is a ValueError, BadIndexError an IndexError, NotAvailableError a NotImplementedError,
CudaError and InternalError RuntimeErrors, OutOfMemoryError a MemoryError; all derive from
:class:`embrope.Error`.

PyTorch users who need autograd, ``torch.compile`` or CUDA-graph capture use
:mod:`embrope.torch`, which registers the same ops as ``torch.library`` custom ops.
"""

from __future__ import annotations

from typing import Any

from . import _embrope
from ._embed import embed, embed_backward, embed_backward_workspace_size
from ._embrope import (
    BadIndexError,
    CudaError,
    Error,
    InternalError,
    InvalidArgumentError,
    ModelConfig,
    NotAvailableError,
    OutOfMemoryError,
    RopeConfig,
    __version__,
)
from ._models import model_config_from_hf, model_preset, model_presets
from ._quant import QuantizedTable
from ._rope import (
    apply_qk_norm_rope,
    apply_qk_norm_rope_append_kv,
    apply_qk_norm_rope_backward,
    apply_rope,
    apply_rope_append_kv,
    apply_rope_backward,
    packed_positions,
    packed_positions_workspace_size,
)
from ._rope_cache import RopeCache, rope_frequencies
from ._status import DeferredStatus


def cpu_isa() -> str:
    """The instruction set of the CPU kernels: "avx512_bf16", "avx512", "avx2" or "portable"
    (the widest this CPU has, unless the environment variable EMBROPE_CPU_ISA caps it; every
    choice gives the same bits)."""
    return _embrope.cpu_isa()


def cuda_device_count() -> int:
    """CUDA devices this build can use: 0 without CUDA support, a driver or a device."""
    return _embrope.cuda_device_count()


__all__ = [
    "BadIndexError", "CudaError", "DeferredStatus", "Error", "InternalError",
    "InvalidArgumentError", "ModelConfig", "NotAvailableError", "OutOfMemoryError",
    "QuantizedTable", "RopeCache", "RopeConfig", "apply_qk_norm_rope", "apply_qk_norm_rope_append_kv", "apply_qk_norm_rope_backward", "apply_rope", "apply_rope_append_kv", "apply_rope_backward",
    "cpu_isa",
    "cuda_device_count",
    "embed", "embed_backward", "embed_backward_workspace_size", "model_config_from_hf",
    "model_preset", "model_presets", "packed_positions", "packed_positions_workspace_size",
    "rope_frequencies", "__version__",
]


def __getattr__(name: str) -> Any:
    # embrope.torch and embrope.transformers are imported on first use, so that
    # `import embrope` needs neither PyTorch nor transformers.
    if name in ("torch", "transformers"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'embrope' has no attribute {name!r}")
