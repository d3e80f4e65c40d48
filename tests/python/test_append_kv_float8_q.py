"""A float8 q_out from the cache-append ops (FlashInfer's rope_quantize_fp8_append_paged_kv_cache;
Qwen3 serving with qk-norm): q rotated (normalised first for apply_qk_norm_rope_append_kv) and
quantized in the pass that writes the cache. Oracles: PyTorch's own float8 conversion of the
float32 result (embrope's float32 path on q upcast exactly: the value before any rounding,
itself checked against HF and float64 elsewhere), the float64 reference, and the cache bytes of
the same call with q in its own dtype."""

import numpy as np
import pytest

import embrope
import reference as ref

torch = pytest.importorskip("torch")
import embrope.torch as et  # noqa: E402

FLOAT8 = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}


def torch_float8(x, fp8):
    """torch's round-to-nearest-even conversion, saturated as cuda_fp8.h's __NV_SATFINITE."""
    m = FLOAT8[fp8]
    return x.clamp(-m, m).to(getattr(torch, fp8))


def codes(x):
    return x.view(torch.uint8)


def problem(seed, dtype=torch.bfloat16, T=11, Hq=4, Hk=2, D=128):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(T, Hq, D, generator=g) * 4).to(dtype)
    k = torch.randn(T, Hk, D, generator=g).to(dtype)
    v = torch.randn(T, Hk, D, generator=g).to(dtype)
    positions = torch.randint(0, 512, (T,), generator=g)
    slots = torch.randperm(4 * 16, generator=g)[:T]
    slots[3] = -1
    weights = (torch.rand(D, generator=g) + 0.5, torch.rand(D, generator=g) + 0.5)
    return q, k, v, positions, slots, weights


@pytest.mark.parametrize("fp8", sorted(FLOAT8))
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_q_codes_are_torch_conversion_and_cache_unchanged(fp8, norm, dtype):
    q, k, v, positions, slots, (qw, kw) = problem(7, getattr(torch, dtype))
    T, Hq, Hk, D = *q.shape[:2], k.shape[1], q.shape[2]
    cache = embrope.RopeCache(D, 512)
    head = torch.tensor([0.5, 1.0, 2.0, 4.0])
    scale = 1.5
    fdt = getattr(torch, fp8)
    norm_args = dict(q_weight=qw, k_weight=kw, eps=1e-6) if norm else {}
    op = embrope.apply_qk_norm_rope_append_kv if norm else embrope.apply_rope_append_kv
    # The cache float8 too: its own k_scale / v_scale, apart from q's scales.
    kc, vc = (torch.zeros(4, 16, Hk, D, dtype=torch.float8_e4m3fn) for _ in range(2))
    q8 = torch.empty(T, Hq, D, dtype=fdt)
    q_before = q.clone()
    got, _ = op(q, k, v, positions, cache, k_cache=kc, v_cache=vc, slot_mapping=slots,
                k_scale=0.5, v_scale=0.25, q_out=q8, q_out_scale=scale, q_out_head_scales=head,
                **norm_args)
    assert got is q8
    assert torch.equal(q, q_before)  # q is only read
    # The float32 value before any rounding: the same op in float32 on q upcast exactly.
    q32 = q.float().clone()
    op(q32, k.float(), v.float(), positions, cache, k_cache=torch.zeros(4, 16, Hk, D),
       v_cache=torch.zeros(4, 16, Hk, D), slot_mapping=slots, **norm_args)
    want = torch_float8(q32 * (torch.tensor(scale) * head).view(1, Hq, 1), fp8)
    assert torch.equal(codes(q8), codes(want))
    # The cache holds what the call with q in its own dtype writes.
    kc2, vc2 = torch.zeros_like(kc), torch.zeros_like(vc)
    op(q.clone(), k, v, positions, cache, k_cache=kc2, v_cache=vc2, slot_mapping=slots,
       k_scale=0.5, v_scale=0.25, **norm_args)
    assert torch.equal(codes(kc), codes(kc2)) and torch.equal(codes(vc), codes(vc2))
    if not norm:  # the float32 rotation against the float64 reference
        q64 = ref.rope(q.double().numpy(), positions.numpy(), cache.inv_freq)
        np.testing.assert_allclose(q32.numpy(), q64, rtol=0, atol=2e-6 * 4 * 8)


