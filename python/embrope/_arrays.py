"""Plumbing shared by every op: argument checks, devices, streams and output allocation.

Arrays are never copied: the native module reads and writes the caller's memory through
DLPack. What this module decides is only what the library cannot see from a DLPack view:
whether an object is an array at all, whether an array the op writes is writable, and in
which framework a new output is allocated (the framework of the array it is shaped after).
"""

from __future__ import annotations

import numbers
import operator
import sys
from typing import Any, Optional

import numpy as np

from . import _embrope as _C

_KDL_CPU = 1
_KDL_CUDA = 2


def check_array(op: str, name: str, x: Any, *, autograd: bool = True) -> None:
    """Raise TypeError unless `x` is an array embrope can read (DLPack or NumPy), and
    InvalidArgumentError for a NumPy array in the other byte order, or (unless `autograd` is
    False: an argument the call may write, checked by :func:`check_writable` or as read
    later) for a torch tensor that requires grad while grad mode is on."""
    if not (hasattr(x, "__dlpack__") or isinstance(x, np.ndarray)):
        raise TypeError(
            f"{op}: {name} must be an array with __dlpack__ (NumPy, PyTorch, CuPy, JAX, ...), "
            f"not {type(x).__name__}"
        )
    if autograd and _is_torch(x) and x.requires_grad:
        import torch

        if torch.is_grad_enabled():
            # What the call returns cannot carry a gradient back to this tensor: a loss
            # computed from it would leave this tensor's history silently without gradient.
            # torch refuses .numpy() of such a tensor for the same reason.
            raise _C.InvalidArgumentError(
                f"{op}: {name} requires grad, and this call works outside autograd (its "
                f"results carry no gradient back); use embrope.torch.{op} (differentiable), "
                f"or call it under torch.no_grad() or with {name}.detach()")
    if isinstance(x, np.ndarray) and not _is_native_order(x.dtype):
        raise _C.InvalidArgumentError(
            f"{op}: {name} has dtype {x.dtype.str}, in the byte order opposite to this "
            f"machine's; convert it first: {name}.astype({name}.dtype.newbyteorder('='))")


# Per-call answers that depend only on a type or a dtype, remembered: NumPy builds
# dtype.name anew at each access (about 2 us), and a module path split costs about 0.5 us,
# where a whole call's plumbing should cost a few.
_BFLOAT16_DTYPES: dict = {}
_NATIVE_ORDER: dict = {}
_FRAMEWORKS: dict = {}


def framework(x: Any) -> str:
    """The top-level module of `x`'s type ("torch", "numpy", "jax", ...)."""
    kind = type(x)
    name = _FRAMEWORKS.get(kind)
    if name is None:
        name = _FRAMEWORKS[kind] = kind.__module__.split(".")[0]
    return name


def _is_native_order(dtype: Any) -> bool:
    answer = _NATIVE_ORDER.get(dtype)
    if answer is None:
        answer = _NATIVE_ORDER[dtype] = bool(dtype.isnative)
    return answer


def is_numpy_bfloat16(x: Any) -> bool:
    """A NumPy array of ml_dtypes.bfloat16 (JAX's and others' bfloat16 on the host)."""
    if not isinstance(x, np.ndarray):
        return False
    dtype = x.dtype
    answer = _BFLOAT16_DTYPES.get(dtype)
    if answer is None:
        answer = _BFLOAT16_DTYPES[dtype] = dtype.name == "bfloat16" and dtype.itemsize == 2
    return answer


def importable(x: Any) -> Any:
    """`x` as the native module reads it: a NumPy bfloat16 or float8 array of ml_dtypes
    (which NumPy cannot export through DLPack) as a zero-copy view of its bytes; anything else
    as it is."""
    if is_numpy_bfloat16(x):
        return _C.bfloat16_view(x.view(np.uint16))
    if isinstance(x, np.ndarray) and x.dtype.itemsize == 1 and x.dtype.name in _IS_E5M2:
        return _C.float8_view(x.view(np.uint8), _IS_E5M2[x.dtype.name])
    return x


# ml_dtypes' float8 dtypes that DLPack has, by name: whether each is e5m2 (else e4m3fn).
_IS_E5M2 = {"float8_e4m3fn": False, "float8_e5m2": True}


