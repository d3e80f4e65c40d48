"""Independent float64 references, written from the formulas (docs/ops.md, HF transformers'
modeling_rope_utils.py), not from embrope's code."""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np


# ------------------------------------------------------------------ frequencies ----

def default_inv_freq(base: float, dim: int) -> np.ndarray:
    """1 / base ** (arange(0, dim, 2) / dim)."""
    return np.array([1.0 / base ** (j / dim) for j in range(0, dim, 2)])


def hf_inv_freq(p: dict, dim: int, max_position_embeddings: int,
                seq_len: Optional[int] = None) -> tuple[np.ndarray, float]:
    """HF's _compute_*_parameters for p = rope_parameters (rope_type, rope_theta, ...), in
    float64. Returns (inv_freq, attention_factor)."""
    kind = p.get("rope_type", "default")
    base = float(p["rope_theta"])
    if kind == "default":
        return default_inv_freq(base, dim), 1.0
    if kind == "linear":
        return default_inv_freq(base, dim) / float(p["factor"]), 1.0
    if kind == "dynamic":
        original = float(p.get("original_max_position_embeddings") or max_position_embeddings)
        factor = float(p["factor"])
        s = max(float(seq_len or 0), original)
        new_base = base * ((factor * s / original) - (factor - 1.0)) ** (dim / (dim - 2))
        return default_inv_freq(new_base, dim), 1.0
    if kind == "yarn":
        factor = float(p["factor"])
        original = float(p.get("original_max_position_embeddings") or max_position_embeddings)

        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if p.get("attention_factor") is not None:
            attention = float(p["attention_factor"])
        elif p.get("mscale") and p.get("mscale_all_dim"):
            attention = mscale(factor, p["mscale"]) / mscale(factor, p["mscale_all_dim"])
        else:
            attention = mscale(factor)
        beta_fast = float(p.get("beta_fast") or 32.0)
        beta_slow = float(p.get("beta_slow") or 1.0)

        def correction_dim(rotations: float) -> float:
            return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if p.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        out = []
        for j in range(dim // 2):
            pos_freq = base ** (2 * j / dim)
            ramp = min(max((j - low) / (high - low), 0.0), 1.0)
            extrapolation = 1.0 - ramp
            out.append((1 / (factor * pos_freq)) * (1 - extrapolation) + (1 / pos_freq) * extrapolation)
        return np.array(out), attention
    if kind == "llama3":
        factor = float(p["factor"])
        low_ff, high_ff = float(p["low_freq_factor"]), float(p["high_freq_factor"])
        old = float(p["original_max_position_embeddings"])
        out = []
        for f in default_inv_freq(base, dim):
            wavelen = 2 * math.pi / f
            llama = f / factor if wavelen > old / low_ff else f
            smooth = (old / wavelen - low_ff) / (high_ff - low_ff)
            medium = not (wavelen < old / high_ff) and not (wavelen > old / low_ff)
            out.append((1 - smooth) * llama / factor + smooth * llama if medium else llama)
        return np.array(out), 1.0
    if kind == "longrope":
        original = int(p["original_max_position_embeddings"])
        factor = float(p.get("factor") or max_position_embeddings / original)
        if p.get("attention_factor") is not None:
            attention = float(p["attention_factor"])
        else:
            attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
        ext = p["long_factor"] if (seq_len or 0) > original else p["short_factor"]
        return np.array([1.0 / (ext[j] * base ** (2 * j / dim)) for j in range(dim // 2)]), attention
    raise ValueError(f"no reference for rope_type {kind!r}")


# ------------------------------------------------------------------------- rope ----

def rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray, attention: float = 1.0,
         layout: str = "neox", inverse: bool = False,
         mrope_section: Optional[Sequence[int]] = None) -> np.ndarray:
    """x [*tokens, H, D] (any float dtype), positions [*tokens] (or [3, *tokens] with
    mrope_section): the rotated x in float64; dims past 2 * len(inv_freq) are copied."""
    x = np.asarray(x, dtype=np.float64)
    positions = np.asarray(positions, dtype=np.float64)
    half = len(inv_freq)
    if mrope_section is not None and any(mrope_section):
        stream = np.repeat([0, 1, 2], mrope_section)
        angle = np.stack([positions[stream[i]] * inv_freq[i] for i in range(half)], -1)
    else:
        angle = positions[..., None] * inv_freq
    c = np.cos(angle)[..., None, :] * attention
    s = np.sin(angle)[..., None, :] * attention * (-1.0 if inverse else 1.0)
    out = x.copy()
    if layout == "neox":
        a, b = x[..., :half], x[..., half:2 * half]
        out[..., :half] = a * c - b * s
        out[..., half:2 * half] = b * c + a * s
    else:
        a, b = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
        out[..., 0:2 * half:2] = a * c - b * s
        out[..., 1:2 * half:2] = b * c + a * s
    return out


# ------------------------------------------------------------------------ embed ----

def sinusoid(positions: np.ndarray, dim: int, base: float = 10000.0,
             layout: str = "interleaved") -> np.ndarray:
    """Vaswani et al. 2017: w_i = base^(-2i/D); interleaved P[2i] = sin, P[2i+1] = cos;
    split P[i] = sin, P[D/2 + i] = cos."""
    positions = np.asarray(positions, dtype=np.float64)
    w = np.array([base ** (-2.0 * i / dim) for i in range(dim // 2)])
    angle = positions[..., None] * w
    out = np.empty(positions.shape + (dim,))
    if layout == "interleaved":
        out[..., 0::2], out[..., 1::2] = np.sin(angle), np.cos(angle)
    else:
        out[..., : dim // 2], out[..., dim // 2:] = np.sin(angle), np.cos(angle)
    return out


def embed(table: np.ndarray, ids: np.ndarray, scale: float = 1.0, vocab_start: int = 0,
          vocab_shard: bool = False, position_rows: Optional[np.ndarray] = None,
          type_table: Optional[np.ndarray] = None,
          type_ids: Optional[np.ndarray] = None) -> np.ndarray:
    """float64: scale * table[id - vocab_start] (0 outside a shard) + position rows + types."""
    table = np.asarray(table, dtype=np.float64)
    ids = np.asarray(ids)
    local = ids - vocab_start
    inside = (local >= 0) & (local < table.shape[0])
    if not vocab_shard:
        assert inside.all()
    out = np.where(inside[..., None], table[np.clip(local, 0, table.shape[0] - 1)], 0.0) * scale
    if position_rows is not None:
        out = out + position_rows
    if type_table is not None:
        out = out + np.asarray(type_table, dtype=np.float64)[np.asarray(type_ids)]
    return out
