"""Every op on NumPy arrays and torch tensors: dtypes, strided views, in and out of place,
and every error mapped to its exception. Expected values come from reference.py (float64,
from the formulas)."""

import os
import subprocess
import sys

import numpy as np
import pytest

import embrope
import reference as ref

torch = pytest.importorskip("torch")

DTYPES = ["float32", "float16", "bfloat16"]


def to_torch(x: np.ndarray, dtype: str):
    return torch.from_numpy(np.ascontiguousarray(x)).to(getattr(torch, dtype))


def as_f64(x) -> np.ndarray:
    """Any framework's array as a float64 NumPy copy."""
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64).numpy()
    return np.asarray(x).astype(np.float64)


def assert_close_rounded(actual, expected: np.ndarray, dtype: str, magnitude: np.ndarray):
    """float32 arithmetic then one rounding to `dtype`: within a few float32 ulps of the
    terms' `magnitude` (sum of absolute values) plus one ulp of the dtype at |expected|."""
    dtype_eps = {"float32": 0.0, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[dtype]
    bound = 4 * 2.0 ** -24 * magnitude + dtype_eps * np.abs(expected)
    err = np.abs(as_f64(actual) - expected)
    worst = np.argmax(err - bound)
    assert (err <= bound + 1e-30).all(), (
        f"{dtype}: error {err.flat[worst]:.3g} > bound {bound.flat[worst]:.3g}")


# ------------------------------------------------------------------------- RoPE ----

@pytest.mark.parametrize("layout", ["neox", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inplace", [True, False])
def test_apply_rope_torch_all_dtypes(layout, dtype, inplace, rng):
    T, Hq, Hk, D, R = 7, 4, 2, 64, 48  # GQA and partial rotary
    cache = embrope.RopeCache(R, 512, base=10000.0)
    q = rng.standard_normal((T, Hq, D)).astype(np.float32)
    k = rng.standard_normal((T, Hk, D)).astype(np.float32)
    positions = rng.integers(0, 512, T)
    qt, kt = to_torch(q, dtype), to_torch(k, dtype)
    q_in, k_in = qt.clone(), kt.clone()
    q_out, k_out = embrope.apply_rope(qt, kt, torch.from_numpy(positions), cache, layout=layout,
                                      inplace=inplace)
    assert isinstance(q_out, torch.Tensor) and q_out.dtype == qt.dtype
    assert (q_out is qt) == inplace and (k_out is kt) == inplace
    if not inplace:
        assert torch.equal(qt, q_in) and torch.equal(kt, k_in)  # inputs untouched
    for x_in, x_out in ((q_in, q_out), (k_in, k_out)):
        expected = ref.rope(as_f64(x_in), positions, cache.inv_freq, layout=layout)
        # float32 arithmetic, one rounding: a few float32 ulps of the pair's magnitude, plus
        # the dtype's own rounding.
        pair = np.abs(as_f64(x_in)).max()
        err = np.abs(as_f64(x_out) - expected)
        bound = 4 * 2.0 ** -24 * pair + {"float32": 0, "float16": 2.0 ** -11,
                                         "bfloat16": 2.0 ** -8}[dtype] * np.abs(expected)
        assert (err <= bound + 1e-12).all(), err.max()
        # dims past the rotary dim are copied exactly
        assert torch.equal(x_out[..., R:], x_in[..., R:])


def test_apply_rope_numpy_in_place_is_zero_copy(rng):
    cache = embrope.RopeCache(32, 64)
    q = rng.standard_normal((5, 3, 32)).astype(np.float32)
    positions = np.arange(5, dtype=np.int32)
    before = q.copy()
    address = q.__array_interface__["data"][0]
    q_out, k_out = embrope.apply_rope(q, None, positions, cache)
    assert q_out is q and k_out is None
    assert q.__array_interface__["data"][0] == address
    np.testing.assert_allclose(q, ref.rope(before, positions, cache.inv_freq), rtol=0, atol=2e-6)


def test_apply_rope_strided_views_of_a_fused_qkv_buffer(rng):
    T, Hq, Hk, D = 6, 4, 2, 32
    cache = embrope.RopeCache(D, 64)
    qkv = rng.standard_normal((T, (Hq + 2 * Hk) * D)).astype(np.float32)
    original = qkv.copy()
    q = qkv[:, : Hq * D].reshape(T, Hq, D)
    k = qkv[:, Hq * D:(Hq + Hk) * D].reshape(T, Hk, D)
    assert not q.flags.c_contiguous and np.shares_memory(q, qkv)
    positions = np.arange(10, 10 + T)
    embrope.apply_rope(q, k, positions, cache)
    np.testing.assert_allclose(qkv[:, : Hq * D].reshape(T, Hq, D),
                               ref.rope(original[:, : Hq * D].reshape(T, Hq, D), positions,
                                        cache.inv_freq), atol=2e-6, rtol=0)
    np.testing.assert_array_equal(qkv[:, (Hq + Hk) * D:], original[:, (Hq + Hk) * D:])  # v


def test_apply_rope_batched_positions_and_torch_strides(rng):
    B, S, H, D = 2, 5, 3, 16
    cache = embrope.RopeCache(D, 128)
    q = torch.randn(B, H, S, D).transpose(1, 2)  # [B, S, H, D] view with permuted strides
    positions = torch.randint(0, 128, (B, S))
    expected = ref.rope(as_f64(q), positions.numpy(), cache.inv_freq)
    embrope.apply_rope(q, None, positions, cache)
    np.testing.assert_allclose(as_f64(q), expected, atol=2e-6, rtol=0)


def test_vllm_cos_sin_cache_and_cos_sin_pair_match_the_cache(rng):
    cache = embrope.RopeCache(64, 256, scaling="linear", factor=2.0)
    q = rng.standard_normal((9, 2, 64)).astype(np.float32)
    positions = rng.integers(0, 256, 9)
    by_cache = embrope.apply_rope(q, None, positions, cache, inplace=False)[0]
    cos_sin_cache = np.array(cache.cos_sin_cache)  # a caller-owned [P, R] table
    by_table = embrope.apply_rope(q, None, positions, cos_sin_cache, inplace=False)[0]
    by_pair = embrope.apply_rope(q, None, positions, (cache.cos, cache.sin), inplace=False)[0]
    np.testing.assert_array_equal(by_cache, by_table)
    np.testing.assert_array_equal(by_cache, by_pair)
    torch_table = torch.from_numpy(cos_sin_cache)
    by_torch = embrope.apply_rope(torch.from_numpy(q), None, torch.from_numpy(positions),
                                  torch_table, inplace=False)[0]
    np.testing.assert_array_equal(by_cache, by_torch.numpy())


def test_apply_rope_inverse_and_backward(rng):
    cache = embrope.RopeCache(32, 64)
    q = rng.standard_normal((4, 2, 32)).astype(np.float32)
    positions = np.array([0, 5, 17, 63])
    expected = ref.rope(q, positions, cache.inv_freq, inverse=True)
    inv, _ = embrope.apply_rope(q, None, positions, cache, inverse=True, inplace=False)
    np.testing.assert_allclose(inv, expected, atol=2e-6, rtol=0)
    # The gradient of RoPE is the transposed rotation: apply_rope_backward == inverse rotation
    grad, _ = embrope.apply_rope_backward(q, None, positions, cache, inplace=False)
    np.testing.assert_allclose(grad, expected, atol=2e-6, rtol=0)
    # and of an inverse forward, the forward rotation
    grad_inv, _ = embrope.apply_rope_backward(q, None, positions, cache, inverse=True,
                                              inplace=False)
    np.testing.assert_allclose(grad_inv, ref.rope(q, positions, cache.inv_freq), atol=2e-6,
                               rtol=0)


def test_apply_rope_mrope_sections(rng):
    cache = embrope.RopeCache(32, 64, mrope_section=(4, 6, 6))
    q = rng.standard_normal((5, 2, 32)).astype(np.float32)
    positions = rng.integers(0, 64, (3, 5))
    out, _ = embrope.apply_rope(q, None, positions, cache, inplace=False)
    np.testing.assert_allclose(out, ref.rope(q, positions, cache.inv_freq,
                                             mrope_section=(4, 6, 6)), atol=2e-6, rtol=0)


def test_rope_cache_arrays_and_properties():
    cache = embrope.RopeCache(16, 100, base=500.0, scaling="yarn", factor=4.0,
                              original_max_positions=25)
    inv, attention = ref.hf_inv_freq({"rope_type": "yarn", "rope_theta": 500.0, "factor": 4.0,
                                      "original_max_position_embeddings": 25}, 16, 100)
    np.testing.assert_allclose(cache.inv_freq, inv, rtol=1e-13)
    assert cache.attention_factor == pytest.approx(attention, rel=1e-14)
    assert cache.cos.shape == (100, 8) and cache.sin.shape == (100, 8)
    p = np.arange(100)[:, None]
    np.testing.assert_allclose(cache.cos, np.cos(p * inv) * attention, atol=2 ** -24 * 2, rtol=0)
    np.testing.assert_allclose(cache.sin, np.sin(p * inv) * attention, atol=2 ** -24 * 2, rtol=0)
    assert not cache.table.flags.writeable  # the shared table cannot be changed by accident
    assert cache.device == "cpu" and cache.rotary_dim == 16 and cache.max_positions == 100
    # config is a copy: changing it once grew the live cache's sizes past its table (rows
    # 100+ read from the heap, bad positions no longer refused).
    config = cache.config
    config.max_positions, config.rotary_dim = 400, 4
    assert cache.max_positions == 100 and cache.rotary_dim == 16
    assert cache.table.shape == (100, 16)
    with pytest.raises(embrope.BadIndexError, match=r"positions\[0\] = 150"):
        embrope.apply_rope(np.ones((1, 1, 16), np.float32), None, np.array([150]), cache)
    axial = embrope.RopeCache.axial([8, 8], 32, 100.0)
    axial.config.max_positions = 400
    axial._native.axes[0].rotary_dim = 2
    assert axial.max_positions == 32 and axial._native.axes[0].rotary_dim == 8
    freqs, factor = embrope.rope_frequencies(16, 500.0, scaling="yarn", factor=4.0,
                                             original_max_positions=25)
    np.testing.assert_array_equal(freqs, cache.inv_freq)
    assert factor == cache.attention_factor


def test_rope_cache_from_preset_and_hf_config(tmp_path):
    names = embrope.model_presets()
    assert "llama-3.1-8b" in names
    by_preset = embrope.RopeCache.from_preset("gpt-j-6b", max_positions=64)
    assert by_preset.layout == "interleaved" and by_preset.rotary_dim == 64
    import json
    import pathlib
    config = json.loads((pathlib.Path(__file__).parent.parent / "data" / "hf"
                         / "llama-3.1-8b-instruct.json").read_text())
    by_dict = embrope.RopeCache.from_hf_config(config, max_positions=64)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    by_path = embrope.RopeCache.from_hf_config(str(path), max_positions=64)
    by_dir = embrope.RopeCache.from_hf_config(tmp_path, max_positions=64)
    for cache in (by_path, by_dir):
        np.testing.assert_array_equal(cache.table, by_dict.table)
    assert by_dict.config.scaling == embrope._embrope.RopeScaling.llama3
    model = embrope.model_config_from_hf(config)
    assert model.head_dim == 128 and model.num_kv_heads == 8
    with pytest.raises(embrope.InvalidArgumentError, match="unknown|known"):
        embrope.model_preset("no-such-model")
    with pytest.raises(ValueError, match="rope_type"):
        embrope.model_config_from_hf(dict(config, rope_scaling={"rope_type": "fancy"}))


# ------------------------------------------------------------------------ embed ----

@pytest.mark.parametrize("dtype", DTYPES)
def test_embed_torch_all_dtypes_with_positions_and_types(dtype, rng):
    V, D, P, B, S = 50, 32, 20, 2, 6
    table = rng.standard_normal((V, D)).astype(np.float32)
    positions_table = rng.standard_normal((P, D)).astype(np.float32)
    types = rng.standard_normal((2, D)).astype(np.float32)
    ids = rng.integers(0, V, (B, S))
    type_ids = rng.integers(0, 2, (B, S))
    offsets = np.array([0, 7])
    tt, pt, yt = to_torch(table, dtype), to_torch(positions_table, dtype), to_torch(types, dtype)
    out = embrope.embed(tt, torch.from_numpy(ids), scale=2.0, position_table=pt,
                        position_offsets=torch.from_numpy(offsets), type_table=yt,
                        type_ids=torch.from_numpy(type_ids))
    assert isinstance(out, torch.Tensor) and out.dtype == tt.dtype and out.shape == (B, S, D)
    rows = as_f64(pt)[offsets[:, None] + np.arange(S)]
    expected = ref.embed(as_f64(tt), ids, scale=2.0, position_rows=rows, type_table=as_f64(yt),
                         type_ids=type_ids)
    magnitude = ref.embed(np.abs(as_f64(tt)), ids, scale=2.0, position_rows=np.abs(rows),
                          type_table=np.abs(as_f64(yt)), type_ids=type_ids)
    assert_close_rounded(out, expected, dtype, magnitude)


@pytest.mark.parametrize("layout", ["interleaved", "split"])
def test_embed_numpy_sinusoidal(layout, rng):
    table = rng.standard_normal((30, 16)).astype(np.float32)
    ids = rng.integers(0, 30, 9)
    position_ids = rng.integers(0, 5000, 9)
    out = embrope.embed(table, ids, positions="sinusoidal", sinusoid_layout=layout,
                        position_ids=position_ids)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    expected = table[ids].astype(np.float64) + ref.sinusoid(position_ids, 16, layout=layout)
    np.testing.assert_allclose(out, expected, atol=4e-6, rtol=0)


@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
def test_embed_numpy_with_a_norm_and_its_pre_norm_output(norm, rng):
    D = 96
    table = rng.standard_normal((30, D)).astype(np.float32)
    ids = rng.integers(0, 30, (2, 7))
    weight = rng.standard_normal(D).astype(np.float32)
    bias = rng.standard_normal(D).astype(np.float32) if norm == "layer_norm" else None
    out, pre = embrope.embed(table, ids, scale=2.0, positions="sinusoidal", norm=norm,
                             norm_weight=weight, norm_bias=bias, norm_eps=0.25,
                             return_pre_norm=True)
    assert out.dtype == np.float32 and pre.shape == (2, 7, D)
    x = 2.0 * table[ids].astype(np.float64) + ref.sinusoid(np.arange(7), D)[None]
    np.testing.assert_allclose(pre, x, atol=1e-5, rtol=0)
    centred = x - x.mean(-1, keepdims=True) if norm == "layer_norm" else x
    y = centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + 0.25) * weight
    if bias is not None:
        y = y + bias
    np.testing.assert_allclose(out, y, atol=2e-5, rtol=0)
    with pytest.raises(embrope.InvalidArgumentError, match="norm_bias"):
        embrope.embed(table, ids, norm="rms_norm", norm_bias=weight)
    with pytest.raises(embrope.InvalidArgumentError, match="norm"):
        embrope.embed(table, ids, norm="batch_norm")
    with pytest.raises(embrope.InvalidArgumentError, match="return_pre_norm"):
        embrope.embed(table, ids, return_pre_norm=True)


def test_embed_into_given_out_and_strided_ids(rng):
    table = rng.standard_normal((40, 8)).astype(np.float32)
    ids = rng.integers(0, 40, (4, 6))[:, ::2]  # strided ids
    out = np.full((4, 3, 8), np.nan, dtype=np.float32)
    result = embrope.embed(table, ids, out=out)
    assert result is out
    np.testing.assert_array_equal(out, table[ids])


def test_embed_vocab_shards_sum_to_the_full_lookup(rng):
    table = rng.standard_normal((20, 8)).astype(np.float32)
    ids = rng.integers(0, 20, 11)
    total = sum(embrope.embed(table[start:start + 5], ids, vocab_start=start, vocab_shard=True)
                for start in range(0, 20, 5))
    np.testing.assert_array_equal(total, table[ids])


def test_embed_backward_accumulates_all_three_gradients(rng):
    V, D, P = 12, 8, 10
    ids = rng.integers(0, V, (2, 5))
    type_ids = rng.integers(0, 3, (2, 5))
    grad_out = rng.standard_normal((2, 5, D)).astype(np.float32)
    grad_table = np.ones((V, D), np.float32)
    grad_positions = np.zeros((P, D), np.float32)
    grad_types = np.zeros((3, D), np.float32)
    embrope.embed_backward(grad_out, ids, grad_table, scale=0.5, padding_idx=int(ids[0, 0]),
                           grad_position_table=grad_positions, grad_type_table=grad_types,
                           type_ids=type_ids)
    expected_table = np.ones((V, D))
    expected_positions = np.zeros((P, D))
    expected_types = np.zeros((3, D))
    for b in range(2):
        for s in range(5):
            g = grad_out[b, s].astype(np.float64)
            if ids[b, s] != ids[0, 0]:
                expected_table[ids[b, s]] += 0.5 * g
            expected_positions[s] += g
            expected_types[type_ids[b, s]] += g
    np.testing.assert_allclose(grad_table, expected_table, atol=1e-5, rtol=0)
    np.testing.assert_allclose(grad_positions, expected_positions, atol=1e-5, rtol=0)
    np.testing.assert_allclose(grad_types, expected_types, atol=1e-5, rtol=0)
    assert embrope.embed_backward_workspace_size(grad_out, ids, grad_table) == 0  # CPU


# ------------------------------------------------------------ packed positions ----

@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_packed_positions(framework):
    cu = np.array([0, 3, 3, 7], dtype=np.int64)
    offsets = np.array([10, 0, 100], dtype=np.int64)
    if framework == "torch":
        cu, offsets = torch.from_numpy(cu), torch.from_numpy(offsets)
    positions = embrope.packed_positions(cu, start_offsets=offsets)
    assert type(positions) is type(cu)
    assert list(np.asarray(positions)) == [10, 11, 12, 100, 101, 102, 103]
    given = np.full(7, -5, dtype=np.int32)
    embrope.packed_positions(np.array([0, 2, 7], dtype=np.int32), given)
    assert list(given) == [0, 1, 0, 1, 2, 3, 4]
    with pytest.raises(embrope.BadIndexError, match="cu_seqlens"):
        embrope.packed_positions(np.array([0, 4, 2], dtype=np.int64), np.zeros(2, np.int64))


# ---------------------------------------------------------------- deferred status ----

def test_deferred_status_collects_instead_of_raising(rng):
    cache = embrope.RopeCache(8, 16)
    status = embrope.DeferredStatus()
    q = rng.standard_normal((3, 1, 8)).astype(np.float32)
    embrope.apply_rope(q, None, np.array([1, 99, 2]), cache, deferred=status)
    assert np.all(q[1] == 0) and np.any(q[0] != 0)  # the bad token zero-filled, others written
    assert not status.ok()
    with pytest.raises(embrope.BadIndexError, match=r"positions\[1\] = 99"):
        status.check()
    assert status.ok()  # check() cleared it
    table = np.ones((4, 2), np.float32)
    embrope.embed(table, np.array([0, 7]), deferred=status)
    with pytest.raises(IndexError, match="ids"):
        status.check()


# ------------------------------------------------------------------------ errors ----

def test_errors_are_exceptions_of_the_right_class(rng):
    cache = embrope.RopeCache(8, 16)
    q = np.zeros((2, 1, 8), np.float32)
    assert issubclass(embrope.InvalidArgumentError, ValueError)
    assert issubclass(embrope.BadIndexError, IndexError)
    assert issubclass(embrope.NotAvailableError, NotImplementedError)
    assert issubclass(embrope.OutOfMemoryError, MemoryError)
    assert issubclass(embrope.CudaError, RuntimeError)
    with pytest.raises(ValueError, match="apply_rope: rotary_dim 6") as info:
        embrope.apply_rope(q, None, np.arange(2), cache, rotary_dim=6)
    assert isinstance(info.value, embrope.Error) and info.value.code == "invalid_argument"
    with pytest.raises(ValueError, match="apply_rope: q .*float64"):
        embrope.apply_rope(q.astype(np.float64), None, np.arange(2), cache)
    with pytest.raises(ValueError, match="positions"):
        embrope.apply_rope(q, None, np.arange(2, dtype=np.float32), cache)
    with pytest.raises(ValueError, match="stride"):
        embrope.apply_rope(np.zeros((2, 1, 16), np.float32)[..., ::2], None, np.arange(2),
                           cache)
    with pytest.raises(IndexError, match=r"apply_rope: positions\[1\] = -1"):
        embrope.apply_rope(q, None, np.array([0, -1]), cache)
    with pytest.raises(IndexError, match=r"embed: ids\[2\] = 5"):
        embrope.embed(np.ones((5, 2), np.float32), np.array([0, 1, 5]))
    with pytest.raises(ValueError, match="embed_backward"):
        embrope.embed_backward(np.ones((3, 2), np.float32), np.arange(3))  # no gradient given
    with pytest.raises(TypeError, match="apply_rope: q must be an array"):
        embrope.apply_rope([[0.0]], None, np.arange(2), cache)
    with pytest.raises(TypeError, match="cache must be"):
        embrope.apply_rope(q, None, np.arange(2), "cache")
    with pytest.raises(ValueError, match="cos_sin_cache has shape"):
        embrope.apply_rope(q, None, np.arange(2), np.zeros((4, 3), np.float32))
    with pytest.raises(ValueError, match="layout 'gptj'"):
        embrope.apply_rope(q, None, np.arange(2), cache, layout="gptj")
    read_only = np.zeros((2, 1, 8), np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="q is read-only"):
        embrope.apply_rope(read_only, None, np.arange(2), cache)
    embrope.apply_rope(read_only, None, np.arange(2), cache, inplace=False)  # reading is fine
    with pytest.raises(ValueError, match="RopeCache: .*rotary_dim"):
        embrope.RopeCache(7, 16)
    with pytest.raises(ValueError, match="factor"):
        embrope.RopeCache(8, 16, factor=2.0)  # a field the variant ignores
    with pytest.raises(ValueError, match="scaling 'ntk'"):
        embrope.RopeCache(8, 16, scaling="ntk")
    with pytest.raises(ValueError, match="device 'tpu'"):
        embrope.RopeCache(8, 16, device="tpu")


@pytest.mark.skipif(embrope.cuda_device_count() > 0, reason="this machine has a usable GPU")
def test_cuda_without_a_gpu_is_a_clear_error():
    with pytest.raises((NotImplementedError, RuntimeError), match="RopeCache|CUDA|cuda"):
        embrope.RopeCache(8, 16, device="cuda")
    with pytest.raises((NotImplementedError, RuntimeError)):
        embrope.DeferredStatus("cuda:0")


# ------------------------------------------------- every op, framework and dtype ----

FRAMEWORKS = [("numpy", "float32"), ("numpy", "float16"), ("torch", "float32"),
              ("torch", "float16"), ("torch", "bfloat16"), ("jax", "float32"),
              ("jax", "bfloat16")]


def make(framework: str, x: np.ndarray, dtype: str = None):
    if framework == "numpy":
        return x.astype(dtype) if dtype else x.copy()
    if framework == "torch":
        return to_torch(x, dtype) if dtype else torch.from_numpy(x.copy())
    import jax.numpy as jnp
    return jnp.asarray(x, dtype=dtype) if dtype else jnp.asarray(x)


def framework_of(x) -> str:
    return type(x).__module__.split(".")[0].replace("jaxlib", "jax")


@pytest.mark.parametrize("framework,dtype", FRAMEWORKS)
def test_every_op_in_every_framework_and_dtype(framework, dtype, rng):
    if framework == "jax":
        pytest.importorskip("jax")  # under CI=true its absence fails (conftest.py)
    eps = {"float32": 0.0, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[dtype]
    cache = embrope.RopeCache(32, 64)
    q64 = rng.standard_normal((5, 2, 32))
    positions = np.array([0, 3, 9, 40, 63])
    q = make(framework, q64.astype(np.float32), dtype)
    q_in = as_f64(q)

    def check(result, expected, magnitude):
        assert framework_of(result) == framework
        assert str(result.dtype) in (dtype, f"torch.{dtype}")
        err = np.abs(as_f64(result) - expected)
        assert np.all(err <= 4 * 2.0 ** -24 * magnitude + eps * np.abs(expected) + 1e-30)

    pos = make(framework, positions)
    rotated, _ = embrope.apply_rope(q, None, pos, cache, inplace=False)
    check(rotated, ref.rope(q_in, positions, cache.inv_freq), 2 * np.abs(q_in).max())
    grad, _ = embrope.apply_rope_backward(q, None, pos, cache, inplace=False)
    check(grad, ref.rope(q_in, positions, cache.inv_freq, inverse=True),
          2 * np.abs(q_in).max())
    if framework == "jax":
        with pytest.raises(embrope.InvalidArgumentError, match="immutable"):
            embrope.apply_rope(q, None, pos, cache)
    else:
        same, _ = embrope.apply_rope(q, None, pos, cache)
        assert same is q
        check(q, ref.rope(q_in, positions, cache.inv_freq), 2 * np.abs(q_in).max())

    table64 = rng.standard_normal((10, 8))
    table = make(framework, table64.astype(np.float32), dtype)
    table_in = as_f64(table)
    ids = np.array([[1, 9, 9], [0, 4, 2]])
    out = embrope.embed(table, make(framework, ids), scale=0.5)
    check(out, 0.5 * table_in[ids], np.abs(0.5 * table_in[ids]))
    # Both allocated outputs of a norm (a JAX bfloat16 pre-norm output raised AttributeError),
    # and a quantized table's dequantized rows (handed back as a bare view).
    normed, pre = embrope.embed(table, make(framework, ids), norm="rms_norm",
                                return_pre_norm=True)
    rows = as_f64(pre)
    check(pre, table_in[ids], np.abs(table_in[ids]))
    rms = rows / np.sqrt(np.mean(rows ** 2, axis=-1, keepdims=True) + 1e-5)
    check(normed, rms, 4 * np.abs(rms))
    codes = make(framework, rng.integers(-128, 128, (10, 8)).astype(np.int8))
    scales = make(framework, rng.uniform(0.5, 1.0, (10, 1)).astype(np.float32), dtype)
    quantized = embrope.QuantizedTable("int8", codes, scales=scales)
    want = np.asarray(codes).astype(np.float64) * as_f64(scales)
    check(quantized.dequantize(), want, np.abs(want))

    grad_out = make(framework, rng.standard_normal((2, 3, 8)).astype(np.float32), dtype)
    go = as_f64(grad_out)
    if framework == "jax":
        with pytest.raises(embrope.InvalidArgumentError, match="immutable"):
            embrope.embed_backward(grad_out, make(framework, ids),
                                   make(framework, np.zeros((10, 8), np.float32)))
    else:
        grad_table = make(framework, np.zeros((10, 8), np.float32))
        embrope.embed_backward(grad_out, make(framework, ids), grad_table)
        expected = np.zeros((10, 8))
        np.add.at(expected, ids.reshape(-1), go.reshape(-1, 8))
        np.testing.assert_allclose(as_f64(grad_table), expected, atol=1e-5, rtol=0)

    cu = make(framework, np.array([0, 2, 5], dtype=np.int64))
    packed = embrope.packed_positions(cu)
    assert framework_of(packed) == framework
    assert np.asarray(packed).tolist() == [0, 1, 0, 1, 2]


def test_cpu_isa_names_the_instruction_set():
    assert embrope.cpu_isa() in ("avx512_bf16", "avx512", "avx2", "portable")


def run_with_cpu_isa(cap, code):
    env = dict(os.environ, EMBROPE_CPU_ISA=cap)
    return subprocess.run([sys.executable, "-c", "import embrope\n" + code], env=env,
                          capture_output=True, text=True, timeout=120)


def test_cpu_isa_cap_never_widens_the_choice():
    widest = embrope.cpu_isa()
    order = ["portable", "avx2", "avx512", "avx512_bf16"]
    for cap in order:
        got = run_with_cpu_isa(cap, "print(embrope.cpu_isa())")
        assert got.returncode == 0, got.stderr
        want = order[min(order.index(cap), order.index(widest))]
        assert got.stdout.strip() == want


def test_an_unknown_cpu_isa_cap_is_an_error_naming_the_choices():
    got = run_with_cpu_isa("avx1024", "embrope.cpu_isa()")
    assert got.returncode != 0
    assert "EMBROPE_CPU_ISA is 'avx1024'" in got.stderr
    assert "portable, avx2, avx512 or avx512_bf16" in got.stderr


def test_an_unknown_cpu_isa_cap_is_each_ops_error_not_an_abort():
    # The KV-cache appends chose the instruction set inside their thread team, where the error
    # terminated the process (exit 134) instead of raising.
    code = (
        "import numpy as np\n"
        "T, H, D = 256, 8, 128\n"
        "cache = embrope.RopeCache(D, 512)\n"
        "q, k, v = (np.ones((T, H, D), np.float32) for _ in range(3))\n"
        "kc, vc, pos = np.zeros((T, 1, H, D), np.float32), np.zeros((T, 1, H, D), np.float32), "
        "np.arange(T)\n"
        "calls = {\n"
        "    'apply_rope': lambda: embrope.apply_rope(q, k, pos, cache),\n"
        "    'apply_rope_append_kv': lambda: embrope.apply_rope_append_kv(\n"
        "        q, k, v, pos, cache, k_cache=kc, v_cache=vc, slot_mapping=pos),\n"
        "    'apply_qk_norm_rope_append_kv': lambda: embrope.apply_qk_norm_rope_append_kv(\n"
        "        q, k, v, pos, cache, k_cache=kc, v_cache=vc, slot_mapping=pos),\n"
        "    'embed': lambda: embrope.embed(np.ones((300, D), np.float32), pos),\n"
        "}\n"
        "for name, call in calls.items():\n"
        "    try:\n"
        "        call()\n"
        "    except embrope.InvalidArgumentError as error:\n"
        "        print(name, \"EMBROPE_CPU_ISA is 'avx1024'\" in str(error))\n")
    got = run_with_cpu_isa("avx1024", code)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split("\n")[:-1] == [
        "apply_rope True", "apply_rope_append_kv True", "apply_qk_norm_rope_append_kv True",
        "embed True"]


def test_a_table_too_large_to_hold_is_a_memory_error():
    with pytest.raises(MemoryError, match="RopeCache") as info:
        embrope.RopeCache(2, 2 ** 44)
    assert isinstance(info.value, embrope.OutOfMemoryError) and info.value.code == "out_of_memory"


def test_an_output_too_large_to_allocate_is_embropes_memory_error():
    # ids expanded without memory of their own: the [2^34, 4096] output cannot be allocated.
    import embrope.torch as et

    table = torch.zeros(10, 4096)
    ids = torch.zeros(1, dtype=torch.int64).expand(1 << 34)
    for embed in (embrope.embed, et.embed):
        with pytest.raises(embrope.OutOfMemoryError,
                           match=r"embed: cannot allocate an output of shape \[17179869184, "
                                 r"4096\] and dtype torch.float32"):
            embed(table, ids)
    with pytest.raises(embrope.OutOfMemoryError, match=r"embed: cannot allocate an output"):
        embrope.embed(np.zeros((10, 4096), np.float32), np.broadcast_to(np.int64(0), (1 << 34,)))
    q = torch.zeros(1, 1, 8).expand(1 << 40, 1, 8)
    with pytest.raises(embrope.OutOfMemoryError, match=r"apply_rope: cannot allocate"):
        et.apply_rope(q, None, torch.zeros(1, dtype=torch.int64).expand(1 << 40),
                      embrope.RopeCache(8, 4))


def test_zero_size_numpy_calls_are_no_ops():
    # NumPy reports every stride of an empty array as 0; the calls have nothing to do.
    cache = embrope.RopeCache(8, 16)
    for tokens, heads in ((0, 2), (3, 0)):
        q = np.zeros((tokens, heads, 8), np.float32)
        k = np.zeros((tokens, heads, 8), np.float32)
        positions = np.zeros(tokens, np.int64)
        q_out, k_out = embrope.apply_rope(q, k, positions, cache, inplace=False)
        assert q_out.shape == q.shape and k_out.shape == k.shape
        embrope.apply_rope(q, k, positions, cache)
        embrope.apply_rope_backward(q, k, positions, cache)
        embrope.apply_qk_norm_rope(q, k, positions, cache)
    table = np.ones((10, 8), np.float32)
    out = embrope.embed(table, np.zeros((2, 0), np.int64))
    assert out.shape == (2, 0, 8)
    out, pre = embrope.embed(table, np.zeros((0,), np.int32), norm="rms_norm",
                             return_pre_norm=True)
    assert out.shape == pre.shape == (0, 8)
    grad = np.zeros((10, 8), np.float32)
    embrope.embed_backward(np.zeros((2, 0, 8), np.float32), np.zeros((2, 0), np.int64), grad)
    assert not grad.any()
    positions = embrope.packed_positions(np.zeros(1, np.int64))
    assert positions.shape == (0,)
    k_cache = np.zeros((2, 4, 1, 8), np.float32)
    embrope.apply_rope_append_kv(
        np.zeros((0, 2, 8), np.float32), np.zeros((0, 1, 8), np.float32),
        np.zeros((0, 1, 8), np.float32), np.zeros(0, np.int64), cache, k_cache=k_cache,
        v_cache=k_cache.copy(), slot_mapping=np.zeros(0, np.int64))
    assert not k_cache.any()


def test_a_dtype_embrope_lacks_is_named_with_what_the_argument_accepts():
    cache = embrope.RopeCache(8, 16)
    with pytest.raises(embrope.InvalidArgumentError,
                       match=r"apply_rope: q has dtype float64 .*; it must be float32, float16 "
                             r"or bfloat16 with one lane$"):
        embrope.apply_rope(np.zeros((2, 1, 8)), None, np.arange(2), cache)
    with pytest.raises(embrope.InvalidArgumentError,
                       match=r"apply_rope: positions has dtype float64 .*; it must be int32 or "
                             r"int64 with one lane$"):
        embrope.apply_rope(np.zeros((2, 1, 8), np.float32), None, np.arange(2.0), cache)
    with pytest.raises(embrope.InvalidArgumentError,
                       match=r"embed: table has dtype float64 .*; it must be float32, float16 "
                             r"or bfloat16 with one lane$"):
        embrope.embed(np.zeros((4, 8)), np.arange(2))
    k_cache = torch.zeros(2, 4, 1, 8, dtype=torch.float64)
    with pytest.raises(embrope.InvalidArgumentError,
                       match=r"k_cache has dtype float64 .*; it must be float32, float16, "
                             r"bfloat16, float8_e4m3fn or float8_e5m2 with one lane$"):
        embrope.apply_rope_append_kv(
            torch.zeros(1, 1, 8), torch.zeros(1, 1, 8), torch.zeros(1, 1, 8), torch.arange(1),
            cache, k_cache=k_cache, v_cache=k_cache.float(), slot_mapping=torch.arange(1))


def test_numpy_bfloat16_arrays_of_ml_dtypes(rng):
    """ml_dtypes.bfloat16 arrays (JAX's host bfloat16) are read and written in place, strided
    views too: the same bits as the op on torch bfloat16 tensors of the same values, within
    bfloat16 rounding of the float64 reference."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = ml_dtypes.bfloat16
    cache = embrope.RopeCache(16, 64)
    wide = rng.standard_normal((5, 3, 24)).astype(bf16)
    q = wide[:, :, :16]  # a strided view
    positions = rng.integers(0, 64, 5)
    by_torch, _ = embrope.apply_rope(torch.from_numpy(q.view(np.uint16).copy()).view(
        torch.bfloat16), None, torch.from_numpy(positions), cache, inplace=False)
    out, _ = embrope.apply_rope(q, None, positions, cache, inplace=False)
    assert out.dtype == bf16 and out.shape == q.shape
    np.testing.assert_array_equal(out.view(np.uint16),
                                  by_torch.view(torch.int16).numpy().view(np.uint16))
    expected = ref.rope(q.astype(np.float64), positions, cache.inv_freq)
    np.testing.assert_allclose(out.astype(np.float64), expected, atol=2e-2, rtol=2 ** -7)
    embrope.apply_rope(q, None, positions, cache)  # in place, through the view
    np.testing.assert_array_equal(q.view(np.uint16), out.view(np.uint16))
    table = rng.standard_normal((10, 8)).astype(bf16)
    rows = embrope.embed(table, np.array([3, 1]))
    assert rows.dtype == bf16
    np.testing.assert_array_equal(rows.view(np.uint16), table[[3, 1]].view(np.uint16))


def test_numpy_arrays_in_the_other_byte_order_are_a_clear_error():
    cache = embrope.RopeCache(8, 4)
    q = np.zeros((2, 1, 8), ">f4" if np.little_endian else "<f4")
    with pytest.raises(embrope.InvalidArgumentError,
                       match=r"apply_rope: q has dtype .f4, in the byte order opposite to this "
                             r"machine's; convert it first"):
        embrope.apply_rope(q, None, np.arange(2), cache)
