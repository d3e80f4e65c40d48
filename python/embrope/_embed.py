"""embed and embed_backward."""

from __future__ import annotations

from typing import Any, Optional

from . import _arrays, _native, _status
from . import _embrope as _C
from ._quant import QuantizedTable


def embed(table: Any, ids: Any, *, out: Any = None, scale: float = 1.0, vocab_start: int = 0,
          vocab_shard: bool = False, positions: Optional[str] = None,
          position_table: Any = None, sinusoid_base: float = 10000.0,
          sinusoid_layout: str = "interleaved", position_ids: Any = None,
          position_offsets: Any = None, type_table: Any = None, type_ids: Any = None,
          norm: Optional[str] = None, norm_weight: Any = None, norm_bias: Any = None,
          norm_eps: float = 1e-5, norm_unit_offset: bool = False, pre_norm_out: Any = None,
          return_pre_norm: bool = False, deferred: Any = None, stream: Any = None) -> Any:
    """Token-embedding lookup, with absolute positions, token types and a norm, in one pass.

    ``x[n] = scale * table[ids[n] - vocab_start] + P(pos_n) + type_table[type_ids[n]]``,
    then optionally normalised (``out = LayerNorm(x)`` or ``RMSNorm(x)``), in float32 with
    one rounding to the table's dtype.

    Parameters
    ----------
    table : array [V, D] or QuantizedTable
        float32, float16 or bfloat16; or a quantized table (:class:`QuantizedTable`: int8,
        int4, float8 or GGUF blocks), dequantized in the same pass. With a quantized table
        `out` chooses the value dtype (allocated: :meth:`QuantizedTable.default_dtype`), and
        the position and type tables, weight, bias and pre-norm output are in it (or float32
        where the float table's embed allows float32).
    ids : array of int32 / int64, any shape and strides
    out : array [*ids.shape, D], optional
        Written in place; absent, allocated in the table's framework and on its device.
    scale : float, default 1.0
        Multiplies the token row (sqrt(D) for Gemma and T5-style models).
    vocab_start : int, default 0
        The table holds ids ``[vocab_start, vocab_start + V)`` of a larger vocabulary.
    vocab_shard : bool, default False
        Vocab-parallel shard: ids outside the shard give zero token rows (positions and
        types still added), so that a sum over shards gives the full lookup. Without it such
        an id is an error.
    positions : {None, "learned", "sinusoidal"}
        Absolute positions added to each row. None: "learned" when `position_table` is
        given, else none.
    position_table : array [max_positions, D], optional
        Learned positions, in the table's dtype.
    sinusoid_base, sinusoid_layout : float, {"interleaved", "split"}
        Sinusoidal positions (Vaswani et al. 2017): sin/cos interleaved as in the paper, or
        split halves with the paper's frequencies (Marian; fairseq and tensor2tensor space
        their frequencies differently, see docs/ops.md). The base is finite and at least 1;
        positions lie in [0, 2**32).
    position_ids : array shaped like ids, optional
        Explicit positions. Absent: ``offset_b + s`` for ids [B, S] (or [S]), with
    position_offsets : array [B], optional
        per-sequence first positions (default 0).
    type_table : array [num_types, D], optional
    type_ids : array shaped like ids, optional
        Token types (segments), as in BERT.
    norm : {None, "layer_norm", "rms_norm"}
        ``(x - mean) / sqrt(var + eps) * norm_weight + norm_bias`` (BERT's embedding
        LayerNorm; var biased), or ``x / sqrt(mean(x^2) + eps) * norm_weight``. The sums run
        in a fixed order, the same on the CPU and the GPU.
    norm_weight, norm_bias : arrays [D], optional
        float32 or the table's dtype; absent, 1 and 0. A bias is for layer_norm only.
    norm_eps : float, default 1e-5
        Finite and >= 0 (BERT uses 1e-12).
    norm_unit_offset : bool, default False
        The weight applied is ``1 + norm_weight``, as Gemma stores it.
    pre_norm_out : array [*ids.shape, D], optional
        Also written: x before the norm (the residual stream), in the table's dtype or
        float32.
    return_pre_norm : bool, default False
        Return ``(out, pre_norm_out)``, allocating pre_norm_out in the table's dtype when it
        is not given.
    deferred : DeferredStatus, optional
        Report bad ids and positions there instead of raising.
    stream : CUDA stream, optional
        Default: the current stream of the table's framework.

    Returns
    -------
    out, or (out, pre_norm_out) with `return_pre_norm`

    Raises
    ------
    InvalidArgumentError (ValueError), BadIndexError (IndexError)
        As for every op: a broken rule before anything is written; an id, position or type
        id outside its table after the other rows are written (its row zero-filled).
    """
    op = "embed"
    quantized = isinstance(table, QuantizedTable)
    if quantized:  # a scale that requires grad would silently get none
        for name in ("scales", "zero_points"):
            _check_quantized_constant(op, f"table.{name}", getattr(table, name))
    else:
        _arrays.check_array(op, "table", table)
    _arrays.check_array(op, "ids", ids)
    for name, value in (("position_table", position_table), ("position_ids", position_ids),
                        ("position_offsets", position_offsets), ("type_table", type_table),
                        ("type_ids", type_ids), ("norm_weight", norm_weight),
                        ("norm_bias", norm_bias)):
        _arrays.check_optional(op, name, value)
    if return_pre_norm and norm is None:
        raise _C.InvalidArgumentError(f"{op}: return_pre_norm needs a norm")
    options = _native.embed_options(
        op, scale=scale, vocab_start=vocab_start, vocab_shard=vocab_shard, positions=positions,
        position_table=position_table, sinusoid_base=sinusoid_base,
        sinusoid_layout=sinusoid_layout, norm=norm, norm_eps=norm_eps,
        norm_unit_offset=norm_unit_offset)
    # Outputs are allocated after the table (a quantized table's data), in its framework.
    like = table.data if quantized else table
    dtype = table.default_dtype() if quantized else None
    allocated = out is None
    if allocated:
        table_shape = table.shape if quantized else _arrays.shape_of(table, op, "table")
        if len(table_shape) != 2:
            raise _C.InvalidArgumentError(
                f"{op}: table has shape {list(table_shape)}; it must be [V, D]")
        out_shape = _arrays.shape_of(ids, op, "ids") + (table_shape[1],)
        out_dtype = like.dtype if dtype is None else dtype
        out = _arrays.empty_like(op, like, out_shape, out_dtype)
    _arrays.check_writable(op, "out", out)
    pre_allocated = return_pre_norm and pre_norm_out is None
    if pre_allocated:  # (an allocated bfloat16 output for JAX is a bare view: no shape of its own)
        if not allocated:
            out_shape, out_dtype = _arrays.shape_of(out), out.dtype
        pre_norm_out = _arrays.empty_like(op, like, out_shape, out_dtype)
    if pre_norm_out is not None:
        _arrays.check_writable(op, "pre_norm_out", pre_norm_out)
    arrays = dict(options=options, position_table=position_table, position_ids=position_ids,
                  position_offsets=position_offsets, type_table=type_table, type_ids=type_ids,
                  norm_weight=norm_weight, norm_bias=norm_bias, pre_norm_out=pre_norm_out,
                  deferred=_status.native(deferred), stream=_arrays.stream_handle(stream, like))
    with _arrays.writes(out, pre_norm_out):
        if quantized:
            _native.call(_C.embed_quantized, _C.QuantFormat.__members__[table.format], table.data,
                         table.dim, table.scales, table.zero_points, ids, out, **arrays)
        else:
            _native.call(_C.embed, table, ids, out, **arrays)
    if allocated:
        out = _arrays.to_framework(like, out)
    if pre_allocated:
        pre_norm_out = _arrays.to_framework(like, pre_norm_out)
    return (out, pre_norm_out) if return_pre_norm else out