def check_optional(op: str, name: str, x: Any, *, autograd: bool = True) -> None:
    if x is not None:
        check_array(op, name, x, autograd=autograd)


def is_immutable(x: Any) -> bool:
    """JAX arrays cannot be written: embrope reads them, and returns new arrays."""
    return framework(x) in ("jax", "jaxlib")


def check_writable(op: str, name: str, x: Any) -> None:
    """Raise ValueError for an array the op would write but may not (a read-only NumPy array,
    an immutable JAX array, an array whose DLPack export is marked read-only)."""
    _check_written_tensor(op, name, x)
    check_array(op, name, x)
    if isinstance(x, np.ndarray):
        if not x.flags.writeable:
            raise _C.InvalidArgumentError(f"{op}: {name} is read-only, and this call writes it")
        return
    if is_immutable(x):
        raise _C.InvalidArgumentError(
            f"{op}: {name} is immutable ({type(x).__name__}), and this call writes it "
            "(pass inplace=False, or leave the output to embrope)")
    if not _is_torch(x) and not _C.dlpack_writable(x):
        raise _C.InvalidArgumentError(
            f"{op}: {name} is read-only (its DLPack export says so, or it refused a writable "
            "export), and this call writes it")


def _check_written_tensor(op: str, name: str, x: Any) -> None:
    if _is_torch(x) and x.requires_grad:
        import torch

        if torch.is_grad_enabled():
            # Autograd would not know of the write: a gradient through this tensor would be
            # silently wrong. torch refuses in-place writes to leaves that require grad, and
            # out= arguments that do, for the same reason.
            raise _C.InvalidArgumentError(
                f"{op}: {name} requires grad, and this call writes it outside autograd; use "
                f"embrope.torch.{op} (differentiable), or write under torch.no_grad() or to a "
                "detached tensor")


def _is_torch(x: Any) -> bool:
    return framework(x) == "torch"


class writes:
    """Around a native call that writes these arrays (None and other frameworks' skipped):
    afterwards, raising or not (a bad index still writes the other rows), the torch tensors'
    version counters move as an in-place torch op's do, so that autograd refuses a backward
    through a tensor saved before the write instead of using the new values. (A class rather
    than a generator-based context manager: a third of the cost, on every call.)"""

    __slots__ = ("arrays",)

    def __init__(self, *arrays: Any) -> None:
        self.arrays = arrays

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        tensors = [x for x in self.arrays if x is not None and _is_torch(x)]
        if tensors:
            increment_version = _increment_version()
            for t in tensors:
                increment_version(t)


def _increment_version() -> Any:
    """torch.autograd.graph.increment_version, imported once (an import statement on every
    call costs about 1 us)."""
    global _INCREMENT_VERSION
    if _INCREMENT_VERSION is None:
        from torch.autograd.graph import increment_version

        _INCREMENT_VERSION = increment_version
    return _INCREMENT_VERSION


_INCREMENT_VERSION: Any = None


def dlpack_device(x: Any) -> tuple[int, int]:
    """(DLPack device type, ordinal) of an array: (1, 0) for host memory."""
    if hasattr(x, "__dlpack_device__"):
        kind, index = x.__dlpack_device__()
        return int(kind), int(index)
    return _KDL_CPU, 0


