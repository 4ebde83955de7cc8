"""Serving under a growing request rate, the way the vLLM paper measures it (modeled).

For a serving set-up (`workloads.setups`), a workload and a system, requests arrive as a
Poisson process at `rate` requests/s; the engine serves them and each request's latency
is read from the modeled clock. The paper's metric is the normalized latency: end-to-end
latency over output tokens (s/token), averaged over requests. As the rate grows past what
a system sustains, requests queue and normalized latency grows without bound.

Systems (the paper's, Section 6):

    paged              kvbench's PagedKVCache, iteration-level (continuous) batching
    contiguous-max     Orca (Max): every request reserves max_seq_len slots
    contiguous-pow2    Orca (Pow2): kvbench's pow2 policy (the next power of two of the
                       prompt, doubling by relocation when outgrown; the paper's variant
                       reserves the next power of two of the true length up front)
    contiguous-oracle  Orca (Oracle): prompt + true output length reserved
    static             request-level batching (FasterTransformer-like): a batch of
                       max-reserved requests runs until its last request finishes

Traces at different rates share their requests (lengths) and their Poisson draws: the
arrival times are one unit-rate draw divided by the rate, so a curve over rates moves
only with the rate. A trace lasts a fixed `duration` of arrivals (the paper replays
an hour), not a fixed number of requests: past its capacity a system's backlog grows
with the time it is overloaded, so with a fixed request count a faster system would be
overloaded for less time and look better than it is. With duration T, a system
overloaded by a fraction e queues about e x T / 2 seconds on average, which crosses a
bound B of normalized latency at about e = 2 B x (mean output tokens) / T for every
system alike: the knees sit that fraction above the capacities, and their ratios are
the capacities' ratios.

Sustained rate: the highest rate whose mean normalized latency stays under a bound,
found by a geometric bisection (`sustained_rate`). The bound is `bound_factor` times the
set-up's latency floor, one decode step of one sequence (`latency_floor`): below the
knee batching keeps normalized latency within a few floors; past it the queue grows
with the trace and latency explodes, so any factor well inside that range finds nearly
the same rate. The sweeps use 10.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from kvbench.paged.serving.latency import flat
from kvbench.paged.serving.simulation import setup_spec, setup_time_model, simulate
from kvbench.paged.serving.slo import SLO, goodput
from kvbench.paged.serving.time_model import SchedulerConfig, SimulationResult, TimeModel
from kvbench.workloads.arrivals import check_burstiness, gamma
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.setups import ServingSetup
from kvbench.workloads.trace import Trace

#: system -> (cache kind, batching)
SYSTEMS: dict[str, tuple[str, str]] = {
    "paged": ("paged", "continuous"),
    "contiguous-max": ("contiguous-max", "continuous"),
    "contiguous-pow2": ("contiguous-pow2", "continuous"),
    "contiguous-oracle": ("contiguous-oracle", "continuous"),
    "static": ("contiguous-max", "static"),
}
#: Default bound on mean normalized latency, in latency floors (module docstring).
BOUND_FACTOR = 10.0


def check_system(name: str) -> str:
    if name not in SYSTEMS:
        raise ConfigError(f"unknown system {name!r}; known: {', '.join(SYSTEMS)}")
    return name


def check_positive(what: str, value: float) -> float:
    """`value` as a float when it is a finite number > 0, else ConfigError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{what} must be a number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{what} must be finite and > 0, got {value!r}")
    return float(value)


def check_rate(rate: float) -> float:
    """A request rate (requests/s) must be a finite number > 0."""
    return check_positive("request rate", rate)


def check_bound(bound: float) -> float:
    """A latency bound (s/token) must be a finite number > 0."""
    return check_positive("latency bound", bound)


@dataclass(frozen=True)
class RateTrace:
    """A trace's requests plus unit-rate arrival times (seconds at 1 request/s): Poisson,
    or gamma gaps of shape `burstiness` and mean 1 (`workloads.arrivals.gamma`; dividing
    them by a rate r gives vLLM's gamma arrivals at r)."""

    base: Trace
    unit_arrivals: np.ndarray
    burstiness: float = 1.0

    @classmethod
    def make(cls, base: Trace, seed: int, burstiness: float = 1.0) -> RateTrace:
        rng = np.random.default_rng([seed, 0x5EED])
        n = len(base.requests)
        if check_burstiness(burstiness) == 1.0:
            return cls(base, np.cumsum(rng.exponential(1.0, n)))
        return cls(base, gamma(n, rng, 1.0, burstiness), float(burstiness))

    def max_rate(self, duration: float) -> float:
        """The highest rate at which the requests last `duration` seconds."""
        return float(self.unit_arrivals[-1]) / duration

    def at(self, rate: float, duration: float | None = None) -> Trace:
        """The trace with Poisson arrivals at `rate` requests/s: every request, or those
        arriving within `duration` seconds (at least one). Raises ConfigError when the
        requests run out before `duration` (the caller made too few)."""
        rate = check_rate(rate)
        n = len(self.base.requests)
        if duration is not None:
            check_positive("trace duration", duration)
            n = max(1, int(np.searchsorted(self.unit_arrivals, rate * duration, side="right")))
            if n == len(self.base.requests) and self.unit_arrivals[-1] < rate * duration:
                raise ConfigError(
                    f"{n} requests last {self.unit_arrivals[-1] / rate:.0f} s at {rate:g} "
                    f"requests/s, under the {duration:g} s asked for; make more requests"
                )
        reqs = tuple(
            replace(r, arrival=float(a / rate))
            for r, a in zip(self.base.requests[:n], self.unit_arrivals[:n], strict=True)
        )
        shape = (
            f"poisson:{rate:g}" if self.burstiness == 1.0 else f"gamma:{rate:g}:{self.burstiness:g}"
        )
        return Trace(reqs, {**self.base.meta, "arrivals": shape})


