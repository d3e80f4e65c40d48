"""apply_rope with float8 outputs (RoPE + quantization, FlashInfer's rope_quantize_fp8
semantics: ``float8(value * scale)``, rounded once, saturated) from the DLPack API and the torch
custom op. Oracles: PyTorch's own float8 conversion of the float32 rotation (which embrope's
float32 outputs give, checked against the float64 reference) and the float64 reference."""

import numpy as np
import pytest

import embrope
import reference as ref

torch = pytest.importorskip("torch")
import embrope.torch as et  # noqa: E402

FLOAT8 = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}


def torch_float8(x: "torch.Tensor", fp8: str) -> "torch.Tensor":
    """PyTorch's conversion (round to nearest even) with saturation to the finite range, as
    cuda_fp8.h's __NV_SATFINITE and FlashInfer store it (torch alone would give NaN / inf)."""
    m = FLOAT8[fp8]
    return x.clamp(-m, m).to(getattr(torch, fp8))


def codes(x: "torch.Tensor") -> "torch.Tensor":
    return x.view(torch.uint8)


@pytest.mark.parametrize("fp8", sorted(FLOAT8))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["neox", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [64, 32])
def test_codes_are_torch_conversion_of_the_scaled_rotation(fp8, dtype, layout, rotary_dim):
    """Every code equals torch's float8 of (the float32 rotation x scale x head scale): the
    rotation as embrope's float32 path computes it from q upcast exactly, so one rounding."""
    gen = torch.Generator().manual_seed(5)
    tdt = getattr(torch, dtype)
    T, Hq, Hk, D = 7, 4, 2, 96
    cache = embrope.RopeCache(rotary_dim, 256)
    q = (torch.randn(T, Hq, D, generator=gen) * 60).to(tdt)  # some saturate
    k = torch.randn(T, Hk, D, generator=gen).to(tdt)
    positions = torch.randint(0, 256, (T,), generator=gen)
    head = torch.tensor([0.5, 1.0, 2.0, 0.25])
    k_head = torch.tensor([2.0, 0.5])  # [Hk]: GQA
    q_out = torch.empty(T, Hq, D, dtype=getattr(torch, fp8))
    k_out = torch.empty(T, Hk, D, dtype=getattr(torch, fp8))
    got_q, got_k = embrope.apply_rope(q, k, positions, cache, layout=layout, q_out=q_out,
                                      k_out=k_out, q_out_scale=3.0, k_out_scale=0.5,
                                      q_out_head_scales=head, k_out_head_scales=k_head)
    assert got_q is q_out and got_k is k_out
    q32, k32 = embrope.apply_rope(q.float(), k.float(), positions, cache, layout=layout,
                                  inplace=False)
    want_q = torch_float8(q32 * (torch.tensor(3.0) * head).view(1, Hq, 1), fp8)
    want_k = torch_float8(k32 * (torch.tensor(0.5) * k_head).view(1, Hk, 1), fp8)
    assert torch.equal(codes(q_out), codes(want_q))
    assert torch.equal(codes(k_out), codes(want_k))
    # The float32 rotation itself against the float64 reference.
    q64 = ref.rope(q.double().numpy(), positions.numpy(), cache.inv_freq, layout=layout)
    np.testing.assert_allclose(q32.numpy(), q64, rtol=0, atol=2e-6 * 60 * 4)


@pytest.mark.parametrize("fp8", sorted(FLOAT8))
def test_float64_reference_within_one_float8_step(fp8):
    T, H, D = 9, 3, 64
    cache = embrope.RopeCache(D, 64)
    q = torch.randn(T, H, D, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    positions = torch.arange(T) * 7
    q_out = torch.empty(T, H, D, dtype=getattr(torch, fp8))
    embrope.apply_rope(q, None, positions, cache, q_out=q_out, q_out_scale=16.0)
    want = ref.rope(q.double().numpy(), positions.numpy(), cache.inv_freq) * 16.0
    got = q_out.to(torch.float64).numpy()
    mant = 3 if fp8 == "float8_e4m3fn" else 2
    step = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(want), 2.0 ** -6))) - mant)
    assert (np.abs(got - want) <= step / 2 * 1.001).all()


@pytest.mark.parametrize("fp8", sorted(FLOAT8))
def test_saturation_and_nan(fp8):
    cache = embrope.RopeCache(4, 8)
    # Pairs (0, 2) and (1, 3) at position 0 (cos 1, sin 0); 4..6 pass through.
    q = torch.tensor([[[1e30, -1e30, 1.0, 2.0, float("nan"), 2e5, -7.0]]])
    q_out = torch.empty(1, 1, 7, dtype=getattr(torch, fp8))
    embrope.apply_rope(q, None, torch.tensor([0]), cache, q_out=q_out)
    got = q_out.float()[0, 0]
    m = FLOAT8[fp8]
    assert got[0] == m and got[1] == -m and got[2] == 1.0 and got[3] == 2.0
    assert torch.isnan(got[4])
    assert got[5] == m  # the pass-through part saturates too
    assert got[6] == -7.0


