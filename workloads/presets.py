"""Model presets: the KV geometries the seed literature works its examples with.

Each preset notes where its numbers come from. Capacity math only needs layers, KV
heads, head dim and dtype; query heads matter for attention benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import KVGeometry


@dataclass(frozen=True)
class ModelPreset:
    """A named KV geometry, with a note of its source and rough weight size.

    Attributes:
        name: preset key used on the command line.
        geometry: the KV geometry (fp16 unless noted).
        source: where the numbers come from.
        weight_bytes: approximate fp16 weight bytes, for modeled decode time (0 = unknown).
        hidden_size: model width, for modeled prefill FLOPs (0 = unknown).
    """

    name: str
    geometry: KVGeometry
    source: str
    weight_bytes: int = 0
    hidden_size: int = 0


def _preset(
    name: str,
    layers: int,
    kv_heads: int,
    head_dim: int,
    q_heads: int,
    source: str,
    params_b: float = 0.0,
    hidden: int = 0,
) -> ModelPreset:
    geometry = KVGeometry(layers, kv_heads, head_dim, "float16", q_heads)
    return ModelPreset(name, geometry, source, int(params_b * 1e9 * 2), hidden)


PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        _preset(
            "llama-3-8b",
            32,
            8,
            128,
            32,
            "[KV-capacity] table (32-layer, 8-KV-head GQA) and [vLLM-internals] "
            "(Llama-3-8B: 128 KiB/token)",
            8.0,
            4096,
        ),
        _preset(
            "llama-2-70b",
            80,
            8,
            128,
            64,
            "[KV-capacity] table (80-layer, 8-KV-head GQA: 320 KiB/token); "
            "[PA-deep-dive] memory budget",
            70.0,
            8192,
        ),
        _preset(
            "llama-3-70b",
            80,
            8,
            128,
            64,
            "Llama 3 70B (Meta, 2024; Llama 3.1 70B has the same shapes): 80 layers, 64 "
            "query heads and 8 KV heads of 128 (320 KiB/token), hidden 8192, 70.6B "
            "parameters; the Mooncake paper (FAST'25) serves a model of this shape",
            70.6,
            8192,
        ),
        _preset(
            "mha-96",
            96,
            96,
            128,
            96,
            "[KV-capacity] table (96-layer, 96-KV-head MHA: 4.5 MiB/token; GPT-3 175B class)",
            175.0,
            12288,
        ),
        _preset(
            "mha-80x64",
            80,
            64,
            128,
            64,
            "[KV-capacity] MHA/GQA/MQA comparison: 80 layers, 64 KV heads (2,560 KiB/token)",
            70.0,
            8192,
        ),
        _preset(
            "gqa-80x8",
            80,
            8,
            128,
            64,
            "[KV-capacity] MHA/GQA/MQA comparison: 80 layers, 8 KV heads (320 KiB/token)",
            70.0,
            8192,
        ),
        _preset(
            "mqa-80x1",
            80,
            1,
            128,
            64,
            "[KV-capacity] MHA/GQA/MQA comparison: 80 layers, 1 KV head (40 KiB/token)",
            70.0,
            8192,
        ),
        _preset(
            "opt-13b",
            40,
            40,
            128,
            40,
            "OPT-13B (Zhang et al. 2022): 40 layers, 40 heads of 128, hidden 5120; the vLLM "
            "paper's Table 1 lists 26 GB of parameters (800 KiB of KV per token)",
            13.0,
            5120,
        ),
        _preset(
            "opt-66b",
            64,
            72,
            128,
            72,
            "OPT-66B: 64 layers, 72 heads of 128, hidden 9216; vLLM paper Table 1: 132 GB "
            "of parameters (2.25 MiB of KV per token)",
            66.0,
            9216,
        ),
        _preset(
            "opt-175b",
            96,
            96,
            128,
            96,
            "OPT-175B: 96 layers, 96 heads of 128, hidden 12288; vLLM paper Table 1: 346 GB "
            "of parameters (4.5 MiB of KV per token)",
            173.0,
            12288,
        ),
        _preset(
            "gpt-32x32",
            32,
            32,
            128,
            32,
            "[paged-sim] GPT-style model: 32 layers, 32 heads, dim 128, fp16 (512 KiB/token)",
            7.0,
            4096,
        ),
    )
}


def get_preset(name: str) -> ModelPreset:
    """Return the preset called `name`, or raise ConfigError listing the known ones."""
    try:
        return PRESETS[name.lower()]
    except KeyError:
        raise ConfigError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}") from None
