"""apply_rope, apply_rope_backward, apply_qk_norm_rope (and its backward),
apply_rope_append_kv, apply_qk_norm_rope_append_kv and packed_positions on any DLPack arrays."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from . import _arrays, _native, _status
from . import _embrope as _C


class _Outputs:
    """The outputs of a RoPE-family call: q_out and k_out allocated in the inputs' framework
    unless the call is in place or gives them, and every array it writes checked writable."""

    def __init__(self, op: str, q_name: str, k_name: str, q: Any, k: Any, inplace: bool,
                 q_out: Any, k_out: Any) -> None:
        self.q, self.k = q, k
        self.allocated_q = q_out is None and not inplace
        self.allocated_k = k is not None and k_out is None and not inplace
        if self.allocated_q:
            q_out = _arrays.empty_like(op, q, _arrays.shape_of(q, op, q_name))
        if self.allocated_k:
            k_out = _arrays.empty_like(op, k, _arrays.shape_of(k, op, k_name))
        # q and k are written in place, or read only (then a torch tensor that requires
        # grad is refused as any argument that is read: its results carry no gradient).
        if q_out is None:
            _arrays.check_writable(op, q_name, q)
        else:
            _arrays.check_writable(op, "q_out", q_out)
            _arrays.check_array(op, q_name, q)
        if k is not None:
            if k_out is None:
                _arrays.check_writable(op, k_name, k)
            else:
                _arrays.check_writable(op, "k_out", k_out)
                _arrays.check_array(op, k_name, k)
        elif k_out is not None:
            raise _C.InvalidArgumentError(f"{op}: k_out is given without {k_name}")
        self.q_out, self.k_out = q_out, k_out

    def writes(self) -> Any:
        """The context of the native call (:func:`_arrays.writes` of what it writes)."""
        return _arrays.writes(self.q if self.q_out is None else self.q_out,
                              self.k if self.k_out is None else self.k_out)

    def results(self) -> tuple[Any, Any]:
        q = self.q if self.q_out is None else self.q_out
        k = self.k if self.k_out is None or self.k is None else self.k_out
        if self.allocated_q:
            q = _arrays.to_framework(self.q, q)
        if self.allocated_k:
            k = _arrays.to_framework(self.k, k)
        return q, k


def _checked_nope(op: str, nope: Optional[dict]) -> dict:
    """The float8 outputs' non-rotary tensors given (q_nope, q_nope_out, k_nope, k_nope_out),
    checked: the inputs read, the outputs writable."""
    given = {name: array for name, array in (nope or {}).items() if array is not None}
    for name, array in given.items():
        if name.endswith("_out"):
            _arrays.check_optional(op, name, array, autograd=False)
            _arrays.check_writable(op, name, array)
        else:
            _arrays.check_array(op, name, array)
    return given


def _rope_direction(op: str, backward: bool, q: Any, k: Any, positions: Any, cache: Any,
                    inplace: bool, q_out: Any, k_out: Any, deferred: Any, stream: Any,
                    q_out_head_scales: Any = None, k_out_head_scales: Any = None,
                    nope: Optional[dict] = None, **settings: Any) -> tuple[Any, Any]:
    """apply_rope or apply_rope_backward; `settings` are :func:`_native.rope_settings`'s,
    `nope` the float8 outputs' non-rotary tensors (q_nope, q_nope_out, k_nope, k_nope_out)."""
    q_name, k_name = ("dq", "dk") if backward else ("q", "k")
    options = _native.rope_settings(op, cache, **settings).options(op)
    _arrays.check_array(op, q_name, q, autograd=False)  # written or read: _Outputs checks
    _arrays.check_optional(op, k_name, k, autograd=False)
    _arrays.check_array(op, "positions", positions)
    _arrays.check_optional(op, "q_out_head_scales", q_out_head_scales)
    _arrays.check_optional(op, "k_out_head_scales", k_out_head_scales)
    nope = _checked_nope(op, nope)
    table = _native.rope_table(op, cache)
    out = _Outputs(op, q_name, k_name, q, k, inplace, q_out, k_out)
    native = _C.apply_rope_backward if backward else _C.apply_rope
    with out.writes(), _arrays.writes(nope.get("q_nope_out"), nope.get("k_nope_out")):
        _native.call(native, q, k, positions, **table, options=options, q_out=out.q_out,
                     k_out=out.k_out, deferred=_status.native(deferred),
                     stream=_arrays.stream_handle(stream, q),
                     q_out_head_scales=q_out_head_scales, k_out_head_scales=k_out_head_scales,
                     **nope)
    return out.results()


