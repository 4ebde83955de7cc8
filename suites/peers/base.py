"""Peer adapters: the two narrow interfaces through which any implementation (kvbench's own,
vLLM's, yours) is checked and measured by the same conformance properties and benches.

* `AllocatorAdapter`: a block allocator with a prefix cache, driven request by request in
  memory only (no KV tensors): admit a prompt, grow by decoded tokens, free. It reports
  its block table, reference counts, free / used / cached block counts and a comparable
  snapshot (so a test can prove a failed operation changed nothing).
* `AttentionAdapter`: a paged KV store for one layer plus its decode-attention kernel:
  make a cache of `num_blocks` blocks, write K/V at flat slots, run decode attention of
  one query per sequence over block tables and sequence lengths.

Adapters are found by name in `kvbench.suites.peers.registry` (`allocator_names`,
`attention_names`, `load_allocator`, `load_attention`): kvbench's own are built in
("kvbench"), vLLM's ship with kvbench but load lazily ("vllm"), and a third-party package
adds its own through the entry-point group `kvbench.peers`: each entry point names a
zero-argument callable returning a `PeerSpec`. This module defines only the interfaces,
so the adapters import it and it imports none of them.
An adapter whose library is not importable raises `PeerUnavailableError` with the reason;
the suites turn that into a skip.

Units: token counts and block counts are integers; block ids are the adapter's physical
ids (vLLM's include its reserved null block 0, which no request ever gets).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from kvbench.workloads.errors import CaseSkipped, ConfigError


class PeerUnavailableError(ConfigError, CaseSkipped):
    """A peer's library cannot be imported or does not support what was asked; the message
    says why (the suites skip with it; the bench records the case as skipped)."""


@dataclass(frozen=True)
class BlockCounts:
    """Blocks of an allocator by state (its reserved blocks are in none of them).

    free: blocks an allocation can take now (never-used, freed, and evictable cached ones);
    used: blocks with reference count >= 1;
    cached: blocks indexed in the prefix cache (in use or evictable).
    Invariant: free + used == usable blocks.
    """

    free: int
    used: int
    cached: int


@dataclass(frozen=True)
class AllocatorTraits:
    """What an allocator does by design, where implementations legitimately differ.

    reserved_blocks: physical ids never handed to a request (vLLM: its null block 0).
    dedups_full_blocks: whether a block that fills with content already cached under
        another block is merged into / indexed over the existing one (False for both
        kvbench and vLLM: kvbench leaves the duplicate unindexed, vLLM indexes both).
    indexes_duplicates: whether two blocks with equal keys are both in the index.
    eviction: how evictable cached blocks are reused: "lru-tail-first" means least
        recently freed first, and a request's blocks enter the queue tail first.
    fresh_reuse: how freed uncached blocks are reused ("lifo": last freed first).
    caches_at: when a block becomes findable: "fill" (once its last token is appended).
    empty_salt_is_no_salt: whether salt "" keys blocks exactly as no salt (vLLM: an empty
        `cache_salt` is falsy and left out of the hash) or as a tenant of its own (kvbench).

    Under eviction `indexes_duplicates` changes hits, not just the cached count: an
    unindexed duplicate is reused before any cached block, so a peer that indexes it
    evicts an older cached block instead (see suites/conformance/peer_allocator_model.py).
    """

    reserved_blocks: tuple[int, ...] = ()
    dedups_full_blocks: bool = False
    indexes_duplicates: bool = False
    eviction: str = "lru-tail-first"
    fresh_reuse: str = "lifo"
    caches_at: str = "fill"
    empty_salt_is_no_salt: bool = False


@runtime_checkable
class AllocatorAdapter(Protocol):
    """A block allocator with a prefix cache, in memory-only mode (see module docstring).

    Every mutating method either succeeds or raises a `workloads.errors.KVBenchError`
    (CapacityError when blocks run out) and leaves `snapshot()` unchanged.
    """

    name: str
    block_size: int
    #: Blocks requests can get (reserved blocks excluded).
    num_usable_blocks: int
    traits: AllocatorTraits

    def admit(self, request_id: Hashable, prompt: Sequence[int], salt: str | None = None) -> int:
        """Admit a request and make its whole prompt resident (cached prefix reused, the
        rest allocated and filled); returns the prompt tokens served from the prefix
        cache (a multiple of block_size, < len(prompt))."""
        ...

    def append(self, request_id: Hashable, token_ids: Sequence[int]) -> None:
        """Grow a request by decoded tokens (allocating blocks as they are needed)."""
        ...

    def free(self, request_id: Hashable) -> None:
        """Release the request's blocks (cached ones become evictable)."""
        ...

    def block_table(self, request_id: Hashable) -> list[int]:
        """Physical blocks of the request, logical order."""
        ...

    def ref_count(self, block: int) -> int:
        """How many request block tables hold `block`."""
        ...

    def counts(self) -> BlockCounts:
        """Blocks by state (see BlockCounts)."""
        ...

    def is_cached(self, block: int) -> bool:
        """Whether `block` is indexed in the prefix cache (findable by a prefix hit)."""
        ...

    def snapshot(self) -> Any:
        """All allocator state as plain comparable values (for atomicity checks)."""
        ...


