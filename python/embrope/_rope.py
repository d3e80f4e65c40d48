"""RopeCache, apply_rope, apply_rope_backward, apply_rope_append_kv and packed_positions."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import numpy as np

from . import _arrays, _models, _status
from . import _embrope as _C

_CONFIG_FIELDS = (
    "rotary_dim", "base", "max_positions", "scaling", "factor", "original_max_positions",
    "sequence_length", "beta_fast", "beta_slow", "truncate", "mscale", "mscale_all_dim",
    "low_freq_factor", "high_freq_factor", "short_factor", "long_factor", "attention_factor",
)


def _rope_config(op: str, **fields: Any) -> Any:
    config = _C.RopeConfig()
    for name, value in fields.items():
        if value is None:
            continue
        if name == "scaling":
            value = _arrays.enum_value(op, "scaling", _C.RopeScaling, value)
        elif name in ("short_factor", "long_factor"):
            value = [float(v) for v in value]
        setattr(config, name, value)
    return config


def _copy_config(config: Any) -> Any:
    copy = _C.RopeConfig()
    for name in _CONFIG_FIELDS:
        setattr(copy, name, getattr(config, name))
    return copy


def rope_frequencies(rotary_dim: int, base: float = 10000.0, **scaling: Any) -> tuple[np.ndarray, float]:
    """The inverse frequencies and attention factor a configuration gives, in float64.

    Takes the arguments of :class:`RopeCache` (``max_positions`` defaults to 1 here) and
    builds no table. Returns ``(inv_freq [rotary_dim / 2] float64, attention_factor)``.
    """
    scaling.setdefault("max_positions", 1)
    config = _rope_config("RopeCache", rotary_dim=rotary_dim, base=base, **scaling)
    return _C.rope_frequencies(config)


class RopeCache:
    """cos and sin of every (position, frequency) pair, built once on one device.

    ``inv_freq_i = base ** (-2 i / rotary_dim)`` for ``i < rotary_dim / 2``, modified by
    `scaling`; the angle of position p is ``p * inv_freq_i``; cos and sin are multiplied by
    the attention factor. Angles and products are computed in float64 and rounded once to
    float32. Immutable: share one cache between layers, threads and streams.

    Parameters
    ----------
    rotary_dim : int
        R, even: the leading dimensions of each head that are rotated.
    max_positions : int
        Positions ``[0, max_positions)`` are valid.
    base : float, default 10000.0
        theta.
    scaling : {"none", "linear", "dynamic", "yarn", "llama3", "longrope"}
        Context-extension variant, with HF transformers' definitions (docs/ops.md). Its
        parameters are the keyword arguments below; setting one the variant does not use is
        an error.
    factor, original_max_positions, sequence_length, beta_fast, beta_slow, truncate, mscale,
    mscale_all_dim, low_freq_factor, high_freq_factor, short_factor, long_factor,
    attention_factor
        The variant's parameters, as in HF's ``rope_scaling`` (``original_max_positions`` is
        ``original_max_position_embeddings``).
    device : str, torch.device or int, default "cpu"
        Where the table lives ("cpu", "cuda", "cuda:1").
    layout : {"neox", "interleaved"}, default "neox"
        The pairing :func:`apply_rope` uses with this cache when its own `layout` is None.
    mrope_section : sequence of 3 ints, optional
        Multimodal sections :func:`apply_rope` uses with this cache by default.
    mrope_interleaved : bool, default False
        With `mrope_section`: the streams interleaved over the frequencies (Qwen3-VL's
        ``mrope_interleaved``) rather than in contiguous sections (Qwen2-VL).

    Raises
    ------
    InvalidArgumentError
        Naming the field and the rule, for an invalid configuration.
    OutOfMemoryError
        When the table cannot be allocated.
    """

    def __init__(
        self,
        rotary_dim: int,
        max_positions: int,
        base: float = 10000.0,
        *,
        scaling: str = "none",
        factor: Optional[float] = None,
        original_max_positions: Optional[int] = None,
        sequence_length: Optional[int] = None,
        beta_fast: Optional[float] = None,
        beta_slow: Optional[float] = None,
        truncate: Optional[bool] = None,
        mscale: Optional[float] = None,
        mscale_all_dim: Optional[float] = None,
        low_freq_factor: Optional[float] = None,
        high_freq_factor: Optional[float] = None,
        short_factor: Optional[Sequence[float]] = None,
        long_factor: Optional[Sequence[float]] = None,
        attention_factor: Optional[float] = None,
        device: Any = "cpu",
        layout: str = "neox",
        mrope_section: Optional[Sequence[int]] = None,
        mrope_interleaved: bool = False,
        stream: Any = None,
    ) -> None:
        config = _rope_config(
            "RopeCache", rotary_dim=rotary_dim, max_positions=max_positions, base=base,
            scaling=scaling, factor=factor, original_max_positions=original_max_positions,
            sequence_length=sequence_length, beta_fast=beta_fast, beta_slow=beta_slow,
            truncate=truncate, mscale=mscale, mscale_all_dim=mscale_all_dim,
            low_freq_factor=low_freq_factor, high_freq_factor=high_freq_factor,
            short_factor=short_factor, long_factor=long_factor,
            attention_factor=attention_factor)
        self._init(config, device, layout, mrope_section, mrope_interleaved, stream)

    def _init(self, config: Any, device: Any, layout: Any, mrope_section: Any,
              mrope_interleaved: bool, stream: Any) -> None:
        kind, index = _arrays.parse_device(device)
        self._native = _C.RopeCache(config, kind, index, _arrays.stream_handle(stream))
        self.layout = _arrays.enum_value("RopeCache", "layout", _C.RopeLayout, layout).name
        self.mrope_section = _mrope_tuple("RopeCache", mrope_section)
        self.mrope_interleaved = bool(mrope_interleaved)
        self._torch_tables: dict = {}

    @classmethod
    def from_config(cls, config: Any, *, device: Any = "cpu", layout: str = "neox",
                    mrope_section: Optional[Sequence[int]] = None,
                    mrope_interleaved: bool = False) -> "RopeCache":
        """A cache from a :class:`RopeConfig` (for example ``model_preset(...).rope``)."""
        self = cls.__new__(cls)
        self._init(config, device, layout, mrope_section, mrope_interleaved, None)
        return self

    @classmethod
    def from_model(cls, model: Any, *, max_positions: Optional[int] = None,
                   device: Any = "cpu") -> "RopeCache":
        """The cache of a :class:`ModelConfig` (its layout and mrope sections included)."""
        if model.positions != _C.PositionKind.rope:
            raise _C.InvalidArgumentError(
                f"RopeCache: model {model.model_type!r} has {model.positions.name} positions, "
                "not rotary ones")
        config = _copy_config(model.rope)
        if max_positions is not None:
            config.max_positions = int(max_positions)
        sections = tuple(model.mrope_section)
        return cls.from_config(config, device=device, layout=model.layout,
                               mrope_section=sections if any(sections) else None,
                               mrope_interleaved=model.mrope_interleaved)

    @classmethod
    def from_preset(cls, name: str, *, max_positions: Optional[int] = None,
                    device: Any = "cpu") -> "RopeCache":
        """The cache of a built-in model preset (see :func:`model_presets`).

        `max_positions` overrides the model's max_position_embeddings (a smaller table).
        """
        return cls.from_model(_models.model_preset(name), max_positions=max_positions,
                              device=device)

    @classmethod
    def from_hf_config(cls, config: Any, *, max_positions: Optional[int] = None,
                       device: Any = "cpu") -> "RopeCache":
        """The cache of a HuggingFace model from its config.json path, dict or
        PretrainedConfig (every rope_type embrope supports; see
        :func:`model_config_from_hf`)."""
        return cls.from_model(_models.model_config_from_hf(config), max_positions=max_positions,
                              device=device)

    # ------------------------------------------------------------------ properties ----
    @property
    def config(self) -> Any:
        """The :class:`RopeConfig` it was built from."""
        return self._native.config

    @property
    def rotary_dim(self) -> int:
        return int(self._native.config.rotary_dim)

    @property
    def max_positions(self) -> int:
        return int(self._native.config.max_positions)

    @property
    def device(self) -> str:
        return _arrays.device_name(self._native.device)

    @property
    def attention_factor(self) -> float:
        """The factor folded into cos and sin (1 for the default frequencies)."""
        return float(self._native.attention_factor)

    @property
    def inv_freq(self) -> np.ndarray:
        """The R/2 inverse frequencies after scaling, float64 (a copy)."""
        return self._native.inv_freq

    @property
    def table(self) -> Any:
        """The table, [max_positions, rotary_dim] float32: the cos half, then the sin half.

        Zero-copy and read-only: a NumPy array for a CPU cache, a DLPack array on the GPU
        for a CUDA cache (``torch.from_dlpack(cache.table)``). This is the layout of vLLM's
        and FlashInfer's ``cos_sin_cache``.
        """
        table = self._native.table()
        if self._native.device[0] == 0:
            array = np.from_dlpack(table)
            array.flags.writeable = False
            return array
        return table

    cos_sin_cache = table

    @property
    def cos(self) -> Any:
        """cos(p f_i) times the attention factor, [max_positions, rotary_dim / 2] (a view)."""
        return self.table[:, : self.rotary_dim // 2]

    @property
    def sin(self) -> Any:
        """sin(p f_i) times the attention factor, [max_positions, rotary_dim / 2] (a view)."""
        return self.table[:, self.rotary_dim // 2:]

    def __repr__(self) -> str:
        c = self._native.config
        return (f"RopeCache(rotary_dim={c.rotary_dim}, max_positions={c.max_positions}, "
                f"base={c.base}, scaling={c.scaling.name!r}, device={self.device!r}, "
                f"layout={self.layout!r})")


def _mrope_tuple(op: str, sections: Optional[Sequence[int]]) -> Optional[tuple[int, int, int]]:
    if sections is None:
        return None
    sections = tuple(int(s) for s in sections)
    if len(sections) != 3:
        raise _C.InvalidArgumentError(
            f"{op}: mrope_section has {len(sections)} entries; it needs 3 (temporal, height, "
            "width)")
    return sections


def _table_args(op: str, cache: Any) -> tuple[Any, Any, Any]:
    """(native cache, cos, sin) from a RopeCache, a cos_sin_cache [P, R] array or (cos, sin)."""
    if isinstance(cache, RopeCache):
        return cache._native, None, None
    if isinstance(cache, tuple) and len(cache) == 2:
        cos, sin = cache
        _arrays.check_array(op, "cos", cos)
        _arrays.check_array(op, "sin", sin)
        return None, cos, sin
    if hasattr(cache, "__dlpack__") or isinstance(cache, np.ndarray):
        shape = _arrays.shape_of(cache)
        if len(shape) != 2 or shape[1] % 2 != 0:
            raise _C.InvalidArgumentError(
                f"{op}: cos_sin_cache has shape {list(shape)}; it must be [max_positions, "
                "rotary_dim] with rotary_dim even (the cos half, then the sin half)")
        half = shape[1] // 2
        return None, cache[:, :half], cache[:, half:]
    raise TypeError(
        f"{op}: cache must be a RopeCache, a cos_sin_cache array [max_positions, rotary_dim] "
        f"or a (cos, sin) pair, not {type(cache).__name__}")


def _rope_settings(op: str, cache: Any, layout: Any, mrope_section: Any,
                   mrope_interleaved: Optional[bool]) -> tuple[Any, tuple[int, int, int, int]]:
    """The layout and multimodal setting a call uses: its own, else its RopeCache's. The
    setting is (temporal, height, width, interleaved), all 0 without mrope."""
    if layout is None:
        layout = cache.layout if isinstance(cache, RopeCache) else "neox"
    from_cache = mrope_section is None and isinstance(cache, RopeCache)
    if from_cache:
        mrope_section = cache.mrope_section
    if mrope_interleaved is None:
        mrope_interleaved = cache.mrope_interleaved if from_cache else False
    sections = _mrope_tuple(op, mrope_section) or (0, 0, 0)
    return layout, sections + (int(bool(mrope_interleaved)),)

def _rope(op: str, backward: bool, q: Any, k: Any, positions: Any, cache: Any, layout: Any,
          inverse: bool, rotary_dim: int, mrope_section: Any, mrope_interleaved: Any,
          inplace: bool, q_out: Any, k_out: Any, deferred: Any,
          stream: Any, native: Any = None) -> tuple[Any, Any]:
    """The RoPE family's shared call: checks, outputs (allocated unless in place), then
    native(...) with apply_rope's native arguments (default: _C.apply_rope itself)."""
    q_name, k_name = ("dq", "dk") if backward else ("q", "k")
    _arrays.check_array(op, q_name, q)
    _arrays.check_optional(op, k_name, k)
    _arrays.check_array(op, "positions", positions)
    native_cache, cos, sin = _table_args(op, cache)
    layout, mrope = _rope_settings(op, cache, layout, mrope_section, mrope_interleaved)
    allocated_q = q_out is None and not inplace
    allocated_k = k is not None and k_out is None and not inplace
    if allocated_q:
        q_out = _arrays.empty_like(op, q, _arrays.shape_of(q))
    if allocated_k:
        k_out = _arrays.empty_like(op, k, _arrays.shape_of(k))
    if q_out is None:
        _arrays.check_writable(op, q_name, q)
    else:
        _arrays.check_writable(op, "q_out", q_out)
    if k is not None:
        if k_out is None:
            _arrays.check_writable(op, k_name, k)
        else:
            _arrays.check_writable(op, "k_out", k_out)
    elif k_out is not None:
        raise _C.InvalidArgumentError(f"{op}: k_out is given without {k_name}")
    (native or _C.apply_rope)(
        q, k, positions, native_cache, cos, sin, q_out, k_out,
        _arrays.enum_value(op, "layout", _C.RopeLayout, layout), bool(inverse), int(rotary_dim),
        mrope, _status.native(deferred), _arrays.stream_handle(stream, q), backward)
    q_result = q if q_out is None else q_out
    k_result = k if k_out is None or k is None else k_out
    if allocated_q:
        q_result = _arrays.to_framework(q, q_result)
    if allocated_k:
        k_result = _arrays.to_framework(k, k_result)
    return q_result, k_result