def apply_rope(q: Any, k: Any, positions: Any, cache: Any, *, layout: Optional[str] = None,
               inverse: bool = False, rotary_dim: int = 0,
               mrope_section: Optional[Sequence[int]] = None,
               mrope_interleaved: Optional[bool] = None,
               axes_dim: Optional[Sequence[int]] = None, inplace: bool = True,
               q_out: Any = None, k_out: Any = None, deferred: Any = None,
               stream: Any = None, q_out_scale: float = 1.0, k_out_scale: float = 1.0,
               q_out_head_scales: Any = None, k_out_head_scales: Any = None,
               q_nope: Any = None, q_nope_out: Any = None, k_nope: Any = None,
               k_nope_out: Any = None) -> tuple[Any, Any]:
    """Rotate queries and keys by their positions' angles (rotary position embedding).

    Parameters
    ----------
    q : array [T, Hq, D] or [B, S, Hq, D]
        float32, float16 or bfloat16; any strides with the last one 1 (a slice of a fused
        QKV buffer is fine).
    k : array [T, Hk, D] or [B, S, Hk, D], or None
        The same dtype as q; Hk may differ from Hq (GQA, MQA).
    positions : array [T] or [B, S] of int32 / int64
        ``[3, T]`` or ``[3, B, S]`` (temporal, height, width) with `mrope_section`;
        ``[N, T]`` or ``[N, B, S]`` (each token's coordinate on each axis) with N axes.
    cache : RopeCache, array [max_positions, R] or (cos, sin)
        The cos/sin table: a :class:`RopeCache`, a vLLM / FlashInfer style
        ``cos_sin_cache`` (cos half then sin half, used as is), or cos and sin arrays
        ``[max_positions, R / 2]`` (ONNX style).
    layout : {"neox", "interleaved"}, optional
        Pairs ``(x[i], x[i + R/2])`` (GPT-NeoX, Llama) or ``(x[2i], x[2i+1])`` (GPT-J).
        Default: the cache's layout for a RopeCache from a model, else "neox".
    inverse : bool, default False
        Rotate by -angle.
    rotary_dim : int, default 0
        0 takes R from the table; otherwise it must equal it (a guard). Elements at and past
        R are left alone (in place) or copied (out of place).
    mrope_section : 3 ints, optional
        Multimodal RoPE sections (Qwen2-VL), summing to R / 2. Default: the cache's.
    mrope_interleaved : bool, optional
        With `mrope_section`: frequency i takes height for i = 1, 4, ... below
        3 * section[1], width for i = 2, 5, ... below 3 * section[2], else temporal
        (Qwen3-VL, HF's interleaving). Default: the cache's with its sections, else False.
    axes_dim : 1 to 4 even ints, optional
        Axial RoPE (docs/ops.md): axis a owns the next ``axes_dim[a]`` rotary features and
        takes its angles from positions[a]. Default: the cache's axes (``RopeCache.axial``
        and its presets); needed with a table array built for axes.
    inplace : bool, default True
        Rotate q and k in place. False allocates new outputs in q's framework.
    q_out, k_out : arrays, optional
        Outputs shaped like q and k (out of place); they override `inplace`. q's dtype, or
        float8_e4m3fn / float8_e5m2 for both (quantized outputs, below).
    deferred : DeferredStatus, optional
        Report bad positions there instead of raising (no host synchronisation).
    stream : CUDA stream, optional
        Default: the current stream of q's framework (PyTorch, CuPy), else the legacy one.
    q_out_scale, k_out_scale : float, default 1.0
        Float8 outputs store ``float8(value * scale)``, every element (rotated or passed
        through) computed in float32 and rounded once to nearest even, saturated to the
        finite range: the scale multiplies, as FlashInfer's ``rope_quantize_fp8``
        ``quant_scale_q`` / ``quant_scale_kv`` do. Only float8 outputs take a scale.
    q_out_head_scales, k_out_head_scales : float32 array [Hq] / [Hk], optional
        Per-head scales of float8 outputs, multiplied with the scale above.
    q_nope, q_nope_out, k_nope, k_nope_out : arrays, optional
        With float8 outputs: the non-rotary parts of q and k held apart (FlashInfer's
        ``rope_quantize_fp8`` / ``mla_rope_quantize_fp8``: DeepSeek MLA's ``q_nope`` and
        ``kv_c`` as one kv head), quantized in the same pass with q's (k's) scales into the
        given float8 arrays. ``q_nope [T, Hq, Dn]``: q's dtype, token dims and heads, its own
        last dim; ``q_nope_out`` its shape in the float8 dtype. k's alike (needs k).

    Returns
    -------
    (q, k)
        The rotated arrays: the inputs themselves in place, else the outputs (k is None
        when no k was given).

    Raises
    ------
    InvalidArgumentError (ValueError)
        A shape, stride, dtype, device or option breaks a rule; nothing was written.
    BadIndexError (IndexError)
        A position outside the table: its token's rows are zero-filled, every other row is
        written, and the message names the first offending one.
    """
    return _rope_direction("apply_rope", False, q, k, positions, cache, inplace, q_out, k_out,
                           deferred, stream, q_out_head_scales, k_out_head_scales,
                           layout=layout, inverse=inverse, rotary_dim=rotary_dim,
                           mrope_section=mrope_section, mrope_interleaved=mrope_interleaved,
                           axes_dim=axes_dim, q_out_scale=q_out_scale, k_out_scale=k_out_scale,
                           nope=dict(q_nope=q_nope, q_nope_out=q_nope_out, k_nope=k_nope,
                                     k_nope_out=k_nope_out))


