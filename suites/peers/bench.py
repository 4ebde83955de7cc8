"""Peer benches: kvbench beside vLLM (and any plug-in) on identical work, ratios in one run.

    python -m kvbench.suites.peers.bench [--full] [--quick] [--only pool_ops trace_replay ...]
                                 [--run-id ID] [--out-dir DIR] [--report [--site-dir DIR]]

A thin front end over the registered `peers.*` sweeps (suites/bench/sweeps/peers.py),
the same as `kvbench bench --only peers.`: peers.pool_ops (block-pool ops per second),
peers.trace_replay (5k-request trace; 100k as well with --full) and peers.cpu_decode
(kvbench torch path vs vLLM's native op vs contiguous SDPA, batch 8 x context 512 / 2048
by default, batch 8-32 x context 512-4096 with --full, block sizes 16 and 32 for both
peers). Rows are appended to out/results/<run-id>.jsonl as each case finishes; peers that
are not installed are logged and left out (never faked). `--report` then builds the site
(out/site/peers.html shows kvbench beside the peers).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from kvbench.reports.results import DEFAULT_RESULTS_DIR
from kvbench.suites.bench.harness import TimingConfig

SWEEPS = ("pool_ops", "trace_replay", "cpu_decode")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the peer sweeps; 0 when every case was measured, 1 when one failed."""
    parser = argparse.ArgumentParser(
        prog="python -m kvbench.suites.peers.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--only", nargs="+", choices=SWEEPS, help="peer sweeps to run")
    parser.add_argument("--full", action="store_true", help="the whole grid (100k trace)")
    parser.add_argument("--quick", action="store_true", help="few timing repeats (smoke run)")
    parser.add_argument("--run-id", default=None, help="id of the new run (default: new)")
    parser.add_argument("--out-dir", default=DEFAULT_RESULTS_DIR, help="results folder")
    parser.add_argument("--report", action="store_true", help="build the site afterwards")
    parser.add_argument("--site-dir", default="out/site", help="where --report writes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from kvbench.suites.bench.runner import run_bench

    timing = TimingConfig(warmup=1, repeats=3) if args.quick else TimingConfig(repeats=7)
    result = run_bench(
        [f"peers.{s}" for s in (args.only or SWEEPS)],
        full=args.full,
        run_id=args.run_id,
        out_dir=args.out_dir,
        timing=timing,
    )
    print(f"run {result.run_id}: measured {result.measured} cases -> {result.path}")
    for case, why in result.failures:
        print(f"FAILED {case}: {why}", file=sys.stderr)
    if args.report:
        from kvbench.reports.results import load_runs
        from kvbench.reports.site import build_site

        index = build_site(load_runs([str(result.path)], args.out_dir), args.site_dir)
        print(f"report: {index.parent / 'peers.html'}")
    return 1 if result.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
