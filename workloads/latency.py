"""Serving latency metrics from per-request times, as serving papers report them.

Per request (times in seconds on one clock, modeled or measured):

    ttft                time to first token      = first_token - arrival
    tpot                time per output token    = (finish - first_token) / (output - 1)
                        (requests with one output token have none)
    e2e                 end-to-end latency       = finish - arrival
    normalized_latency  e2e / output tokens (s/token; the vLLM paper's Figure 12 metric)

Summaries give the mean, p50, p90 and p99 of each, plus the throughput of the run:
requests and output tokens per second over the makespan (first arrival to last finish).
Percentiles are numpy's linear interpolation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from kvbench.workloads.errors import ConfigError

LATENCIES = ("ttft", "tpot", "e2e", "normalized_latency")
STATS = ("mean", "p50", "p90", "p99")


def latency_metrics(
    arrival: Sequence[float],
    first_token: Sequence[float],
    finish: Sequence[float],
    output_len: Sequence[int],
) -> dict[str, float]:
    """`{ttft,tpot,e2e,normalized_latency}_{mean,p50,p90,p99}` (seconds, s/token for the
    normalized one), `requests_per_second`, `tokens_per_second`, `requests`, `makespan`.

    Raises ConfigError for mismatched lengths, no requests, or a request whose times are
    out of order (first token before arrival, finish before first token)."""
    arr, first, fin = (np.asarray(x, dtype=np.float64) for x in (arrival, first_token, finish))
    out = np.asarray(output_len, dtype=np.int64)
    n = len(arr)
    if not (len(first) == len(fin) == len(out) == n):
        raise ConfigError(
            f"per-request arrays differ in length: {n}, {len(first)}, {len(fin)}, {len(out)}"
        )
    if n == 0:
        raise ConfigError("no requests to summarize")
    if (out < 1).any():
        raise ConfigError(f"output lengths must be >= 1, got {int(out.min())}")
    bad = np.flatnonzero((first < arr) | (fin < first) | ~np.isfinite(fin))
    if bad.size:
        i = int(bad[0])
        raise ConfigError(
            f"request {i}: times out of order (arrival {arr[i]}, first token {first[i]}, "
            f"finish {fin[i]})"
        )
    e2e = fin - arr
    multi = out > 1
    series = {
        "ttft": first - arr,
        "tpot": (fin[multi] - first[multi]) / (out[multi] - 1),
        "e2e": e2e,
        "normalized_latency": e2e / out,
    }
    result: dict[str, float] = {}
    for name, values in series.items():
        for stat in STATS:
            result[f"{name}_{stat}"] = _stat(values, stat)
    makespan = float(fin.max() - arr.min())
    result["requests"] = float(n)
    result["makespan"] = makespan
    result["requests_per_second"] = n / makespan if makespan > 0 else math.inf
    result["tokens_per_second"] = float(out.sum()) / makespan if makespan > 0 else math.inf
    return result


def _stat(values: np.ndarray, stat: str) -> float:
    if values.size == 0:
        return math.nan
    if stat == "mean":
        return float(values.mean())
    return float(np.percentile(values, float(stat[1:])))
