"""`kvbench gate`: did a change make a kernel slower or heavier than the baseline?

    kvbench gate                                   # measure now, compare with reports/baselines/*.json
    kvbench gate --baseline reports/baselines/sm90.json --candidate RUN
    kvbench gate --update-baseline                 # re-measure (full compile) and rewrite the baselines

Static costs (registers, spills, shared memory, SASS instructions of every kernel
configuration, compiled ahead of time for the architectures the baselines name) are
compared exactly; timing ratios measured within one run (each torch kernel against the
baseline's frozen copy of it side by side, and paged prefill against contiguous SDPA;
interleaved repeats) by a one-sided Mann-Whitney U test plus a minimum effect.

Exit status: 0 pass, 1 regression (or a failed conformance check), 2 unusable input (a
missing, truncated or hand-edited baseline, one from another triton version or for
another device, a bad run). `--update-baseline` refuses (exit 2) a run that failed the
conformance check or whose static costs were reused rather than compiled.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from kvbench.reports.store.environment import utc_now
from kvbench.reports.store.files import DEFAULT_RESULTS_DIR
from kvbench.reports.store.reader import load_run, resolve_run
from kvbench.suites.cli.argtypes import (
    check_output_file,
    float_range,
    folder_arg,
    int_range,
)
from kvbench.suites.gate import (
    Baseline,
    GateInputError,
    Thresholds,
    candidate_from_run,
    evaluate,
    format_table,
    is_arch,
    load_baseline,
    make_baseline,
    normalize_target,
    render_html,
    to_json,
    write_baseline,
)
from kvbench.suites.gate.model import THRESHOLD_RANGES

log = logging.getLogger(__name__)

#: Committed baselines, relative to the repository root.
BASELINE_DIR = Path(__file__).resolve().parents[2] / "reports" / "baselines"


def default_baselines() -> list[Path]:
    """Every committed baseline file (reports/baselines/*.json)."""
    return sorted(BASELINE_DIR.glob("*.json"))


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `gate` subcommand."""
    th = Thresholds()
    p = subparsers.add_parser(
        "gate",
        help="regression gate: compare kernel costs and timing ratios with a baseline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--baseline",
        action="append",
        metavar="FILE",
        help="baseline file (repeatable); default: every reports/baselines/*.json",
    )
    p.add_argument(
        "--candidate",
        metavar="RUN",
        help="an existing run (id, prefix, path or 'latest'); default: measure now",
    )
    p.add_argument(
        "--update-baseline",
        action="store_true",
        help="write the candidate's figures into the baseline file(s) instead of "
        "comparing (measures with a full compile when no --candidate)",
    )
    p.add_argument(
        "--dir", type=folder_arg, default=DEFAULT_RESULTS_DIR, help="results folder (%(default)s)"
    )
    p.add_argument("--json", metavar="FILE", help="also write the verdict as JSON")
    p.add_argument("--html", metavar="FILE", help="also write the verdict as an HTML fragment")
    p.add_argument("--all", action="store_true", help="show passing rows too")
    m = p.add_argument_group("measuring (no --candidate)")
    m.add_argument(
        "--full",
        action="store_true",
        help="compile every configuration even if the kernel sources are unchanged",
    )
    m.add_argument(
        "--repeats", type=int_range(2, 100_000), default=24, help="timing repeats per case (24)"
    )
    m.add_argument(
        "--min-sample",
        type=float_range(0.0, 60.0, lo_open=True),
        default=0.005,
        help="shortest timing sample in seconds (0.005)",
    )
    m.add_argument("--no-timing", action="store_true", help="skip the timing ratios")
    m.add_argument("--no-static", action="store_true", help="skip the static costs")
    m.add_argument(
        "--inject-slowdown",
        type=float_range(0.0, 100.0),
        default=0.0,
        metavar="F",
        help="testing: make every timed candidate (1+F) times slower",
    )
    t = p.add_argument_group("thresholds")
    t.add_argument("--register-slack", type=_threshold("register_slack"), default=th.register_slack)
    t.add_argument(
        "--shared-slack", type=_threshold("shared_slack"), default=th.shared_slack, help="bytes"
    )
    t.add_argument(
        "--sass-pct",
        type=_threshold("sass_pct"),
        default=th.sass_pct,
        help="allowed SASS instruction increase, percent (%(default)s)",
    )
    t.add_argument(
        "--alpha",
        type=float_range(0.0, 1.0, lo_open=True, hi_open=True),
        default=th.alpha,
        help="Mann-Whitney significance level (%(default)s)",
    )
    t.add_argument(
        "--min-effect",
        type=_threshold("min_effect"),
        default=th.min_effect,
        help="smallest median-ratio increase that fails, for ratios against the baseline's "
        "own frozen code (%(default)s = 10%%)",
    )
    t.add_argument(
        "--cross-min-effect",
        type=_threshold("cross_min_effect"),
        default=th.cross_min_effect,
        help="the same for ratios against another kind of work, e.g. paged against SDPA, "
        "which depend on the machine (%(default)s = 30%%)",
    )
    p.set_defaults(func=run)


def _threshold(name: str):  # type: ignore[no-untyped-def]
    """The argparse type of threshold `name`: a finite number in its THRESHOLD_RANGES
    range (a whole number where the threshold counts something)."""
    lo, hi, integer = next((lo, hi, i) for n, lo, hi, i in THRESHOLD_RANGES if n == name)
    return int_range(int(lo), int(hi)) if integer else float_range(lo, hi)


def _target_of(path: Path) -> str:
    """Target of a baseline file: from the file when it is valid, else from its name."""
    if path.is_file():
        try:
            return load_baseline(path).target
        except GateInputError as exc:
            log.info("%s unreadable (%s); taking its target from the file name", path, exc)
    stem = path.stem.lower()
    try:
        return normalize_target(stem)
    except GateInputError:
        raise GateInputError(
            f"cannot tell what {path} is a baseline for: name it cpu.json, cuda.json or "
            "smNN.json (e.g. sm90.json)"
        ) from None


def _measure(args: argparse.Namespace, targets: list[str], reuse: list[Baseline]) -> Path:
    from kvbench.suites.gate.run import MeasureOptions, measure

    archs = [] if args.no_static else [t for t in targets if is_arch(t)]
    timing = None if args.no_timing else next((t for t in targets if not is_arch(t)), None)
    opts = MeasureOptions(
        archs=archs,
        timing_device=timing,
        repeats=args.repeats,
        min_sample_s=args.min_sample,
        slowdown=args.inject_slowdown,
        full=args.full or args.update_baseline,
        reuse_from=reuse,
        frozen_source=next((b.frozen_source for b in reuse if b.frozen_source), None),
    )
    path = measure(opts, args.dir)
    print(f"measured run {path.stem} ({path})", file=sys.stderr)
    return path


def _update(args: argparse.Namespace, paths: list[Path]) -> int:
    targets = [_target_of(p) for p in paths]
    if args.candidate:
        run_path = resolve_run(args.candidate, args.dir)
    else:
        run_path = _measure(args, targets, [])
    candidate = candidate_from_run(load_run(run_path))
    docs = [make_baseline(candidate, t, utc_now()) for t in targets]  # all or nothing
    for path, doc in zip(paths, docs, strict=True):
        write_baseline(doc, path)
        n = doc["counts"]["static"] or doc["counts"]["timing"]
        print(f"wrote {path}: {doc['target']} baseline, {n} entries, from run {candidate.run_id}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Compare (or update); returns the exit status."""
    paths = [Path(b) for b in args.baseline] if args.baseline else default_baselines()
    if not paths:
        raise GateInputError(
            f"no baseline: pass --baseline FILE or commit one under {BASELINE_DIR}"
        )
    for path, what in ((args.json, "--json"), (args.html, "--html")):
        if path:
            check_output_file(path, what)
    th = Thresholds(
        register_slack=args.register_slack,
        shared_slack=args.shared_slack,
        sass_pct=args.sass_pct,
        alpha=args.alpha,
        min_effect=args.min_effect,
        cross_min_effect=args.cross_min_effect,
    )
    if args.update_baseline:
        return _update(args, paths)
    baselines = [load_baseline(p) for p in paths]  # unusable input fails before measuring
    for b in baselines:
        if b.target == "cuda" and not args.candidate and not args.no_timing:
            import torch

            if not torch.cuda.is_available():
                raise GateInputError(
                    f"baseline {b.path} holds cuda timings; this machine has no CUDA device"
                )
    if args.candidate:
        run_path = resolve_run(args.candidate, args.dir)
    else:
        run_path = _measure(args, [b.target for b in baselines], baselines)
    candidate = candidate_from_run(load_run(run_path))
    if args.no_timing or args.no_static:
        baselines = [
            b
            for b in baselines
            if not (args.no_timing and not is_arch(b.target))
            and not (args.no_static and is_arch(b.target))
        ]
    result = evaluate(baselines, candidate, th)
    print(format_table(result, show_all=args.all))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(to_json(result) + "\n", encoding="utf-8")
    if args.html:
        Path(args.html).parent.mkdir(parents=True, exist_ok=True)
        Path(args.html).write_text(render_html(result), encoding="utf-8")
    return result.exit_code
