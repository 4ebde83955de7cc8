"""`kvbench rate`: latency against request rate (or a trace's time scale), the sustained
rate and, with an SLO, goodput and the highest load within it.

Examples:
    kvbench rate --setup opt-13b-1xa100-40gb --workload sharegpt --rates 1,2,3,4
    kvbench rate --setup opt-66b-4xa100-40gb --system paged,contiguous-max --bound 0.25
    kvbench rate --setup opt-13b-1xa100-40gb --rates 1,2 --burstiness 0.5 \
        --slo-ttft 1 --slo-tpot 0.1 --max-concurrency 64
    kvbench rate --setup llama-3-70b-8xh100-tp8 --trace conv.jsonl --time-scale 0.25,0.5 \
        --system paged --slo-ttft 2 --slo-tpot 0.1
    kvbench rate --list

For each system, the workload's requests arrive for `--duration` seconds at each rate, as
a Poisson process or, with `--burstiness B`, with gamma gaps of shape B (vLLM's
`--burstiness`: 1 is Poisson, lower is burstier), and are served on the set-up's time
model (`paged.serving.rate`). With `--trace FILE` the trace's own arrivals are replayed instead,
divided by each `--time-scale` (2 = twice as fast), with prefix caching in the paged
cache. The table gives mean and p99 normalized latency (s/token), TTFT p50 and p99 (s),
TPOT p99 (s) and requests/s; with `--slo-ttft` / `--slo-tpot` (seconds) also goodput
(requests/s meeting both bounds, as `vllm bench serve --goodput`) and SLO attainment
(the fraction that does; `paged.serving.slo`). `--max-concurrency N` lets at most N requests be
in flight at once (the rest wait outside, as vLLM's client does; their latency counts
from when they are let in). With `--knee` (default on) it searches each system's
sustained rate: the highest rate (time scale) whose mean normalized latency stays under
`--bound` (s/token; default 10 x the set-up's one-sequence decode step), and, with an
SLO, the highest rate (time scale) whose p99 TTFT and p99 TPOT stay within it
(`paged.serving.replay.slo_search`). Everything is modeled. Bad values (a rate, scale, bound or
SLO outside its range, an unknown system, workload or set-up, options that do not go
together) and a set-up whose weights and KV exceed its devices are refused before
anything runs: exit 2, one line. Ranges: rates [1e-3, 1e6] requests/s, time scales
[1e-6, 1e6] (and the trace's last arrival divided by each within 2^22 s,
`workloads.trace.MAX_ARRIVAL_S`), --duration [1e-3, 86,400] s, --bound [1e-6, 3,600]
s/token, and the load options' (`load_args`).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from kvbench.suites.cli.argtypes import float_range, int_range
from kvbench.suites.cli.load_args import MIN_BOUND_S, add_load_args, slo_from_args
from kvbench.suites.cli.workload import MAX_REQUESTS
from kvbench.workloads.errors import ConfigError

_COLUMNS = (
    "system",
    "load",
    "norm lat mean",
    "norm lat p99",
    "ttft p50",
    "ttft p99",
    "tpot p99",
    "req/s",
    "tok/s",
)
_SLO_COLUMNS = ("goodput", "SLO met")
#: Range of a request rate given with --rates [requests/s]: below one request in 1,000 s
#: the first arrival alone can pass the latest arrival a trace may have (2^22 s).
RATE_RANGE = (1e-3, 1e6)


def _within(what: str, lo: float, hi: float, check: Callable[[float], float]):  # type: ignore[no-untyped-def]
    """`check`, then ConfigError naming `what` for a value outside [lo, hi]."""

    def checked(value: float) -> float:
        value = check(value)
        if not lo <= value <= hi:
            raise ConfigError(f"{what} {value:g} is outside [{lo:g}, {hi:g}]")
        return value

    return checked


def _floats(text: str, what: str, check: Callable[[float], float]) -> list[float]:
    """The comma-separated numbers of `text`, each passed through `check`."""
    out = []
    for part in str(text).split(","):
        try:
            value = float(part)
        except ValueError:
            raise ConfigError(f"{what} {part.strip()!r} is not a number") from None
        out.append(check(value))
    return out


def _check_combination(args: argparse.Namespace) -> None:
    """Refuse options that do not go together (before anything runs)."""
    if args.trace is not None:
        from kvbench.suites.cli.argtypes import check_input_file

        check_input_file(args.trace, "--trace")
        for name, value in (("--rates", args.rates), ("--burstiness", args.burstiness)):
            if value is not None:
                raise ConfigError(f"{name} is for generated arrivals, not --trace")
        if args.duration is not None:
            raise ConfigError("--duration is for generated arrivals, not --trace")
    elif args.time_scale is not None:
        raise ConfigError("--time-scale needs --trace (it scales a trace's own arrivals)")


def run(args: argparse.Namespace) -> int:
    from kvbench.paged.serving.rate import (
        SYSTEMS,
        RateTrace,
        check_bound,
        check_positive,
        check_rate,
        check_system,
        latency_floor,
        run_at_rate,
        run_system,
        sustained_rate,
    )
    from kvbench.paged.serving.replay import slo_search
    from kvbench.paged.serving.simulation import setup_time_model
    from kvbench.workloads.setups import SETUPS, get_setup
    from kvbench.workloads.sharing import generate
    from kvbench.workloads.time_scale import (
        MAX_TIME_SCALE,
        MIN_TIME_SCALE,
        check_scaled_arrivals,
        check_time_scale,
        time_scaled,
    )
    from kvbench.workloads.trace import Trace

    if args.list:
        for known in SETUPS.values():
            print(f"{known.name:24s} {known.kv_slots():>8,} slots  {known.source}")
        return 0
    setup = get_setup(args.setup)
    setup.check_fits()
    systems = list(SYSTEMS) if args.system == "all" else args.system.split(",")
    for s in systems:
        check_system(s.strip())
    _check_combination(args)
    slo = slo_from_args(args)
    floor = latency_floor(setup_time_model(setup))
    bound = 10 * floor if args.bound is None else check_bound(args.bound)
    cap = args.max_concurrency or 0
    if args.trace is not None:
        scale = _within(
            "--time-scale",
            MIN_TIME_SCALE,
            MAX_TIME_SCALE,
            lambda v: check_time_scale(v, "--time-scale"),
        )
        loads = _floats(args.time_scale or "1", "--time-scale", scale)
        trace = Trace.read(args.trace)
        for x in loads:
            check_scaled_arrivals(trace, x, "--time-scale")

        def measure(system: str, x: float) -> dict[str, float]:
            return run_system(
                setup,
                system,
                time_scaled(trace, x, "time scale"),
                max_concurrency=cap,
                slo=slo,
                prefix_caching=True,
            )

        unit, limit, what = "x", math.inf, f"{args.trace}, time scale"
    else:
        loads = _floats(args.rates or "1,2,3,4", "rate", _within("rate", *RATE_RANGE, check_rate))
        duration = 300.0 if args.duration is None else check_positive("duration", args.duration)
        need = int(max(loads) * duration * 4) + 64
        if need > MAX_REQUESTS:
            raise ConfigError(
                f"rate {max(loads):g} requests/s for {duration:g} s needs a trace of {need:,} "
                f"requests; at most {MAX_REQUESTS:,}: use lower --rates or a shorter --duration"
            )
        burst = 1.0 if args.burstiness is None else args.burstiness
        rtrace = RateTrace.make(generate(args.workload, need, seed=args.seed), args.seed, burst)

        def measure(system: str, x: float) -> dict[str, float]:
            return run_at_rate(setup, system, rtrace, x, duration, max_concurrency=cap, slo=slo)

        unit, limit = " requests/s", rtrace.max_rate(duration)
        what = (
            f"{args.workload}, {'Poisson' if burst == 1 else f'gamma (burstiness {burst:g})'} rate"
        )
    rows = []
    for s in systems:
        for x in loads:
            m = measure(s, x)
            row = [
                s,
                f"{x:g}",
                f"{m['normalized_latency_mean']:.4f}",
                f"{m['normalized_latency_p99']:.4f}",
                f"{m['ttft_p50']:.3f}",
                f"{m['ttft_p99']:.3f}",
                f"{m['tpot_p99']:.4f}",
                f"{m['requests_per_second']:.2f}",
                f"{m['tokens_per_second']:.0f}",
            ]
            if slo is not None:
                row += [f"{m['goodput']:.2f}", f"{m['slo_attainment']:.1%}"]
            rows.append(row)
    cap_text = f", at most {cap} requests in flight" if cap else ""
    print(
        f"{setup.name}, {what}{cap_text}: modeled; normalized latency in s/token, TTFT and "
        "TPOT in s, goodput in requests/s"
        + (f" meeting {slo.describe()}" if slo is not None else "")
    )
    columns = _COLUMNS + (_SLO_COLUMNS if slo is not None else ())
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
    if args.knee:
        start = loads[len(loads) // 2]
        print(f"sustained load (mean normalized latency <= {bound:.4g} s/token):")
        for s in systems:

            def mean_latency(r: float, s: str = s) -> float:
                return measure(s, r)["normalized_latency_mean"]

            x, seen = sustained_rate(mean_latency, bound, start, limit=limit)
            print(f"  {s:18s} {_load_text(x, unit, limit, seen)}")
        if slo is not None:
            print(f"highest load with p99 within the SLO ({slo.describe()}):")
            for s in systems:

                def latency(r: float, s: str = s) -> dict[str, dict[str, float]]:
                    return _latency(measure(s, r))

                x, seen = slo_search(latency, slo, start, limit=limit)
                print(f"  {s:18s} {_load_text(x, unit, limit, seen)}")
    return 0


def _latency(m: dict[str, float]) -> dict[str, dict[str, float]]:
    """The p99s of a flat row as the latency summary `slo_search` reads."""
    return {"ttft": {"p99": m["ttft_p99"]}, "tpot": {"p99": m["tpot_p99"]}}


def _load_text(x: float, unit: str, limit: float, seen: dict[float, float]) -> str:
    """A search's answer: the load found, or "below X" where even the lowest load it
    tried (X) missed the bound (the search's 0.0 means "below", never "none")."""
    if x <= 0 and seen:
        return f"below {min(seen):.3g}{unit} (the lowest load tried)"
    more = " or more (the trace's requests ran out)" if x >= limit else ""
    return f"{x:.3g}{unit}{more}"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "rate",
        help="modeled latency vs request rate or time scale per system, goodput, sustained load",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--setup", default="opt-13b-1xa100-40gb", help="serving set-up (--list)")
    p.add_argument("--workload", default="sharegpt", help="sharegpt | alpaca | ...")
    p.add_argument("--trace", default=None, help="replay this trace's own arrivals instead")
    p.add_argument("--system", default="all", help="comma-separated systems, or 'all'")
    p.add_argument("--rates", default=None, help="comma-separated requests/s (1,2,3,4)")
    p.add_argument(
        "--time-scale",
        default=None,
        help="with --trace: comma-separated time scales (arrivals / scale; 1)",
    )
    add_load_args(p, "gamma arrivals of this shape (1: Poisson, the default; < 1 burstier)")
    p.add_argument(
        "--bound",
        type=float_range(MIN_BOUND_S, 3600.0),
        default=None,
        help="latency bound, s/token",
    )
    p.add_argument(
        "--duration",
        type=float_range(1e-3, 86_400.0),
        default=None,
        help="seconds of arrivals (300)",
    )
    p.add_argument("--seed", type=int_range(0, 2**63 - 1), default=0)
    p.add_argument("--no-knee", dest="knee", action="store_false", help="skip the load searches")
    p.add_argument("--list", action="store_true", help="list the serving set-ups and exit")
    p.set_defaults(func=run)
