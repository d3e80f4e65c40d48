"""apply_qk_norm_rope (per-head RMSNorm, then RoPE) and its backward from Python: against a
float64 numpy reference written from the formulas, against HF transformers' own Qwen3 and
Gemma 3 code (Qwen3RMSNorm / Gemma3RMSNorm, then apply_rotary_pos_emb), and its torch
gradients against torch autograd of the unfused float64 composition."""

import numpy as np
import pytest

import embrope

torch = pytest.importorskip("torch")

import embrope.torch as et  # noqa: E402


def reference(x, w, eps, positions, cache, layout="neox", unit_offset=False):
    """float64: x / sqrt(mean(x^2) + eps) * w, then the rotation of the first R elements."""
    x = x.astype(np.float64)
    f = np.ones(x.shape[-1]) if w is None else w.astype(np.float64) + (1.0 if unit_offset else 0)
    n = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * f
    table = np.asarray(cache.table, np.float64)
    R = table.shape[1]
    half = R // 2
    cos = table[positions, :half][:, None, :]
    sin = table[positions, half:][:, None, :]
    out = n.copy()
    if layout == "neox":
        a, b = n[..., :half], n[..., half:R]
        out[..., :half] = a * cos - b * sin
        out[..., half:R] = a * sin + b * cos
    else:
        a, b = n[..., 0:R:2], n[..., 1:R:2]
        out[..., 0:R:2] = a * cos - b * sin
        out[..., 1:R:2] = a * sin + b * cos
    return out


@pytest.mark.parametrize("layout", ["neox", "interleaved"])
@pytest.mark.parametrize("dim,rotary", [(128, 128), (80, 80), (96, 32), (17, 16)])
def test_numpy_forward_equals_float64_reference(layout, dim, rotary):
    rng = np.random.default_rng(dim + rotary)
    T, Hq, Hk = 7, 4, 2
    q = rng.standard_normal((T, Hq, dim)).astype(np.float32)
    k = rng.standard_normal((T, Hk, dim)).astype(np.float32)
    wq = (1 + 0.3 * rng.standard_normal(dim)).astype(np.float32)
    wk = (1 + 0.3 * rng.standard_normal(dim)).astype(np.float32)
    cache = embrope.RopeCache(rotary, 256)
    positions = rng.integers(0, 256, T)
    want_q = reference(q, wq, 1e-6, positions, cache, layout)
    want_k = reference(k, wk, 1e-6, positions, cache, layout)
    got_q, got_k = embrope.apply_qk_norm_rope(q, k, positions, cache, q_weight=wq, k_weight=wk,
                                              layout=layout, inplace=False)
    np.testing.assert_allclose(got_q, want_q, rtol=0, atol=4e-6 * np.abs(want_q).max() * 4)
    np.testing.assert_allclose(got_k, want_k, rtol=0, atol=4e-6 * np.abs(want_k).max() * 4)


def test_numpy_backward_equals_torch_autograd_of_the_float64_composition():
    rng = np.random.default_rng(3)
    T, Hq, Hk, D = 70, 4, 2, 64  # more rows than one weight-gradient chunk of 64
    q = rng.standard_normal((T, Hq, D)).astype(np.float32)
    k = rng.standard_normal((T, Hk, D)).astype(np.float32)
    wq = rng.standard_normal(D).astype(np.float32) * 0.2
    wk = rng.standard_normal(D).astype(np.float32) * 0.2
    dq = rng.standard_normal(q.shape).astype(np.float32)
    dk = rng.standard_normal(k.shape).astype(np.float32)
    cache = embrope.RopeCache(D, 128)
    positions = rng.integers(0, 128, T)
    gq = np.empty(D, np.float32)
    gk = np.empty(D, np.float32)
    got_dq, got_dk = embrope.apply_qk_norm_rope_backward(
        dq.copy(), dk.copy(), q, k, positions, cache, q_weight=wq, k_weight=wk, unit_offset=True,
        q_weight_grad=gq, k_weight_grad=gk)

    table = torch.from_numpy(np.asarray(cache.table, np.float64))
    pos = torch.from_numpy(positions)

    def composition(x, w):
        n = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * (1 + w)
        return reference_rope(n, pos, table)

    for x, w, dy, got_dx, got_w in ((q, wq, dq, got_dq, gq), (k, wk, dk, got_dk, gk)):
        xt = torch.from_numpy(x.astype(np.float64)).requires_grad_()
        wt = torch.from_numpy(w.astype(np.float64)).requires_grad_()
        composition(xt, wt).backward(torch.from_numpy(dy.astype(np.float64)))
        np.testing.assert_allclose(got_dx, xt.grad.numpy(), rtol=0,
                                   atol=2e-5 * np.abs(xt.grad.numpy()).max())
        np.testing.assert_allclose(got_w, wt.grad.numpy(), rtol=0,
                                   atol=2e-5 * np.abs(wt.grad.numpy()).max())


