"""embrope in a Hugging Face ``transformers`` model, in one line.

>>> model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen3-0.6B")
>>> report = embrope.transformers.patch(model)      # this model only; unpatch(model) undoes it

:func:`patch` swaps, on one instantiated model, HF's position code for embrope's ops:

- the model's rotary module (HF computes cos and sin for every position of every forward, in
  float32) for embrope's float64-exact table of the same RoPE (every ``rope_type`` HF has:
  llama3, YaRN, LongRoPE with HF's per-forward choice of short or long factors, dynamic NTK
  with HF's cache growth, Gemma 3's per-layer-type RoPEs, the multimodal RoPE of the
  Qwen2-VL / Qwen2.5-VL / Qwen3-VL language models), and in those VL models the vision
  tower's rotary module for the axial (row, column) table of the same angles;
- each attention module's rotation (``apply_rotary_pos_emb``) for :func:`embrope.torch.apply_rope`
  on q and k as the projections wrote them (DeepSeek-V3: q's rope slice and the shared k_pe,
  returned in HF's order; a vision tower: both axes in one call), and, in the families with a
  per-head RMSNorm of q and k (Qwen3, Gemma 3, Qwen3-VL), the norm and the rotation for one
  :func:`embrope.torch.apply_qk_norm_rope`;
- the embeddings for :func:`embrope.torch.embed` where it does more than a lookup (Gemma's
  scaled embedding, rounded as HF rounds it; BERT's, RoBERTa's and XLM-R's word + position +
  token type + LayerNorm block in one pass) and the learned position lookups of GPT-2 and OPT.

Everything else (projections, the attention kernel HF's ``attn_implementation`` picks, the KV
cache, masks, MLPs) is HF's own code, untouched. Parameters, buffers that are saved and the
``state_dict`` do not change. Works with eager forwards, ``generate()`` with dynamic and static
caches, autograd and gradient checkpointing, and ``torch.compile(fullgraph=True)`` (except
dynamic NTK, whose table grows with the sequence as HF's does, which needs a host value).
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import threading
import types
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from . import _embrope as _C
from . import torch as _etorch
from ._native import dlpack_table
from ._rope_cache import RopeCache

__all__ = ["PatchReport", "patch", "supported", "unpatch"]


# ------------------------------------------------------------------------ families ----

@dataclasses.dataclass(frozen=True)
class _Family:
    """How one architecture's attention is laid out (read from its ``modeling_*.py``)."""

    attention: Tuple[str, ...] = ()  # attention class names (none: a model without RoPE)
    projection: str = "separate"  # "separate" (q/k/v_proj), "phi3" (qkv_proj), "neox", "mla"
    qk_norm: bool = False  # q_norm / k_norm per head before the rotation
    unit_offset: bool = False  # the norms scale by 1 + w (Gemma)
    sliding_window: Optional[str] = None  # what HF passes: "module", "config" or nothing
    output: str = "o_proj"
    output_dropout: Optional[str] = None  # a dropout module after the output projection
    cache_argument: str = "cache"
    mrope: bool = False  # positions [3, B, S] (temporal, height, width): Qwen2-VL, Qwen3-VL
    # What embrope does for the embeddings: "scaled" (Gemma's embed_tokens times
    # sqrt(hidden)), "block" (BERT's word + position + token type + LayerNorm module),
    # "positions" (GPT-2's wpe), "opt_positions" (OPT's learned positions, offset 2).
    embedding: Optional[str] = None
    # The vision tower's attention (a VL model): q and k rotated by the patches' (row,
    # column) positions, axial RoPE over two halves of the rotary features.
    vision_attention: Tuple[str, ...] = ()


