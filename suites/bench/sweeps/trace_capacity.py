"""trace.prefix_capacity: prefix-cache hit rate against cache capacity on a production
trace (the Mooncake paper's Fig. 9), from the shipped Mooncake conversation trace.

Each row is one (trace, capacity, block size, method[, policy | peer]); `method` says how
its number was produced, `policy` is the eviction policy of a replay (nothing else):

    replay     kvbench's real PagedKVCache (memory-only) with eviction `policy` (every
               policy of `paged.eviction.POLICIES` in the full grid), replaying the trace
               request after request (`paged.hitrate`: admit with a prefix lookup,
               compute the rest of the prompt, free: the blocks stay cached until
               evicted); computed exactly, no timing.
    optimal    the offline optimal bound at the same capacity (Belady's MIN: evict the
               block whose next possible hit is farthest in the future) on the same
               replay model (`workloads.prefix_oracle`); no policy.
    peer       `peer` = vllm: vLLM's v1 KVCacheManager (prefix caching on; its free
               queue evicts least recently freed first) on the same requests and the
               same replay model (`suites.peers.workloads.prefix_hit_replay`), at the
               capacities the real LRU cache runs at by default (3M and 50M), at every
               block size of the grid; only where vLLM is installed (the peers env),
               its version a case parameter (elsewhere the rows are absent and the
               reason is logged). Always replayed, also where the capacity holds the
               whole footprint (see below). Computed exactly, no timing.

All the replay and optimal rows of a (trace, block size) come from one call of
`paged.hitrate.hit_rates` (the pipeline `kvbench hitrate` runs too): the block accesses,
ceiling and footprint once, one replay pass per policy over all its capacities, one job
for the bounds; the result is kept in the run's context (`BenchContext.cache`), not in
this module.

Metrics: hit_rate = prefix-hit tokens / prompt tokens; hit_rate_ceiling = the same for an
unbounded cache (every earlier prefix cached); fraction_of_ceiling = their ratio;
peak_rss_self / peak_rss_workers: the largest resident set [B] of this bench process and
of any replay worker so far (`resource.getrusage`, measured here).

A capacity at or above the trace's footprint (distinct full blocks + one request) never
evicts, so the real cache there is the unbounded one: those rows are the ceiling
(`unbounded` = 1; `hit_rates` says method "ceiling"), not a replay.

Default run (kept to about a minute and a half on two cores): block size 512, the real
LRU cache at 3M and 50M tokens (the claim's points) and the optimal bound at every
capacity. `--full`: capacities 10^4-10^9 (log-spaced, with 3M and 50M), block sizes 512
and 16, every eviction policy and the bound.

Speed: `hit_rates` runs the first job of a block size here and the others in worker
processes (one per spare core; at most KVBENCH_REPLAY_WORKERS, 0 for none), so on two
cores two passes replay side by side.
"""

from __future__ import annotations

import logging
import os
import resource

from kvbench.paged.eviction import POLICIES
from kvbench.paged.hitrate import HitRateQuery, HitRates, hit_rates
from kvbench.reports.provenance import COUNTED
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.registry import Case, Measurement, get_sweep, sweep
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.shipped import shipped_trace

TRACE = "mooncake-conversation"
#: Cache capacities [tokens]: log-spaced 10^4..10^9 plus the paper's 3M and 50M.
CAPACITIES = (10_000, 100_000, 1_000_000, 3_000_000, 10_000_000, 50_000_000, 10**8, 10**9)
DEFAULT_REPLAYED = (3_000_000, 50_000_000)
#: The peer whose KVCacheManager replays the trace beside kvbench (`peer` parameter).
PEER = "vllm"

log = logging.getLogger(__name__)
_reported: list[str] = []


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


def _computed_cases(full: bool) -> list[Case]:
    """The grid's replay and optimal cases (module docstring), in measuring order."""
    cases: list[Case] = []
    for bs in (512, 16) if full else (512,):
        for cap in CAPACITIES:
            base = {"trace": TRACE, "capacity_tokens": cap, "block_size": bs}
            policies = list(POLICIES) if full else ["lru"] if cap in DEFAULT_REPLAYED else []
            cases += [{**base, "method": "replay", "policy": p} for p in sorted(policies)]
            cases.append({**base, "method": "optimal"})
    return cases


