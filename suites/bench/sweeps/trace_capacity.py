"""trace.prefix_capacity: prefix-cache hit rate against cache capacity on a production
trace (the Mooncake paper's Fig. 9), from the shipped Mooncake conversation trace.

Each row is one (trace, capacity, block size, policy):

    lru, lfu   kvbench's real PagedKVCache (memory-only) with that eviction policy,
               replaying the trace request after request (`paged.hitrate`: admit with a
               prefix lookup, compute the rest of the prompt, free: the blocks stay
               cached until evicted); computed exactly, no timing. All capacities of a
               (block size, policy) replay in one pass (`replay_many`: each prompt's
               key chain hashed once, not once per capacity).
    optimal    the offline optimal bound at the same capacity (Belady's MIN: evict the
               block whose next possible hit is farthest in the future) on the same
               replay model (`workloads.prefix_oracle`).
    vllm       a peer row: vLLM's v1 KVCacheManager (prefix caching on; its free queue
               evicts least recently freed first) on the same requests and the same
               replay model (`suites.peers.workloads.prefix_hit_replay`), at the
               capacities the real LRU cache runs at by default (3M and 50M), at every
               block size of the grid; only where vLLM is installed (the peers env),
               its version a case parameter (elsewhere the rows are absent and the
               reason is logged). Always replayed, also where the capacity holds the
               whole footprint (see below). Computed exactly, no timing.

Metrics: hit_rate = prefix-hit tokens / prompt tokens; hit_rate_ceiling = the same for an
unbounded cache (every earlier prefix cached); fraction_of_ceiling = their ratio.

A capacity at or above the trace's footprint (distinct full blocks + one request) never
evicts, so the real cache there is the unbounded one: those rows are the ceiling
(`unbounded` = 1), not a replay (the replay would hold ~90M token ids in memory).

Default run (kept to about a minute and a half on two cores): block size 512, the real
LRU cache at 3M and 50M tokens (the claim's points) and the optimal bound at every
capacity. `--full`: capacities 10^4-10^9 (log-spaced, with 3M and 50M), block sizes 512
and 16, policies lru, lfu, optimal.

Speed: the first replayed case of a block size runs its policy's pass here and starts
the other policies' passes and the optimal bounds in worker processes (one per spare
core; at most KVBENCH_REPLAY_WORKERS, 0 for none), so on two cores LRU and LFU replay
side by side; each is the same `replay_many` / `belady_hit_tokens` call wherever it
runs.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
from concurrent.futures import Executor, Future, ProcessPoolExecutor

from kvbench.reports.provenance import COUNTED
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.registry import Case, Measurement, sweep
from kvbench.workloads import prefix_oracle
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.shipped import shipped_trace

TRACE = "mooncake-conversation"
#: Cache capacities [tokens]: log-spaced 10^4..10^9 plus the paper's 3M and 50M.
CAPACITIES = (10_000, 100_000, 1_000_000, 3_000_000, 10_000_000, 50_000_000, 10**8, 10**9)
DEFAULT_REPLAYED = (3_000_000, 50_000_000)
#: The peer whose KVCacheManager replays the trace beside kvbench (policy name = peer).
PEER = "vllm"

log = logging.getLogger(__name__)
_reported: list[str] = []
#: The replayed capacities of each (trace, block size, policy) in the grid last built:
#: one pass of `paged.hitrate.replay_many` serves them all (each prompt's key chain is
#: computed once per pass, not once per capacity).
_PLAN: dict[tuple[str, int, str], tuple[int, ...]] = {}


def _peer_version() -> str | None:
    """The peer's version where it is installed here (a cheap probe, no import), else None
    (the reason logged once per process)."""
    from kvbench.suites.peers import registry

    why = registry.unavailable_reason(PEER)
    if why is None:
        return registry.peer_version(PEER)
    if not _reported:
        _reported.append(why)
        log.warning("trace.prefix_capacity: no %s peer rows: %s", PEER, why)
    return None


def capacity_cases(full: bool) -> list[Case]:
    """The grid (module docstring)."""
    block_sizes = (512, 16) if full else (512,)
    peer = _peer_version()
    cases: list[Case] = []
    _PLAN.clear()
    _PASSES.clear()
    _PENDING.clear()
    for bs in block_sizes:
        for cap in CAPACITIES:
            policies = ["optimal"]
            if full:
                policies += ["lru", "lfu"]
            elif cap in DEFAULT_REPLAYED:
                policies.append("lru")
            for policy in sorted(policies):
                key = (TRACE, bs, policy)
                _PLAN[key] = tuple(sorted({*_PLAN.get(key, ()), cap}))
                cases.append(
                    {"trace": TRACE, "capacity_tokens": cap, "block_size": bs, "policy": policy}
                )
            if peer is not None and cap in DEFAULT_REPLAYED:
                cases.append(
                    {
                        "trace": TRACE,
                        "capacity_tokens": cap,
                        "block_size": bs,
                        "policy": PEER,
                        "version": peer,
                    }
                )
    return cases


@functools.lru_cache(maxsize=2)
def _accesses(trace: str, block_size: int) -> prefix_oracle.BlockAccesses:
    return prefix_oracle.block_accesses(shipped_trace(trace), block_size)


@functools.lru_cache(maxsize=4)
def _ceiling(trace: str, block_size: int) -> int:
    return prefix_oracle.ceiling_hit_tokens(_accesses(trace, block_size))


def hit_tokens(case: Case) -> tuple[int, bool]:
    """(prefix-hit tokens of the case, whether the capacity is unbounded in effect)."""
    trace, cap, bs, policy = (
        case["trace"],
        int(case["capacity_tokens"]),
        int(case["block_size"]),
        case["policy"],
    )
    footprint = _footprint(trace, bs)
    unbounded = cap // bs >= footprint
    if policy == PEER:
        return _peer_hit_tokens(trace, cap, bs, footprint), unbounded
    if unbounded:
        return _ceiling(trace, bs), True
    return _replayed(trace, bs, policy, cap, footprint), False


@functools.lru_cache(maxsize=4)
def _footprint(trace: str, block_size: int) -> int:
    """`BlockAccesses.footprint_blocks` (a sort of every block access: once per grid)."""
    return _accesses(trace, block_size).footprint_blocks()


def _planned(trace: str, bs: int, policy: str, footprint: int) -> tuple[int, ...]:
    """The bounded capacities the grid replays with this policy (`_PLAN`)."""
    return tuple(c for c in _PLAN.get((trace, bs, policy), ()) if c // bs < footprint)


def _replayed(trace: str, bs: int, policy: str, cap: int, footprint: int) -> int:
    """Hit tokens of the real cache at `cap`, from one `replay_many` pass over every
    bounded capacity the grid replays with this policy (`_PLAN`), memoized (for
    "optimal": Belady's bound at `cap`). The first pass of a (trace, block size) also
    starts the other policies' planned passes and bounds in worker processes (one per
    spare core), so LRU, LFU and the bounds run side by side."""
    planned = _planned(trace, bs, policy, footprint)
    if policy == "optimal":  # one bound per capacity: no pass to share
        planned = (cap,) if cap in planned else ()
    caps = planned if cap in planned else (cap,)
    key = (trace, bs, policy, caps, footprint)
    if key not in _PASSES:
        if cap in planned:
            _start_siblings(trace, bs, policy, footprint)
        future = _PENDING.pop(key, None)
        _PASSES[key] = future.result() if future is not None else _replay_pass(*key)
    return _PASSES[key][cap]


#: Finished passes by (trace, block size, policy, capacities, footprint): hit tokens by
#: capacity (small dicts: every pass of a run is kept).
_PASSES: dict[tuple[str, int, str, tuple[int, ...], int], dict[int, int]] = {}
#: Passes running in worker processes, by the same key.
_PENDING: dict[tuple[str, int, str, tuple[int, ...], int], Future[dict[int, int]]] = {}
_POOL: list[Executor] = []


def _start_siblings(trace: str, bs: int, policy: str, footprint: int) -> None:
    """Submit the other policies' planned passes of (trace, bs) to worker processes
    (none where this machine has one core, or KVBENCH_REPLAY_WORKERS=0)."""
    workers = _workers()
    if workers < 1:
        return
    for (t, b, other), _caps in sorted(_PLAN.items()):
        if (t, b) != (trace, bs) or other == policy:
            continue
        planned = _planned(trace, bs, other, footprint)
        # a replayed policy's capacities share one pass; each optimal bound is its own
        jobs = [planned] if other != "optimal" else [(c,) for c in planned]
        for caps in jobs:
            key = (trace, bs, other, caps, footprint)
            if not caps or key in _PASSES or key in _PENDING:
                continue
            if not _POOL:
                _POOL.append(_make_pool(workers))
            _PENDING[key] = _POOL[0].submit(_replay_pass, *key)


def _make_pool(workers: int) -> Executor:
    """The worker processes (spawned: a fresh interpreter imports kvbench and the trace,
    nothing is inherited from this process's state)."""
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))


