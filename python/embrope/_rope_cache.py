"""RopeCache: the cos/sin table of a rotary configuration, and rope_frequencies."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from typing import Any, Optional, Sequence, Union

import numpy as np

from . import _arrays, _models
from . import _embrope as _C


def _rope_config(op: str, **fields: Any) -> Any:
    # The scaling parameters are RopeConfig's fields (listed once, in C++: RopeConfig.fields);
    # a name that is not one of them is a TypeError from _arrays.settings.
    for name in ("short_factor", "long_factor"):
        if fields.get(name) is not None:
            fields[name] = [_arrays.real(op, name, v) for v in fields[name]]
    return _arrays.settings(op, _C.RopeConfig, **fields)


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
    **params
        The variant's parameters, by keyword, as in HF's ``rope_scaling``
        (``original_max_positions`` is ``original_max_position_embeddings``): factor,
        original_max_positions, sequence_length, beta_fast, beta_slow, truncate, mscale,
        mscale_all_dim, low_freq_factor, high_freq_factor, attention_factor, short_factor,
        long_factor (``RopeConfig.fields`` lists them).
    device : str, torch.device or int, default "cpu"
        Where the table lives ("cpu", "cuda", "cuda:1"); "cuda" is the current device
        (``torch.cuda.set_device``'s), as in PyTorch.
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
    TypeError
        For a keyword argument that is not a scaling parameter.
    """

    def __init__(
        self,
        rotary_dim: int,
        max_positions: int,
        base: float = 10000.0,
        *,
        scaling: str = "none",
        device: Any = "cpu",
        layout: str = "neox",
        mrope_section: Optional[Sequence[int]] = None,
        mrope_interleaved: bool = False,
        stream: Any = None,
        **params: Any,
    ) -> None:
        config = _rope_config("RopeCache", rotary_dim=rotary_dim, max_positions=max_positions,
                              base=base, scaling=scaling, **params)
        self._init(config, device, layout, mrope_section, mrope_interleaved, stream)

    def _init(self, config: Any, device: Any, layout: Any, mrope_section: Any,
              mrope_interleaved: bool, stream: Any) -> None:
        kind, index = _arrays.parse_device(device)
        if isinstance(config, list):  # the axes of an axial cache
            self._native = _C.RopeCache.axial(config, kind, index, _arrays.stream_handle(stream))
        else:
            self._native = _C.RopeCache(config, kind, index, _arrays.stream_handle(stream))
        self.layout = _arrays.enum_value("RopeCache", "layout", _C.RopeLayout, layout).name
        self.mrope_section = _mrope_tuple("RopeCache", mrope_section)
        self.mrope_interleaved = bool(mrope_interleaved)
        # The features of each axis of an axial cache, None for a one-axis cache (a plain
        # attribute, as the settings above, so that torch.compile traces the code reading it).
        self.axes_dim = tuple(int(d) for d in self._native.axes_dim) or None

    # ------------------------------------------------------------------ axial RoPE ----
    @classmethod
    def axial(cls, axes_dim: Sequence[int], max_positions: int,
              base: Union[float, Sequence[float]] = 10000.0, *, scaling: str = "none",
              device: Any = "cpu", layout: str = "neox", stream: Any = None,
              **params: Any) -> "RopeCache":
        """An axial RoPE cache: 1 to 4 axes, each owning a slice of the rotary features.

        Axis a owns ``axes_dim[a]`` features (``axes_dim[a] / 2`` pairs) with the frequencies
        ``base_a ** (-2 j / axes_dim[a])``, as diffusers' ``get_1d_rotary_pos_embed`` and HF's
        ``VisionRotaryEmbedding`` compute them; the table's columns are the axes' frequencies
        one after another (docs/ops.md, "Axial RoPE"). :func:`apply_rope` with this cache then
        takes positions ``[N, T]`` or ``[N, B, S]``: each token's integer coordinate on each
        axis (Flux's ``ids [T, N]`` transposed, ``ids.T``), and the axes from the cache.

        Parameters
        ----------
        axes_dim : sequence of 1 to 4 even ints
            The features of each axis (diffusers' ``axes_dim``); their sum is the rotary dim.
        max_positions : int
            Coordinates ``[0, max_positions)`` are valid on every axis.
        base : float or sequence of floats, default 10000.0
            theta, one for all axes or one per axis.
        scaling, **params
            A context-extension variant and its parameters, as in :class:`RopeCache`,
            applied to every axis alike (each with its own rotary dim). The axes must give
            one attention factor.
        device, layout, stream
            As in :class:`RopeCache`. `layout` is the pairing :func:`apply_rope` uses by
            default: "interleaved" for Flux, Wan and timm, "neox" for Qwen2-VL's vision tower.

        Raises
        ------
        InvalidArgumentError
            Naming the axis and the rule.
        """
        dims = [_arrays.integer("RopeCache", "axes_dim", d)
                for d in _sequence("RopeCache", "axes_dim", axes_dim)]
        bases = [_arrays.real("RopeCache", "base", base)] * len(dims) \
            if isinstance(base, (int, float)) else \
            [_arrays.real("RopeCache", "base", b) for b in _sequence("RopeCache", "base", base)]
        if len(bases) != len(dims):
            raise _C.InvalidArgumentError(
                f"RopeCache: base has {len(bases)} entries but axes_dim has {len(dims)}; give "
                "one base, or one per axis")
        configs = [_rope_config("RopeCache", rotary_dim=d, max_positions=max_positions, base=b,
                                scaling=scaling, **params) for d, b in zip(dims, bases)]
        return cls.from_axes(configs, device=device, layout=layout, stream=stream)

    @classmethod
    def from_axes(cls, axes: Sequence[Any], *, device: Any = "cpu", layout: str = "neox",
                  stream: Any = None) -> "RopeCache":
        """An axial cache from one :class:`RopeConfig` per axis (each axis's rotary_dim,
        base and scaling its own; one max_positions and attention factor for all)."""
        self = cls.__new__(cls)
        self._init(list(axes), device, layout, None, False, stream)
        return self

    @classmethod
    def flux(cls, max_positions: int = 512, *, device: Any = "cpu") -> "RopeCache":
        """Flux.1's rotary table (diffusers' ``FluxPosEmbed(theta=10000, axes_dim=[16, 56,
        56])``, adjacent pairs): positions are its ``ids`` transposed, ``[3, T]``."""
        return cls.axial([16, 56, 56], max_positions, 10000.0, device=device,
                         layout="interleaved")

    @classmethod
    def flux2(cls, max_positions: int = 512, *, device: Any = "cpu") -> "RopeCache":
        """FLUX.2's rotary table (diffusers' ``Flux2PosEmbed(theta=2000, axes_dim=(32, 32, 32,
        32))``, adjacent pairs): positions ``[4, T]``."""
        return cls.axial([32, 32, 32, 32], max_positions, 2000.0, device=device,
                         layout="interleaved")

    @classmethod
    def qwen2_vl_vision(cls, head_dim: int = 80, max_positions: int = 1024,
                        base: float = 10000.0, *, device: Any = "cpu") -> "RopeCache":
        """The vision tower of Qwen2-VL and Qwen2.5-VL (HF's ``VisionRotaryEmbedding(head_dim
        // 2)`` and ``apply_rotary_pos_emb_vision``): axes (row, column) of ``head_dim / 2``
        features each, rotate-half pairs; positions ``[2, T]``, each patch's row and column."""
        head_dim = _arrays.integer("RopeCache", "head_dim", head_dim)
        return cls.axial([head_dim // 2, head_dim // 2], max_positions, base, device=device,
                         layout="neox")

    @classmethod
    def wan(cls, head_dim: int = 128, max_positions: int = 1024, base: float = 10000.0, *,
            device: Any = "cpu") -> "RopeCache":
        """Wan 2.1's rotary table (diffusers' ``WanRotaryPosEmbed``): axes (frame, row,
        column) of ``head_dim - 4 (head_dim // 6)``, ``2 (head_dim // 6)`` and ``2 (head_dim
        // 6)`` features, adjacent pairs; positions ``[3, T]``."""
        head_dim = _arrays.integer("RopeCache", "head_dim", head_dim)
        hw = 2 * (head_dim // 6)
        return cls.axial([head_dim - 2 * hw, hw, hw], max_positions, base, device=device,
                         layout="interleaved")

    @classmethod
    def vit_2d(cls, head_dim: int, max_positions: int, base: float = 10000.0, *,
               device: Any = "cpu") -> "RopeCache":
        """A 2-D RoPE ViT with integer patch coordinates (timm's ``RotaryEmbeddingCat(head_dim,
        in_pixels=False)`` without ``ref_feat_shape``, EVA-02's layout): axes (row, column) of
        ``head_dim / 2`` features each, temperature `base`, adjacent pairs; positions
        ``[2, T]``."""
        head_dim = _arrays.integer("RopeCache", "head_dim", head_dim)
        return cls.axial([head_dim // 2, head_dim // 2], max_positions, base, device=device,
                         layout="interleaved")


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
                   sequence_length: Optional[int] = None, device: Any = "cpu") -> "RopeCache":
        """The cache of a :class:`ModelConfig` (its layout and mrope sections included).

        `sequence_length`: the length of the sequence the cache serves, where the scaling
        depends on it as HF's does per forward (HF: ``max(position_ids) + 1``): longrope
        (Phi-3) takes its short factors up to ``original_max_positions`` and its long ones
        past it; dynamic NTK grows its base past it. None: ``max_positions``, the model's
        whole context (long factors).
        """
        if model.positions != _C.PositionKind.rope:
            raise _C.InvalidArgumentError(
                f"RopeCache: model {model.model_type!r} has {model.positions.name} positions, "
                "not rotary ones")
        config = copy.copy(model.rope)
        if max_positions is not None:
            config.max_positions = _arrays.integer("RopeCache", "max_positions", max_positions)
        if sequence_length is not None:
            config.sequence_length = _arrays.integer("RopeCache", "sequence_length",
                                                     sequence_length)
        sections = tuple(model.mrope_section)
        return cls.from_config(config, device=device, layout=model.layout,
                               mrope_section=sections if any(sections) else None,
                               mrope_interleaved=model.mrope_interleaved)

    @classmethod
    def from_preset(cls, name: str, *, max_positions: Optional[int] = None,
                    sequence_length: Optional[int] = None, device: Any = "cpu") -> "RopeCache":
        """The cache of a built-in model preset (see :func:`model_presets`).

        `max_positions` overrides the model's max_position_embeddings (a smaller table);
        `sequence_length` as in :meth:`from_model`.
        """
        return cls.from_model(_models.model_preset(name), max_positions=max_positions,
                              sequence_length=sequence_length, device=device)

    @classmethod
    def from_hf_config(cls, config: Any, *, max_positions: Optional[int] = None,
                       sequence_length: Optional[int] = None, layer_type: Optional[str] = None,
                       device: Any = "cpu") -> "RopeCache":
        """The cache of a HuggingFace model from its config.json path, dict or
        PretrainedConfig (every rope_type embrope supports; see
        :func:`model_config_from_hf`). `max_positions` and `sequence_length` as in
        :meth:`from_model`: Phi-3's cache for a prompt within its original 4K context takes
        the short factors, as HF's forward does, only with ``sequence_length``. `layer_type`
        picks one RoPE of a model with a RoPE per layer type (Gemma 3: "sliding_attention" or
        "full_attention"; one cache per layer type)."""
        model = _models.model_config_from_hf(config, layer_type=layer_type)
        return cls.from_model(model, max_positions=max_positions,
                              sequence_length=sequence_length, device=device)

    @classmethod
    def from_diffusers_config(cls, config: Any, *, max_positions: Optional[int] = None,
                              device: Any = "cpu") -> "RopeCache":
        """The axial cache of a diffusers transformer from its config: a config.json path (or
        the model directory holding it), its dict, a model's ``config``, or the model itself.

        ``FluxTransformer2DModel`` (``axes_dims_rope``, theta 10000 as its FluxPosEmbed),
        ``Flux2Transformer2DModel`` (``axes_dims_rope``, ``rope_theta``) and
        ``WanTransformer3DModel`` (``attention_head_dim``, ``rope_max_seq_len``, theta 10000 as
        its WanRotaryPosEmbed). `max_positions`: the table's rows (default: Wan's
        ``rope_max_seq_len``, else 512, Flux's latent coordinates of an 8192-pixel side).
        Any other config is an error naming what it lacks.
        """
        fields = _config_dict(config)
        name = fields.get("_class_name", "")
        if name.startswith("Wan") or "rope_max_seq_len" in fields:
            if "attention_head_dim" not in fields:
                raise _C.InvalidArgumentError(
                    f"RopeCache: the diffusers config {name or '(unnamed)'} has "
                    "rope_max_seq_len but no attention_head_dim")
            rows = max_positions or int(fields.get("rope_max_seq_len", 1024))
            return cls.wan(int(fields["attention_head_dim"]), rows, device=device)
        axes = fields.get("axes_dims_rope")
        if axes is None:
            raise _C.InvalidArgumentError(
                f"RopeCache: the diffusers config {name or '(unnamed)'} has neither "
                "axes_dims_rope (Flux.1, FLUX.2) nor rope_max_seq_len (Wan 2.1)")
        theta = float(fields.get("rope_theta", 10000.0))
        return cls.axial([int(d) for d in axes], max_positions or 512, theta, device=device,
                         layout="interleaved")

    @classmethod
    def from_hf_vision_config(cls, config: Any, *, max_positions: int = 1024,
                              device: Any = "cpu") -> "RopeCache":
        """The axial cache of a Qwen2-VL or Qwen2.5-VL vision tower from transformers' config:
        the model's config (its ``vision_config`` is used), the vision config itself, their
        dicts or a config.json path. Head dim ``embed_dim / num_heads`` (Qwen2-VL) or
        ``hidden_size / num_heads`` (Qwen2.5-VL), ``head_dim`` where given; theta from
        ``rope_parameters["rope_theta"]`` or ``rope_theta``, else 10000, as the vision rotary
        module reads them. `max_positions`: rows of the table (patch rows and columns)."""
        fields = _config_dict(config)
        fields = _config_dict(fields.get("vision_config", fields))
        heads = fields.get("num_heads")
        width = fields.get("embed_dim", fields.get("hidden_size"))
        head_dim = fields.get("head_dim") or (width // heads if heads and width else None)
        if not head_dim:
            raise _C.InvalidArgumentError(
                "RopeCache: the vision config has no head_dim, nor num_heads with embed_dim or "
                "hidden_size")
        rope = fields.get("rope_parameters") or {}
        theta = float(rope.get("rope_theta", fields.get("rope_theta", 10000.0)))
        return cls.qwen2_vl_vision(int(head_dim), max_positions, theta, device=device)

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
        if self.axes_dim is not None:
            bases = [a.base for a in self._native.axes]
            return (f"RopeCache.axial(axes_dim={list(self.axes_dim)}, "
                    f"max_positions={c.max_positions}, base={bases}, device={self.device!r}, "
                    f"layout={self.layout!r})")
        return (f"RopeCache(rotary_dim={c.rotary_dim}, max_positions={c.max_positions}, "
                f"base={c.base}, scaling={c.scaling.name!r}, device={self.device!r}, "
                f"layout={self.layout!r})")


def _config_dict(config: Any) -> dict:
    """A config as a dict: a config.json path (or its directory), a mapping, an object with
    ``to_dict()`` (transformers' PretrainedConfig), or one with a ``config`` (a model)."""
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    if isinstance(config, Mapping):
        return dict(config)
    if hasattr(config, "to_dict"):
        return config.to_dict()
    if hasattr(config, "config"):
        return _config_dict(config.config)
    raise TypeError(f"RopeCache: cannot read a config from {type(config).__name__}")


def _sequence(op: str, name: str, value: Any) -> Any:
    """A sequence of integers as given: a list, a tuple or a 1-d array, never a string (whose
    characters int() would read as digits) or a lone number."""
    if (isinstance(value, (str, bytes)) or not hasattr(value, "__iter__")
            or getattr(value, "ndim", 1) == 0):
        raise TypeError(f"{op}: {name} must be a sequence of integers, not "
                        f"{type(value).__name__} ({value!r})")
    return value


def _axes_tuple(op: str, axes_dim: Optional[Sequence[int]]) -> tuple[int, int, int, int]:
    """axes_dim as RopeOptions holds it: four entries, unused ones 0."""
    if axes_dim is None:
        return (0, 0, 0, 0)
    dims = tuple(_arrays.integer(op, "axes_dim", d) for d in _sequence(op, "axes_dim", axes_dim))
    if not 1 <= len(dims) <= 4:
        raise _C.InvalidArgumentError(
            f"{op}: axes_dim has {len(dims)} entries; axial RoPE has 1 to 4 axes")
    return dims + (0,) * (4 - len(dims))


def _mrope_tuple(op: str, sections: Optional[Sequence[int]]) -> Optional[tuple[int, int, int]]:
    if sections is None:
        return None
    sections = tuple(_arrays.integer(op, "mrope_section", s)
                     for s in _sequence(op, "mrope_section", sections))
    if len(sections) != 3:
        raise _C.InvalidArgumentError(
            f"{op}: mrope_section has {len(sections)} entries; it needs 3 (temporal, height, "
            "width)")
    return sections