def capacity_cases(full: bool) -> list[Case]:
    """The grid (module docstring): the computed cases, the peer's after each block
    size's capacity where it is installed."""
    peer = _peer_version()
    cases: list[Case] = []
    for case in _computed_cases(full):
        cases.append(case)
        last = case["method"] == "optimal"  # the capacity's last computed case
        if peer is not None and last and case["capacity_tokens"] in DEFAULT_REPLAYED:
            cases.append({**case, "method": "peer", "peer": PEER, "version": peer})
    return cases


def _query(case: Case) -> HitRateQuery:
    method = case["method"]
    return HitRateQuery(int(case["capacity_tokens"]), method, case.get("policy"))


def _hit_rates(case: Case, ctx: BenchContext | None) -> HitRates:
    """The pipeline's answer for the case's (trace, block size): every computed case of
    the run's grid (the registered sweep's cases) at once, kept in the run's context
    (without a context: this case's query alone)."""
    trace, bs = case["trace"], int(case["block_size"])
    mine = _query(case) if case["method"] != "peer" else None
    if ctx is None:
        return hit_rates(shipped_trace(trace), bs, [mine] if mine else [])
    key = f"trace.prefix_capacity/{trace}/{bs}"
    found: HitRates | None = ctx.cache.get(key)
    if found is None or (mine is not None and mine not in {p.query for p in found.points}):
        grid = get_sweep("trace.prefix_capacity").cases(ctx.full)  # the run's grid
        same = [c for c in grid if (c["trace"], c["block_size"]) == (trace, bs)]
        same = [c for c in same if c["method"] != "peer"]
        queries = list(dict.fromkeys([_query(c) for c in same] + ([mine] if mine else [])))
        found = ctx.cache[key] = hit_rates(shipped_trace(trace), bs, queries, workers=_workers())
    return found


def _workers() -> int:
    """Worker processes for the other jobs: the cores beside this process, at most
    KVBENCH_REPLAY_WORKERS when set."""
    spare = (os.cpu_count() or 1) - 1
    limit = os.environ.get("KVBENCH_REPLAY_WORKERS")
    if limit is not None:
        try:
            spare = min(spare, int(limit))
        except ValueError:
            raise ConfigError(f"KVBENCH_REPLAY_WORKERS must be an integer, got {limit!r}") from None
    return max(0, spare)


def hit_tokens(case: Case, ctx: BenchContext | None = None) -> tuple[int, bool]:
    """(prefix-hit tokens of the case, whether the capacity is unbounded in effect)."""
    rates = _hit_rates(case, ctx)
    cap, bs = int(case["capacity_tokens"]), int(case["block_size"])
    unbounded = cap // bs >= rates.footprint_blocks
    if case["method"] == "peer":
        return _peer_hit_tokens(case["trace"], cap, bs, rates.footprint_blocks), unbounded
    (point,) = [p for p in rates.points if p.query == _query(case)]
    return point.hit_tokens, unbounded


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


def peak_rss() -> tuple[int, int]:
    """(this process's, its largest finished child's) peak resident set [B] (Linux
    reports ru_maxrss in KiB)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return own * 1024, kids * 1024


@sweep(
    "trace.prefix_capacity",
    "prefix-cache hit rate vs cache capacity on the Mooncake conversation trace (computed "
    "exactly: the real PagedKVCache, memory-only, each eviction policy; Belady's optimal "
    "bound; the unbounded ceiling; vLLM's KVCacheManager beside them at 3M and 50M where "
    "installed). Default run: block 512, LRU at 3M and 50M tokens, the bound at every "
    "capacity; --full: block 16 and 512, 10^4-10^9 tokens, every policy and the bound",
    capacity_cases,
    requires=("kvbench.paged.hitrate",),
    tags=("trace", "prefix"),
    produced=(COUNTED,),
)
def prefix_capacity(case: Case, ctx: BenchContext) -> list[Measurement]:
    rates = _hit_rates(case, ctx)
    hits, unbounded = hit_tokens(case, ctx)
    prompts = rates.prompt_tokens
    rate, top = hits / prompts, rates.ceiling
    own, kids = peak_rss()
    rows = [
        Measurement("hit_rate", rate, "fraction"),
        Measurement("hit_rate_ceiling", top, "fraction"),
        Measurement("hit_tokens", hits, "tokens"),
        Measurement("prompt_tokens", prompts, "tokens"),
        Measurement("unbounded", float(unbounded), "bool"),
        Measurement("peak_rss_self", own, "B"),
        Measurement("peak_rss_workers", kids, "B"),
    ]
    if top:  # no fraction of a zero ceiling (the store holds no NaN): the row is left out
        rows.insert(2, Measurement("fraction_of_ceiling", rate / top, "fraction"))
    return rows