def test_qwen3_norm_then_rope_then_float8_equals_hf():
    """Qwen3's q_norm (HF's Qwen3RMSNorm) and rotary embedding + apply_rotary_pos_emb, then
    torch's float8: the fused op's codes within one float8 step (HF rounds to the model's dtype
    in between; embrope rounds once)."""
    qwen3 = pytest.importorskip("transformers.models.qwen3.modeling_qwen3")
    import transformers
    T, Hq, Hk, D = 9, 4, 2, 128
    config = transformers.Qwen3Config(hidden_size=Hq * D, num_attention_heads=Hq,
                                      num_key_value_heads=Hk, head_dim=D, rms_norm_eps=1e-6,
                                      max_position_embeddings=4096)
    q, k, v, positions, slots, (qw, kw) = problem(9, torch.float32, T, Hq, Hk, D)
    norm_q, norm_k = qwen3.Qwen3RMSNorm(D, eps=1e-6), qwen3.Qwen3RMSNorm(D, eps=1e-6)
    with torch.no_grad():
        norm_q.weight.copy_(qw)
        norm_k.weight.copy_(kw)
        cos, sin = qwen3.Qwen3RotaryEmbedding(config)(q, positions[None])
        hq, _ = qwen3.apply_rotary_pos_emb(norm_q(q)[None].transpose(1, 2),
                                           norm_k(k)[None].transpose(1, 2), cos, sin)
    want = hq.transpose(1, 2)[0] * 2.0
    cache = embrope.RopeCache.from_hf_config(config)
    kc, vc = (torch.zeros(4, 16, Hk, D) for _ in range(2))
    q8 = et.apply_qk_norm_rope_append_kv(q, k, v, positions, cache, kc, vc, q_weight=qw,
                                         k_weight=kw, slot_mapping=slots,
                                         q_out_dtype=torch.float8_e4m3fn, q_out_scale=2.0)
    assert q8.dtype == torch.float8_e4m3fn
    got = q8.to(torch.float64)
    step = 2.0 ** (torch.floor(torch.log2(want.abs().clamp_min(2.0 ** -6))) - 3).double()
    assert ((got - want.double()).abs() <= step * 0.51).all()


@pytest.mark.parametrize("fp8", sorted(FLOAT8))
def test_deepseek_mla_q_rope_and_nope_into_float8_with_the_latent_cache(fp8):
    """DeepSeek MLA through views, FlashInfer's mla_rope_quantize_fp8 + the latent cache
    append in one call: q's rope slice into a float8 q_out, q_nope quantized with the same
    scales, k_pe and kv_c into the cache; the torch op returns (q_out, q_nope_out)."""
    T, H, nope, rope, rank = 6, 4, 128, 64, 512
    g = torch.Generator().manual_seed(4)
    q = torch.randn(T, H, nope + rope, generator=g).to(torch.bfloat16)
    kv_a = torch.randn(T, rank + rope, generator=g).to(torch.bfloat16)
    kv_c, k_pe = kv_a[:, :rank], kv_a[:, rank:]
    positions = torch.randint(0, 256, (T,), generator=g)
    slots = torch.tensor([5, 0, -1, 9, 2, 14])
    cache = embrope.RopeCache(rope, 256)
    kv_cache = torch.zeros(2, 8, rank + rope, dtype=torch.bfloat16)
    head = torch.tensor([1.0, 0.5, 2.0, 0.25])
    q_out, q_nope_out = et.apply_rope_append_kv(
        q[..., nope:], k_pe[:, None], kv_c[:, None], positions, cache,
        kv_cache[..., rank:].unsqueeze(2), kv_cache[..., :rank].unsqueeze(2), slot_mapping=slots,
        layout="interleaved", q_out_dtype=getattr(torch, fp8), q_out_scale=3.0,
        q_out_head_scales=head, q_nope=q[..., :nope])
    s = (torch.tensor(3.0) * head).view(1, H, 1)
    q32 = embrope.apply_rope(q[..., nope:].float(), None, positions, cache, layout="interleaved",
                             inplace=False)[0]
    assert torch.equal(codes(q_out), codes(torch_float8(q32 * s, fp8)))
    assert torch.equal(codes(q_nope_out), codes(torch_float8(q[..., :nope].float() * s, fp8)))
    # The latent cache: what the call without float8 writes.
    want = torch.zeros_like(kv_cache)
    embrope.apply_rope_append_kv(q[..., nope:].clone(), k_pe[:, None], kv_c[:, None], positions,
                                 cache, k_cache=want[..., rank:].unsqueeze(2),
                                 v_cache=want[..., :rank].unsqueeze(2), slot_mapping=slots,
                                 layout="interleaved")
    assert torch.equal(kv_cache, want) and torch.count_nonzero(want) > 0