def _check_quantized_constant(op: str, name: str, x: Any) -> None:
    """A quantized table's scales and zero points are constants to embed (there is no
    backward for quantized tables): refuse one that requires grad while grad mode is on, which
    would otherwise be left silently without a gradient."""
    if x is not None and _arrays.framework(x) == "torch" and x.requires_grad:
        import torch

        if torch.is_grad_enabled():
            raise _C.InvalidArgumentError(
                f"{op}: {name} requires grad, and embed has no backward for quantized tables "
                f"(their scales and zero points are constants); pass {name}.detach(), or call "
                f"it under torch.no_grad()")
    _arrays.check_optional(op, name, x, autograd=False)


# The arrays embed_backward reads and those it writes, by keyword (besides grad_out, ids and
# grad_table).
_BACKWARD_INPUTS = ("position_ids", "position_offsets", "type_ids", "pre_norm", "norm_weight",
                    "grad_pre_norm")
_BACKWARD_OUTPUTS = ("grad_position_table", "grad_type_table", "grad_norm_weight",
                     "grad_norm_bias")
_BACKWARD_SETTINGS = ("scale", "vocab_start", "vocab_shard", "padding_idx", "mode", "norm",
                      "norm_eps", "norm_unit_offset")


def _backward_call(op: str, grad_out: Any, ids: Any, grad_table: Any, workspace: Any,
                   arguments: dict) -> dict:
    """The checked keyword arguments of the native embed_backward (and its size query);
    `arguments` holds the other keywords of :func:`embed_backward`, by name."""
    _arrays.check_array(op, "grad_out", grad_out)
    _arrays.check_array(op, "ids", ids)
    for name in _BACKWARD_INPUTS:
        _arrays.check_optional(op, name, arguments[name])
    for name, value in [("grad_table", grad_table), ("workspace", workspace)] + [
            (name, arguments[name]) for name in _BACKWARD_OUTPUTS]:
        if value is not None:
            _arrays.check_writable(op, name, value)
    return dict(
        grad_out=grad_out, ids=ids, grad_table=grad_table,
        options=_native.embed_backward_options(
            op, **{name: arguments[name] for name in _BACKWARD_SETTINGS}),
        **{name: arguments[name] for name in _BACKWARD_INPUTS + _BACKWARD_OUTPUTS})


