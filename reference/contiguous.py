"""ContiguousKVCache: the reference KV cache, one contiguous slot range per request.

Each layer has one arena of token slots for K and one for V. An admitted request reserves
a contiguous range, chosen first fit, whose size follows a reservation policy: the three
contiguous baselines of the PagedAttention paper.

    max     max_seq_len slots (what most pre-paged engines did);
    pow2    the next power of two of the prompt, doubling (by relocation) when outgrown;
    oracle  prompt + the true output length (`output_len` at admission), an upper bound
            on what any contiguous allocator could do.

It is deliberately simple: it is the oracle the paged cache is compared with. Fork copies.
Every operation validates everything before it changes anything.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch

from kvbench.reference.contract import (
    NO_GROWTH,
    CacheStats,
    Footprint,
    Occupancy,
    RequestId,
    ServingTraits,
)
from kvbench.reference.oracle import decode_attention
from kvbench.reference.validation import (
    allocate_zeros,
    token_id_count,
    validate_attend_query,
    validate_device,
    validate_geometry,
    validate_kv_append,
    validate_prompt,
    validate_token_ids,
)
from kvbench.workloads.errors import (
    CapacityError,
    ConfigError,
    DuplicateRequestError,
    ShapeError,
    UnknownRequestError,
)
from kvbench.workloads.geometry import KVGeometry, require_positive
from kvbench.workloads.kv_quant import ScaleSpec, append_dtype, make_kv_quant
from kvbench.workloads.torch_dtypes import torch_dtype

POLICIES = ("max", "pow2", "oracle")


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    return 1 << (max(n, 1) - 1).bit_length()


@dataclass
class _Request:
    start: int
    reserved: int
    length: int
    prompt: tuple[int, ...]
    output_len: int | None
    salt: str | None
    token_ids: list[int | None] = field(default_factory=list)

    @property
    def known_need(self) -> int:
        """Slots the cache knows this request will fill."""
        need = len(self.prompt) + (self.output_len or 0)
        return min(self.reserved, max(need, self.length))


class ContiguousKVCache:
    """The reference implementation of the KVCache contract (see reference/contract.py).

    Args:
        geometry: KV geometry (layers, KV heads, head dim, dtype, query heads).
        capacity_tokens: token slots in the arena (per layer).
        max_seq_len: the longest a request may grow.
        policy: reservation policy, one of POLICIES.
        device: where the arena lives.
        store_kv: False for a memory-only cache (same bookkeeping, no tensors).
        k_scale, v_scale, scale_granularity: fp8 geometries only (`workloads.kv_quant`):
            static scales, or None for dynamic ones set by the first append; "tensor" or
            "head". The arena then holds fp8 bytes, `gather` returns them, `kv_quant`
            holds the scales and `attend` runs the oracle over their float64 values.

    Invariants: reserved ranges never overlap and lie within [0, capacity_tokens);
    each request's length <= its reservation <= max_seq_len.
    """

    def __init__(
        self,
        geometry: KVGeometry,
        capacity_tokens: int,
        max_seq_len: int,
        policy: str = "max",
        device: str | torch.device = "cpu",
        store_kv: bool = True,
        *,
        k_scale: ScaleSpec | None = None,
        v_scale: ScaleSpec | None = None,
        scale_granularity: str = "tensor",
    ) -> None:
        validate_geometry(geometry)
        self.kv_quant = make_kv_quant(geometry, k_scale, v_scale, scale_granularity)
        require_positive("capacity_tokens", capacity_tokens, 2**48)
        require_positive("max_seq_len", max_seq_len)
        if policy not in POLICIES:
            raise ConfigError(f"unknown reservation policy {policy!r}; known: {POLICIES}")
        self._geometry = geometry
        self.capacity_tokens = capacity_tokens
        self.max_seq_len = max_seq_len
        self.policy = policy
        self._device = validate_device(device)
        self._dtype = torch_dtype(geometry.dtype)
        self.store_kv = store_kv
        shape = (geometry.num_layers, capacity_tokens, geometry.num_kv_heads, geometry.head_dim)
        self._k = (
            allocate_zeros(shape, self._dtype, self._device, "the key arena") if store_kv else None
        )
        self._v = (
            allocate_zeros(shape, self._dtype, self._device, "the value arena")
            if store_kv
            else None
        )
        self._requests: dict[Hashable, _Request] = {}
        # Reserved ranges sorted by start: parallel lists of starts and (start, end, id).
        self._starts: list[int] = []
        self._ranges: list[tuple[int, int, Hashable]] = []
        self._probe_slots = max_seq_len if policy == "max" else 0

    # ----------------------------------------------------------------- properties
    @property
    def geometry(self) -> KVGeometry:
        return self._geometry

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def torch_dtype(self) -> torch.dtype:
        return self._dtype

    # ----------------------------------------------------------------- ranges
    def _gaps(self, ignore: Hashable | None = None) -> list[tuple[int, int]]:
        """Free (start, length) gaps in address order, treating `ignore`'s range as free."""
        gaps, cursor = [], 0
        for start, end, rid in self._ranges:
            if rid == ignore:
                continue
            if start > cursor:
                gaps.append((cursor, start - cursor))
            cursor = end
        if cursor < self.capacity_tokens:
            gaps.append((cursor, self.capacity_tokens - cursor))
        return gaps

    def _first_fit(self, size: int, ignore: Hashable | None = None) -> int | None:
        for start, length in self._gaps(ignore):
            if length >= size:
                return start
        return None

    def _insert_range(self, start: int, size: int, rid: Hashable) -> None:
        i = bisect.bisect_left(self._starts, start)
        self._starts.insert(i, start)
        self._ranges.insert(i, (start, start + size, rid))

    def _remove_range(self, start: int) -> None:
        i = bisect.bisect_left(self._starts, start)
        del self._starts[i]
        del self._ranges[i]

    def _reservation_for(self, prompt_len: int, output_len: int | None) -> int:
        if self.policy == "max":
            return self.max_seq_len
        if self.policy == "pow2":
            return min(next_pow2(prompt_len), self.max_seq_len)
        if output_len is None:
            raise ConfigError("policy 'oracle' needs output_len at admission, got None")
        return min(prompt_len + output_len, self.max_seq_len)

    def _growth_for(self, needed: int) -> int:
        if self.policy == "pow2":
            return min(next_pow2(needed), self.max_seq_len)
        return needed

    # ----------------------------------------------------------------- contract
    def _known(self, request_id: RequestId) -> bool:
        """Whether the cache holds `request_id`; ConfigError for an unhashable id."""
        try:
            return request_id in self._requests
        except TypeError:
            raise ConfigError(f"request id {request_id!r} is not hashable") from None

    def _get(self, request_id: RequestId) -> _Request:
        try:
            return self._requests[request_id]
        except (KeyError, TypeError):
            raise UnknownRequestError(f"unknown request id {request_id!r}") from None

    def admit(
        self,
        request_id: RequestId,
        prompt: Sequence[int],
        *,
        salt: str | None = None,
        output_len: int | None = None,
    ) -> int:
        """Reserve a contiguous range for the request (see KVCache.admit). Returns 0."""
        if self._known(request_id):
            raise DuplicateRequestError(f"request id {request_id!r} is already admitted")
        prompt_ids = tuple(validate_prompt(prompt, self.max_seq_len))
        if output_len is not None and (
            isinstance(output_len, bool) or not isinstance(output_len, int) or output_len < 0
        ):
            raise ConfigError(f"output_len must be an integer >= 0, got {output_len!r}")
        if salt is not None and not isinstance(salt, str):
            raise ConfigError(f"salt must be a string or None, got {salt!r}")
        size = self._reservation_for(len(prompt_ids), output_len)
        start = self._first_fit(size)
        if start is None:
            free = self.capacity_tokens - sum(e - s for s, e, _ in self._ranges)
            raise CapacityError(
                f"cannot admit request {request_id!r}: needs {size} contiguous slots, "
                f"{free} free in total but no gap is large enough"
            )
        # ---- mutation starts: nothing below can fail
        self._probe_slots = size
        self._insert_range(start, size, request_id)
        self._requests[request_id] = _Request(start, size, 0, prompt_ids, output_len, salt)
        return 0

    def append(
        self,
        request_id: RequestId,
        keys: torch.Tensor,
        values: torch.Tensor,
        token_ids: Sequence[int] | None = None,
    ) -> None:
        """Write n tokens after the request's last one, relocating it if it has outgrown
        its reservation (pow2/oracle)."""
        req = self._get(request_id)
        dtype = append_dtype(self.kv_quant, self._dtype, keys)
        n = validate_kv_append(self._geometry, dtype, keys, values)
        pending = None if self.kv_quant is None else self.kv_quant.prepare(keys, values)
        lo = self._make_room(request_id, req, n, token_ids)
        if self.store_kv:
            assert self._k is not None and self._v is not None
            if self.kv_quant is not None and pending is not None:
                keys, values = self.kv_quant.quantize(keys, values, pending)
            self._k[:, lo : lo + n] = keys.to(self._device)
            self._v[:, lo : lo + n] = values.to(self._device)
        if self.kv_quant is not None and pending is not None:
            self.kv_quant.commit(pending)
        self._record_ids(req, n, token_ids)

    def append_tokens(
        self, request_id: RequestId, n: int, token_ids: Sequence[int | None] | None = None
    ) -> None:
        """Memory-only append of n tokens: the bookkeeping of `append`, no KV written."""
        if self.store_kv:
            raise ConfigError("append_tokens is for memory-only caches; use append with KV")
        req = self._get(request_id)
        require_positive("n", n)
        self._make_room(request_id, req, n, token_ids)
        self._record_ids(req, n, token_ids)

    def _make_room(
        self,
        request_id: RequestId,
        req: _Request,
        n: int,
        token_ids: Sequence[int | None] | None,
    ) -> int:
        """Check an append of n tokens and relocate the request if it outgrew its
        reservation; returns the first slot to write. Raises (nothing changed) if not."""
        if token_ids is not None:
            given = token_id_count(token_ids)
            if given != n:
                raise ShapeError(f"token_ids has {given} ids for {n} tokens")
            validate_token_ids(token_ids)
        new_len = req.length + n
        if new_len > self.max_seq_len:
            raise CapacityError(
                f"request {request_id!r} would grow to {new_len} tokens, past "
                f"max_seq_len={self.max_seq_len}"
            )
        if new_len > req.reserved:
            self._relocate(request_id, req, self._growth_for(new_len))
        return req.start + req.length

    @staticmethod
    def _record_ids(req: _Request, n: int, token_ids: Sequence[int | None] | None) -> None:
        """Record the ids of n appended tokens (prompt ids fill in omitted ones)."""
        ids: list[int | None] = list(token_ids) if token_ids is not None else [None] * n
        for i in range(n):
            pos = req.length + i
            if ids[i] is None and pos < len(req.prompt):
                ids[i] = req.prompt[pos]
        req.token_ids.extend(ids)
        req.length += n

    def _relocate(self, request_id: RequestId, req: _Request, size: int) -> None:
        """Move the request to a range of `size` slots (in place if the gap after it
        suffices); raises CapacityError with nothing changed when none fits."""
        start = self._first_fit(size, ignore=request_id)
        if start is None:
            raise CapacityError(
                f"request {request_id!r} needs {size} contiguous slots to grow; no gap fits"
            )
        if self.store_kv and start != req.start:
            assert self._k is not None and self._v is not None
            src = slice(req.start, req.start + req.length)
            k_data, v_data = self._k[:, src].clone(), self._v[:, src].clone()
            self._k[:, start : start + req.length] = k_data
            self._v[:, start : start + req.length] = v_data
        self._remove_range(req.start)
        self._insert_range(start, size, request_id)
        req.start, req.reserved = start, size

    def fork(self, parent_id: RequestId, child_id: RequestId) -> None:
        """Copy the parent into a fresh reservation of the same size."""
        parent = self._get(parent_id)
        if self._known(child_id):
            raise DuplicateRequestError(f"request id {child_id!r} is already admitted")
        start = self._first_fit(parent.reserved)
        if start is None:
            raise CapacityError(
                f"cannot fork {parent_id!r} into {child_id!r}: no gap of {parent.reserved} slots"
            )
        if self.store_kv:
            assert self._k is not None and self._v is not None
            src = slice(parent.start, parent.start + parent.length)
            self._k[:, start : start + parent.length] = self._k[:, src]
            self._v[:, start : start + parent.length] = self._v[:, src]
        self._insert_range(start, parent.reserved, child_id)
        self._requests[child_id] = _Request(
            start,
            parent.reserved,
            parent.length,
            parent.prompt,
            parent.output_len,
            parent.salt,
            list(parent.token_ids),
        )

    def free(self, request_id: RequestId) -> None:
        req = self._get(request_id)
        self._remove_range(req.start)
        del self._requests[request_id]

    def seq_len(self, request_id: RequestId) -> int:
        return self._get(request_id).length

    def request_ids(self) -> list[RequestId]:
        return list(self._requests)

    def token_ids(self, request_id: RequestId) -> list[int | None]:
        """Token ids of the request's cached tokens (None where never given)."""
        return list(self._get(request_id).token_ids)

    def reservation(self, request_id: RequestId) -> tuple[int, int]:
        """(first slot, reserved slots) of the request's range in the arena."""
        req = self._get(request_id)
        return req.start, req.reserved

    def arena(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s K and V arenas [capacity_tokens, num_kv_heads, head_dim] (views;
        an engine running a model writes its new tokens' KV here, at the request's range)."""
        if not self.store_kv:
            raise ConfigError("arena needs KV tensors; this cache is memory-only")
        assert self._k is not None and self._v is not None
        return self._k[layer], self._v[layer]

    def gather(self, request_id: RequestId) -> tuple[torch.Tensor, torch.Tensor]:
        req = self._get(request_id)
        if not self.store_kv:
            raise ConfigError("gather needs KV tensors; this cache is memory-only")
        assert self._k is not None and self._v is not None
        span = slice(req.start, req.start + req.length)
        return self._k[:, span].clone(), self._v[:, span].clone()

    def attend(
        self,
        request_ids: Sequence[RequestId],
        query: torch.Tensor,
        layer: int = 0,
        scale: float | None = None,
    ) -> torch.Tensor:
        """Decode attention through the float64 oracle, returned in the query's dtype."""
        g = self._geometry
        reqs = [self._get(r) for r in request_ids]
        if not self.store_kv:
            raise ConfigError("attend needs KV tensors; this cache is memory-only")
        validate_attend_query(query, len(reqs), g, layer)
        if scale is not None and (
            isinstance(scale, bool)
            or not isinstance(scale, (int, float))
            or not math.isfinite(scale)
            or scale <= 0
        ):
            raise ConfigError(f"scale must be a finite number > 0 or None, got {scale!r}")
        for rid, req in zip(request_ids, reqs, strict=True):
            if req.length == 0:
                raise ShapeError(f"request {rid!r} has no cached tokens to attend over")
        assert self._k is not None and self._v is not None
        if not reqs:
            return query.clone()
        outs = []
        for i, req in enumerate(reqs):
            span = slice(req.start, req.start + req.length)
            k, v = self._k[layer, span], self._v[layer, span]
            if self.kv_quant is not None:  # fp8: the oracle reads the exact float64 values
                k, v = self.kv_quant.dequantize(layer, k, v)
            outs.append(decode_attention(query[i], k, v, scale))
        return torch.stack(outs).to(query.dtype)

    def stats(self) -> CacheStats:
        live = sum(r.length for r in self._requests.values())
        reserved = sum(r.reserved for r in self._requests.values())
        reservation = sum(r.known_need - r.length for r in self._requests.values())
        gaps = self._gaps()
        free = sum(length for _, length in gaps)
        probe = self._probe_slots
        external = sum(length for _, length in gaps if length < probe) if probe else 0
        return CacheStats(
            capacity_slots=self.capacity_tokens,
            live_slots=live,
            reservation_slots=reservation,
            internal_fragmentation_slots=reserved - live - reservation,
            free_slots=free,
            external_fragmentation_slots=external,
            logical_tokens=live,
            num_requests=len(self._requests),
            bytes_per_slot=self._geometry.bytes_per_token,
        )

    # ----------------------------------------------------------------- serving accounting
    def serving_traits(self) -> ServingTraits:
        """Fixed facts a serving engine reads once (contract: ServingCache); no blocks."""
        return ServingTraits(
            block_size=0,
            store_kv=self.store_kv,
            prefix_caching=False,
            can_swap=False,
            max_seq_len=self.max_seq_len,
        )

    def footprint(self, tokens: int) -> Footprint:
        """The reservation a request of `tokens` tokens comes to hold under the policy
        (max: max_seq_len; pow2: the next power of two; oracle: exactly), against the
        arena."""
        size = self.max_seq_len if self.policy == "max" else tokens
        if self.policy == "pow2":
            size = min(next_pow2(tokens), self.max_seq_len)
        return Footprint(size, self.capacity_tokens, "slots")

    def next_growth(self, request_id: RequestId, length: int) -> int:
        """The end of the request's reservation (an append there relocates: pow2 to the
        next power of two, oracle to exactly what it needs), or NO_GROWTH once the
        reservation is max_seq_len (policy max: past it an append is refused, not
        grown). Read from the reservation, not the policy, so an oracle hint that fell
        short of the tokens that came is followed, never trusted blindly."""
        reserved = self._get(request_id).reserved
        if reserved >= self.max_seq_len:
            return NO_GROWTH
        return max(length, reserved)

    def occupancy(self) -> Occupancy:
        """(0, 0, 0, live slots, reserved slots): no blocks."""
        reqs = self._requests.values()
        return Occupancy(0, 0, 0, sum(r.length for r in reqs), sum(r.reserved for r in reqs))

    @property
    def num_free_blocks(self) -> int:
        """0: no blocks (growth is checked by `append`)."""
        return 0

    def blocks_needed_to_grow(self, request_id: RequestId, n: int) -> int:
        """0: no blocks (growth is checked by `append`)."""
        self._get(request_id)
        return 0

    def blocks_needed_to_admit(self, prompt: Sequence[int], *, salt: str | None = None) -> int:
        """0: no blocks (admission is checked by `admit`)."""
        return 0

    def blocks_held(self, request_ids: Sequence[RequestId]) -> int:
        """0: no blocks."""
        return 0

    def swap_out_group(self, request_ids: Sequence[RequestId]) -> None:
        """Refused: the reference has no swap space (serving_traits().can_swap is False)."""
        raise ConfigError("the contiguous reference cache has no swap space")

    def swap_in_group(self, request_ids: Sequence[RequestId]) -> None:
        """Refused: nothing is ever swapped out."""
        raise ConfigError("the contiguous reference cache has no swap space")
