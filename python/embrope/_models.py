"""Model presets and HuggingFace config.json: what a model family needs from embrope."""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Optional, Union

from . import _embrope as _C

ModelConfig = _C.ModelConfig


def model_presets() -> list[str]:
    """The names of the built-in model presets ("llama-3.1-8b", "qwen2-vl-7b", ...)."""
    return list(_C.model_presets())


def model_preset(name: str) -> ModelConfig:
    """The :class:`ModelConfig` of a built-in preset.

    Raises
    ------
    InvalidArgumentError
        For an unknown name (the message lists the known ones).
    """
    if not isinstance(name, str):
        raise TypeError(f"model_preset: name must be a str, not {type(name).__name__}")
    return _C.model_preset(name)


def model_config_from_hf(config: Union[str, os.PathLike, Mapping[str, Any], Any], *,
                         layer_type: Optional[str] = None) -> ModelConfig:
    """Read the fields of a HuggingFace config that decide positions and embeddings.

    Parameters
    ----------
    config : path, dict or transformers.PretrainedConfig
        A config.json file (or a model directory holding one), its parsed dict, or a
        ``PretrainedConfig`` (anything with ``to_dict()``).
    layer_type : str, optional
        For a model with a RoPE per layer type (Gemma 3: "sliding_attention" layers base
        1e4, "full_attention" layers base 1e6 with linear x8), the layers whose RoPE is
        wanted; such a config without it is an error, never one of the two silently. A
        model with one RoPE takes any layer type.

    Raises
    ------
    InvalidArgumentError
        When a field the model needs is malformed, or missing without a default of HF's
        config class for the model_type (which a field left out takes), or its rope_type is
        not supported (never ignored).
    """
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        return _C.model_config_from_hf_file(path, layer_type or "")
    if hasattr(config, "to_dict") and not isinstance(config, Mapping):
        config = config.to_dict()
    if not isinstance(config, Mapping):
        raise TypeError(
            "model_config_from_hf: config must be a path, a dict or a PretrainedConfig, "
            f"not {type(config).__name__}"
        )
    return _C.model_config_from_hf_json(json.dumps(dict(config), default=_json_default),
                                        layer_type or "")


def _json_default(value: Any) -> Any:
    # PretrainedConfig.to_dict() may hold torch dtypes and similar: not position fields.
    return str(value)
