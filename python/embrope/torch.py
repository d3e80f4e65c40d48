"""embrope's ops as PyTorch operators: autograd, torch.compile and CUDA graphs.

Every op is a ``torch.library`` operator in the ``embrope::`` namespace, with a fake (meta)
kernel, so that ``torch.compile(fullgraph=True)`` traces it without a graph break, and with
autograd where it has a gradient:

- :func:`apply_rope` (``embrope::apply_rope``, functional, and ``embrope::apply_rope_``,
  in place): its gradient is ``embrope::apply_rope_backward``, the transposed rotation, whose
  own gradient is ``embrope::apply_rope`` again (double backward works).
- :func:`apply_qk_norm_rope` (``embrope::apply_qk_norm_rope``): per-head RMSNorm, then RoPE;
  its gradient (q, k and both norm weights) is ``embrope::apply_qk_norm_rope_backward``.
- :func:`embed` (``embrope::embed``, or ``embrope::embed_norm`` with a norm): its gradients
  with respect to the token, position and type tables come from ``embrope::embed_backward``
  (``embrope::embed_norm_backward`` with a norm, which also gives the norm's weight and
  bias theirs), the deterministic backward (sorted, summed in a fixed order: the same bits
  from run to run, on CPU and GPU alike).
- :func:`apply_rope_append_kv` (``embrope::apply_rope_append_kv_``): RoPE fused with the
  KV-cache write, in place (serving; no autograd); :func:`apply_qk_norm_rope_append_kv`
  (``embrope::apply_qk_norm_rope_append_kv_``), the same with the per-head RMSNorm first.
- :func:`packed_positions` (``embrope::packed_positions``).

Kernels run on PyTorch's current CUDA stream. By default a bad id or position raises
:class:`embrope.BadIndexError`, which on a GPU costs a stream synchronisation; inside
:func:`deferred_errors` the ops report to a :class:`embrope.DeferredStatus` instead and never
synchronise, which is what CUDA-graph capture needs.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import weakref
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from . import _arrays, _native
from . import _embrope as _C
from ._embed import embed as _embed_arrays
from ._quant import QuantizedTable
from ._rope_cache import RopeCache
from ._status import DeferredStatus

__all__ = [
    "RotaryEmbedding", "apply_qk_norm_rope", "apply_qk_norm_rope_append_kv", "apply_rope", "apply_rope_append_kv", "apply_rope_backward", "deferred_errors", "embed",
    "embed_backward", "packed_positions", "DeferredStatus",
]

# ------------------------------------------------------------ deferred reporting ----

# A context variable, not a thread-local: per thread, and per asyncio task within a thread (a
# task's block must not report into another task's status across an await).
_status: contextvars.ContextVar[Optional[DeferredStatus]] = contextvars.ContextVar(
    "embrope_deferred_status", default=None)


@contextlib.contextmanager
def deferred_errors(status: DeferredStatus) -> Iterator[DeferredStatus]:
    """Within this block, embrope's torch ops report bad ids and positions to `status`
    instead of raising, and so never synchronise the stream (safe inside
    ``torch.cuda.graph`` capture). Call ``status.check()`` when you choose to.

    The setting is per thread and per asyncio task (a context variable: a context copied into
    another thread, as ``asyncio.to_thread`` does, carries it along; a status must not be used
    by two threads at once); `status` must be on the device of the tensors. A backward
    reports to the status in effect on its own thread, else to its forward's: autograd runs a
    CUDA backward on a thread of its own. A backward compiled by ``torch.compile`` reads only
    the status of the thread it runs on.
    """
    if not isinstance(status, DeferredStatus):
        raise TypeError(f"deferred_errors: status must be an embrope.DeferredStatus, not "
                        f"{type(status).__name__}")
    token = _status.set(status)
    try:
        yield status
    finally:
        _status.reset(token)


def _deferred(op: str, like: Tensor) -> Any:
    status = _status.get()
    if status is not None:
        return status._native
    if like.is_cuda and torch.cuda.is_current_stream_capturing():
        raise _C.InvalidArgumentError(
            f"{op}: called during CUDA graph capture without a DeferredStatus; reporting a bad "
            "index would synchronise the stream. Wrap the captured code in "
            "`with embrope.torch.deferred_errors(status):`")
    return None


# ------------------------------------------------------------------ the operators ----

# The embrope:: operators, each defined on this library with a schema inferred from its
# function's annotations (torch.library.infer_schema) and one kernel for every device
# (CompositeExplicitAutograd), rather than with torch.library.custom_op: the dispatcher then
# calls the kernel itself, where custom_op's layers (an autograd indirection in Python, a
# dynamo-disable wrapper, version bookkeeping) cost 9 us a call of an in-place op and 2 us of
# a functional one, on a one-token call of 20-40 us (benchmarks/call_overhead.py). vLLM
# registers its operators the same way (direct_register_custom_op). Fake kernels, autograd
# (torch.library.register_autograd) and torch.compile work as with custom_op.
_LIBRARY = torch.library.Library("embrope", "FRAGMENT")


def _operator(name: str, fake: Callable[..., Any], *, mutates_args: Tuple[str, ...] = (),
              no_autograd: str = "",
              no_gradient: str = "") -> Callable[[Callable[..., Any]], Any]:
    """Decorator: defines ``embrope::<name>`` with the function as its kernel and `fake` as
    its fake (meta) kernel, and returns the operator (``torch.ops.embrope.<name>.default``).

    A functional operator's autograd is registered after it (``register_autograd``), or, for
    one without a gradient, here: `no_gradient` says why, and a backward through it raises
    NotAvailableError with that reason (with no autograd kernel, torch would only warn and
    leave the gradient silently missing).

    An operator that writes some of its arguments (`mutates_args`, marked in its schema) has
    no autograd: while grad mode is on, a tensor argument that requires grad is refused with
    InvalidArgumentError (``"<op>: <argument> requires grad, but <no_autograd>"``) by both
    kernels, since its gradient would silently miss the write. After the call, raising or not
    (a bad index still writes the other rows), the written tensors' version counters move, as
    an in-place torch op's do, so that a backward through a tensor saved before the write
    raises.
    """
    def define(function: Callable[..., Any]) -> Any:
        _LIBRARY.define(name + torch.library.infer_schema(function, mutates_args=mutates_args))
        kernel, fake_kernel = function, fake
        if mutates_args:
            kernel, fake_kernel = _writing_kernels(name.rstrip("_"), function, fake,
                                                   mutates_args, no_autograd)
        _LIBRARY.impl(name, kernel, "CompositeExplicitAutograd")
        torch.library.register_fake(f"embrope::{name}", fake_kernel, lib=_LIBRARY)
        if no_gradient:
            def backward(ctx: Any, *grads: Any) -> None:
                raise _C.NotAvailableError(f"embrope::{name} has no gradient: {no_gradient}")

            torch.library.register_autograd(f"embrope::{name}", backward, lib=_LIBRARY)
        return getattr(torch.ops.embrope, name).default
    return define


def _register_autograd(name: str, backward: Callable[..., Any],
                       setup_context: Callable[..., Any]) -> None:
    """torch.library.register_autograd for ``embrope::<name>``, with the forward's
    DeferredStatus kept for the backward: a backward reports to the status in effect on its
    own thread, else to its forward's. deferred_errors is per thread, and autograd runs a CUDA
    backward on a thread of its own, where it would not be in effect (a bad index would then
    raise and synchronise, and a captured backward be refused)."""
    def setup(ctx: Any, inputs: Any, output: Any) -> None:
        setup_context(ctx, inputs, output)
        ctx.deferred = _status.get()

    def run_backward(ctx: Any, *grads: Any) -> Any:
        if ctx.deferred is None or _status.get() is not None:
            return backward(ctx, *grads)
        token = _status.set(ctx.deferred)
        try:
            return backward(ctx, *grads)
        finally:
            _status.reset(token)

    torch.library.register_autograd(f"embrope::{name}", run_backward, setup_context=setup)


def _writing_kernels(op: str, function: Callable[..., Any], fake: Callable[..., Any],
                     mutates_args: Tuple[str, ...], no_autograd: str) -> Tuple[Any, Any]:
    """The kernel and fake kernel of an operator that writes its `mutates_args` (see
    :func:`_operator`)."""
    parameters = inspect.signature(function).parameters
    tensors = [(i, name) for i, (name, p) in enumerate(parameters.items())
               if "Tensor" in str(p.annotation)]
    written = [i for i, name in enumerate(parameters) if name in mutates_args]

    def refuse_grad(args: Tuple[Any, ...]) -> None:
        if torch.is_grad_enabled():
            for i, name in tensors:
                if args[i] is not None and args[i].requires_grad:
                    raise _C.InvalidArgumentError(f"{op}: {name} requires grad, but {no_autograd}")

    def kernel(*args: Any) -> None:
        refuse_grad(args)
        try:
            function(*args)
        finally:
            increment_version = _arrays._increment_version()
            for i in written:
                if args[i] is not None:
                    increment_version(args[i])

    def fake_kernel(*args: Any) -> None:
        refuse_grad(args)
        return fake(*args)

    return kernel, fake_kernel


# What the writing operators' refusals say after "<argument> requires grad, but ".
_NO_AUTOGRAD_APPLY_ROPE = (
    "rotating in place has no autograd (the gradient would miss the rotation); pass "
    "inplace=False (differentiable), or call it under torch.no_grad()")
_NO_AUTOGRAD_APPLY_ROPE_APPEND_KV = (
    "this serving op has no autograd (its cache writes are not differentiable); call it under "
    "torch.no_grad(), or use apply_rope for training")
_NO_AUTOGRAD_APPLY_QK_NORM_ROPE_APPEND_KV = (
    "this serving op has no autograd (its cache writes are not differentiable); call it under "
    "torch.no_grad(), or use apply_qk_norm_rope for training")


def _stream(like: Tensor) -> int:
    return int(torch.cuda.current_stream(like.device).cuda_stream) if like.is_cuda else 0


def _empty(op: str, shape: Any, dtype: torch.dtype, device: torch.device,
           zeros: bool = False) -> Tensor:
    """A new output of an op (zero-filled with `zeros`); a failure to allocate it is
    embrope.OutOfMemoryError."""
    try:
        return (torch.zeros if zeros else torch.empty)(shape, dtype=dtype, device=device)
    except (MemoryError, RuntimeError) as error:
        _arrays._raise_out_of_memory(op, shape, dtype, error)
        raise


def _new(like: Tensor, op: str = "apply_rope") -> Tensor:
    return _empty(op, like.shape, like.dtype, like.device)


def _unit_last_stride(t: Optional[Tensor]) -> Optional[Tensor]:
    # Autograd hands in gradients such as expand()ed ones (stride 0); embrope's ops read
    # rows with unit stride.
    return t if t is None or t.dim() == 0 or t.stride(-1) == 1 else t.contiguous()


@functools.lru_cache(maxsize=256)
def _rope_options_cached(op: str, layout: int, inverse: bool, rotary_dim: int,
                         mrope: Tuple[int, ...]) -> Any:
    return _native.RopeSettings(layout, inverse, rotary_dim, mrope).options(op)


def _rope_options(op: str, layout: int, inverse: bool, rotary_dim: int,
                  mrope: List[int]) -> Any:
    """The native RopeOptions of a custom op's arguments (those of a RopeSettings), made once
    per distinct settings (they are read-only)."""
    return _rope_options_cached(op, layout, inverse, rotary_dim, tuple(mrope))


def _table(op: str, cos_sin_cache: Tensor) -> dict:
    """The table keyword of a native call: the whole cos_sin_cache, which the native module
    splits into its halves (no gradient flows to it: see _refuse_table_gradient)."""
    return {"cos_sin_cache": cos_sin_cache}


# --------------------------------------------------------------------- apply_rope ----

def _rope_impl(op: str, backward: bool, q: Tensor, k: Optional[Tensor], positions: Tensor,
               cos_sin_cache: Tensor, layout: int, inverse: bool, rotary_dim: int,
               mrope: List[int], q_out: Optional[Tensor],
               k_out: Optional[Tensor]) -> None:
    native = _C.apply_rope_backward if backward else _C.apply_rope
    _native.call(native, q.detach(), _detach(k), positions, **_table(op, cos_sin_cache),
           options=_rope_options(op, layout, inverse, rotary_dim, mrope), q_out=q_out,
           k_out=k_out, deferred=_deferred(op, q), stream=_stream(q))


def _rope_outputs(q: Tensor, k: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    # A custom op returns tensors, never None: without k, its output is an empty tensor.
    return _new(q), (_new(k) if k is not None else q.new_empty(0))


def _rope_out_of_place(op: str, backward: bool, q: Tensor, k: Optional[Tensor],
                       positions: Tensor, cos_sin_cache: Tensor, layout: int, inverse: bool,
                       rotary_dim: int, mrope: List[int]) -> Tuple[Tensor, Tensor]:
    q_out, k_out = _rope_outputs(q, k)
    _rope_impl(op, backward, q, k, positions, cos_sin_cache, layout, inverse, rotary_dim,
               mrope, q_out, k_out if k is not None else None)
    return q_out, k_out


def _rotated_like_fake(q, k, *options):
    # The fake kernel of each op whose outputs are shaped as its first two tensors.
    return _rope_outputs(q, k)


def _writes_only_fake(*args):
    # The fake kernel of each op that only writes its arguments.
    return None


@_operator("apply_rope", _rotated_like_fake)
def _apply_rope_op(q: Tensor, k: Optional[Tensor], positions: Tensor, cos_sin_cache: Tensor,
                   layout: int, inverse: bool, rotary_dim: int,
                   mrope: List[int]) -> Tuple[Tensor, Tensor]:
    return _rope_out_of_place("apply_rope", False, q, k, positions, cos_sin_cache, layout,
                              inverse, rotary_dim, mrope)


@_operator("apply_rope_backward", _rotated_like_fake)
def _apply_rope_backward_op(dq: Tensor, dk: Optional[Tensor], positions: Tensor,
                            cos_sin_cache: Tensor, layout: int, inverse: bool, rotary_dim: int,
                            mrope: List[int]) -> Tuple[Tensor, Tensor]:
    return _rope_out_of_place("apply_rope_backward", True, dq, dk, positions, cos_sin_cache,
                              layout, inverse, rotary_dim, mrope)


@_operator("apply_rope_", _writes_only_fake,
           mutates_args=("q", "k"), no_autograd=_NO_AUTOGRAD_APPLY_ROPE)
def _apply_rope_inplace_op(q: Tensor, k: Optional[Tensor], positions: Tensor,
                           cos_sin_cache: Tensor, layout: int, inverse: bool, rotary_dim: int,
                           mrope: List[int]) -> None:
    _rope_impl("apply_rope", False, q, k, positions, cos_sin_cache, layout, inverse,
               rotary_dim, mrope, None, None)


def _rope_setup_context(ctx, inputs, output, op: str = "apply_rope"):
    _, k, positions, cos_sin_cache, layout, inverse, rotary_dim, mrope = inputs
    _refuse_table_gradient(op, cos_sin_cache)
    ctx.save_for_backward(positions, cos_sin_cache)
    ctx.has_k = k is not None
    ctx.options = (layout, inverse, rotary_dim, mrope)


def _rope_backward(ctx, grad_q, grad_k):
    positions, cos_sin_cache = ctx.saved_tensors
    grad_k = _unit_last_stride(grad_k) if ctx.has_k else None
    dq, dk = _apply_rope_backward_op(_unit_last_stride(grad_q), grad_k, positions,
                                     cos_sin_cache, *ctx.options)
    return dq, (dk if ctx.has_k else None), None, None, None, None, None, None


_register_autograd("apply_rope", _rope_backward, _rope_setup_context)


def _rope_backward_backward(ctx, grad_dq, grad_dk):
    # apply_rope_backward is the transpose of apply_rope's linear map (m R(-angle) against
    # m R(angle), the attention factor m folded into the table); its transpose, and so its
    # gradient, is apply_rope with the same settings: gradient of gradient (double backward).
    positions, cos_sin_cache = ctx.saved_tensors
    grad_dk = _unit_last_stride(grad_dk) if ctx.has_k else None
    q, k = _apply_rope_op(_unit_last_stride(grad_dq), grad_dk, positions, cos_sin_cache,
                          *ctx.options)
    return q, (k if ctx.has_k else None), None, None, None, None, None, None


_register_autograd("apply_rope_backward", _rope_backward_backward,
                   functools.partial(_rope_setup_context, op="apply_rope_backward"))


def _quantized_outputs(q: Tensor, k: Optional[Tensor], q_nope: Optional[Tensor],
                       k_nope: Optional[Tensor], out_dtype: torch.dtype,
                       empty=None) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The float8 outputs of q, k, q_nope and k_nope (an empty tensor for each absent one)."""
    empty = empty or (lambda x: x.new_empty(x.shape, dtype=out_dtype))
    return tuple(empty(x) if x is not None else q.new_empty(0, dtype=out_dtype)
                 for x in (q, k, q_nope, k_nope))