def test_torch_op_matches_dlpack_api_and_traces():
    T, Hq, Hk, D = 5, 4, 1, 64
    cache = embrope.RopeCache(D, 32)
    q = torch.randn(T, Hq, D, dtype=torch.bfloat16)
    k = torch.randn(T, Hk, D, dtype=torch.bfloat16)
    positions = torch.arange(T)
    head = torch.tensor([1.0, 2.0, 4.0, 8.0])
    qo, ko = et.apply_rope(q, k, positions, cache, out_dtype=torch.float8_e4m3fn,
                           q_out_scale=0.5, k_out_scale=2.0, q_out_head_scales=head)
    assert qo.dtype == ko.dtype == torch.float8_e4m3fn and qo.shape == q.shape
    q_out = torch.empty_like(qo)
    k_out = torch.empty_like(ko)
    embrope.apply_rope(q, k, positions, cache, q_out=q_out, k_out=k_out, q_out_scale=0.5,
                       k_out_scale=2.0, q_out_head_scales=head)
    assert torch.equal(codes(qo), codes(q_out)) and torch.equal(codes(ko), codes(k_out))
    table = et.RotaryEmbedding(cache).cos_sin_cache

    def step(q, k, positions):
        return et.apply_rope(q, k, positions, table, out_dtype=torch.float8_e4m3fn,
                             q_out_scale=0.5, k_out_scale=2.0, q_out_head_scales=head)

    cq, ck = torch.compile(step, fullgraph=True)(q, k, positions)
    assert torch.equal(codes(cq), codes(qo)) and torch.equal(codes(ck), codes(ko))
    torch.library.opcheck(
        torch.ops.embrope.apply_rope_quantized.default,
        (q, k, positions, table, 0, False, 0, [0, 0, 0, 0], torch.float8_e5m2, 1.0, 1.0, head,
         None, None, None))


def test_torch_errors():
    cache = embrope.RopeCache(64, 32)
    q = torch.randn(3, 2, 64, requires_grad=True)
    positions = torch.arange(3)
    with pytest.raises(embrope.InvalidArgumentError, match="no gradient"):
        et.apply_rope(q, None, positions, cache, out_dtype=torch.float8_e4m3fn)
    with torch.no_grad():
        qo, _ = et.apply_rope(q, None, positions, cache, out_dtype=torch.float8_e4m3fn)
    assert qo.dtype == torch.float8_e4m3fn
    with pytest.raises(embrope.InvalidArgumentError, match="out_dtype"):
        et.apply_rope(q.detach(), None, positions, cache, out_dtype=torch.int8)
    with pytest.raises(embrope.InvalidArgumentError, match="inplace"):
        et.apply_rope(q.detach(), None, positions, cache, out_dtype=torch.float8_e5m2,
                      inplace=True)
    with pytest.raises(embrope.InvalidArgumentError, match="float8 outputs only"):
        et.apply_rope(q.detach(), None, positions, cache, q_out_scale=2.0)


def test_dlpack_errors_name_the_argument():
    cache = embrope.RopeCache(64, 32)
    q = torch.randn(3, 2, 64)
    k = torch.randn(3, 1, 64)
    positions = torch.arange(3)
    q8 = torch.empty(3, 2, 64, dtype=torch.float8_e4m3fn)
    k5 = torch.empty(3, 1, 64, dtype=torch.float8_e5m2)
    with pytest.raises(embrope.InvalidArgumentError, match="k_out is not given"):
        embrope.apply_rope(q, k, positions, cache, q_out=q8)
    with pytest.raises(embrope.InvalidArgumentError, match="one dtype"):
        embrope.apply_rope(q, k, positions, cache, q_out=q8, k_out=k5)
    with pytest.raises(embrope.InvalidArgumentError, match="q_out_scale .* positive"):
        embrope.apply_rope(q, None, positions, cache, q_out=q8, q_out_scale=0.0)
    with pytest.raises(embrope.InvalidArgumentError, match="q_out_head_scales"):
        embrope.apply_rope(q, None, positions, cache, q_out=q8,
                           q_out_head_scales=torch.ones(3))
    with pytest.raises(embrope.InvalidArgumentError, match="float8 outputs are apply_rope's"):
        embrope.apply_rope_backward(q, None, positions, cache, q_out=q8)