def apply_rope_backward(dq: Any, dk: Any, positions: Any, cache: Any, *,
                        layout: Optional[str] = None, inverse: bool = False,
                        rotary_dim: int = 0, mrope_section: Optional[Sequence[int]] = None,
                        mrope_interleaved: Optional[bool] = None,
                        axes_dim: Optional[Sequence[int]] = None, inplace: bool = True,
                        q_out: Any = None, k_out: Any = None, deferred: Any = None,
                        stream: Any = None) -> tuple[Any, Any]:
    """The gradient of :func:`apply_rope`: ``dx = m R(-angle) dy``.

    `dq` and `dk` are the gradients of apply_rope's outputs; `positions`, `cache` and the
    options are those of the forward call (`inverse` names the forward's direction). Returns
    the gradients with respect to q and k, in place by default, like :func:`apply_rope`.
    """
    return _rope_direction("apply_rope_backward", True, dq, dk, positions, cache, inplace, q_out, k_out,
                           deferred, stream, layout=layout, inverse=inverse,
                           rotary_dim=rotary_dim, mrope_section=mrope_section,
                           mrope_interleaved=mrope_interleaved, axes_dim=axes_dim)


def _qk_arguments(op: str, like: Any, cache: Any, q_weight: Any, k_weight: Any, eps: float,
                  unit_offset: bool, deferred: Any, stream: Any, **settings: Any) -> dict:
    """The keyword arguments the qk-norm ops' native calls share (weights checked);
    `settings` are :func:`_native.rope_settings`'s."""
    _arrays.check_optional(op, "q_weight", q_weight)
    _arrays.check_optional(op, "k_weight", k_weight)
    return dict(
        norm=_arrays.settings(op, _C.QkNorm, eps=_arrays.real(op, "eps", eps),
                              unit_offset=bool(unit_offset)),
        q_weight=q_weight, k_weight=k_weight, **_native.rope_table(op, cache),
        options=_native.rope_settings(op, cache, **settings).options(op),
        deferred=_status.native(deferred), stream=_arrays.stream_handle(stream, like))


