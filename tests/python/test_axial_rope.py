"""Axial RoPE (RopeCache.axial and its presets) against the code the models run: diffusers'
FluxPosEmbed / Flux2PosEmbed / WanRotaryPosEmbed with apply_rotary_emb, transformers'
Qwen2-VL vision rotary with apply_rotary_pos_emb_vision, and timm's build_rotary_pos_embed
with apply_rot_embed; plus the float64 formula and the torch custom op's autograd."""

import math

import numpy as np
import pytest

import embrope

torch = pytest.importorskip("torch")
import embrope.torch as et  # noqa: E402


def _bshd(x):
    """[B, H, S, D] (diffusers' attention layout) as the [B, S, H, D] view embrope takes."""
    return x.transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flux_matches_diffusers(dtype):
    transformer_flux = pytest.importorskip("diffusers.models.transformers.transformer_flux")
    from diffusers.models.embeddings import apply_rotary_emb

    # Flux's ids: 7 text tokens at (0, 0, 0), then a 6 x 5 latent grid at (0, row, col).
    rows, cols = torch.meshgrid(torch.arange(6), torch.arange(5), indexing="ij")
    img_ids = torch.stack([torch.zeros_like(rows), rows, cols], -1).reshape(-1, 3)
    ids = torch.cat([torch.zeros(7, 3, dtype=img_ids.dtype), img_ids]).float()
    cos, sin = transformer_flux.FluxPosEmbed(theta=10000, axes_dim=[16, 56, 56])(ids)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 3, ids.shape[0], 128, generator=g).to(dtype)
    k = torch.randn(2, 3, ids.shape[0], 128, generator=g).to(dtype)
    want_q = apply_rotary_emb(q, (cos, sin), use_real=True, use_real_unbind_dim=-1)
    want_k = apply_rotary_emb(k, (cos, sin), use_real=True, use_real_unbind_dim=-1)

    cache = embrope.RopeCache.flux(max_positions=64)
    positions = ids.long().T.unsqueeze(1).expand(3, 2, -1)  # [3, B, S]
    got_q, got_k = et.apply_rope(_bshd(q), _bshd(k), positions, cache)
    # The same float32 products and sums as diffusers' (x cos + rot(x) sin), one rounding:
    # equal where the tables are (diffusers rounds float64 cos/sin once, as embrope does).
    torch.testing.assert_close(got_q, _bshd(want_q), rtol=0, atol=0)
    torch.testing.assert_close(got_k, _bshd(want_k), rtol=0, atol=0)


def test_flux2_four_axes_match_diffusers():
    transformer_flux2 = pytest.importorskip("diffusers.models.transformers.transformer_flux2")
    from diffusers.models.embeddings import apply_rotary_emb

    g = torch.Generator().manual_seed(6)
    ids = torch.randint(0, 40, (19, 4), generator=g)
    cos, sin = transformer_flux2.Flux2PosEmbed(theta=2000, axes_dim=(32, 32, 32, 32))(ids)
    q = torch.randn(1, 2, 19, 128, generator=g)
    want = apply_rotary_emb(q, (cos, sin), use_real=True, use_real_unbind_dim=-1)
    got, _ = et.apply_rope(_bshd(q), None, ids.T.unsqueeze(1), embrope.RopeCache.flux2(40))
    torch.testing.assert_close(got, _bshd(want), rtol=0, atol=0)


