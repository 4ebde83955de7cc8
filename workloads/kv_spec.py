"""KV cache specs: which tokens a layer's attention keeps, and layers grouped over one pool.

[vLLM-internals] names vLLM's KVCacheSpec variants; kvbench models four of them:

* full attention (Llama): a layer keeps every token of the sequence;
* sliding window (Mistral, Gemma 2's local layers): the token at position p attends to
  positions p - window + 1 .. p, so older tokens are never read again;
* chunked local attention (Llama 4's `attention_chunk_size`, vLLM's
  ChunkedLocalAttentionSpec): the sequence is cut into chunks of `chunk` tokens and the
  token at position p attends to positions floor(p / chunk) x chunk .. p only, so whole
  earlier chunks are never read again;
* cross-attention (encoder-decoder decoders): a layer keeps the encoder's output, a
  fixed `encoder_len` tokens written once at admission, whatever the decoder length.

A model is one or more `LayerGroup`s, each a number of layers sharing one spec and one
per-layer KV shape. The groups are served from one pool whose page (one block of one
group: block_size tokens x the group's layers) is the same size for every group, as in
vLLM's hybrid KV cache manager; `ModelKVSpec` refuses groups whose pages differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from math import gcd

from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import KVGeometry, require_positive


def check_window(window: int | None) -> int | None:
    """`window` if it is None (full attention) or an int >= 1 (tokens a query attends to,
    its own included), else ConfigError naming the value. Kernels and the oracle use it."""
    if window is not None:
        require_positive("window", window)
    return window


def check_chunk(chunk: int | None) -> int | None:
    """`chunk` if it is None (no chunking) or an int >= 1 (tokens of one attention chunk),
    else ConfigError naming the value. The oracle uses it."""
    if chunk is not None:
        require_positive("chunk", chunk)
    return chunk


class AttentionKind(str, Enum):
    """What one layer's KV holds (the value is the name HF's `layer_types` uses where
    it has one)."""

    FULL = "full_attention"
    SLIDING_WINDOW = "sliding_attention"
    CHUNKED_LOCAL = "chunked_attention"
    CROSS = "cross_attention"


@dataclass(frozen=True)
class KVCacheSpec:
    """One layer's KV retention rule.

    Attributes:
        kind: full, sliding window, chunked local or cross-attention.
        window: tokens a query attends to (itself included), sliding window only.
        encoder_len: encoder tokens a cross-attention layer holds, cross-attention only.
        chunk: tokens of one attention chunk, chunked local attention only.
    """

    kind: AttentionKind
    window: int | None = None
    encoder_len: int | None = None
    chunk: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", AttentionKind(self.kind))
        wants = {
            "window": AttentionKind.SLIDING_WINDOW,
            "encoder_len": AttentionKind.CROSS,
            "chunk": AttentionKind.CHUNKED_LOCAL,
        }
        for name, kind in wants.items():
            value = getattr(self, name)
            if self.kind is kind:
                require_positive(name, value)
            elif value is not None:
                raise ConfigError(f"{name}={value!r} given for a {self.kind.value} layer")

    def check_block_size(self, block_size: int) -> None:
        """ConfigError where this spec cannot be paged in blocks of `block_size` tokens:
        a chunk that is not a whole number of blocks (vLLM asserts `attention_chunk_size
        % block_size == 0` when it builds chunked-local attention's batches)."""
        if self.chunk is not None and self.chunk % block_size:
            raise ConfigError(
                f"chunk={self.chunk} is not a multiple of block_size={block_size} "
                "(chunked local attention pages whole chunks, as vLLM requires)"
            )

    @classmethod
    def full(cls) -> KVCacheSpec:
        """Full attention: every token is kept."""
        return cls(AttentionKind.FULL)

    @classmethod
    def sliding_window(cls, window: int) -> KVCacheSpec:
        """A sliding window of `window` tokens (the query's own token included)."""
        return cls(AttentionKind.SLIDING_WINDOW, window=window)

    @classmethod
    def chunked_local(cls, chunk: int) -> KVCacheSpec:
        """Chunked local attention over chunks of `chunk` tokens (Llama 4)."""
        return cls(AttentionKind.CHUNKED_LOCAL, chunk=chunk)

    @classmethod
    def cross_attention(cls, encoder_len: int) -> KVCacheSpec:
        """Cross-attention over a fixed encoder output of `encoder_len` tokens."""
        return cls(AttentionKind.CROSS, encoder_len=encoder_len)

    def describe(self) -> str:
        """A short human label, e.g. 'sliding window 4096'."""
        if self.kind is AttentionKind.SLIDING_WINDOW:
            return f"sliding window {self.window}"
        if self.kind is AttentionKind.CROSS:
            return f"cross-attention, encoder {self.encoder_len}"
        if self.kind is AttentionKind.CHUNKED_LOCAL:
            return f"chunked local {self.chunk}"
        return "full attention"


#: What the kernels' `window` argument may be: None (full attention), an int (a sliding
#: window of that many tokens) or the `KVCacheSpec` of any other kind that bounds what a
#: query reads (chunked local); `workloads.kv_rules.rule_for_window` turns it into a rule.
KernelWindow = int | KVCacheSpec | None


@dataclass(frozen=True)
class LayerGroup:
    """Layers that share one spec and one per-layer KV shape (one block table per group).

    Attributes:
        spec: the retention rule of every layer of the group.
        num_layers: layers in the group.
        num_kv_heads, head_dim: per-layer KV shape.
        dtype: KV dtype name (see geometry.DTYPE_BYTES).
        layer_ids: the model's layer indices in this group (documentation; may be empty).
    """

    spec: KVCacheSpec
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "float16"
    layer_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        geometry = self.geometry  # validates the shape and dtype
        object.__setattr__(self, "dtype", geometry.dtype)
        object.__setattr__(self, "layer_ids", tuple(self.layer_ids))
        if self.layer_ids and len(self.layer_ids) != self.num_layers:
            raise ConfigError(
                f"layer_ids lists {len(self.layer_ids)} layers for a group of "
                f"num_layers={self.num_layers}"
            )

    @property
    def geometry(self) -> KVGeometry:
        """The group's layers as a KVGeometry (for bytes per token)."""
        return KVGeometry(self.num_layers, self.num_kv_heads, self.head_dim, self.dtype)

    def page_bytes(self, block_size: int) -> int:
        """Bytes of one block of this group: block_size tokens x all its layers, K and V."""
        return self.geometry.bytes_per_block(block_size)


@dataclass(frozen=True)
class ModelKVSpec:
    """A model's KV: its layer groups, served from one pool of equal pages.

    Attributes:
        name: label (a preset key or the source of an HF config).
        groups: the layer groups; their page sizes must be equal (checked per block size
            by `page_bytes`, and at construction for any block size, since page bytes
            are block_size x a per-group constant).
        source: where the numbers come from.
    """

    name: str
    groups: tuple[LayerGroup, ...]
    source: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", tuple(self.groups))
        if not self.groups:
            raise ConfigError(f"model {self.name!r} has no layer groups")
        per_token = {g.page_bytes(1) for g in self.groups}
        if len(per_token) > 1:
            sizes = ", ".join(
                f"{g.spec.describe()} x{g.num_layers}: {g.page_bytes(1)} B/token"
                for g in self.groups
            )
            raise ConfigError(
                f"model {self.name!r}: layer groups need one page size to share a pool, got {sizes}"
            )

    @property
    def num_layers(self) -> int:
        """KV-holding layers over all groups (a decoder layer with self- and
        cross-attention counts once per group it appears in)."""
        return sum(g.num_layers for g in self.groups)

    @property
    def is_hybrid(self) -> bool:
        """True when the groups do not all share one spec."""
        return len({g.spec for g in self.groups}) > 1

    def page_bytes(self, block_size: int) -> int:
        """Bytes of one pool page (one block of any group)."""
        return self.groups[0].page_bytes(block_size)

    @property
    def self_groups(self) -> list[int]:
        """Indices of the groups a decoder step writes (full attention, sliding window)."""
        return [i for i, g in enumerate(self.groups) if g.spec.kind is not AttentionKind.CROSS]

    @property
    def cross_groups(self) -> list[int]:
        """Indices of the cross-attention groups (written once, from the encoder)."""
        return [i for i, g in enumerate(self.groups) if g.spec.kind is AttentionKind.CROSS]


def group_layers(
    name: str,
    layer_specs: Sequence[KVCacheSpec],
    num_kv_heads: int,
    head_dim: int,
    dtype: str = "float16",
    source: str = "",
) -> ModelKVSpec:
    """Split a model's layers (one spec per layer, in order) into equal-size groups.

    Every group must hold the same number of layers so that pages are equal (all layers
    share one KV shape here). The group size is the greatest common divisor of the
    per-spec layer counts, so 21 local + 21 global layers make two groups of 21, and
    10 local + 5 global make three groups of 5 (two local, one global). Layers are
    assigned to a spec's groups in layer order.
    """
    if not layer_specs:
        raise ConfigError(f"model {name!r} lists no layers")
    by_spec: dict[KVCacheSpec, list[int]] = {}
    for i, spec in enumerate(layer_specs):
        by_spec.setdefault(spec, []).append(i)
    size = 0
    for ids in by_spec.values():
        size = gcd(size, len(ids))
    groups = [
        LayerGroup(spec, size, num_kv_heads, head_dim, dtype, tuple(ids[k : k + size]))
        for spec, ids in by_spec.items()
        for k in range(0, len(ids), size)
    ]
    return ModelKVSpec(name, tuple(groups), source)
