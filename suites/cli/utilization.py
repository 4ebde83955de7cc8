"""`kvbench utilization`: naive vs paged slot utilization, measured from real caches.

Reproduces [paged-sim]'s experiment (see paged/utilization.py): normal(500, 200) lengths
clipped to [200, 2048], block 16, batch sizes 10..200, and the shared 200-token system
prompt across 10 requests. Published figures: about 24% naive vs about 98.5% paged; 130
pages without sharing vs 13 with copy-on-write sharing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tqdm import tqdm

from kvbench.paged.utilization import (
    SEED002_BATCH_SIZES,
    UtilizationRow,
    measure_batch,
    seed002_lengths,
    shared_prompt_blocks,
)
from kvbench.suites.cli.argtypes import add_block_size_option, float_range, int_range, seed_int
from kvbench.workloads.errors import ConfigError

SUITE = "paged.utilization"

#: Largest batch and longest length accepted: far past the seed's 200 and 2048, small
#: enough that the caches this command fills fit in memory.
MAX_BATCH = 10_000
MAX_TOKENS = 1 << 20
#: Most blocks the caches of one invocation may hold (their bookkeeping is about 100 bytes
#: a block): checked on the drawn lengths before any cache is built.
MAX_BLOCKS = 1 << 22

_length = int_range(1, MAX_TOKENS)


def _batch_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"batch sizes must be integers, got {text!r}") from None
    if not sizes or min(sizes) <= 0 or max(sizes) > MAX_BATCH:
        raise argparse.ArgumentTypeError(
            f"batch sizes must be integers in [1, {MAX_BATCH:,}], got {text!r}"
        )
    return sizes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "utilization",
        help="naive vs paged KV slot utilization and shared-prompt block counts ([paged-sim])",
        description=(
            "Fill a contiguous cache (max-length reservation) and a paged cache with the "
            "same requests and print each one's live / reserved slots per batch size; then "
            "count the device blocks 10 requests with one shared system prompt use with "
            "and without sharing. Defaults reproduce [paged-sim]'s experiment."
        ),
    )
    p.add_argument(
        "--batch-sizes",
        type=_batch_sizes,
        default=list(SEED002_BATCH_SIZES),
        help="comma-separated batch sizes (default 10,25,50,100,200)",
    )
    add_block_size_option(p)
    p.add_argument("--max-len", type=_length, default=2048, help="naive reservation per request")
    p.add_argument(
        "--mean",
        type=float_range(0.0, MAX_TOKENS, lo_open=True),
        default=500.0,
        help="mean request length (500)",
    )
    p.add_argument(
        "--std",
        type=float_range(0.0, MAX_TOKENS),
        default=200.0,
        help="std of request length (200)",
    )
    p.add_argument("--min-len", type=_length, default=200, help="lengths clipped below (200)")
    p.add_argument(
        "--seed", type=seed_int, default=42, help="legacy numpy seed (42, as in [paged-sim])"
    )
    p.add_argument("--system-prompt", type=_length, default=200, help="shared prompt tokens (200)")
    p.add_argument(
        "--shared-requests",
        type=int_range(1, MAX_BATCH),
        default=10,
        help="requests sharing it (10)",
    )
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument(
        "--results",
        metavar="RUN_ID",
        help="also append the figures as result rows to out/results/RUN_ID.jsonl",
    )
    p.set_defaults(func=run)


def _record(
    run_id: str, rows: list[UtilizationRow], sharing: dict, args: argparse.Namespace
) -> None:
    from kvbench.reports.store.writer import ResultWriter

    with ResultWriter(run_id) as writer:
        for row in rows:
            case = {"batch_size": row.batch_size, "block_size": args.block_size}
            case["max_len"] = args.max_len
            writer.record_many(
                SUITE,
                case,
                [
                    ("naive_utilization", row.naive_utilization, "ratio"),
                    ("paged_utilization", row.paged_utilization, "ratio"),
                ],
            )
        case = {k: sharing[k] for k in ("requests", "prompt_len", "block_size")}
        writer.record_many(
            "paged.sharing",
            case,
            [
                (name, float(sharing[name]), "blocks")
                for name in ("no_sharing", "fork_sharing", "after_one_diverges", "prefix_caching")
            ],
        )


def run(args: argparse.Namespace) -> int:
    if args.min_len > args.max_len:
        raise ConfigError(f"--min-len {args.min_len} is above --max-len {args.max_len}")
    if args.results:
        from kvbench.reports.store.files import DEFAULT_RESULTS_DIR
        from kvbench.reports.store.writer import check_appendable, check_run_id

        check_appendable(Path(DEFAULT_RESULTS_DIR) / f"{check_run_id(args.results)}.jsonl")
    batches = seed002_lengths(
        args.batch_sizes,
        seed=args.seed,
        mean=args.mean,
        std=args.std,
        min_len=args.min_len,
        max_len=args.max_len,
    )
    blocks = sum(int(((b + args.block_size - 1) // args.block_size).sum()) for b in batches)
    shared = args.shared_requests * (-(-args.system_prompt // args.block_size) + 1)
    if max(blocks, shared) > MAX_BLOCKS:
        raise ConfigError(
            f"these options fill {max(blocks, shared):,} blocks of {args.block_size} tokens; "
            f"this command fills at most {MAX_BLOCKS:,}: use smaller batches, lengths or a "
            "larger --block-size"
        )
    rows = [
        measure_batch(b, args.block_size, args.max_len)
        for b in tqdm(batches, desc="filling caches", unit="batch", disable=None, leave=False)
    ]
    sharing = shared_prompt_blocks(args.shared_requests, args.system_prompt, args.block_size)
    if args.results:
        _record(args.results, rows, sharing.as_dict(), args)
    if args.format == "json":
        print(
            json.dumps(
                {"utilization": [r.as_dict() for r in rows], "sharing": sharing.as_dict()},
                indent=2,
            )
        )
        return 0
    print(
        f"Slot utilization (live / reserved), lengths normal({args.mean:g}, {args.std:g}) "
        f"clipped to [{args.min_len}, {args.max_len}], block {args.block_size}, seed {args.seed}"
    )
    print(f"{'batch':>6} {'live tokens':>12} {'naive':>8} {'paged':>8} {'paged blocks':>13}")
    for r in rows:
        print(
            f"{r.batch_size:>6} {r.live_tokens:>12} {r.naive_utilization:>8.1%} "
            f"{r.paged_utilization:>8.1%} {r.paged_blocks:>13}"
        )
    print("[paged-sim] reports: naive about 24%, paged about 98.5%")
    s = sharing
    print(
        f"\nShared {s.prompt_len}-token system prompt across {s.requests} requests "
        f"(device blocks of {s.block_size} tokens):"
    )
    print(f"  no sharing                     {s.no_sharing:>5}")
    print(f"  fork sharing (copy-on-write)   {s.fork_sharing:>5}")
    print(f"  ... after one request diverges {s.after_one_diverges:>5}")
    print(f"  automatic prefix caching       {s.prefix_caching:>5}  (full blocks only)")
    print("[paged-sim] reports: 130 pages naive vs 13 with copy-on-write sharing")
    return 0
