"""Prefix-cache hit rate of a trace against cache capacity (the Mooncake paper's Fig. 9),
through kvbench's real `PagedKVCache` (memory-only: bookkeeping, no KV tensors).

The replay model (what a request does):

    Requests are served one at a time in trace order (arrival order), as in Mooncake's
    capacity analysis: no two requests are in the cache at once, so the cache's whole
    capacity holds the previous requests' blocks. A request
      1. is admitted with its prompt: the cache looks up the longest cached chain of the
         prompt's full blocks (sha256 keys, `paged.prefix_cache`) and counts those tokens
         as hits; the hit stops one block short of a prompt that is all cached, because
         the last prompt token is always computed again (kvbench's admission rule);
      2. computes the rest of its prompt (`append_tokens`): every full block is indexed;
      3. finishes at once and is freed: all its blocks join the evictable queue (tail
         first), so the cache keeps them until a later request needs the room; when the
         pool runs out, the eviction policy (`paged.eviction`: LRU by default, or LFU)
         picks which cached block is reallocated.
    Capacity C tokens = a pool of C // block_size blocks: the cache holds at most that
    many tokens between requests. A request whose prompt needs more blocks than the pool
    has only its first C // block_size blocks go through the cache (a cache that small
    cannot hold the rest); its other tokens count as misses.

Outputs are not cached (the traces record prompt blocks only). Hit rate = prefix-hit
tokens / prompt tokens of all requests.

A pool larger than every distinct full block of the trace plus one request never evicts,
so it behaves exactly as an unbounded cache: the replay sizes the pool at
min(C // block_size, that bound) (`footprint_blocks`), which keeps the 10^9-token points
cheap and changes no hit.

A sweep over capacities (`replay_many`) runs one cache per capacity side by side in one
pass over the trace: each prompt's block-key chain depends on the prompt, the block size
and the salt only, so it is computed once (`paged.block_chain`) and given to every cache's
`admit`; each cache still looks up, verifies, allocates, evicts and indexes by itself, so
every result equals `replay`'s for that capacity (tested). A trace described by block ids
(an imported production trace) replays in arrays instead (`paged.compact_replay`: the same
decisions, ~20-60 bytes a block where the caches' Python objects took ~600; tested equal).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvbench.paged.block_chain import BlockChain, DescribedChains
from kvbench.paged.cache import PagedKVCache
from kvbench.paged.gc_pause import gc_paused
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE, check_block_size
from kvbench.workloads.geometry import KVGeometry, require_positive
from kvbench.workloads.trace import Trace

#: A one-element geometry: memory-only bookkeeping, no KV bytes.
TINY = KVGeometry(1, 1, 1, "float16")


@dataclass(frozen=True)
class ReplayResult:
    """One replay: hit and prompt tokens, the pool it ran on, the evictions it made."""

    capacity_tokens: int
    block_size: int
    policy: str
    hit_tokens: int
    prompt_tokens: int
    pool_blocks: int
    evictions: int

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def replay(
    trace: Trace,
    capacity_tokens: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
    policy: str = "lru",
    *,
    pool_limit: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Replay `trace` through a memory-only PagedKVCache of `capacity_tokens` (see the
    module docstring). `pool_limit`: blocks past which the pool provably never evicts
    (`footprint_blocks`); the pool is min(capacity // block_size, pool_limit)."""
    check_block_size(block_size)
    cache = _memory_cache(capacity_tokens, block_size, policy, pool_limit)
    with gc_paused():
        hits, prompts = _replay_one(trace, cache, progress)
    assert cache.prefix is not None
    return ReplayResult(
        capacity_tokens, block_size, policy, hits, prompts, cache.num_blocks,
        cache.prefix.evictions,
    )  # fmt: skip