def latency_floor(tm: TimeModel) -> float:
    """Seconds of one decode step of one sequence with no context: the least normalized
    latency any system can reach on the set-up."""
    return tm.decode_ps(1) / 1e12


def run_at_rate(
    setup: ServingSetup,
    system: str,
    trace: RateTrace,
    rate: float,
    duration: float | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_num_seqs: int = 256,
    *,
    max_concurrency: int = 0,
    slo: SLO | None = None,
) -> dict[str, float]:
    """Serve `trace` at `rate` on `setup` with `system` (`run_system`)."""
    return run_system(
        setup,
        system,
        trace.at(rate, duration),
        block_size,
        max_num_seqs,
        max_concurrency=max_concurrency,
        slo=slo,
    )


def run_system(
    setup: ServingSetup,
    system: str,
    trace: Trace,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_num_seqs: int = 256,
    *,
    max_concurrency: int = 0,
    slo: SLO | None = None,
    prefix_caching: bool = False,
) -> dict[str, float]:
    """Serve `trace` (its own arrivals) on `setup` with `system`: latency metrics
    (`SimulationResult.latency`, flat: "normalized_latency_mean", ...), throughput
    (`served_throughput`) plus peak concurrency, preemptions and the engine's wall
    time; with `slo`, "goodput" (requests/s) and "slo_attainment" (`paged.serving.slo`).
    `max_concurrency` caps the requests in flight (0: none); `prefix_caching` applies
    to the paged cache."""
    kind, batching = SYSTEMS[check_system(system)]
    spec = setup_spec(setup, kind, block_size, prefix_caching=prefix_caching)
    cfg = SchedulerConfig(
        max_num_seqs=max_num_seqs, batching=batching, max_concurrency=max_concurrency
    )
    result = simulate(
        trace,
        spec,
        config=cfg,
        time_model=setup_time_model(setup, block_size),
    )
    out = flat(result.latency)
    out.update(served_throughput(result))
    if slo is not None:
        out.update(goodput(result.records, slo).as_dict())
    out.update(
        peak_concurrency=float(result.peak_concurrency),
        preemptions=float(result.preemptions),
        simulation_wall_time=result.wall_seconds,
    )
    return out


def served_throughput(result: SimulationResult) -> dict[str, float]:
    """Requests and output tokens per second over the run's makespan (first arrival to
    last finish, modeled or measured seconds), and the request count."""
    recs = result.records
    start = min(r.arrival_s for r in recs)
    makespan = max(r.finish_s for r in recs) - start
    requests = len({r.request for r in recs})
    rate = (lambda x: x / makespan) if makespan > 0 else (lambda x: math.inf)
    return {
        "requests": float(requests),
        "requests_per_second": rate(requests),
        "tokens_per_second": rate(result.generated_tokens),
    }


def sustained_rate(
    latency_at: Callable[[float], float],
    bound: float,
    start: float,
    rel_tol: float = 0.05,
    max_evals: int = 16,
    limit: float = math.inf,
) -> tuple[float, dict[float, float]]:
    """The highest rate r with latency_at(r) <= bound, to `rel_tol` (geometric
    bisection from `start`, doubling or halving to bracket the bound first). Returns
    (rate, every evaluation); rate 0.0 when even start / 2**6 exceeds the bound, and
    `limit` when the bound holds there (the search never evaluates a higher rate: a
    trace's requests run out). Assumes latency grows with the rate (true up to the
    trace's noise)."""
    check_bound(bound)
    check_rate(start)
    seen: dict[float, float] = {}

    def f(r: float) -> float:
        if r not in seen:
            seen[r] = latency_at(r)
        return seen[r]

    lo, hi = None, None
    r = min(start, limit)
    for _ in range(6):
        if f(r) <= bound:
            lo = r
            break
        hi, r = r, r / 2
    if lo is None:
        return 0.0, seen
    while hi is None and len(seen) < max_evals:
        r = min(lo * 2, limit)
        if r == lo:
            return lo, seen
        if f(r) <= bound:
            lo = r
        else:
            hi = r
    if hi is None:
        return lo, seen
    while hi / lo > 1 + rel_tol and len(seen) < max_evals:
        mid = math.sqrt(lo * hi)
        if f(mid) <= bound:
            lo = mid
        else:
            hi = mid
    return lo, seen
