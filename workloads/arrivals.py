"""Seeded request arrival processes (times in seconds from the start of a trace).

Four processes cover the serving benchmarks the seeds discuss:

    all        every request at t = 0 (an offline batch: the throughput setting);
    poisson    exponential inter-arrival gaps at `rate` requests per second;
    gamma      gamma inter-arrival gaps at `rate` requests per second with a burstiness
               factor b, as `vllm bench serve --burstiness` draws them: shape b, scale
               1 / (rate * b), so the mean gap is 1 / rate for every b and the gaps'
               coefficient of variation is 1 / sqrt(b). b = 1 is the exponential
               distribution (Poisson arrivals); b < 1 is burstier, b > 1 more regular;
    burst      groups of `size` requests arriving together every `interval` seconds.

Every function returns a non-decreasing float64 array of length n, the order a trace
requires. Spec strings for the CLI: "all", "poisson:RATE", "gamma:RATE:BURSTINESS",
"burst:SIZE:INTERVAL".
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import require_positive

ArrivalProcess = Callable[[int, np.random.Generator], np.ndarray]


def _check_n(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ConfigError(f"request count must be an integer >= 0, got {n!r}")


def all_at_once(n: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """n arrivals at time 0."""
    _check_n(n)
    return np.zeros(n, dtype=np.float64)


def poisson(n: int, rng: np.random.Generator, rate: float) -> np.ndarray:
    """n arrivals of a Poisson process at `rate` requests/s (first gap included)."""
    _check_n(n)
    if not (isinstance(rate, (int, float)) and rate > 0 and np.isfinite(rate)):
        raise ConfigError(f"poisson rate must be a positive number of requests/s, got {rate!r}")
    return np.cumsum(rng.exponential(1.0 / rate, size=n))


#: Range of a burstiness factor: below 1e-3 (gaps with a coefficient of variation of 32)
#: the gamma scale 1 / (rate * b) overflows for small rates (b = 1e-320 gives NaN gaps).
BURSTINESS_RANGE = (1e-3, 1e6)


def check_burstiness(burstiness: float) -> float:
    """A burstiness factor (the gamma shape) must be a number in BURSTINESS_RANGE."""
    b = burstiness
    lo, hi = BURSTINESS_RANGE
    if isinstance(b, bool) or not isinstance(b, (int, float)) or not (lo <= b <= hi):
        raise ConfigError(
            f"burstiness must be a finite number in [{lo:g}, {hi:g}], got {burstiness!r}"
        )
    return float(b)


def gamma(n: int, rng: np.random.Generator, rate: float, burstiness: float = 1.0) -> np.ndarray:
    """n arrivals with gamma gaps of mean 1 / `rate` s: shape `burstiness`, scale
    1 / (rate * burstiness) (vLLM's definition; module docstring). The first gap is
    included, as in `poisson`."""
    _check_n(n)
    poisson(0, rng, rate)  # the rate's checks
    b = check_burstiness(burstiness)
    return np.cumsum(rng.gamma(b, 1.0 / (rate * b), size=n))


#: Largest burst (requests arriving together): as many as a generated trace may hold.
MAX_BURST = 10_000_000


def bursts(n: int, size: int, interval: float) -> np.ndarray:
    """Bursts of `size` requests at t = 0, interval, 2 * interval, ..."""
    _check_n(n)
    require_positive("burst size", size)
    if size > MAX_BURST:
        raise ConfigError(f"burst size must be at most {MAX_BURST:,}, got {size!r:.40}")
    if not (isinstance(interval, (int, float)) and interval >= 0 and np.isfinite(interval)):
        raise ConfigError(f"burst interval must be a number of seconds >= 0, got {interval!r}")
    return (np.arange(n, dtype=np.int64) // size).astype(np.float64) * float(interval)


def parse_arrivals(spec: str) -> ArrivalProcess:
    """An arrival process from a spec string: 'all', 'poisson:RATE',
    'gamma:RATE:BURSTINESS', 'burst:SIZE:INTERVAL'."""
    parts = str(spec).strip().lower().split(":")
    try:
        if parts == ["all"]:
            return lambda n, rng: all_at_once(n)
        if parts[0] == "poisson" and len(parts) == 2:
            rate = float(parts[1])
            poisson(0, np.random.default_rng(0), rate)  # validate now, not at first use
            return lambda n, rng: poisson(n, rng, rate)
        if parts[0] == "gamma" and len(parts) == 3:
            rate, b = float(parts[1]), float(parts[2])
            gamma(0, np.random.default_rng(0), rate, b)
            return lambda n, rng: gamma(n, rng, rate, b)
        if parts[0] == "burst" and len(parts) == 3:
            size, interval = int(parts[1]), float(parts[2])
            bursts(0, size, interval)
            return lambda n, rng: bursts(n, size, interval)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"bad number in arrival spec {spec!r}: {exc}") from None
    raise ConfigError(
        f"cannot parse arrival spec {spec!r}; use 'all', 'poisson:RATE', "
        "'gamma:RATE:BURSTINESS' or 'burst:SIZE:INTERVAL'"
    )