def _workers() -> int:
    """Worker processes for sibling passes: the cores beside this process, at most
    KVBENCH_REPLAY_WORKERS when set."""
    spare = (os.cpu_count() or 1) - 1
    limit = os.environ.get("KVBENCH_REPLAY_WORKERS")
    if limit is not None:
        try:
            spare = min(spare, int(limit))
        except ValueError:
            raise ConfigError(f"KVBENCH_REPLAY_WORKERS must be an integer, got {limit!r}") from None
    return max(0, spare)


def _replay_pass(
    trace: str, bs: int, policy: str, caps: tuple[int, ...], footprint: int
) -> dict[int, int]:
    """One `replay_many` pass: hit tokens by capacity (run here or in a worker); for
    "optimal", Belady's bound at each capacity."""
    from kvbench.paged.hitrate import ReplayConfig, replay_many

    if policy == "optimal":
        acc = _accesses(trace, bs)
        return {c: prefix_oracle.belady_hit_tokens(acc, c) for c in caps}

    configs = [ReplayConfig(c, policy) for c in caps]
    results = replay_many(shipped_trace(trace), configs, bs, pool_limit=footprint)
    return {r.capacity_tokens: r.hit_tokens for r in results}


def _peer_hit_tokens(trace: str, cap: int, bs: int, footprint: int) -> int:
    """Prefix-hit tokens of the peer's KVCacheManager with a pool of min(cap // bs,
    footprint) blocks (PeerUnavailableError, a skip, where the peer does not import)."""
    from kvbench.suites.peers.registry import load_allocator
    from kvbench.suites.peers.workloads import prefix_hit_replay

    blocks = cap // bs
    requests = shipped_trace(trace).requests
    prompts = ((r.prompt_ids(i), r.salt) for i, r in enumerate(requests))
    alloc = load_allocator(PEER, min(blocks, footprint), bs)
    return prefix_hit_replay(alloc, prompts, blocks * bs)


