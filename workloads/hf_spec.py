"""Read a Hugging Face `config.json` (as a dict) into a `ModelKVSpec`.

Only the fields that decide the KV cache are read, without importing transformers:

* decoder-only: `num_hidden_layers`, `num_attention_heads`, `num_key_value_heads`
  (default: the attention heads), `head_dim` (default: hidden_size / heads), and the
  attention kind per layer: `layer_types` where present (Gemma 2/3, recent Qwen2,
  gpt-oss: "full_attention" / "sliding_attention"), else `sliding_window` on every
  layer (Mistral) unless `use_sliding_window` is false (Qwen2), in which case, or with
  no `sliding_window`, every layer is full attention. Qwen2's `max_window_layers` (the
  first layers stay full) is honoured when `layer_types` is absent. Llama 4's chunked
  local attention: "chunked_attention" layers of `attention_chunk_size` tokens; without
  `layer_types`, a Llama 4 text config (`model_type` llama4_text, or llama4's
  `text_config`) makes its RoPE layers chunked (`no_rope_layers`: 1 = RoPE, default
  every `no_rope_layer_interval`-th layer NoPE, full attention), as transformers does.
* encoder-decoder (`is_encoder_decoder`): the decoder's layers each hold one
  self-attention KV (full) and one cross-attention KV over the encoder output; the
  encoder length is `max_source_positions` (Whisper: 1500 audio frames) unless given.

Any other layer type (linear attention, ...) is refused by name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvbench.workloads.errors import ConfigError
from kvbench.workloads.kv_spec import (
    AttentionKind,
    KVCacheSpec,
    LayerGroup,
    ModelKVSpec,
    group_layers,
)

#: The `layer_types` entries a decoder-only config may hold.
_DECODER_LAYER_TYPES = {
    AttentionKind.FULL.value,
    AttentionKind.SLIDING_WINDOW.value,
    AttentionKind.CHUNKED_LOCAL.value,
}


def _int_field(config: Mapping[str, Any], *names: str) -> int:
    for name in names:
        value = config.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"config field {name}={value!r} is not a positive integer")
            return value
    raise ConfigError(f"config has none of the fields {', '.join(names)}")


def _head_dim(config: Mapping[str, Any], heads: int, width_fields: tuple[str, ...]) -> int:
    if config.get("head_dim") is not None:
        return _int_field(config, "head_dim")
    width = _int_field(config, *width_fields)
    if width % heads:
        raise ConfigError(f"hidden size {width} does not divide by {heads} attention heads")
    return width // heads


def _llama4_layer_types(config: Mapping[str, Any], num_layers: int) -> list[str] | None:
    """Llama 4's layer types when its config has no `layer_types` (transformers'
    Llama4TextConfig): RoPE layers chunked when `attention_chunk_size` is set."""
    if config.get("model_type") != "llama4_text" or config.get("attention_chunk_size") is None:
        return None
    rope = config.get("no_rope_layers")
    if not rope:
        interval = _int_field({"no_rope_layer_interval": 4, **config}, "no_rope_layer_interval")
        rope = [int((i + 1) % interval != 0) for i in range(num_layers)]
    if not isinstance(rope, list) or len(rope) != num_layers:
        raise ConfigError(f"config no_rope_layers must list one 0/1 per layer, got {rope!r}")
    chunked, full = AttentionKind.CHUNKED_LOCAL.value, AttentionKind.FULL.value
    return [chunked if r else full for r in rope]


def _layer_specs(config: Mapping[str, Any], num_layers: int) -> list[KVCacheSpec]:
    window = config.get("sliding_window")
    types = config.get("layer_types") or _llama4_layer_types(config, num_layers)
    if types is not None:
        if not isinstance(types, list) or len(types) != num_layers:
            raise ConfigError(
                f"config layer_types must list one type per layer ({num_layers}), got {types!r}"
            )
        unknown = sorted(set(types) - _DECODER_LAYER_TYPES)
        if unknown:
            raise ConfigError(
                f"config layer_types holds {unknown}, which kvbench does not model (it "
                f"models {' and '.join(sorted(_DECODER_LAYER_TYPES))})"
            )
        by_type = {AttentionKind.FULL.value: KVCacheSpec.full()}
        if AttentionKind.SLIDING_WINDOW.value in types:
            if window is None:
                raise ConfigError("config layer_types has sliding_attention but no sliding_window")
            by_type[AttentionKind.SLIDING_WINDOW.value] = KVCacheSpec.sliding_window(window)
        if AttentionKind.CHUNKED_LOCAL.value in types:
            chunk = config.get("attention_chunk_size")
            if chunk is None:
                raise ConfigError(
                    "config layer_types has chunked_attention but no attention_chunk_size"
                )
            by_type[AttentionKind.CHUNKED_LOCAL.value] = KVCacheSpec.chunked_local(chunk)
        return [by_type[t] for t in types]
    if window is None or config.get("use_sliding_window") is False:
        return [KVCacheSpec.full()] * num_layers
    first_windowed = config.get("max_window_layers") if "use_sliding_window" in config else 0
    first_windowed = 0 if first_windowed is None else first_windowed
    return [
        KVCacheSpec.sliding_window(window) if i >= first_windowed else KVCacheSpec.full()
        for i in range(num_layers)
    ]


def model_spec_from_hf_config(
    config: Mapping[str, Any],
    name: str = "hf-config",
    dtype: str = "float16",
    encoder_len: int | None = None,
) -> ModelKVSpec:
    """The KV spec a Hugging Face config describes (see the module docstring).

    Args:
        config: the parsed config.json.
        name: label for tables.
        dtype: KV dtype (config.json's own dtype is the weights', not necessarily the KV's).
        encoder_len: encoder tokens for an encoder-decoder (default max_source_positions).
    """
    if not isinstance(config, Mapping):
        raise ConfigError(f"a config must be a JSON object, got {type(config).__name__}")
    source = f"HF config (model_type {config.get('model_type')!r})"
    if config.get("model_type") == "llama4" and isinstance(config.get("text_config"), Mapping):
        config = {"model_type": "llama4_text", **config["text_config"]}  # the decoder's KV
    if config.get("is_encoder_decoder"):
        layers = _int_field(config, "decoder_layers", "num_decoder_layers", "num_layers")
        heads = _int_field(config, "decoder_attention_heads", "num_heads", "num_attention_heads")
        kv_heads = config.get("num_key_value_heads") or heads
        head_dim = config.get("d_kv") or _head_dim(config, heads, ("d_model", "hidden_size"))
        if encoder_len is None:
            encoder_len = _int_field(config, "max_source_positions")
        ids = tuple(range(layers))
        groups = tuple(
            LayerGroup(spec, layers, kv_heads, head_dim, dtype, ids)
            for spec in (KVCacheSpec.full(), KVCacheSpec.cross_attention(encoder_len))
        )
        return ModelKVSpec(name, groups, source)
    layers = _int_field(config, "num_hidden_layers", "num_layers")
    heads = _int_field(config, "num_attention_heads")
    kv_heads = _int_field(config, "num_key_value_heads", "num_attention_heads")
    head_dim = _head_dim(config, heads, ("hidden_size",))
    return group_layers(name, _layer_specs(config, layers), kv_heads, head_dim, dtype, source)


def read_hf_config(path: str | Path) -> dict[str, Any]:
    """Parse a config.json file; ConfigError (naming the file) if it is not a JSON object.

    Missing, folder and unreadable paths raise OSError (the CLI turns it into one line);
    text that is not UTF-8 raises UnicodeDecodeError likewise.
    """
    text = Path(path).read_text(encoding="utf-8")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{str(path)!r} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    except RecursionError:
        raise ConfigError(
            f"{str(path)!r} is not a usable config (JSON nested too deeply)"
        ) from None
    if not isinstance(config, dict):
        raise ConfigError(
            f"{str(path)!r} holds a JSON {type(config).__name__}, not a config object"
        )
    return config
