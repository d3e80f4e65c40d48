"""docs/numerics.md's rules to the bit, against references written from the rules (numpy's
float32 arithmetic is IEEE single precision, one rounding per operation; torch's conversions
round float32 to bfloat16 / float16 to nearest even):

- the cos/sin table: ``cos(p f_i) m`` and ``sin(p f_i) m`` in float64, rounded once to float32,
  for the scaled variants too (m != 1);
- apply_rope: ``a cos - b sin`` and ``a sin + b cos`` in float32, each product and the sum
  rounded, then one rounding to the output dtype.
The tolerance-based tests elsewhere would pass a float64 rotation or a float32 ``cos * m``;
these would not (each test shows its data tells them apart: the table for every scaled
variant, the rotation for float32 outputs; for 16-bit outputs the float32 steps and a float64
rotation round alike on this data, so those cases check the one narrowing)."""

import math

import numpy as np
import pytest

import embrope

torch = pytest.importorskip("torch")

SCALED = {
    "none": dict(),
    "yarn": dict(scaling="yarn", factor=4.0, original_max_positions=2048),
    "longrope": dict(scaling="longrope", factor=4.0, original_max_positions=2048,
                     short_factor=[1.0 + 0.01 * i for i in range(32)],
                     long_factor=[1.0 + 0.25 * i for i in range(32)], sequence_length=9000),
    "llama3": dict(scaling="llama3", factor=8.0, original_max_positions=2048),
}


@pytest.mark.parametrize("variant", list(SCALED))
def test_table_values_are_the_float64_products_rounded_once(variant):
    cache = embrope.RopeCache(64, 9000, 10000.0, **SCALED[variant])
    m = cache.attention_factor
    assert (m != 1.0) == (variant in ("yarn", "longrope"))
    f = np.array(cache.inv_freq)
    table = np.array(cache.table)
    rng = np.random.default_rng(3)
    float32_product_differs = False
    for p in [0, 1, 2, 1000, 4095, 8999] + rng.integers(0, 9000, 40).tolist():
        angles = [float(p) * float(w) for w in f]  # float64 products
        want_cos = np.array([math.cos(a) * m for a in angles], np.float64).astype(np.float32)
        want_sin = np.array([math.sin(a) * m for a in angles], np.float64).astype(np.float32)
        np.testing.assert_array_equal(table[p, :32], want_cos, err_msg=f"cos at {p}")
        np.testing.assert_array_equal(table[p, 32:], want_sin, err_msg=f"sin at {p}")
        # cos rounded to float32, then times m in float32: two roundings, other bits
        twice = np.array([math.cos(a) for a in angles], np.float32) * np.float32(m)
        float32_product_differs |= not np.array_equal(twice, want_cos)
    assert float32_product_differs == (m != 1.0)  # the test tells the two orders apart


def _rotate_half_float32(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Pairs (i, i + R/2): a' = a cos - b sin, b' = a sin + b cos, each step in float32."""
    half = cos.shape[-1]
    a, b = x[..., :half], x[..., half:2 * half]
    out = x.copy()
    out[..., :half] = a * cos - b * sin  # float32 arrays: each product and the difference rounded
    out[..., half:2 * half] = a * sin + b * cos
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_rotation_is_float32_products_and_sum_then_one_rounding(dtype):
    rng = np.random.default_rng(4)
    tokens, heads, dim = 37, 3, 64
    cache = embrope.RopeCache(dim, 4096, 10000.0)
    table = np.array(cache.table)
    positions = rng.integers(0, 4096, tokens)
    q = torch.from_numpy(rng.standard_normal((tokens, heads, dim)).astype(np.float32))
    q = q.to(getattr(torch, dtype))
    widened = q.float().numpy()  # exact
    cos = table[positions, None, :dim // 2]
    sin = table[positions, None, dim // 2:]
    want = torch.from_numpy(_rotate_half_float32(widened, cos, sin)).to(q.dtype)
    got, _ = embrope.apply_rope(q, None, torch.from_numpy(positions), cache, inplace=False)
    assert torch.equal(got.view(torch.int16 if dtype != "float32" else torch.int32),
                       want.view(torch.int16 if dtype != "float32" else torch.int32))
    # A float64 rotation rounded once differs somewhere: the test can tell the two apart.
    exact = torch.from_numpy(_rotate_half_float32(widened.astype(np.float64), cos.astype(np.float64),
                                                  sin.astype(np.float64))).to(q.dtype)
    if dtype == "float32":
        assert not torch.equal(exact, want)
