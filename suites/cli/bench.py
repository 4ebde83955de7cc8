"""`kvbench bench`: run the bench sweeps into the results store.

    kvbench bench                      # the default grid (<= 10 min on a 2-core CPU)
    kvbench bench --full               # the whole grid (meant for a GPU)
    kvbench bench --only kernel.decode utilization.static
    kvbench bench --only kernel.       # every sweep whose name starts with 'kernel.'
    kvbench bench --shard 3/8          # every 8th case, starting with the 3rd (Slurm arrays)
    kvbench bench --resume RUN         # measure only the cases RUN has not finished
    kvbench bench --list               # the sweeps, their case counts, and what they wait for

Every case's rows are appended (and fsynced) as soon as it is measured, so Ctrl-C or a
kill loses only the case in flight. Shard files join with `kvbench merge`.
"""

from __future__ import annotations

import argparse
import sys

from kvbench.reports.store.files import DEFAULT_RESULTS_DIR
from kvbench.suites.bench.harness import TimingConfig
from kvbench.suites.cli.argtypes import check_output_dir, int_range, run_id_arg


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `bench` subcommand."""
    p = subparsers.add_parser(
        "bench",
        help="run benchmark sweeps into out/results/<run-id>.jsonl",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--only", nargs="+", metavar="NAME", help="sweeps to run (default: all)")
    p.add_argument("--full", action="store_true", help="the whole grid, not the default one")
    p.add_argument("--shard", metavar="K/N", help="run shard K of N (1-based)")
    p.add_argument("--resume", metavar="RUN", help="continue RUN, skipping finished cases")
    p.add_argument(
        "--run-id", type=run_id_arg, help="id of the new run (default: time + random suffix)"
    )
    p.add_argument("--out-dir", default=DEFAULT_RESULTS_DIR, help="results folder (%(default)s)")
    p.add_argument(
        "--repeats",
        type=int_range(1, 100_000),
        default=15,
        help="timed repeats per case (%(default)s)",
    )
    p.add_argument(
        "--warmup",
        type=int_range(0, 100_000),
        default=3,
        help="warm-up calls per case (%(default)s)",
    )
    p.add_argument(
        "--seed", type=int_range(0, 2**32 - 1), default=0, help="seed of the random workloads"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--list", action="store_true", help="list sweeps and exit")
    p.set_defaults(func=run)


def _list(args: argparse.Namespace) -> int:
    from kvbench.suites.bench import catalog  # noqa: F401
    from kvbench.suites.bench.registry import select

    for sw in select(args.only, full=True):
        missing = sw.missing()
        state = (
            f"waiting for {', '.join(missing)}" if missing else f"{len(sw.cases(args.full))} cases"
        )
        if not sw.in_default:
            state += " (only when named, or --full)"
        print(f"{sw.name:<28} {state:<34} {sw.description}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Run the bench; 0 when every case was measured, 1 when some case failed."""
    from kvbench.suites.bench.runner import Shard, run_bench

    if args.list:
        return _list(args)
    shard = Shard.parse(args.shard) if args.shard else None
    check_output_dir(args.out_dir, "--out-dir")
    timing = TimingConfig(warmup=args.warmup, repeats=args.repeats)
    try:
        result = run_bench(
            args.only,
            full=args.full,
            shard=shard,
            resume=args.resume,
            run_id=args.run_id,
            out_dir=args.out_dir,
            timing=timing,
            progress=not args.no_progress,
            seed=args.seed,
        )
    except KeyboardInterrupt:
        sys.stderr.write(
            "kvbench bench: interrupted; every finished case is saved. "
            "Continue with: kvbench bench --resume latest (plus the same options)\n"
        )
        return 130
    for name, missing in result.waiting.items():
        print(f"skipped {name}: waiting for {', '.join(missing)}")
    print(
        f"run {result.run_id}: measured {result.measured} cases"
        + (f", skipped {result.skipped_done} already measured" if result.skipped_done else "")
        + f" in {result.wall_s:.1f} s -> {result.path}"
    )
    print(claims_line(result.path))
    for case, why in result.failures:
        print(f"FAILED {case}: {why}", file=sys.stderr)
    return 1 if result.failures else 0


def claims_line(path) -> str:  # type: ignore[no-untyped-def]
    """'claims: 3 hold, 1 does not hold, 2 not applicable here, 14 not measured (of 20)'
    for the run at `path`: every verdict counted, so the counts add up to the total."""
    from kvbench.reports import claims
    from kvbench.reports.store.reader import load_run

    verdicts = [v.verdict for _, v in claims.evaluate(load_run(path).frame())]
    parts = [label for _, label in claims.verdict_counts(verdicts)]
    return f"claims: {', '.join(parts)} (of {len(verdicts)}; `kvbench report` shows each one)"
