"""apply_qk_norm_rope_append_kv (per-head RMSNorm, RoPE and the KV-cache write in one pass)
from Python: against HF transformers' own Qwen3 code (Qwen3RMSNorm, then
apply_rotary_pos_emb) followed by a cache write written from vLLM's reshape_and_cache_flash
semantics, against a float64 numpy reference (Gemma's 1 + w, HND and contiguous caches),
float8 caches against PyTorch's own float8 conversion, the torch custom op under
torch.compile, and the errors."""

import numpy as np
import pytest

import embrope

torch = pytest.importorskip("torch")

import embrope.torch as et  # noqa: E402


def reference(x, w, eps, positions, cache, unit_offset=False):
    """float64: x / sqrt(mean(x^2) + eps) * w, then the neox rotation of the first R."""
    x = x.astype(np.float64)
    f = np.ones(x.shape[-1]) if w is None else w.astype(np.float64) + (1.0 if unit_offset else 0)
    n = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * f
    table = np.asarray(cache.table, np.float64)
    half = table.shape[1] // 2
    cos = table[positions, :half][:, None, :]
    sin = table[positions, half:][:, None, :]
    out = n.copy()
    a, b = n[..., :half], n[..., half:2 * half]
    out[..., :half] = a * cos - b * sin
    out[..., half:2 * half] = a * sin + b * cos
    return out


def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, k_scale=1.0,
                            v_scale=1.0):
    """vLLM's reshape_and_cache_flash (csrc/cache_kernels.cu) as its kernel defines it: for
    token t with slot_mapping[t] >= 0, block = slot // block_size, offset = slot % block_size,
    key_cache[block, offset] = key[t] and value_cache[block, offset] = value[t] ([num_blocks,
    block_size, num_heads, head_size]); a float8 cache stores value / scale."""
    block_size = key_cache.shape[1]
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        block, offset = divmod(slot, block_size)
        for cache, x, scale in ((key_cache, key[t], k_scale), (value_cache, value[t], v_scale)):
            if cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
                cache[block, offset] = (x.float() / torch.tensor(scale)).to(cache.dtype)
            else:
                cache[block, offset] = x.to(cache.dtype)


def test_qwen3_layer_as_hf_then_vllm_cache():
    """A Qwen3 attention layer's q_norm / k_norm and rotation (HF's modules, float32) and
    vLLM's cache write give what the fused call gives."""
    qwen3 = pytest.importorskip("transformers.models.qwen3.modeling_qwen3")
    T, Hq, Hk, D, blocks, block = 11, 8, 2, 128, 3, 8
    eps = 1e-6
    g = torch.Generator().manual_seed(0)
    q = torch.randn(T, Hq, D, generator=g)
    k = torch.randn(T, Hk, D, generator=g)
    v = torch.randn(T, Hk, D, generator=g)
    positions = torch.randint(0, 4096, (T,), generator=g)
    slots = torch.tensor([3, 17, -1, 0, 9, 22, 5, -1, 12, 1, 20])
    q_norm, k_norm = qwen3.Qwen3RMSNorm(D, eps), qwen3.Qwen3RMSNorm(D, eps)
    with torch.no_grad():
        q_norm.weight.copy_(1 + 0.2 * torch.randn(D, generator=g))
        k_norm.weight.copy_(1 + 0.2 * torch.randn(D, generator=g))
        cache = embrope.RopeCache(D, 4096, base=1e6)
        # HF's rotation with float64-exact cos/sin (HF's own float32 angles drift at 4K).
        inv = torch.from_numpy(np.asarray(cache.inv_freq)).double()
        angle = positions.double()[:, None] * inv[None, :]
        emb = torch.cat((angle, angle), -1)
        cos, sin = emb.cos().float(), emb.sin().float()  # [T, D]: unsqueezed to [T, 1, D]
        hq, hk = qwen3.apply_rotary_pos_emb(q_norm(q), k_norm(k), cos, sin, unsqueeze_dim=1)
        want_k_cache = torch.full((blocks, block, Hk, D), float("nan"))
        want_v_cache = want_k_cache.clone()
        reshape_and_cache_flash(hk, v, want_k_cache, want_v_cache, slots)

        k_cache = torch.full((blocks, block, Hk, D), float("nan"))
        v_cache = k_cache.clone()
        q_fused = q.clone()
        q_res, k_res = embrope.apply_qk_norm_rope_append_kv(
            q_fused, k, v, positions, cache, q_weight=q_norm.weight, k_weight=k_norm.weight,
            eps=eps, k_cache=k_cache, v_cache=v_cache, slot_mapping=slots)
    assert q_res is q_fused and k_res is None
    torch.testing.assert_close(q_fused, hq, rtol=0, atol=2e-5)
    torch.testing.assert_close(k_cache, want_k_cache, rtol=0, atol=2e-5, equal_nan=True)
    assert torch.equal(v_cache.nan_to_num(7.0), want_v_cache.nan_to_num(7.0))  # copied as is


@pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_torch_float8_cache_is_apply_qk_norm_rope_then_torch_conversion(fp8, dtype):
    """The fused call's bytes are apply_qk_norm_rope's (q, and k before the cache) followed by
    PyTorch's own float8 conversion of k / k_scale and v / v_scale."""
    T, Hq, Hk, D, blocks, block = 12, 4, 2, 64, 2, 16
    tdt, cdt = getattr(torch, dtype), getattr(torch, fp8)
    g = torch.Generator().manual_seed(1)
    cache = embrope.RopeCache(D, 64)
    q = torch.randn(T, Hq, D, generator=g).to(tdt)
    k = (3 * torch.randn(T, Hk, D, generator=g)).to(tdt)
    v = (4 * torch.randn(T, Hk, D, generator=g)).to(tdt)
    wq = (1 + 0.3 * torch.randn(D, generator=g)).to(tdt)
    wk = (1 + 0.3 * torch.randn(D, generator=g)).to(tdt)
    positions = torch.randint(0, 64, (T,), generator=g)
    slots = torch.randperm(blocks * block, generator=g)[:T]
    k_scale, v_scale = 0.05, 0.3
    k_cache = torch.zeros(blocks, block, Hk, D, dtype=cdt)
    v_cache = torch.zeros(blocks, block, Hk, D, dtype=cdt)
    q_fused = q.clone()
    embrope.apply_qk_norm_rope_append_kv(q_fused, k, v, positions, cache, q_weight=wq,
                                         k_weight=wk, k_cache=k_cache, v_cache=v_cache,
                                         slot_mapping=slots, k_scale=k_scale, v_scale=v_scale)
    q_n, k_n = embrope.apply_qk_norm_rope(q.clone(), k.clone(), positions, cache, q_weight=wq,
                                          k_weight=wk)
    assert torch.equal(q_fused, q_n)
    want_k = torch.zeros_like(k_cache)
    want_v = torch.zeros_like(v_cache)
    reshape_and_cache_flash(k_n, v, want_k, want_v, slots, k_scale, v_scale)
    assert torch.equal(k_cache.view(torch.uint8), want_k.view(torch.uint8))
    assert torch.equal(v_cache.view(torch.uint8), want_v.view(torch.uint8))