def reference_rope(x, positions, table, layout="neox"):
    R = table.shape[-1]
    half = R // 2
    cos = table[positions, :half].unsqueeze(-2)
    sin = table[positions, half:].unsqueeze(-2)
    rot, rest = x[..., :R], x[..., R:]
    a, b = rot[..., :half], rot[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin, rest], -1)


@pytest.mark.parametrize("model", ["qwen3", "gemma3"])
def test_equals_hf_qwen3_and_gemma3_norm_then_rope(model):
    """HF's own modules: Qwen3's q_norm (Qwen3RMSNorm) and Gemma 3's (Gemma3RMSNorm, 1 + w),
    then apply_rotary_pos_emb, in float32, against embrope in float32."""
    transformers = pytest.importorskip("transformers")  # noqa: F841
    torch.manual_seed(5)
    T, H, D = 9, 4, 128
    cache = embrope.RopeCache(D, 512, base=1000000.0)
    x = torch.randn(1, T, H, D)
    positions = torch.randint(0, 512, (T,))
    if model == "qwen3":
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, apply_rotary_pos_emb
        norm = Qwen3RMSNorm(D, eps=1e-6)
        unit = False
    else:
        from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm, apply_rotary_pos_emb
        norm = Gemma3RMSNorm(D, eps=1e-6)
        unit = True
    with torch.no_grad():
        norm.weight.copy_(torch.randn(D) * 0.2 + (0.0 if unit else 1.0))
        table = torch.from_numpy(np.array(cache.table))
        cos = torch.cat([table[positions, :D // 2]] * 2, -1)[None]
        sin = torch.cat([table[positions, D // 2:]] * 2, -1)[None]
        hf_q = norm(x).transpose(1, 2)  # [B, H, T, D]
        want, _ = apply_rotary_pos_emb(hf_q, hf_q, cos, sin)
        want = want.transpose(1, 2)[0]
        got, _ = et.apply_qk_norm_rope(x[0], None, positions, cache, q_weight=norm.weight.detach(),
                                       eps=1e-6, unit_offset=unit)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6 * want.abs().max().item())


def test_torch_autograd_matches_the_unfused_composition_and_opcheck():
    torch.manual_seed(1)
    T, Hq, Hk, D, R = 6, 4, 2, 32, 16
    cache = embrope.RopeCache(R, 64)
    table = torch.from_numpy(np.array(cache.table))
    positions = torch.randint(0, 64, (T,))
    q = torch.randn(T, Hq, D, requires_grad=True)
    k = torch.randn(T, Hk, D, requires_grad=True)
    wq = (1 + 0.2 * torch.randn(D)).requires_grad_()
    wk = (1 + 0.2 * torch.randn(D)).requires_grad_()
    q_out, k_out = et.apply_qk_norm_rope(q, k, positions, table, q_weight=wq, k_weight=wk)
    gy_q, gy_k = torch.randn_like(q_out), torch.randn_like(k_out)
    (q_out * gy_q).sum().add((k_out * gy_k).sum()).backward()

    def composition(x, w):
        n = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w
        return reference_rope(n, positions, table.double())

    q64 = q.detach().double().requires_grad_()
    k64 = k.detach().double().requires_grad_()
    wq64 = wq.detach().double().requires_grad_()
    wk64 = wk.detach().double().requires_grad_()
    (composition(q64, wq64) * gy_q.double()).sum().add(
        (composition(k64, wk64) * gy_k.double()).sum()).backward()
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (wq.grad, wq64.grad),
                      (wk.grad, wk64.grad)):
        torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-5 * want.abs().max().item())

    args = (q, k, positions, table, wq, wk, 1e-6, False, 0, False, 0, [0, 0, 0, 0])
    torch.library.opcheck(torch.ops.embrope.apply_qk_norm_rope.default, args)
    torch.library.opcheck(torch.ops.embrope.apply_qk_norm_rope_backward.default,
                          (q_out.detach(), k_out.detach(), q.detach(), k.detach(), positions,
                           table, wq.detach(), wk.detach(), 1e-6, False, 0, False, 0,
                           [0, 0, 0, 0], True, True))


def test_errors_name_the_op_and_the_rule():
    q = np.ones((2, 2, 16), np.float32)
    cache = embrope.RopeCache(16, 8)
    with pytest.raises(embrope.InvalidArgumentError, match="apply_qk_norm_rope: eps"):
        embrope.apply_qk_norm_rope(q, None, np.arange(2), cache, eps=-1.0)
    with pytest.raises(embrope.InvalidArgumentError, match="q_weight"):
        embrope.apply_qk_norm_rope(q, None, np.arange(2), cache, q_weight=np.ones(8, np.float32))
    with pytest.raises(embrope.BadIndexError, match="apply_qk_norm_rope"):
        embrope.apply_qk_norm_rope(q, None, np.array([0, 9]), cache)
