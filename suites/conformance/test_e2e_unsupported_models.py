"""The e2e runner decodes only what its forward implements, and refuses the rest by name.

Its forward (suites/e2e/llama_forward.py) runs embedding, (RMSNorm, rotary attention,
RMSNorm, MLP) x layers, norm and lm_head. Qwen3 adds per-head q/k RMSNorms (decoded
without them its logits are off by 0.1-0.6) and Mistral may attend through a sliding
window (tokens diverge once the context passes it): both are refused with ConfigError
naming what is missing. Models it does accept (Llama, Mistral without a window, Qwen2)
match Hugging Face's own forward at every position.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from kvbench.reference.oracle import relative_error
from kvbench.suites.e2e.llama_forward import (
    LlamaForward,
    OracleAttention,
    check_supported,
    pack,
)
from kvbench.workloads.errors import ConfigError

SMALL = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)


def _model(config_cls: str, model_cls: str, **extra):  # type: ignore[no-untyped-def]
    import transformers

    config = getattr(transformers, config_cls)(**SMALL, **extra)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = getattr(transformers, model_cls)(config)
    return model.float().eval()


@pytest.mark.parametrize(
    ("config_cls", "model_cls", "extra", "names"),
    [
        ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 8}, "q_norm, k_norm"),
        ("MistralConfig", "MistralForCausalLM", {"sliding_window": 4}, "sliding_window=4"),
        (
            "Qwen2Config",
            "Qwen2ForCausalLM",
            {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0},
            "sliding",
        ),
        ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 8}, "'gemma'"),
    ],
)
def test_unimplemented_models_are_refused_by_name(
    config_cls: str, model_cls: str, extra: dict, names: str
) -> None:
    model = _model(config_cls, model_cls, **extra)
    with pytest.raises(ConfigError, match=names.replace("(", r"\(")):
        LlamaForward(model)


def test_an_unmodeled_config_field_is_refused() -> None:
    model = _model("LlamaConfig", "LlamaForCausalLM")
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(ConfigError, match=r"final_logit_softcapping=30\.0"):
        check_supported(model)


@pytest.mark.parametrize(
    ("config_cls", "model_cls", "extra"),
    [
        ("LlamaConfig", "LlamaForCausalLM", {}),
        ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
        ("Qwen2Config", "Qwen2ForCausalLM", {}),
    ],
)
def test_accepted_models_match_hugging_face_on_every_position(
    config_cls: str, model_cls: str, extra: dict
) -> None:
    model = _model(config_cls, model_cls, **extra)
    fwd = LlamaForward(model)
    prompt = list(range(3, 40))
    empty = torch.empty(SMALL["num_hidden_layers"], 0, fwd.num_kv_heads, fwd.head_dim)
    ours = fwd(pack(["a"], [prompt], [0], [(empty, empty)]), OracleAttention(fwd.scale)).logits
    with torch.no_grad():
        theirs = model(torch.tensor([prompt]), use_cache=False).logits[0].float()
    assert relative_error(ours, theirs) <= 1e-5
