"""What a prefix cache could hit on a trace, computed from block identities alone (no
cache): the ceiling (an unbounded cache) and the offline optimal bound (Belady's MIN) at a
capacity, under the replay model of `paged.hitrate` (requests one at a time in trace
order; the hit is the longest cached chain of a prompt's full blocks, stopping one block
short when the whole prompt is cached; a request's blocks all fit in the cache while it
runs; a prompt longer than the cache goes through it only for its first
capacity // block_size blocks).

Block identity: the i-th full block of a prompt is identified by its whole prefix (the
ids of blocks 0..i and the salt), as kvbench's sha256 chain keys it. For version-2
requests (`prompt_blocks`) with block_size dividing prompt_block_tokens this is computed
from the block ids without looking at a token: sub-block j of described block k is
(chain of block ids 0..k, j). Otherwise the token ids are chained. Both give one int per
distinct prefix.

This module is the independent oracle the real-cache replay is judged against: it shares
no code with `paged`.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvbench.workloads.block_size import check_block_size
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.trace import Trace


@dataclass(frozen=True)
class BlockAccesses:
    """Every request's full-block identities, flattened.

    keys: int64 identities, request after request; starts[i]:starts[i + 1] are request
    i's full blocks (prompt_len // block_size of them). hittable[i]: how many leading
    blocks a lookup may serve ((prompt_len - 1) // block_size). prompt_lens[i]: tokens.
    """

    block_size: int
    keys: np.ndarray
    starts: np.ndarray
    hittable: np.ndarray
    prompt_lens: np.ndarray

    @property
    def num_requests(self) -> int:
        return len(self.prompt_lens)

    @property
    def prompt_tokens(self) -> int:
        return int(self.prompt_lens.sum())

    def distinct_blocks(self) -> int:
        return len(np.unique(self.keys)) if len(self.keys) else 0

    def footprint_blocks(self) -> int:
        """Blocks past which a pool never evicts in the replay: every distinct full
        block plus the largest request."""
        most = int(-(-self.prompt_lens.max() // self.block_size)) if len(self.prompt_lens) else 0
        return self.distinct_blocks() + most


def block_accesses(trace: Trace, block_size: int) -> BlockAccesses:
    """The trace's full-block identities at `block_size` (module docstring)."""
    check_block_size(block_size)
    reqs = trace.requests
    compact = len({r.prompt_block_tokens for r in reqs}) == 1 and all(
        r.prompt_blocks is not None
        and r.prompt_block_tokens is not None
        and r.prompt_block_tokens % block_size == 0
        for r in reqs
    )
    chains: dict[tuple, int] = {}
    keys = array("q")  # int64s, not int objects: 8 bytes an access (~9M at block 16)
    starts = [0]
    for i, r in enumerate(reqs):
        full = r.prompt_len // block_size
        if compact:
            assert r.prompt_blocks is not None and r.prompt_block_tokens is not None
            per = r.prompt_block_tokens // block_size
            parent: object = ("salt", r.salt)
            for k, h in enumerate(r.prompt_blocks):
                if k * per >= full:
                    break
                chain = chains.setdefault((parent, h, r.prompt_block_tokens), len(chains))
                parent = chain
                take = min(per, full - k * per)
                base = chain * per
                keys.extend(range(base, base + take))
        else:
            ids = r.prompt_ids(i)
            parent = ("salt", r.salt)
            for b in range(full):
                chunk = tuple(ids[b * block_size : (b + 1) * block_size])
                parent = chains.setdefault((parent, chunk), len(chains))
                keys.append(parent)  # type: ignore[arg-type]
        starts.append(len(keys))
    lens = np.array([r.prompt_len for r in reqs], dtype=np.int64)
    return BlockAccesses(
        block_size,
        np.frombuffer(keys, dtype=np.int64) if len(keys) else np.zeros(0, dtype=np.int64),
        np.array(starts, dtype=np.int64),
        (lens - 1) // block_size,
        lens,
    )


def ceiling_hit_tokens(acc: BlockAccesses) -> int:
    """Prefix-hit tokens of an unbounded cache: a block hits when an earlier request had
    the same prefix (it was cached then and is never evicted)."""
    if not len(acc.keys):
        return 0
    req_of = np.repeat(np.arange(acc.num_requests), np.diff(acc.starts))
    pos = np.arange(len(acc.keys)) - acc.starts[req_of]
    _, first = np.unique(acc.keys, return_index=True)
    first_req = np.empty(int(acc.keys.max()) + 1, dtype=np.int64)
    first_req[acc.keys[first]] = req_of[first]
    hit = (first_req[acc.keys] < req_of) & (pos < acc.hittable[req_of])
    return int(hit.sum()) * acc.block_size


def _next_uses(acc: BlockAccesses, cap_blocks: int) -> np.ndarray:
    """For every access, the request whose access of the same block comes next, if that
    access may hit (a hittable position within the capacity), else a number past every
    request.

    A request caches every full block it holds, so a block whose next access cannot hit
    is computed and cached again there for free: keeping it until then saves nothing,
    and its eviction must rank with blocks never used again (otherwise Belady's rule
    keeps a block that is recomputed anyway in place of one that would hit)."""
    n = len(acc.keys)
    never = acc.num_requests + 1
    if not n:
        return np.zeros(0, dtype=np.int64)
    req_of = np.repeat(np.arange(acc.num_requests), np.diff(acc.starts))
    pos = np.arange(n) - acc.starts[req_of]
    use = np.minimum(acc.prompt_lens, cap_blocks * acc.block_size)
    held = pos < (use // acc.block_size)[req_of]  # blocks the request holds (recaches)
    limit = np.minimum(acc.hittable, (use - 1) // acc.block_size)
    usable = pos < limit[req_of]  # held blocks that may hit
    if not held.any():
        return np.full(n, never, dtype=np.int64)
    span = acc.num_requests + 2
    order = np.argsort(acc.keys[held] * span + req_of[held], kind="stable")
    uses = (acc.keys[held] * span + req_of[held])[order]
    may_hit = usable[held][order]
    query = acc.keys * span + req_of
    at = np.searchsorted(uses, query, side="right")
    found = at < len(uses)
    nxt = np.full(n, never, dtype=np.int64)
    idx = np.minimum(at, len(uses) - 1)
    cand = uses[idx]
    same = found & (cand // span == acc.keys) & may_hit[idx]
    nxt[same] = cand[same] % span
    return nxt


def belady_hit_tokens(acc: BlockAccesses, capacity_tokens: int) -> int:
    """Prefix-hit tokens of the offline optimal cache of `capacity_tokens` (Belady's
    MIN): while a request runs, the cache keeps at most capacity - (its blocks) other
    cached blocks, evicting those whose next possible hit is farthest in the future;
    after it, all its full blocks stay cached."""
    cap = capacity_tokens // acc.block_size
    if cap < 1:
        raise ConfigError(
            f"capacity {capacity_tokens} tokens holds no block of {acc.block_size} tokens"
        )
    nxt = _next_uses(acc, cap)
    keys, starts = acc.keys, acc.starts.tolist()  # keys and next uses: per request below
    hittable = acc.hittable.tolist()
    lens = acc.prompt_lens.tolist()
    bs = acc.block_size
    span = int(keys.max()) + 1 if len(keys) else 1  # keys are in [0, span)
    top = acc.num_requests + 1  # next uses are in [1, top]
    # key -> its next use + 1 (the heap's live entry), 0 where not cached: 8 bytes a key
    # in one array, not a dict entry (a 10^8-token cache at block 16 holds 6M keys)
    next_of = array("q", bytes(8 * span))
    count = 0  # cached keys
    # one int a cached key, lazily deleted: (top - next use) * span + (span - 1 - key),
    # ordered as (-next use, -key): farthest next use first; on a tie the larger key,
    # which is the deeper block (a child is numbered after its parent), so the cached set
    # stays closed under prefixes
    heap: list[int] = []
    hits = 0
    for i, length in enumerate(lens):
        use = min(length, cap * bs)
        full = use // bs
        total = -(-use // bs)
        lo = starts[i]
        mine = keys[lo : lo + full].tolist()
        nxt_l = nxt[lo : lo + full].tolist()
        run = 0
        limit = min(hittable[i], (use - 1) // bs)
        while run < limit and next_of[mine[run]]:
            run += 1
        hits += run * bs
        pinned = set(mine[:run])
        keep = cap - total  # other cached blocks that fit beside this request
        others = count - run
        held: list[int] = []
        while others > keep:
            code = heapq.heappop(heap)
            far, rest = divmod(code, span)
            key = span - 1 - rest
            if next_of[key] != top - far + 1:
                continue
            if key in pinned:
                held.append(code)
                continue
            next_of[key] = 0
            count -= 1
            others -= 1
        for code in held:
            heapq.heappush(heap, code)
        for j, key in enumerate(mine):
            nu = nxt_l[j]
            was = next_of[key]
            if was != nu + 1:
                count += not was
                next_of[key] = nu + 1
                heapq.heappush(heap, (top - nu) * span + span - 1 - key)
        if len(heap) > 4 * count + 1024:
            live = np.frombuffer(next_of, dtype=np.int64)
            at = np.flatnonzero(live)
            heap = ((top - (live[at] - 1)) * span + span - 1 - at).tolist()
            heapq.heapify(heap)
    return hits


def lru_model_hit_tokens(acc: BlockAccesses, capacity_tokens: int) -> int:
    """Prefix-hit tokens of an LRU cache modeled on block identities (for cross-checking
    the real cache on small traces): hits revive blocks; fresh blocks come from free
    room first, else evict the least recently released; after the request its blocks
    are released tail first (deepest first into the queue), new identities cached."""
    from collections import OrderedDict

    cap = capacity_tokens // acc.block_size
    bs = acc.block_size
    lru: OrderedDict[int, None] = OrderedDict()
    hits = 0
    keys = acc.keys.tolist()
    starts = acc.starts.tolist()
    for i, length in enumerate(acc.prompt_lens.tolist()):
        use = min(length, cap * bs)
        full, total = use // bs, -(-use // bs)
        mine: Sequence[int] = keys[starts[i] : starts[i] + full]
        run = 0
        limit = min(int(acc.hittable[i]), (use - 1) // bs)
        while run < limit and mine[run] in lru:
            run += 1
        hits += run * bs
        for key in mine[:run]:
            del lru[key]  # in use again
        fresh = total - run
        room = cap - run - len(lru)  # free blocks (never-cached room)
        for _ in range(max(0, fresh - room)):
            lru.popitem(last=False)
        indexed = list(mine[:run])
        for key in mine[run:]:
            indexed.append(-1 if key in lru else key)  # taken: the new block is not indexed
        for key in reversed(indexed):
            if key >= 0:
                lru[key] = None
    return hits
