"""Replaying a trace faster or slower: its arrival times divided by a time scale.

A time scale s > 0 replays a trace's own arrival stream s times as fast: request i
arrives at arrival_i / s (s = 2 halves every gap, so twice the request rate; s = 0.5
doubles them). The requests themselves (lengths, prompts) do not change, nor does
their order. This is the `--speed` of trace replayers and the knob an SLO search over
a trace turns (the highest time scale whose latencies stay within the SLO).

Bounds: the command-line flags (`--speed`, `--time-scale`) take scales in
[MIN_TIME_SCALE, MAX_TIME_SCALE] = [1e-6, 1e6] (a million times slower or faster), and
every scaled arrival must stay within the trace format's MAX_ARRIVAL_S (2^22 s;
`workloads.trace`), checked after scaling: `time_scaled` refuses a scale that would put
the last arrival past it (a scale of 1e-300 once reached the engine as an arrival of
1e300 s and overflowed its picosecond clock), naming the scale and the request.
"""

from __future__ import annotations

import math
from dataclasses import replace

from kvbench.workloads.errors import ConfigError
from kvbench.workloads.trace import MAX_ARRIVAL_S, Trace

#: The range of a time scale given on the command line (`--speed`, `--time-scale`).
MIN_TIME_SCALE = 1e-6
MAX_TIME_SCALE = 1e6


def check_time_scale(scale: float, name: str = "time scale") -> float:
    """A time scale (an importer's `speed` too) as a float: a finite number > 0, else
    ConfigError naming it by `name`."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise ConfigError(f"{name} must be a number, got {scale!r}")
    if not (math.isfinite(scale) and scale > 0):
        raise ConfigError(f"{name} must be finite and > 0, got {scale!r}")
    return float(scale)


def check_scaled_arrivals(trace: Trace, scale: float, name: str = "time scale") -> None:
    """ConfigError, naming the scale by `name` and the request, when `trace`'s arrivals
    divided by `scale` would land past MAX_ARRIVAL_S (nothing is built)."""
    s = check_time_scale(scale, name)
    if trace.requests and not trace.requests[-1].arrival / s <= MAX_ARRIVAL_S:
        last = trace.requests[-1]  # arrivals never decrease: the last is the latest
        raise ConfigError(
            f"{name} {scale!r} puts request {last.id!r} (arrival {last.arrival:g} s) at "
            f"{last.arrival / s:.4g} s, past the latest arrival a trace may have, "
            f"{MAX_ARRIVAL_S:,.0f} s (2^22 s: latencies stay exact to 1 ns); use a larger "
            f"{name}"
        )


def time_scaled(trace: Trace, scale: float, name: str = "time scale") -> Trace:
    """`trace` with every arrival divided by `scale` (module docstring); the trace itself
    when scale is 1. ConfigError, naming the scale by `name` and the request, when an
    arrival would land past MAX_ARRIVAL_S."""
    s = check_time_scale(scale, name)
    if s == 1.0:
        return trace
    check_scaled_arrivals(trace, s, name)
    reqs = tuple(replace(r, arrival=r.arrival / s) for r in trace.requests)
    return Trace(reqs, {**trace.meta, "time_scale": s})


def arrivals_before(trace: Trace, seconds: float) -> Trace:
    """The requests of `trace` arriving before `seconds` (its first `seconds` of
    traffic, at its own time scale); the trace itself when none is left out."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
        raise ConfigError(f"window must be a number of seconds > 0, got {seconds!r}")
    reqs = tuple(r for r in trace.requests if r.arrival < seconds)
    if len(reqs) == len(trace.requests):
        return trace
    return Trace(reqs, {**trace.meta, "window_s": float(seconds)})
