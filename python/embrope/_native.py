"""The arguments of the native calls, formed in one place for every surface.

The native module (``_embrope``) takes each op's tensors as keyword arguments and its
settings as one typed object (``RopeOptions``, ``QkNorm``, ``EmbedOptions``,
``EmbedBackwardOptions``, built by :func:`_arrays.settings`). What a Python caller says in
other terms is turned into those here, for the NumPy / DLPack functions and for
:mod:`embrope.torch` alike:

- the cos/sin table: a :class:`RopeCache`, a ``cos_sin_cache`` array ``[P, R]`` (cos half,
  then sin half: vLLM's and FlashInfer's layout) or a ``(cos, sin)`` pair;
- the RoPE settings of a call: its own layout and multimodal sections, else its cache's;
- the embed settings: positions "learned" when a position table is given, norm None as none.

Settings are resolved into plain named tuples first (:class:`RopeSettings`,
:class:`EmbedSettings`), which ``torch.compile`` can trace and the custom ops' schemas carry,
then into the native objects by their ``options()`` inside the call.
"""

from __future__ import annotations

import math
import sys
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np

from . import _arrays
from . import _embrope as _C
from ._rope_cache import RopeCache, _axes_tuple, _mrope_tuple


def call(function: Any, *args: Any, **kwargs: Any) -> Any:
    """A native function called with its arrays as the native module imports them fastest:

    - a NumPy bfloat16 array as a bfloat16 view of its bytes (:func:`_arrays.importable`);
    - a torch tensor without ``__torch_function__`` overrides as the DLPack capsule of
      torch's own exporter (``torch._C._to_dlpack``). Given the tensor, nanobind calls
      ``Tensor.__dlpack__``: Python-level checks (2-4 us a tensor, most of a one-token call)
      that end in that same export, and where they refuse (a tensor that requires grad, one
      on another CUDA device than the current one) nanobind falls back to the same exporter
      (``torch.utils.dlpack.to_dlpack``). No stream is synchronised either way: nanobind
      passes none, and the ops take theirs explicitly. A tensor subclass with overrides keeps
      the protocol, and a tensor without strided storage (sparse) is left to it, which refuses
      it;
    - anything else as it is.
    """
    torch = sys.modules.get("torch")  # torch tensors exist only once torch is imported
    if torch is None:
        args = tuple(_arrays.importable(a) if isinstance(a, np.ndarray) else a for a in args)
        for name, a in kwargs.items():
            if isinstance(a, np.ndarray):
                kwargs[name] = _arrays.importable(a)
        return function(*args, **kwargs)
    tensor, overridden, export = torch.Tensor, torch._C._has_torch_function_unary, _export
    args = tuple(export(a) if isinstance(a, tensor) and not overridden(a) else
                 _arrays.importable(a) if isinstance(a, np.ndarray) else a for a in args)
    for name, a in kwargs.items():
        if a is None:  # most keywords of most calls
            continue
        if isinstance(a, tensor):
            if not overridden(a):
                kwargs[name] = export(a)
        elif isinstance(a, np.ndarray):
            kwargs[name] = _arrays.importable(a)
    return function(*args, **kwargs)


def _export(a: Any) -> Any:
    try:
        return sys.modules["torch"]._C._to_dlpack(a)
    except (RuntimeError, BufferError):  # no strided storage (sparse), a dtype DLPack lacks:
        return a  # the protocol's own path, which nanobind refuses by type


def rope_table(op: str, cache: Any) -> dict:
    """The table keyword arguments (``cache``, ``cos`` and ``sin``, or ``cos_sin_cache``) of a
    native call."""
    if isinstance(cache, RopeCache):
        return {"cache": cache._native}
    if isinstance(cache, tuple) and len(cache) == 2:
        cos, sin = cache
        _arrays.check_array(op, "cos", cos)
        _arrays.check_array(op, "sin", sin)
        return {"cos": cos, "sin": sin}
    if hasattr(cache, "__dlpack__") or isinstance(cache, np.ndarray):
        _arrays.check_array(op, "cache", cache)
        return {"cos_sin_cache": cache}  # split into its halves by the native module
    raise TypeError(
        f"{op}: cache must be a RopeCache, a cos_sin_cache array [max_positions, rotary_dim] "
        f"or a (cos, sin) pair, not {type(cache).__name__}")


