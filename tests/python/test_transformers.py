"""embrope.transformers.patch against HF transformers' own models (PyPI `transformers`, CPU).

Every family patch() supports is built as a tiny random model from a config (two layers, the
head layout and RoPE variant of the real family), and for each:
- logits of the patched model equal the unpatched model's within float32 rounding;
- at positions past 8K, where HF's float32 angles drift, both are compared with a float64
  run of HF's model whose rotary module is a float64 transliteration of HF's formulas
  (reference.py): the patched model is at least as close as HF's own;
- greedy generate() gives the same tokens for 20 steps with a dynamic and a static cache;
- 5 optimizer steps with gradient checkpointing give the same losses within 1e-5;
- torch.compile(fullgraph=True) of the patched forward runs (no graph break) and agrees.
Each check is shown to fail on a deliberately wrong patch (test_checks_catch_a_wrong_patch).
"""

import copy
import dataclasses
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import embrope  # noqa: E402
import embrope.transformers as et  # noqa: E402
import reference as ref  # noqa: E402

pytestmark = pytest.mark.ci_required

HEAD = 16
COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16384,
              tie_word_embeddings=False,
              initializer_range=0.2)  # attention sharp enough that positions matter


def _config(family: str):
    c = dict(COMMON)
    if family == "llama":
        c["rope_parameters"] = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                                    low_freq_factor=1.0, high_freq_factor=4.0,
                                    original_max_position_embeddings=2048)
        return transformers.LlamaConfig(**c)
    if family == "llama_dynamic":
        c["max_position_embeddings"] = 4096
        c["rope_parameters"] = dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0)
        return transformers.LlamaConfig(**c)
    if family == "mistral":
        return transformers.MistralConfig(sliding_window=None, **c)
    if family == "qwen2":
        c["rope_parameters"] = dict(rope_type="yarn", rope_theta=1e6, factor=4.0,
                                    original_max_position_embeddings=4096)
        return transformers.Qwen2Config(**c)
    if family == "qwen2_moe":
        return transformers.Qwen2MoeConfig(num_experts=4, num_experts_per_tok=2,
                                           moe_intermediate_size=32,
                                           shared_expert_intermediate_size=32, **c)
    if family == "granite":
        return transformers.GraniteConfig(attention_multiplier=0.2, embedding_multiplier=2.0,
                                          residual_multiplier=0.5, logits_scaling=4.0, **c)
    if family == "phi3":
        c["num_key_value_heads"] = 4
        rng = np.random.default_rng(3)
        c["rope_parameters"] = dict(
            rope_type="longrope", rope_theta=10000.0, original_max_position_embeddings=4096,
            short_factor=[float(x) for x in 1.0 + rng.random(HEAD // 2)],
            long_factor=[float(x) for x in 1.0 + 20 * rng.random(HEAD // 2)])
        return transformers.Phi3Config(pad_token_id=0, **c)
    if family == "gpt_neox":
        c.pop("num_key_value_heads")
        c["rope_parameters"] = dict(rope_type="default", rope_theta=10000.0,
                                    partial_rotary_factor=0.5)
        return transformers.GPTNeoXConfig(**c)
    if family == "gptj":
        c.pop("num_key_value_heads")
        return transformers.GPTJConfig(rotary_dim=HEAD // 2, resid_pdrop=0.0, embd_pdrop=0.0,
                                       attn_pdrop=0.0, **c)
    if family == "qwen3":
        return transformers.Qwen3Config(head_dim=HEAD, **c)
    if family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(head_dim=HEAD, num_experts=4, num_experts_per_tok=2,
                                           moe_intermediate_size=32, **c)
    if family == "gemma3_text":
        c["rope_parameters"] = {
            "sliding_attention": dict(rope_type="default", rope_theta=10000.0),
            "full_attention": dict(rope_type="linear", rope_theta=1e6, factor=8.0)}
        return transformers.Gemma3TextConfig(
            head_dim=HEAD, query_pre_attn_scalar=HEAD, sliding_window=8,
            layer_types=["sliding_attention", "full_attention"], **c)
    if family in MROPE:  # the language model of a tiny VL model (a one-block vision tower)
        sections = [4, 2, 2] if family == "qwen3_vl" else [2, 3, 3]  # rotary_dim / 2 = 8
        c["rope_parameters"] = dict(rope_type="default", rope_theta=1e6, mrope_section=sections)
        vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64,
                      out_hidden_size=64, initializer_range=0.2)
        if family == "qwen2_vl":
            vision = dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2,
                          initializer_range=0.2)
        else:
            c["head_dim"] = HEAD
        configs = dict(qwen2_vl=transformers.Qwen2VLConfig,
                       qwen2_5_vl=transformers.Qwen2_5_VLConfig,
                       qwen3_vl=transformers.Qwen3VLConfig)
        return configs[family](text_config=c, vision_config=vision)
    if family == "deepseek_v3":  # MLA, YaRN with mscale, interleaved rope weights
        c.update(num_key_value_heads=4, moe_intermediate_size=32, n_routed_experts=4,
                 num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1,
                 kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=HEAD, qk_nope_head_dim=16,
                 v_head_dim=16, rope_interleave=True)
        c["rope_parameters"] = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                    original_max_position_embeddings=4096, beta_fast=32,
                                    beta_slow=1, mscale=1.0, mscale_all_dim=0.8)
        return transformers.DeepseekV3Config(**c)
    encoder = dict(vocab_size=c["vocab_size"], hidden_size=64, num_hidden_layers=2,
                   num_attention_heads=4, intermediate_size=96, initializer_range=0.2,
                   hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    if family == "bert":
        return transformers.BertConfig(type_vocab_size=2, **encoder)
    if family == "roberta":  # padding id 1; positions count from it
        return transformers.RobertaConfig(max_position_embeddings=40, **encoder)
    if family == "xlm-roberta":
        return transformers.XLMRobertaConfig(max_position_embeddings=40, **encoder)
    if family == "gpt2":
        return transformers.GPT2Config(vocab_size=c["vocab_size"], n_embd=64, n_layer=2, n_head=4,
                                       n_positions=64, initializer_range=0.2, resid_pdrop=0.0,
                                       embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=0)
    if family == "opt":  # positions from the attention mask, 2 rows of offset
        return transformers.OPTConfig(vocab_size=c["vocab_size"], hidden_size=64,
                                      num_hidden_layers=2, ffn_dim=96, num_attention_heads=4,
                                      word_embed_proj_dim=32, max_position_embeddings=64,
                                      init_std=0.2, dropout=0.0, pad_token_id=1)
    raise KeyError(family)


MROPE = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
ROPE_FAMILIES = ["llama", "llama_dynamic", "mistral", "qwen2", "qwen2_moe", "granite", "phi3",
                 "gptj", "gpt_neox", "qwen3", "qwen3_moe", "gemma3_text", *MROPE, "deepseek_v3"]
ENCODERS = ["bert", "roberta", "xlm-roberta"]  # the embedding block with LayerNorm
LEARNED = ["gpt2", "opt"]  # learned positions
FAMILIES = ROPE_FAMILIES + ENCODERS + LEARNED
GENERATIVE = ROPE_FAMILIES + LEARNED


def _model(family: str, dtype=torch.float32):
    torch.manual_seed(0)
    config = _config(family)
    config._attn_implementation = "eager"
    if family in MROPE:
        config.get_text_config()._attn_implementation = "eager"
        kind = dict(qwen2_vl=transformers.Qwen2VLForConditionalGeneration,
                    qwen2_5_vl=transformers.Qwen2_5_VLForConditionalGeneration,
                    qwen3_vl=transformers.Qwen3VLForConditionalGeneration)[family]
        model = kind(config).eval()
    elif family in ENCODERS:
        model = transformers.AutoModelForMaskedLM.from_config(config).eval()
    else:
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
    if family == "gemma3_text":  # HF initialises the norms' w to 0 (scale 1 + 0): perturb
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.normal_(0.0, 0.3)
    return model.to(dtype)


def _pair(family: str, dtype=torch.float32, **options):
    hf = _model(family, dtype)
    patched = copy.deepcopy(hf)
    report = et.patch(patched, **options)
    return hf, patched, report


# ---------------------------------------------------------- the float64 reference ----

def _float64_rotary(config):
    """HF's rotary module's forward in float64 from the formulas (reference.hf_inv_freq):
    (x, position_ids[, layer_type]) -> cos, sin [B, S, rotary_dim] as HF lays them out."""
    def forward(x, position_ids, layer_type=None):
        if config.model_type == "gptj":  # sin, cos [B, S, rotary_dim / 2], base 10000
            dim = config.rotary_dim
            inv_freq = torch.from_numpy(ref.default_inv_freq(10000.0, dim))
            angle = position_ids.double()[..., None] * inv_freq
            return angle.sin(), angle.cos()
        p = config.rope_parameters if layer_type is None else config.rope_parameters[layer_type]
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dim = int(head_dim * p.get("partial_rotary_factor", 1.0))
        seq_len = int(position_ids.max()) + 1
        inv_freq, attention = ref.hf_inv_freq(p, dim, config.max_position_embeddings,
                                              seq_len=seq_len)
        angle = position_ids.double()[..., None] * torch.from_numpy(inv_freq)
        if "mrope_section" in p:  # [3, B, S, R/2]: frequency i takes one stream's angle
            angle = angle[_mrope_streams(p["mrope_section"], config.model_type),
                          :, :, torch.arange(dim // 2)].permute(1, 2, 0)
        emb = torch.cat([angle, angle], dim=-1)
        return emb.cos() * attention, emb.sin() * attention
    return forward


def _mrope_streams(sections, model_type: str) -> torch.Tensor:
    """The position stream (0 temporal, 1 height, 2 width) of each frequency: Qwen2-VL's
    contiguous sections, or Qwen3-VL's interleaving (height at 1, 4, ... below 3 s_1, width
    at 2, 5, ... below 3 s_2, temporal elsewhere)."""
    half = sum(sections)
    if model_type.startswith("qwen3_vl"):
        return torch.tensor([1 if i % 3 == 1 and i < 3 * sections[1] else
                             2 if i % 3 == 2 and i < 3 * sections[2] else 0
                             for i in range(half)])
    return torch.tensor([j for j, n in enumerate(sections) for _ in range(n)])


def _float64_model(hf):
    model = copy.deepcopy(hf).double()
    model.config._experts_implementation = "eager"  # grouped_mm has no float64
    for module in model.modules():
        kind = type(module).__name__
        if kind.endswith("RotaryEmbedding") and "Vision" not in kind:
            module.forward = _float64_rotary(model.config.get_text_config())
    return model


# ------------------------------------------------------------------------ checks ----

def _ids(batch=2, length=12, seed=1):
    return torch.randint(0, COMMON["vocab_size"], (batch, length),
                         generator=torch.Generator().manual_seed(seed))


def _inputs(model, start=None, batch=2, length=12, seed=1):
    """Token ids and the forward's keyword arguments for a family: padding where the family's
    positions depend on it (RoBERTa's count from the padding: right-padded; OPT's from the
    attention mask: left-padded), and for the mrope families three position streams
    (temporal, height, width) that differ, as an image's tokens have them."""
    model_type = model.config.model_type
    ids = _ids(batch, length, seed)
    kwargs = {}
    pad = getattr(model.config.get_text_config(), "pad_token_id", None)
    if model_type in ENCODERS + ["opt"]:
        where = slice(-3, None) if model_type in ENCODERS else slice(0, 3)
        ids = ids.masked_fill(ids == pad, pad + 1)
        ids[0, where] = pad
        kwargs["attention_mask"] = (ids != pad).long()
    if model_type in MROPE:
        step = torch.arange(length)
        first = 0 if start is None else start
        kwargs["position_ids"] = torch.stack(
            [first + step, first + step // 3, first + step % 3 + 1])[:, None].expand(3, batch, -1)
    elif start is not None:
        kwargs["position_ids"] = torch.arange(start, start + length)[None]
    return ids, kwargs


def logits_error(hf, patched, positions=None) -> float:
    ids, kwargs = _inputs(hf)
    if positions is not None:
        kwargs["position_ids"] = positions
    with torch.no_grad():
        return float((hf(ids, **kwargs).logits - patched(ids, **kwargs).logits).abs().max())


def far_errors(hf, patched, start=8192):
    """(patched's, HF's) max abs logit error against the float64 run at positions past 8K."""
    ids, kwargs = _inputs(hf, start=start)
    with torch.no_grad():
        truth = _float64_model(hf)(ids, **kwargs).logits
        ours = patched(ids, **kwargs).logits.double()
        theirs = hf(ids, **kwargs).logits.double()
    return float((ours - truth).abs().max()), float((theirs - truth).abs().max())


def generated(model, cache: str):
    ids = _ids(batch=1, length=6, seed=2)
    mask = torch.ones_like(ids)
    if model.config.model_type == "opt":  # left padding: OPT counts positions over the mask
        ids[0, :2], mask[0, :2] = model.config.pad_token_id, 0
    kwargs = dict(max_new_tokens=20, min_new_tokens=20, do_sample=False, pad_token_id=0,
                  attention_mask=mask)
    if cache == "static":
        kwargs["cache_implementation"] = "static"
    return model.generate(ids, **kwargs)[0, ids.shape[1]:].tolist()


def losses(model, steps=5):
    model = copy.deepcopy(model).train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=dict(use_reentrant=False))
    # SGD: an update linear in the gradient. (Adam divides each gradient by its running
    # RMS, so parameters whose gradient is rounding noise move by the full step either way,
    # which turns float32 rounding differences into 1e-4 loss differences in 4 steps.)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    for step in range(steps):
        ids, kwargs = _inputs(model, seed=10 + step)
        loss = model(ids, labels=ids, **kwargs).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        out.append(loss.item())
    return out


# ------------------------------------------------------------------------- tests ----

@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_hf(family, report):
    hf, patched, _ = _pair(family)
    error = logits_error(hf, patched)
    report(f"transformers.patch {family}: logits vs HF float32 max abs {error:.2e}")
    assert error < 2e-5


@pytest.mark.parametrize("family", ROPE_FAMILIES)
def test_logits_past_8k_at_least_as_close_to_float64_as_hf(family, report):
    hf, patched, _ = _pair(family)
    ours, theirs = far_errors(hf, patched)
    report(f"transformers.patch {family} at 8K: vs float64 patched {ours:.2e}, HF {theirs:.2e}")
    assert ours <= max(theirs, 1e-6) * 1.05
    assert ours < 1e-5


# Dynamic NTK with a static cache: HF's table depends on the sequence seen so far either
# way; the dynamic cache checks it.
@pytest.mark.parametrize("family,cache", [(f, c) for f in GENERATIVE for c in ("dynamic", "static")
                                          if (f, c) != ("llama_dynamic", "static")])
def test_greedy_generate_gives_hfs_tokens(family, cache):
    hf, patched, _ = _pair(family)
    assert generated(patched, cache) == generated(hf, cache)


@pytest.mark.parametrize("family", FAMILIES)
def test_training_with_checkpointing_gives_hfs_losses(family):
    hf, patched, _ = _pair(family)
    expected, got = losses(hf), losses(patched)
    assert np.allclose(got, expected, rtol=0, atol=1e-5), (got, expected)


# Every family but dynamic NTK, whose table grows with the sequence from a host value (as
# HF's does: docs/transformers.md).
COMPILED = [f for f in FAMILIES if f != "llama_dynamic"]


def compiled_error(hf, patched) -> float:
    torch._dynamo.reset()
    compiled = torch.compile(patched, fullgraph=True, backend="aot_eager")
    ids, kwargs = _inputs(hf)
    with torch.no_grad():
        return float((compiled(ids, **kwargs).logits - hf(ids, **kwargs).logits).abs().max())


@pytest.mark.parametrize("family", COMPILED)
def test_compiles_whole(family):
    hf, patched, _ = _pair(family)
    assert compiled_error(hf, patched) < 2e-5


@pytest.mark.parametrize("family,dtype", [(f, d) for f in ("llama", "qwen3", "gemma3_text",
                                                           "qwen3_vl", "deepseek_v3", "bert")
                                          for d in (torch.float16, torch.bfloat16)])
def test_half_precision_within_the_dtypes_rounding(family, dtype):
    hf, patched, _ = _pair(family, dtype)
    truth = _float64_model(hf)
    ids, kwargs = _inputs(hf)
    with torch.no_grad():
        exact = truth(ids, **kwargs).logits
        ours = (patched(ids, **kwargs).logits.double() - exact).abs().max()
        theirs = (hf(ids, **kwargs).logits.double() - exact).abs().max()
    # Both round at every layer; embrope's rotation rounds once where HF rounds cos, sin,
    # the products and the sum: no further from float64 than HF, beyond a rounding step.
    assert float(ours) <= 1.5 * float(theirs) + 4 * torch.finfo(dtype).eps


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gemma_scaled_embedding_is_hfs_bit_for_bit(dtype):
    config = _config("gemma3_text")
    config.hidden_size = 80  # sqrt(80) is not a dtype value: HF rounds it first
    torch.manual_seed(0)
    hf = transformers.Gemma3TextModel(config).to(dtype).eval()
    patched = copy.deepcopy(hf)
    report = et.patch(patched, rope=False)
    assert "embed_tokens" in report.replaced
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(patched.embed_tokens(ids), hf.embed_tokens(ids))


# ------------------------------------------------ families with their own checks ----

IMAGE, VIDEO, START, END = 90, 91, 92, 93  # the tiny VL models' special token ids


def _vl_with_image(family):
    """A tiny VL model, patched and not, and a prompt with a 4 x 6-patch image between text
    tokens: HF's get_rope_index gives its tokens (temporal, height, width) positions and
    decoding continues from HF's rope_deltas."""
    torch.manual_seed(0)
    config = _config(family)
    for name, value in dict(image_token_id=IMAGE, video_token_id=VIDEO,
                            vision_start_token_id=START, vision_end_token_id=END).items():
        setattr(config, name, value)
    hf, _, _ = _pair(family)
    hf = type(hf)(config).eval()
    patched = copy.deepcopy(hf)
    et.patch(patched)
    vision = config.vision_config
    grid = torch.tensor([[1, 4, 6]])
    pixels = torch.randn(int(grid.prod()),
                         vision.in_channels * vision.temporal_patch_size * vision.patch_size ** 2,
                         generator=torch.Generator().manual_seed(5))
    image = int(grid.prod()) // vision.spatial_merge_size ** 2
    ids = torch.cat([_ids(1, 3, seed=6) % 80, torch.tensor([[START] + [IMAGE] * image + [END]]),
                     _ids(1, 4, seed=7) % 80], dim=1)
    kwargs = dict(pixel_values=pixels, image_grid_thw=grid, attention_mask=torch.ones_like(ids),
                  mm_token_type_ids=(ids == IMAGE).long())
    return hf, patched, ids, kwargs


@pytest.mark.parametrize("family", MROPE)
def test_vl_prompt_with_an_image_gives_hfs_logits_and_tokens(family):
    hf, patched, ids, kwargs = _vl_with_image(family)
    positions, _ = hf.model.get_rope_index(ids, image_grid_thw=kwargs["image_grid_thw"],
                                           mm_token_type_ids=kwargs["mm_token_type_ids"],
                                           attention_mask=kwargs["attention_mask"])
    assert not torch.equal(positions[1], positions[2])  # the image's rows and columns differ
    with torch.no_grad():
        assert float((hf(ids, **kwargs).logits - patched(ids, **kwargs).logits).abs().max()) < 2e-5
    options = dict(max_new_tokens=20, min_new_tokens=20, do_sample=False, pad_token_id=0)
    assert (patched.generate(ids, **kwargs, **options).tolist()
            == hf.generate(ids, **kwargs, **options).tolist())


def _vision_inputs(vision, seed=11):
    """Pixels of three images (one 2-frame video) whose grids differ, for a tiny vision tower:
    rows and columns up to 19, and Qwen2.5-VL's 8 x 8-patch attention windows cut in."""
    grid = torch.tensor([[1, 16, 20], [2, 8, 4], [1, 4, 12]])
    pixels = torch.randn(int(grid.prod(-1).sum()),
                         vision.in_channels * vision.temporal_patch_size * vision.patch_size ** 2,
                         generator=torch.Generator().manual_seed(seed))
    return pixels, grid


def _vision_outputs(model, pixels, grid):
    return model.model.visual(pixels, grid_thw=grid).last_hidden_state


@pytest.mark.parametrize("family", MROPE)
def test_vision_tower_gives_hfs_hidden_states_and_gradients(family):
    hf, patched, report = _pair(family)
    assert "axes_dim [8, 8]" in report.replaced["model.visual.rotary_pos_emb"]
    assert "axial" in report.replaced["model.visual.blocks.0.attn"]
    pixels, grid = _vision_inputs(hf.config.vision_config)
    outputs = [_vision_outputs(m, pixels, grid) for m in (hf, patched)]
    scale = float(outputs[0].detach().abs().max())
    assert float((outputs[0] - outputs[1]).abs().max()) < 2e-6 * scale
    # autograd through the rotation: the qkv projection's gradients are HF's
    g = torch.randn(outputs[0].shape, generator=torch.Generator().manual_seed(12))
    grads = []
    for model, out in zip((hf, patched), outputs):
        out.backward(g)
        grads.append(model.model.visual.blocks[0].attn.qkv.weight.grad)
    assert float((grads[0] - grads[1]).abs().max()) < 1e-5 * float(grads[0].abs().max())


def test_vision_tower_check_catches_rows_and_columns_swapped():
    hf, patched, _ = _pair("qwen2_5_vl")
    positions = patched.model.visual.rotary_pos_emb
    forward = positions.forward
    positions.forward = lambda x, position_ids: forward(x, position_ids.flip(-1))
    pixels, grid = _vision_inputs(hf.config.vision_config)
    with torch.no_grad():
        want, got = (_vision_outputs(m, pixels, grid) for m in (hf, patched))
    assert float((want - got).abs().max()) > 1e-3 * float(want.abs().max())


def test_vision_tower_kept_where_embrope_cannot_stand_in():
    _, _, off = _pair("qwen2_vl", vision=False)
    assert off.kept["model.visual.rotary_pos_emb"] == "vision=False"
    assert "model.visual.blocks.0.attn" not in off.replaced
    assert "model.language_model.rotary_emb" in off.replaced
    _, _, no_rope = _pair("qwen2_vl", rope=False)
    assert not any("visual" in path for path in no_rope.replaced)
    assert no_rope.kept["model.visual.rotary_pos_emb"] == "rope=False"
    # transformers 4's vision rotary module (called with the grid size, angles made in the
    # tower's forward), and frequencies that are not the config's: HF's code runs
    for how in ("signature", "frequencies"):
        hf = _model("qwen2_vl")
        rotary = hf.model.visual.rotary_pos_emb
        if how == "signature":
            rotary.forward = lambda seqlen: None
        else:
            rotary.inv_freq = rotary.inv_freq * 2
        report = et.patch(hf)
        why = report.kept["model.visual.rotary_pos_emb"]
        assert ("position_ids" if how == "signature" else "frequencies") in why
        assert "model.visual.blocks.0.attn" not in report.replaced


def test_vision_tower_refused_before_anything_is_replaced(monkeypatch):
    # A vision config embrope cannot read, or attention modules of a class the patch does not
    # know: HF's tower is kept with the reason, the language model is patched, and the model
    # stays whole (its vision logits are HF's, unpatch() works).
    hf = _model("qwen2_vl")
    pixels, grid = _vision_inputs(hf.config.vision_config)
    with torch.no_grad():
        want = _vision_outputs(hf, pixels, grid)
    unknown = dataclasses.replace(et._FAMILIES["qwen2_vl"], vision_attention=("Renamed",))
    for how in ("config", "class"):
        model = copy.deepcopy(hf)
        with monkeypatch.context() as patched_families:
            if how == "config":  # the reader's refusal of a config without the head layout
                def unreadable(*args, **kwargs):
                    raise embrope.InvalidArgumentError("RopeCache: the vision config has no "
                                                       "head_dim")
                patched_families.setattr(et.RopeCache, "from_hf_vision_config", unreadable)
            else:
                patched_families.setitem(et._FAMILIES, "qwen2_vl", unknown)
            report = et.patch(model)
        why = report.kept["model.visual.rotary_pos_emb"]
        assert ("no axial RoPE" if how == "config" else "Renamed") in why
        assert "model.language_model.rotary_emb" in report.replaced
        if how == "class":
            with torch.no_grad():
                assert torch.equal(_vision_outputs(model, pixels, grid), want)
        et.unpatch(model)


def test_vision_tower_of_a_model_cast_to_bfloat16_is_patched():
    # model.to(bfloat16) rounds HF's inv_freq buffer: the check allows its precision, and the
    # table stays float64-exact.
    hf, patched, report = _pair("qwen2_vl", torch.bfloat16)
    assert hf.model.visual.rotary_pos_emb.inv_freq.dtype == torch.bfloat16
    assert "axial table" in report.replaced["model.visual.rotary_pos_emb"]


def _mla_caches(hf, patched):
    ids, _ = _inputs(hf)
    with torch.no_grad():
        caches = [model(ids, use_cache=True).past_key_values for model in (hf, patched)]
    return [(a.keys, b.keys, a.values, b.values) for a, b in zip(*(c.layers for c in caches))]


def test_deepseek_cache_holds_hfs_rotated_k_pe():
    # The latent cache holds (kv_c, rotated k_pe): HF returns interleaved pairs rotated in
    # rotate_half order, and a model that reads its cache (vLLM's, a saved prefix) needs
    # those exact values, not only the same attention scores.
    hf, patched, report = _pair("deepseek_v3")
    assert "rotate_half order" in report.replaced["model.layers.0.self_attn"]
    for layer, (hf_kv, our_kv, hf_pe, our_pe) in enumerate(_mla_caches(hf, patched)):
        if layer == 0:  # the same input: the same latent, k_pe within the rotation's rounding
            assert torch.equal(hf_kv, our_kv)
        assert float((hf_kv - our_kv).abs().max()) < 1e-5 * float(hf_kv.abs().max())
        assert float((hf_pe - our_pe).abs().max()) < 1e-5 * float(hf_pe.abs().max())


def embedding_gradient_errors(hf, patched):
    """Max abs difference of the embedding block's parameter gradients (patched vs HF) after
    one masked-LM loss over padded ids, per parameter, relative to HF's largest."""
    grads = []
    for model in (hf, patched):
        ids, kwargs = _inputs(model)
        model(ids, labels=ids, **kwargs).loss.backward()
        grads.append(dict(model.base_model.embeddings.named_parameters()))
    assert set(grads[0]) == set(grads[1])
    return {name: float((grads[1][name].grad - p.grad).abs().max() / p.grad.abs().max())
            for name, p in grads[0].items()}


@pytest.mark.parametrize("family", ENCODERS)
def test_embedding_block_gradients_are_hfs(family):
    hf, patched, report = _pair(family)
    assert "LayerNorm in one pass" in report.replaced[f"{family.split('-')[-1]}.embeddings"]
    errors = embedding_gradient_errors(hf, patched)
    assert max(errors.values()) < 1e-5, errors
    positions = patched.base_model.embeddings.position_embeddings
    if positions.padding_idx is not None:  # RoBERTa: the padded tokens' row gets none
        assert not positions.weight.grad[positions.padding_idx].any()


def test_encoders_given_inputs_embeds_run_hfs_code():
    hf, patched, _ = _pair("roberta")
    ids, kwargs = _inputs(hf)
    embeds = hf.roberta.embeddings.word_embeddings(ids)
    with torch.no_grad():
        assert torch.equal(patched(inputs_embeds=embeds, **kwargs).logits,
                           hf(inputs_embeds=embeds, **kwargs).logits)


# HF's float32 angles drift by up to ~1e-3 in these logits at 4K-9K (see the 8K test):
# tolerance for patched vs HF there. A wrong factor set or base moves them by O(1).
FAR = 5e-3


def test_longrope_follows_hfs_short_and_long_factors():
    hf, patched, _ = _pair("phi3")
    for start in (0, 4000, 4090, 8192, 100):  # short, short, crossing 4K (long), long, short
        positions = torch.arange(start, start + 12)[None]
        assert logits_error(hf, patched, positions) < (2e-5 if start == 0 else FAR), start


def test_dynamic_ntk_grows_and_resets_as_hf():
    hf, patched, _ = _pair("llama_dynamic")
    # grow, grow, keep the longest (HF's max_seq_len_cached), reset below 4K, grow again
    for start in (0, 6000, 9000, 6000, 100, 5000):
        positions = torch.arange(start, start + 12)[None]
        assert logits_error(hf, patched, positions) < (2e-5 if start == 0 else FAR), start


def test_dynamic_ntk_gives_each_thread_the_table_of_its_own_length():
    # Threads sharing a patched model: a forward's table was read back after its update, so
    # another thread's update in between (a reset below the original context) gave a long
    # sequence the short one's table. Here that other thread's whole forward runs right after
    # this one's update.
    import threading

    _, patched, _ = _pair("llama_dynamic")
    positions = next(m for m in patched.modules() if type(m).__name__ == "_EmbropePositions")
    tables = positions._tables[None]
    short, long = torch.arange(100)[None], torch.arange(6000, 6012)[None]
    _, long_alone = positions(None, long)
    long_alone = long_alone.clone()
    _, short_alone = positions(None, short)
    short_alone = short_alone.clone()
    update = tables._dynamic_update

    def update_then_another_thread(sequence_length, device):
        table = update(sequence_length, device)
        if sequence_length > 1000:
            other = threading.Thread(target=positions, args=(None, short))
            other.start()
            other.join()
        return table

    tables._dynamic_update = update_then_another_thread
    _, got = positions(None, long)
    assert torch.equal(got, long_alone) and not torch.equal(got, short_alone)


def test_dynamic_ntk_starts_and_resets_at_hfs_context_whatever_the_table():
    # HF starts from the plain base and measures growth against max_position_embeddings only:
    # a table of 16K rows started scaled for 16K (logits off by about 4), and an
    # original_max_position_embeddings in the parameters (which HF ignores) moved the growth.
    hf = _model("llama_dynamic")
    # HF's frequencies do not depend on that field (so hf stands for both configs).
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    with_field = copy.deepcopy(hf.config)
    with_field.rope_parameters["original_max_position_embeddings"] = 1024
    for length in (None, 6000):
        assert torch.equal(ROPE_INIT_FUNCTIONS["dynamic"](hf.config, "cpu", seq_len=length)[0],
                           ROPE_INIT_FUNCTIONS["dynamic"](with_field, "cpu", seq_len=length)[0])
    for parameters in ({}, {"original_max_position_embeddings": 1024}):
        model = copy.deepcopy(hf)
        model.config.rope_parameters.update(parameters)
        et.patch(model, max_positions=16384)
        for start in (0, 2000, 6000, 100):
            positions = torch.arange(start, start + 12)[None]
            assert logits_error(hf, model, positions) < (2e-5 if start == 0 else FAR), \
                (parameters, start)


# ------------------------------------------------------------- the patch itself ----

def test_report_names_what_was_replaced_and_what_was_kept():
    _, _, report = _pair("qwen3")
    assert "model.rotary_emb" in report.replaced
    assert "apply_qk_norm_rope" in report.replaced["model.layers.0.self_attn"]
    assert "model.embed_tokens" in report.kept
    _, _, unfused = _pair("qwen3", qk_norm=False)
    assert "apply_rope" in unfused.replaced["model.layers.1.self_attn"]
    assert unfused.kept["model.layers.1.self_attn.q_norm/k_norm"] == "qk_norm=False"
    _, _, no_rope = _pair("qwen3", rope=False)
    assert not any("self_attn" in path for path in no_rope.replaced)
    assert "rope=False" in no_rope.kept.values()
    assert "qk_norm" in str(no_rope)


def test_report_of_the_multimodal_encoder_and_learned_families():
    _, _, vl = _pair("qwen2_vl")
    assert "mrope [2, 3, 3]" in vl.replaced["model.language_model.rotary_emb"]
    assert "axial table" in vl.replaced["model.visual.rotary_pos_emb"]
    _, _, qwen3_vl = _pair("qwen3_vl")
    assert "mrope [4, 2, 2] interleaved" in qwen3_vl.replaced["model.language_model.rotary_emb"]
    _, _, opt = _pair("opt")
    assert "offset 2" in opt.replaced["model.decoder.embed_positions"]
    assert "model.decoder.embed_tokens" in opt.kept
    _, _, gpt2 = _pair("gpt2")
    assert list(gpt2.replaced) == ["transformer.wpe"]
    hf, patched, _ = _pair("roberta")
    et.unpatch(patched)
    ids, kwargs = _inputs(hf)
    with torch.no_grad():
        assert torch.equal(patched(ids, **kwargs).logits, hf(ids, **kwargs).logits)


@pytest.mark.parametrize("family", ["qwen3", "gemma3_text"])
def test_qk_norm_unfused_equals_hf_too(family):
    hf, patched, _ = _pair(family, qk_norm=False)
    assert logits_error(hf, patched) < 2e-5


def test_unpatch_restores_hf_and_other_models_are_untouched():
    hf, patched, _ = _pair("llama")
    bystander = copy.deepcopy(hf)
    ids = _ids()
    with torch.no_grad():
        before = bystander(ids).logits
        patched(ids)
        assert torch.equal(bystander(ids).logits, before)
        et.unpatch(patched)
        assert torch.equal(patched(ids).logits, hf(ids).logits)
    assert type(patched.model.rotary_emb).__name__ == "LlamaRotaryEmbedding"
    et.patch(patched)  # patchable again


def test_state_dict_and_dtype_casts_are_unchanged_by_the_patch():
    hf, patched, _ = _pair("qwen3")
    assert list(patched.state_dict()) == list(hf.state_dict())
    patched.to(torch.bfloat16)
    table = patched.model.rotary_emb._tables[None].table
    assert table.dtype == torch.float32  # the positions stay exact whatever the model's dtype


def test_refusals_are_clear():
    hf, patched, _ = _pair("llama")
    with pytest.raises(embrope.NotAvailableError, match="already patched"):
        et.patch(patched)
    with pytest.raises(embrope.InvalidArgumentError, match="not patched"):
        et.unpatch(hf)
    config = transformers.BloomConfig(n_layer=1, hidden_size=32, n_head=2, vocab_size=64)
    with pytest.raises(embrope.NotAvailableError, match=r"'bloom' is not supported; supported: .*llama"):
        et.patch(transformers.BloomForCausalLM(config))
    assert "qwen3" in et.supported() and "gemma3_text" in et.supported()


# --------------------------------------------------- the checks fail on wrong patches ----

def _sabotaged(family: str, how: str):
    hf, patched, _ = _pair(family)
    for module in patched.modules():
        state = getattr(module, "_embrope_attention", None)
        if state is None:
            continue
        if how == "layout":
            state.rope["layout"] = "interleaved"
        elif how == "mrope" and state.vision is None:  # Qwen2-VL's sections, Qwen3-VL's order
            state.rope["mrope_interleaved"] = not state.rope["mrope_interleaved"]
        elif how == "unit_offset":
            state.family = copy.copy(state.family)
            object.__setattr__(state.family, "unit_offset", not state.family.unit_offset)
    if how == "positions":  # twice the angle (a shift would be invisible: RoPE is relative)
        positions = patched.model.rotary_emb
        forward = positions.forward
        positions.forward = lambda x, position_ids, *a: forward(x, position_ids * 2, *a)
    if how in ("longrope_offset", "no_growth"):
        tables = patched.model.rotary_emb._tables[None]
        if how == "longrope_offset":
            tables.original = 1 << 30  # always the short factors
        else:
            tables._dynamic_update = lambda *a: tables.table
    if how == "padding_positions":  # positions 0, 1, ... instead of counted from the padding
        block = patched.roberta.embeddings
        block.create_position_ids_from_input_ids = (
            lambda ids, padding_idx, past: torch.arange(ids.shape[1])[None].expand_as(ids))
    if how == "padding_gradient":  # the padding row of the position table left trainable
        patched.roberta.embeddings.position_embeddings.padding_idx = None
    if how == "opt_offset":
        patched.model.decoder.embed_positions.offset = 3  # HF: 2
    if how == "graph_break":
        positions = patched.model.rotary_emb
        forward = positions.forward

        def breaking(x, position_ids, *a):
            torch._dynamo.graph_break()
            return forward(x, position_ids, *a)
        positions.forward = breaking
    return hf, patched


def test_checks_catch_a_wrong_patch():
    hf, wrong = _sabotaged("llama", "layout")
    assert logits_error(hf, wrong) > 1e-3
    ours, theirs = far_errors(hf, wrong)
    assert ours > theirs
    hf, wrong = _sabotaged("llama", "positions")
    assert generated(wrong, "dynamic") != generated(hf, "dynamic")
    assert not np.allclose(losses(wrong), losses(hf), rtol=0, atol=1e-5)
    hf, wrong = _sabotaged("gemma3_text", "unit_offset")
    assert logits_error(hf, wrong) > 1e-3
    hf, wrong = _sabotaged("phi3", "longrope_offset")
    positions = torch.arange(4090, 4102)[None]
    assert logits_error(hf, wrong, positions) > FAR
    hf, wrong = _sabotaged("llama_dynamic", "no_growth")
    with pytest.raises(embrope.BadIndexError):  # the table of the original 4K, not grown
        logits_error(hf, wrong, torch.arange(6000, 6012)[None])
    hf, wrong = _sabotaged("llama", "graph_break")
    with pytest.raises(Exception, match="(?i)graph.?break"):
        compiled_error(hf, wrong)


def test_checks_of_the_later_families_catch_a_wrong_patch(monkeypatch):
    hf, wrong = _sabotaged("qwen3_vl", "mrope")
    assert logits_error(hf, wrong) > 1e-3
    hf, wrong = _sabotaged("roberta", "padding_positions")
    assert logits_error(hf, wrong) > 1e-3
    hf, wrong = _sabotaged("roberta", "padding_gradient")
    assert embedding_gradient_errors(hf, wrong)["position_embeddings.weight"] > 1e-3
    hf, wrong = _sabotaged("opt", "opt_offset")
    assert logits_error(hf, wrong) > 1e-3
    # DeepSeek: k_pe left in interleaved order gives HF's logits (q and k permuted alike)
    # but not HF's cache: the cache check catches what the logits cannot.
    monkeypatch.setattr(et, "_rotary_pairs_halved", lambda x: x)
    hf, wrong, _ = _pair("deepseek_v3")
    assert logits_error(hf, wrong) < 2e-5
    assert any(float((a - b).abs().max()) > 1e-2 for _, _, a, b in _mla_caches(hf, wrong))
