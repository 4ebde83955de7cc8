"""Tiny random-weight Hugging Face models with KV cache specs, and their HF oracle.

Architectures whose KV is not plain full attention, built in code (nothing is
downloaded), float32, CPU, eager attention, fixed seeds:

* Mistral with `sliding_window` shorter than the test sequences (every layer windowed),
  so a windowed layer group really releases blocks mid-sequence;
* Gemma 2 (`layer_types` alternating sliding / full attention): embeddings scaled by
  sqrt(hidden), (1 + w) RMSNorms before and after attention and MLP, attention scaled by
  `query_pre_attn_scalar` ** -0.5 (set apart from head_dim so a kernel that scales by
  head_dim fails) and a tanh soft-cap of the final logits; attention-score soft-capping
  is off (`attn_logit_softcapping=None`): the paged kernels cannot apply it, so the
  runner refuses a model that sets it (see `spec_forward.check_spec_supported`);
* Qwen2 with `use_sliding_window` and `max_window_layers` (the first layers full, the
  rest windowed: a hybrid read from a config without `layer_types`' own spelling);
* Whisper (encoder-decoder): a log-mel encoder whose output the decoder's
  cross-attention reads; the decoder's self-attention is paged, the cross-attention KV is
  written once at admission.

The oracle is Hugging Face's own forward over the whole sequence (`hf_logits`: its own
attention, masks, sliding-window mask and cross-attention, no KV cache), teacher-forced
on the tokens kvbench produced: a token kvbench got wrong shows as HF's argmax differing
there. Weights are drawn wider than the defaults (std 0.1) so logits are peaked and the
greedy argmax is not decided by rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

from kvbench.workloads.hf_spec import model_spec_from_hf_config
from kvbench.workloads.kv_spec import ModelKVSpec

#: The architectures built here (keys of `build_spec_model`).
KINDS = ("mistral", "gemma2", "whisper", "qwen2")


@dataclass(frozen=True)
class TinySpecModel:
    """Shape of a tiny model (sizes in elements or counts; window and encoder in tokens).

    window: the sliding window (Mistral: every layer; Gemma 2: its local layers).
    encoder_len: Whisper's encoder output length (`max_source_positions`; its input has
    twice as many mel frames).
    """

    kind: str
    num_layers: int = 2
    hidden_size: int = 64
    num_q_heads: int = 4
    num_kv_heads: int = 2
    vocab_size: int = 256
    intermediate_size: int = 128
    max_positions: int = 256
    window: int = 7
    encoder_len: int = 13
    num_mel_bins: int = 8
    query_pre_attn_scalar: int = 24
    init_std: float = 0.1
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_q_heads


def common_fields(spec: TinySpecModel) -> dict:
    """The config fields every decoder-only architecture here shares (sizes, no special
    tokens, eager attention): a test building another architecture's config starts
    from them."""
    return dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_q_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_positions,
        initializer_range=spec.init_std,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )


def make_config(spec: TinySpecModel, **overrides):  # -> transformers.PretrainedConfig
    """The transformers config of `spec` (fields in `overrides` replace the defaults)."""
    import transformers

    if spec.kind == "mistral":
        return transformers.MistralConfig(
            **{**common_fields(spec), "sliding_window": spec.window, **overrides}
        )
    if spec.kind == "qwen2":  # the first half of the layers full, the rest windowed
        return transformers.Qwen2Config(
            **{
                **common_fields(spec),
                "use_sliding_window": True,
                "sliding_window": spec.window,
                "max_window_layers": spec.num_layers // 2,
                **overrides,
            }
        )
    if spec.kind == "gemma2":
        return transformers.Gemma2Config(
            **{
                **common_fields(spec),
                "head_dim": spec.head_dim,
                "sliding_window": spec.window,
                "query_pre_attn_scalar": spec.query_pre_attn_scalar,
                "attn_logit_softcapping": None,
                "final_logit_softcapping": 30.0,
                **overrides,
            }
        )
    if spec.kind == "whisper":
        return transformers.WhisperConfig(
            **{
                "vocab_size": spec.vocab_size,
                "d_model": spec.hidden_size,
                "encoder_layers": 1,
                "decoder_layers": spec.num_layers,
                "encoder_attention_heads": spec.num_q_heads,
                "decoder_attention_heads": spec.num_q_heads,
                "encoder_ffn_dim": spec.intermediate_size,
                "decoder_ffn_dim": spec.intermediate_size,
                "num_mel_bins": spec.num_mel_bins,
                "max_source_positions": spec.encoder_len,
                "max_target_positions": spec.max_positions,
                "init_std": spec.init_std,
                "pad_token_id": 0,
                "bos_token_id": 1,
                "eos_token_id": 2,
                "decoder_start_token_id": 3,
                "attn_implementation": "eager",
                **overrides,
            }
        )
    raise ValueError(f"unknown tiny model kind {spec.kind!r}; known: {KINDS}")


def random_model(config, seed: int, cls=None):  # -> transformers.PreTrainedModel
    """A random-weight model of `config` (float32, eval, no grad; same seed, same weights);
    `cls`: the transformers model class (by default this module's for its model type)."""
    import transformers

    cls = cls or {
        "mistral": transformers.MistralForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "gemma2": transformers.Gemma2ForCausalLM,
        "whisper": transformers.WhisperForConditionalGeneration,
    }.get(config.model_type)
    if cls is None:
        raise ValueError(f"no tiny builder for model type {config.model_type!r}")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = cls(config)
    model = model.to(dtype=torch.float32).eval()  # type: ignore[call-arg]
    model.requires_grad_(False)
    return model


@lru_cache(maxsize=6)
def build_spec_model(spec: TinySpecModel):  # -> transformers.PreTrainedModel
    """The model of `spec` (cached: callers must not modify it)."""
    return random_model(make_config(spec), spec.seed)


def model_kv_spec(model, dtype: str = "float32") -> ModelKVSpec:
    """The model's layer groups as kvbench reads them from its HF config (`hf_spec`)."""
    return model_spec_from_hf_config(
        model.config.to_dict(), name=model.config.model_type, dtype=dtype
    )


def encoder_inputs(model, count: int, seed: int) -> list[torch.Tensor]:
    """`count` random Whisper log-mel inputs [num_mel_bins, 2 * max_source_positions]."""
    cfg = model.config
    gen = torch.Generator().manual_seed(seed)
    shape = (cfg.num_mel_bins, 2 * cfg.max_source_positions)
    return [torch.randn(shape, generator=gen) for _ in range(count)]


@torch.no_grad()
def hf_logits(
    model, tokens: Sequence[int], encoder_input: torch.Tensor | None = None
) -> torch.Tensor:
    """HF's own forward over `tokens` (no KV cache): logits [len(tokens), vocab] float32,
    row i predicting the token after position i. An encoder-decoder reads
    `encoder_input` through its own encoder and cross-attention."""
    ids = torch.tensor([list(tokens)], dtype=torch.long)
    if model.config.is_encoder_decoder:
        if encoder_input is None:
            raise ValueError("an encoder-decoder needs its encoder input")
        out = model(input_features=encoder_input[None], decoder_input_ids=ids, use_cache=False)
    else:
        out = model(ids, use_cache=False)
    return out.logits[0].float()