def _replay_one(
    trace: Trace, cache: PagedKVCache, progress: Callable[[int], None] | None
) -> tuple[int, int]:
    """`replay`'s loop: (hit tokens, prompt tokens)."""
    max_tokens = cache.max_seq_len
    hits = prompts = 0
    for i, req in enumerate(trace.requests):
        ids = req.prompt_ids(i)
        prompts += len(ids)
        if len(ids) > max_tokens:
            ids = ids[:max_tokens]
        cached = cache.admit(i, ids, salt=req.salt)
        cache.append_tokens(i, len(ids) - cached)
        cache.free(i)
        hits += cached
        if progress is not None:
            progress(1)
    return hits, prompts


@dataclass(frozen=True)
class ReplayConfig:
    """One cache of a sweep: its capacity [tokens] and eviction policy."""

    capacity_tokens: int
    policy: str = "lru"


def replay_many(
    trace: Trace,
    configs: Sequence[ReplayConfig],
    block_size: int = DEFAULT_BLOCK_SIZE,
    *,
    pool_limit: int | None = None,
    progress: Callable[[int], None] | None = None,
    compact: bool = True,
) -> list[ReplayResult]:
    """`replay` of `trace` through one cache per config, all in one pass: each prompt's
    key chain (`paged.block_chain`) is computed once and handed to every cache, which
    makes every decision itself (the results equal `replay`'s, config by config).
    Memory: all the caches at once (their block tuples shared through the chains).

    `compact` (the default): a trace whose prompts are all described by block ids (an
    imported production trace) replays in arrays (`paged.compact_replay`: the same
    decisions, hits and evictions, ~20 bytes a block instead of ~600); False, or any
    other trace: through the real cache as above."""
    check_block_size(block_size)
    if not configs:
        return []
    if compact:
        got = _replay_compact(trace, configs, block_size, pool_limit, progress)
        if got is not None:
            return got
    caches = [_memory_cache(c.capacity_tokens, block_size, c.policy, pool_limit) for c in configs]
    with gc_paused():
        hits, prompts = _replay_all(trace, caches, block_size, progress)
    out: list[ReplayResult] = []
    for c, cache, h in zip(configs, caches, hits, strict=True):
        assert cache.prefix is not None
        out.append(
            ReplayResult(
                c.capacity_tokens, block_size, c.policy, h, prompts, cache.num_blocks,
                cache.prefix.evictions,
            )
        )  # fmt: skip
    return out


def _replay_all(
    trace: Trace,
    caches: Sequence[PagedKVCache],
    block_size: int,
    progress: Callable[[int], None] | None,
) -> tuple[list[int], int]:
    """`replay_many`'s loop: (hit tokens per cache, prompt tokens)."""
    limits = [cache.max_seq_len for cache in caches]
    hits = [0] * len(caches)
    prompts = 0
    chains = DescribedChains(block_size)
    for i, req in enumerate(trace.requests):
        ids = req.prompt_ids(i)
        n = len(ids)
        prompts += n
        extra = (req.salt, None)
        chain = chains.chain(ids, extra)
        cut: dict[int, tuple[Sequence[int], BlockChain]] = {}
        for k, cache in enumerate(caches):
            p, pc = ids, chain
            if n > limits[k]:
                if limits[k] not in cut:
                    short = ids[: limits[k]]
                    cut[limits[k]] = (short, chain.truncated(limits[k], short))
                p, pc = cut[limits[k]]
            cached = cache.admit(i, p, salt=req.salt, chain=pc)
            cache.append_tokens(i, len(p) - cached)
            cache.free(i)
            hits[k] += cached
        if progress is not None:
            progress(1)
    return hits, prompts


def _replay_compact(
    trace: Trace,
    configs: Sequence[ReplayConfig],
    block_size: int,
    pool_limit: int | None,
    progress: Callable[[int], None] | None,
) -> list[ReplayResult] | None:
    """`replay_many` in arrays (`paged.compact_replay`), or None where the trace is not
    described by block ids; every config checked first as `_memory_cache` checks it."""
    from kvbench.paged.compact_replay import replay_compact
    from kvbench.paged.eviction import make_queue
    from kvbench.reference.validation import MAX_INDEX

    for c in configs:
        make_queue(c.policy)  # ConfigError on an unknown policy
        require_positive("capacity_tokens", c.capacity_tokens)
        blocks = c.capacity_tokens // block_size
        if blocks < 1:
            raise_small(c.capacity_tokens, block_size)
        require_positive("num_blocks", min(blocks, pool_limit) if pool_limit else blocks, MAX_INDEX)
    pairs = [(c.capacity_tokens, c.policy) for c in configs]
    got = replay_compact(trace, pairs, block_size, pool_limit, progress)
    if got is None:
        return None
    hits, evictions, pools, prompts = got
    return [
        ReplayResult(c.capacity_tokens, block_size, c.policy, h, prompts, pool, ev)
        for c, h, ev, pool in zip(configs, hits, evictions, pools, strict=True)
    ]