def apply_rope(q: Any, k: Any, positions: Any, cache: Any, *, layout: Optional[str] = None,
               inverse: bool = False, rotary_dim: int = 0,
               mrope_section: Optional[Sequence[int]] = None,
               mrope_interleaved: Optional[bool] = None, inplace: bool = True,
               q_out: Any = None, k_out: Any = None, deferred: Any = None,
               stream: Any = None) -> tuple[Any, Any]:
    """Rotate queries and keys by their positions' angles (rotary position embedding).

    Parameters
    ----------
    q : array [T, Hq, D] or [B, S, Hq, D]
        float32, float16 or bfloat16; any strides with the last one 1 (a slice of a fused
        QKV buffer is fine).
    k : array [T, Hk, D] or [B, S, Hk, D], or None
        The same dtype as q; Hk may differ from Hq (GQA, MQA).
    positions : array [T] or [B, S] of int32 / int64
        ``[3, T]`` or ``[3, B, S]`` (temporal, height, width) with `mrope_section`.
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
    inplace : bool, default True
        Rotate q and k in place. False allocates new outputs in q's framework.
    q_out, k_out : arrays, optional
        Outputs shaped like q and k (out of place); they override `inplace`.
    deferred : DeferredStatus, optional
        Report bad positions there instead of raising (no host synchronisation).
    stream : CUDA stream, optional
        Default: the current stream of q's framework (PyTorch, CuPy), else the legacy one.

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
    return _rope("apply_rope", False, q, k, positions, cache, layout, inverse, rotary_dim,
                 mrope_section, mrope_interleaved, inplace, q_out, k_out, deferred, stream)


def apply_rope_backward(dq: Any, dk: Any, positions: Any, cache: Any, *,
                        layout: Optional[str] = None, inverse: bool = False,
                        rotary_dim: int = 0, mrope_section: Optional[Sequence[int]] = None,
                        mrope_interleaved: Optional[bool] = None, inplace: bool = True,
                        q_out: Any = None, k_out: Any = None, deferred: Any = None,
                        stream: Any = None) -> tuple[Any, Any]:
    """The gradient of :func:`apply_rope`: ``dx = m R(-angle) dy``.

    `dq` and `dk` are the gradients of apply_rope's outputs; `positions`, `cache` and the
    options are those of the forward call (`inverse` names the forward's direction). Returns
    the gradients with respect to q and k, in place by default, like :func:`apply_rope`.
    """
    return _rope("apply_rope_backward", True, dq, dk, positions, cache, layout, inverse,
                 rotary_dim, mrope_section, mrope_interleaved, inplace, q_out, k_out, deferred,
                 stream)


def _norm_vector(op: str, name: str, w: Any) -> Any:
    if w is not None:
        _arrays.check_array(op, name, w)
    return w


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
    _norm_vector(op, "q_weight", q_weight)
    _norm_vector(op, "k_weight", k_weight)

    def native(*args: Any) -> None:
        _C.apply_qk_norm_rope(*args[:12], q_weight, k_weight, float(eps), bool(unit_offset),
                              *args[12:], None, None, None, None)

    return _rope(op, False, q, k, positions, cache, layout, inverse, rotary_dim, mrope_section,
                 mrope_interleaved, inplace, q_out, k_out, deferred, stream, native)


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
    _arrays.check_array(op, "q", q)
    _arrays.check_optional(op, "k", k)
    for name, w in (("q_weight", q_weight), ("k_weight", k_weight),
                    ("q_weight_grad", q_weight_grad), ("k_weight_grad", k_weight_grad)):
        _norm_vector(op, name, w)
    for name, g in (("q_weight_grad", q_weight_grad), ("k_weight_grad", k_weight_grad)):
        if g is not None:
            _arrays.check_writable(op, name, g)

    def native(*args: Any) -> None:
        _C.apply_qk_norm_rope(*args[:12], q_weight, k_weight, float(eps), bool(unit_offset),
                              *args[12:], q, k, q_weight_grad, k_weight_grad)

    return _rope(op, True, dq, dk, positions, cache, layout, inverse, rotary_dim, mrope_section,
                 mrope_interleaved, inplace, q_out, k_out, deferred, stream, native)


def apply_rope_append_kv(q: Any, k: Any, v: Any, positions: Any, cache: Any, *,
                         k_cache: Any = None, v_cache: Any = None, kv_cache: Any = None,
                         slot_mapping: Any = None, cache_offsets: Any = None,
                         cu_seqlens: Any = None, kv_layout: str = "nhd",
                         k_scale: float = 1.0, v_scale: float = 1.0,
                         layout: Optional[str] = None, rotary_dim: int = 0,
                         mrope_section: Optional[Sequence[int]] = None,
                         mrope_interleaved: Optional[bool] = None, q_out: Any = None,
                         k_out: Any = None, deferred: Any = None,
                         stream: Any = None) -> tuple[Any, Any]:
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
    op = "apply_rope_append_kv"
    for name, array in (("q", q), ("k", k), ("v", v), ("positions", positions)):
        _arrays.check_array(op, name, array)
    for name, array in (("k_cache", k_cache), ("v_cache", v_cache), ("kv_cache", kv_cache),
                        ("slot_mapping", slot_mapping), ("cache_offsets", cache_offsets),
                        ("cu_seqlens", cu_seqlens), ("q_out", q_out), ("k_out", k_out)):
        _arrays.check_optional(op, name, array)
    if kv_cache is None and (k_cache is None or v_cache is None):
        raise _C.InvalidArgumentError(f"{op}: give k_cache and v_cache, or kv_cache")
    if kv_cache is not None and (k_cache is not None or v_cache is not None):
        raise _C.InvalidArgumentError(f"{op}: give kv_cache or k_cache and v_cache, not both")
    for name, array in (("k_cache", k_cache), ("v_cache", v_cache), ("kv_cache", kv_cache)):
        if array is not None:
            _arrays.check_writable(op, name, array)
    _arrays.check_writable(op, "q_out" if q_out is not None else "q", q if q_out is None else q_out)
    if k_out is not None:
        _arrays.check_writable(op, "k_out", k_out)
    native_cache, cos, sin = _table_args(op, cache)
    layout, mrope = _rope_settings(op, cache, layout, mrope_section, mrope_interleaved)
    _C.apply_rope_append_kv(
        q, k, v, positions, native_cache, cos, sin, k_cache, v_cache, kv_cache,
        _arrays.enum_value(op, "kv_layout", _C.KvCacheLayout, kv_layout), float(k_scale),
        float(v_scale), slot_mapping, cache_offsets, cu_seqlens, q_out, k_out,
        _arrays.enum_value(op, "layout", _C.RopeLayout, layout), int(rotary_dim), mrope,
        _status.native(deferred), _arrays.stream_handle(stream, q))
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
    _C.packed_positions(False, cu_seqlens, positions, start_offsets, workspace,
                        _status.native(deferred), _arrays.stream_handle(stream, cu_seqlens))
    return _arrays.to_framework(cu_seqlens, positions) if allocated else positions


def packed_positions_workspace_size(cu_seqlens: Any, positions: Any, *,
                                    start_offsets: Any = None) -> int:
    """Bytes of GPU workspace :func:`packed_positions` needs (0 on the CPU)."""
    return _C.packed_positions(True, cu_seqlens, positions, start_offsets, None, None, 0)
