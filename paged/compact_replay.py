"""The capacity sweep's replay in arrays: `PagedKVCache`'s serial memory-only replay
(`paged.hitrate`) for traces whose prompts are described by block ids, with every
decision the cache makes and ~20 bytes a block instead of ~600 bytes of Python objects.

Why: at block 16 the whole Mooncake conversation trace keeps ~10M cached blocks across
the capacities of one pass; as index entries, dict slots and queue nodes that is ~6 GB a
process. Here each cache of a pass is a handful of numpy arrays, and each request is a
few vectorized operations per cache (no per-block Python).

What it replays is exactly what `replay_many` does through the real cache, request after
request (`_replay_all`: admit with the chain, append the rest of the prompt, free):

* identity: a full block is identified by its whole prefix (salt, the described block
  ids before it, its position in its own described block), interned to a dense int per
  (parent, block id) here; equal identities are exactly equal sha256 chain keys with
  equal verified content, so a lookup hits here iff it hits (verified) in the cache;
* admit: the hit is the longest run of indexed identities among the first
  (len - 1) // block_size blocks; the hit blocks leave the eviction queue (revived);
  the rest are taken from the top of the free stack (last freed first), then evicted
  in the queue's order (their index entries dropped);
* append: each fresh full block is indexed under its identity unless another block
  already holds it (the cache's default: duplicates unindexed);
* free: blocks released tail first: indexed ones join the eviction queue, the others
  the free stack.

Eviction queues (`paged.eviction`), as logs with lazy deletion (an entry is live while
the block's stamp equals the entry's): `lru` one log in release order; `lfu` one log per
use count (evicted from the lowest count up, each in release order; a block's count is
its releases since cached, reset when evicted); `slru` a probationary and a protected
log with the demotions of `SLRUQueue`. Tested equal to the real cache's replay, hits and
evictions, on slices of the Mooncake trace and on synthetic traces
(`suites/conformance/test_paged_compact_replay.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from kvbench.paged.eviction import PROTECTED_SHARE
from kvbench.workloads.trace import BlockTokenIds, Trace

_I32 = np.int32
_I64 = np.int64


def described_identities(trace: Trace, block_size: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(identities of every request's full blocks flattened, starts: request i's are
    [starts[i], starts[i + 1])) as int64, or None where a prompt is not described by
    block ids whose size the block size divides (the real cache replays those)."""
    memo: dict[tuple[object, int], int] = {}
    parts: list[np.ndarray] = []
    starts = [0]
    total = 0
    sizes = set()
    for i, req in enumerate(trace.requests):
        ids = req.prompt_ids(i)
        if not isinstance(ids, BlockTokenIds):
            return None
        blocks, bt = ids.described()
        sizes.add(bt)  # one size: blocks of two sizes may describe equal ids
        if bt % block_size or len(sizes) > 1:
            return None
        per = bt // block_size
        full = len(ids) // block_size
        parent: object = ("salt", req.salt)
        bases = []
        for h in blocks[: -(-full // per)]:
            base = memo.setdefault((parent, h), len(memo))
            bases.append(base)
            parent = base
        own = (np.asarray(bases, dtype=_I64)[:, None] * per + np.arange(per)).ravel()[:full]
        parts.append(own)
        total += full
        starts.append(total)
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=_I64)
    return flat, np.asarray(starts, dtype=_I64)


class _Log:
    """Blocks in append order with lazy deletion: an entry is live while `stamp[block]`
    equals the entry's stamp (`stamp` shared by every log of a cache)."""

    def __init__(self, stamp: np.ndarray) -> None:
        self.stamp = stamp
        self.blocks = np.zeros(1024, dtype=_I32)
        self.stamps = np.zeros(1024, dtype=_I64)
        self.head = 0
        self.end = 0
        self.live = 0

    def append(self, blocks: np.ndarray, stamps: np.ndarray) -> None:
        """Append blocks with their (new, increasing) stamps."""
        n = len(blocks)
        if self.end + n > len(self.blocks):
            self._compact(n)
        self.blocks[self.end : self.end + n] = blocks
        self.stamps[self.end : self.end + n] = stamps
        self.end += n

    def _compact(self, extra: int) -> None:
        """Drop the consumed and dead entries; grow to fit `extra` more."""
        b, s = self.blocks[self.head : self.end], self.stamps[self.head : self.end]
        keep = self.stamp[b] == s
        b, s = b[keep], s[keep]
        size = max(1024, 2 * (len(b) + extra))
        self.blocks = np.zeros(size, dtype=_I32)
        self.stamps = np.zeros(size, dtype=_I64)
        self.blocks[: len(b)] = b
        self.stamps[: len(b)] = s
        self.head, self.end = 0, len(b)

    def pop_front(self, k: int) -> np.ndarray:
        """Remove and return the first k live blocks (k <= live)."""
        out: list[np.ndarray] = []
        need = k
        while need:
            c = min(self.end - self.head, max(2 * need, 256))
            b = self.blocks[self.head : self.head + c]
            idx = np.flatnonzero(self.stamp[b] == self.stamps[self.head : self.head + c])
            if len(idx) >= need:
                out.append(b[idx[:need]])
                self.head += int(idx[need - 1]) + 1
                need = 0
            else:
                out.append(b[idx])
                self.head += c
                need -= len(idx)
        got = np.concatenate(out) if len(out) > 1 else out[0].copy()
        self.stamp[got] = -1
        self.live -= k
        return got


class CompactCache:
    """One cache of a pass: `pool` blocks, identities < `identities`, eviction `policy`
    (module docstring)."""

    def __init__(self, pool: int, block_size: int, policy: str, identities: int) -> None:
        if policy not in ("lru", "lfu", "slru"):
            raise ValueError(f"no compact replay of eviction policy {policy!r}")
        self.pool, self.block_size, self.policy = pool, block_size, policy
        self.block_of = np.full(identities, -1, dtype=_I32)  # identity -> indexed block
        self.key_of = np.full(pool, -1, dtype=_I64)  # block -> its identity, -1 unindexed
        self.free = np.arange(pool - 1, -1, -1, dtype=_I32)  # the free stack, top last
        self.top = pool
        self.stamp = np.full(pool, -1, dtype=_I64)  # live queue entry's stamp, -1: none
        self.clock = 0
        self.uses = np.zeros(pool, dtype=_I32)  # lfu: releases since cached
        self.seen = np.zeros(pool, dtype=bool)  # slru: released since cached
        self.level_of = np.zeros(pool, dtype=_I32)  # the log of a queued block
        self.logs: dict[int, _Log] = {}  # lru: {0}; lfu: by use count; slru: 0 / 1
        self.queued = 0
        self.evictions = 0

    def _log(self, level: int) -> _Log:
        log = self.logs.get(level)
        if log is None:
            log = self.logs[level] = _Log(self.stamp)
        return log

    def request(self, ident: np.ndarray, length: int) -> int:
        """Admit, fill and free one prompt of `length` tokens whose full blocks have
        identities `ident`; returns its prefix-hit tokens."""
        bs = self.block_size
        total = -(-length // bs)
        limit = (length - 1) // bs
        found = self.block_of[ident[:limit]]
        miss = np.flatnonzero(found < 0)
        run = int(miss[0]) if len(miss) else len(found)
        hits = found[:run]
        if run:  # revived: out of the queue
            self.stamp[hits] = -1
            self.queued -= run
            if len(self.logs) == 1:
                self.logs[next(iter(self.logs))].live -= run
            else:
                levels, counts = np.unique(self.level_of[hits], return_counts=True)
                for level, c in zip(levels.tolist(), counts.tolist(), strict=True):
                    self.logs[level].live -= c
                    self._drained(level)
        fresh = self._allocate(total - run)
        blocks = np.concatenate([hits, fresh]) if run else fresh
        new = ident[run:]
        if len(new):
            mine = blocks[run : run + len(new)]
            free_key = self.block_of[new] < 0
            self.block_of[new[free_key]] = mine[free_key]
            self.key_of[mine[free_key]] = new[free_key]
        self._release(blocks[::-1])
        return run * bs

    def _allocate(self, n: int) -> np.ndarray:
        take = min(n, self.top)
        out: np.ndarray = self.free[self.top - take : self.top][::-1].copy()
        self.top -= take
        if take == n:
            return out
        victims = self._evict(n - take)
        self.block_of[self.key_of[victims]] = -1
        self.key_of[victims] = -1
        self.evictions += len(victims)
        return np.concatenate([out, victims])

    def _drained(self, level: int) -> None:
        """Forget an empty lfu log (its entries are all dead): the logs stay as many as
        the use counts of queued blocks, not every count ever seen."""
        if self.policy == "lfu" and not self.logs[level].live:
            del self.logs[level]

    def _evict(self, k: int) -> np.ndarray:
        """The next k blocks of the queue, removed (their histories forgotten)."""
        self.queued -= k
        if self.policy == "lru":
            return self.logs[0].pop_front(k)
        out = []
        for level in sorted(self.logs):  # lfu: fewest uses first; slru: probation first
            log = self.logs[level]  # (an lfu log is dropped as it drains)
            if not log.live:
                continue
            got = log.pop_front(min(k, log.live))
            self._drained(level)
            out.append(got)
            k -= len(got)
            if not k:
                break
        victims = np.concatenate(out) if len(out) > 1 else out[0]
        self.uses[victims] = 0
        self.seen[victims] = False
        return victims

    def _release(self, blocks: np.ndarray) -> None:
        """Release a request's blocks (given tail first)."""
        cached = self.key_of[blocks] >= 0
        back = blocks[~cached]
        self.free[self.top : self.top + len(back)] = back
        self.top += len(back)
        queue = blocks[cached]
        if not len(queue):
            return
        if self.policy == "slru":
            self._release_slru(queue)
            return
        self.queued += len(queue)
        if self.policy == "lru":
            self._append(0, queue)
            return
        stamps = np.arange(self.clock, self.clock + len(queue), dtype=_I64)
        self.clock += len(queue)
        self.stamp[queue] = stamps
        uses = self.uses[queue] + 1
        self.uses[queue] = uses
        self.level_of[queue] = uses
        for level in np.unique(uses).tolist():
            pick = uses == level
            log = self._log(level)
            log.append(queue[pick], stamps[pick])
            log.live += int(pick.sum())

    def _release_slru(self, queue: np.ndarray) -> None:
        """`SLRUQueue.__setitem__` for each block in order: a first release since cached
        joins probation (log 0); a later one joins protected (log 1), which then gives
        its oldest to probation's tail while it holds more than 4/5 of the queue.

        In runs of equal kind: a run of first releases appends to probation (no
        demotion); after the j-th of a run of m later releases protected has demoted
        D_j = max(D_{j-1}, P0 + j - (Q0 + j) * 4 // 5) blocks in all (P0, Q0: protected
        and queue lengths before the run), its oldest in order: so the run appends to
        protected, then its D_m oldest move to probation."""
        num, den = PROTECTED_SHARE
        seen = self.seen[queue]
        self.seen[queue] = True
        cuts = np.flatnonzero(seen[1:] != seen[:-1]) + 1
        for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(queue)], strict=True):
            run = queue[lo:hi]
            if not seen[lo]:
                self._append(0, run)
                self.queued += len(run)
                continue
            protected = self._log(1)
            j = np.arange(1, len(run) + 1, dtype=_I64)
            over = int((protected.live + j - (self.queued + j) * num // den).max())
            self._append(1, run)
            self.queued += len(run)
            if over > 0:
                self._append(0, protected.pop_front(over))

    def _append(self, level: int, blocks: np.ndarray) -> None:
        """Queue blocks at the tail of log `level` (new stamps)."""
        stamps = np.arange(self.clock, self.clock + len(blocks), dtype=_I64)
        self.clock += len(blocks)
        self.stamp[blocks] = stamps
        self.level_of[blocks] = level
        log = self._log(level)
        log.append(blocks, stamps)
        log.live += len(blocks)


def replay_compact(
    trace: Trace,
    caps: Sequence[tuple[int, str]],
    block_size: int,
    pool_limit: int | None,
    progress: Callable[[int], None] | None = None,
) -> tuple[list[int], list[int], list[int], int] | None:
    """`replay_many`'s numbers for (capacity, policy) pairs: (hit tokens, evictions, pool
    blocks, each per pair; prompt tokens), or None where the trace is not described by
    block ids (module docstring)."""
    found = described_identities(trace, block_size)
    if found is None:
        return None
    ident, starts = found
    count = int(ident.max()) + 1 if len(ident) else 0
    caches = []
    for cap, policy in caps:
        blocks = cap // block_size
        pool = min(blocks, pool_limit) if pool_limit else blocks
        caches.append((blocks * block_size, CompactCache(pool, block_size, policy, count)))
    hits = [0] * len(caches)
    prompts = 0
    for i, req in enumerate(trace.requests):
        n = req.prompt_len
        prompts += n
        own = ident[starts[i] : starts[i + 1]]
        for k, (limit, cache) in enumerate(caches):
            use = min(n, limit)
            hits[k] += cache.request(own[: use // block_size], use)
        if progress is not None:
            progress(1)
    evictions = [c.evictions for _, c in caches]
    return hits, evictions, [c.pool for _, c in caches], prompts
