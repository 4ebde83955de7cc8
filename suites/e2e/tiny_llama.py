"""A tiny random-weight Llama from Hugging Face transformers, and its greedy oracle.

The model is built from a `LlamaConfig` with a fixed seed, float32 on the CPU, with eager
attention: nothing is downloaded. `hf_greedy` runs transformers' own `generate` (its own
dynamic KV cache, its own attention) and is the independent oracle of the end-to-end suite.

Weights are drawn with a larger standard deviation than Llama's default 0.02 so logits
are peaked: with near-uniform logits the greedy argmax would sit on ties that float32
rounding decides, and exact token comparison would test rounding, not the cache.
No BOS/EOS/pad ids are set, so HF's generate never stops early or masks a logit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

from kvbench.workloads.geometry import KVGeometry


@dataclass(frozen=True)
class TinyLlamaSpec:
    """Shape of the tiny model (all sizes in elements or counts)."""

    num_layers: int = 2
    hidden_size: int = 64
    num_q_heads: int = 4
    num_kv_heads: int = 2
    vocab_size: int = 256
    intermediate_size: int = 128
    max_positions: int = 1024
    init_std: float = 0.1
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_q_heads


@lru_cache(maxsize=4)
def build_tiny_llama(spec: TinyLlamaSpec = TinyLlamaSpec()):  # -> LlamaForCausalLM
    """The model for `spec`, in eval mode, float32, CPU; the same weights for the same spec.

    Cached: callers must not modify it.
    """
    return random_llama(
        spec,
        seed=spec.seed,
        config_overrides={"initializer_range": spec.init_std},
    )


def random_llama(spec, *, seed: int, device="cpu", config_overrides=None):  # type: ignore[no-untyped-def]
    """A random-weight LlamaForCausalLM (float32, eval mode, no grad; nothing downloaded)
    of a spec with vocab_size, hidden_size, intermediate_size, num_layers, num_q_heads,
    num_kv_heads and max_positions; the same weights for the same spec and seed."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_q_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_positions,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
        # taken at run time (LlamaConfig passes it on to PretrainedConfig), though its typed
        # signature omits it
        attn_implementation="eager",  # type: ignore[call-arg]
        **(config_overrides or {}),
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    # transformers types its decorated `to` as unbound (asks for `self`)
    model = model.to(device=device, dtype=torch.float32).eval()  # type: ignore[call-arg]
    model.requires_grad_(False)
    return model


def kv_geometry(model) -> KVGeometry:
    """The KV geometry of `model` (float32 KV, as the model runs)."""
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return KVGeometry(
        num_layers=cfg.num_hidden_layers,
        num_kv_heads=cfg.num_key_value_heads,
        head_dim=head_dim,
        dtype="float32",
        num_q_heads=cfg.num_attention_heads,
    )


@dataclass(frozen=True)
class GreedyResult:
    """HF's greedy continuation: `tokens[i]` is argmax of `logits[i]` ([n, vocab])."""

    tokens: tuple[int, ...]
    logits: torch.Tensor


def hf_greedy(model, prompt: Sequence[int], max_new_tokens: int) -> GreedyResult:
    """Greedy decoding by transformers' own `generate` with its own cache (batch of one,
    so no padding is involved on the oracle's side)."""
    ids = torch.tensor([list(prompt)], dtype=torch.long)
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            output_logits=True,
            return_dict_in_generate=True,
            use_cache=True,
            pad_token_id=0,
        )
    tokens = tuple(int(t) for t in out.sequences[0, len(prompt) :])
    logits = torch.cat([step.float() for step in out.logits], dim=0)
    return GreedyResult(tokens, logits)