def _apply_rope_quantized_fake(q, k, positions, cos_sin_cache, layout, inverse, rotary_dim,
                               mrope, out_dtype, q_out_scale, k_out_scale, q_out_head_scales,
                               k_out_head_scales, q_nope, k_nope):
    return _quantized_outputs(q, k, q_nope, k_nope, out_dtype)


@_operator("apply_rope_quantized", _apply_rope_quantized_fake,
           no_gradient="float8 outputs are not differentiable")
def _apply_rope_quantized_op(q: Tensor, k: Optional[Tensor], positions: Tensor,
                             cos_sin_cache: Tensor, layout: int, inverse: bool, rotary_dim: int,
                             mrope: List[int], out_dtype: torch.dtype, q_out_scale: float,
                             k_out_scale: float, q_out_head_scales: Optional[Tensor],
                             k_out_head_scales: Optional[Tensor], q_nope: Optional[Tensor],
                             k_nope: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    op = "apply_rope"
    outputs = _quantized_outputs(q, k, q_nope, k_nope, out_dtype,
                                 lambda x: _empty(op, x.shape, out_dtype, x.device))
    q_out, k_out, q_nope_out, k_nope_out = outputs
    settings = _native.RopeSettings(layout, inverse, rotary_dim, tuple(mrope), q_out_scale,
                                    k_out_scale)
    _native.call(_C.apply_rope, q, k, positions, **_table(op, cos_sin_cache),
                 options=settings.options(op), q_out=q_out,
                 k_out=k_out if k is not None else None, deferred=_deferred(op, q),
                 stream=_stream(q), q_out_head_scales=q_out_head_scales,
                 k_out_head_scales=k_out_head_scales, q_nope=q_nope,
                 q_nope_out=q_nope_out if q_nope is not None else None, k_nope=k_nope,
                 k_nope_out=k_nope_out if k_nope is not None else None)
    return outputs


def _refuse_table_gradient(op: str, cos_sin_cache: Tensor) -> None:
    """Refuses a cos/sin table that requires grad: embrope's RoPE ops give it no gradient, so
    a backward would leave it silently without one. The public functions check before the
    call, and each differentiable operator's autograd setup (called directly through
    torch.ops) checks again."""
    if cos_sin_cache.requires_grad:
        raise _C.InvalidArgumentError(
            f"{op}: the cos/sin table requires grad; embrope has no gradient with respect "
            "to it (detach it)")


def _cos_sin_tensor(op: str, cache: Union[RopeCache, Tensor], device: torch.device) -> Tensor:
    if isinstance(cache, Tensor):
        if torch.is_grad_enabled():  # under no_grad or inference_mode no gradient is missed
            _refuse_table_gradient(op, cache)
        return cache
    if isinstance(cache, RopeCache):
        return _cache_tensor(op, cache, device)
    raise TypeError(f"{op}: cache must be a RopeCache or a cos_sin_cache tensor "
                    f"[max_positions, rotary_dim], not {type(cache).__name__}")


# Each RopeCache's table as a tensor, by device, for as long as the cache lives.
_cache_tables: "weakref.WeakKeyDictionary[RopeCache, dict]" = weakref.WeakKeyDictionary()


# A constant to torch.compile: evaluated when the graph is traced (a RopeCache is immutable),
# so that a function compiled with a cache it has never used eagerly still traces whole.
@torch.compiler.assume_constant_result
def _cache_tensor(op: str, cache: RopeCache, device: torch.device) -> Tensor:
    """The cache's table as a tensor on `device`: zero-copy on the cache's own device, a
    copy (made once and kept) on another."""
    tables = _cache_tables.setdefault(cache, {})
    key = str(device)
    table = tables.get(key)
    if table is None:
        table = torch.from_dlpack(_native.dlpack_table(cache))
        if table.device != device:
            if device.type == "cuda" and _capturing(device):
                # A copy made in a capture is a node of the graph, run at its replays only,
                # in the graph's memory: kept, it would give later calls memory never written.
                raise _C.InvalidArgumentError(
                    f"{op}: the RopeCache lives on {table.device}, and its first use on "
                    f"{device} is inside CUDA graph capture, where its copy cannot be made; "
                    f"call the op once on {device} before capturing, or build the cache there")
            source = table.device
            table = table.to(device)
            # The copy is ordered on the devices' current streams; the kept copy serves calls
            # on any stream. (Those streams alone: a device-wide wait would break another
            # thread's capture.)
            for side in (source, device):
                if side.type == "cuda":
                    torch.cuda.current_stream(side).synchronize()
        tables[key] = table
    return table


def _capturing(device: torch.device) -> bool:
    """Whether the current stream of `device` (not of the current device) is capturing."""
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


def _rope_arguments(op: str, cache: Any, layout: Optional[str], inverse: bool, rotary_dim: int,
                    mrope_section: Optional[Sequence[int]],
                    mrope_interleaved: Optional[bool],
                    axes_dim: Optional[Sequence[int]] = None) -> Tuple[int, bool, int, List[int]]:
    """The custom ops' (layout, inverse, rotary_dim, mrope) of a call, with the settings the
    NumPy / DLPack API would use (its own, else its RopeCache's); mrope holds the position
    streams, mrope's and the axes' (RopeSettings.mrope)."""
    settings = _native.rope_settings(
        op, cache, layout=layout, inverse=inverse, rotary_dim=rotary_dim,
        mrope_section=mrope_section, mrope_interleaved=mrope_interleaved, axes_dim=axes_dim)
    return settings.layout, settings.inverse, settings.rotary_dim, list(settings.mrope)


def apply_rope(q: Tensor, k: Optional[Tensor], positions: Tensor,
               cache: Union[RopeCache, Tensor], *, layout: Optional[str] = None,
               inverse: bool = False, rotary_dim: int = 0,
               mrope_section: Optional[Sequence[int]] = None,
               mrope_interleaved: Optional[bool] = None,
               axes_dim: Optional[Sequence[int]] = None,
               inplace: bool = False, out_dtype: Optional[torch.dtype] = None,
               q_out_scale: float = 1.0, k_out_scale: float = 1.0,
               q_out_head_scales: Optional[Tensor] = None,
               k_out_head_scales: Optional[Tensor] = None, q_nope: Optional[Tensor] = None,
               k_nope: Optional[Tensor] = None) -> Tuple[Optional[Tensor], ...]:
    """Rotary position embedding of q and k, differentiable and traceable.

    The arguments are those of :func:`embrope.apply_rope`; `cache` is a
    :class:`embrope.RopeCache` or a ``cos_sin_cache`` tensor ``[max_positions, R]`` (cos
    half, then sin half: vLLM's and FlashInfer's layout). Under ``torch.compile`` pass the
    tensor (or use :class:`RotaryEmbedding`, which holds it as a buffer).

    inplace : bool, default False
        False (the PyTorch convention): returns new tensors, with autograd through
        ``embrope::apply_rope_backward``. True: rotates q and k in place (the serving path;
        no autograd) and returns them.
    out_dtype : torch.float8_e4m3fn or torch.float8_e5m2, optional
        Quantized outputs (``embrope::apply_rope_quantized``, one pass, no autograd): new
        float8 tensors holding ``float8(value * scale)``, rounded once, saturated
        (FlashInfer's ``rope_quantize_fp8`` semantics: the scale multiplies). None or q's
        dtype: the outputs have q's dtype.
    q_out_scale, k_out_scale, q_out_head_scales, k_out_head_scales
        The float8 outputs' scales, as in :func:`embrope.apply_rope`.
    q_nope, k_nope : Tensor, optional
        With `out_dtype` float8: the non-rotary parts of q and k held apart (FlashInfer's
        ``mla_rope_quantize_fp8``; DeepSeek MLA's q_nope ``[T, H, 128]`` and kv_c
        ``[T, 1, 512]``), quantized in the same pass with q's (k's) scales.

    Returns
    -------
    (q, k)
        k is None when no k was given. With `q_nope` or `k_nope`: (q, k, q_nope_out,
        k_nope_out), None for each part not given.
    """
    op = "apply_rope"
    table = _cos_sin_tensor(op, cache, q.device)
    arguments = _rope_arguments(op, cache, layout, inverse, rotary_dim, mrope_section,
                                mrope_interleaved, axes_dim)
    if out_dtype is not None and out_dtype != q.dtype:
        if out_dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
            raise _C.InvalidArgumentError(
                f"{op}: out_dtype is {out_dtype}; it is q's dtype ({q.dtype}), "
                "torch.float8_e4m3fn or torch.float8_e5m2")
        if inplace:
            raise _C.InvalidArgumentError(
                f"{op}: out_dtype {out_dtype} needs new outputs; inplace must be False")
        if torch.is_grad_enabled() and (q.requires_grad or (k is not None and k.requires_grad)):
            raise _C.InvalidArgumentError(
                f"{op}: float8 outputs have no gradient, but q or k requires grad; call it "
                "under torch.no_grad() or on detached tensors")
        for name, x in (("q_nope", q_nope), ("k_nope", k_nope)):
            if x is not None and torch.is_grad_enabled() and x.requires_grad:
                raise _C.InvalidArgumentError(
                    f"{op}: float8 outputs have no gradient, but {name} requires grad; call "
                    "it under torch.no_grad() or on detached tensors")
        q_out, k_out, q_nope_out, k_nope_out = torch.ops.embrope.apply_rope_quantized(
            q, k, positions, table, *arguments, out_dtype, float(q_out_scale),
            float(k_out_scale), q_out_head_scales, k_out_head_scales, q_nope, k_nope)
        if q_nope is None and k_nope is None:
            return q_out, (k_out if k is not None else None)
        return (q_out, k_out if k is not None else None,
                q_nope_out if q_nope is not None else None,
                k_nope_out if k_nope is not None else None)
    if q_nope is not None or k_nope is not None:
        raise _C.InvalidArgumentError(
            f"{op}: q_nope and k_nope are for float8 outputs (out_dtype=torch.float8_e4m3fn or "
            "torch.float8_e5m2), which quantize them with q and k")
    if q_out_scale != 1.0 or k_out_scale != 1.0 or q_out_head_scales is not None or \
            k_out_head_scales is not None:
        raise _C.InvalidArgumentError(
            f"{op}: q_out_scale, k_out_scale and the head scales apply to float8 outputs only "
            "(out_dtype=torch.float8_e4m3fn or torch.float8_e5m2)")
    if inplace:
        torch.ops.embrope.apply_rope_(q, k, positions, table, *arguments)
        return q, k
    q_out, k_out = torch.ops.embrope.apply_rope(q, k, positions, table, *arguments)
    return q_out, (k_out if k is not None else None)


# ------------------------------------------------------------- apply_qk_norm_rope ----

def _qk_arguments(op: str, like: Tensor, cos_sin_cache: Tensor, q_weight: Optional[Tensor],
                  k_weight: Optional[Tensor], eps: float, unit_offset: bool, layout: int,
                  inverse: bool, rotary_dim: int, mrope: List[int]) -> dict:
    """The keyword arguments the qk-norm ops' native calls share."""
    return dict(norm=_arrays.settings(op, _C.QkNorm, eps=eps, unit_offset=unit_offset),
                q_weight=_detach(q_weight), k_weight=_detach(k_weight),
                **_table(op, cos_sin_cache),
                options=_rope_options(op, layout, inverse, rotary_dim, mrope),
                deferred=_deferred(op, like), stream=_stream(like))


@_operator("apply_qk_norm_rope", _rotated_like_fake)
def _apply_qk_norm_rope_op(q: Tensor, k: Optional[Tensor], positions: Tensor,
                           cos_sin_cache: Tensor, q_weight: Optional[Tensor],
                           k_weight: Optional[Tensor], eps: float, unit_offset: bool,
                           layout: int, inverse: bool, rotary_dim: int,
                           mrope: List[int]) -> Tuple[Tensor, Tensor]:
    op = "apply_qk_norm_rope"
    q_out, k_out = _rope_outputs(q, k)
    _native.call(
        _C.apply_qk_norm_rope, q.detach(), _detach(k), positions, q_out=q_out,
        k_out=k_out if k is not None else None,
        **_qk_arguments(op, q, cos_sin_cache, q_weight, k_weight, eps, unit_offset, layout,
                        inverse, rotary_dim, mrope))
    return q_out, k_out


def _apply_qk_norm_rope_backward_fake(dq, dk, q, k, positions, cos_sin_cache, q_weight,
                                      k_weight, eps, unit_offset, layout, inverse, rotary_dim,
                                      mrope, q_weight_grad, k_weight_grad):
    dq_out, dk_out = _rope_outputs(dq, dk)
    dim = q.shape[-1]
    return (dq_out, dk_out, q.new_empty(dim if q_weight_grad else 0, dtype=torch.float32),
            q.new_empty(dim if k_weight_grad else 0, dtype=torch.float32))


@_operator("apply_qk_norm_rope_backward", _apply_qk_norm_rope_backward_fake,
           no_gradient="apply_qk_norm_rope has no second derivative here")
def _apply_qk_norm_rope_backward_op(
        dq: Tensor, dk: Optional[Tensor], q: Tensor, k: Optional[Tensor], positions: Tensor,
        cos_sin_cache: Tensor, q_weight: Optional[Tensor], k_weight: Optional[Tensor],
        eps: float, unit_offset: bool, layout: int, inverse: bool, rotary_dim: int,
        mrope: List[int], q_weight_grad: bool,
        k_weight_grad: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    dq_out, dk_out = _rope_outputs(dq, dk)
    dim = q.shape[-1]
    gq = q.new_empty(dim if q_weight_grad else 0, dtype=torch.float32)
    gk = q.new_empty(dim if k_weight_grad else 0, dtype=torch.float32)
    op = "apply_qk_norm_rope_backward"
    _native.call(
        _C.apply_qk_norm_rope_backward,
        dq.detach(), _detach(dk), q.detach(), _detach(k), positions, q_out=dq_out,
        k_out=dk_out if dk is not None else None, q_weight_grad=gq if q_weight_grad else None,
        k_weight_grad=gk if k_weight_grad else None,
        **_qk_arguments(op, dq, cos_sin_cache, q_weight, k_weight, eps, unit_offset, layout,
                        inverse, rotary_dim, mrope))
    return dq_out, dk_out, gq, gk


def _qk_setup_context(ctx, inputs, output):
    (q, k, positions, cos_sin_cache, q_weight, k_weight, eps, unit_offset, layout, inverse,
     rotary_dim, mrope) = inputs
    _refuse_table_gradient("apply_qk_norm_rope", cos_sin_cache)
    ctx.save_for_backward(q, k, positions, cos_sin_cache, q_weight, k_weight)
    ctx.options = (eps, unit_offset, layout, inverse, rotary_dim, mrope)
    ctx.weight_dtypes = (None if q_weight is None else q_weight.dtype,
                         None if k_weight is None else k_weight.dtype)


def _qk_backward(ctx, grad_q, grad_k):
    q, k, positions, cos_sin_cache, q_weight, k_weight = ctx.saved_tensors
    want_q = q_weight is not None and ctx.needs_input_grad[4]
    want_k = k_weight is not None and ctx.needs_input_grad[5]
    grad_k = _unit_last_stride(grad_k) if k is not None else None
    dq, dk, gq, gk = _apply_qk_norm_rope_backward_op(
        _unit_last_stride(grad_q), grad_k, q, k, positions, cos_sin_cache, q_weight, k_weight,
        *ctx.options, want_q, want_k)
    gq = gq.to(ctx.weight_dtypes[0]) if want_q else None
    gk = gk.to(ctx.weight_dtypes[1]) if want_k else None
    return (dq, (dk if k is not None else None), None, None, gq, gk, None, None, None, None,
            None, None)


_register_autograd("apply_qk_norm_rope", _qk_backward, _qk_setup_context)


def apply_qk_norm_rope(q: Tensor, k: Optional[Tensor], positions: Tensor,
                       cache: Union[RopeCache, Tensor], *, q_weight: Optional[Tensor] = None,
                       k_weight: Optional[Tensor] = None, eps: float = 1e-6,
                       unit_offset: bool = False, layout: Optional[str] = None,
                       inverse: bool = False, rotary_dim: int = 0,
                       mrope_section: Optional[Sequence[int]] = None,
                       mrope_interleaved: Optional[bool] = None
                       ) -> Tuple[Tensor, Optional[Tensor]]:
    """Per-head RMSNorm of q and k, then RoPE, in one pass: differentiable and traceable.

    The arguments are those of :func:`embrope.apply_qk_norm_rope` (`cache` as in
    :func:`apply_rope`). Returns new tensors; autograd runs
    ``embrope::apply_qk_norm_rope_backward``, which gives q, k and both weights their
    gradients (the weights' summed in a fixed order, the same on CPU and GPU).
    """
    op = "apply_qk_norm_rope"
    table = _cos_sin_tensor(op, cache, q.device)
    arguments = _rope_arguments(op, cache, layout, inverse, rotary_dim, mrope_section,
                                mrope_interleaved)
    q_out, k_out = torch.ops.embrope.apply_qk_norm_rope(
        q, k, positions, table, q_weight, k_weight, float(eps), bool(unit_offset), *arguments)
    return q_out, (k_out if k is not None else None)


@_operator("apply_rope_append_kv_", _writes_only_fake,
           mutates_args=("q", "k_cache", "v_cache", "q_out", "q_nope_out"),
           no_autograd=_NO_AUTOGRAD_APPLY_ROPE_APPEND_KV)
def _apply_rope_append_kv_op(q: Tensor, k: Tensor, v: Tensor, positions: Tensor,
                             cos_sin_cache: Tensor, k_cache: Tensor, v_cache: Tensor,
                             slot_mapping: Optional[Tensor], cache_offsets: Optional[Tensor],
                             cu_seqlens: Optional[Tensor], kv_layout: int, k_scale: float,
                             v_scale: float, layout: int, rotary_dim: int, mrope: List[int],
                             q_out: Optional[Tensor], q_out_scale: float,
                             q_out_head_scales: Optional[Tensor], q_nope: Optional[Tensor],
                             q_nope_out: Optional[Tensor]) -> None:
    op = "apply_rope_append_kv"
    settings = _native.RopeSettings(layout, False, rotary_dim, tuple(mrope), q_out_scale)
    _native.call(
        _C.apply_rope_append_kv,
        q.detach(), k.detach(), v.detach(), positions, k_cache=k_cache.detach(),
        v_cache=v_cache.detach(), kv_layout=_C.KvCacheLayout(kv_layout), k_scale=k_scale,
        v_scale=v_scale, slot_mapping=slot_mapping, cache_offsets=cache_offsets,
        cu_seqlens=cu_seqlens, **_table(op, cos_sin_cache), options=settings.options(op),
        deferred=_deferred(op, q), stream=_stream(q), q_out=q_out,
        q_out_head_scales=q_out_head_scales, q_nope=q_nope, q_nope_out=q_nope_out)


def _float8_q_out(op: str, q: Tensor, q_nope: Optional[Tensor],
                  q_out_dtype: Optional[torch.dtype]) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """The new float8 q_out (and q_nope_out) of a cache-append op, or None: q in place."""
    if q_out_dtype is None or q_out_dtype == q.dtype:
        if q_nope is not None:
            raise _C.InvalidArgumentError(
                f"{op}: q_nope is for a float8 q_out; give q_out_dtype torch.float8_e4m3fn or "
                "torch.float8_e5m2")
        return None, None
    if q_out_dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise _C.InvalidArgumentError(
            f"{op}: q_out_dtype is {q_out_dtype}; it is q's dtype ({q.dtype}), "
            "torch.float8_e4m3fn or torch.float8_e5m2")
    q_out = _empty(op, q.shape, q_out_dtype, q.device)
    q_nope_out = None if q_nope is None else _empty(op, q_nope.shape, q_out_dtype, q.device)
    return q_out, q_nope_out


def apply_rope_append_kv(q: Tensor, k: Tensor, v: Tensor, positions: Tensor,
                         cache: Union[RopeCache, Tensor], k_cache: Tensor, v_cache: Tensor, *,
                         slot_mapping: Optional[Tensor] = None,
                         cache_offsets: Optional[Tensor] = None,
                         cu_seqlens: Optional[Tensor] = None, kv_layout: str = "nhd",
                         k_scale: float = 1.0, v_scale: float = 1.0,
                         layout: Optional[str] = None, rotary_dim: int = 0,
                         mrope_section: Optional[Sequence[int]] = None,
                         mrope_interleaved: Optional[bool] = None,
                         q_out_dtype: Optional[torch.dtype] = None, q_out_scale: float = 1.0,
                         q_out_head_scales: Optional[Tensor] = None,
                         q_nope: Optional[Tensor] = None) -> Any:
    """RoPE of q in place and of k into the KV cache, with v, in one pass (the serving path).

    ``embrope::apply_rope_append_kv_`` mutates q, k_cache and v_cache (no autograd); k and v
    are only read. The arguments are those of :func:`embrope.apply_rope_append_kv` (separate
    k and v caches; pass ``kv[:, 0]`` and ``kv[:, 1]`` of a combined one). Traceable by
    ``torch.compile`` and capturable in a CUDA graph (inside :func:`deferred_errors`).

    With `q_out_dtype` ``torch.float8_e4m3fn`` / ``torch.float8_e5m2`` q is not written: the
    rotated q goes to a new float8 tensor, ``float8(value * scale)`` rounded once with
    `q_out_scale` and `q_out_head_scales` (FlashInfer's
    ``rope_quantize_fp8_append_paged_kv_cache``), and `q_nope` (q's non-rotary part held
    apart, DeepSeek MLA) to another, quantized with q's scales.

    Returns
    -------
    q, or the float8 q_out; with `q_nope`: (q_out, q_nope_out)
    """
    op = "apply_rope_append_kv"
    table = _cos_sin_tensor(op, cache, q.device)
    layout_value, _, rotary_dim, mrope = _rope_arguments(
        op, cache, layout, False, rotary_dim, mrope_section, mrope_interleaved)
    kv_value = _arrays.enum_value(op, "kv_layout", _C.KvCacheLayout, kv_layout).value
    q_out, q_nope_out = _float8_q_out(op, q, q_nope, q_out_dtype)
    torch.ops.embrope.apply_rope_append_kv_(
        q, k, v, positions, table, k_cache, v_cache, slot_mapping, cache_offsets, cu_seqlens,
        kv_value, float(k_scale), float(v_scale), layout_value, rotary_dim, mrope, q_out,
        float(q_out_scale), q_out_head_scales, q_nope, q_nope_out)
    if q_nope is not None:
        return q_out, q_nope_out
    return q if q_out is None else q_out


@_operator("apply_qk_norm_rope_append_kv_", _writes_only_fake,
           mutates_args=("q", "k_cache", "v_cache", "q_out"),
           no_autograd=_NO_AUTOGRAD_APPLY_QK_NORM_ROPE_APPEND_KV)
def _apply_qk_norm_rope_append_kv_op(q: Tensor, k: Tensor, v: Tensor, positions: Tensor,
                                     cos_sin_cache: Tensor, k_cache: Tensor, v_cache: Tensor,
                                     slot_mapping: Optional[Tensor],
                                     cache_offsets: Optional[Tensor],
                                     cu_seqlens: Optional[Tensor], kv_layout: int,
                                     k_scale: float, v_scale: float, q_weight: Optional[Tensor],
                                     k_weight: Optional[Tensor], eps: float, unit_offset: bool,
                                     layout: int, rotary_dim: int, mrope: List[int],
                                     q_out: Optional[Tensor], q_out_scale: float,
                                     q_out_head_scales: Optional[Tensor]) -> None:
    op = "apply_qk_norm_rope_append_kv"
    arguments = _qk_arguments(op, q, cos_sin_cache, q_weight, k_weight, eps, unit_offset, layout,
                              False, rotary_dim, mrope)
    arguments["options"] = _native.RopeSettings(layout, False, rotary_dim, tuple(mrope),
                                                q_out_scale).options(op)
    _native.call(
        _C.apply_qk_norm_rope_append_kv,
        q.detach(), k.detach(), v.detach(), positions, k_cache=k_cache.detach(),
        v_cache=v_cache.detach(), kv_layout=_C.KvCacheLayout(kv_layout), k_scale=k_scale,
        v_scale=v_scale, slot_mapping=slot_mapping, cache_offsets=cache_offsets,
        cu_seqlens=cu_seqlens, q_out=q_out, q_out_head_scales=q_out_head_scales, **arguments)


def apply_qk_norm_rope_append_kv(q: Tensor, k: Tensor, v: Tensor, positions: Tensor,
                                 cache: Union[RopeCache, Tensor], k_cache: Tensor,
                                 v_cache: Tensor, *, q_weight: Optional[Tensor] = None,
                                 k_weight: Optional[Tensor] = None, eps: float = 1e-6,
                                 unit_offset: bool = False,
                                 slot_mapping: Optional[Tensor] = None,
                                 cache_offsets: Optional[Tensor] = None,
                                 cu_seqlens: Optional[Tensor] = None, kv_layout: str = "nhd",
                                 k_scale: float = 1.0, v_scale: float = 1.0,
                                 layout: Optional[str] = None, rotary_dim: int = 0,
                                 mrope_section: Optional[Sequence[int]] = None,
                                 mrope_interleaved: Optional[bool] = None,
                                 q_out_dtype: Optional[torch.dtype] = None,
                                 q_out_scale: float = 1.0,
                                 q_out_head_scales: Optional[Tensor] = None) -> Tensor:
    """Per-head RMSNorm of q and k, RoPE, and the KV-cache write, in one pass (Qwen3 serving).

    ``embrope::apply_qk_norm_rope_append_kv_`` mutates q, k_cache and v_cache (no autograd:
    a q, k, v or weight that requires grad is refused while grad mode is on); k and v are only
    read. The arguments are those of :func:`embrope.apply_qk_norm_rope_append_kv` (separate k
    and v caches; pass ``kv[:, 0]`` and ``kv[:, 1]`` of a combined one). Traceable by
    ``torch.compile``. With `q_out_dtype` float8, q is not written: the normalised, rotated q
    goes to a new float8 tensor, quantized as in :func:`apply_rope_append_kv`.

    Returns
    -------
    q, or the float8 q_out
    """
    op = "apply_qk_norm_rope_append_kv"
    table = _cos_sin_tensor(op, cache, q.device)
    layout_value, _, rotary_dim, mrope = _rope_arguments(
        op, cache, layout, False, rotary_dim, mrope_section, mrope_interleaved)
    kv_value = _arrays.enum_value(op, "kv_layout", _C.KvCacheLayout, kv_layout).value
    q_out, _ = _float8_q_out(op, q, None, q_out_dtype)
    torch.ops.embrope.apply_qk_norm_rope_append_kv_(
        q, k, v, positions, table, k_cache, v_cache, slot_mapping, cache_offsets, cu_seqlens,
        kv_value, float(k_scale), float(v_scale), q_weight, k_weight, float(eps),
        bool(unit_offset), layout_value, rotary_dim, mrope, q_out, float(q_out_scale),
        q_out_head_scales)
    return q if q_out is None else q_out


def apply_rope_backward(dq: Tensor, dk: Optional[Tensor], positions: Tensor,
                        cache: Union[RopeCache, Tensor], *, layout: Optional[str] = None,
                        inverse: bool = False, rotary_dim: int = 0,
                        mrope_section: Optional[Sequence[int]] = None,
                        mrope_interleaved: Optional[bool] = None,
                        axes_dim: Optional[Sequence[int]] = None
                        ) -> Tuple[Tensor, Optional[Tensor]]:
    """The gradient of :func:`apply_rope` (new tensors): ``m R(-angle) dy``; the arguments
    are apply_rope's."""
    op = "apply_rope_backward"
    table = _cos_sin_tensor(op, cache, dq.device)
    arguments = _rope_arguments(op, cache, layout, inverse, rotary_dim, mrope_section,
                                mrope_interleaved, axes_dim)
    dq_out, dk_out = torch.ops.embrope.apply_rope_backward(dq, dk, positions, table, *arguments)
    return dq_out, (dk_out if dk is not None else None)


def _device_after(fn: Callable, device: torch.device) -> torch.device:
    """The device a Module._apply function moves a tensor on `device` to (its dtype cast, if
    any, left out): for modules whose tables keep their dtype."""
    return fn(torch.empty(0, device=device)).device


class RotaryEmbedding(torch.nn.Module):
    """RoPE as a module holding its cos/sin table as a (non-persistent) buffer, so that it
    moves with ``.to(device)`` and is a constant to ``torch.compile``.

    Parameters
    ----------
    cache : RopeCache or Tensor [max_positions, R]
        The table, held without a copy (a RopeCache's own memory, or the tensor detached);
        ``.to(device)`` copies it to another device.
    layout, mrope_section, mrope_interleaved, axes_dim : optional
        As in :func:`apply_rope`; default: the cache's.
    """

    def __init__(self, cache: Union[RopeCache, Tensor], *, layout: Optional[str] = None,
                 mrope_section: Optional[Sequence[int]] = None,
                 mrope_interleaved: Optional[bool] = None,
                 axes_dim: Optional[Sequence[int]] = None) -> None:
        super().__init__()
        if isinstance(cache, RopeCache):
            table = torch.from_dlpack(_native.dlpack_table(cache))
        else:
            table = cache.detach()
        self.layout, _, _, self.mrope = _rope_arguments(
            "RotaryEmbedding", cache, layout, False, 0, mrope_section, mrope_interleaved,
            axes_dim)
        self.register_buffer("cos_sin_cache", table, persistent=False)

    def _apply(self, fn: Callable, recurse: bool = True) -> "RotaryEmbedding":
        # .to(device) moves the table; a dtype cast (model.half()) keeps its dtype, as the
        # transformers integration's tables do: the table's precision is the caller's choice
        # (a RopeCache's float32 values are exact), not the model's.
        device = _device_after(fn, self.cos_sin_cache.device)
        if device != self.cos_sin_cache.device:
            self.cos_sin_cache = self.cos_sin_cache.to(device)
        return self

    def forward(self, positions: Tensor, q: Tensor, k: Optional[Tensor] = None, *,
                inplace: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """Rotates q and k by `positions` (vLLM's argument order)."""
        if inplace:
            torch.ops.embrope.apply_rope_(q, k, positions, self.cos_sin_cache, self.layout,
                                          False, 0, self.mrope)
            return q, k
        q_out, k_out = torch.ops.embrope.apply_rope(q, k, positions, self.cos_sin_cache,
                                                    self.layout, False, 0, self.mrope)
        return q_out, (k_out if k is not None else None)


# -------------------------------------------------------------------------- embed ----

def _detach(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else t.detach()


def _embed_fake(table, ids, position_table, position_ids, position_offsets, type_table,
                type_ids, scale, vocab_start, vocab_shard, positions, sinusoid_base,
                sinusoid_layout, padding_idx):
    return table.new_empty(tuple(ids.shape) + (table.shape[-1],))


@_operator("embed", _embed_fake)
def _embed_op(table: Tensor, ids: Tensor, position_table: Optional[Tensor],
              position_ids: Optional[Tensor], position_offsets: Optional[Tensor],
              type_table: Optional[Tensor], type_ids: Optional[Tensor], scale: float,
              vocab_start: int, vocab_shard: bool, positions: int, sinusoid_base: float,
              sinusoid_layout: int, padding_idx: Optional[int]) -> Tensor:
    out = _empty("embed", tuple(ids.shape) + (table.shape[-1],), table.dtype, table.device)
    options = _native.EmbedSettings(scale, vocab_start, vocab_shard, positions, sinusoid_base,
                                    sinusoid_layout, _C.Normalization.none.value, 0.0,
                                    False).options("embed")
    _native.call(_C.embed, table.detach(), ids, out, options=options,
                 position_table=_detach(position_table), position_ids=position_ids,
                 position_offsets=position_offsets, type_table=_detach(type_table),
                 type_ids=type_ids, deferred=_deferred("embed", table), stream=_stream(table))
    return out


def _embed_backward_fake(grad_out, ids, position_ids, position_offsets, type_ids, table_rows,
                         position_rows, type_rows, dtype, scale, vocab_start, vocab_shard,
                         padding_idx):
    width = grad_out.shape[-1]
    return [grad_out.new_empty((rows, width), dtype=dtype)
            for rows in (table_rows, position_rows, type_rows)]


@_operator("embed_backward", _embed_backward_fake,
           no_gradient="embed has no second derivative here")
def _embed_backward_op(grad_out: Tensor, ids: Tensor, position_ids: Optional[Tensor],
                       position_offsets: Optional[Tensor], type_ids: Optional[Tensor],
                       table_rows: int, position_rows: int, type_rows: int, dtype: torch.dtype,
                       scale: float, vocab_start: int, vocab_shard: bool,
                       padding_idx: Optional[int]) -> List[Tensor]:
    """Zero-initialised gradients [rows, D] (0 rows: not wanted), accumulated by
    embed_backward (deterministic mode)."""
    width = grad_out.shape[-1]
    grads = [_empty("embed_backward", (rows, width), dtype, grad_out.device, zeros=True)
             for rows in (table_rows, position_rows, type_rows)]
    wanted = [g if rows > 0 else None
              for g, rows in zip(grads, (table_rows, position_rows, type_rows))]
    op = "embed_backward"
    _native.call(
        _C.embed_backward,
        grad_out.detach(), ids, wanted[0],
        options=_native.embed_backward_options(op, scale=scale, vocab_start=vocab_start,
                                               vocab_shard=vocab_shard,
                                               padding_idx=padding_idx, mode="deterministic"),
        grad_position_table=wanted[1], position_ids=position_ids if position_rows > 0 else None,
        position_offsets=position_offsets if position_rows > 0 else None,
        grad_type_table=wanted[2], type_ids=type_ids if type_rows > 0 else None,
        deferred=_deferred(op, grad_out), stream=_stream(grad_out))
    return grads


def _gradient_rows(table, position_table, type_table, positions) -> Tuple[int, int, int]:
    """The rows of each table's gradient for embed_backward (0: the table needs none)."""
    learned = positions == _C.PositionEncoding.learned.value and position_table is not None
    return (
        table.shape[0] if table.requires_grad else 0,
        position_table.shape[0] if learned and position_table.requires_grad else 0,
        type_table.shape[0] if type_table is not None and type_table.requires_grad else 0,
    )


def _embed_setup_context(ctx, inputs, output):
    (table, ids, position_table, position_ids, position_offsets, type_table, type_ids, scale,
     vocab_start, vocab_shard, positions, _, _, padding_idx) = inputs
    ctx.save_for_backward(ids, position_ids, position_offsets, type_ids)
    ctx.rows = _gradient_rows(table, position_table, type_table, positions)
    ctx.dtype = table.dtype
    ctx.options = (scale, vocab_start, vocab_shard, padding_idx)


def _embed_backward(ctx, grad_out):
    ids, position_ids, position_offsets, type_ids = ctx.saved_tensors
    grads = _embed_backward_op(_unit_last_stride(grad_out), ids, position_ids, position_offsets, type_ids,
                               *ctx.rows, ctx.dtype, *ctx.options)
    wanted = [g if rows > 0 else None for g, rows in zip(grads, ctx.rows)]
    return (wanted[0], None, wanted[1], None, None, wanted[2], None, None, None, None, None,
            None, None, None)


_register_autograd("embed", _embed_backward, _embed_setup_context)


def _embed_norm_fake(table, ids, position_table, position_ids, position_offsets, type_table,
                     type_ids, norm_weight, norm_bias, scale, vocab_start, positions,
                     sinusoid_base, sinusoid_layout, norm, norm_eps, norm_unit_offset,
                     padding_idx):
    shape = tuple(ids.shape) + (table.shape[-1],)
    return table.new_empty(shape), table.new_empty(shape)


@_operator("embed_norm", _embed_norm_fake)
def _embed_norm_op(table: Tensor, ids: Tensor, position_table: Optional[Tensor],
                   position_ids: Optional[Tensor], position_offsets: Optional[Tensor],
                   type_table: Optional[Tensor], type_ids: Optional[Tensor],
                   norm_weight: Optional[Tensor], norm_bias: Optional[Tensor], scale: float,
                   vocab_start: int, positions: int, sinusoid_base: float, sinusoid_layout: int,
                   norm: int, norm_eps: float, norm_unit_offset: bool,
                   padding_idx: Optional[int]) -> Tuple[Tensor, Tensor]:
    """embed with a norm: (out, pre_norm), both in the table's dtype."""
    shape = tuple(ids.shape) + (table.shape[-1],)
    out = _empty("embed", shape, table.dtype, table.device)
    pre = _empty("embed", shape, table.dtype, table.device)
    options = _native.EmbedSettings(scale, vocab_start, False, positions, sinusoid_base,
                                    sinusoid_layout, norm, norm_eps,
                                    norm_unit_offset).options("embed")
    _native.call(_C.embed, table.detach(), ids, out, options=options,
                 position_table=_detach(position_table), position_ids=position_ids,
                 position_offsets=position_offsets, type_table=_detach(type_table),
                 type_ids=type_ids, norm_weight=_detach(norm_weight),
                 norm_bias=_detach(norm_bias), pre_norm_out=pre,
                 deferred=_deferred("embed", table), stream=_stream(table))
    return out, pre


def _embed_norm_setup_context(ctx, inputs, output):
    (table, ids, position_table, position_ids, position_offsets, type_table, type_ids,
     norm_weight, norm_bias, scale, vocab_start, positions, _, _, norm, norm_eps,
     norm_unit_offset, padding_idx) = inputs
    ctx.save_for_backward(ids, position_ids, position_offsets, type_ids, output[1], norm_weight)
    ctx.rows = _gradient_rows(table, position_table, type_table, positions)
    ctx.dtype = table.dtype
    ctx.options = (scale, vocab_start, False, padding_idx)
    ctx.norm = (norm, norm_eps, norm_unit_offset)
    ctx.weight_grad = norm_weight is not None and norm_weight.requires_grad
    ctx.bias = None if norm_bias is None else (norm_bias.requires_grad, norm_bias.dtype)


def _embed_norm_backward_fake(grad_out, grad_pre_norm, ids, position_ids, position_offsets,
                              type_ids, pre_norm, norm_weight, table_rows, position_rows,
                              type_rows, dtype, scale, vocab_start, padding_idx, norm, norm_eps,
                              norm_unit_offset, weight_grad, bias_grad):
    width = grad_out.shape[-1]
    return ([grad_out.new_empty((rows, width), dtype=dtype)
             for rows in (table_rows, position_rows, type_rows)]
            + [grad_out.new_empty((width if wanted else 0,), dtype=torch.float32)
               for wanted in (weight_grad, bias_grad)])


@_operator("embed_norm_backward", _embed_norm_backward_fake,
           no_gradient="embed with a norm has no second derivative here")
def _embed_norm_backward_op(grad_out: Tensor, grad_pre_norm: Optional[Tensor], ids: Tensor,
                            position_ids: Optional[Tensor], position_offsets: Optional[Tensor],
                            type_ids: Optional[Tensor], pre_norm: Tensor,
                            norm_weight: Optional[Tensor], table_rows: int, position_rows: int,
                            type_rows: int, dtype: torch.dtype, scale: float, vocab_start: int,
                            padding_idx: Optional[int], norm: int, norm_eps: float,
                            norm_unit_offset: bool, weight_grad: bool,
                            bias_grad: bool) -> List[Tensor]:
    """embed_backward with the norm: the three tables' zero-initialised gradients [rows, D]
    (0 rows: not wanted) in `dtype`, then the norm weight's and bias's [D] float32 (0
    elements: not wanted)."""
    width = grad_out.shape[-1]
    op = "embed_backward"
    rows = (table_rows, position_rows, type_rows)
    grads = [_empty(op, (n, width), dtype, grad_out.device, zeros=True) for n in rows]
    norm_grads = [_empty(op, (width if wanted else 0,), torch.float32, grad_out.device)
                  for wanted in (weight_grad, bias_grad)]
    wanted = [g if n > 0 else None for g, n in zip(grads, rows)]
    _native.call(
        _C.embed_backward,
        grad_out.detach(), ids, wanted[0],
        options=_native.embed_backward_options(
            op, scale=scale, vocab_start=vocab_start, vocab_shard=False, padding_idx=padding_idx,
            mode="deterministic", norm=_C.Normalization(norm), norm_eps=norm_eps,
            norm_unit_offset=norm_unit_offset),
        grad_position_table=wanted[1], position_ids=position_ids if position_rows > 0 else None,
        position_offsets=position_offsets if position_rows > 0 else None,
        grad_type_table=wanted[2], type_ids=type_ids if type_rows > 0 else None,
        pre_norm=pre_norm.detach(), norm_weight=_detach(norm_weight),
        grad_pre_norm=_detach(grad_pre_norm),
        grad_norm_weight=norm_grads[0] if weight_grad else None,
        grad_norm_bias=norm_grads[1] if bias_grad else None,
        deferred=_deferred(op, grad_out), stream=_stream(grad_out))
    return grads + norm_grads


def _embed_norm_backward(ctx, grad_out, grad_pre):
    """The library's embed_backward with the norm (torch's LayerNorm backward, from the saved
    pre-norm row as torch saves its input), for the tables and the norm's weight and bias."""
    ids, position_ids, position_offsets, type_ids, pre, weight = ctx.saved_tensors
    norm, eps, unit_offset = ctx.norm
    if grad_out is None:
        grad_out = torch.zeros_like(pre)
    scale, vocab_start, _, padding_idx = ctx.options
    bias_grad = ctx.bias is not None and ctx.bias[0]
    grads = _embed_norm_backward_op(
        _unit_last_stride(grad_out), _unit_last_stride(grad_pre),
        ids, position_ids, position_offsets, type_ids, pre, weight, *ctx.rows, ctx.dtype, scale,
        vocab_start, padding_idx, norm, eps, unit_offset, ctx.weight_grad, bias_grad)
    wanted = [g if rows > 0 else None for g, rows in zip(grads, ctx.rows)]
    d_weight = grads[3].to(weight.dtype) if ctx.weight_grad else None
    d_bias = grads[4].to(ctx.bias[1]) if bias_grad else None
    return (wanted[0], None, wanted[1], None, None, wanted[2], None, d_weight, d_bias, None,
            None, None, None, None, None, None, None, None)


_register_autograd("embed_norm", _embed_norm_backward, _embed_norm_setup_context)


def _padding_row(op: str, padding_idx: Optional[int], rows: int, vocab_start: int,
                 vocab_shard: bool) -> Optional[int]:
    """padding_idx in the ids' numbering. A negative one counts back from the table's end, as
    torch.nn.Embedding's does, where the ids number the table's rows (no vocab_start or
    vocab_shard). Without table rows (no table gradient) it has nothing to keep: None."""
    if padding_idx is None or rows == 0:
        return None
    if int(padding_idx) >= 0:
        return int(padding_idx)
    padding_idx = int(padding_idx)
    if vocab_start or vocab_shard:
        raise _C.InvalidArgumentError(
            f"{op}: padding_idx {padding_idx} is negative; with vocab_start or vocab_shard give "
            "the id itself (in the ids' numbering)")
    if padding_idx < -rows:
        raise _C.InvalidArgumentError(
            f"{op}: padding_idx {padding_idx} is below -{rows}, minus the table's rows (a "
            "negative padding_idx counts back from the end, as in torch.nn.Embedding)")
    return padding_idx + rows


def embed(table: Union[Tensor, QuantizedTable], ids: Tensor, *, scale: float = 1.0,
          vocab_start: int = 0, vocab_shard: bool = False, positions: Optional[str] = None,
          position_table: Optional[Tensor] = None, sinusoid_base: float = 10000.0,
          sinusoid_layout: str = "interleaved", position_ids: Optional[Tensor] = None,
          position_offsets: Optional[Tensor] = None, type_table: Optional[Tensor] = None,
          type_ids: Optional[Tensor] = None, padding_idx: Optional[int] = None,
          norm: Optional[str] = None, norm_weight: Optional[Tensor] = None,
          norm_bias: Optional[Tensor] = None, norm_eps: float = 1e-5,
          norm_unit_offset: bool = False, return_pre_norm: bool = False):
    """Token-embedding lookup with positions, types and an optional norm:
    :func:`embrope.embed` as a differentiable operator (gradients for `table`,
    `position_table`, `type_table`, `norm_weight` and `norm_bias` when they require grad;
    `padding_idx` rows give `table` no gradient, as in ``torch.nn.Embedding``, where a
    negative one counts back from the table's end). Returns a new
    tensor ``[*ids.shape, D]``, or ``(out, pre_norm)`` with `return_pre_norm` (the summed row
    before the norm, in the table's dtype; differentiable too). The norm's backward runs in
    float32 from the pre-norm row rounded to the table's dtype, as torch's LayerNorm does
    from its saved input.

    `table` may be a :class:`embrope.QuantizedTable` over torch tensors: a forward only, as
    :func:`embrope.embed` computes it (out in the table's default dtype), since there is no
    backward for quantized tables; a `position_table`, `type_table`, `norm_weight` or
    `norm_bias` that requires grad is refused (it would get none) while grad mode is on."""
    if isinstance(scale, Tensor) and scale.requires_grad and torch.is_grad_enabled():
        raise _C.InvalidArgumentError(
            "embed: scale is a tensor that requires grad; embed takes it as a number and gives "
            "it no gradient (multiply the output by it instead)")
    if isinstance(table, QuantizedTable):
        if torch.is_grad_enabled():
            for name, x in (("position_table", position_table), ("type_table", type_table),
                            ("norm_weight", norm_weight), ("norm_bias", norm_bias)):
                if x is not None and x.requires_grad:
                    raise _C.InvalidArgumentError(
                        f"embed: {name} requires grad, and embed of a QuantizedTable has no "
                        f"backward (it would get no gradient); pass {name}.detach(), or call "
                        f"it under torch.no_grad()")
        # padding_idx only keeps gradients from the table's row: nothing to do without one.
        return _embed_arrays(
            table, ids, scale=scale, vocab_start=vocab_start, vocab_shard=vocab_shard,
            positions=positions, position_table=position_table, sinusoid_base=sinusoid_base,
            sinusoid_layout=sinusoid_layout, position_ids=position_ids,
            position_offsets=position_offsets, type_table=type_table, type_ids=type_ids,
            norm=norm, norm_weight=norm_weight, norm_bias=norm_bias, norm_eps=norm_eps,
            norm_unit_offset=norm_unit_offset, return_pre_norm=return_pre_norm)
    settings = _native.embed_settings(
        "embed", scale=scale, vocab_start=vocab_start, vocab_shard=vocab_shard,
        positions=positions, position_table=position_table, sinusoid_base=sinusoid_base,
        sinusoid_layout=sinusoid_layout, norm=norm, norm_eps=norm_eps,
        norm_unit_offset=norm_unit_offset)
    padding_idx = _padding_row("embed", padding_idx, table.shape[0], vocab_start, vocab_shard)
    if settings.norm != _C.Normalization.none.value:
        if vocab_shard:
            raise _C.InvalidArgumentError(
                "embed: norm cannot be combined with vocab_shard: a shard's rows are partial "
                "sums; normalise after the sum over shards")
        out, pre = torch.ops.embrope.embed_norm(
            table, ids, position_table, position_ids, position_offsets, type_table, type_ids,
            norm_weight, norm_bias, settings.scale, settings.vocab_start, settings.positions,
            settings.sinusoid_base, settings.sinusoid_layout, settings.norm,
            settings.norm_eps, settings.norm_unit_offset, padding_idx)
        return (out, pre) if return_pre_norm else out
    if return_pre_norm:
        raise _C.InvalidArgumentError("embed: return_pre_norm needs a norm")
    if norm_weight is not None or norm_bias is not None or norm_unit_offset:
        raise _C.InvalidArgumentError(
            "embed: norm_weight, norm_bias or norm_unit_offset is given but norm is none; pass "
            "norm='layer_norm' or norm='rms_norm'")
    return torch.ops.embrope.embed(
        table, ids, position_table, position_ids, position_offsets, type_table, type_ids,
        settings.scale, settings.vocab_start, settings.vocab_shard, settings.positions,
        settings.sinusoid_base, settings.sinusoid_layout, padding_idx)


def embed_backward(grad_out: Tensor, ids: Tensor, *, table_rows: int = 0,
                   position_rows: int = 0, type_rows: int = 0,
                   dtype: Optional[torch.dtype] = None, scale: float = 1.0,
                   vocab_start: int = 0, vocab_shard: bool = False,
                   position_ids: Optional[Tensor] = None,
                   position_offsets: Optional[Tensor] = None, type_ids: Optional[Tensor] = None,
                   padding_idx: Optional[int] = None) -> List[Optional[Tensor]]:
    """New gradients of :func:`embed`'s tables, deterministic: ``[grad_table,
    grad_position_table, grad_type_table]``, each ``[rows, D]`` (None where its rows are 0).
    `dtype` defaults to grad_out's."""
    op = "embed_backward"
    rows = (int(table_rows), int(position_rows), int(type_rows))
    if rows == (0, 0, 0):
        raise _C.InvalidArgumentError(
            f"{op}: table_rows, position_rows and type_rows are all 0; give the rows of each "
            "table that needs a gradient")
    for name, given, rows_name, wanted in (
            ("position_ids", position_ids, "position_rows", rows[1]),
            ("position_offsets", position_offsets, "position_rows", rows[1]),
            ("type_ids", type_ids, "type_rows", rows[2])):
        if given is not None and wanted == 0:
            raise _C.InvalidArgumentError(
                f"{op}: {name} is given but {rows_name} is 0; give the rows of the table whose "
                "gradient it indexes")
    grads = torch.ops.embrope.embed_backward(
        grad_out, ids, position_ids, position_offsets, type_ids, *rows,
        grad_out.dtype if dtype is None else dtype, float(scale), int(vocab_start),
        bool(vocab_shard), _padding_row(op, padding_idx, rows[0], vocab_start, vocab_shard))
    return [g if n > 0 else None for g, n in zip(grads, rows)]


# --------------------------------------------------------------- packed_positions ----

def _packed_positions_fake(cu_seqlens, start_offsets, num_tokens):
    return cu_seqlens.new_empty(num_tokens)


@_operator("packed_positions", _packed_positions_fake)
def _packed_positions_op(cu_seqlens: Tensor, start_offsets: Optional[Tensor],
                         num_tokens: int) -> Tensor:
    positions = _empty("packed_positions", (num_tokens,), cu_seqlens.dtype, cu_seqlens.device)
    _native.call(_C.packed_positions, cu_seqlens, positions, start_offsets=start_offsets,
                 deferred=_deferred("packed_positions", cu_seqlens), stream=_stream(cu_seqlens))
    return positions


def packed_positions(cu_seqlens: Tensor, num_tokens: int,
                     start_offsets: Optional[Tensor] = None) -> Tensor:
    """RoPE positions ``[num_tokens]`` of a packed batch (:func:`embrope.packed_positions`);
    `num_tokens` is ``cu_seqlens[-1]``, given so that no host read is needed."""
    return torch.ops.embrope.packed_positions(cu_seqlens, start_offsets, int(num_tokens))
