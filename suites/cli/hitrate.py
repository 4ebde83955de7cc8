"""`kvbench hitrate`: a trace's prefix-cache hit rate at given cache capacities.

Examples:
    kvbench workload --import mooncake:conversation_trace.jsonl --out out/traces/mc.jsonl
    kvbench hitrate --trace out/traces/mc.jsonl --capacity 3e6,5e7 --block-size 512
    kvbench hitrate --trace out/traces/mc.jsonl --capacity 1e6 --policy lfu

For each capacity (tokens; 3e6 = 3M) it prints the hit rate (prefix-hit tokens / prompt
tokens), the ceiling (an unbounded cache), their ratio and the method that gave the
number, computed exactly by `paged.hitrate.hit_rates` (the pipeline of the bench sweep
trace.prefix_capacity). Policies: every eviction policy of `paged.eviction` (`lru` the
default, `lfu`, ...) replays the trace through kvbench's PagedKVCache (memory-only) with
that policy, requests one at a time in trace order (method "replay"); `optimal` is the
offline optimal bound (Belady). A capacity that holds the trace's footprint never evicts:
its row is the ceiling (method "ceiling"). Any kvbench trace works, imported or
generated. Bad values (a capacity that is not a number >= one block, an unknown policy,
a missing or malformed trace, a trace whose block accesses would need more than half the
free memory) exit 2 with one line.
"""

from __future__ import annotations

import argparse
import math
import sys

from kvbench.paged.eviction import POLICIES as EVICTION_POLICIES
from kvbench.suites.cli.argtypes import add_block_size_option, check_input_file
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.units import format_bytes

#: `--policy` values: every eviction policy (a replay of the real cache), and Belady's bound.
POLICIES = (*EVICTION_POLICIES, "optimal")
#: Largest capacity accepted [tokens] (past any trace's footprint).
MAX_CAPACITY = 10**12
#: Host bytes per block access a hit-rate pass may hold at its peak: the accesses'
#: keys and offsets (measured: 51-59 bytes at its peak, 8 kept, on the Mooncake head at
#: blocks of 16 and 64) plus the replayed cache's bookkeeping for a block (128).
BYTES_PER_ACCESS = 192


def parse_capacities(text: str, block_size: int) -> list[int]:
    """Comma-separated token counts (3e6, 50000000, ...) as ints >= block_size."""
    out = []
    for part in str(text).split(","):
        try:
            value = float(part)
        except ValueError:
            raise ConfigError(f"capacity {part.strip()!r} is not a number") from None
        if not math.isfinite(value) or value != int(value) or not 1 <= value <= MAX_CAPACITY:
            raise ConfigError(
                f"capacity {part.strip()!r} must be a whole number of tokens in "
                f"[1, {MAX_CAPACITY:.0e}]"
            )
        if value < block_size:
            raise ConfigError(
                f"capacity {part.strip()!r} holds no block of {block_size} tokens (--block-size)"
            )
        out.append(int(value))
    return out


def _check_memory(trace, args: argparse.Namespace) -> None:  # type: ignore[no-untyped-def]
    """Refuse (ConfigError) a trace whose block accesses would need more than half the
    memory free (lengths are bounded at 2^24 tokens, but 1,000 such prompts at blocks of
    16 tokens are a billion accesses): a clear refusal, not a MemoryError midway."""
    from kvbench.suites.cli import simulate

    bs = args.block_size
    accesses = sum(-(-r.prompt_len // bs) for r in trace.requests)
    need = accesses * BYTES_PER_ACCESS
    free = simulate.available_memory_bytes()
    if free is not None and need > free // 2:
        raise ConfigError(
            f"trace {args.trace!r} is {accesses:,} block accesses of {bs} tokens; its hit "
            f"rate needs about {format_bytes(need)} of memory, more than half of the "
            f"{format_bytes(free)} free: use a larger --block-size or a shorter trace"
        )


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from kvbench.paged.hitrate import HitRateQuery, hit_rates
    from kvbench.workloads.trace import Trace

    if args.policy not in POLICIES:
        raise ConfigError(f"unknown policy {args.policy!r}; known: {', '.join(POLICIES)}")
    capacities = parse_capacities(args.capacity, args.block_size)
    check_input_file(args.trace, "--trace")
    trace = Trace.read(args.trace)
    if not len(trace):
        raise ConfigError(f"trace {args.trace!r} has no requests")
    _check_memory(trace, args)
    method = "replay" if args.policy in EVICTION_POLICIES else "optimal"
    policy = args.policy if method == "replay" else None
    queries = [HitRateQuery(cap, method, policy) for cap in capacities]
    with tqdm(
        total=len(trace),
        desc=f"{len(capacities)} capacities",
        unit="req",
        disable=args.quiet or None,
        file=sys.stderr,
        leave=False,
    ) as bar:  # one pass: every capacity's cache replays the trace side by side
        rates = hit_rates(trace, args.block_size, queries, progress=bar.update)
    print(
        f"{args.trace}: {len(trace)} requests, {rates.prompt_tokens:,} prompt tokens, block "
        f"{args.block_size}, policy {args.policy}; computed exactly (requests one at a time)"
    )
    ceiling = rates.ceiling
    print(f"{'capacity [tokens]':>18}  {'hit rate':>9}  {'ceiling':>9}  {'fraction':>9}  method")
    for point in rates.points:
        rate = rates.rate(point.hit_tokens)
        # a trace that shares nothing (no prefix ids, e.g. Azure) has no ceiling to reach
        fraction = f"{rate / ceiling:>9.2%}" if ceiling else f"{'n/a':>9}"
        cap = point.query.capacity_tokens
        print(f"{cap:>18,}  {rate:>9.2%}  {ceiling:>9.2%}  {fraction}  {point.method}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "hitrate",
        help="a trace's prefix-cache hit rate, ceiling and fraction per cache capacity",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--trace", required=True, help="kvbench trace file (e.g. imported)")
    p.add_argument(
        "--capacity", default="3e6,5e7", help="comma-separated cache capacities [tokens]"
    )
    add_block_size_option(p)
    p.add_argument("--policy", default="lru", help=f"one of {', '.join(POLICIES)}")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