def apply_qk_norm_rope(q: Any, k: Any, positions: Any, cache: Any, *, q_weight: Any = None,
                       k_weight: Any = None, eps: float = 1e-6, unit_offset: bool = False,
                       layout: Optional[str] = None, inverse: bool = False, rotary_dim: int = 0,
                       mrope_section: Optional[Sequence[int]] = None,
                       mrope_interleaved: Optional[bool] = None, inplace: bool = True,
                       q_out: Any = None, k_out: Any = None, deferred: Any = None,
                       stream: Any = None) -> tuple[Any, Any]:
    """RMSNorm of every head of q and k, then rotary position embedding, in one pass.

    Each (token, head) row x of length D becomes ``x / sqrt(mean(x**2) + eps) * w`` in float32
    (Qwen3's ``q_norm`` / ``k_norm``; Gemma 3's with ``unit_offset``: ``* (1 + w)``), and is then
    rotated as :func:`apply_rope` rotates, rounded once. The norm covers all of D; elements at
    and past the rotary dim are normalised, not rotated.

    Parameters
    ----------
    q, k, positions, cache
        As in :func:`apply_rope`.
    q_weight, k_weight : array [D], optional
        The norms' weights, float32 or q's dtype. None: 1. `k_weight` needs `k`.
    eps : float, default 1e-6
        Finite and >= 0. With 0, an all-zero row gives NaN, as in PyTorch.
    unit_offset : bool, default False
        Apply ``1 + w`` (Gemma's RMSNorm); needs the weights.
    layout, inverse, rotary_dim, mrope_section, mrope_interleaved, inplace, q_out, k_out, deferred, stream
        As in :func:`apply_rope`.

    Returns
    -------
    (q, k)
        The normalised and rotated arrays (k is None when no k was given).

    Raises
    ------
    InvalidArgumentError (ValueError)
        A shape, dtype, device or option breaks a rule; nothing was written.
    BadIndexError (IndexError)
        A position outside the table: its token's rows are zero-filled.
    """
    op = "apply_qk_norm_rope"
    _arrays.check_array(op, "q", q, autograd=False)  # written or read: _Outputs checks
    _arrays.check_optional(op, "k", k, autograd=False)
    _arrays.check_array(op, "positions", positions)
    call = _qk_arguments(op, q, cache, q_weight, k_weight, eps, unit_offset, deferred, stream,
                         layout=layout, inverse=inverse, rotary_dim=rotary_dim,
                         mrope_section=mrope_section, mrope_interleaved=mrope_interleaved)
    out = _Outputs(op, "q", "k", q, k, inplace, q_out, k_out)
    with out.writes():
        _native.call(_C.apply_qk_norm_rope, q, k, positions, **call, q_out=out.q_out,
                     k_out=out.k_out)
    return out.results()


def apply_qk_norm_rope_backward(dq: Any, dk: Any, q: Any, k: Any, positions: Any, cache: Any, *,
                                q_weight: Any = None, k_weight: Any = None, eps: float = 1e-6,
                                unit_offset: bool = False, layout: Optional[str] = None,
                                inverse: bool = False, rotary_dim: int = 0,
                                mrope_section: Optional[Sequence[int]] = None,
                                mrope_interleaved: Optional[bool] = None, inplace: bool = True,
                                q_out: Any = None, k_out: Any = None,
                                q_weight_grad: Any = None, k_weight_grad: Any = None,
                                deferred: Any = None, stream: Any = None) -> tuple[Any, Any]:
    """The gradient of :func:`apply_qk_norm_rope`.

    `dq` and `dk` are the gradients of its outputs, `q` and `k` its inputs (the norm's
    statistics are recomputed from them); the other arguments are the forward call's. The
    input gradients overwrite dq and dk (or go to `q_out` / `k_out`, or new arrays with
    ``inplace=False``).

    q_weight_grad, k_weight_grad : array [D] float32, optional
        Receive dL/dw, summed over every row in a fixed order that the CPU and the GPU share
        (the same bits run to run and backend to backend). They need `q_weight` / `k_weight`.

    Returns
    -------
    (dq, dk)
        The gradients with respect to q and k (dk is None without k).
    """
    op = "apply_qk_norm_rope_backward"
    _arrays.check_array(op, "dq", dq, autograd=False)  # written or read: _Outputs checks
    _arrays.check_optional(op, "dk", dk, autograd=False)
    _arrays.check_array(op, "q", q)
    _arrays.check_optional(op, "k", k)
    _arrays.check_array(op, "positions", positions)
    for name, g in (("q_weight_grad", q_weight_grad), ("k_weight_grad", k_weight_grad)):
        if g is not None:
            _arrays.check_writable(op, name, g)
    call = _qk_arguments(op, dq, cache, q_weight, k_weight, eps, unit_offset, deferred, stream,
                         layout=layout, inverse=inverse, rotary_dim=rotary_dim,
                         mrope_section=mrope_section, mrope_interleaved=mrope_interleaved)
    out = _Outputs(op, "dq", "dk", dq, dk, inplace, q_out, k_out)
    with out.writes(), _arrays.writes(q_weight_grad, k_weight_grad):
        _native.call(_C.apply_qk_norm_rope_backward, dq, dk, q, k, positions,
                     q_weight_grad=q_weight_grad, k_weight_grad=k_weight_grad, **call,
                     q_out=out.q_out, k_out=out.k_out)
    return out.results()


