"""apply_rope_append_kv from Python: NumPy and torch, paged (NHD, HND, combined) and
contiguous caches, float8 caches against PyTorch's own float8 conversion, the torch custom op
under torch.compile, and the errors. Rotations are checked against reference.py (float64)."""

import numpy as np
import pytest

import embrope
import reference as ref

torch = pytest.importorskip("torch")


def as_f64(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64).numpy()
    return np.asarray(x).astype(np.float64)


@pytest.mark.parametrize("kv_layout", ["nhd", "hnd"])
def test_numpy_paged_cache_is_rotate_then_scatter(kv_layout, rng):
    T, Hq, Hk, D, R, pages, page = 9, 4, 2, 64, 64, 3, 4
    cache = embrope.RopeCache(R, 128)
    q = rng.standard_normal((T, Hq, D)).astype(np.float32)
    k = rng.standard_normal((T, Hk, D)).astype(np.float32)
    v = rng.standard_normal((T, Hk, D)).astype(np.float32)
    positions = rng.integers(0, 128, T)
    slots = np.array([5, 0, -1, 11, 2, 7, 3, -1, 8])
    shape = (pages, page, Hk, D) if kv_layout == "nhd" else (pages, Hk, page, D)
    k_cache = np.full(shape, np.nan, np.float32)
    v_cache = np.full(shape, np.nan, np.float32)
    q0, k0 = q.copy(), k.copy()
    q_res, k_res = embrope.apply_rope_append_kv(
        q, k, v, positions, cache, k_cache=k_cache, v_cache=v_cache, slot_mapping=slots,
        kv_layout=kv_layout)
    assert q_res is q and k_res is None
    np.testing.assert_array_equal(k, k0)  # k only read
    q_want = ref.rope(q0, positions, cache.inv_freq)
    k_want = ref.rope(k0, positions, cache.inv_freq)
    np.testing.assert_allclose(q, q_want, rtol=0, atol=2e-6)
    for t, slot in enumerate(slots):
        if slot < 0:
            continue
        p, o = divmod(slot, page)
        k_row = k_cache[p, o] if kv_layout == "nhd" else k_cache[p, :, o]
        v_row = v_cache[p, o] if kv_layout == "nhd" else v_cache[p, :, o]
        np.testing.assert_allclose(k_row, k_want[t], rtol=0, atol=2e-6)
        np.testing.assert_array_equal(v_row, v[t])
    written = np.zeros(pages * page, bool)
    written[slots[slots >= 0]] = True
    untouched = k_cache.reshape(pages, page, -1) if kv_layout == "nhd" else \
        k_cache.transpose(0, 2, 1, 3).reshape(pages, page, -1)
    assert np.isnan(untouched.reshape(pages * page, -1)[~written]).all()


@pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_torch_float8_cache_matches_torch_conversion(fp8, dtype, rng):
    """The cache holds torch's own float8 rounding of rotated k / scale (apply_rope's k) and
    of v / scale: PyTorch's conversion is the oracle (round to nearest even), inside the
    finite range where it does not saturate."""
    T, Hq, Hk, D, pages, page = 12, 4, 2, 128, 2, 16
    tdt, cdt = getattr(torch, dtype), getattr(torch, fp8)
    cache = embrope.RopeCache(D, 64)
    q = torch.randn(T, Hq, D).to(tdt)
    k = torch.randn(T, Hk, D).to(tdt)
    v = (torch.randn(T, Hk, D) * 4).to(tdt)
    positions = torch.from_numpy(rng.integers(0, 64, T))
    slots = torch.randperm(pages * page)[:T]
    k_cache = torch.zeros(pages, page, Hk, D, dtype=cdt)
    v_cache = torch.zeros(pages, page, Hk, D, dtype=cdt)
    k_scale, v_scale = 0.05, 0.3
    q_fused = q.clone()
    embrope.apply_rope_append_kv(q_fused, k, v, positions, cache, k_cache=k_cache,
                                 v_cache=v_cache, slot_mapping=slots, k_scale=k_scale,
                                 v_scale=v_scale)
    q_rot, k_rot = embrope.apply_rope(q.clone(), k.clone(), positions, cache)
    assert torch.equal(q_fused, q_rot)
    k_want = (k_rot.float() / torch.tensor(k_scale, dtype=torch.float32)).to(cdt)
    v_want = (v.float() / torch.tensor(v_scale, dtype=torch.float32)).to(cdt)
    flat_k = k_cache.view(-1, Hk, D)[slots]
    flat_v = v_cache.view(-1, Hk, D)[slots]
    assert torch.equal(flat_k.view(torch.uint8), k_want.view(torch.uint8))
    assert torch.equal(flat_v.view(torch.uint8), v_want.view(torch.uint8))
    # And the float64 rotation, within one float8 ulp plus k's own rounding.
    k_ref = ref.rope(as_f64(k), positions.numpy(), cache.inv_freq) / k_scale
    got = flat_k.to(torch.float64).numpy()
    mant = 3 if fp8 == "float8_e4m3fn" else 2
    ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(k_ref), 2.0 ** -6))) - mant)
    assert (np.abs(got - k_ref) <= ulp).all()


@pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2"])
def test_every_float8_code_round_trips(fp8):
    """Every finite code, decoded by torch, is stored back as itself."""
    cdt = getattr(torch, fp8)
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    values = codes.view(cdt).float()
    finite = torch.isfinite(values)
    v = values[finite].reshape(-1, 1, 1)
    n = v.shape[0]
    k = torch.zeros(n, 1, 2)
    cache = embrope.RopeCache(2, 4)
    k_cache = torch.zeros(n, 1, 1, 2, dtype=cdt)
    v_cache = torch.zeros(n, 1, 1, 1, dtype=cdt)
    embrope.apply_rope_append_kv(torch.zeros(n, 0, 2), k, v, torch.zeros(n, dtype=torch.int64),
                                 cache, k_cache=k_cache, v_cache=v_cache,
                                 slot_mapping=torch.arange(n))
    assert torch.equal(v_cache.view(torch.uint8).flatten(), codes[finite])


@pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2"])
def test_nan_is_stored_as_torch_stores_it(fp8):
    """NaN of either sign becomes the byte torch's own conversion gives (e5m2: 0x7f / 0xff,
    not another of its NaN codes)."""
    cdt = getattr(torch, fp8)
    nan = float("nan")
    values = torch.tensor([nan, -nan, nan, -nan]).reshape(-1, 1, 1)
    n = values.shape[0]
    cache = embrope.RopeCache(2, 4)
    k_cache = torch.zeros(n, 1, 1, 2, dtype=cdt)
    v_cache = torch.zeros(n, 1, 1, 1, dtype=cdt)
    embrope.apply_rope_append_kv(torch.zeros(n, 0, 2), values.expand(n, 1, 2).contiguous(),
                                 values, torch.zeros(n, dtype=torch.int64), cache,
                                 k_cache=k_cache, v_cache=v_cache, slot_mapping=torch.arange(n))
    want = values.flatten().to(cdt).view(torch.uint8)
    assert want.tolist() == [0x7f, 0xff, 0x7f, 0xff]
    assert torch.equal(v_cache.view(torch.uint8).flatten(), want)
    # k is rotated first: the sign of a NaN that arithmetic produced is the hardware's.
    assert set(k_cache.view(torch.uint8).flatten().tolist()) <= {0x7f, 0xff}