def _memory_cache(
    capacity_tokens: int, block_size: int, policy: str, pool_limit: int | None
) -> PagedKVCache:
    """The memory-only cache `replay` runs on (module docstring)."""
    require_positive("capacity_tokens", capacity_tokens)
    blocks = capacity_tokens // block_size
    if blocks < 1:
        raise_small(capacity_tokens, block_size)
    pool = min(blocks, pool_limit) if pool_limit else blocks
    return PagedKVCache(
        TINY,
        num_blocks=pool,
        block_size=block_size,
        store_kv=False,
        enable_prefix_caching=True,
        eviction_policy=policy,
        max_seq_len=blocks * block_size,
    )


def raise_small(capacity_tokens: int, block_size: int) -> None:
    from kvbench.workloads.errors import ConfigError

    raise ConfigError(
        f"capacity {capacity_tokens} tokens holds no block of {block_size} tokens; give at "
        "least one block"
    )


# ---------------------------------------------------------------- the pipeline
#: How a hit-rate figure was produced: the real cache replayed, Belady's bound, the
#: unbounded cache (a capacity holding the whole footprint never evicts, so its replay
#: is the ceiling, not run), or a peer's allocator (`suites.peers`, not computed here).
METHODS = ("replay", "optimal", "ceiling", "peer")


@dataclass(frozen=True)
class HitRateQuery:
    """One point asked of `hit_rates`: a capacity [tokens] and how to compute its hits:
    method "replay" (the real cache with eviction `policy`) or "optimal" (Belady's
    bound; `policy` None)."""

    capacity_tokens: int
    method: str = "replay"
    policy: str | None = "lru"


@dataclass(frozen=True)
class HitRatePoint:
    """A query's answer: prefix-hit tokens and the method that produced them ("ceiling"
    where the capacity holds the trace's footprint: the query's own method would give
    the same number)."""

    query: HitRateQuery
    method: str
    hit_tokens: int


@dataclass(frozen=True)
class HitRates:
    """A trace's hit rates at one block size: its prompt tokens, the ceiling's hit
    tokens (an unbounded cache), its footprint [blocks] and one point per query."""

    block_size: int
    prompt_tokens: int
    ceiling_tokens: int
    footprint_blocks: int
    points: tuple[HitRatePoint, ...]

    def rate(self, hit_tokens: int) -> float:
        return hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def ceiling(self) -> float:
        return self.rate(self.ceiling_tokens)


