"""Which KV each layer's attention reads: what the time model prices per layer group.

A full-attention layer's query at position p reads the p + 1 tokens before and at it; a
layer with a sliding window of W reads at most W of them (positions p - W + 1 .. p); a
cross-attention layer reads the encoder's output, E tokens, whatever the position; any
other kind what its rule says (`KindRule.reads`, `chunk_reads`, `decode_reads`). The
time model (`time_model.TimeModel` with a layout) prices attention's KV reads and FLOPs
per layer with these counts instead of the whole context on every layer.

`AttentionLayout.from_spec` takes the layout of a `workloads.kv_spec.ModelKVSpec`; all
its groups must have one per-layer KV shape (the model's geometry), as the presets do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvbench.workloads.errors import ConfigError
from kvbench.workloads.kv_rules import KindRule, rule_for
from kvbench.workloads.kv_spec import AttentionKind, KVCacheSpec, ModelKVSpec


@dataclass(frozen=True)
class LayoutGroup:
    """`layers` layers reading the same KV: full (window and encoder_len None), a
    sliding `window` (tokens), or cross-attention over `encoder_len` tokens; or any kind
    given as its `spec` (what `AttentionLayout.from_spec` passes, so a new kind needs
    nothing here). `rule` is its kind's rule (`workloads.kv_rules`), which every count
    below asks."""

    layers: int
    window: int | None = None
    encoder_len: int | None = None
    spec: KVCacheSpec | None = field(default=None, kw_only=True)
    rule: KindRule = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("layers", "window", "encoder_len"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")
        if self.window is not None and self.encoder_len is not None:
            raise ConfigError("a layer group is windowed or cross-attention, not both")
        if self.spec is not None:
            if self.window is not None or self.encoder_len is not None:
                raise ConfigError("a layer group takes a spec or a window / encoder_len, not both")
            object.__setattr__(self, "rule", rule_for(self.spec))
            return
        kind = (
            AttentionKind.SLIDING_WINDOW
            if self.window is not None
            else AttentionKind.CROSS
            if self.encoder_len is not None
            else AttentionKind.FULL
        )
        object.__setattr__(self, "rule", rule_for(KVCacheSpec(kind, self.window, self.encoder_len)))


@dataclass(frozen=True)
class AttentionLayout:
    """A model's layer groups (`LayoutGroup`), in any order."""

    groups: tuple[LayoutGroup, ...]

    def __post_init__(self) -> None:
        if not self.groups:
            raise ConfigError("an attention layout needs at least one layer group")
        if not any(g.rule.self_attention for g in self.groups):
            raise ConfigError("an attention layout needs a self-attention group to decode")

    @property
    def num_layers(self) -> int:
        return sum(g.layers for g in self.groups)

    @property
    def windows(self) -> tuple[int, ...]:
        """The distinct window sizes, ascending (the engine tracks, per window, the
        decoders whose context passed it)."""
        return tuple(sorted({g.rule.reach for g in self.groups if g.rule.reach is not None}))

    @classmethod
    def from_spec(cls, model: ModelKVSpec) -> AttentionLayout:
        """The layout of a layer-group model (ConfigError where groups differ in their
        per-layer KV shape: the time model prices one shape)."""
        shapes = {(g.num_kv_heads, g.head_dim, g.dtype) for g in model.groups}
        if len(shapes) > 1:
            raise ConfigError(
                f"model {model.name!r} mixes per-layer KV shapes {sorted(shapes)}: the time "
                "model prices one shape"
            )
        out = (LayoutGroup(g.num_layers, spec=g.spec) for g in model.groups)
        return cls(tuple(out))

    # -- layer-token counts (a layer reading one token of KV counts 1) -----------------
    def decode_layer_tokens(self, decoders: int, kv_read: int, excess: Sequence[int]) -> int:
        """KV layer-tokens `decoders` decoding queries read, whose full contexts (each
        c + 1) sum to `kv_read`, and `excess[i]` = sum over them of max(0, c + 1 - W_i)
        for each window W_i of `windows`. `excess` empty: as if every decoder read
        kv_read / decoders (exact for one decoder; callers without the decoders'
        contexts, like the latency floor)."""
        windows = self.windows
        if not excess and windows:
            excess = [max(0, kv_read - decoders * w) for w in windows]
        by_reach: dict[int | None, int] = dict(zip(windows, excess, strict=False))
        return sum(
            g.layers * g.rule.decode_reads(decoders, kv_read, by_reach.get(g.rule.reach, 0))
            for g in self.groups
        )

    def decode_slope(self, decoders: int, above: Sequence[int]) -> int:
        """How much `decode_layer_tokens` grows per decode step when every decoder
        gains a token and `above[i]` of them are already past window W_i."""
        by_reach: dict[int | None, int] = dict(zip(self.windows, above, strict=False))
        return sum(
            g.layers * g.rule.decode_slope(decoders, by_reach.get(g.rule.reach, 0))
            for g in self.groups
        )

    def chunk_layer_tokens(self, ctx: int, n: int) -> int:
        """KV layer-tokens a prefill chunk of n queries at positions ctx .. ctx + n - 1
        reads from memory (each layer once: the positions any of its queries reads)."""
        return sum(g.layers * g.rule.chunk_reads(ctx, n) for g in self.groups)

    def chunk_pairs(self, ctx: int, n: int) -> int:
        """(query, key) layer-pairs of a prefill chunk: each query at position p pairs
        with min(p + 1, W) keys on a windowed layer, p + 1 on a full one, E on a cross
        one."""
        return sum(g.layers * g.rule.chunk_pairs(ctx, n) for g in self.groups)
