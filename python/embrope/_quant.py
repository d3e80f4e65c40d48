"""Quantized token tables: :class:`QuantizedTable`, which :func:`embrope.embed` reads in place."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from . import _arrays
from . import _embrope as _C

# GGUF block sizes (llama.cpp's ggml-common.h): values and bytes per block.
_GGUF_BLOCKS = {"gguf_q8_0": (32, 34), "gguf_q4_0": (32, 18), "gguf_q4_k": (256, 144),
                "gguf_q6_k": (256, 210)}
_FORMATS = ("int8", "int4", "float8_e4m3fn", "float8_e5m2") + tuple(_GGUF_BLOCKS)
# The gguf package's names of the GGUF formats (GGMLQuantizationType members).
_GGML_TYPES = {"Q8_0": "gguf_q8_0", "Q4_0": "gguf_q4_0", "Q4_K": "gguf_q4_k",
               "Q6_K": "gguf_q6_k"}


class QuantizedTable:
    """A token-embedding table stored quantized, which :func:`embrope.embed` reads in place:
    each row it looks up is dequantized to float32 in the same pass, fused with everything embed
    does (scale, positions, types, norm, vocab shards).

    Parameters
    ----------
    format : str
        How the rows are stored:

        - ``"int8"``: int8 values, ``x = (q - zero_point) * scale`` (ExecuTorch's
          ``embedding_byte``; torchao's ``IntxWeightOnlyConfig`` tables, int4 ones included,
          which keep one value per byte);
        - ``"int4"``: int4 values two per byte, ExecuTorch's ``embedding_4bit`` packing (the
          even element in the high nibble, each stored plus 8);
        - ``"float8_e4m3fn"``, ``"float8_e5m2"``: ``x = float(q) * scale`` (torchao's float8
          weight-only tables);
        - ``"gguf_q8_0"``, ``"gguf_q4_0"``, ``"gguf_q4_k"``, ``"gguf_q6_k"``: llama.cpp's
          blocks, as a ``.gguf`` file stores ``token_embd.weight`` (:meth:`from_gguf`); their
          scales are in the blocks.
    data : array [V, C]
        The rows, kept by reference (no copy): int8 [V, D] (int8), uint8 [V, D / 2] (int4),
        the float8 dtype [V, D] (float8), uint8 [V, bytes per row] (GGUF). C contiguous; any row
        stride.
    dim : int, optional
        D, the values per row. Default: from C and the format.
    scales : array, optional
        int8, int4 and float8: float32, float16 or bfloat16, ``[V]`` or ``[V, 1]`` (one per
        row), ``[V, G]`` (one per group of D / G values) or one element (the whole table).
    zero_points : array, optional
        int8 and int4: shaped like `scales`; float32, float16, bfloat16, int8 or int32.
        Absent: 0.

    Notes
    -----
    There is no backward for quantized tables. CPU arrays and CUDA arrays (PyTorch, CuPy) both
    work; :meth:`from_gguf` and :meth:`quantize` give host arrays (move them with the
    framework, e.g. ``torch.from_numpy(...).cuda()``).
    """

    def __init__(self, format: str, data: Any, *, dim: Optional[int] = None,
                 scales: Any = None, zero_points: Any = None) -> None:
        op = "QuantizedTable"
        if format not in _FORMATS:
            raise _C.InvalidArgumentError(
                f"{op}: format {format!r} is not one of {', '.join(_FORMATS)}")
        _arrays.check_array(op, "data", data, autograd=False)
        _arrays.check_optional(op, "scales", scales, autograd=False)
        _arrays.check_optional(op, "zero_points", zero_points, autograd=False)
        shape = _arrays.shape_of(data)
        if len(shape) != 2:
            raise _C.InvalidArgumentError(
                f"{op}: data has shape {list(shape)}; it must be [V, C]")
        if dim is None:
            columns = shape[1]
            if format == "int4":
                dim = 2 * columns
            elif format in _GGUF_BLOCKS:
                values, nbytes = _GGUF_BLOCKS[format]
                if columns % nbytes != 0:
                    raise _C.InvalidArgumentError(
                        f"{op}: data has {columns} columns, not whole {format} blocks of "
                        f"{nbytes} bytes")
                dim = columns // nbytes * values
            else:
                dim = columns
        self.format = format
        self.data = data
        self.dim = int(dim)
        self.scales = scales
        self.zero_points = zero_points
        self._out_dtype = None  # from_torchao: the weight's dtype

    @property
    def vocab_size(self) -> int:
        """V, the rows."""
        return int(_arrays.shape_of(self.data)[0])

    @property
    def shape(self) -> tuple[int, int]:
        """(V, D): the shape of the table it stands for."""
        return (self.vocab_size, self.dim)

    @property
    def nbytes(self) -> int:
        """Bytes of the rows, scales and zero points (what a lookup of every row reads)."""
        return sum(_nbytes(a) for a in (self.data, self.scales, self.zero_points)
                   if a is not None)

    def default_dtype(self) -> Any:
        """The dtype embed writes when it allocates the output: the weight's dtype for a table
        from :meth:`from_torchao` (as ``F.embedding`` of the weight gives), else the scales'
        float dtype, or float32 (GGUF tables, as llama.cpp's get_rows writes them)."""
        if self._out_dtype is not None:
            return self._out_dtype
        scales = self.scales
        if scales is not None and str(scales.dtype).split(".")[-1] in (
                "float32", "float16", "bfloat16"):
            return scales.dtype
        return _float32_of(self.data)

    def dequantize(self, dtype: Any = None) -> Any:
        """The whole table [V, D] as floats (`dtype`, default :meth:`default_dtype`): embed of
        every row in order."""
        from ._embed import embed

        ids = np.arange(self.vocab_size, dtype=np.int64)
        if _arrays.framework(self.data) == "torch":
            import torch

            ids = torch.from_numpy(ids).to(self.data.device)
        out = _arrays.empty_like("QuantizedTable.dequantize", self.data, (self.vocab_size, self.dim),
                                 self.default_dtype() if dtype is None else dtype)
        return _arrays.to_framework(self.data, embed(self, ids, out=out))

    def __repr__(self) -> str:
        return (f"QuantizedTable({self.format!r}, V={self.vocab_size}, D={self.dim}, "
                f"{self.nbytes} bytes)")

    # ------------------------------------------------------------------- constructors --

    @classmethod
    def from_gguf(cls, source: Any, name: str = "token_embd.weight") -> Any:
        """The tensor `name` of a ``.gguf`` file, read with the ``gguf`` package (PyPI) and kept
        memory-mapped: a QuantizedTable for Q8_0, Q4_0, Q4_K and Q6_K tensors, the float array
        [V, D] itself for F32, F16 and BF16 ones.

        Parameters
        ----------
        source : str, os.PathLike or gguf.GGUFReader
        name : str, default "token_embd.weight"
        """
        op = "QuantizedTable.from_gguf"
        try:
            import gguf
        except ImportError as e:
            raise _C.NotAvailableError(
                f"{op}: reading .gguf files needs the gguf package (pip install gguf)") from e
        reader = source if isinstance(source, gguf.GGUFReader) else gguf.GGUFReader(source)
        if reader.byte_order != "I":
            # Its blocks' float16 scales and BF16 values would be read in the wrong byte order.
            raise _C.InvalidArgumentError(
                f"{op}: the file's byte order is not this machine's (a big-endian .gguf); "
                "convert it with gguf's gguf_convert_endian script")
        found = [t for t in reader.tensors if t.name == name]
        if not found:
            names = ", ".join(t.name for t in reader.tensors[:8])
            raise _C.InvalidArgumentError(
                f"{op}: the file has no tensor {name!r} (it has {names}"
                f"{', ...' if len(reader.tensors) > 8 else ''})")
        tensor = found[0]
        kind = tensor.tensor_type.name
        if len(tensor.shape) != 2:
            raise _C.InvalidArgumentError(
                f"{op}: {name!r} has shape {list(tensor.shape)} (fastest first); a token table "
                "has two dimensions, [D, V]")
        # GGUF shapes list the fastest dimension first: [D, V].
        dim, vocab = (int(n) for n in tensor.shape)
        if kind in ("F32", "F16"):
            return tensor.data.reshape(vocab, dim)
        if kind == "BF16":  # gguf-py hands BF16 out as raw bytes [V, 2 D]
            try:
                import ml_dtypes
            except ImportError as e:
                raise _C.NotAvailableError(
                    f"{op}: {name!r} is BF16; NumPy holds bfloat16 through ml_dtypes "
                    "(pip install ml_dtypes)") from e
            return tensor.data.view(ml_dtypes.bfloat16).reshape(vocab, dim)
        if kind not in _GGML_TYPES:
            raise _C.InvalidArgumentError(
                f"{op}: {name!r} is stored as {kind}; embrope reads {', '.join(_GGML_TYPES)}, "
                "F32, F16 and BF16 tables")
        return cls(_GGML_TYPES[kind], tensor.data.reshape(vocab, -1), dim=dim)

    @classmethod
    def from_torchao(cls, weight: Any) -> "QuantizedTable":
        """The table of a torchao-quantized ``nn.Embedding`` weight, by reference: an
        ``IntxUnpackedToInt8Tensor`` (``IntxWeightOnlyConfig``, int1 to int8 values kept one per
        byte; per-row or per-group scales and zero points) or a float8 weight with ``qdata`` and
        ``scale``."""
        op = "QuantizedTable.from_torchao"
        qdata = getattr(weight, "qdata", None)
        scale = getattr(weight, "scale", None)
        if qdata is None or scale is None:
            raise _C.InvalidArgumentError(
                f"{op}: {type(weight).__name__} has no qdata and scale (a torchao "
                "IntxUnpackedToInt8Tensor or float8 tensor is expected)")
        kind = str(qdata.dtype).split(".")[-1]
        if kind not in ("int8", "float8_e4m3fn", "float8_e5m2"):
            raise _C.InvalidArgumentError(
                f"{op}: qdata has dtype {kind}; int8 or float8 expected")
        # One stored value per weight value: packed layouts (Int4Tensor's two int4 values per
        # int8, its scales [D / group, V]) are not these.
        if tuple(qdata.shape) != tuple(weight.shape):
            raise _C.InvalidArgumentError(
                f"{op}: {type(weight).__name__} keeps qdata of shape {list(qdata.shape)} for a "
                f"weight of shape {list(weight.shape)}; embrope reads torchao layouts with one "
                "value per element (IntxUnpackedToInt8Tensor from IntxWeightOnlyConfig, "
                "Int8Tensor, float8 tensors), not packed ones such as Int4Tensor")
        table = (cls("int8", qdata, scales=scale, zero_points=getattr(weight, "zero_point", None))
                 if kind == "int8" else cls(kind, qdata, scales=scale))
        # embed's output dtype by default: the weight's, as F.embedding of it gives (a float8
        # weight of a bfloat16 model keeps float32 scales).
        dtype = getattr(weight, "dtype", None)
        if str(dtype).split(".")[-1] in ("float32", "float16", "bfloat16"):
            table._out_dtype = dtype
        return table

    @classmethod
    def quantize(cls, table: Any, format: str, *, group_size: Optional[int] = None,
                 zero_point: bool = False) -> "QuantizedTable":
        """Quantize a float table [V, D] (NumPy, or PyTorch on any device: the arrays are made
        on the host and returned on the table's device).

        - int8 / int4: a scale per row (`group_size` None) or per group of `group_size`
          values; symmetric ``scale = max|x| / qmax`` (127 or 7), or with `zero_point` the
          range [min, max] mapped onto [qmin, qmax] with an int8 zero point. q = round(x / scale
          + zero_point), clamped. Arrays come back in the table's framework; int4 packed as
          ExecuTorch packs them.
        - float8_e4m3fn / float8_e5m2: a scale per row, ``max|x| / (largest finite)``; needs
          PyTorch for the float8 rounding, and returns PyTorch tensors (NumPy has no float8).
        - gguf_q8_0 / gguf_q4_0: the gguf package's own quantizer (llama.cpp's reference).
        - gguf_q4_k / gguf_q6_k (which the gguf package cannot quantize): a direct quantizer of
          the blocks' layout, min/max per sub-block of 32 (Q4_K) and max|x| per group of 16
          (Q6_K), the sub-block factors quantized to 6 and 8 bits against a float16 super-block
          scale (rounded up, so that the levels cover each sub-block), the values then rounded
          against the quantized factors. Every value lies within half a step of its sub-block
          plus half a step of the super-block's scale, which as a float16 is at least 2^-24
          (so values far below 1e-6 keep an error of up to 3e-8); llama.cpp's ``llama-quantize`` searches the factors
          further (``make_qkx2_quants``) and gives other, slightly closer, blocks.
        """
        op = "QuantizedTable.quantize"
        if format not in _FORMATS:
            raise _C.InvalidArgumentError(
                f"{op}: format {format!r} is not one of {', '.join(_FORMATS)}")
        _arrays.check_array(op, "table", table, autograd=False)
        torch_in = _arrays.framework(table) == "torch"
        device = table.device if torch_in else None
        x = (table.detach().to("cpu").double().numpy() if torch_in
             else np.asarray(table, dtype=np.float64))
        if x.ndim != 2:
            raise _C.InvalidArgumentError(f"{op}: table has shape {list(x.shape)}; it must be [V, D]")
        if not np.all(np.isfinite(x)):
            raise _C.InvalidArgumentError(f"{op}: table has NaN or infinite values")
        vocab, dim = x.shape

        def back(a: np.ndarray) -> Any:
            if torch_in:
                import torch

                return torch.from_numpy(np.ascontiguousarray(a)).to(device)
            return np.ascontiguousarray(a)

        if format in _GGUF_BLOCKS:
            if group_size is not None or zero_point:
                raise _C.InvalidArgumentError(
                    f"{op}: {format} blocks fix their own groups and offsets: group_size and "
                    "zero_point do not apply")
            values, _ = _GGUF_BLOCKS[format]
            if dim % values != 0:
                raise _C.InvalidArgumentError(
                    f"{op}: {format} stores rows in blocks of {values} values: D {dim} must be "
                    f"a multiple of {values}")
            rows = x.astype(np.float32)
            if format == "gguf_q4_k":
                return cls(format, back(_quantize_q4_k(rows)), dim=dim)
            if format == "gguf_q6_k":
                return cls(format, back(_quantize_q6_k(rows)), dim=dim)
            try:
                import gguf
            except ImportError as e:
                raise _C.NotAvailableError(
                    f"{op}: {format} quantizes with the gguf package (pip install gguf)") from e
            kind = gguf.GGMLQuantizationType.Q8_0 if format == "gguf_q8_0" else \
                gguf.GGMLQuantizationType.Q4_0
            return cls(format, back(gguf.quants.quantize(rows, kind)), dim=dim)

        if format.startswith("float8"):
            if group_size is not None or zero_point:
                raise _C.InvalidArgumentError(
                    f"{op}: {format} tables have one scale per row and no zero point")
            try:
                import torch
            except ImportError as e:
                raise _C.NotAvailableError(
                    f"{op}: float8 rounding needs PyTorch (torch.{format})") from e
            largest = 448.0 if format == "float8_e4m3fn" else 57344.0
            amax = np.abs(x).max(axis=1, keepdims=True)
            scale = np.where(amax > 0, amax / largest, 1.0).astype(np.float32)
            q = torch.from_numpy((x / scale).astype(np.float32)).to(getattr(torch, format))
            s = torch.from_numpy(scale[:, 0].copy())
            if torch_in:
                q, s = q.to(device), s.to(device)
            return cls(format, q, scales=s)

        bits = 8 if format == "int8" else 4
        qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        group = dim if group_size is None else int(group_size)
        if group < 1 or dim % group != 0:
            raise _C.InvalidArgumentError(
                f"{op}: group_size {group_size} must divide D {dim}")
        if format == "int4" and dim % 2 != 0:
            raise _C.InvalidArgumentError(f"{op}: int4 packs two values per byte: D {dim} must be even")
        g = x.reshape(vocab, dim // group, group)
        if zero_point:
            lo = np.minimum(g.min(axis=2), 0.0)
            hi = np.maximum(g.max(axis=2), 0.0)
            scale = np.where(hi > lo, (hi - lo) / (qmax - qmin), 1.0).astype(np.float32)
            zp = np.clip(np.round(qmin - lo / scale), qmin, qmax).astype(np.int8)
        else:
            amax = np.abs(g).max(axis=2)
            scale = np.where(amax > 0, amax / qmax, 1.0).astype(np.float32)
            zp = np.zeros(scale.shape, dtype=np.int8)
        q = np.clip(np.round(g / scale[:, :, None] + zp[:, :, None]), qmin, qmax)
        q = q.astype(np.int16).reshape(vocab, dim)
        if format == "int4":
            q = (((q[:, 0::2] + 8) << 4) | (q[:, 1::2] + 8)).astype(np.uint8)
        else:
            q = q.astype(np.int8)
        return cls(format, back(q), dim=dim, scales=back(scale),
                   zero_points=back(zp) if zero_point else None)


def _f16_up(a: np.ndarray) -> np.ndarray:
    """Non-negative float32 values rounded up to float16 and back (the blocks' super-block
    scales): never below the value, so the 6- and 8-bit factors against it stay within their
    range, and never 0 for a value above 0. Rounded to nearest, a table of values below about
    1e-4 (Q6_K) or 1e-5 (Q4_K) had scales of 0: all-zero rows, or every value its
    sub-block's minimum."""
    h = a.astype(np.float16)
    low = h.astype(np.float32) < a
    h[low] = np.nextafter(h[low], np.float16(np.inf))
    return h.astype(np.float32)


def _check_block_scales(format: str, x: np.ndarray, *scales: np.ndarray) -> None:
    """Refuses a table whose float16 super-block scales overflow (|x| past about 4e6 for Q4_K's
    minima, 2.5e8 for Q6_K)."""
    if not all(np.all(np.isfinite(s)) for s in scales):
        raise _C.InvalidArgumentError(
            f"QuantizedTable.quantize: {format} keeps float16 super-block scales, which overflow "
            f"for this table (max |x| {np.abs(x).max():.3g})")


def _quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """float32 rows [V, D] (D a multiple of 256) as Q4_K blocks, uint8 [V, D / 256 * 144]:
    x = d * sc * q - dmin * m per sub-block of 32, q in [0, 15], sc and m 6-bit (ggml-common.h's
    block_q4_K; the scale packing is get_scale_min_k4's inverse)."""
    vocab, dim = x.shape
    blocks = x.reshape(-1, 8, 32)  # every block of every row, as 8 sub-blocks of 32
    lo = np.minimum(blocks.min(axis=2), 0.0)
    hi = np.maximum(blocks.max(axis=2), 0.0)
    scale = (hi - lo) / 15.0  # of each sub-block
    offset = -lo              # its min, >= 0
    d = _f16_up(scale.max(axis=1) / 63.0)
    dmin = _f16_up(offset.max(axis=1) / 63.0)
    _check_block_scales("gguf_q4_k", x, d, dmin)
    # The factors rounded up, so that the 16 levels cover the sub-block (rounded to nearest,
    # a factor below its value clipped the largest values by up to half the factor's step).
    with np.errstate(divide="ignore", invalid="ignore"):
        mq = np.where(dmin[:, None] > 0, np.ceil(offset / dmin[:, None]), 0).clip(0, 63)
        mq = mq.astype(np.uint8)
        shift = (dmin[:, None] * mq).astype(np.float32)
        sc = np.where(d[:, None] > 0, np.ceil((hi + shift) / 15.0 / d[:, None]), 0)
        sc = sc.clip(0, 63).astype(np.uint8)
        step = (d[:, None] * sc).astype(np.float32)
        q = np.where(step[:, :, None] > 0,
                     np.rint((blocks + shift[:, :, None]) / step[:, :, None]), 0)
    q = q.clip(0, 15).astype(np.uint8)
    out = np.zeros((blocks.shape[0], 144), dtype=np.uint8)
    out[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = dmin.astype(np.float16).view(np.uint8).reshape(-1, 2)
    packed = out[:, 4:16]
    packed[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    packed[:, 4:8] = (mq[:, 0:4] & 63) | ((mq[:, 4:8] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:8] & 15) | ((mq[:, 4:8] & 15) << 4)
    # Sub-blocks 2i and 2i + 1 share 32 bytes: low nibbles, then high nibbles.
    out[:, 16:] = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(-1, 128)
    return out.reshape(vocab, dim // 256 * 144)


def _quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """float32 rows [V, D] (D a multiple of 256) as Q6_K blocks, uint8 [V, D / 256 * 210]:
    x = d * sc * q per group of 16, q in [-32, 31], sc int8 (ggml-common.h's block_q6_K, laid
    out as dequantize_row_q6_K reads it)."""
    vocab, dim = x.shape
    groups = x.reshape(-1, 16, 16)  # every block as 16 groups of 16
    scale = np.abs(groups).max(axis=2) / 31.0
    d = _f16_up(scale.max(axis=1) / 127.0)
    _check_block_scales("gguf_q6_k", x, d)
    # The factors rounded up: the levels cover the group (see _quantize_q4_k).
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.ceil(scale / d[:, None]), 0).clip(0, 127).astype(np.int8)
        step = (d[:, None] * sc).astype(np.float32)
        q = np.where(step[:, :, None] > 0, np.rint(groups / step[:, :, None]), 0)
    q = (q.clip(-32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)  # [block, half, k, l]
    out = np.zeros((q.shape[0], 210), dtype=np.uint8)
    for half in range(2):
        ql = out[:, 64 * half:64 * half + 64]
        ql[:, 0:32] = (q[:, half, 0] & 15) | ((q[:, half, 2] & 15) << 4)
        ql[:, 32:64] = (q[:, half, 1] & 15) | ((q[:, half, 3] & 15) << 4)
        out[:, 128 + 32 * half:160 + 32 * half] = (
            (q[:, half, 0] >> 4) | ((q[:, half, 1] >> 4) << 2) | ((q[:, half, 2] >> 4) << 4) |
            ((q[:, half, 3] >> 4) << 6))
    out[:, 192:208] = sc.view(np.uint8)
    out[:, 208:210] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return out.reshape(vocab, dim // 256 * 210)


def _nbytes(a: Any) -> int:
    nbytes = getattr(a, "nbytes", None)
    if nbytes is None:  # torch
        nbytes = a.numel() * a.element_size()
    return int(nbytes)


def _float32_of(like: Any) -> Any:
    """float32 in `like`'s framework."""
    if _arrays.framework(like) == "torch":
        import torch

        return torch.float32
    return np.float32