# One native settings object per distinct settings, shared by the calls that use them: the
# native functions take them by const reference and copy what they add (outputs, statuses,
# streams), so sharing is safe, and building one costs about 4 us per call. Bounded: a run
# of ever-new settings (float8 scales per call, say) only rebuilds.
_OPTIONS: dict = {}


def _sign(x: Any) -> Any:
    """The sign of a number that scales values, for keys: 0.0 == -0.0, but x * 0.0 and
    x * -0.0 differ in the zeros' signs (None for what is not a number: the build says so)."""
    try:
        return math.copysign(1.0, x)
    except TypeError:
        return None


def _shared_options(settings: tuple, build: Any) -> Any:
    try:
        native = _OPTIONS.get(settings)
    except TypeError:  # an unhashable argument: build() says what is wrong with it
        return build()
    if native is None:
        if len(_OPTIONS) >= 256:
            _OPTIONS.clear()
        native = _OPTIONS[settings] = build()
    return native


class RopeSettings(NamedTuple):
    """A call's RoPE settings in plain values (so that ``torch.compile`` traces the code that
    forms them): the ``RopeOptions`` fields, the layout as its enum value and the position
    streams as (mrope temporal, height, width, interleaved, then the four axes_dim), all 0
    without mrope or axes (a custom op's list of the first four alone means no axes)."""

    layout: int
    inverse: bool
    rotary_dim: int
    mrope: tuple
    q_out_scale: float = 1.0
    k_out_scale: float = 1.0

    def options(self, op: str) -> Any:
        """The native ``RopeOptions`` (shared between calls with the same settings)."""
        key = ("rope",) + tuple(self) + (_sign(self.q_out_scale), _sign(self.k_out_scale))
        return _shared_options(key, lambda: _arrays.settings(
            op, _C.RopeOptions, layout=_C.RopeLayout(self.layout), inverse=bool(self.inverse),
            rotary_dim=int(self.rotary_dim), mrope_section=tuple(self.mrope[:3]),
            mrope_interleaved=bool(self.mrope[3]),
            axes_dim=(tuple(self.mrope[4:8]) + (0, 0, 0, 0))[:4],
            q_out_scale=float(self.q_out_scale),
            k_out_scale=float(self.k_out_scale)))


def rope_settings(op: str, cache: Any, *, layout: Optional[str] = None, inverse: bool = False,
                  rotary_dim: int = 0, mrope_section: Optional[Sequence[int]] = None,
                  mrope_interleaved: Optional[bool] = None, q_out_scale: float = 1.0,
                  k_out_scale: float = 1.0,
                  axes_dim: Optional[Sequence[int]] = None) -> RopeSettings:
    """The settings of a call: the layout, multimodal and axial settings are the call's own,
    else its RopeCache's (a table array has none: "neox", no mrope, no axes)."""
    from_cache = isinstance(cache, RopeCache)
    if layout is None:
        layout = cache.layout if from_cache else "neox"
    if mrope_section is None and from_cache:
        mrope_section = cache.mrope_section
        if mrope_interleaved is None:
            mrope_interleaved = cache.mrope_interleaved
    if axes_dim is None and from_cache:
        axes_dim = cache.axes_dim
    sections = _mrope_tuple(op, mrope_section) or (0, 0, 0)
    return RopeSettings(_arrays.enum_value(op, "layout", _C.RopeLayout, layout).value,
                        bool(inverse), _arrays.integer(op, "rotary_dim", rotary_dim),
                        sections + (int(bool(mrope_interleaved)),) + _axes_tuple(op, axes_dim),
                        _arrays.real(op, "q_out_scale", q_out_scale),
                        _arrays.real(op, "k_out_scale", k_out_scale))


def dlpack_table(cache: RopeCache) -> Any:
    """The cache's float32 table as a DLPack array on its own device (writable views are
    for the library; the public :attr:`RopeCache.table` is read-only)."""
    return cache._native.table()


class EmbedSettings(NamedTuple):
    """An embed call's settings in plain values: the ``EmbedOptions`` fields, enums as their
    values."""

    scale: float
    vocab_start: int
    vocab_shard: bool
    positions: int
    sinusoid_base: float
    sinusoid_layout: int
    norm: int
    norm_eps: float
    norm_unit_offset: bool

    def options(self, op: str) -> Any:
        """The native ``EmbedOptions`` (shared between calls with the same settings)."""
        key = ("embed",) + tuple(self) + (_sign(self.scale),)
        return _shared_options(key, lambda: _arrays.settings(
            op, _C.EmbedOptions, scale=float(self.scale), vocab_start=int(self.vocab_start),
            vocab_shard=bool(self.vocab_shard), positions=_C.PositionEncoding(self.positions),
            sinusoid_base=float(self.sinusoid_base),
            sinusoid_layout=_C.SinusoidLayout(self.sinusoid_layout),
            norm=_C.Normalization(self.norm), norm_eps=float(self.norm_eps),
            norm_unit_offset=bool(self.norm_unit_offset)))


