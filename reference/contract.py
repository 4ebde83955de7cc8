"""The KV cache contract: one protocol that the reference and the paged cache implement.

Because both caches speak it, one hypothesis state machine drives both with the same
operations and compares them after every step, and other people's caches plug into the
same suites. Names here are stable API.

Conventions:
    * A request id is any hashable (ints and strings in practice).
    * KV tensors for new tokens are [num_layers, n, num_kv_heads, head_dim] in the cache's
      dtype and on its device: all layers are appended at once.
    * A request's length (`seq_len`) counts the tokens whose KV has been appended.
      Admission registers the prompt; its KV is then appended (all of it, or, after a
      prefix-cache hit of `c` tokens, the prompt from position `c` on).
    * Every operation either succeeds or raises a `workloads.errors.KVBenchError`
      subclass and leaves the cache exactly as it was.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass
from typing import NamedTuple, Protocol, runtime_checkable

import torch

from kvbench.workloads.geometry import KVGeometry
from kvbench.workloads.kv_spec import ModelKVSpec

RequestId = Hashable


@dataclass(frozen=True)
class CacheStats:
    """A snapshot of a cache's memory, in token slots (bytes follow from the geometry).

    Slot accounting (every slot of the store is in exactly one of these):
        live_slots: physical slots holding written KV (a slot shared by several requests
            counts once).
        reservation_slots: slots set aside for tokens the cache knows are coming (a
            prompt admitted but not yet appended; with an output-length hint, the rest
            of the hinted output).
        internal_fragmentation_slots: held by a request but, as far as the cache knows,
            never to be filled (the unused tail of a paged block, or the part of a
            contiguous max-length reservation beyond the known need).
        free_slots: not held by any request (a paged cache counts cached-evictable
            blocks here too, since they can be reclaimed).
    external_fragmentation_slots is the part of free_slots that cannot serve a new
    request of the cache's reference size because it lies in gaps that are too small
    (always 0 for a paged cache).

    Block fields are 0 for caches without blocks.
    """

    capacity_slots: int
    live_slots: int
    reservation_slots: int
    internal_fragmentation_slots: int
    free_slots: int
    external_fragmentation_slots: int
    logical_tokens: int
    num_requests: int
    bytes_per_slot: int
    block_size: int = 0
    total_blocks: int = 0
    free_blocks: int = 0
    used_blocks: int = 0
    cached_blocks: int = 0
    shared_blocks: int = 0
    cow_copies: int = 0
    swapped_blocks: int = 0

    @property
    def reserved_slots(self) -> int:
        """Slots held by requests: live + reservation + internal fragmentation."""
        return self.live_slots + self.reservation_slots + self.internal_fragmentation_slots

    @property
    def allocated_slots(self) -> int:
        """Alias of reserved_slots: what the requests hold, whatever it holds."""
        return self.reserved_slots

    @property
    def utilization(self) -> float:
        """live / reserved slots (1.0 when nothing is reserved)."""
        reserved = self.reserved_slots
        return self.live_slots / reserved if reserved else 1.0

    @property
    def live_bytes(self) -> int:
        return self.live_slots * self.bytes_per_slot

    @property
    def reserved_bytes(self) -> int:
        return self.reserved_slots * self.bytes_per_slot

    @property
    def capacity_bytes(self) -> int:
        return self.capacity_slots * self.bytes_per_slot

    def as_dict(self) -> dict[str, float | int]:
        """All fields and derived figures, for result rows and tables."""
        out: dict[str, float | int] = asdict(self)
        out.update(
            reserved_slots=self.reserved_slots,
            utilization=self.utilization,
            live_bytes=self.live_bytes,
            reserved_bytes=self.reserved_bytes,
        )
        return out


@runtime_checkable
class KVCache(Protocol):
    """What every KV cache under test implements (see the module docstring)."""

    @property
    def geometry(self) -> KVGeometry:
        """The KV geometry: layers, KV heads, head dim, dtype, query heads."""
        ...

    @property
    def device(self) -> torch.device:
        """Where the KV tensors live."""
        ...

    @property
    def torch_dtype(self) -> torch.dtype:
        """The torch dtype of stored K and V."""
        ...

    def admit(
        self,
        request_id: RequestId,
        prompt: Sequence[int],
        *,
        salt: str | None = None,
        output_len: int | None = None,
    ) -> int:
        """Admit a request with its prompt token ids and reserve room for the prompt.

        `salt` isolates prefix sharing (different salts never share). `output_len` is a
        hint of how many tokens will follow the admitted ones: the tokens to be
        generated, plus the rest of the prompt when only a first chunk is admitted (used
        by reservation policies that know the future; others ignore it).

        Returns how many prompt tokens are already cached (their KV is in place and
        `seq_len` starts there); always 0 for a cache without prefix caching. At least the
        last prompt token is never reported cached.

        Raises CapacityError when the request does not fit (nothing changes),
        DuplicateRequestError for a known id, ConfigError / RequestStateError for an
        empty or over-long prompt.
        """
        ...

    def append(
        self,
        request_id: RequestId,
        keys: torch.Tensor,
        values: torch.Tensor,
        token_ids: Sequence[int] | None = None,
    ) -> None:
        """Append the K and V of n new tokens, all layers at once.

        keys, values: [num_layers, n, num_kv_heads, head_dim]. `token_ids` name the n
        tokens; they may be omitted while the tokens are the admitted prompt's, and are
        needed past it by caches that hash generated blocks (omitted ids beyond the prompt
        make those blocks unshareable).

        Raises UnknownRequestError, ShapeError, CapacityError (nothing changes).
        """
        ...

    def fork(self, parent_id: RequestId, child_id: RequestId) -> None:
        """Make `child_id` a request holding exactly the parent's tokens and KV so far.

        The reference copies; a paged cache shares blocks and copies on write.
        """
        ...

    def free(self, request_id: RequestId) -> None:
        """Release the request and everything only it holds."""
        ...

    def seq_len(self, request_id: RequestId) -> int:
        """Tokens of the request whose KV is in the cache."""
        ...

    def request_ids(self) -> list[RequestId]:
        """Ids of the requests the cache holds, in admission order."""
        ...

    def gather(self, request_id: RequestId) -> tuple[torch.Tensor, torch.Tensor]:
        """The request's whole K and V, each [num_layers, seq_len, num_kv_heads, head_dim],
        contiguous, in the cache's dtype (a copy, safe to keep)."""
        ...

    def attend(
        self,
        request_ids: Sequence[RequestId],
        query: torch.Tensor,
        layer: int = 0,
        scale: float | None = None,
    ) -> torch.Tensor:
        """Decode attention of one query per request over its cached KV in `layer`.

        query: [len(request_ids), num_q_heads, head_dim]. Returns the same shape in the
        query's dtype. `scale` defaults to 1/sqrt(head_dim).
        """
        ...

    def stats(self) -> CacheStats:
        """A snapshot of memory use (see CacheStats)."""
        ...


