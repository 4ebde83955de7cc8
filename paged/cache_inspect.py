"""What `PagedKVCache` reports about itself: stats, prefix-cache stats, a comparable
snapshot and the invariant check.

A mixin over the attributes `PagedKVCache` sets; read-only, so it can never break the
atomicity of the operations in `paged.cache`."""

from __future__ import annotations

import torch

from kvbench.paged.block_table import RequestState
from kvbench.paged.prefix_cache import PrefixCacheStats
from kvbench.reference.contract import CacheStats


class PagedInspection:
    """stats / prefix_stats / snapshot / check over `PagedKVCache`'s state."""

    def _reservation_slots(self, req: RequestState) -> int:
        """Pending prompt slots in blocks the request holds alone (a shared partial block's
        free tail is nobody's reservation: the first write copies the block)."""
        pending = req.pending_prompt
        if not pending or req.swapped:
            return 0
        bs, s = self.block_size, req.seq_len
        if s % bs and self.pool.ref[req.blocks[s // bs]] > 1:
            pending -= min(req.prompt_len, (s // bs + 1) * bs) - s
        return pending

    def stats(self) -> CacheStats:
        """Memory snapshot (O(requests + blocks)); see CacheStats for the slot accounting.

        Paged specifics: reservation_slots are pending prompt slots in blocks a request
        holds alone; internal fragmentation is the rest of the used blocks' empty slots;
        free_slots include evictable cached blocks; logical_tokens counts running
        requests (a slot shared by n requests counts n times there, once in live_slots);
        num_requests includes swapped ones; cached_blocks are the prefix index's entries
        (in use or evictable); shared_blocks have refcount > 1; swapped_blocks are CPU
        blocks held now; cow_copies is cumulative.
        """
        bs, pool = self.block_size, self.pool
        running = [r for r in self._requests.values() if not r.swapped]
        reservation = sum(self._reservation_slots(r) for r in running)
        used_slots = pool.num_used * bs
        return CacheStats(
            capacity_slots=self.num_blocks * bs,
            live_slots=pool.live_slots,
            reservation_slots=reservation,
            internal_fragmentation_slots=used_slots - pool.live_slots - reservation,
            free_slots=pool.num_free * bs,
            external_fragmentation_slots=0,
            logical_tokens=sum(r.seq_len for r in running),
            num_requests=len(self._requests),
            bytes_per_slot=self._geometry.bytes_per_token,
            block_size=bs,
            total_blocks=self.num_blocks,
            free_blocks=pool.num_free,
            used_blocks=pool.num_used,
            cached_blocks=len(self.prefix) if self.prefix is not None else 0,
            shared_blocks=sum(1 for c in pool.ref if c > 1),
            cow_copies=self.cow_copies,
            swapped_blocks=self.swap.num_used,
        )

    def prefix_stats(self) -> PrefixCacheStats:
        """Prefix-cache counters (all zero when prefix caching is off)."""
        p = self.prefix
        if p is None:
            return PrefixCacheStats(0, 0, 0, 0, 0, 0, 0)
        return PrefixCacheStats(
            p.lookups,
            p.queried_tokens,
            p.hit_blocks,
            p.hit_tokens,
            p.evictions,
            len(p),
            self.pool.num_evictable,
        )

    # ------------------------------------------------------------------ checking
    def snapshot(self) -> dict[str, object]:
        """The whole state as comparable values and tensor copies (for atomicity tests;
        compare two with `snapshots_equal`). Expensive: copies the KV pools."""
        snap: dict[str, object] = {
            "pool": self.pool.snapshot(),
            "prefix": self.prefix.snapshot() if self.prefix is not None else None,
            "swap": self.swap.snapshot(),
            "requests": [r.snapshot() for r in self._requests.values()],
            "counters": (self._order, self.cow_copies, self.swap_outs, self.swap_ins),
        }
        for name, t in (
            ("k", self._k),
            ("v", self._v),
            ("cpu_k", self.swap.k),
            ("cpu_v", self.swap.v),
        ):
            snap[name] = None if t is None else t.clone()
        return snap

    def check(self) -> None:
        """Assert every invariant: the pool's, the prefix index's, the swap space's, and
        that request tables account for every reference (none from a freed request)."""
        self.pool.check()
        bs, pool = self.block_size, self.pool
        refs = [0] * self.num_blocks
        for rid, req in self._requests.items():
            assert len(req.blocks) == max(-(-req.seq_len // bs), -(-req.prompt_len // bs)), (
                f"request {rid!r} holds {len(req.blocks)} blocks for {req.seq_len} tokens"
            )
            assert req.seq_len <= self.max_seq_len
            if req.tokens is not None:
                assert len(req.tokens) + req.unknown_tail == req.seq_len, (
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
                key = self.prefix.key_of(b) if self.prefix is not None else None
                if key is not None:
                    assert i < len(req.keys) and req.keys[i] == key, (
                        f"request {rid!r} holds cached block {b} of another prefix"
                    )
        assert refs == pool.ref, "refcounts differ from the block tables' references"
        self.swap.check(r.blocks for r in self._requests.values() if r.swapped)
        s = self.stats()
        assert s.internal_fragmentation_slots >= 0 and s.reservation_slots >= 0
        assert s.free_slots + s.reserved_slots == s.capacity_slots


def snapshots_equal(a: dict[str, object], b: dict[str, object]) -> bool:
    """Whether two `PagedKVCache.snapshot()` results are identical (tensors bitwise)."""
    if a.keys() != b.keys():
        return False
    for name in a:
        x, y = a[name], b[name]
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype:
                return False
            # bitwise: compare raw bytes so NaNs and -0.0 count as themselves
            if not torch.equal(x.view(torch.uint8), y.view(torch.uint8)):
                return False
        elif x != y:
            return False
    return True
