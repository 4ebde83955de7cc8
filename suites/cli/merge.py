"""`kvbench merge`: join the result files of a sharded bench (`--shard K/N`) into one run.

    kvbench merge RUN_A RUN_B ... [--into RUN_ID]

The parts must be the shards of one sharded bench: the same sweeps, grid, seed and
shard count, each shard once, all of them (or `--allow-incomplete`, and the merged run
says which are missing). Everything is checked before anything is written: a refused
merge changes no file. The merged header records every part's run id and environment, and
is a bench header, so a plain `kvbench report` reports the merged run. A case measured by
more than one part keeps the first part's rows (and says how many were dropped).
"""

from __future__ import annotations

import argparse

from kvbench.reports.store.files import DEFAULT_RESULTS_DIR
from kvbench.reports.store.merge import merge_runs
from kvbench.reports.store.reader import load_runs
from kvbench.suites.cli.argtypes import folder_arg, run_id_arg


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `merge` subcommand."""
    p = subparsers.add_parser(
        "merge",
        help="join shard result files into one run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="run ids, prefixes or paths")
    p.add_argument(
        "--into",
        metavar="RUN_ID",
        type=run_id_arg,
        help="id of the merged run (default: new id)",
    )
    p.add_argument(
        "--allow-incomplete",
        action="store_true",
        help="merge even when some shards are missing (the report marks the run incomplete)",
    )
    p.add_argument(
        "--dir", type=folder_arg, default=DEFAULT_RESULTS_DIR, help="results folder (%(default)s)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Merge the runs; returns the exit status."""
    runs = load_runs(args.runs, args.dir)
    path, kept, dupes = merge_runs(
        runs, args.into, args.dir, allow_incomplete=args.allow_incomplete
    )
    extra = f"; dropped {dupes} duplicate rows" if dupes else ""
    print(f"merged {len(runs)} runs into {path}: {kept} rows{extra}")
    return 0