def embed_backward(grad_out: Any, ids: Any, grad_table: Any = None, *, scale: float = 1.0,
                   vocab_start: int = 0, vocab_shard: bool = False,
                   padding_idx: Optional[int] = None, grad_position_table: Any = None,
                   position_ids: Any = None, position_offsets: Any = None,
                   grad_type_table: Any = None, type_ids: Any = None,
                   norm: Optional[str] = None, pre_norm: Any = None, norm_weight: Any = None,
                   norm_eps: float = 1e-5, norm_unit_offset: bool = False,
                   grad_pre_norm: Any = None, grad_norm_weight: Any = None,
                   grad_norm_bias: Any = None, mode: str = "deterministic",
                   workspace: Any = None, deferred: Any = None,
                   stream: Any = None) -> tuple[Any, Any, Any]:
    """The gradients of :func:`embed` with respect to its tables, accumulated (``+=``), and
    of its norm's weight and bias.

    For every row n: ``grad_table[ids[n] - vocab_start] += scale * dx[n]`` (not for
    `padding_idx` or, with `vocab_shard`, ids another shard owns),
    ``grad_position_table[pos_n] += dx[n]`` and ``grad_type_table[type_ids[n]] += dx[n]``,
    where dx is grad_out, or with a `norm` the norm's backward of grad_out at `pre_norm`
    plus `grad_pre_norm`, in float32 (as torch's ``layer_norm`` backward computes it from its
    saved input). Sums are formed in float32 in a fixed order (the same on CPU and GPU in
    "deterministic" mode); the existing value is added last and the result rounded once.

    Parameters
    ----------
    grad_out : array [*ids.shape, D]
        The gradient of embed's output (float32, float16 or bfloat16).
    ids : array of int32 / int64
    grad_table, grad_position_table, grad_type_table : arrays, optional
        ``[rows, D]`` in float32 or grad_out's dtype (any of the three with a norm),
        accumulated in place; at least one of them or of the norm's gradients.
    scale, vocab_start, vocab_shard, position_ids, position_offsets, type_ids
        Those of the forward call.
    padding_idx : int, optional
        Rows with this id give no gradient to grad_table (torch.nn.Embedding's padding_idx).
    norm : {None, "layer_norm", "rms_norm"}
        The forward's norm, differentiated first (not with `vocab_shard`).
    pre_norm : array [*ids.shape, D]
        The forward's pre-norm row (its `pre_norm_out`), float32 or grad_out's dtype; needed
        with a norm. Mean and rstd are recomputed from it in the forward's order.
    norm_weight, norm_eps, norm_unit_offset
        Those of the forward call (the bias does not enter the gradient).
    grad_pre_norm : array [*ids.shape, D], optional
        The gradient of the forward's pre-norm output, added to the norm's; absent: zero.
    grad_norm_weight, grad_norm_bias : arrays [D] of float32, optional
        Overwritten (not accumulated) with the sums over rows of ``grad_out * xhat`` and of
        ``grad_out`` (bias: layer_norm only), in a fixed order, the same on CPU and GPU.
    mode : {"deterministic", "atomic"}
        GPU summation: sorted and bitwise reproducible, or float32 atomics (faster, rounding
        varies from run to run). The CPU is always deterministic.
    workspace : array, optional
        GPU scratch of at least :func:`embed_backward_workspace_size` bytes.

    Returns
    -------
    (grad_table, grad_position_table, grad_type_table)
        The arrays given (None where absent); the norm's gradients are written into the
        arrays given.
    """
    op = "embed_backward"
    call = _backward_call(op, grad_out, ids, grad_table, workspace, locals())
    with _arrays.writes(grad_table, grad_position_table, grad_type_table, grad_norm_weight,
                        grad_norm_bias, workspace):
        _native.call(_C.embed_backward, **call, workspace=workspace,
                     deferred=_status.native(deferred),
                     stream=_arrays.stream_handle(stream, grad_out))
    return grad_table, grad_position_table, grad_type_table


def embed_backward_workspace_size(grad_out: Any, ids: Any, grad_table: Any = None, *,
                                  scale: float = 1.0, vocab_start: int = 0,
                                  vocab_shard: bool = False, padding_idx: Optional[int] = None,
                                  grad_position_table: Any = None, position_ids: Any = None,
                                  position_offsets: Any = None, grad_type_table: Any = None,
                                  type_ids: Any = None, norm: Optional[str] = None,
                                  pre_norm: Any = None, norm_weight: Any = None,
                                  norm_eps: float = 1e-5, norm_unit_offset: bool = False,
                                  grad_pre_norm: Any = None, grad_norm_weight: Any = None,
                                  grad_norm_bias: Any = None,
                                  mode: str = "deterministic") -> int:
    """Bytes of GPU workspace the same :func:`embed_backward` call needs (0 on the CPU).
    Validates the arguments like embed_backward; reads no array data."""
    call = _backward_call("embed_backward", grad_out, ids, grad_table, None, locals())
    return _native.call(_C.embed_backward_workspace_size, **call)
