"""embrope in a Hugging Face ``transformers`` model, in one line.

>>> model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen3-0.6B")
>>> report = embrope.transformers.patch(model)      # this model only; unpatch(model) undoes it

:func:`patch` swaps, on one instantiated model, HF's position code for embrope's ops:

- the model's rotary module (HF computes cos and sin for every position of every forward, in
  float32) for embrope's float64-exact table of the same RoPE (every ``rope_type`` HF has:
  llama3, YaRN, LongRoPE with HF's per-forward choice of short or long factors, dynamic NTK
  with HF's cache growth, Gemma 3's per-layer-type RoPEs);
- each attention module's rotation (``apply_rotary_pos_emb``) for :func:`embrope.torch.apply_rope`
  on q and k as the projections wrote them, and, in the families with a per-head RMSNorm of q
  and k (Qwen3, Gemma 3), the norm and the rotation for one
  :func:`embrope.torch.apply_qk_norm_rope`;
- the token embedding for :func:`embrope.torch.embed` where it does more than a lookup
  (Gemma's scaled embedding, rounded as HF rounds it).

Everything else (projections, the attention kernel HF's ``attn_implementation`` picks, the KV
cache, masks, MLPs) is HF's own code, untouched. Parameters, buffers that are saved and the
``state_dict`` do not change. Works with eager forwards, ``generate()`` with dynamic and static
caches, autograd and gradient checkpointing, and ``torch.compile(fullgraph=True)`` (except
dynamic NTK, whose table grows with the sequence as HF's does, which needs a host value).
"""

from __future__ import annotations

import dataclasses
import sys
import types
from typing import Any, Callable, Dict, List, Optional, Tuple

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

    attention: Tuple[str, ...]  # attention class names
    projection: str = "separate"  # "separate" (q/k/v_proj), "phi3" (qkv_proj), "neox"
    qk_norm: bool = False  # q_norm / k_norm per head before the rotation
    unit_offset: bool = False  # the norms scale by 1 + w (Gemma)
    sliding_window: Optional[str] = None  # what HF passes: "module", "config" or nothing
    output: str = "o_proj"
    output_dropout: Optional[str] = None  # a dropout module after the output projection
    cache_argument: str = "cache"
    scaled_embedding: bool = False  # Gemma's embed_tokens multiplies by sqrt(hidden)


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
                           sliding_window="module", scaled_embedding=True),
}


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
        self.table = _table_tensor(cache)
        if self.scaling == _C.RopeScaling.longrope:
            short = RopeCache.from_hf_config(config, layer_type=layer_type,
                                             max_positions=max_positions,
                                             sequence_length=self.original)
            self.table = torch.cat([_table_tensor(short), self.table])
        self.original_table = self.table  # dynamic NTK: the table below the original context
        self.cached_length = self.original  # dynamic NTK: HF's max_seq_len_cached

    def describe(self) -> str:
        what = self.scaling.name
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
            self._dynamic_update(int(position_ids.max()) + 1, position_ids.device)
        return position_ids, self.table

    def _dynamic_update(self, sequence_length: int, device: torch.device) -> None:
        # HF's dynamic_rope_update: grow past the longest length seen, reset below the
        # original context once it had grown.
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
            probe = fn(torch.empty(0, device=tables.table.device))
            tables.to(probe.device)
        return self

    def forward(self, x: Tensor, position_ids: Tensor, layer_type: Optional[str] = None
                ) -> Tuple[Tensor, Tensor]:
        tables = self._tables[layer_type if layer_type in self._tables else None]
        return tables.positions_and_table(position_ids)


# ------------------------------------------------------------------------ attention ----

def _positions(position_embeddings: Any, op: str, shape: torch.Size) -> Tuple[Tensor, Tensor]:
    if (not isinstance(position_embeddings, tuple) or len(position_embeddings) != 2
            or position_embeddings[0].dtype not in (torch.int32, torch.int64)):
        raise _C.InvalidArgumentError(
            f"embrope.transformers: {op} received HF's cos/sin instead of embrope's positions; "
            "the model's rotary module was replaced after patch() (call unpatch() and patch() "
            "again)")
    positions, table = position_embeddings
    batch, sequence = shape[0], shape[1]
    if positions.dim() == 2 and positions.shape[0] != batch:
        positions = positions.expand(batch, sequence)
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
            eps=state.eps, unit_offset=family.unit_offset, layout=state.layout)
    else:
        if family.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = _etorch.apply_rope(q, k, positions, table, layout=state.layout)
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