_FAMILIES: Dict[str, _Family] = {
    "llama": _Family(("LlamaAttention",)),
    "mistral": _Family(("MistralAttention",), sliding_window="config"),
    "qwen2": _Family(("Qwen2Attention",), sliding_window="module"),
    "qwen2_moe": _Family(("Qwen2MoeAttention",)),
    "granite": _Family(("GraniteAttention",)),
    "phi3": _Family(("Phi3Attention",), projection="phi3", sliding_window="config"),
    "gptj": _Family(("GPTJAttention",), output="out_proj", output_dropout="resid_dropout"),
    "gpt_neox": _Family(("GPTNeoXAttention",), projection="neox", output="dense",
                        cache_argument="layer_past"),
    "qwen3": _Family(("Qwen3Attention",), qk_norm=True, sliding_window="module"),
    "qwen3_moe": _Family(("Qwen3MoeAttention",), qk_norm=True, sliding_window="module"),
    "gemma3_text": _Family(("Gemma3Attention",), qk_norm=True, unit_offset=True,
                           sliding_window="module", embedding="scaled"),
    "qwen2_vl": _Family(("Qwen2VLAttention",), sliding_window="module", mrope=True,
                        vision_attention=("VisionAttention",)),
    "qwen2_5_vl": _Family(("Qwen2_5_VLAttention",), sliding_window="module", mrope=True,
                          vision_attention=("Qwen2_5_VLVisionAttention",)),
    "qwen3_vl": _Family(("Qwen3VLTextAttention",), qk_norm=True, mrope=True,
                        vision_attention=("Qwen3VLVisionAttention",)),
    "deepseek_v3": _Family(("DeepseekV3Attention",), projection="mla"),
    "bert": _Family(embedding="block"),
    "roberta": _Family(embedding="block"),
    "xlm-roberta": _Family(embedding="block"),
    "gpt2": _Family(embedding="positions"),
    "opt": _Family(embedding="opt_positions"),
}
# The language model of a multimodal model, alone (Qwen2VLTextModel, ...).
_FAMILIES.update({f"{name}_text": dataclasses.replace(_FAMILIES[name], vision_attention=())
                  for name in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")})


def supported() -> List[str]:
    """The architectures :func:`patch` knows, by their ``config.model_type``."""
    return sorted(_FAMILIES)


# -------------------------------------------------------------------------- report ----

@dataclasses.dataclass
class PatchReport:
    """What :func:`patch` did to a model.

    Attributes
    ----------
    architecture : str
        The model's ``config.model_type``.
    replaced : dict
        Module path -> what embrope runs there now.
    kept : dict
        Module path -> why HF's code still runs there (a part switched off by an argument,
        or an option embrope does not fuse).
    """

    architecture: str
    replaced: Dict[str, str] = dataclasses.field(default_factory=dict)
    kept: Dict[str, str] = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"embrope.transformers.patch of a {self.architecture!r} model:"]
        lines += [f"  replaced {path or '<model>'}: {what}" for path, what in self.replaced.items()]
        lines += [f"  kept HF's {path or '<model>'}: {why}" for path, why in self.kept.items()]
        return "\n".join(lines)


# ------------------------------------------------------------------------ positions ----

def _table_tensor(cache: RopeCache) -> Tensor:
    return torch.from_dlpack(dlpack_table(cache))


class _Tables:
    """The cos/sin tables of one RoPE of the model (one per layer type in Gemma 3), and how a
    forward picks its rows, as HF's rotary module picks its frequencies:

    - fixed RoPEs: one table;
    - LongRoPE (Phi-3): the short-factor table then the long-factor one in one tensor; a
      forward whose ``max(position_ids) + 1`` exceeds the original context reads the second
      half (an offset added on the device: no host synchronisation, traceable);
    - dynamic NTK: the table of the longest sequence seen so far, rebuilt when a forward
      grows past it and reset below the original context (HF's rule; needs the host value).
    """

    def __init__(self, config: Any, layer_type: Optional[str], max_positions: Optional[int]):
        self.config = config
        self.layer_type = layer_type
        cache = RopeCache.from_hf_config(config, layer_type=layer_type, max_positions=max_positions)
        self.max_positions = cache.max_positions
        self.scaling = cache.config.scaling
        self.original = cache.config.original_max_positions
        self.layout = str(cache.layout)
        # Multimodal RoPE as HF's rotary module of the family does it (the reader gives the
        # sections HF defaults to, and Qwen3-VL's interleaving).
        self.mrope = (dict(mrope_section=cache.mrope_section,
                           mrope_interleaved=cache.mrope_interleaved)
                      if cache.mrope_section is not None else {})
        if self.scaling == _C.RopeScaling.dynamic:
            # HF starts from the frequencies of the original context (its seq_len defaults to
            # max_position_embeddings), not those of a sequence as long as the table.
            cache = RopeCache.from_hf_config(config, layer_type=layer_type,
                                             max_positions=max_positions,
                                             sequence_length=self.original)
        self.table = _table_tensor(cache)
        if self.scaling == _C.RopeScaling.longrope:
            short = RopeCache.from_hf_config(config, layer_type=layer_type,
                                             max_positions=max_positions,
                                             sequence_length=self.original)
            self.table = torch.cat([_table_tensor(short), self.table])
        self.original_table = self.table  # dynamic NTK: the table below the original context
        self.cached_length = self.original  # dynamic NTK: HF's max_seq_len_cached
        self._dynamic_lock = threading.Lock()

    def __getstate__(self) -> Dict[str, Any]:  # copy.deepcopy and pickle: a lock is neither
        state = self.__dict__.copy()
        del state["_dynamic_lock"]
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._dynamic_lock = threading.Lock()

    def describe(self) -> str:
        what = self.scaling.name
        if self.mrope:
            what += (f", mrope {list(self.mrope['mrope_section'])}"
                     f"{' interleaved' if self.mrope['mrope_interleaved'] else ''}")
        if self.scaling == _C.RopeScaling.longrope:
            what += f" (short factors up to {self.original} positions, long past)"
        elif self.scaling == _C.RopeScaling.dynamic:
            what += f" (rebuilt as the sequence grows past {self.original})"
        return what

    def to(self, device: torch.device) -> None:
        if self.table.device != device:
            self.table = self.table.to(device)
            self.original_table = self.original_table.to(device)

    def positions_and_table(self, position_ids: Tensor) -> Tuple[Tensor, Tensor]:
        if self.table.device != position_ids.device:
            self.to(position_ids.device)
        if self.scaling == _C.RopeScaling.longrope:
            longer = (position_ids.max() + 1 > self.original).to(position_ids.dtype)
            return position_ids + longer * self.max_positions, self.table
        if self.scaling == _C.RopeScaling.dynamic:
            return position_ids, self._dynamic_update(int(position_ids.max()) + 1,
                                                      position_ids.device)
        return position_ids, self.table

    def _dynamic_update(self, sequence_length: int, device: torch.device) -> Tensor:
        """HF's dynamic_rope_update: grow past the longest length seen, reset below the
        original context once it had grown; the table for this call. Under a lock, and the
        table returned rather than read back: threads that share a model (building a table
        releases the GIL) each get the table of their own update, not another's."""
        with self._dynamic_lock:
            cached = self.cached_length
            if sequence_length > cached:
                cache = RopeCache.from_hf_config(
                    self.config, layer_type=self.layer_type, sequence_length=sequence_length,
                    max_positions=max(sequence_length, self.max_positions))
                self.table = _table_tensor(cache).to(device)
                self.cached_length = sequence_length
            if sequence_length < self.original and cached > self.original:
                self.table = self.original_table.to(device)
                self.cached_length = self.original
            return self.table


class _EmbropePositions(torch.nn.Module):
    """Stands where the model's rotary module stood. HF's model calls it with
    ``(hidden_states, position_ids[, layer_type])``; it returns ``(position_ids, table)``,
    which HF passes on to the attention modules as their ``position_embeddings``: the
    patched attention reads the table's rows itself."""

    def __init__(self, tables: Dict[Optional[str], _Tables]):
        super().__init__()
        self._tables = tables

    def _apply(self, fn: Callable, recurse: bool = True) -> "_EmbropePositions":
        # .to(device) moves the tables; a dtype cast (model.half()) leaves them float32, as
        # the position code must stay exact whatever the model's dtype.
        for tables in self._tables.values():
            tables.to(_etorch._device_after(fn, tables.table.device))
        return self

    def forward(self, x: Tensor, position_ids: Tensor, layer_type: Optional[str] = None
                ) -> Tuple[Tensor, Tensor]:
        tables = self._tables[layer_type if layer_type in self._tables else None]
        if tables.mrope and position_ids.dim() == 2:
            position_ids = position_ids.expand(3, -1, -1)  # as HF's mrope rotary modules
        return tables.positions_and_table(position_ids)


class _VisionTables:
    """The axial (row, column) table of a vision tower's RoPE: HF's vision rotary module
    computes, per forward, ``cos`` and ``sin`` of ``row * f_i`` on the first half of the
    frequencies and ``column * f_i`` on the second (Qwen2-VL's ``VisionRotaryEmbedding``);
    this is the float64-exact table of the same angles, rows 0 .. max_positions - 1."""

    def __init__(self, cache: RopeCache):
        self.table = _table_tensor(cache)
        self.rope = dict(layout=str(cache.layout), axes_dim=tuple(cache.axes_dim))

    def to(self, device: torch.device) -> None:
        if self.table.device != device:
            self.table = self.table.to(device)


class _EmbropeVisionPositions(_EmbropePositions):
    """Stands where the vision tower's rotary module stood. HF's tower calls it with
    ``(hidden_states, position_ids)``, ``position_ids [T, 2]`` the patches' (row, column);
    it returns the two columns ``([T, 1], [T, 1])`` in place of ``(cos, sin)``: Qwen2.5-VL
    reorders both by its attention windows as it reorders cos and sin, and the patched
    vision attention reads the table's rows itself."""

    def forward(self, x: Tensor, position_ids: Tensor, layer_type: Optional[str] = None
                ) -> Tuple[Tensor, Tensor]:
        if position_ids.dim() != 2 or position_ids.shape[-1] != 2:
            raise _C.InvalidArgumentError(
                f"embrope.transformers: the vision tower passed position ids of shape "
                f"{tuple(position_ids.shape)}; patch() expects HF's [tokens, 2] (row, column)")
        tables = self._tables[None]
        if tables.table.device != position_ids.device:
            tables.to(position_ids.device)
        return position_ids[:, 0:1], position_ids[:, 1:2]


# ------------------------------------------------------------------------ attention ----

def _check_positions(position_embeddings: Any, op: str, module: str) -> None:
    """What an attention module received from the rotary module is embrope's pair (integer
    positions first), not HF's (cos, sin) from a module put back after patch()."""
    if (not isinstance(position_embeddings, tuple) or len(position_embeddings) != 2
            or position_embeddings[0].dtype not in (torch.int32, torch.int64)):
        raise _C.InvalidArgumentError(
            f"embrope.transformers: {op} received HF's cos/sin instead of embrope's positions; "
            f"{module} was replaced after patch() (call unpatch() and patch() again)")


def _positions(position_embeddings: Any, op: str, shape: torch.Size) -> Tuple[Tensor, Tensor]:
    _check_positions(position_embeddings, op, "the model's rotary module")
    positions, table = position_embeddings
    batch, sequence = shape[0], shape[1]
    if positions.dim() == 2 and positions.shape[0] != batch:
        positions = positions.expand(batch, sequence)
    elif positions.dim() == 3 and positions.shape[1] != batch:  # mrope: [3, B, S]
        positions = positions.expand(3, batch, sequence)
    return positions, table


def _project(self: torch.nn.Module, family: _Family, hidden_states: Tensor
             ) -> Tuple[Tensor, Tensor, Tensor]:
    """q, k and v as ``[B, S, H, D]`` views of the projections (HF's own layers)."""
    input_shape = hidden_states.shape[:-1]
    if family.projection == "neox":
        qkv = self.query_key_value(hidden_states).view(*input_shape, -1, 3 * self.head_size)
        return qkv.chunk(3, dim=-1)
    hidden_shape = (*input_shape, -1, self.head_dim)
    if family.projection == "phi3":
        qkv = self.qkv_proj(hidden_states)
        query_pos = self.config.num_attention_heads * self.head_dim
        key_end = query_pos + self.num_key_value_heads * self.head_dim
        return (qkv[..., :query_pos].view(hidden_shape),
                qkv[..., query_pos:key_end].view(hidden_shape),
                qkv[..., key_end:].view(hidden_shape))
    return (self.q_proj(hidden_states).view(hidden_shape),
            self.k_proj(hidden_states).view(hidden_shape),
            self.v_proj(hidden_states).view(hidden_shape))


def _norm_eps(norm: torch.nn.Module) -> float:
    for name in ("variance_epsilon", "eps"):
        if hasattr(norm, name):
            return float(getattr(norm, name))
    raise _C.InvalidArgumentError(
        f"embrope.transformers: {type(norm).__name__} has no eps attribute")


def _attention_forward(self: torch.nn.Module, hidden_states: Tensor,
                       position_embeddings: Any = None, attention_mask: Optional[Tensor] = None,
                       cache: Any = None, **kwargs: Any) -> Tuple[Tensor, Optional[Tensor]]:
    """HF's attention forward of the families in _FAMILIES, with the rotation (and the
    qk-norm where fused) done by embrope on q and k as the projections wrote them."""
    state: _AttentionPatch = self._embrope_attention
    family = state.family
    if cache is None:
        cache = kwargs.pop("past_key_values", None)
    if family.cache_argument != "cache" and cache is None:
        cache = kwargs.pop(family.cache_argument, None)
    input_shape = hidden_states.shape[:-1]
    q, k, v = _project(self, family, hidden_states)
    positions, table = _positions(position_embeddings, type(self).__name__, q.shape)
    if state.fuse_norm:
        q, k = _etorch.apply_qk_norm_rope(
            q, k, positions, table, q_weight=self.q_norm.weight, k_weight=self.k_norm.weight,
            eps=state.eps, unit_offset=family.unit_offset, **state.rope)
    else:
        if family.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = _etorch.apply_rope(q, k, positions, table, **state.rope)
    query_states, key_states, value_states = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if cache is not None:
        if family.cache_argument == "cache":
            key_states, value_states = cache.update(key_states, value_states, self.layer_idx,
                                                    kwargs=kwargs)
        else:
            key_states, value_states = cache.update(key_states, value_states, self.layer_idx)
    modeling = sys.modules[type(self).__module__]
    attention_interface = modeling.ALL_ATTENTION_FUNCTIONS.get_interface(
        self.config._attn_implementation, modeling.eager_attention_forward)
    extra = {}
    if family.sliding_window == "module":
        extra["sliding_window"] = self.sliding_window
    elif family.sliding_window == "config":
        extra["sliding_window"] = getattr(self.config, "sliding_window", None)
    attn_output, attn_weights = attention_interface(
        self, query_states, key_states, value_states, attention_mask,
        dropout=0.0 if not self.training else self.attention_dropout,
        scaling=self.scaling, **extra, **kwargs)
    attn_output = getattr(self, family.output)(attn_output.reshape(*input_shape, -1).contiguous())
    if family.output_dropout is not None:
        attn_output = getattr(self, family.output_dropout)(attn_output)
    return attn_output, attn_weights


def _neox_attention_forward(self: torch.nn.Module, hidden_states: Tensor,
                            attention_mask: Optional[Tensor] = None, layer_past: Any = None,
                            position_embeddings: Any = None, **kwargs: Any
                            ) -> Tuple[Tensor, Optional[Tensor]]:
    # GPT-NeoX's argument order, then the shared body.
    return _attention_forward(self, hidden_states, position_embeddings, attention_mask,
                              layer_past, **kwargs)


def _rotary_pairs_halved(x: Tensor) -> Tensor:
    """Interleaved pairs (x0, x1), (x2, x3), ... to rotate_half order (x0, x2, ..., x1, x3,
    ...): the order HF's apply_rotary_pos_emb_interleave returns DeepSeek's rotated q and k
    in (and its KV cache holds k in)."""
    return x.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2)