@pytest.mark.parametrize("fp8", sorted(FLOAT8))
def test_mla_rope_quantize_fp8_q_nope_and_kv_c(fp8):
    """FlashInfer's mla_rope_quantize_fp8 on DeepSeek's shapes: q [T, H, 128 | 64] and kv_a
    [T, 512 | 64] split into views (q_nope and the rope slice; kv_c as k_nope and k_pe as k,
    one head), all quantized in one pass: the rotated parts as apply_rope's float8 outputs,
    the non-rotary parts torch's float8 of value x scale (x head scale for q)."""
    gen = torch.Generator().manual_seed(9)
    T, H, nope, rope, rank = 5, 4, 128, 64, 512
    cache = embrope.RopeCache(rope, 128)
    q = (torch.randn(T, H, nope + rope, generator=gen) * 40).bfloat16()
    kv_a = (torch.randn(T, rank + rope, generator=gen) * 40).bfloat16()
    positions = torch.randint(0, 128, (T,), generator=gen)
    head = torch.tensor([0.5, 1.0, 2.0, 4.0])
    f8 = getattr(torch, fp8)
    outs = [torch.empty(T, H, rope, dtype=f8), torch.empty(T, 1, rope, dtype=f8),
            torch.empty(T, H, nope, dtype=f8), torch.empty(T, 1, rank, dtype=f8)]
    embrope.apply_rope(q[..., nope:], kv_a[:, None, rank:], positions, cache,
                       layout="interleaved", q_out=outs[0], k_out=outs[1], q_out_scale=2.0,
                       k_out_scale=0.5, q_out_head_scales=head, q_nope=q[..., :nope],
                       q_nope_out=outs[2], k_nope=kv_a[:, None, :rank], k_nope_out=outs[3])
    q_scale = (torch.tensor(2.0) * head).view(1, H, 1)
    assert torch.equal(codes(outs[2]), codes(torch_float8(q[..., :nope].float() * q_scale, fp8)))
    assert torch.equal(codes(outs[3]),
                       codes(torch_float8(kv_a[:, None, :rank].float() * torch.tensor(0.5), fp8)))
    rot = [torch.empty_like(outs[0]), torch.empty_like(outs[1])]
    embrope.apply_rope(q[..., nope:], kv_a[:, None, rank:], positions, cache,
                       layout="interleaved", q_out=rot[0], k_out=rot[1], q_out_scale=2.0,
                       k_out_scale=0.5, q_out_head_scales=head)
    assert torch.equal(codes(outs[0]), codes(rot[0])) and torch.equal(codes(outs[1]), codes(rot[1]))

    # The torch op: one custom op, four outputs, traceable whole.
    def step(q, kv_a):
        return et.apply_rope(q[..., nope:], kv_a[:, None, rank:], positions, cache,
                             layout="interleaved", out_dtype=f8, q_out_scale=2.0,
                             k_out_scale=0.5, q_out_head_scales=head, q_nope=q[..., :nope],
                             k_nope=kv_a[:, None, :rank])
    for fn in (step, torch.compile(step, fullgraph=True)):
        got = fn(q, kv_a)
        assert len(got) == 4
        for a, b in zip(got, outs):
            assert torch.equal(codes(a), codes(b))
    torch.library.opcheck(
        torch.ops.embrope.apply_rope_quantized.default,
        (q[..., nope:], kv_a[:, None, rank:], positions,
         torch.from_numpy(np.asarray(cache.cos_sin_cache).copy()), 1, False, 0,
         [0, 0, 0, 0], f8, 2.0, 0.5, head, None, q[..., :nope], kv_a[:, None, :rank]))
    with pytest.raises(embrope.InvalidArgumentError, match="q_nope and k_nope are for float8"):
        et.apply_rope(q[..., nope:], None, positions, cache, q_nope=q[..., :nope])
    with pytest.raises(embrope.InvalidArgumentError,
                       match="apply_rope: q_nope is given but q_nope_out is not"):
        embrope.apply_rope(q[..., nope:], None, positions, cache, q_out=outs[0],
                           q_nope=q[..., :nope])


@pytest.mark.parametrize("fp8", sorted(FLOAT8))
def test_numpy_float8_outputs_of_ml_dtypes(fp8):
    # NumPy cannot export ml_dtypes' float8 through DLPack: such an output was a TypeError
    # listing nanobind's overloads. Its bytes are torch's codes of the same rotation.
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(6)
    cache = embrope.RopeCache(64, 128)
    q = (rng.standard_normal((5, 2, 64)) * 40).astype(np.float32)
    positions = rng.integers(0, 128, 5)
    q_out = np.empty((5, 2, 64), dtype=getattr(ml_dtypes, fp8))
    got, _ = embrope.apply_rope(q, None, positions, cache, q_out=q_out, q_out_scale=2.0)
    assert got is q_out
    q32, _ = embrope.apply_rope(q, None, positions, cache, inplace=False)
    want = torch_float8(torch.from_numpy(q32) * 2.0, fp8)
    assert np.array_equal(q_out.view(np.uint8), codes(want).numpy())
    read_only = np.empty((5, 2, 64), dtype=getattr(ml_dtypes, fp8))
    read_only.flags.writeable = False
    with pytest.raises(embrope.InvalidArgumentError, match="q_out is read-only"):
        embrope.apply_rope(q, None, positions, cache, q_out=read_only)