@dataclass(frozen=True)
class AttentionTraits:
    """Layout facts of an attention peer.

    layout: the per-layer cache shape as a string, e.g. "[num_blocks, block_size, H, D]".
    needs_finite_tail: the kernel reads the unwritten slots of a sequence's last block,
        so they must hold finite values (NaN there poisons the output).
    """

    layout: str
    needs_finite_tail: bool = False


#: Q/K/V dtypes every built-in attention peer takes.
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def basic_unsupported(dtype: torch.dtype, num_q_heads: int, num_kv_heads: int) -> str | None:
    """The checks every built-in attention peer shares: a float dtype, and query heads a
    multiple of KV heads. None when both hold, else the reason naming the value."""
    if dtype not in FLOAT_DTYPES:
        return f"dtype {dtype} is not float32/float16/bfloat16"
    if num_q_heads % num_kv_heads:
        return f"{num_q_heads} query heads are not a multiple of {num_kv_heads} KV heads"
    return None


@runtime_checkable
class AttentionAdapter(Protocol):
    """One layer's paged KV store and decode attention (see module docstring).

    Shapes: key/value [n, num_kv_heads, head_dim]; slot_mapping int64 [n] (flat slot
    block * block_size + offset); query [batch, num_q_heads, head_dim]; block_tables
    int32 [batch, max_blocks]; seq_lens int32 [batch] >= 1. Output: query's shape and dtype.
    """

    name: str
    traits: AttentionTraits

    def unsupported(
        self,
        dtype: torch.dtype,
        block_size: int,
        head_dim: int,
        num_q_heads: int,
        num_kv_heads: int,
    ) -> str | None:
        """None when the configuration is supported, else the reason it is not."""
        ...

    def make_cache(
        self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> Any:
        """A zeroed cache for one layer (opaque to callers)."""
        ...

    def write(
        self, cache: Any, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        """Store K/V of n tokens at their flat slots."""
        ...

    def fill_(self, cache: Any, value: float) -> None:
        """Set every element of the cache's storage to `value` (tests poison unwritten slots
        with NaN this way)."""
        ...

    def decode_fn(
        self,
        cache: Any,
        query: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
    ) -> Callable[[], torch.Tensor]:
        """A zero-argument callable running one decode step (per-step metadata, which an
        engine builds once per step for all layers, is built here, outside the callable)."""
        ...


@dataclass(frozen=True)
class PeerSpec:
    """What a peer package registers: a name and factories for its adapters.

    allocator(num_blocks, block_size) -> AllocatorAdapter, with `num_blocks` usable blocks;
    attention() -> AttentionAdapter. Either may be None. Factories may raise
    PeerUnavailableError.
    probe() -> None when the peer's library looks installed, else the reason it is not;
    it must be cheap (no heavy import: the bench calls it while planning its cases).
    None means always available.
    version() -> the peer library's version string (recorded with its bench rows).
    timed: False for a peer checked for correctness only (a kernel run by the Triton
    interpreter): the timed benches leave it out.
    """

    name: str
    allocator: Callable[[int, int], AllocatorAdapter] | None = None
    attention: Callable[[], AttentionAdapter] | None = None
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    probe: Callable[[], str | None] | None = None
    version: Callable[[], str] | None = None
    timed: bool = True
