"""Replaying a trace faster or slower: its arrival times divided by a time scale.

A time scale s > 0 replays a trace's own arrival stream s times as fast: request i
arrives at arrival_i / s (s = 2 halves every gap, so twice the request rate; s = 0.5
doubles them). The requests themselves (lengths, prompts) do not change, nor does
their order. This is the `--speed` of trace replayers and the knob an SLO search over
a trace turns (the highest time scale whose latencies stay within the SLO).
"""

from __future__ import annotations

import math
from dataclasses import replace

from kvbench.workloads.errors import ConfigError
from kvbench.workloads.trace import Trace


def check_time_scale(scale: float, name: str = "time scale") -> float:
    """A time scale (an importer's `speed` too) as a float: a finite number > 0, else
    ConfigError naming it by `name`."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise ConfigError(f"{name} must be a number, got {scale!r}")
    if not (math.isfinite(scale) and scale > 0):
        raise ConfigError(f"{name} must be finite and > 0, got {scale!r}")
    return float(scale)


def time_scaled(trace: Trace, scale: float) -> Trace:
    """`trace` with every arrival divided by `scale` (module docstring); the trace itself
    when scale is 1."""
    s = check_time_scale(scale)
    if s == 1.0:
        return trace
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
