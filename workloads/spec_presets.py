"""Model presets with KV cache specs beyond full attention (see `workloads.kv_spec`).

Each preset is the KV-deciding fields of the model's published Hugging Face
`config.json`, read by `workloads.hf_spec` exactly as a user's own config file would be,
so the presets also exercise the reader.
"""

from __future__ import annotations

from typing import Any

from kvbench.workloads.errors import ConfigError
from kvbench.workloads.hf_spec import model_spec_from_hf_config
from kvbench.workloads.kv_spec import ModelKVSpec

#: name -> (config.json fields, source note).
_CONFIGS: dict[str, tuple[dict[str, Any], str]] = {
    "mistral-7b": (
        {
            "model_type": "mistral",
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "hidden_size": 4096,
            "sliding_window": 4096,
        },
        "Mistral-7B-v0.1 config.json: 32 layers, 32 query / 8 KV heads of 128, every "
        "layer a 4096-token sliding window",
    ),
    "gemma-2-9b": (
        {
            "model_type": "gemma2",
            "num_hidden_layers": 42,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 256,
            "hidden_size": 3584,
            "sliding_window": 4096,
            "layer_types": ["sliding_attention", "full_attention"] * 21,
        },
        "Gemma-2-9B config.json: 42 layers, 16 query / 8 KV heads of 256, local "
        "(4096-token window) and global layers alternating, local first",
    ),
    "whisper-large-v3": (
        {
            "model_type": "whisper",
            "is_encoder_decoder": True,
            "decoder_layers": 32,
            "decoder_attention_heads": 20,
            "d_model": 1280,
            "max_source_positions": 1500,
        },
        "Whisper large-v3 config.json: a 32-layer decoder, 20 heads of 64, each layer "
        "with self-attention and cross-attention over 1500 encoder frames",
    ),
}


def spec_preset_names() -> list[str]:
    """The spec presets' names."""
    return list(_CONFIGS)


def get_spec_preset(name: str, dtype: str = "float16") -> ModelKVSpec:
    """The spec preset called `name` with KV dtype `dtype`; ConfigError if unknown."""
    try:
        config, source = _CONFIGS[name.lower()]
    except KeyError:
        raise ConfigError(f"unknown spec preset {name!r}; known: {', '.join(_CONFIGS)}") from None
    spec = model_spec_from_hf_config(config, name.lower(), dtype)
    return ModelKVSpec(spec.name, spec.groups, source)