def _mla_attention_forward(self: torch.nn.Module, hidden_states: Tensor,
                           position_embeddings: Any = None,
                           attention_mask: Optional[Tensor] = None, cache: Any = None,
                           **kwargs: Any) -> Tuple[Tensor, Optional[Tensor]]:
    """DeepSeek-V3's multi-head latent attention (HF's DeepseekV3Attention.forward) with the
    rotation of q's rope slice and the shared k_pe done by embrope, in place of HF's
    cos/sin: q and k_pe are read where the projections wrote them; the rotated values are
    laid out as HF lays them out (with ``rope_interleave``, HF returns the rotated pairs in
    rotate_half order, and the cache holds k_pe so), so the cache and the logits are HF's."""
    state: _AttentionPatch = self._embrope_attention
    if cache is None:
        cache = kwargs.pop("past_key_values", None)
    batch, sequence = hidden_states.shape[:-1]
    if self.q_lora_rank is None:
        q_states = self.q_proj(hidden_states)
    else:
        q_states = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
    q_states = q_states.view(batch, sequence, -1, self.qk_head_dim)
    compressed_kv = self.kv_a_proj_with_mqa(hidden_states)
    kv_nope, k_pe = torch.split(compressed_kv, [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
    kv_nope = self.kv_a_layernorm(kv_nope).view(batch, 1, sequence, self.kv_lora_rank)
    positions, table = _positions(position_embeddings, type(self).__name__, q_states.shape)
    q_rot, k_rot = _etorch.apply_rope(
        q_states[..., self.qk_nope_head_dim:], k_pe.view(batch, sequence, 1, -1), positions,
        table, **state.rope)
    if state.rope["layout"] == "interleaved":
        q_rot, k_rot = _rotary_pairs_halved(q_rot), _rotary_pairs_halved(k_rot)
    k_rot = k_rot.transpose(1, 2)
    if cache is not None:
        kv_nope, k_rot = cache.update(kv_nope, k_rot, self.layer_idx, kwargs=kwargs)
    query_states = torch.cat((q_states[..., :self.qk_nope_head_dim].transpose(1, 2),
                              q_rot.transpose(1, 2)), dim=-1)
    key_states, value_states = self.expand_kv(kv_nope, k_rot)
    modeling = sys.modules[type(self).__module__]
    attention_interface = modeling.ALL_ATTENTION_FUNCTIONS.get_interface(
        self.config._attn_implementation, modeling.eager_attention_forward)
    attn_output, attn_weights = attention_interface(
        self, query_states, key_states, value_states, attention_mask,
        dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling,
        **kwargs)
    attn_output = attn_output.reshape(batch, sequence, -1).contiguous()
    return self.o_proj(attn_output), attn_weights


def _vision_attention_forward(self: torch.nn.Module, hidden_states: Tensor, cu_seqlens: Tensor,
                             position_embeddings: Any = None, max_seqlen: Optional[int] = None,
                             **kwargs: Any) -> Tensor:
    """HF's vision attention forward of Qwen2-VL, Qwen2.5-VL and Qwen3-VL (one image or
    window per ``cu_seqlens`` span, no mask), with q and k rotated by embrope's axial RoPE
    on the patches' (row, column) positions, as the qkv projection wrote them."""
    state: _AttentionPatch = self._embrope_attention
    _check_positions(position_embeddings, type(self).__name__,
                     "the vision tower's rotary module")
    tokens = hidden_states.shape[0]
    q, k, v = self.qkv(hidden_states).reshape(tokens, 3, self.num_heads, -1).unbind(1)
    positions = torch.cat(position_embeddings, dim=1).T  # [2, T]: rows, columns
    q, k = _etorch.apply_rope(q, k, positions, state.vision.table, **state.rope)
    q, k, v = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
    modeling = sys.modules[type(self).__module__]
    attention_interface = modeling.ALL_ATTENTION_FUNCTIONS.get_interface(
        self.config._attn_implementation, modeling.eager_attention_forward)
    common = dict(attention_mask=None, scaling=self.scaling, is_causal=False,
                  dropout=0.0 if not self.training else self.attention_dropout)
    if modeling.is_flash_attention_requested(self.config):
        max_seqlen = modeling.get_max_seqlen(cu_seqlens, self.config,
                                             kwargs={"max_seqlen": max_seqlen})
        attn_output, _ = attention_interface(
            self, q, k, v, cu_seq_lens_q=cu_seqlens, cu_seq_lens_k=cu_seqlens,
            max_length_q=max_seqlen, max_length_k=max_seqlen, **common, **kwargs)
    else:  # HF: each image (window) apart
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        splits = [torch.split(x, lengths, dim=2) for x in (q, k, v)]
        attn_output = torch.cat([attention_interface(self, *qkv, **common, **kwargs)[0]
                                 for qkv in zip(*splits)], dim=1)
    return self.proj(attn_output.reshape(tokens, -1).contiguous())


_ATTENTION_FORWARDS = {"neox": _neox_attention_forward, "mla": _mla_attention_forward}


@dataclasses.dataclass
class _AttentionPatch:
    family: _Family
    rope: Dict[str, Any]  # apply_rope's settings: layout, and mrope's or axes' where used
    fuse_norm: bool
    eps: float
    vision: Optional[_VisionTables] = None  # a vision tower's attention: its axial table


# ------------------------------------------------------------------------ embedding ----

def _scaled_embedding_forward(self: torch.nn.Module, input_ids: Tensor) -> Tensor:
    # HF: lookup * embed_scale.to(weight.dtype), a product rounded to the weight's dtype;
    # embrope multiplies in float32 and rounds once: the same bits (a product of two
    # 8- or 11-bit significands is exact in float32).
    scale = self._embrope_scales[self.weight.dtype]
    return _etorch.embed(self.weight, input_ids, scale=scale, padding_idx=self.padding_idx)


def _embedding_block_forward(self: torch.nn.Module, input_ids: Optional[Tensor] = None,
                             token_type_ids: Optional[Tensor] = None,
                             position_ids: Optional[Tensor] = None,
                             inputs_embeds: Optional[Tensor] = None, cache_length: int = 0,
                             **kwargs: Any) -> Tensor:
    """BERT's, RoBERTa's and XLM-R's embeddings module (word + position + token type rows,
    LayerNorm, dropout) with the lookups, the sum and the norm in one embrope pass. Position
    and token type ids are HF's: RoBERTa's counted from the padding by HF's own function."""
    if input_ids is None or inputs_embeds is not None or kwargs:
        return type(self).forward(self, input_ids, token_type_ids, position_ids, inputs_embeds,
                                  cache_length, **kwargs)
    batch, sequence = input_ids.shape
    if position_ids is None:
        if hasattr(self, "create_position_ids_from_input_ids"):
            position_ids = self.create_position_ids_from_input_ids(input_ids, self.padding_idx,
                                                                   cache_length)
        else:
            position_ids = self.position_ids[:, cache_length:sequence + cache_length]
    if token_type_ids is None:
        if hasattr(self, "token_type_ids"):  # HF's zero buffer, read as HF reads it
            buffered = self.token_type_ids.to(position_ids.device).expand(position_ids.shape[0], -1)
            token_type_ids = torch.gather(buffered, dim=1, index=position_ids)
        else:
            token_type_ids = torch.zeros_like(input_ids)
    positions = self.position_embeddings
    position_table = positions.weight
    if (positions.padding_idx is not None and position_table.requires_grad
            and torch.is_grad_enabled()):
        # nn.Embedding(padding_idx) gives its padding row no gradient (RoBERTa's padded
        # tokens sit at that position): the row enters embrope's op detached.
        row = positions.padding_idx % position_table.shape[0]
        position_table = torch.cat((position_table[:row], position_table[row:row + 1].detach(),
                                    position_table[row + 1:]))
    norm = self.LayerNorm
    out = _etorch.embed(
        self.word_embeddings.weight, input_ids, position_table=position_table,
        position_ids=position_ids.expand(batch, sequence),
        type_table=self.token_type_embeddings.weight,
        type_ids=token_type_ids.expand(batch, sequence),
        padding_idx=self.word_embeddings.padding_idx, norm="layer_norm",
        norm_weight=norm.weight, norm_bias=norm.bias, norm_eps=norm.eps)
    return self.dropout(out)


def _position_lookup_forward(self: torch.nn.Module, position_ids: Tensor) -> Tensor:
    # GPT-2's wpe: the rows of the learned position table at HF's position_ids.
    return _etorch.embed(self.weight, position_ids)


def _opt_positions_forward(self: torch.nn.Module, attention_mask: Tensor, cache_length: int = 0,
                           position_ids: Optional[Tensor] = None) -> Tensor:
    # OPTLearnedPositionalEmbedding: positions counted over the attention mask (padding at
    # -1), then offset by 2 rows of the table, as HF does.
    if position_ids is None:
        position_ids = torch.cumsum(attention_mask, dim=1)
        position_ids = (position_ids * attention_mask - 1).long()[:, cache_length:]
    return _etorch.embed(self.weight, position_ids + self.offset)


def _rounded_scales(scale: float) -> Dict[torch.dtype, float]:
    """HF's embed_scale (a float32 buffer of the Python value) rounded to each dtype the
    weight can have: known when patching, so a compiled forward needs no tensor read."""
    buffer = torch.tensor(scale, dtype=torch.float32)
    return {dtype: float(buffer.to(dtype))
            for dtype in (torch.float32, torch.float16, torch.bfloat16)}


# ---------------------------------------------------------------------------- patch ----

@dataclasses.dataclass
class _PatchState:
    rotary: List[Tuple[torch.nn.Module, str, torch.nn.Module]]  # (parent, name, HF module)
    forwards: List[torch.nn.Module]  # modules whose forward is an instance attribute
    report: PatchReport


def _family_of(model: torch.nn.Module) -> Tuple[str, _Family]:
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in _FAMILIES:
        raise _C.NotAvailableError(
            f"embrope.transformers.patch: architecture {model_type!r} is not supported; "
            f"supported: {', '.join(supported())}")
    return model_type, _FAMILIES[model_type]


def _rope_layer_types(config: Any) -> List[Optional[str]]:
    parameters = getattr(config, "rope_parameters", None)
    layer_types = getattr(config, "layer_types", None)
    if (isinstance(parameters, dict) and layer_types
            and all(t in parameters for t in set(layer_types))):
        return sorted(set(layer_types))
    return [None]


def patch(model: torch.nn.Module, *, rope: bool = True, qk_norm: bool = True,
          embeddings: bool = True, vision: bool = True,
          max_positions: Optional[int] = None) -> PatchReport:
    """Make one instantiated ``transformers`` model run embrope's ops (in place).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A model of an architecture in :func:`supported` (a ``*ForCausalLM``, a VL model's
        ``*ForConditionalGeneration``, a ``*ForMaskedLM`` or their base models). Other
        models in the process are untouched: the patch is per instance.
    rope : bool, default True
        Replace the rotary module and the attention modules' rotation.
    qk_norm : bool, default True
        In families with a per-head RMSNorm of q and k (Qwen3, Gemma 3), fuse it with the
        rotation (one :func:`embrope.torch.apply_qk_norm_rope`). False: HF's norm modules
        run, then embrope's rotation. Needs `rope`.
    embeddings : bool, default True
        Replace the embeddings: Gemma's scaled token embedding, BERT's / RoBERTa's / XLM-R's
        embedding block (with its LayerNorm), GPT-2's and OPT's learned position lookups. In
        the other families HF's ``nn.Embedding`` is a plain gather and is kept (the report
        says so).
    vision : bool, default True
        In the VL families (Qwen2-VL, Qwen2.5-VL, Qwen3-VL), replace the vision tower's
        rotary module and its attention modules' rotation too: the patches' (row, column)
        axial RoPE from a float64-exact table (rows and columns up to 8191). Needs `rope`.
    max_positions : int, optional
        Rows of the language model's cos/sin tables; default the config's
        ``max_position_embeddings``.

    Returns
    -------
    PatchReport
        What was replaced, per module, and what was kept as HF's and why.

    Raises
    ------
    NotAvailableError (NotImplementedError)
        The architecture is not supported (the message lists the supported ones), or the
        model is already patched.
    InvalidArgumentError (ValueError)
        An option that cannot apply (`qk_norm` without `rope`), or a RoPE the config
        describes that embrope does not support.
    """
    architecture, family = _family_of(model)
    if getattr(model, "_embrope_patch", None) is not None:
        raise _C.NotAvailableError(
            "embrope.transformers.patch: this model is already patched (unpatch(model) first)")
    config = model.config
    if hasattr(config, "get_text_config"):  # a multimodal model: its language model's config
        config = config.get_text_config()
    report = PatchReport(architecture)
    state = _PatchState([], [], report)
    if not family.attention:
        pass  # no RoPE in this architecture
    elif rope:
        _patch_rope(model, family, config, max_positions, qk_norm, vision, state)
    else:
        report.kept["rotary_emb"] = "rope=False"
        for name, module in model.named_modules():
            kind = type(module).__name__
            if kind.endswith("RotaryEmbedding") and "Vision" in kind:
                report.kept[name] = "rope=False"
        if family.qk_norm and qk_norm:
            report.kept["q_norm/k_norm"] = ("qk_norm fuses the norm with the rotation: needs "
                                            "rope=True")
    if embeddings:
        _patch_embeddings(model, family, state)
    else:
        report.kept["embed_tokens"] = "embeddings=False"
    object.__setattr__(model, "_embrope_patch", state)
    return report


def _patch_rope(model: torch.nn.Module, family: _Family, config: Any,
                max_positions: Optional[int], qk_norm: bool, vision: bool,
                state: _PatchState) -> None:
    report = state.report
    rotary, vision_rotary = [], []
    for name, module in model.named_modules():
        kind = type(module).__name__
        if kind.endswith("RotaryEmbedding"):
            (vision_rotary if "Vision" in kind else rotary).append((name, module))
    # The vision tower's plan, made before anything is replaced, so that a tower embrope
    # cannot stand in for leaves the model whole.
    vision_plan = _vision_plan(model, family, vision_rotary, vision) if vision_rotary else None
    if not rotary:
        raise _C.InvalidArgumentError(
            f"embrope.transformers.patch: found no rotary module in this "
            f"{config.model_type!r} model")
    layer_types = _rope_layer_types(config)
    tables = {layer_type: _Tables(config, layer_type, max_positions) for layer_type in layer_types}
    first = tables[layer_types[0]]
    settings = dict(layout=first.layout, **first.mrope)
    device = next((b.device for b in rotary[0][1].buffers()), torch.device("cpu"))
    for t in tables.values():
        t.to(device)
    for name, module in rotary:
        parent_name, _, attribute = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        parent._modules[attribute] = _EmbropePositions(tables)
        state.rotary.append((parent, attribute, module))
        kinds = ", ".join(f"{lt or 'all layers'}: {t.describe()}" for lt, t in tables.items())
        report.replaced[name] = (f"embrope's float64-exact cos/sin table "
                                 f"({t.max_positions} positions; {kinds})")
    for name, module in model.named_modules():
        if type(module).__name__ not in family.attention:
            continue
        fuse, eps = False, 0.0
        if family.qk_norm:
            eps = _norm_eps(module.q_norm)
            if not qk_norm:
                report.kept[f"{name}.q_norm/k_norm"] = "qk_norm=False"
            elif _norm_eps(module.k_norm) != eps:
                report.kept[f"{name}.q_norm/k_norm"] = "q_norm and k_norm have different eps"
            else:
                fuse = True
        object.__setattr__(module, "_embrope_attention",
                           _AttentionPatch(family, dict(settings), fuse, eps))
        forward = _ATTENTION_FORWARDS.get(family.projection, _attention_forward)
        module.forward = types.MethodType(forward, module)
        state.forwards.append(module)
        layout = settings["layout"]
        if fuse:
            norm = "1 + w" if family.unit_offset else "w"
            report.replaced[name] = (f"embrope apply_qk_norm_rope ({layout}): q_norm and k_norm "
                                     f"(x {norm}) and the rotation in one op")
        elif family.projection == "mla":
            order = (", returned in HF's rotate_half order" if layout == "interleaved" else "")
            report.replaced[name] = (f"embrope apply_rope ({layout}) of q's rope slice and the "
                                     f"shared k_pe{order}")
        else:
            report.replaced[name] = f"embrope apply_rope ({layout})"
    if vision_plan is not None:
        _patch_vision(model, family, vision_rotary, vision_plan, state)


# The rows of a vision tower's table: patch rows and columns up to 8191 (an image 114,674
# pixels on a side at Qwen2-VL's 14-pixel patches); a larger grid is refused by the op
# (BadIndexError), never read past the table.
_VISION_MAX_POSITIONS = 8192


@dataclasses.dataclass
class _VisionPlan:
    cache: Optional[RopeCache]  # None: HF's tower is kept, for `why`
    why: str
    attention: List[Tuple[str, torch.nn.Module]]


def _vision_plan(model: torch.nn.Module, family: _Family,
                 rotary: List[Tuple[str, torch.nn.Module]], enabled: bool) -> _VisionPlan:
    """embrope's table of the vision tower's RoPE and the attention modules that will read it,
    or why HF's tower is kept: the rotary module must take ``(x, position_ids)``
    (transformers 5's vision rotary modules; earlier versions compute the angles in the
    tower's forward), its frequencies must be the config's, and the tower's attention modules
    must be ones whose forward embrope's replaces (else they would read positions as cos and
    sin)."""
    attention = [(name, module) for name, module in model.named_modules()
                 if type(module).__name__ in family.vision_attention]
    if not enabled:
        return _VisionPlan(None, "vision=False", attention)
    if not attention:
        return _VisionPlan(None, "no vision attention module of a class embrope's patch knows "
                                 f"({', '.join(family.vision_attention) or 'none'}): HF's code "
                                 "kept", attention)
    forward = inspect.signature(rotary[0][1].forward)
    if "position_ids" not in forward.parameters:
        return _VisionPlan(None, "this transformers version computes the vision angles in the "
                                 "tower's forward (no position_ids argument): HF's code kept",
                           attention)
    try:
        cache = RopeCache.from_hf_vision_config(model.config,
                                                max_positions=_VISION_MAX_POSITIONS)
    except (ValueError, TypeError, KeyError) as error:
        return _VisionPlan(None, f"its config gives no axial RoPE embrope reads ({error}): HF's "
                                 "code kept", attention)
    theirs = getattr(rotary[0][1], "inv_freq", None)
    ours = np.asarray(cache.inv_freq, dtype=np.float64)
    half = len(ours) // 2
    if theirs is None or tuple(theirs.shape) != (half,) or theirs.is_meta:
        return _VisionPlan(None, "its rotary module has no inv_freq of the config's axial RoPE "
                                 "(row and column halves of the head dim): HF's code kept",
                           attention)
    # The buffer in its own precision (a model cast to bfloat16 before patch() holds bfloat16
    # frequencies; the table is float64-exact either way).
    rtol = max(1e-6, float(torch.finfo(theirs.dtype).eps))
    if (not np.allclose(theirs.double().cpu().numpy(), ours[:half], rtol=rtol, atol=0)
            or not np.array_equal(ours[:half], ours[half:])):
        return _VisionPlan(None, "its frequencies are not the config's axial RoPE (row and "
                                 "column halves of the head dim): HF's code kept", attention)
    return _VisionPlan(cache, "", attention)


def _patch_vision(model: torch.nn.Module, family: _Family,
                  rotary: List[Tuple[str, torch.nn.Module]], plan: _VisionPlan,
                  state: _PatchState) -> None:
    report = state.report
    if plan.cache is None:
        for name, _ in rotary:
            report.kept[name] = plan.why
        return
    cache = plan.cache
    tables = _VisionTables(cache)
    device = next((b.device for b in rotary[0][1].buffers()), torch.device("cpu"))
    tables.to(device)
    axes = list(cache.axes_dim)
    for name, module in rotary:
        parent_name, _, attribute = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        parent._modules[attribute] = _EmbropeVisionPositions({None: tables})
        state.rotary.append((parent, attribute, module))
        report.replaced[name] = (f"embrope's float64-exact axial table (rows, columns; "
                                 f"axes_dim {axes}, {cache.max_positions} positions)")
    for name, module in plan.attention:
        object.__setattr__(module, "_embrope_attention",
                           _AttentionPatch(family, dict(tables.rope), False, 0.0, tables))
        module.forward = types.MethodType(_vision_attention_forward, module)
        state.forwards.append(module)
        report.replaced[name] = (f"embrope apply_rope, axial ({tables.rope['layout']}): the "
                                 "patches' rows and columns in one call")


def _patch_embeddings(model: torch.nn.Module, family: _Family, state: _PatchState) -> None:
    report = state.report
    embedding = model.get_input_embeddings()
    name = next((n for n, m in model.named_modules() if m is embedding), "embed_tokens")

    def replace(module: torch.nn.Module, forward: Callable) -> None:
        module.forward = types.MethodType(forward, module)
        state.forwards.append(module)

    if family.embedding == "scaled" and hasattr(embedding, "scalar_embed_scale"):
        object.__setattr__(embedding, "_embrope_scales",
                           _rounded_scales(embedding.scalar_embed_scale))
        replace(embedding, _scaled_embedding_forward)
        report.replaced[name] = "embrope embed (lookup and scale, rounded as HF's)"
        return
    if family.embedding == "block":
        blocks = [(n, m) for n, m in model.named_modules()
                  if type(m).__name__.endswith("Embeddings") and hasattr(m, "word_embeddings")]
        for block_name, block in blocks:
            replace(block, _embedding_block_forward)
            padding = ("positions from the ids' padding, as HF counts them; "
                       if hasattr(block, "create_position_ids_from_input_ids") else "")
            report.replaced[block_name] = (
                f"embrope embed: word + position + token type + LayerNorm in one pass ({padding}"
                "HF's own code when given inputs_embeds)")
        return
    if family.embedding in ("positions", "opt_positions"):
        kind = "wpe" if family.embedding == "positions" else "embed_positions"
        for module_name, module in model.named_modules():
            if module_name.rpartition(".")[2] != kind:
                continue
            if family.embedding == "positions":
                replace(module, _position_lookup_forward)
                what = "the position_ids HF passes"
            else:
                replace(module, _opt_positions_forward)
                what = "positions from the attention mask, offset 2, as HF counts them"
            report.replaced[module_name] = f"embrope embed of the learned position table ({what})"
        report.kept[name] = ("the token lookup, and its sum with the positions' rows, are "
                             "written in the model's forward between the two lookups: kept")
        return
    report.kept[name] = "a plain lookup (torch.nn.Embedding): nothing for embrope to fuse"


def unpatch(model: torch.nn.Module) -> None:
    """Undo :func:`patch`: HF's modules and forwards come back (moved to the device the
    model is on now)."""
    state: Optional[_PatchState] = getattr(model, "_embrope_patch", None)
    if state is None:
        raise _C.InvalidArgumentError("embrope.transformers.unpatch: this model is not patched")
    for module in state.forwards:
        del module.forward
        for attribute in ("_embrope_attention", "_embrope_scales"):
            if hasattr(module, attribute):
                object.__delattr__(module, attribute)
    for parent, attribute, original in state.rotary:
        patched = parent._modules[attribute]
        device = next(iter(patched._tables.values())).table.device
        parent._modules[attribute] = original.to(device)
    object.__delattr__(model, "_embrope_patch")
