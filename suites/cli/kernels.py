"""`kvbench kernels`: compile every kernel configuration for sm_80 and sm_90 (no GPU needed)
and show what each costs.

    kvbench kernels                      # the full table, rows written to out/results
    kvbench kernels --headline           # the representative float16 / head dim 128 set
    kvbench kernels --arch 90 --no-results
    kvbench kernels --json out/aot.json  # the records as a JSON list as well
    kvbench kernels --peers              # vLLM's Triton attention kernels beside kvbench's

Rows go to the results store (suite "kernels.aot", one row per metric: registers,
spills, shared_bytes, sass_instructions; case: kernel, arch, config as canonical JSON,
triton version, kernel source hash). Records are cached under out/aot, so a repeated run
is quick. Exit status 1 when any configuration spills or exceeds a limit.

`--peers` compiles vLLM's Triton kernels (unified attention, split-KV decode, the KV
write) with the configurations vLLM's launchers choose for fp16 / bf16, head dims 64 /
128, blocks 16 / 32 (suites/peers/vllm_aot.py) and tables them beside kvbench's own
kernels for the same shapes; rows go to suite "kernels.aot.peers". Without vLLM
installed it says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from kvbench.kernels import aot
from kvbench.reports.store.files import DEFAULT_RESULTS_DIR
from kvbench.reports.store.writer import ResultWriter, check_appendable
from kvbench.suites.cli.argtypes import (
    check_output_dir,
    check_output_file,
    int_range,
    run_id_arg,
)

SUITE = "kernels.aot"

#: Config keys shown in the table (others are in the rows and the JSON).
_SHOWN = ("dtype", "D_PAD", "QH", "SINGLE", "BLOCK_M", "TILE_N", "SRC_IDENTITY", "num_warps")


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `kernels` subcommand."""
    p = subparsers.add_parser(
        "kernels",
        help="compile every kernel configuration for sm_80/sm_90 and show their costs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--arch", type=int, nargs="+", choices=aot.ARCHS, default=list(aot.ARCHS))
    p.add_argument("--headline", action="store_true", help="only the representative set")
    p.add_argument("--workers", type=int_range(1, 256), default=None, help="compile processes")
    p.add_argument("--results-dir", default=DEFAULT_RESULTS_DIR, help="(%(default)s)")
    p.add_argument(
        "--run-id", type=run_id_arg, default=None, help="append to this run (default: a new one)"
    )
    p.add_argument("--no-results", action="store_true", help="do not write result rows")
    p.add_argument("--json", type=Path, default=None, help="also write the records here")
    p.add_argument(
        "--peers", action="store_true", help="vLLM's Triton kernels beside kvbench's (needs vLLM)"
    )
    p.set_defaults(func=run)


def format_table(records: list[aot.CompileRecord]) -> str:
    """A fixed-width text table of records, one line each."""
    head = f"{'kernel':<20} {'arch':<6} {'config':<58} {'regs':>5} {'spill':>5} {'shared':>7} {'sass':>6}"
    lines = [head, "-" * len(head)]
    for r in records:
        cfg = " ".join(f"{k}={r.config[k]}" for k in _SHOWN if k in r.config)
        flag = "  <- " + "; ".join(r.violations()) if r.violations() else ""
        lines.append(
            f"{r.kernel:<20} {r.arch:<6} {cfg:<58} {r.registers:>5} {r.spills:>5} "
            f"{r.shared_bytes:>7} {r.sass_instructions:>6}{flag}"
        )
    return "\n".join(lines)


def run_peers(args: argparse.Namespace) -> int:
    """The side-by-side table of vLLM's and kvbench's kernels (exit 2 without vLLM)."""
    from kvbench.suites.peers import vllm_aot
    from kvbench.suites.peers.base import PeerUnavailableError

    try:
        records = vllm_aot.compile_peers_isolated(archs=args.arch, workers=args.workers)
    except PeerUnavailableError as exc:
        print(f"kvbench kernels --peers: {exc}")
        return 2
    print(vllm_aot.format_table(records))
    bad = [r for r in records if r.impl == "kvbench" and r.record.violations()]
    print(
        f"\n{len(records)} kernels x shapes x architectures; kvbench's breaking a rule: {len(bad)}"
    )
    if not args.no_results:
        with ResultWriter(args.run_id, args.results_dir) as writer:
            for row in vllm_aot.as_rows(records):
                writer.record(vllm_aot.SUITE, row["case"], row["metric"], row["value"], row["unit"])
        print(f"wrote {writer.rows_written} rows to {writer.path}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([r.as_dict() for r in records], indent=1))
    return 1 if bad else 0


def run(args: argparse.Namespace) -> int:
    """Compile, print, record; returns 1 if any configuration breaks a rule."""
    if not args.no_results:
        check_output_dir(args.results_dir, "--results-dir")
        if args.run_id is not None:
            check_appendable(Path(args.results_dir) / f"{args.run_id}.jsonl")
    if args.json is not None:
        check_output_file(args.json, "--json")
    if args.peers:
        return run_peers(args)
    cfgs = aot.headline_configs() if args.headline else None
    bar = tqdm(desc="compiling kernels", unit="cfg", leave=False)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    try:
        records = aot.compile_all(cfgs, archs=args.arch, workers=args.workers, progress=progress)
    finally:
        bar.close()
    print(format_table(records))
    bad = [r for r in records if r.violations()]
    print(f"\n{len(records)} configurations x architectures, {len(bad)} breaking a rule")
    if not args.no_results:
        with ResultWriter(args.run_id, args.results_dir) as writer:
            for row in aot.as_rows(records):
                writer.record(SUITE, row["case"], row["metric"], row["value"], row["unit"])
        print(f"wrote {writer.rows_written} rows to {writer.path}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([asdict(r) for r in records], indent=1))
    return 1 if bad else 0