def apply_rope_append_kv(q: Any, k: Any, v: Any, positions: Any, cache: Any, *,
                         k_cache: Any = None, v_cache: Any = None, kv_cache: Any = None,
                         slot_mapping: Any = None, cache_offsets: Any = None,
                         cu_seqlens: Any = None, kv_layout: str = "nhd",
                         k_scale: float = 1.0, v_scale: float = 1.0,
                         layout: Optional[str] = None, rotary_dim: int = 0,
                         mrope_section: Optional[Sequence[int]] = None,
                         mrope_interleaved: Optional[bool] = None, q_out: Any = None,
                         k_out: Any = None, deferred: Any = None, stream: Any = None,
                         q_out_scale: float = 1.0, q_out_head_scales: Any = None,
                         q_nope: Any = None, q_nope_out: Any = None) -> tuple[Any, Any]:
    """Rotate q and k (RoPE) and write rotated k and v into a KV cache, in one pass.

    What serving engines do before attention (vLLM ``rotary_emb`` + ``reshape_and_cache``,
    FlashInfer ``apply_rope_with_cos_sin_cache`` + ``append_paged_kv_cache``), fused: the
    cache receives the bytes :func:`apply_rope` followed by a copy would give.

    Parameters
    ----------
    q, k : arrays [T, Hq, D] / [T, Hk, D] or [B, S, ...]
        As in :func:`apply_rope`. q is rotated in place unless `q_out` is given; k is only
        read unless `k_out` is given (it may be k itself).
    v : array [T, Hk, Dv] or [B, S, Hk, Dv]
        q's dtype; Dv may differ from D.
    positions, cache, layout, rotary_dim, mrope_section, mrope_interleaved, deferred, stream
        As in :func:`apply_rope`.
    k_cache, v_cache : arrays
        Paged ``[pages, page_size, Hk, D]`` (``kv_layout="nhd"``, vLLM / FlashInfer) or
        ``[pages, Hk, page_size, D]`` (``"hnd"``, TensorRT-LLM), or a contiguous
        ``[B, max_len, Hk, D]`` cache. float32 / float16 / bfloat16 (any, from any
        activations) or float8_e4m3fn / float8_e5m2.
    kv_cache : array, optional
        Instead of k_cache and v_cache: one ``[pages, 2, ...]`` tensor (k at 0, v at 1).
    slot_mapping : array [T] or [B, S] of int32 / int64
        Paged caches: ``slot = page * page_size + offset``; -1 skips the token.
    cache_offsets : array [B] of int32 / int64
        Contiguous caches, instead of slot_mapping: token s of sequence b goes to row
        ``cache_offsets[b] + s``; with packed [T, H, D] inputs give `cu_seqlens` [B + 1].
    k_scale, v_scale : float
        float8 caches store ``value / scale`` (round to nearest even, saturated to the finite
        range, NaN kept). Must be 1 for other cache dtypes.
    q_out, k_out : arrays, optional
        q_out: q's dtype, or float8_e4m3fn / float8_e5m2 (q rotated and quantized in the same
        pass, FlashInfer's ``rope_quantize_fp8_append_paged_kv_cache``). k_out: k's dtype (a
        float8 k is the cache's, by `k_scale`).
    q_out_scale, q_out_head_scales
        A float8 q_out's scales, as in :func:`apply_rope` (``float8(value * scale)``).
    q_nope, q_nope_out : arrays, optional
        With a float8 q_out: q's non-rotary part held apart, quantized with q's scales, as in
        :func:`apply_rope` (DeepSeek MLA's ``q_nope``).

    Returns
    -------
    (q, k)
        The rotated q (q itself, or q_out) and k_out (None when not given).

    Raises
    ------
    InvalidArgumentError (ValueError)
        A shape, stride, dtype, device or option breaks a rule; nothing was written.
    BadIndexError (IndexError)
        A slot outside the cache (or a write position outside [0, max_len)), or a position
        outside the table: that token's cache rows are not written (a bad position also
        zero-fills its q rows), every other token is, and the first bad token is named.
    """
    return _append_kv("apply_rope_append_kv", None, q, k, v, positions, cache, k_cache=k_cache,
                      v_cache=v_cache, kv_cache=kv_cache, slot_mapping=slot_mapping,
                      cache_offsets=cache_offsets, cu_seqlens=cu_seqlens, kv_layout=kv_layout,
                      k_scale=k_scale, v_scale=v_scale, layout=layout, rotary_dim=rotary_dim,
                      mrope_section=mrope_section, mrope_interleaved=mrope_interleaved,
                      q_out=q_out, k_out=k_out, deferred=deferred, stream=stream,
                      q_out_scale=q_out_scale, q_out_head_scales=q_out_head_scales,
                      nope=dict(q_nope=q_nope, q_nope_out=q_nope_out))


