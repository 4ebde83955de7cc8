"""`workloads.hf_spec`: Hugging Face configs (as transformers writes them) into KV specs."""

from __future__ import annotations

import pytest

from kvbench.workloads.errors import ConfigError
from kvbench.workloads.hf_spec import model_spec_from_hf_config
from kvbench.workloads.kv_spec import KVCacheSpec

transformers = pytest.importorskip("transformers")


def _layout(config: dict) -> list[tuple[str, int, tuple[int, ...]]]:
    spec = model_spec_from_hf_config(config)
    return [(g.spec.describe(), g.num_layers, g.layer_ids) for g in spec.groups]


def test_mistral_config_is_one_windowed_group() -> None:
    config = transformers.MistralConfig(sliding_window=4096, num_hidden_layers=4).to_dict()
    spec = model_spec_from_hf_config(config)
    assert _layout(config) == [("sliding window 4096", 4, (0, 1, 2, 3))]
    assert (spec.groups[0].num_kv_heads, spec.groups[0].head_dim) == (8, 128)


def test_mistral_without_a_window_is_full_attention() -> None:
    config = transformers.MistralConfig(sliding_window=None, num_hidden_layers=2).to_dict()
    assert _layout(config) == [("full attention", 2, (0, 1))]


def test_gemma_2_config_alternates_local_and_global() -> None:
    config = transformers.Gemma2Config(num_hidden_layers=6, sliding_window=64).to_dict()
    assert _layout(config) == [
        ("sliding window 64", 3, (0, 2, 4)),
        ("full attention", 3, (1, 3, 5)),
    ]


def test_qwen2_max_window_layers_keeps_the_first_layers_full() -> None:
    config = transformers.Qwen2Config(
        use_sliding_window=True, sliding_window=64, max_window_layers=2, num_hidden_layers=4
    ).to_dict()
    assert _layout(config) == [("full attention", 2, (0, 1)), ("sliding window 64", 2, (2, 3))]
    config.pop("layer_types")  # an older config.json: the same answer from the fields
    assert _layout(config) == [("full attention", 2, (0, 1)), ("sliding window 64", 2, (2, 3))]
    config["use_sliding_window"] = False
    assert _layout(config) == [("full attention", 4, (0, 1, 2, 3))]


def test_whisper_config_has_self_and_cross_attention_groups() -> None:
    config = transformers.WhisperConfig(decoder_layers=3, decoder_attention_heads=6).to_dict()
    spec = model_spec_from_hf_config(config)
    assert [g.spec for g in spec.groups] == [KVCacheSpec.full(), KVCacheSpec.cross_attention(1500)]
    assert [(g.num_layers, g.num_kv_heads, g.head_dim) for g in spec.groups] == [(3, 6, 64)] * 2
    other = model_spec_from_hf_config(config, encoder_len=200)
    assert other.groups[1].spec == KVCacheSpec.cross_attention(200)


@pytest.mark.parametrize(
    ("config", "names"),
    [
        ({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
          "layer_types": ["full_attention", "linear_attention"]}, "linear_attention"),
        ({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
          "layer_types": ["full_attention"]}, "one type per layer"),
        ({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
          "layer_types": ["sliding_attention"] * 2}, "no sliding_window"),
        ({"num_hidden_layers": 0, "num_attention_heads": 4, "hidden_size": 64},
         "num_hidden_layers=0"),
        ({"num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 64}, "divide"),
        ({"num_attention_heads": 4, "hidden_size": 64}, "num_hidden_layers"),
        ({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
          "sliding_window": -1}, "window"),
        ([1, 2], "JSON object"),
    ],
)  # fmt: skip
def test_bad_configs_are_refused_by_name(config: object, names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        model_spec_from_hf_config(config)  # type: ignore[arg-type]


_LLAMA4 = {"model_type": "llama4_text", "num_hidden_layers": 8, "num_attention_heads": 8,
           "num_key_value_heads": 2, "hidden_size": 512, "head_dim": 64,
           "attention_chunk_size": 8192}  # fmt: skip


def test_llama4_rope_layers_are_chunked_and_every_fourth_is_full() -> None:
    """Without layer_types, transformers' rule: no_rope_layers (default: every 4th layer
    NoPE) -> RoPE layers chunked local, NoPE layers full; llama4's text_config is read."""
    for config in (_LLAMA4, {"model_type": "llama4", "text_config": _LLAMA4}):
        spec = model_spec_from_hf_config(config)
        kinds = {i: g.spec for g in spec.groups for i in g.layer_ids}
        assert [kinds[i] for i in range(8)] == [KVCacheSpec.chunked_local(8192)] * 3 + [
            KVCacheSpec.full()
        ] + [KVCacheSpec.chunked_local(8192)] * 3 + [KVCacheSpec.full()]
    rope = model_spec_from_hf_config({**_LLAMA4, "no_rope_layers": [1, 0] * 4})
    assert {g.spec.describe() for g in rope.groups} == {"chunked local 8192", "full attention"}
    none = model_spec_from_hf_config({**_LLAMA4, "attention_chunk_size": None})
    assert {g.spec for g in none.groups} == {KVCacheSpec.full()}


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"layer_types": ["chunked_attention"] * 8, "attention_chunk_size": None},
         "chunked_attention but no attention_chunk_size"),
        ({"attention_chunk_size": 0}, "chunk must be an integer >= 1, got 0"),
        ({"no_rope_layers": [1, 0]}, "no_rope_layers must list one 0/1 per layer"),
    ],
)  # fmt: skip
def test_bad_llama4_fields_are_refused_by_name(fields: dict, names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        model_spec_from_hf_config({**_LLAMA4, **fields})
