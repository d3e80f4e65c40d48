"""Writes blocks.json: GGUF blocks and their values as the gguf package (llama.cpp's gguf-py,
PyPI `gguf`) dequantizes them, the oracle of tests/test_quant_math.cpp.

    pip install gguf numpy && python tests/data/gguf/make_blocks.py

Q8_0 and Q4_0 blocks come from gguf's own quantize of random float32 rows; Q4_K and Q6_K,
which gguf-py dequantizes but cannot quantize, are random bytes with their float16 scale
fields set to random finite values (every byte pattern of the rest is a valid block). Values
are stored as float32 bit patterns, so the comparison is bit for bit.
"""

import importlib.metadata
import json
import pathlib

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import quants

rng = np.random.default_rng(20261127)


def random_scales(count: int, low: float, high: float) -> np.ndarray:
    """float16 scales, random sign for d-like fields where allowed, as little-endian bytes."""
    return rng.uniform(low, high, count).astype(np.float16)


def blocks_of(kind: Q) -> np.ndarray:
    block, size = gguf.GGML_QUANT_SIZES[kind]
    if kind in (Q.Q8_0, Q.Q4_0):
        rows = rng.standard_normal((4, 2 * block)).astype(np.float32)
        rows[1] *= 1e-3  # small and large scales
        rows[2] *= 300.0
        packed = quants.quantize(rows, kind)
        return packed.reshape(-1, size)
    count = 6
    raw = rng.integers(0, 256, (count, size), dtype=np.uint8)
    if kind == Q.Q4_K:  # half d, half dmin at the front
        raw[:, 0:2] = random_scales(count, -2.0, 2.0).view(np.uint8).reshape(count, 2)
        raw[:, 2:4] = random_scales(count, -0.5, 0.5).view(np.uint8).reshape(count, 2)
    else:  # Q6_K: half d at the end
        raw[:, size - 2:] = random_scales(count, -0.05, 0.05).view(np.uint8).reshape(count, 2)
    return raw


out = {"gguf_version": importlib.metadata.version("gguf")}
for kind in (Q.Q8_0, Q.Q4_0, Q.Q4_K, Q.Q6_K):
    raw = blocks_of(kind)
    values = quants.dequantize(raw.reshape(-1), kind).astype(np.float32)
    out[kind.name] = {
        "blocks": raw.reshape(-1).tobytes().hex(),
        "values": values.reshape(-1).view(np.uint32).tolist(),
    }
pathlib.Path(__file__).with_name("blocks.json").write_text(json.dumps(out) + "\n")