def test_bad_position_gives_zero_codes():
    q, k, v, positions, slots, _ = problem(3)
    cache = embrope.RopeCache(128, 512)
    positions[4] = 512
    q8 = torch.full(q.shape, 0x55, dtype=torch.uint8).view(torch.float8_e4m3fn)
    kc, vc = (torch.zeros(4, 16, 2, 128, dtype=torch.bfloat16) for _ in range(2))
    with pytest.raises(embrope.BadIndexError, match=r"positions\[4\] = 512"):
        embrope.apply_rope_append_kv(q, k, v, positions, cache, k_cache=kc, v_cache=vc,
                                     slot_mapping=slots, q_out=q8)
    assert (codes(q8)[4] == 0).all() and (codes(q8)[:4] != 0x55).any()


def test_torch_compile_of_the_float8_path():
    q, k, v, positions, slots, (qw, kw) = problem(5, torch.float32, T=5)
    table = torch.from_numpy(np.asarray(embrope.RopeCache(128, 512).cos_sin_cache).copy())

    def step(q, kc, vc):
        return et.apply_qk_norm_rope_append_kv(q, k, v, positions, table, kc, vc, q_weight=qw,
                                               k_weight=kw, slot_mapping=slots,
                                               q_out_dtype=torch.float8_e5m2, q_out_scale=0.5)

    results = []
    for fn in (step, torch.compile(step, fullgraph=True)):
        kc, vc = torch.zeros(4, 16, 2, 128), torch.zeros(4, 16, 2, 128)
        results.append((fn(q.clone(), kc, vc), kc, vc))
    assert results[0][0].dtype == torch.float8_e5m2
    for a, b in zip(*results):
        assert torch.equal(a.view(torch.uint8) if a.dtype != torch.float32 else a,
                           b.view(torch.uint8) if b.dtype != torch.float32 else b)


def test_errors_name_the_op_and_the_rule():
    q, k, v, positions, slots, (qw, kw) = problem(2)
    cache = embrope.RopeCache(128, 512)
    kc, vc = (torch.zeros(4, 16, 2, 128, dtype=torch.bfloat16) for _ in range(2))
    common = dict(k_cache=kc, v_cache=vc, slot_mapping=slots)
    q8 = torch.empty(q.shape, dtype=torch.float8_e4m3fn)
    k8 = torch.empty(k.shape, dtype=torch.float8_e4m3fn)
    with pytest.raises(embrope.InvalidArgumentError,
                       match="apply_rope_append_kv: k_out has dtype float8_e4m3fn.*k_scale"):
        embrope.apply_rope_append_kv(q, k, v, positions, cache, q_out=q8, k_out=k8, **common)
    with pytest.raises(embrope.InvalidArgumentError, match="q_out_scale -1 must be positive"):
        embrope.apply_rope_append_kv(q, k, v, positions, cache, q_out=q8, q_out_scale=-1.0,
                                     **common)
    with pytest.raises(embrope.InvalidArgumentError,
                       match="q_out_scale applies to float8 outputs only"):
        embrope.apply_rope_append_kv(q, k, v, positions, cache, q_out_scale=2.0, **common)
    with pytest.raises(embrope.InvalidArgumentError, match="q_out_dtype is torch.int8"):
        et.apply_rope_append_kv(q, k, v, positions, cache, kc, vc, slot_mapping=slots,
                                q_out_dtype=torch.int8)
    with pytest.raises(embrope.InvalidArgumentError, match="q_nope is for a float8 q_out"):
        et.apply_rope_append_kv(q, k, v, positions, cache, kc, vc, slot_mapping=slots,
                                q_nope=q[..., :8])
    assert torch.count_nonzero(kc) == 0  # nothing was written
