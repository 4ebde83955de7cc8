"""`kvbench rate`: normalized latency against Poisson request rate, and the sustained rate.

Examples:
    kvbench rate --setup opt-13b-1xa100-40gb --workload sharegpt --rates 1,2,3,4
    kvbench rate --setup opt-66b-4xa100-40gb --system paged,contiguous-max --bound 0.25
    kvbench rate --list

For each system, the workload's requests arrive as a Poisson process for `--duration`
seconds at each rate and are served on the set-up's time model (`paged.serving.rate`); the table
gives mean and p99 normalized latency (s/token), TTFT p50 and requests/s. With
`--knee` (default on) it searches each system's sustained rate: the highest rate whose
mean normalized latency stays under `--bound` (s/token; default 10 x the set-up's
one-sequence decode step). Everything is modeled. Bad values (a rate or bound that is
not a finite number > 0, an unknown system, workload or set-up) and a set-up whose
weights and KV exceed its devices are refused before anything runs: exit 2, one line.
"""

from __future__ import annotations

import argparse

from kvbench.suites.cli.argtypes import float_range, int_range
from kvbench.suites.cli.workload import MAX_REQUESTS
from kvbench.workloads.errors import ConfigError

_COLUMNS = ("system", "rate", "norm lat mean", "norm lat p99", "ttft p50", "req/s", "tok/s")


def _floats(text: str, what: str) -> list[float]:
    from kvbench.paged.serving.rate import check_rate

    out = []
    for part in str(text).split(","):
        try:
            value = float(part)
        except ValueError:
            raise ConfigError(f"{what} {part.strip()!r} is not a number") from None
        out.append(check_rate(value))
    return out


def run(args: argparse.Namespace) -> int:
    from kvbench.paged.serving.rate import (
        SYSTEMS,
        RateTrace,
        check_bound,
        check_positive,
        check_system,
        latency_floor,
        run_at_rate,
        sustained_rate,
    )
    from kvbench.paged.serving.simulation import setup_time_model
    from kvbench.workloads.setups import SETUPS, get_setup
    from kvbench.workloads.sharing import generate

    if args.list:
        for s in SETUPS.values():
            print(f"{s.name:24s} {s.kv_slots():>8,} slots  {s.source}")
        return 0
    setup = get_setup(args.setup)
    setup.check_fits()
    systems = list(SYSTEMS) if args.system == "all" else args.system.split(",")
    for s in systems:
        check_system(s.strip())
    rates = _floats(args.rates, "rate")
    duration = 300.0 if args.duration is None else check_positive("duration", args.duration)
    floor = latency_floor(setup_time_model(setup))
    bound = 10 * floor if args.bound is None else check_bound(args.bound)
    need = int(max(rates) * duration * 4) + 64
    if need > MAX_REQUESTS:
        raise ConfigError(
            f"rate {max(rates):g} requests/s for {duration:g} s needs a trace of {need:,} "
            f"requests; at most {MAX_REQUESTS:,}: use lower --rates or a shorter --duration"
        )
    trace = RateTrace.make(generate(args.workload, need, seed=args.seed), args.seed)
    rows = []
    for s in systems:
        for r in rates:
            m = run_at_rate(setup, s, trace, r, duration)
            rows.append(
                (
                    s,
                    f"{r:g}",
                    f"{m['normalized_latency_mean']:.4f}",
                    f"{m['normalized_latency_p99']:.4f}",
                    f"{m['ttft_p50']:.3f}",
                    f"{m['requests_per_second']:.2f}",
                    f"{m['tokens_per_second']:.0f}",
                )
            )
    print(f"{setup.name}, {args.workload}: modeled; normalized latency in s/token, TTFT in s")
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(_COLUMNS)]
    print("  ".join(c.rjust(w) for c, w in zip(_COLUMNS, widths, strict=True)))
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
    if args.knee:
        print(f"sustained rate (mean normalized latency <= {bound:.4g} s/token):")
        limit = trace.max_rate(duration)
        for s in systems:
            rate, _ = sustained_rate(
                lambda r, s=s: run_at_rate(setup, s, trace, r, duration)["normalized_latency_mean"],
                bound,
                rates[len(rates) // 2],
                limit=limit,
            )
            more = " or more (the trace's requests ran out)" if rate >= limit else ""
            print(f"  {s:18s} {rate:.3g} requests/s{more}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "rate",
        help="modeled latency vs Poisson request rate per system, and the sustained rate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--setup", default="opt-13b-1xa100-40gb", help="serving set-up (--list)")
    p.add_argument("--workload", default="sharegpt", help="sharegpt | alpaca | ...")
    p.add_argument("--system", default="all", help="comma-separated systems, or 'all'")
    p.add_argument("--rates", default="1,2,3,4", help="comma-separated requests/s")
    p.add_argument(
        "--bound",
        type=float_range(0.0, 3600.0, lo_open=True),
        default=None,
        help="latency bound, s/token",
    )
    p.add_argument(
        "--duration",
        type=float_range(0.0, 86_400.0, lo_open=True),
        default=None,
        help="seconds of arrivals (300)",
    )
    p.add_argument("--seed", type=int_range(0, 2**63 - 1), default=0)
    p.add_argument("--no-knee", dest="knee", action="store_false", help="skip the knee search")
    p.add_argument("--list", action="store_true", help="list the serving set-ups and exit")
    p.set_defaults(func=run)
