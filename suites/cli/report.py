"""`kvbench report`: build the static HTML site from result files.

    kvbench report                      # the latest bench run in out/results -> out/site/
    kvbench report RUN [RUN ...]        # run ids, unique prefixes, paths or 'latest'
    kvbench report --all                # every run in the results folder
    kvbench report RUN_A RUN_B          # ... and compare.html puts A and B side by side
    kvbench report --out public/        # write the site anywhere (e.g. for GitHub Pages)

The site needs nothing but the files it writes: no network, no CDN.
"""

from __future__ import annotations

import argparse
import sys

from kvbench.reports.store.files import DEFAULT_RESULTS_DIR
from kvbench.reports.store.reader import load_runs, resolve_run
from kvbench.reports.store.schema import ResultsError
from kvbench.suites.cli.argtypes import check_output_dir, folder_arg


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `report` subcommand."""
    p = subparsers.add_parser(
        "report",
        help="build the HTML report site from result files",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("runs", nargs="*", metavar="RUN", help="runs to report (default: latest)")
    p.add_argument("--all", action="store_true", help="report every run in --dir")
    p.add_argument(
        "--dir", type=folder_arg, default=DEFAULT_RESULTS_DIR, help="results folder (%(default)s)"
    )
    p.add_argument("--out", default="out/site", help="site folder (%(default)s)")
    p.add_argument(
        "--gate",
        nargs="+",
        default=[],
        metavar="JSON",
        help="gate results (`kvbench gate` JSON) to show on gate.html",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Build the site; returns the exit status."""
    from kvbench.reports.site import build_site, check_site_dir

    check_output_dir(args.out, "--out")
    check_site_dir(args.out)
    if args.all and args.runs:
        raise ResultsError("give runs or --all, not both")
    if args.all:
        runs = load_runs(None, args.dir)
        if not runs:
            raise ResultsError(f"no runs in {args.dir}; run `kvbench bench` first")
    else:
        refs = args.runs or [str(resolve_run("latest", args.dir, kind="bench"))]
        paths = [resolve_run(r, args.dir) for r in refs]
        for i, path in enumerate(paths):
            if path.resolve() in {q.resolve() for q in paths[:i]}:
                raise ResultsError(f"run {refs[i]!r} ({path}) is given twice")
        runs = load_runs(paths, args.dir)
    for r in runs:  # refuse before any warning, so a refusal is one line
        if not r.rows:
            why = ""
            if r.problems:
                first = r.problems[0]
                why = (
                    f" ({len(r.problems)} unreadable line(s); first: line {first.line}: "
                    f"{first.message})"
                )
            raise ResultsError(f"run {r.run_id} ({r.path}) has no measurements to report{why}")
    fragments = _gate_fragments(args.gate)
    for r in runs:
        if r.problems:
            first = r.problems[0]
            sys.stderr.write(
                f"kvbench report: warning: skipped {len(r.problems)} bad line(s) of {r.path} "
                f"(first: line {first.line}: {first.message})\n"
            )
    index = build_site(runs, args.out, fragments)
    print(f"wrote {index} ({len(runs)} run(s))")
    return 0


def _gate_fragments(paths: list[str]) -> list[tuple[str, str]]:
    """(file name, HTML fragment) of each gate JSON file."""
    if not paths:
        return []
    import json
    from pathlib import Path

    from kvbench.suites import gate

    out = []
    for p in paths:
        try:
            doc = json.loads(Path(p).read_text(encoding="utf-8"))
            out.append((Path(p).name, gate.render_html(doc)))
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise ResultsError(f"cannot read gate result {p}: {exc}") from exc
    return out