# ---------------------------------------------------------------------- KV cache specs
#: One group's K and V, each [layers_in_group, n, num_kv_heads, head_dim].
KVPair = tuple[torch.Tensor, torch.Tensor]


@runtime_checkable
class LayerGroupsKVCache(Protocol):
    """The spec-aware contract: a cache of a model's layer groups (`model.groups`: full
    attention, sliding window, cross-attention, any mix), every operation covering all of
    a request's groups at once, all or nothing.

    `reference.layer_groups.LayerGroupsReferenceCache` (keeps everything, slices each
    group's view) and `paged.layer_groups.LayerGroupsPagedCache` (one pool, one block
    table per group, windows released by the rule of `workloads.spec_capacity`)
    implement it, so one state machine drives both. It is additive: `KVCache` above (one
    full-attention group, prompts, stats) is unchanged.

    Conventions:
        * K/V arguments are lists of `KVPair`, one per self-attention group in
          `model.self_groups` order (append) or per cross-attention group in
          `model.cross_groups` order (admit).
        * Cross-attention KV is given once, at admission (the encoder output), stored
          read-only, shared by forks and freed with the request.
        * A swapped-out request keeps its id and length but refuses append, fork,
          gather and attend (RequestStateError) until it is swapped back in; free works.
          Preemption by recomputation is `free` followed by a fresh `admit`.
        * Every failed operation raises a `KVBenchError` and changes nothing.
    """

    model: ModelKVSpec

    def admit(
        self,
        request_id: RequestId,
        encoder_kv: Sequence[KVPair] = (),
        *,
        prompt: Sequence[int] | None = None,
        salt: str | None = None,
    ) -> int:
        """Register a request in every group; cross groups get their encoder K/V now.
        `prompt` (token ids) lets a prefix-caching cache report how many of its tokens
        are already cached: the return value, at which every self group's length starts
        (0 without prefix caching; never the whole prompt). CapacityError: nothing
        changed."""
        ...

    def append(
        self,
        request_id: RequestId,
        kv: Sequence[KVPair],
        token_ids: Sequence[int] | None = None,
    ) -> None:
        """Append n tokens to every self-attention group at once; `token_ids` name them
        (needed past the prompt for their blocks to be prefix-cached)."""
        ...

    def fork(self, parent_id: RequestId, child_id: RequestId) -> None:
        """The child holds exactly the parent's tokens in every group."""
        ...

    def free(self, request_id: RequestId) -> None:
        """Release the request from every group (swapped or not)."""
        ...

    def swap_out(self, request_ids: Sequence[RequestId]) -> None:
        """Preempt the requests together by swapping every group's KV out of the
        device (blocks they share copied once); CapacityError when swap space is short."""
        ...

    def swap_in(self, request_ids: Sequence[RequestId]) -> None:
        """Bring swapped requests back, every group, bit for bit; CapacityError when
        the device cannot hold them."""
        ...

    def is_swapped(self, request_id: RequestId) -> bool: ...

    def seq_len(self, request_id: RequestId) -> int:
        """Decoder tokens cached (the same in every self-attention group)."""
        ...

    def request_ids(self) -> list[RequestId]:
        """Live requests (swapped ones included), in admission order."""
        ...

    def gather(self, request_id: RequestId, group: int) -> KVPair:
        """What the newest token reads in `group`: its window, every token, or the
        encoder output."""
        ...

    def attend(
        self, request_ids: Sequence[RequestId], query: torch.Tensor, group: int, layer: int
    ) -> torch.Tensor:
        """Decode attention of query[b] over request b's view in one group and layer."""
        ...