def test_numpy_gemma_hnd_k_out_and_contiguous_cache():
    """Gemma's 1 + w weights, an HND paged cache with k_out, then a contiguous cache from a
    packed batch: the float64 reference, scattered by the cache's rules."""
    rng = np.random.default_rng(7)
    T, Hq, Hk, D, R = 7, 4, 1, 96, 32
    cache = embrope.RopeCache(R, 128)
    q = rng.standard_normal((T, Hq, D)).astype(np.float32)
    k = rng.standard_normal((T, Hk, D)).astype(np.float32)
    v = rng.standard_normal((T, Hk, 40)).astype(np.float32)
    wq = (0.3 * rng.standard_normal(D)).astype(np.float32)
    wk = (0.3 * rng.standard_normal(D)).astype(np.float32)
    positions = rng.integers(0, 128, T)
    want_q = reference(q, wq, 1e-6, positions, cache, unit_offset=True)
    want_k = reference(k, wk, 1e-6, positions, cache, unit_offset=True)
    slots = np.array([4, -1, 0, 7, 2, 5, 1])
    k_cache = np.full((2, Hk, 4, D), np.nan, np.float32)  # HND
    v_cache = np.full((2, Hk, 4, 40), np.nan, np.float32)
    k_out = np.empty_like(k)
    q_res, k_res = embrope.apply_qk_norm_rope_append_kv(
        q.copy(), k, v, positions, cache, q_weight=wq, k_weight=wk, unit_offset=True,
        k_cache=k_cache, v_cache=v_cache, kv_layout="hnd", slot_mapping=slots, k_out=k_out)
    assert k_res is k_out
    tol = 2e-5 * max(np.abs(want_q).max(), np.abs(want_k).max())
    np.testing.assert_allclose(q_res, want_q, rtol=0, atol=tol)
    np.testing.assert_allclose(k_out, want_k, rtol=0, atol=tol)
    for t, slot in enumerate(slots):
        if slot >= 0:
            np.testing.assert_array_equal(k_cache[slot // 4, :, slot % 4], k_out[t])
            np.testing.assert_array_equal(v_cache[slot // 4, :, slot % 4], v[t])
    assert np.isnan(k_cache[1, :, 2]).all()  # slot 6: no token

    # Contiguous [B, max_len, Hk, D]: sequences [0, 3) and [3, 7) at offsets 5 and 0.
    k_cache = np.full((2, 16, Hk, D), np.nan, np.float32)
    v_cache = np.full((2, 16, Hk, 40), np.nan, np.float32)
    embrope.apply_qk_norm_rope_append_kv(
        q.copy(), k, v, positions, cache, q_weight=wq, k_weight=wk, unit_offset=True,
        k_cache=k_cache, v_cache=v_cache, cache_offsets=np.array([5, 0]),
        cu_seqlens=np.array([0, 3, 7]))
    rows = [(0, 5), (0, 6), (0, 7), (1, 0), (1, 1), (1, 2), (1, 3)]
    for t, (b, row) in enumerate(rows):
        np.testing.assert_allclose(k_cache[b, row], want_k[t], rtol=0, atol=tol)
        np.testing.assert_array_equal(v_cache[b, row], v[t])


def test_torch_op_compiles_and_matches_eager():
    T, Hq, Hk, D = 6, 4, 2, 64
    cache = embrope.RopeCache(D, 64)
    q = torch.randn(T, Hq, D)
    k = torch.randn(T, Hk, D)
    v = torch.randn(T, Hk, D)
    wq, wk = 1 + 0.1 * torch.randn(D), 1 + 0.1 * torch.randn(D)
    positions = torch.arange(T) + 2
    slots = torch.tensor([0, 5, 2, -1, 7, 1])

    def step(q, k_cache, v_cache):
        et.apply_qk_norm_rope_append_kv(q, k, v, positions, cache, k_cache, v_cache,
                                        q_weight=wq, k_weight=wk, slot_mapping=slots)
        return q * 2

    results = []
    for fn in (step, torch.compile(step, fullgraph=True)):
        qq = q.clone()
        kc, vc = torch.zeros(2, 4, Hk, D), torch.zeros(2, 4, Hk, D)
        out = fn(qq, kc, vc)
        results.append((out, kc, vc))
    for a, b in zip(*results):
        assert torch.equal(a, b)
    # The generic API gives the same bytes.
    qq = q.clone()
    kc, vc = torch.zeros(2, 4, Hk, D), torch.zeros(2, 4, Hk, D)
    embrope.apply_qk_norm_rope_append_kv(qq, k, v, positions, cache, q_weight=wq, k_weight=wk,
                                         k_cache=kc, v_cache=vc, slot_mapping=slots)
    assert torch.equal(qq * 2, results[0][0]) and torch.equal(kc, results[0][1])


def test_errors_name_the_op_and_nothing_is_written():
    T, Hq, Hk, D = 4, 2, 1, 32
    cache = embrope.RopeCache(D, 16)
    q = torch.randn(T, Hq, D)
    k = torch.randn(T, Hk, D)
    v = torch.randn(T, Hk, D)
    kc, vc = torch.zeros(2, 4, Hk, D), torch.zeros(2, 4, Hk, D)
    slots = torch.arange(T)
    q0 = q.clone()
    with pytest.raises(embrope.InvalidArgumentError,
                       match=r"apply_qk_norm_rope_append_kv: q_weight of shape \[33\].*head_dim of q"):
        embrope.apply_qk_norm_rope_append_kv(q, k, v, torch.arange(T), cache,
                                             q_weight=torch.ones(D + 1), k_cache=kc,
                                             v_cache=vc, slot_mapping=slots)
    with pytest.raises(embrope.InvalidArgumentError, match="eps nan must be finite"):
        et.apply_qk_norm_rope_append_kv(q, k, v, torch.arange(T), cache, kc, vc,
                                        eps=float("nan"), slot_mapping=slots)
    with pytest.raises(embrope.InvalidArgumentError, match="give k_cache and v_cache"):
        embrope.apply_qk_norm_rope_append_kv(q, k, v, torch.arange(T), cache, k_cache=kc,
                                             slot_mapping=slots)
    w = torch.ones(D, requires_grad=True)
    with pytest.raises(embrope.InvalidArgumentError, match="q_weight requires grad"):
        et.apply_qk_norm_rope_append_kv(q, k, v, torch.arange(T), cache, kc, vc, q_weight=w,
                                        slot_mapping=slots)
    assert torch.equal(q, q0) and not kc.any() and not vc.any()
    with pytest.raises(embrope.BadIndexError, match="apply_qk_norm_rope_append_kv"):
        embrope.apply_qk_norm_rope_append_kv(q, k, v, torch.arange(T), cache, k_cache=kc,
                                             v_cache=vc, slot_mapping=torch.tensor([0, 1, 8, 2]))
