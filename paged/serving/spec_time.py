"""The step pricing of a layer-group model (sliding window, hybrid) on a device profile:
what `kvbench simulate --model mistral-7b` and the serving.kv_specs sweep price with.

The KV spec (`workloads.spec_presets`) says which KV each layer reads; the time model also
needs the model's parameters, width and query heads, which a KV spec does not carry.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.paged.serving.attention_layout import AttentionLayout
from kvbench.paged.serving.time_model import TimeModel
from kvbench.workloads.geometry import KVGeometry
from kvbench.workloads.kv_spec import ModelKVSpec
from kvbench.workloads.profiles import get_profile


@dataclass(frozen=True)
class SpecModelFacts:
    """What the time model needs beyond the KV spec [model cards / config.json]."""

    params: float  # parameters (fp16 weights: 2 bytes each)
    hidden_size: int  # model width (all-reduce messages)
    q_heads: int  # query heads per layer (attention FLOPs)


#: Mistral-7B-v0.1: 7.24B parameters, hidden 4096, 32 query heads; Gemma-2-9B: 9.24B,
#: hidden 3584, 16 query heads (their model cards and config.json).
FACTS = {
    "mistral-7b": SpecModelFacts(7.24e9, 4096, 32),
    "gemma-2-9b": SpecModelFacts(9.24e9, 3584, 16),
}


def spec_time_model(model: ModelKVSpec, facts: SpecModelFacts, profile: str, block_size: int,
                    tp: int) -> TimeModel:  # fmt: skip
    """The model's step pricing on `profile` over `tp` ranks (module docstring)."""
    g = model.groups[0]
    geometry = KVGeometry(model.num_layers, g.num_kv_heads, g.head_dim, g.dtype, facts.q_heads)
    return TimeModel(
        get_profile(profile), geometry, int(2 * facts.params), facts.params, block_size,
        tp=tp, hidden_size=facts.hidden_size, layout=AttentionLayout.from_spec(model),
        swap_block_bytes=model.page_bytes(block_size),
    )  # fmt: skip
