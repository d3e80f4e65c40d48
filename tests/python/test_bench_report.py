"""The benchmark report's PyTorch eager peers compute what they stand for: its GGUF
dequantizer (benchmarks/report.py's gguf_dequantize, the eager column of the Q8_0, Q4_K and Q6_K
lookups) gives the gguf package's values for llama.cpp's blocks."""

import pathlib
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import report  # noqa: E402

QTYPES = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_k": gguf.GGMLQuantizationType.Q4_K,
          "q6_k": gguf.GGMLQuantizationType.Q6_K}
# Where each format keeps its float16 factors (byte offsets in a block): d for Q8_0 and Q6_K,
# d and dmin for Q4_K.
HALVES = {"q8_0": (0,), "q4_k": (0, 2), "q6_k": (208,)}


@pytest.mark.parametrize("fmt", sorted(QTYPES))
def test_gguf_dequantize_matches_the_gguf_package(fmt):
    values, block_bytes = report.GGUF_BLOCKS[fmt]
    assert gguf.GGML_QUANT_SIZES[QTYPES[fmt]] == (values, block_bytes)
    rng = np.random.default_rng(7)
    blocks = rng.integers(0, 256, size=(64, block_bytes), dtype=np.uint8)
    for offset in HALVES[fmt]:  # finite factors of both signs, every other bit random
        factors = (rng.standard_normal(64) * 0.01).astype(np.float16)
        blocks[:, offset:offset + 2] = factors.view(np.uint8).reshape(64, 2)
    want = gguf.quants.dequantize(blocks.reshape(-1), QTYPES[fmt]).reshape(64, values)
    got = report.gguf_dequantize(torch, fmt, torch.from_numpy(blocks)).numpy()
    np.testing.assert_array_equal(got, want.astype(np.float32))
