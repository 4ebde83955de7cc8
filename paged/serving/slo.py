"""Goodput and SLO attainment of a run's requests: DistServe's goodput, as vLLM computes it.

A service-level objective (`SLO`) bounds two per-request latencies (modeled seconds, from
`paged.serving.latency.request_spans`: the records of one request together):

    ttft = first_token - arrival          time to first token
    tpot = (finish - first_token) / (output_len - 1)
                                          time per output token after the first (vLLM's
                                          TPOT, "excl. 1st token"); a request with one
                                          output token has none

A request is *good* when ttft <= ttft bound and tpot <= tpot bound. Each bound is
inclusive (vLLM keeps a request when `slo >= value`), a bound not given always holds,
and a request with a single output token meets every TPOT bound (vLLM counts its TPOT
as 0 for goodput). Then, over the run (`goodput`):

    goodput         good requests / duration                           (requests/s)
    slo_attainment  good requests / requests                           (fraction)
    duration        last finish - first arrival (s): vLLM divides by its benchmark's
                    duration, from sending the first request to the last response

This is the rate of good requests that `vllm bench serve --goodput ttft:MS tpot:MS` prints
as "Request goodput" (DistServe, Zhong et al., OSDI 2024, defines goodput by the
requests that meet both SLOs). An SLO search (`paged.serving.replay.slo_search`) asks the other
question DistServe asks: the highest load whose p99 TTFT and p99 TPOT both stay within
the bounds (`slo_margin`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvbench.paged.serving.latency import request_spans
from kvbench.workloads.errors import ConfigError

if TYPE_CHECKING:
    from kvbench.paged.serving.records import SeqRecord


def _check_bound(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"SLO {name} must be a number of seconds, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"SLO {name} must be finite and > 0 seconds, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class SLO:
    """Latency bounds of a good request, seconds (None: that bound is not checked)."""

    ttft_s: float | None = None
    tpot_s: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "ttft_s", _check_bound("ttft", self.ttft_s))
        object.__setattr__(self, "tpot_s", _check_bound("tpot", self.tpot_s))

    def met(self, ttft: float, tpot: float | None) -> bool:
        """Whether a request with these latencies is good (tpot None: one output token)."""
        if self.ttft_s is not None and not ttft <= self.ttft_s:
            return False
        return self.tpot_s is None or tpot is None or tpot <= self.tpot_s

    def describe(self) -> str:
        parts = []
        if self.ttft_s is not None:
            parts.append(f"TTFT <= {self.ttft_s:g} s")
        if self.tpot_s is not None:
            parts.append(f"TPOT <= {self.tpot_s:g} s")
        return " and ".join(parts) or "no bound"


@dataclass(frozen=True)
class Goodput:
    """What `goodput` found (module docstring for the definitions)."""

    requests: int
    good: int
    duration_s: float
    goodput: float  # good requests / duration, requests/s
    slo_attainment: float  # good / requests, fraction

    def as_dict(self) -> dict[str, float]:
        return {
            "goodput": self.goodput,
            "slo_attainment": self.slo_attainment,
            "good_requests": float(self.good),
        }


def goodput(records: Iterable[SeqRecord], slo: SLO) -> Goodput:
    """Goodput and SLO attainment of the requests of `records` (module docstring)."""
    spans = request_spans(records)
    if not spans:
        return Goodput(0, 0, 0.0, 0.0, math.nan)
    good = 0
    for arrival, first, finish, output_len in spans:
        tpot = (finish - first) / (output_len - 1) if output_len > 1 else None
        good += slo.met(first - arrival, tpot)
    start = min(s[0] for s in spans)
    duration = max(s[2] for s in spans) - start
    rate = good / duration if duration > 0 else (math.inf if good else 0.0)
    return Goodput(len(spans), good, duration, rate, good / len(spans))


def slo_margin(latency: Mapping[str, Mapping[str, float]], slo: SLO) -> float:
    """max(p99 TTFT / TTFT bound, p99 TPOT / TPOT bound) of a latency summary
    (`paged.serving.latency.summarize`): <= 1 when both p99s are within the bounds. A bound not
    given, or a run with no TPOT (every request one token), contributes 0."""
    ratios = [0.0]
    for name, bound in (("ttft", slo.ttft_s), ("tpot", slo.tpot_s)):
        p99 = latency[name]["p99"]
        if bound is not None and not math.isnan(p99):
            ratios.append(p99 / bound)
    return max(ratios)
