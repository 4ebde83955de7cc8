"""Load-shape and SLO options shared by `kvbench simulate` and `kvbench rate`.

    --burstiness B        gamma arrival gaps of shape B (1 = Poisson; vLLM's --burstiness)
    --max-concurrency N   at most N requests in flight (vLLM's --max-concurrency)
    --slo-ttft S          TTFT bound of a good request, seconds
    --slo-tpot S          TPOT bound of a good request, seconds (goodput, SLO attainment)

Each is range-checked by its argparse type (`argtypes`), so a bad value is refused in one
line before the command does anything. Ranges: burstiness [1e-3, 1e6]
(`workloads.arrivals.BURSTINESS_RANGE`), TTFT bound [1e-6, 86,400] s, TPOT bound
[1e-6, 3,600] s (under a microsecond no modeled step is that short; a bound of 1e-320 s
means nothing), concurrency [1, 10^7].
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from kvbench.suites.cli.argtypes import float_range, int_range
from kvbench.workloads.arrivals import BURSTINESS_RANGE

if TYPE_CHECKING:
    from kvbench.paged.serving.slo import SLO

#: Most requests a concurrency cap may name (as many as a generated trace may hold).
MAX_CONCURRENCY = 10_000_000
#: Shortest time bound a flag takes [s] (SLOs, latency bounds).
MIN_BOUND_S = 1e-6


def add_load_args(p: argparse.ArgumentParser, burstiness_help: str) -> None:
    """Add --burstiness, --max-concurrency, --slo-ttft and --slo-tpot to `p`."""
    p.add_argument(
        "--burstiness",
        type=float_range(*BURSTINESS_RANGE),
        default=None,
        help=burstiness_help,
    )
    p.add_argument(
        "--max-concurrency",
        type=int_range(1, MAX_CONCURRENCY),
        default=None,
        help="at most this many requests in flight (default: no cap)",
    )
    p.add_argument(
        "--slo-ttft",
        type=float_range(MIN_BOUND_S, 86_400.0),
        default=None,
        help="TTFT bound of a good request, s (goodput, SLO attainment)",
    )
    p.add_argument(
        "--slo-tpot",
        type=float_range(MIN_BOUND_S, 3600.0),
        default=None,
        help="TPOT bound of a good request, s (goodput, SLO attainment)",
    )


def slo_from_args(args: argparse.Namespace) -> SLO | None:
    """The SLO --slo-ttft / --slo-tpot give, or None when neither is given."""
    from kvbench.paged.serving.slo import SLO

    if args.slo_ttft is None and args.slo_tpot is None:
        return None
    return SLO(args.slo_ttft, args.slo_tpot)