def apply_qk_norm_rope_append_kv(q: Any, k: Any, v: Any, positions: Any, cache: Any, *,
                                 q_weight: Any = None, k_weight: Any = None, eps: float = 1e-6,
                                 unit_offset: bool = False, k_cache: Any = None,
                                 v_cache: Any = None, kv_cache: Any = None,
                                 slot_mapping: Any = None, cache_offsets: Any = None,
                                 cu_seqlens: Any = None, kv_layout: str = "nhd",
                                 k_scale: float = 1.0, v_scale: float = 1.0,
                                 layout: Optional[str] = None, rotary_dim: int = 0,
                                 mrope_section: Optional[Sequence[int]] = None,
                                 mrope_interleaved: Optional[bool] = None, q_out: Any = None,
                                 k_out: Any = None, deferred: Any = None, stream: Any = None,
                                 q_out_scale: float = 1.0,
                                 q_out_head_scales: Any = None) -> tuple[Any, Any]:
    """Per-head RMSNorm of q and k, RoPE, and the write of k and v into a KV cache, in one pass.

    What a Qwen3 (or Gemma 3) layer does before attention when served: ``q_norm`` /
    ``k_norm``, the rotation, and vLLM's ``reshape_and_cache_flash`` (FlashInfer's
    ``append_paged_kv_cache``), fused. q and k are normalised and rotated exactly as
    :func:`apply_qk_norm_rope` does it; the cache receives the normalised, rotated k and v
    exactly as :func:`apply_rope_append_kv` writes them (the bytes of
    :func:`apply_qk_norm_rope` followed by a copy). v is copied, not normalised.

    Parameters
    ----------
    q, k, v, positions, cache
        As in :func:`apply_rope_append_kv`.
    q_weight, k_weight, eps, unit_offset
        As in :func:`apply_qk_norm_rope`.
    k_cache, v_cache, kv_cache, slot_mapping, cache_offsets, cu_seqlens, kv_layout, k_scale, v_scale
        As in :func:`apply_rope_append_kv`.
    layout, rotary_dim, mrope_section, mrope_interleaved, q_out, k_out, deferred, stream
        As in :func:`apply_rope_append_kv`.
    q_out_scale, q_out_head_scales
        A float8 q_out (q normalised, rotated, then quantized, rounded once from float32):
        its scales, as in :func:`apply_rope`. The non-rotary part is not held apart here (the
        norm covers whole rows).

    Returns
    -------
    (q, k)
        The normalised, rotated q (q itself, or q_out) and k_out (None when not given).

    Raises
    ------
    InvalidArgumentError (ValueError)
        A shape, stride, dtype, device or option breaks a rule; nothing was written.
    BadIndexError (IndexError)
        As in :func:`apply_rope_append_kv`.
    """
    return _append_kv("apply_qk_norm_rope_append_kv",
                      dict(q_weight=q_weight, k_weight=k_weight, eps=eps,
                           unit_offset=unit_offset),
                      q, k, v, positions, cache, k_cache=k_cache, v_cache=v_cache,
                      kv_cache=kv_cache, slot_mapping=slot_mapping, cache_offsets=cache_offsets,
                      cu_seqlens=cu_seqlens, kv_layout=kv_layout, k_scale=k_scale,
                      v_scale=v_scale, layout=layout, rotary_dim=rotary_dim,
                      mrope_section=mrope_section, mrope_interleaved=mrope_interleaved,
                      q_out=q_out, k_out=k_out, deferred=deferred, stream=stream,
                      q_out_scale=q_out_scale, q_out_head_scales=q_out_head_scales, nope={})