def test_torch_combined_and_contiguous_caches(rng):
    T, Hq, Hk, D = 10, 8, 2, 64
    cache = embrope.RopeCache(D, 64)
    q = torch.randn(T, Hq, D, dtype=torch.bfloat16)
    k = torch.randn(T, Hk, D, dtype=torch.bfloat16)
    v = torch.randn(T, Hk, D, dtype=torch.bfloat16)
    positions = torch.arange(T)
    # A combined [pages, 2, page, Hk, D] cache (FlashInfer's paged_kv_cache) ...
    kv = torch.zeros(2, 2, 8, Hk, D, dtype=torch.bfloat16)
    slots = torch.arange(T) + 3
    embrope.apply_rope_append_kv(q.clone(), k, v, positions, cache, kv_cache=kv,
                                 slot_mapping=slots)
    _, k_rot = embrope.apply_rope(q.clone(), k.clone(), positions, cache)
    assert torch.equal(kv[:, 0].reshape(-1, Hk, D)[slots], k_rot)
    assert torch.equal(kv[:, 1].reshape(-1, Hk, D)[slots], v)
    # ... and a contiguous [B, max_len, Hk, D] cache from a packed batch.
    kc = torch.zeros(3, 16, Hk, D, dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    cu = torch.tensor([0, 4, 4, 10])
    offsets = torch.tensor([5, 0, 10])
    embrope.apply_rope_append_kv(q.clone(), k, v, positions, cache, k_cache=kc, v_cache=vc,
                                 cache_offsets=offsets, cu_seqlens=cu)
    assert torch.equal(kc[0, 5:9], k_rot[0:4]) and torch.equal(vc[0, 5:9], v[0:4])
    assert torch.equal(kc[2, 10:16], k_rot[4:10]) and torch.equal(vc[2, 10:16], v[4:10])
    assert torch.count_nonzero(kc[1]) == 0


def test_torch_op_compiles_and_matches_eager():
    T, Hq, Hk, D = 6, 4, 2, 64
    cache = embrope.RopeCache(D, 64)
    table = torch.from_numpy(np.asarray(cache.cos_sin_cache).copy())
    q = torch.randn(T, Hq, D)
    k = torch.randn(T, Hk, D)
    v = torch.randn(T, Hk, D)
    positions = torch.arange(T) + 2
    slots = torch.tensor([0, 5, 2, -1, 7, 1])

    def step(q, k_cache, v_cache):
        embrope.torch.apply_rope_append_kv(q, k, v, positions, table, k_cache, v_cache,
                                           slot_mapping=slots)
        return q * 2

    results = []
    for fn in (step, torch.compile(step, fullgraph=True)):
        qq = q.clone()
        kc, vc = torch.zeros(2, 4, Hk, D), torch.zeros(2, 4, Hk, D)
        out = fn(qq, kc, vc)
        results.append((out, kc, vc))
    for a, b in zip(*results):
        assert torch.equal(a, b)
    assert torch.count_nonzero(results[0][1]) > 0


def test_errors(rng):
    T, H, D = 4, 2, 64
    cache = embrope.RopeCache(D, 64)
    q, k, v = (np.ones((T, H, D), np.float32) for _ in range(3))
    kc, vc = np.zeros((2, 4, H, D), np.float32), np.zeros((2, 4, H, D), np.float32)
    with pytest.raises(embrope.BadIndexError, match=r"slot_mapping\[2\] = 8"):
        embrope.apply_rope_append_kv(q, k, v, np.arange(T), cache, k_cache=kc, v_cache=vc,
                                     slot_mapping=np.array([0, 1, 8, 3]))
    assert (kc.reshape(8, -1)[[0, 1, 3]] != 0).all() and (kc.reshape(8, -1)[[2, 4]] == 0).all()
    with pytest.raises(embrope.InvalidArgumentError, match="float8 caches only"):
        embrope.apply_rope_append_kv(q, k, v, np.arange(T), cache, k_cache=kc, v_cache=vc,
                                     slot_mapping=np.arange(T), k_scale=2.0)
    with pytest.raises(embrope.InvalidArgumentError, match="k_cache and v_cache, or kv_cache"):
        embrope.apply_rope_append_kv(q, k, v, np.arange(T), cache, k_cache=kc,
                                     slot_mapping=np.arange(T))
    with pytest.raises(embrope.InvalidArgumentError, match="exactly one of slot_mapping"):
        embrope.apply_rope_append_kv(q, k, v, np.arange(T), cache, k_cache=kc, v_cache=vc)


def concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, scale=1.0):
    """vLLM's concat_and_cache_mla (csrc/cache_kernels.cu) as its kernel defines it: for token
    t with slot_mapping[t] >= 0, block = slot // block_size, offset = slot % block_size,
    kv_cache[block, offset, :kv_lora_rank] = kv_c[t] and kv_cache[block, offset,
    kv_lora_rank:] = k_pe[t] ([num_blocks, block_size, kv_lora_rank + pe_dim]); a float8 cache
    stores value / scale."""
    block_size, rank = kv_cache.shape[1], kv_c.shape[-1]
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        block, offset = divmod(slot, block_size)
        row = torch.cat([kv_c[t], k_pe[t]])
        if kv_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            kv_cache[block, offset] = (row.float() / torch.tensor(scale)).to(kv_cache.dtype)
        else:
            kv_cache[block, offset] = row.to(kv_cache.dtype)