def test_wan_table_and_rotation_match_diffusers():
    transformer_wan = pytest.importorskip("diffusers.models.transformers.transformer_wan")
    from diffusers.models.embeddings import apply_rotary_emb

    rope = transformer_wan.WanRotaryPosEmbed(attention_head_dim=128, patch_size=(1, 2, 2),
                                             max_seq_len=1024)
    frames, height, width = 3, 8, 6  # latent frames and pixels: 3 x 4 x 3 patches
    cos, sin = rope(torch.zeros(1, 16, frames, height, width))
    cos, sin = cos.reshape(-1, 128), sin.reshape(-1, 128)
    f, h, w = torch.meshgrid(torch.arange(3), torch.arange(4), torch.arange(3), indexing="ij")
    positions = torch.stack([f.flatten(), h.flatten(), w.flatten()])  # [3, T], Wan's order
    cache = embrope.RopeCache.wan(head_dim=128, max_positions=1024)
    assert cache.axes_dim == (44, 42, 42)
    # Wan's tables repeat each frequency over its pair (interleaved): the cache's rows
    # gathered per axis are those values.
    table = torch.from_numpy(np.array(cache.table))
    half = 64
    want_cos = torch.empty(positions.shape[1], half)
    first = 0
    for axis, dim in enumerate(cache.axes_dim):
        cols = slice(first, first + dim // 2)
        want_cos[:, cols] = table[positions[axis], cols]
        first += dim // 2
    torch.testing.assert_close(cos[:, 0::2], want_cos, rtol=0, atol=0)
    torch.testing.assert_close(cos[:, 1::2], want_cos, rtol=0, atol=0)
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 2, positions.shape[1], 128, generator=g)
    want = apply_rotary_emb(q, (cos, sin), use_real=True, use_real_unbind_dim=-1)
    got, _ = et.apply_rope(_bshd(q), None, positions.unsqueeze(1), cache)
    torch.testing.assert_close(got, _bshd(want), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_qwen2_vl_vision_matches_transformers(dtype):
    modeling = pytest.importorskip("transformers.models.qwen2_vl.modeling_qwen2_vl")
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
    from transformers.vision_utils import get_vision_position_ids

    # A tiny vision tower: head dim 160 / 2 = 80, as the real one's 1280 / 16.
    config = Qwen2VLVisionConfig(depth=1, embed_dim=160, num_heads=2, hidden_size=64,
                                 spatial_merge_size=2)
    rotary = modeling.Qwen2VLVisionRotaryEmbedding(config)
    grid_thw = torch.tensor([[1, 4, 6], [2, 2, 4], [1, 8, 2]])
    position_ids = get_vision_position_ids(grid_thw, 2)  # [T, 2]: row, column
    tokens = position_ids.shape[0]
    cos, sin = rotary(torch.zeros(tokens, 160), position_ids)
    g = torch.Generator().manual_seed(8)
    q = torch.randn(tokens, 2, 80, generator=g).to(dtype)
    k = torch.randn(tokens, 2, 80, generator=g).to(dtype)
    want_q, want_k = modeling.apply_rotary_pos_emb_vision(q, k, cos, sin)

    cache = embrope.RopeCache.qwen2_vl_vision(head_dim=80, max_positions=64)
    got_q, got_k = et.apply_rope(q, k, position_ids.T, cache)
    # HF computes its angles in float32 (inv_freq and the products): a few float32 ulps of
    # the angle (|angle| < 8 here) apart from the float64-exact table.
    tol = dict(rtol=0, atol=2e-5) if dtype == torch.float32 else dict(rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(got_q, want_q, **tol)
    torch.testing.assert_close(got_k, want_k, **tol)


def test_timm_2d_rope_matches():
    pos_embed = pytest.importorskip("timm.layers.pos_embed_sincos")
    head_dim, height, width = 64, 7, 9
    sin_emb, cos_emb = pos_embed.build_rotary_pos_embed(
        [height, width], dim=head_dim, temperature=10000.0, in_pixels=False)
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, 3, height * width, head_dim, generator=g)  # [B, heads, N, D]
    want = pos_embed.apply_rot_embed(x, sin_emb, cos_emb)
    rows, cols = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    positions = torch.stack([rows.flatten(), cols.flatten()]).unsqueeze(1).expand(2, 2, -1)
    cache = embrope.RopeCache.vit_2d(head_dim, max_positions=16)
    got, _ = et.apply_rope(_bshd(x), None, positions, cache)
    # timm's bands and angles are float32: ulps of the angle apart.
    torch.testing.assert_close(got, _bshd(want), rtol=0, atol=2e-5)


def test_axial_against_the_float64_formula_numpy():
    axes_dim, bases = [16, 24, 24], [100.0, 10000.0, 500.0]
    cache = embrope.RopeCache.axial(axes_dim, 32, bases, layout="interleaved")
    rng = np.random.default_rng(10)
    q = rng.standard_normal((5, 2, 70)).astype(np.float32)
    positions = rng.integers(0, 32, (3, 5))
    got, _ = embrope.apply_rope(q, None, positions, cache, inplace=False)
    want = q.astype(np.float64).copy()
    pair = 0
    for axis, (dim, base) in enumerate(zip(axes_dim, bases)):
        for j in range(dim // 2):
            angle = positions[axis] * base ** (-2.0 * j / dim)
            c, s = np.cos(angle)[:, None], np.sin(angle)[:, None]
            a, b = q[:, :, 2 * pair].astype(np.float64), q[:, :, 2 * pair + 1].astype(np.float64)
            want[:, :, 2 * pair], want[:, :, 2 * pair + 1] = a * c - b * s, a * s + b * c
            pair += 1
    np.testing.assert_allclose(got, want, rtol=0, atol=3e-6)
    assert np.array_equal(got[:, :, 64:], q[:, :, 64:])  # past the rotary dim: copied


def test_axial_autograd_and_explicit_axes_with_a_table_tensor():
    cache = embrope.RopeCache.qwen2_vl_vision(head_dim=80, max_positions=32)
    table = torch.from_numpy(np.array(cache.table))
    g = torch.Generator().manual_seed(11)
    q = torch.randn(6, 2, 80, generator=g, dtype=torch.float64).float().requires_grad_()
    positions = torch.randint(0, 32, (2, 6), generator=g)
    out_cache, _ = et.apply_rope(q, None, positions, cache)
    out_table, _ = et.apply_rope(q, None, positions, table, axes_dim=[40, 40])
    torch.testing.assert_close(out_table, out_cache, rtol=0, atol=0)
    # Rotations are orthogonal: the gradient of sum(out * w) rotates w back, so its norm per
    # (token, head) row is w's.
    w = torch.randn(6, 2, 80, generator=g)
    (out_cache * w).sum().backward()
    torch.testing.assert_close(q.grad.norm(dim=-1), w.norm(dim=-1), rtol=1e-5, atol=1e-6)
    # And equals the float64 transpose of the forward map, built column by column.
    eye = torch.eye(80).expand(6, 2, 80, 80)
    columns = [et.apply_rope(eye[:, :, i].contiguous(), None, positions, cache)[0]
               for i in range(80)]
    jacobian = torch.stack(columns, -1).double()  # [T, H, out, in]
    want = torch.einsum("thoi,tho->thi", jacobian, w.double())
    torch.testing.assert_close(q.grad.double(), want, rtol=0, atol=1e-5)
    # The explicit backward and the module take a table tensor's axes as apply_rope does.
    dq, _ = et.apply_rope_backward(w, None, positions, table, axes_dim=[40, 40])
    torch.testing.assert_close(dq, q.grad, rtol=0, atol=0)
    module_out, _ = et.RotaryEmbedding(table, axes_dim=[40, 40])(positions, q.detach())
    torch.testing.assert_close(module_out, out_cache.detach(), rtol=0, atol=0)
    assert torch.library.opcheck(torch.ops.embrope.apply_rope,
                                 (q.detach(), None, positions, table,
                                  *et._rope_arguments("apply_rope", cache, None, False, 0, None,
                                                      None))) is not None


def test_axial_errors_name_the_rule():
    cache = embrope.RopeCache.flux(32)
    q = np.zeros((4, 1, 128), np.float32)
    with pytest.raises(embrope.InvalidArgumentError, match=r"positions .* 3 axes"):
        embrope.apply_rope(q, None, np.zeros((2, 4), np.int64), cache)
    with pytest.raises(embrope.InvalidArgumentError, match=r"axes_dim \[64, 64, 0, 0\] differs"):
        embrope.apply_rope(q, None, np.zeros((2, 4), np.int64), cache, axes_dim=[64, 64])
    with pytest.raises(embrope.InvalidArgumentError, match="1 to 4 axes"):
        embrope.apply_rope(q, None, np.zeros((5, 4), np.int64), cache, axes_dim=[32] * 5)
    with pytest.raises(embrope.InvalidArgumentError, match="base has 2 entries"):
        embrope.RopeCache.axial([16, 56, 56], 32, [1e4, 1e4])
    with pytest.raises(embrope.InvalidArgumentError, match="axis 2: rotary_dim 55"):
        embrope.RopeCache.axial([16, 56, 55], 32)
    with pytest.raises(embrope.BadIndexError, match="apply_rope"):
        embrope.apply_rope(q, None, np.full((3, 4), 32, np.int64), cache)
    assert "axes_dim=[16, 56, 56]" in repr(cache)
    assert embrope.RopeCache(64, 8).axes_dim is None
    assert math.isclose(cache.attention_factor, 1.0)


def test_caches_from_diffusers_and_transformers_configs_match_the_models_own_modules():
    diffusers = pytest.importorskip("diffusers")
    from diffusers.models.embeddings import apply_rotary_emb

    g = torch.Generator().manual_seed(12)
    # A tiny Flux transformer with its own axes: the cache from its config against its
    # pos_embed, through the model object, its config and the config's dict.
    flux = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=8, pooled_projection_dim=8,
        axes_dims_rope=[4, 6, 6])
    for source in (flux, flux.config, dict(flux.config)):
        cache = embrope.RopeCache.from_diffusers_config(source, max_positions=32)
        assert cache.axes_dim == (4, 6, 6) and cache.layout == "interleaved"
    ids = torch.randint(0, 32, (11, 3), generator=g)
    cos, sin = flux.pos_embed(ids.float())
    q = torch.randn(1, 2, 11, 16, generator=g)
    want = apply_rotary_emb(q, (cos, sin), use_real=True, use_real_unbind_dim=-1)
    got, _ = et.apply_rope(_bshd(q), None, ids.T.unsqueeze(1), cache)
    torch.testing.assert_close(got, _bshd(want), rtol=0, atol=0)

    # A tiny Wan transformer: head dim 24, axes [8, 8, 8], rope_max_seq_len rows.
    wan = diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=24, in_channels=4,
        out_channels=4, text_dim=8, freq_dim=8, ffn_dim=16, num_layers=1, rope_max_seq_len=64)
    cache = embrope.RopeCache.from_diffusers_config(wan.config)
    assert cache.axes_dim == (8, 8, 8) and cache.max_positions == 64
    cos, sin = wan.rope(torch.zeros(1, 4, 2, 6, 4))
    cos = cos.reshape(-1, 24)
    f, h, w = torch.meshgrid(torch.arange(2), torch.arange(3), torch.arange(2), indexing="ij")
    positions = torch.stack([f.flatten(), h.flatten(), w.flatten()])
    table = torch.from_numpy(np.array(cache.table))
    gathered = torch.cat([table[positions[0], 0:4], table[positions[1], 4:8],
                          table[positions[2], 8:12]], -1)
    torch.testing.assert_close(cos[:, 0::2], gathered, rtol=0, atol=0)

    with pytest.raises(embrope.InvalidArgumentError, match="neither axes_dims_rope"):
        embrope.RopeCache.from_diffusers_config({"_class_name": "UNet2DModel"})

    # Qwen2-VL's vision tower from the model's config (vision_config inside) and from the
    # vision config alone, against the vision rotary module.
    modeling = pytest.importorskip("transformers.models.qwen2_vl.modeling_qwen2_vl")
    from transformers import Qwen2VLConfig
    from transformers.vision_utils import get_vision_position_ids

    config = Qwen2VLConfig(vision_config=dict(depth=1, embed_dim=96, num_heads=2, hidden_size=32,
                                              spatial_merge_size=2))
    for source in (config, config.vision_config, config.to_dict()):
        cache = embrope.RopeCache.from_hf_vision_config(source, max_positions=16)
        assert cache.axes_dim == (24, 24) and cache.layout == "neox"
    positions = get_vision_position_ids(torch.tensor([[1, 4, 6]]), 2)
    cos, sin = modeling.Qwen2VLVisionRotaryEmbedding(config.vision_config)(
        torch.zeros(positions.shape[0], 96), positions)
    q = torch.randn(positions.shape[0], 2, 48, generator=g)
    want, _ = modeling.apply_rotary_pos_emb_vision(q, q.clone(), cos, sin)
    got, _ = et.apply_rope(q, None, positions.T, cache)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5)