def _append_kv(op: str, norm: Optional[dict], q: Any, k: Any, v: Any, positions: Any, cache: Any,
               *, k_cache: Any, v_cache: Any, kv_cache: Any, slot_mapping: Any,
               cache_offsets: Any, cu_seqlens: Any, kv_layout: str, k_scale: float,
               v_scale: float, layout: Optional[str], rotary_dim: int,
               mrope_section: Optional[Sequence[int]], mrope_interleaved: Optional[bool],
               q_out: Any, k_out: Any, deferred: Any, stream: Any, q_out_scale: float,
               q_out_head_scales: Any, nope: dict) -> tuple[Any, Any]:
    """apply_rope_append_kv, or with `norm` (the qk-norm's arguments) its qk-norm form;
    `nope` q_nope and q_nope_out (apply_rope_append_kv's)."""
    # q is written in place or read, k read or written as k_out: checked below
    _arrays.check_array(op, "q", q, autograd=False)
    _arrays.check_array(op, "k", k, autograd=False)
    for name, array in (("v", v), ("positions", positions)):
        _arrays.check_array(op, name, array)
    for name, array in (("slot_mapping", slot_mapping), ("cache_offsets", cache_offsets),
                        ("cu_seqlens", cu_seqlens)):
        _arrays.check_optional(op, name, array)
    for name, array in (("k_cache", k_cache), ("v_cache", v_cache), ("kv_cache", kv_cache),
                        ("q_out", q_out), ("k_out", k_out)):  # written: check_writable below
        _arrays.check_optional(op, name, array, autograd=False)
    _arrays.check_optional(op, "q_out_head_scales", q_out_head_scales)
    nope = _checked_nope(op, nope)
    if kv_cache is None and (k_cache is None or v_cache is None):
        raise _C.InvalidArgumentError(f"{op}: give k_cache and v_cache, or kv_cache")
    if kv_cache is not None and (k_cache is not None or v_cache is not None):
        raise _C.InvalidArgumentError(f"{op}: give kv_cache or k_cache and v_cache, not both")
    for name, array in (("k_cache", k_cache), ("v_cache", v_cache), ("kv_cache", kv_cache)):
        if array is not None:
            _arrays.check_writable(op, name, array)
    _arrays.check_writable(op, "q_out" if q_out is not None else "q", q if q_out is None else q_out)
    if q_out is not None:
        _arrays.check_array(op, "q", q)
    if k_out is not None:
        _arrays.check_writable(op, "k_out", k_out)
    if k_out is not k:
        _arrays.check_array(op, "k", k)
    if norm is None:
        native, call = _C.apply_rope_append_kv, dict(
            **_native.rope_table(op, cache),
            options=_native.rope_settings(op, cache, layout=layout, rotary_dim=rotary_dim,
                                          mrope_section=mrope_section,
                                          mrope_interleaved=mrope_interleaved,
                                          q_out_scale=q_out_scale).options(op),
            deferred=_status.native(deferred), stream=_arrays.stream_handle(stream, q), **nope)
    else:
        native, call = _C.apply_qk_norm_rope_append_kv, _qk_arguments(
            op, q, cache, norm["q_weight"], norm["k_weight"], norm["eps"], norm["unit_offset"],
            deferred, stream, layout=layout, rotary_dim=rotary_dim,
            mrope_section=mrope_section, mrope_interleaved=mrope_interleaved,
            q_out_scale=q_out_scale)
    with _arrays.writes(q if q_out is None else q_out, k_out, k_cache, v_cache, kv_cache,
                        nope.get("q_nope_out")):
        _native.call(
            native, q, k, v, positions, k_cache=k_cache, v_cache=v_cache, kv_cache=kv_cache,
            kv_layout=_arrays.enum_value(op, "kv_layout", _C.KvCacheLayout, kv_layout),
            k_scale=_arrays.real(op, "k_scale", k_scale),
            v_scale=_arrays.real(op, "v_scale", v_scale), slot_mapping=slot_mapping,
            cache_offsets=cache_offsets, cu_seqlens=cu_seqlens, **call, q_out=q_out, k_out=k_out,
            q_out_head_scales=q_out_head_scales)
    return (q if q_out is None else q_out), k_out