@pytest.mark.parametrize("cache_dtype", ["bfloat16", "float8_e4m3fn"])
def test_deepseek_mla_rope_and_latent_cache_through_views(cache_dtype):
    """DeepSeek-V3 MLA (q [T, H, 128 + 64], k_pe [T, 64] shared by the heads, kv_c [T, 512]):
    q's rope slice and k_pe rotated (interleaved pairs, YaRN with mscale) and the latent cache
    [blocks, block_size, 512 + 64] written in one apply_rope_append_kv, through views: q's
    rope slice as q, k_pe as one kv head, kv_c as v, the cache's two parts as k_cache and
    v_cache. Oracles: HF's DeepseekV3RotaryEmbedding + apply_rotary_pos_emb_interleave (which
    returns the rotated pairs in rotate_half order) and vLLM's concat_and_cache_mla."""
    ds = pytest.importorskip("transformers.models.deepseek_v3.modeling_deepseek_v3")
    import transformers
    T, H, nope, rope, rank, blocks, block = 9, 4, 128, 64, 512, 2, 8
    config = transformers.DeepseekV3Config(
        hidden_size=256, num_attention_heads=H, num_key_value_heads=H, kv_lora_rank=rank,
        q_lora_rank=None, qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=128,
        max_position_embeddings=16384, rope_interleave=True,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                             original_max_position_embeddings=4096, beta_fast=32, beta_slow=1,
                             mscale=1.0, mscale_all_dim=0.8))
    g = torch.Generator().manual_seed(3)
    q = torch.randn(T, H, nope + rope, generator=g).to(torch.bfloat16)
    kv_a = torch.randn(T, rank + rope, generator=g).to(torch.bfloat16)  # kv_a_proj_with_mqa's
    kv_c, k_pe = kv_a[:, :rank], kv_a[:, rank:]
    positions = torch.randint(0, 1000, (T,), generator=g)
    slots = torch.tensor([3, 12, -1, 0, 9, 15, 4, 7, 1])
    cdt = getattr(torch, cache_dtype)
    scale = 0.25 if cache_dtype.startswith("float8") else 1.0

    with torch.no_grad():
        cos, sin = ds.DeepseekV3RotaryEmbedding(config)(q.float(), positions[None])
        hq, hk = ds.apply_rotary_pos_emb_interleave(q[None, :, :, nope:].float().transpose(1, 2),
                                                    k_pe[None, None].float(), cos, sin)
    hq = hq.transpose(1, 2)[0]  # [T, H, rope] in rotate_half order
    hk = hk[0, 0]

    cache = embrope.RopeCache.from_hf_config(config)
    kv_cache = torch.full((blocks, block, rank + rope), float("nan")).to(cdt)
    q_fused = q.clone()
    embrope.apply_rope_append_kv(
        q_fused[..., nope:], k_pe[:, None], kv_c[:, None], positions, cache,
        k_cache=kv_cache[..., rank:].unsqueeze(2), v_cache=kv_cache[..., :rank].unsqueeze(2),
        k_scale=scale, v_scale=scale, slot_mapping=slots, layout="interleaved")
    assert torch.equal(q_fused[..., :nope], q[..., :nope])  # the nope slice passes through
    q_rot = q_fused[..., nope:].float()
    # embrope keeps DeepSeek's interleaved pairs; HF returns them as (evens, odds).
    as_hf = torch.cat([q_rot[..., 0::2], q_rot[..., 1::2]], -1)
    torch.testing.assert_close(as_hf, hq, rtol=2**-8, atol=1e-3)  # one bfloat16 rounding

    # The latent cache: vLLM's write of kv_c and of the rotated k_pe embrope's rotation gives
    # (apply_rope of k_pe alone; its values are checked against HF's just below).
    k_rot = embrope.apply_rope(k_pe[:, None].clone(), None, positions, cache,
                               layout="interleaved")[0][:, 0]
    torch.testing.assert_close(torch.cat([k_rot.float()[:, 0::2], k_rot.float()[:, 1::2]], -1),
                               hk, rtol=2**-8, atol=1e-3)
    want = torch.full((blocks, block, rank + rope), float("nan")).to(cdt)
    concat_and_cache_mla(kv_c, k_rot, want, slots, scale)
    assert torch.equal(kv_cache.view(torch.uint8), want.view(torch.uint8))