# ---------------------------------------------------------------------- serving accounting
#: `ServingCache.next_growth` of a request that never needs more memory as it grows.
NO_GROWTH = 1 << 62


@dataclass(frozen=True)
class ServingTraits:
    """What a serving engine needs to know of a cache once, before it schedules.

    Attributes:
        block_size: tokens per block; 0 for a cache without blocks (it cannot share
            memory between requests, so beam search needs a cache with blocks).
        store_kv: whether the cache holds KV tensors (False: memory-only; grow requests
            with `append_tokens`).
        prefix_caching: whether full blocks are indexed by their token ids, so passing
            generated ids to `append` makes them shareable.
        can_swap: whether `swap_out_group` / `swap_in_group` may be called (a CPU pool).
        max_seq_len: the longest any request may grow (tokens).
        watermark_blocks: free blocks an admission must leave (0 without blocks).
        releases_blocks: whether appends also free blocks (sliding-window groups drop
            blocks that left the window): the engine then visits every length
            `next_growth` names (allocations and releases), not only block boundaries,
            so admission sees freed pages at the step a token-by-token run would.
        slots_per_token: live slots one appended token fills (a model of several
            self-attention layer groups writes one slot in each group's page).
    """

    block_size: int
    store_kv: bool
    prefix_caching: bool
    can_swap: bool
    max_seq_len: int
    watermark_blocks: int = 0
    releases_blocks: bool = False
    slots_per_token: int = 1


@dataclass(frozen=True)
class Footprint:
    """How much memory one request of a given length can come to hold (`need`) and the
    most the cache can ever give one request (`room`), both in `unit` ("blocks" or
    "slots"). A request with need > room can never be served."""

    need: int
    room: int
    unit: str


class Occupancy(NamedTuple):
    """The engine's per-step memory reading (block fields 0 for caches without blocks).

    free_blocks counts cached-evictable blocks too; cached_blocks are those evictable ones
    (cached blocks no request holds; CacheStats.cached_blocks also counts held ones);
    live_slots are slots holding written KV (shared ones once); reserved_slots are slots
    held by requests, whatever they hold.
    """

    free_blocks: int
    used_blocks: int
    cached_blocks: int
    live_slots: int
    reserved_slots: int


@runtime_checkable
class ServingCache(KVCache, Protocol):
    """A KVCache a serving engine (`kvbench.paged.serving.engine`) can schedule over: the
    accounting it reads and the batch operations it calls, beyond the KV contract.

    Block figures are 0 for caches without blocks (as in CacheStats); such a cache never
    needs blocks to grow or admit and reports none free (its `append` and `admit` raise
    CapacityError when there is no room).
    """

    def serving_traits(self) -> ServingTraits:
        """Fixed facts about the cache (see ServingTraits)."""
        ...

    def footprint(self, tokens: int) -> Footprint:
        """Memory one request that comes to hold `tokens` tokens can need at most, alone
        (no sharing), against the most the cache can ever give one request."""
        ...

    def next_growth(self, request_id: RequestId, length: int) -> int:
        """The smallest length >= `length` at which appending one more token to the
        request (as it holds memory now, sharing none of it) needs memory it does not
        hold: a block boundary, a contiguous relocation (and, for a cache whose traits
        say `releases_blocks`, frees a block). NO_GROWTH if never."""
        ...

    def occupancy(self) -> Occupancy:
        """Block and slot counts now (see Occupancy); cheap: called every step."""
        ...

    @property
    def num_free_blocks(self) -> int:
        """Blocks free for growth (running requests may use the watermark)."""
        ...

    def blocks_needed_to_grow(self, request_id: RequestId, n: int) -> int:
        """Blocks appending n tokens to the running request takes (new + copy-on-write)."""
        ...

    def blocks_needed_to_admit(self, prompt: Sequence[int], *, salt: str | None = None) -> int:
        """Blocks admitting `prompt` now would take from the free count (after prefix hits)."""
        ...

    def blocks_held(self, request_ids: Sequence[RequestId]) -> int:
        """Distinct blocks the requests hold, a shared block counted once (what a group
        swap copies)."""
        ...

    def append_tokens(
        self, request_id: RequestId, n: int, token_ids: Sequence[int | None] | None = None
    ) -> None:
        """Memory-only append of n tokens (bookkeeping as `append`, no KV); only for a
        cache with store_kv False."""
        ...

    def swap_out_group(self, request_ids: Sequence[RequestId]) -> None:
        """Move the requests to CPU swap space together (shared blocks copied once);
        CapacityError, nothing changed, when the swap space cannot hold them."""
        ...

    def swap_in_group(self, request_ids: Sequence[RequestId]) -> None:
        """Bring swapped requests back together, keeping their sharing and the watermark;
        CapacityError, nothing changed, when they do not fit."""
        ...