@sweep(
    "trace.prefix_capacity",
    "prefix-cache hit rate vs cache capacity on the Mooncake conversation trace (computed "
    "exactly: the real PagedKVCache, memory-only, LRU / LFU; Belady's optimal bound; the "
    "unbounded ceiling; vLLM's KVCacheManager beside them at 3M and 50M where installed). "
    "Default run: block 512, LRU at 3M and 50M tokens, the bound at every capacity; "
    "--full: block 16 and 512, 10^4-10^9 tokens, LRU, LFU and optimal",
    capacity_cases,
    requires=("kvbench.paged.hitrate",),
    tags=("trace", "prefix"),
    produced=(COUNTED,),
)
def prefix_capacity(case: Case, ctx: BenchContext) -> list[Measurement]:
    acc = _accesses(case["trace"], int(case["block_size"]))
    hits, unbounded = hit_tokens(case)
    ceiling = _ceiling(case["trace"], int(case["block_size"]))
    prompts = acc.prompt_tokens
    rate, top = hits / prompts, ceiling / prompts
    rows = [
        Measurement("hit_rate", rate, "fraction"),
        Measurement("hit_rate_ceiling", top, "fraction"),
        Measurement("hit_tokens", hits, "tokens"),
        Measurement("prompt_tokens", prompts, "tokens"),
        Measurement("unbounded", float(unbounded), "bool"),
    ]
    if top:  # no fraction of a zero ceiling (the store holds no NaN): the row is left out
        rows.insert(2, Measurement("fraction_of_ceiling", rate / top, "fraction"))
    return rows
