"""serving.rate: normalized latency against Poisson request rate, per system (modeled).

The vLLM paper's end-to-end experiment (Kwon et al., SOSP 2023, Figure 12) replayed on
the engine's time model (`paged.serving.rate`): ShareGPT-like and Alpaca-like requests arrive as
a Poisson process; the systems are paged (kvbench), Orca's three contiguous reservations
(max, pow2, oracle) and request-level batching (static, FasterTransformer-like), all on
the same set-up and KV memory (`workloads.setups`: the paper's OPT-13B on one
A100-40GB, OPT-66B on 4 x A100-40GB and OPT-175B on 8 x A100-80GB; see DEFAULT_NOTE for
what the default run leaves to --full).

Two kinds of case:

* a grid case (`rate` set) serves the trace at that rate: normalized latency (mean and
  p99, s/token), TTFT (p50, p99), requests and output tokens per second;
* a knee case (`bound_factor` set, no `rate`) searches the sustained rate: the highest
  rate whose mean normalized latency stays under bound_factor x the set-up's latency
  floor (one decode step of one sequence; see `paged.serving.rate`); where even the
  lowest rate the search tried misses the bound, the row is `sustained_rate_below` = that
  rate (the answer lies below it; never a sustained rate of 0: `suites.bench.search_rows`).

Every number is modeled (the engine's time model of the named GPUs), never measured.
The `calibration` parameter says which GPU figures priced the steps: "fitted" (the
profiles' fitted efficiency, `kvbench calibrate gpu`; A100-40GB takes A100-80GB's fit,
an assumption) or "datasheet" (100% of the datasheet peaks, no kernel floor). Grid cases
run fitted; knee cases run both, so the sustained rates can be compared before/after.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvbench.reports.provenance import MODELED
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.registry import Case, Measurement, sweep
from kvbench.workloads.setups import CALIBRATIONS, ServingSetup

if TYPE_CHECKING:
    from kvbench.paged.serving.rate import RateTrace

SYSTEM_NAMES = ("paged", "contiguous-max", "contiguous-pow2", "contiguous-oracle", "static")
FULL_SETUPS = ("opt-13b-1xa100-40gb", "opt-66b-4xa100-40gb", "opt-175b-8xa100-80gb")
WORKLOADS = ("sharegpt", "alpaca")
#: (set-up, workload) -> (default grid, full grid) of rates in requests/s, chosen to span
#: every system's knee on that set-up.
RATE_GRID: dict[tuple[str, str], tuple[tuple[float, ...], tuple[float, ...]]] = {
    ("opt-13b-1xa100-40gb", "sharegpt"): (
        (0.5, 1, 2, 3, 4.5),
        (0.25, 0.5, 1, 1.5, 2, 2.5, 3, 4, 5),
    ),
    ("opt-13b-1xa100-40gb", "alpaca"): ((5, 20, 80, 150), (2, 5, 10, 20, 40, 80, 120, 150, 180)),
    ("opt-66b-4xa100-40gb", "sharegpt"): ((0.25, 0.5, 1, 2, 3), (0.25, 0.5, 1, 1.5, 2, 2.5, 3, 4)),
    ("opt-66b-4xa100-40gb", "alpaca"): ((), (2, 5, 10, 20, 40, 80, 120, 160)),
    ("opt-175b-8xa100-80gb", "sharegpt"): ((0.5, 1, 2, 4, 8), (0.25, 0.5, 1, 2, 3, 4, 6, 8, 10)),
    ("opt-175b-8xa100-80gb", "alpaca"): ((), (2, 5, 10, 20, 40, 80, 120, 160)),
}
#: What the default run leaves out, and why (the sweep's description carries it).
DEFAULT_NOTE = (
    "default run: the three OPT set-ups on ShareGPT-like requests (the rate claims are on "
    "ShareGPT), OPT-13B also on Alpaca-like; OPT-66B / OPT-175B on Alpaca only with --full, "
    "to keep the default run a few minutes"
)
#: Seconds of arrivals per trace (see `paged.serving.rate` on why a duration, not a count):
#: long enough that a 10 x floor bound is crossed at a modest overload (ShareGPT's long
#: outputs need longer), short enough for the default run.
DURATION = {"sharegpt": 300.0, "alpaca": 60.0}
#: Requests drawn per workload (the traces at every rate are prefixes of one draw).
POOL = {"sharegpt": 6000, "alpaca": 16000}
BOUND_FACTOR = 10.0

_TRACES: dict[tuple, object] = {}


def _cases(full: bool) -> list[Case]:
    out: list[Case] = []
    for setup in FULL_SETUPS:
        for w in WORKLOADS:
            grid = RATE_GRID[(setup, w)][1 if full else 0]
            if not grid:  # left to --full (DEFAULT_NOTE says which and why)
                continue
            base = {"setup": setup, "workload": w, "duration": DURATION[w]}
            for s in SYSTEM_NAMES:
                out += [
                    {**base, "system": s, "calibration": "fitted", "rate": float(r)} for r in grid
                ]
                out += [
                    {**base, "system": s, "calibration": c, "bound_factor": BOUND_FACTOR}
                    for c in CALIBRATIONS
                ]
    return out


def _rate_trace(workload: str, seed: int):  # type: ignore[no-untyped-def]
    """The requests of a workload with unit-rate Poisson arrivals, made once per process."""
    from kvbench.paged.serving.rate import RateTrace
    from kvbench.workloads.sharing import generate

    key = (workload, seed)
    if key not in _TRACES:
        _TRACES[key] = RateTrace.make(generate(workload, POOL[workload], seed=seed), seed)
    return _TRACES[key]


def _metrics(m: dict) -> list[Measurement]:
    return [
        Measurement("normalized_latency", m["normalized_latency_mean"], "s/token"),
        Measurement("normalized_latency_p99", m["normalized_latency_p99"], "s/token"),
        Measurement("ttft_p50", m["ttft_p50"], "s"),
        Measurement("ttft_p99", m["ttft_p99"], "s"),
        Measurement("tpot_p50", m["tpot_p50"], "s"),
        Measurement("requests_per_second", m["requests_per_second"], "requests/s"),
        Measurement("tokens_per_second", m["tokens_per_second"], "tokens/s"),
        Measurement("requests_served", m["requests"], "requests"),
        Measurement("peak_concurrency", m["peak_concurrency"], "requests"),
        Measurement("preemptions", m["preemptions"], "count"),
        Measurement("simulation_wall_time", m["simulation_wall_time"], "s"),
    ]


def _start_rate(setup: str, workload: str) -> float:
    grid = RATE_GRID[(setup, workload)]
    rates = grid[0] or grid[1]
    return float(rates[len(rates) // 2])


@sweep(
    "serving.rate",
    "modeled serving under Poisson load (vLLM paper, Figure 12): normalized latency, TTFT "
    "and throughput against request rate for paged, Orca (max / pow2 / oracle) and "
    "request-level batching on the paper's set-ups; sustained rate = highest rate with "
    f"mean normalized latency under {BOUND_FACTOR:g} x the set-up's one-sequence decode step; "
    + DEFAULT_NOTE,
    _cases,
    requires=("kvbench.paged.serving.rate",),
    tags=("serving", "modeled"),
    produced=(MODELED,),
)
def serving_rate(case: Case, ctx: BenchContext) -> list[Measurement]:
    from kvbench.paged.serving.rate import run_at_rate
    from kvbench.workloads.setups import get_setup, with_calibration

    setup = with_calibration(get_setup(case["setup"]), case.get("calibration", "fitted"))
    trace = _rate_trace(case["workload"], ctx.seed)
    duration = case["duration"]
    if "rate" in case:
        return _metrics(run_at_rate(setup, case["system"], trace, case["rate"], duration))
    return knee_measurements(
        setup,
        case["system"],
        trace,
        duration,
        case["bound_factor"],
        _start_rate(case["setup"], case["workload"]),
    )


def knee_measurements(
    setup: ServingSetup,
    system: str,
    trace: RateTrace,
    duration: float,
    bound_factor: float,
    start_rate: float,
) -> list[Measurement]:
    """The sustained-rate search of one system on `setup` (module docstring): the rate,
    the bound and floor it used (s/token), how many rates it tried, and the normalized
    latency and tokens/s at the rate found."""
    from kvbench.paged.serving.rate import latency_floor, run_at_rate, sustained_rate
    from kvbench.paged.serving.simulation import setup_time_model
    from kvbench.suites.bench.search_rows import search_rows

    floor = latency_floor(setup_time_model(setup))
    bound = bound_factor * floor
    details: dict[float, dict] = {}

    def latency_at(rate: float) -> float:
        details[rate] = run_at_rate(setup, system, trace, rate, duration)
        return details[rate]["normalized_latency_mean"]

    rate, seen = sustained_rate(latency_at, bound, start_rate, limit=trace.max_rate(duration))
    at = details.get(rate)
    out = [
        *search_rows("sustained_rate", rate, seen, "requests/s"),
        Measurement("latency_bound", bound, "s/token"),
        Measurement("latency_floor", floor, "s/token"),
        Measurement("rate_evaluations", len(seen), "count"),
    ]
    if at is not None:
        out += [
            Measurement(
                "normalized_latency_at_sustained", at["normalized_latency_mean"], "s/token"
            ),
            Measurement("tokens_per_second_at_sustained", at["tokens_per_second"], "tokens/s"),
            Measurement("peak_concurrency_at_sustained", at["peak_concurrency"], "requests"),
        ]
    return out