def embed_options(op: str, *, scale: Any, vocab_start: Any, vocab_shard: Any, positions: Any,
                  position_table: Any, sinusoid_base: Any, sinusoid_layout: Any, norm: Any,
                  norm_eps: Any, norm_unit_offset: Any) -> Any:
    """The native ``EmbedOptions`` of an embed call's arguments (those of
    :func:`embed_settings`), looked up by the arguments themselves: resolving them costs 3 us,
    most of a one-row call's Python time. Arguments that compare equal resolve alike (1, 1.0
    and True are the same number to float(), int() and bool(); the scale's sign is part of
    the key, for 0.0 and -0.0); a position table counts only by its presence."""
    def build() -> Any:
        return embed_settings(
            op, scale=scale, vocab_start=vocab_start, vocab_shard=vocab_shard,
            positions=positions, position_table=position_table, sinusoid_base=sinusoid_base,
            sinusoid_layout=sinusoid_layout, norm=norm, norm_eps=norm_eps,
            norm_unit_offset=norm_unit_offset).options(op)

    # Values of other types (a 0-d tensor, say) are resolved afresh: as keys they would compare
    # by identity, be kept alive by the cache, and could change in place between calls.
    for value in (scale, vocab_start, sinusoid_base, norm_eps, vocab_shard, norm_unit_offset,
                  positions, sinusoid_layout, norm):
        if not (value is None or isinstance(value, _KEY_VALUES)):
            return build()
    key = ("embed arguments", op, scale, _sign(scale), vocab_start, type(vocab_start),
           vocab_shard, positions,
           position_table is None, sinusoid_base, sinusoid_layout, norm, norm_eps,
           norm_unit_offset)
    return _shared_options(key, build)


# Immutable values that compare by value: numbers, flags, names and the native enums.
_KEY_VALUES = (int, float, str, np.number, np.bool_, _C.PositionEncoding, _C.SinusoidLayout,
               _C.Normalization)


def embed_settings(op: str, *, scale: float = 1.0, vocab_start: int = 0,
                   vocab_shard: bool = False, positions: Optional[str] = None,
                   position_table: Any = None, sinusoid_base: float = 10000.0,
                   sinusoid_layout: Any = "interleaved", norm: Optional[str] = None,
                   norm_eps: float = 1e-5, norm_unit_offset: bool = False) -> EmbedSettings:
    """An embed call's settings: positions "learned" when a position table is given, else
    none; norm None is no norm."""
    if positions is None:
        positions = "learned" if position_table is not None else "none"
    return EmbedSettings(
        _arrays.real(op, "scale", scale), _arrays.integer(op, "vocab_start", vocab_start),
        bool(vocab_shard),
        _arrays.enum_value(op, "positions", _C.PositionEncoding, positions).value,
        _arrays.real(op, "sinusoid_base", sinusoid_base),
        _arrays.enum_value(op, "sinusoid_layout", _C.SinusoidLayout, sinusoid_layout).value,
        _arrays.enum_value(op, "norm", _C.Normalization, "none" if norm is None else norm).value,
        _arrays.real(op, "norm_eps", norm_eps), bool(norm_unit_offset))


def embed_backward_options(op: str, *, scale: float, vocab_start: int, vocab_shard: bool,
                           padding_idx: Optional[int], mode: Any, norm: Optional[str] = None,
                           norm_eps: float = 1e-5, norm_unit_offset: bool = False) -> Any:
    """The ``EmbedBackwardOptions`` settings of an embed_backward call (norm None: no norm)."""
    return _arrays.settings(
        op, _C.EmbedBackwardOptions, scale=_arrays.real(op, "scale", scale),
        vocab_start=_arrays.integer(op, "vocab_start", vocab_start),
        vocab_shard=bool(vocab_shard),
        padding_idx=None if padding_idx is None else _arrays.integer(op, "padding_idx",
                                                                     padding_idx),
        mode=mode, norm="none" if norm is None else norm,
        norm_eps=_arrays.real(op, "norm_eps", norm_eps), norm_unit_offset=bool(norm_unit_offset))
