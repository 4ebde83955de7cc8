"""Forwards of HF models whose layers have KV cache specs, with kvbench holding the KV.

As in `llama_forward` (read its docstring for why a forward of our own), every module runs
as transformers built it, on a packed ragged batch; only where K/V live and how attention
reads them is kvbench's, through a layer-group attention engine (`spec_attention`):

* `WindowedLlamaForward`: Llama-architecture models whose layers may have a sliding
  window (Mistral, Qwen2 with `use_sliding_window`): the Llama forward, the window
  applied by the engine from the layer's group;
* `Gemma2Forward`: Gemma 2's scaled embedding, (1 + w) RMSNorms around attention and MLP,
  attention scaled by `query_pre_attn_scalar` ** -0.5, local (windowed) and global layers,
  and its tanh soft-cap of the final logits;
* `WhisperDecoderForward`: Whisper's decoder (learned positions, LayerNorms, biased
  projections, queries scaled before attention as HF does, GELU MLP) with its
  self-attention paged and its cross-attention reading the encoder K/V written at
  admission; `encoder_kv` runs HF's encoder and the decoder layers' K/V projections.

`check_spec_supported` refuses by name what these do not implement: attention-score
soft-capping (Gemma 2's `attn_logit_softcapping`: a tanh inside the softmax, which the
paged kernels cannot apply), T5's relative position bias (added to attention scores),
Gemma 3 (per-head q/k norms, a local rotary base), any other module or model type.

Another architecture joins with `register_forward` (its forward, its own refusals, and
related model types it refuses by name), from a library module or a test, so the
built-in list above does not change for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from kvbench.reference.contract import KVPair
from kvbench.suites.e2e.llama_forward import (
    ForwardOutput,
    LlamaForward,
    PackedBatch,
    check_supported,
    embed_batch,
    project_qkv,
)
from kvbench.workloads.errors import ConfigError, ShapeError
from kvbench.workloads.kv_spec import ModelKVSpec


class GroupAttention(Protocol):
    """Attention of the packed new tokens in one model layer, KV held per layer group.

    `__call__`: self-attention (q [T, Hq, D]; k, v [T, Hkv, D] of the new tokens, after
    rotary). `cross`: cross-attention of q over each request's encoder K/V (no mask).
    Both return [T, Hq, D] in q's dtype.
    """

    def __call__(
        self, batch: PackedBatch, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor: ...

    def cross(self, batch: PackedBatch, layer: int, q: torch.Tensor) -> torch.Tensor: ...


class SpecForward(Protocol):
    """What the layer-group runner needs of a forward."""

    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    is_encoder_decoder: bool

    def __call__(self, batch: PackedBatch, attention: GroupAttention) -> ForwardOutput: ...

    def encoder_kv(self, encoder_input: torch.Tensor) -> list[KVPair]: ...


# ---------------------------------------------------------------------------- refusals
def _check_modules(model_type: str, levels: Sequence[tuple[str, object, frozenset]]) -> None:
    for where, module, allowed in levels:
        extra = [n for n, _ in module.named_children() if n not in allowed]  # type: ignore[attr-defined]
        if extra:
            raise ConfigError(
                f"{model_type} model: {where} has module(s) {', '.join(extra)} that the e2e "
                "runner's forward does not implement"
            )


_GEMMA2_LAYER = frozenset(
    {
        "self_attn",
        "mlp",
        "input_layernorm",
        "post_attention_layernorm",
        "pre_feedforward_layernorm",
        "post_feedforward_layernorm",
    }
)
_PROJ = frozenset({"q_proj", "k_proj", "v_proj", "o_proj"})
_WHISPER_LAYER = frozenset(
    {
        "self_attn",
        "activation_fn",
        "self_attn_layer_norm",
        "encoder_attn",
        "encoder_attn_layer_norm",
        "fc1",
        "fc2",
        "final_layer_norm",
    }
)
_WHISPER_PROJ = frozenset({"q_proj", "k_proj", "v_proj", "out_proj"})

#: Model types with a feature the paged attention path cannot express, and that feature.
_REFUSED_TYPES = {
    "t5": "T5's relative position bias is added to the attention scores, which the paged "
    "kernels do not take",
    "mt5": "mT5's relative position bias is added to the attention scores, which the paged "
    "kernels do not take",
    "gemma3_text": "Gemma 3's per-head q/k norms and separate local rotary base are not "
    "implemented by the e2e runner's forward",
    "gemma3": "Gemma 3's per-head q/k norms and separate local rotary base are not "
    "implemented by the e2e runner's forward",
}

#: Model types the layer-group runner decodes with its built-in forwards.
SPEC_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "gemma2", "whisper"})


@dataclass(frozen=True)
class AddedForward:
    """A forward added with `register_forward`: `check(model)` raises ConfigError naming
    what it does not follow; `build(model)` makes the forward."""

    check: Callable[[Any], None]
    build: Callable[[Any], SpecForward]


#: Forwards added beside the built-in ones, by model type (`register_forward`).
_ADDED: dict[str, AddedForward] = {}


def register_forward(
    model_type: str,
    build: Callable[[Any], SpecForward],
    check: Callable[[Any], None],
    refused: Mapping[str, str] | None = None,
) -> None:
    """Let the layer-group runner decode `model_type` with `build(model)` after
    `check(model)` (ConfigError naming what the forward does not follow); `refused`:
    related model types to refuse by name, with why (e.g. a multimodal wrapper)."""
    if model_type in SPEC_MODEL_TYPES or model_type in _REFUSED_TYPES:
        raise ConfigError(f"model type {model_type!r} has a built-in forward or refusal")
    _ADDED[model_type] = AddedForward(check, build)
    _REFUSED_TYPES.update(refused or {})


def _is_on(value: object) -> bool:
    return value is not None and value is not False and value != 0


def check_spec_supported(model) -> None:
    """Refuse (ConfigError, naming it) a model the layer-group runner would decode
    wrongly; see the module docstring."""
    cfg = model.config
    model_type = getattr(cfg, "model_type", None)
    if model_type in _REFUSED_TYPES:
        raise ConfigError(f"model type {model_type!r}: {_REFUSED_TYPES[model_type]}")
    if model_type in ("llama", "mistral", "qwen2"):
        check_supported(model, allow_sliding_window=True)
        return
    if model_type == "gemma2":
        cap = getattr(cfg, "attn_logit_softcapping", None)
        if cap is not None:
            raise ConfigError(
                f"gemma2 model: attn_logit_softcapping={cap!r} (a tanh soft-cap of the "
                "attention scores before the softmax) is not implemented by kvbench's paged "
                "attention kernels; set it to None to run the rest of the model"
            )
        if _is_on(getattr(cfg, "use_bidirectional_attention", None)):
            raise ConfigError("gemma2 model: use_bidirectional_attention is not implemented")
        inner = model.model
        levels: list[tuple[str, object, frozenset]] = [
            ("model", inner, frozenset({"embed_tokens", "layers", "norm", "rotary_emb"}))
        ]
        for i, layer in enumerate(inner.layers):
            levels.append((f"decoder layer {i}", layer, _GEMMA2_LAYER))
            levels.append((f"attention of layer {i}", layer.self_attn, _PROJ))
        _check_modules(model_type, levels)
        return
    if model_type in _ADDED:
        _ADDED[model_type].check(model)
        return
    if model_type == "whisper":
        if _is_on(getattr(cfg, "scale_embedding", None)):
            raise ConfigError("whisper model: scale_embedding=True is not implemented")
        dec = model.model.decoder
        levels = [
            ("decoder", dec, frozenset({"embed_tokens", "embed_positions", "layers", "layer_norm"}))
        ]
        for i, layer in enumerate(dec.layers):
            levels.append((f"decoder layer {i}", layer, _WHISPER_LAYER))
            levels.append((f"self-attention of layer {i}", layer.self_attn, _WHISPER_PROJ))
            levels.append((f"cross-attention of layer {i}", layer.encoder_attn, _WHISPER_PROJ))
        _check_modules(model_type, levels)
        return
    raise ConfigError(
        f"model type {model_type!r} is not supported by the e2e layer-group runner (it "
        f"implements {', '.join(sorted(SPEC_MODEL_TYPES | _ADDED.keys()))})"
    )


# ---------------------------------------------------------------------------- layer map
@dataclass(frozen=True)
class LayerMap:
    """Where each model layer's KV lives: (group index, layer index within the group's
    storage) for its self-attention and, in an encoder-decoder, its cross-attention."""

    self_slots: tuple[tuple[int, int], ...]
    cross_slots: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, spec: ModelKVSpec, forward: SpecForward) -> LayerMap:
        """The map of `spec`'s groups onto the model's layers; ConfigError unless every
        layer is in exactly one self-attention group (and one cross-attention group for
        an encoder-decoder, none otherwise) and every group's KV shape is the model's."""
        n = forward.num_layers
        shape = (forward.num_kv_heads, forward.head_dim)
        slots: dict[str, dict[int, tuple[int, int]]] = {"self": {}, "cross": {}}
        for gi, group in enumerate(spec.groups):
            if (group.num_kv_heads, group.head_dim) != shape:
                raise ConfigError(
                    f"layer group {gi} ({group.spec.describe()}) holds {group.num_kv_heads} KV "
                    f"heads of dim {group.head_dim}; the model has {shape[0]} of dim {shape[1]}"
                )
            ids = group.layer_ids or (tuple(range(n)) if len(spec.groups) == 1 else ())
            if len(ids) != group.num_layers:
                raise ConfigError(f"layer group {gi} does not list its model layers")
            kind = "cross" if gi in spec.cross_groups else "self"
            for j, layer in enumerate(ids):
                if layer in slots[kind] or not 0 <= layer < n:
                    raise ConfigError(
                        f"layer {layer} is in two {kind}-attention groups or out of 0..{n - 1}"
                    )
                slots[kind][layer] = (gi, j)
        for kind in ("self", "cross"):
            want = n if kind == "self" or forward.is_encoder_decoder else 0
            if len(slots[kind]) != want:
                raise ConfigError(
                    f"the groups place {len(slots[kind])} of the model's {n} layers in "
                    f"{kind}-attention groups; {want} expected"
                )
        return cls(
            tuple(slots["self"][i] for i in range(n)),
            tuple(slots["cross"][i] for i in range(len(slots["cross"]))),
        )

    def group_layers(self, group: int, cross: bool = False) -> list[int]:
        """The model layers of `group`, in its storage order."""
        slots = self.cross_slots if cross else self.self_slots
        pairs = sorted((j, layer) for layer, (g, j) in enumerate(slots) if g == group)
        return [layer for _, layer in pairs]


# ---------------------------------------------------------------------------- forwards
class WindowedLlamaForward(LlamaForward):
    """The Llama forward for models whose layers may be windowed (the engine applies
    each layer's window from its group)."""

    is_encoder_decoder = False

    def __init__(self, model) -> None:
        super().__init__(model, allow_sliding_window=True)
        self.num_layers = len(model.model.layers)

    def encoder_kv(self, encoder_input: torch.Tensor) -> list[KVPair]:
        raise ConfigError(f"{self.model.config.model_type} has no encoder")


class Gemma2Forward:
    """Gemma 2's layers on a packed ragged batch (see the module docstring)."""

    is_encoder_decoder = False

    def __init__(self, model) -> None:
        from transformers.models.gemma2.modeling_gemma2 import apply_rotary_pos_emb

        check_spec_supported(model)
        self.model = model
        self._rotary = apply_rotary_pos_emb
        cfg = model.config
        self.num_layers = cfg.num_hidden_layers
        self.num_q_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scale = float(model.model.layers[0].self_attn.scaling)  # query_pre_attn_scalar
        self.final_cap = cfg.final_logit_softcapping

    def encoder_kv(self, encoder_input: torch.Tensor) -> list[KVPair]:
        raise ConfigError("gemma2 has no encoder")

    @torch.no_grad()
    def __call__(self, batch: PackedBatch, attention: GroupAttention) -> ForwardOutput:
        inner = self.model.model
        positions, h = embed_batch(inner, batch)  # scaled by sqrt(hidden) inside the module
        t = h.shape[0]
        cos, sin = inner.rotary_emb(h, positions.unsqueeze(0))
        cos, sin = cos[0], sin[0]
        keys, values = [], []
        for layer, block in enumerate(inner.layers):
            attn = block.self_attn
            x = block.input_layernorm(h)
            q, k, v = project_qkv(attn, x, self.num_q_heads, self.num_kv_heads, self.head_dim)
            q, k = self._rotary(q, k, cos, sin, unsqueeze_dim=1)
            q, k = q.contiguous(), k.contiguous()
            keys.append(k)
            values.append(v)
            o = attention(batch, layer, q, k, v)
            a = attn.o_proj(o.reshape(t, self.num_q_heads * self.head_dim))
            h = h + block.post_attention_layernorm(a)
            m = block.mlp(block.pre_feedforward_layernorm(h))
            h = h + block.post_feedforward_layernorm(m)
        logits = self.model.lm_head(inner.norm(h))
        if self.final_cap is not None:  # as Gemma2ForCausalLM.forward does
            logits = torch.tanh(logits / self.final_cap) * self.final_cap
        return ForwardOutput(torch.stack(keys), torch.stack(values), logits.float().cpu())


class WhisperDecoderForward:
    """Whisper's decoder on a packed ragged batch (see the module docstring)."""

    is_encoder_decoder = True

    def __init__(self, model) -> None:
        check_spec_supported(model)
        self.model = model
        cfg = model.config
        self.num_layers = cfg.decoder_layers
        self.num_q_heads = cfg.decoder_attention_heads
        self.num_kv_heads = cfg.decoder_attention_heads
        self.head_dim = cfg.d_model // cfg.decoder_attention_heads
        self.max_positions = cfg.max_target_positions
        # HF scales the queries by head_dim ** -0.5 before attention and attends with 1.0.
        self.scale = 1.0

    @torch.no_grad()
    def encoder_kv(self, encoder_input: torch.Tensor) -> list[KVPair]:
        """Per decoder layer, the cross-attention K and V ([encoder_len, heads, dim]) of
        HF's encoder run on `encoder_input` ([num_mel_bins, frames])."""
        dec = self.model.model.decoder
        dev = dec.embed_tokens.weight.device
        enc = self.model.model.encoder(encoder_input[None].to(dev)).last_hidden_state[0]
        shape = (enc.shape[0], self.num_kv_heads, self.head_dim)
        return [
            (
                block.encoder_attn.k_proj(enc).view(shape).contiguous(),
                block.encoder_attn.v_proj(enc).view(shape).contiguous(),
            )
            for block in dec.layers
        ]

    @torch.no_grad()
    def __call__(self, batch: PackedBatch, attention: GroupAttention) -> ForwardOutput:
        dec = self.model.model.decoder
        dev = dec.embed_tokens.weight.device
        ids = batch.flat_ids().to(dev)
        positions = batch.flat_positions().to(dev)
        if int(positions.max()) >= self.max_positions:
            raise ShapeError(
                f"decoder position {int(positions.max())} is past whisper's "
                f"max_target_positions={self.max_positions}"
            )
        t = ids.shape[0]
        hq, d = self.num_q_heads, self.head_dim
        h = dec.embed_tokens(ids) + dec.embed_positions.weight[positions]
        keys, values = [], []
        for layer, block in enumerate(dec.layers):
            sa = block.self_attn
            x = block.self_attn_layer_norm(h)
            q = (sa.q_proj(x) * sa.scaling).view(t, hq, d)
            k = sa.k_proj(x).view(t, hq, d).contiguous()
            v = sa.v_proj(x).view(t, hq, d).contiguous()
            keys.append(k)
            values.append(v)
            o = attention(batch, layer, q, k, v)
            h = h + sa.out_proj(o.reshape(t, hq * d))
            ca = block.encoder_attn
            x = block.encoder_attn_layer_norm(h)
            q = (ca.q_proj(x) * ca.scaling).view(t, hq, d)
            h = h + ca.out_proj(attention.cross(batch, layer, q).reshape(t, hq * d))
            x = block.final_layer_norm(h)
            h = h + block.fc2(block.activation_fn(block.fc1(x)))
        logits = self.model.proj_out(dec.layer_norm(h))
        return ForwardOutput(torch.stack(keys), torch.stack(values), logits.float().cpu())


def spec_forward(model) -> SpecForward:
    """The forward for `model`'s architecture; ConfigError naming what is not modeled."""
    check_spec_supported(model)
    model_type = model.config.model_type
    if model_type == "gemma2":
        return Gemma2Forward(model)
    if model_type == "whisper":
        return WhisperDecoderForward(model)
    if model_type in _ADDED:
        return _ADDED[model_type].build(model)
    return WindowedLlamaForward(model)
