"""The requests a `PagedKVCache` holds: their states by id, in admission order.

A part of the cache (`paged.cache`): it owns the id -> `RequestState` map and the admission
counter, answers every lookup (an unknown id, a swapped request where a resident one is
needed, a repeated id in a group: each a clear error, nothing changed), and checks that
the request tables account for every reference the device pool counts.

Invariants (asserted by `check`): every request holds ceil(max(seq_len, prompt_len) /
block_size) blocks and at most max_seq_len tokens; tracked token ids (the prompt head,
the stored ones, the unknown tail) are in step with seq_len; keyed blocks are leading full
blocks; the resident tables hold exactly the device pool's reference counts, each block
filled as far as its request's tokens reach, reserved (unwritten) blocks unshared, cached
blocks keyed by the request's own prefix.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence

from kvbench.paged.block_pool import BlockPool
from kvbench.paged.block_table import RequestState
from kvbench.paged.prefix_cache import PrefixCache
from kvbench.reference.contract import RequestId
from kvbench.workloads.errors import (
    ConfigError,
    DuplicateRequestError,
    RequestStateError,
    UnknownRequestError,
)


class RequestTable:
    """Request states by id (insertion = admission order) and the admission counter."""

    def __init__(self) -> None:
        #: id -> state, in admission order (a fork's child after its parent's admission).
        self.by_id: dict[Hashable, RequestState] = {}
        #: The last admission order handed out (orders start at 1).
        self.order = 0

    def __len__(self) -> int:
        return len(self.by_id)

    def states(self) -> Iterator[RequestState]:
        return iter(self.by_id.values())

    def next_order(self) -> int:
        self.order += 1
        return self.order

    # ------------------------------------------------------------------ lookups
    def get(self, request_id: RequestId) -> RequestState:
        try:
            return self.by_id[request_id]
        except (KeyError, TypeError):
            raise UnknownRequestError(f"unknown request id {request_id!r}") from None

    def resident(self, request_id: RequestId, what: str) -> RequestState:
        """The state of a request whose blocks are on the device (RequestStateError naming
        `what` could not be done when it is swapped out)."""
        req = self.get(request_id)
        if req.swapped:
            raise RequestStateError(f"cannot {what} request {request_id!r}: it is swapped out")
        return req

    def require_new(self, request_id: RequestId) -> None:
        """Refuse an id that cannot name a new request: unhashable or already held."""
        try:
            known = request_id in self.by_id
        except TypeError:
            raise ConfigError(f"request id {request_id!r} is not hashable") from None
        if known:
            raise DuplicateRequestError(f"request id {request_id!r} is already admitted")

    def group(self, request_ids: Sequence[RequestId], swapped: bool) -> list[RequestState]:
        """The states of a swap group: distinct ids, all resident (or all swapped)."""
        ids = list(request_ids)
        if not ids:
            raise ConfigError("a swap group needs at least one request id")
        try:
            repeated = len(set(ids)) != len(ids)
        except TypeError:
            raise ConfigError(f"request ids {ids!r} are not all hashable") from None
        if repeated:
            raise ConfigError(f"a swap group names a request twice: {ids!r}")
        if not swapped:
            return [self.resident(r, "swap out") for r in ids]
        reqs = [self.get(r) for r in ids]
        for r, req in zip(ids, reqs, strict=True):
            if not req.swapped:
                raise RequestStateError(f"cannot swap in request {r!r}: it is not swapped")
        return reqs

    def ids(self, swapped: bool | None = None) -> list[RequestId]:
        """Held ids in admission order: all, or only the swapped (True) / resident (False)."""
        if swapped is None:
            return list(self.by_id)
        return [r for r, s in self.by_id.items() if s.swapped == swapped]

    # ------------------------------------------------------------------ mutation
    def add(self, state: RequestState) -> None:
        self.by_id[state.request_id] = state

    def remove(self, request_id: RequestId) -> None:
        del self.by_id[request_id]

    # ------------------------------------------------------------------ checks
    def snapshot(self) -> tuple[list[tuple[object, ...]], int]:
        return [r.snapshot() for r in self.by_id.values()], self.order

    def check(self, pool: BlockPool, prefix: PrefixCache | None, max_seq_len: int) -> None:
        """Assert the invariants of the module docstring against the device pool."""
        bs = pool.block_size
        refs = [0] * pool.num_blocks
        for rid, req in self.by_id.items():
            assert len(req.blocks) == max(-(-req.seq_len // bs), -(-req.prompt_len // bs)), (
                f"request {rid!r} holds {len(req.blocks)} blocks for {req.seq_len} tokens"
            )
            assert req.seq_len <= max_seq_len
            if req.tokens is not None:
                assert req.head + len(req.tokens) + req.unknown_tail == req.seq_len, (
                    f"request {rid!r} token ids out of step"
                )
            assert len(req.keys) <= req.seq_len // bs
            if req.swapped:
                continue
            for i, b in enumerate(req.blocks):
                refs[b] += 1
                want = min(bs, max(0, req.seq_len - i * bs))
                assert pool.fill[b] == want, (
                    f"request {rid!r} block {i} (physical {b}) fill {pool.fill[b]} != {want}"
                )
                if i * bs >= req.seq_len:
                    assert pool.ref[b] == 1, f"reserved block {b} of {rid!r} is shared"
                key = prefix.key_of(b) if prefix is not None else None
                if key is not None:
                    assert i < len(req.keys) and req.keys[i] == key, (
                        f"request {rid!r} holds cached block {b} of another prefix"
                    )
        assert refs == pool.ref, "refcounts differ from the block tables' references"