def current_cuda_device() -> int:
    """The device a bare 'cuda' names: the current one of the framework in use, as
    ``torch.device('cuda')`` means in PyTorch (``torch.cuda.set_device``, else CuPy's
    ``cupy.cuda.Device(n).use()``); 0 where neither is imported."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return int(torch.cuda.current_device())
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        return int(cupy.cuda.runtime.getDevice())
    return 0


def parse_device(device: Any) -> tuple[int, int]:
    """'cpu', 'cuda' (the current device), 'cuda:1', a torch.device or an int (CUDA ordinal)
    -> (0 | 1, index)."""
    if device is None:
        return 0, 0
    if isinstance(device, numbers.Integral) and not isinstance(device, bool):
        return 1, int(device)
    text = str(device)
    if text == "cpu":
        return 0, 0
    if text == "cuda":
        return 1, current_cuda_device()
    if text.startswith("cuda:") and text[5:].isdigit():
        return 1, int(text[5:])
    raise _C.InvalidArgumentError(
        f"device {text!r} is neither 'cpu' nor 'cuda' / 'cuda:<index>'"
    )


def device_name(pair: tuple[int, int]) -> str:
    kind, index = pair
    return "cpu" if kind == 0 else f"cuda:{index}"


def stream_handle(stream: Any, like: Any = None) -> int:
    """The cudaStream_t of `stream` as an int.

    None means the stream the array's framework is using: PyTorch's current stream for a
    torch CUDA tensor, CuPy's current stream for a CuPy array, else the legacy default stream.
    Accepted otherwise: an int, an object with ``cuda_stream`` (torch.cuda.Stream), ``ptr``
    (cupy.cuda.Stream) or ``__cuda_stream__`` (the CUDA stream protocol).
    """
    if stream is None:
        if like is None:
            return 0
        module = framework(like)
        if module == "torch":
            if not like.is_cuda:  # (torch's __dlpack_device__ costs about 2 us)
                return 0
            import torch

            return int(torch.cuda.current_stream(like.device).cuda_stream)
        if dlpack_device(like)[0] != _KDL_CUDA:
            return 0
        if module == "cupy":
            import cupy

            return int(cupy.cuda.get_current_stream().ptr)
        return 0
    if isinstance(stream, numbers.Integral) and not isinstance(stream, (bool, np.bool_)):
        if not 0 <= stream < 2**64:
            raise _C.InvalidArgumentError(
                f"stream {int(stream)} is not a cudaStream_t handle (0 <= stream < 2**64)")
        return int(stream)
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    for attribute in ("cuda_stream", "ptr"):
        if hasattr(stream, attribute):
            return int(getattr(stream, attribute))
    raise TypeError(f"stream must be an int or a CUDA stream object, not {type(stream).__name__}")


def _allocation_failed(error: BaseException) -> bool:
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    # PyTorch's CPU allocator raises a plain RuntimeError.
    return isinstance(error, RuntimeError) and "can't allocate memory" in str(error)


def _raise_out_of_memory(op: str, shape: Any, dtype: Any, error: BaseException) -> None:
    """Around the allocation of an output a call makes itself (in a plain try: a generator's
    context manager costs 2-4 us a call): a framework's failure to allocate it (NumPy's
    MemoryError, PyTorch's allocator errors) becomes :class:`embrope.OutOfMemoryError` naming
    the op and the output. Raises it from `error` when that is a failed allocation; else
    returns, and the caller re-raises `error`."""
    if _allocation_failed(error):
        raise _C.OutOfMemoryError(
            f"{op}: cannot allocate an output of shape {[int(n) for n in shape]} and dtype "
            f"{dtype}: {error}") from error


def empty_like(op: str, like: Any, shape: tuple[int, ...], dtype: Any = None) -> Any:
    """A new uninitialised array in `like`'s framework and on its device.

    For an immutable framework (JAX) this is a NumPy array on the host, which
    :func:`to_framework` hands back as the framework's array once written.
    """
    dtype = like.dtype if dtype is None else dtype
    try:
        return _empty_like(op, like, shape, dtype)
    except (MemoryError, RuntimeError) as error:
        _raise_out_of_memory(op, shape, dtype, error)
        raise


def _empty_like(op: str, like: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    if _is_torch(like):
        import torch

        return torch.empty(shape, dtype=dtype, device=like.device)
    if isinstance(like, np.ndarray):
        return np.empty(shape, dtype=dtype)
    if is_immutable(like):
        if dlpack_device(like)[0] != _KDL_CPU:
            raise _C.NotAvailableError(
                f"{op}: outputs for {type(like).__name__} arrays on a GPU cannot be allocated "
                "by embrope (they are immutable); pass output arrays of another framework")
        if str(dtype) == "bfloat16":  # NumPy cannot export bfloat16: a view of uint16 bytes
            return _C.bfloat16_view(np.empty(shape, dtype=np.uint16))
        return np.empty(shape, dtype=np.dtype(dtype))
    namespace = getattr(like, "__array_namespace__", None)
    if namespace is not None:
        return namespace().empty(shape, dtype=dtype, device=getattr(like, "device", None))
    raise TypeError(
        f"{op}: cannot allocate an output in the framework of {type(like).__name__}; "
        "pass the output array explicitly"
    )


def to_framework(like: Any, out: Any) -> Any:
    """An output allocated by :func:`empty_like` as the framework's own array."""
    if is_immutable(like):
        import jax

        return jax.numpy.asarray(out) if isinstance(out, np.ndarray) else jax.dlpack.from_dlpack(out)
    return out