@dataclasses.dataclass
class _AttentionPatch:
    family: _Family
    layout: str
    fuse_norm: bool
    eps: float


# ------------------------------------------------------------------------ embedding ----

def _scaled_embedding_forward(self: torch.nn.Module, input_ids: Tensor) -> Tensor:
    # HF: lookup * embed_scale.to(weight.dtype), a product rounded to the weight's dtype;
    # embrope multiplies in float32 and rounds once: the same bits (a product of two
    # 8- or 11-bit significands is exact in float32).
    scale = self._embrope_scales[self.weight.dtype]
    return _etorch.embed(self.weight, input_ids, scale=scale, padding_idx=self.padding_idx)


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
          embeddings: bool = True, max_positions: Optional[int] = None) -> PatchReport:
    """Make one instantiated ``transformers`` model run embrope's ops (in place).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A model of an architecture in :func:`supported` (a ``*ForCausalLM`` or its base
        model). Other models in the process are untouched: the patch is per instance.
    rope : bool, default True
        Replace the rotary module and the attention modules' rotation.
    qk_norm : bool, default True
        In families with a per-head RMSNorm of q and k (Qwen3, Gemma 3), fuse it with the
        rotation (one :func:`embrope.torch.apply_qk_norm_rope`). False: HF's norm modules
        run, then embrope's rotation. Needs `rope`.
    embeddings : bool, default True
        Replace the token embedding where embrope fuses more than the lookup (Gemma's
        scaled embedding). In the other families HF's ``nn.Embedding`` is a plain gather
        and is kept (the report says so).
    max_positions : int, optional
        Rows of the cos/sin tables; default the config's ``max_position_embeddings``.

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
    report = PatchReport(architecture)
    state = _PatchState([], [], report)
    if rope:
        _patch_rope(model, family, config, max_positions, qk_norm, state)
    else:
        report.kept["rotary_emb"] = "rope=False"
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
                max_positions: Optional[int], qk_norm: bool, state: _PatchState) -> None:
    report = state.report
    rotary = [(name, module) for name, module in model.named_modules()
              if type(module).__name__.endswith("RotaryEmbedding")]
    if not rotary:
        raise _C.InvalidArgumentError(
            f"embrope.transformers.patch: found no rotary module in this "
            f"{config.model_type!r} model")
    layer_types = _rope_layer_types(config)
    tables = {layer_type: _Tables(config, layer_type, max_positions) for layer_type in layer_types}
    layout = tables[layer_types[0]].layout
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
        object.__setattr__(module, "_embrope_attention", _AttentionPatch(family, layout, fuse, eps))
        forward = _neox_attention_forward if family.projection == "neox" else _attention_forward
        module.forward = types.MethodType(forward, module)
        state.forwards.append(module)
        if fuse:
            norm = "1 + w" if family.unit_offset else "w"
            report.replaced[name] = (f"embrope apply_qk_norm_rope ({layout}): q_norm and k_norm "
                                     f"(x {norm}) and the rotation in one op")
        else:
            report.replaced[name] = f"embrope apply_rope ({layout})"


def _patch_embeddings(model: torch.nn.Module, family: _Family, state: _PatchState) -> None:
    embedding = model.get_input_embeddings()
    name = next((n for n, m in model.named_modules() if m is embedding), "embed_tokens")
    if family.scaled_embedding and hasattr(embedding, "scalar_embed_scale"):
        object.__setattr__(embedding, "_embrope_scales",
                           _rounded_scales(embedding.scalar_embed_scale))
        embedding.forward = types.MethodType(_scaled_embedding_forward, embedding)
        state.forwards.append(embedding)
        state.report.replaced[name] = "embrope embed (lookup and scale, rounded as HF's)"
    else:
        state.report.kept[name] = ("a plain lookup (torch.nn.Embedding): nothing for embrope "
                                   "to fuse")


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