def packed_positions(cu_seqlens: Any, positions: Any = None, *, start_offsets: Any = None,
                     workspace: Any = None, deferred: Any = None, stream: Any = None) -> Any:
    """RoPE positions of a packed variable-length batch (FlashAttention's varlen layout).

    Sequence b holds tokens ``[cu_seqlens[b], cu_seqlens[b + 1])``; token t of it gets
    position ``start_offsets[b] + t - cu_seqlens[b]`` (``start_offsets`` absent: 0).

    Parameters
    ----------
    cu_seqlens : array [B + 1] of int32 / int64
        Non-decreasing from 0 to T.
    positions : array [T] of int32 / int64, optional
        Written in place. Absent: allocated like cu_seqlens with T = cu_seqlens[-1] (which
        reads that value on the host: a synchronisation for a GPU array).
    start_offsets : array [B], optional
        Each sequence's first position (for example its KV-cache length).
    workspace : array, optional
        GPU scratch of at least :func:`packed_positions_workspace_size` bytes on the same
        device; absent, the call allocates it stream-ordered. Ignored on the CPU.

    Returns
    -------
    positions

    Raises
    ------
    BadIndexError
        When cu_seqlens is not a valid prefix sum (the first offending entry is named).
    """
    op = "packed_positions"
    _arrays.check_array(op, "cu_seqlens", cu_seqlens)
    _arrays.check_optional(op, "start_offsets", start_offsets)
    _arrays.check_optional(op, "workspace", workspace)
    allocated = positions is None
    if allocated:
        shape = _arrays.shape_of(cu_seqlens)
        if len(shape) != 1 or shape[0] < 1:
            raise _C.InvalidArgumentError(
                f"{op}: cu_seqlens has shape {list(shape)}; it must be [B + 1]")
        total = int(cu_seqlens[-1])
        if total < 0:
            raise _C.InvalidArgumentError(f"{op}: cu_seqlens[-1] = {total} is negative")
        positions = _arrays.empty_like(op, cu_seqlens, (total,))
    _arrays.check_writable(op, "positions", positions)
    with _arrays.writes(positions):
        _native.call(_C.packed_positions, cu_seqlens, positions, start_offsets=start_offsets,
                     workspace=workspace, deferred=_status.native(deferred),
                     stream=_arrays.stream_handle(stream, cu_seqlens))
    return _arrays.to_framework(cu_seqlens, positions) if allocated else positions


def packed_positions_workspace_size(cu_seqlens: Any, positions: Any, *,
                                    start_offsets: Any = None) -> int:
    """Bytes of GPU workspace :func:`packed_positions` needs (0 on the CPU)."""
    return _native.call(_C.packed_positions_workspace_size, cu_seqlens, positions,
                        start_offsets=start_offsets)