def hit_rates(
    trace: Trace,
    block_size: int,
    queries: Sequence[HitRateQuery],
    *,
    workers: int = 0,
    progress: Callable[[int], None] | None = None,
) -> HitRates:
    """Every query's hits on `trace` at `block_size`, computed exactly, and the trace's
    ceiling and footprint (`workloads.prefix_oracle`): the one hit-rate pipeline of
    `kvbench hitrate` and the trace.prefix_capacity sweep.

    Work: the block accesses once; one `replay_many` pass per eviction policy over its
    bounded capacities (each prompt's key chain computed once per pass); one job for all
    the optimal bounds. With `workers` > 0 the jobs after the first run in that many
    spawned processes beside this one (a job gets the trace pickled, nothing else);
    every job is the same call wherever it runs, so the numbers do not depend on
    `workers`. `progress` counts this process's replayed requests. Nothing is kept
    between calls."""
    from kvbench.workloads import prefix_oracle

    check_block_size(block_size)
    for q in queries:
        _check_query(q, block_size)
    acc = prefix_oracle.block_accesses(trace, block_size)
    footprint = acc.footprint_blocks()
    ceiling = prefix_oracle.ceiling_hit_tokens(acc)
    bounded = [q for q in queries if q.capacity_tokens // block_size < footprint]
    jobs: dict[str | None, tuple[int, ...]] = {}  # policy (None: optimal) -> capacities
    for q in bounded:
        key = q.policy if q.method == "replay" else None
        jobs[key] = tuple(sorted({*jobs.get(key, ()), q.capacity_tokens}))
    found = _run_jobs(trace, acc, block_size, footprint, jobs, workers, progress)
    points = []
    for q in queries:
        if q.capacity_tokens // block_size >= footprint:
            points.append(HitRatePoint(q, "ceiling", ceiling))
        else:
            key = q.policy if q.method == "replay" else None
            points.append(HitRatePoint(q, q.method, found[key][q.capacity_tokens]))
    return HitRates(block_size, acc.prompt_tokens, ceiling, footprint, tuple(points))


def _check_query(q: HitRateQuery, block_size: int) -> None:
    """ConfigError naming a query's bad method, policy or capacity."""
    from kvbench.paged.eviction import POLICIES
    from kvbench.workloads.errors import ConfigError

    if q.method == "replay":
        if q.policy not in POLICIES:
            raise ConfigError(f"unknown eviction policy {q.policy!r}; known: {', '.join(POLICIES)}")
    elif q.method == "optimal":
        if q.policy is not None:
            raise ConfigError(f"the optimal bound takes no eviction policy, got {q.policy!r}")
    else:
        raise ConfigError(f"method {q.method!r} is not computed here; known: replay, optimal")
    require_positive("capacity_tokens", q.capacity_tokens)
    if q.capacity_tokens < block_size:
        raise_small(q.capacity_tokens, block_size)


def _run_jobs(
    trace: Trace,
    acc: object,
    block_size: int,
    footprint: int,
    jobs: dict[str | None, tuple[int, ...]],
    workers: int,
    progress: Callable[[int], None] | None,
) -> dict[str | None, dict[int, int]]:
    """Hit tokens by capacity of each job (policy: one replay pass; None: the bounds),
    the first here, the rest in `workers` spawned processes (or here, in order); once
    its job is done this process takes the jobs no worker has started."""
    order = list(jobs)
    if workers < 1 or len(order) < 2:
        return {k: _job(trace, block_size, footprint, k, jobs[k], acc, progress) for k in order}
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing inherited
    with ProcessPoolExecutor(min(workers, len(order) - 1), mp_context=ctx) as pool:
        futures = {
            k: pool.submit(_job, trace, block_size, footprint, k, jobs[k]) for k in order[1:]
        }
        out = {
            order[0]: _job(trace, block_size, footprint, order[0], jobs[order[0]], acc, progress)
        }
        for k, future in reversed(futures.items()):  # jobs no worker has taken: here
            if future.cancel():
                out[k] = _job(trace, block_size, footprint, k, jobs[k], acc, progress)
        for k, future in futures.items():
            if k not in out:
                out[k] = future.result()
    return {k: out[k] for k in order}


def _job(
    trace: Trace,
    block_size: int,
    footprint: int,
    policy: str | None,
    caps: tuple[int, ...],
    acc: object = None,
    progress: Callable[[int], None] | None = None,
) -> dict[int, int]:
    """One job of `hit_rates` (here or in a worker): a `replay_many` pass of `policy`
    over `caps`, or (policy None) Belady's bound at each of them."""
    from kvbench.workloads import prefix_oracle

    if policy is None:
        if not isinstance(acc, prefix_oracle.BlockAccesses):
            acc = prefix_oracle.block_accesses(trace, block_size)
        return {c: prefix_oracle.belady_hit_tokens(acc, c) for c in caps}
    configs = [ReplayConfig(c, policy) for c in caps]
    results = replay_many(trace, configs, block_size, pool_limit=footprint, progress=progress)
    return {r.capacity_tokens: r.hit_tokens for r in results}
