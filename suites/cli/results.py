"""`kvbench results`: list the runs in the results store, or export runs as CSV / parquet.

    kvbench results                         # one line per run: id, time, device, rows, suites
    kvbench results --dir out/results
    kvbench results --export RUN [RUN ...] --to out/table.csv   (or .parquet with pyarrow)

Corrupt lines are counted in the listing (and logged with file and line by -v).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvbench.reports.store.files import DEFAULT_RESULTS_DIR, run_files
from kvbench.reports.store.frame import export_frame, to_frame
from kvbench.reports.store.reader import load_runs, summarize
from kvbench.reports.store.schema import ResultsError
from kvbench.suites.cli.argtypes import check_output_file, folder_arg


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `results` subcommand."""
    p = subparsers.add_parser(
        "results",
        help="list runs in the results store; export them as CSV or parquet",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--dir", type=folder_arg, default=DEFAULT_RESULTS_DIR, help="results folder (%(default)s)"
    )
    p.add_argument(
        "--export",
        nargs="+",
        metavar="RUN",
        help="runs to export (run ids, unique prefixes, paths, or 'latest')",
    )
    p.add_argument("--to", metavar="FILE", help="export target: a .csv or .parquet file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """List or export runs; returns the exit status."""
    if args.export:
        if not args.to:
            raise ResultsError("--export needs --to FILE.csv (or FILE.parquet)")
        check_output_file(args.to, "--to")
        if Path(args.to).suffix.lower() not in (".csv", ".parquet"):
            raise ResultsError(f"cannot export to {args.to}: use a .csv or .parquet file name")
        runs = load_runs(args.export, args.dir)
        frame = to_frame(runs)
        if frame.empty:
            raise ResultsError(f"nothing to export: {', '.join(args.export)} hold no rows")
        path = export_frame(frame, args.to)
        print(f"wrote {len(frame)} rows of {len(runs)} run(s) to {path}")
        return 0
    if args.to:
        raise ResultsError("--to needs --export RUN")
    files = run_files(args.dir)
    if not files:
        print(f"no runs in {args.dir}")
        return 0
    runs = load_runs(None, args.dir)
    header = f"{'run':<26} {'started (UTC)':<20} {'device':<18} {'git':<13} {'rows':>6} {'bad':>4}  suites"
    print(header)
    for r in runs:
        s = summarize(r)
        git = s.git_revision + ("+" if s.git_dirty else "")
        suites = ", ".join(s.suites) if s.suites else "(empty)"
        notes = [f"incomplete: {s.ended} of {s.planned} cases"] if s.incomplete else []
        notes += [f"{n} {what}" for n, what in ((s.failed, "failed"), (s.skipped, "skipped")) if n]
        suites += f"  [{'; '.join(notes)}]" if notes else ""
        print(
            f"{s.run_id:<26} {s.created[:19]:<20} {s.device[:18]:<18} {git:<13} "
            f"{s.rows:>6} {s.problems:>4}  {suites}"
        )
    sys.stdout.flush()
    return 0