def shape_of(x: Any, op: str = "embrope", name: str = "array") -> tuple[int, ...]:
    """The shape of an array that an output is allocated like (an object with only
    ``__dlpack__`` has none to allocate from: its outputs are the caller's to pass)."""
    shape = getattr(x, "shape", None)
    if shape is None or not hasattr(x, "dtype"):
        raise TypeError(
            f"{op}: {name} is a {type(x).__name__} without shape and dtype; embrope cannot "
            "allocate an output like it: pass the output array")
    return tuple(int(n) for n in shape)


_ENUM_MEMBERS: dict = {}


def enum_value(op: str, name: str, enum: Any, value: Any) -> Any:
    """A native enum from its name ('neox') or the enum itself."""
    if isinstance(value, enum):
        return value
    members = _ENUM_MEMBERS.get(enum)
    if members is None:  # enum.__members__ builds a new mapping on every access
        members = _ENUM_MEMBERS[enum] = dict(enum.__members__)
    if isinstance(value, str) and value in members:
        return members[value]
    raise _C.InvalidArgumentError(
        f"{op}: {name} {value!r} is not one of {', '.join(repr(m) for m in members)}"
    )


# The enum of every settings field that takes one, by field name (names are unique across the
# native settings classes): such a field accepts the member's name ("neox") or the member.
_ENUM_FIELDS = {
    "layout": _C.RopeLayout,
    "kv_layout": _C.KvCacheLayout,
    "scaling": _C.RopeScaling,
    "positions": _C.PositionEncoding,
    "sinusoid_layout": _C.SinusoidLayout,
    "norm": _C.Normalization,
    "mode": _C.BackwardMode,
}


def integer(op: str, name: str, value: Any) -> int:
    """`value` as an int: an integer (Python's, NumPy's, a 0-d integer array or tensor) or a
    float holding a whole number (``embed_dim / num_heads``); never a fraction, a string or a
    bool, which int() would truncate, parse or count silently."""
    if type(value) is int:
        return value
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{op}: {name} must be an integer, not a bool ({value})")
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(
            f"{op}: {name} must be an integer, not {type(value).__name__} ({value!r})") from None


def real(op: str, name: str, value: Any) -> float:
    """`value` as a float: a real number (or a 0-d array of one), never a string, which
    float() would parse silently."""
    if not isinstance(value, (str, bytes)):
        try:
            return float(value)
        except (TypeError, ValueError):
            pass
    raise TypeError(f"{op}: {name} must be a real number, not {type(value).__name__} ({value!r})")


def settings(op: str, cls: Any, **fields: Any) -> Any:
    """A native settings object (``_C.RopeOptions``, ``_C.EmbedOptions``, ``_C.RopeConfig``,
    ...) built by keyword: its defaults are the C++ struct's, a field given as None keeps its
    default, and a name the class does not have is an error rather than a silent no-op. An
    integer field takes integers only (:func:`integer`); a value the field cannot hold is a
    TypeError naming the op and the field."""
    value = cls()
    for name, field in fields.items():
        if field is None:
            continue
        enum = _ENUM_FIELDS.get(name)
        if enum is not None:
            field = enum_value(op, name, enum, field)
        if not hasattr(value, name):
            raise TypeError(f"{op}: {cls.__name__} has no field {name!r}")
        default = getattr(value, name)
        if type(default) is int and type(field) is not int:
            field = integer(op, name, field)
        try:
            setattr(value, name, field)
        except TypeError:
            raise TypeError(
                f"{op}: {name} cannot be {type(field).__name__} ({field!r}); it takes "
                f"{type(default).__name__} values") from None
    return value
