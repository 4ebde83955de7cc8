"""Request latency in modeled seconds, the way serving papers report it.

Per sequence the engine stamps (`SeqRecord`): `arrival_s` (the trace's arrival time),
`first_token_s` (the modeled end of the step that sampled its first token) and
`finish_s` (the end of the step that generated its last token). Per *request* (its n
samples together: the first token of any, the finish of the last; a beam group has one
record):

    ttft                time to first token: first_token - arrival (s)
    tpot                time per output token after the first:
                        (finish - first_token) / (output_len - 1) (s; requests with one
                        output token have none)
    e2e                 end-to-end latency: finish - arrival (s)
    normalized_latency  e2e / output_len (s per output token; the vLLM paper's metric,
                        whose mean over requests it plots against the request rate)

`summarize` gives each metric's mean, p50, p90 and p99 over the requests (percentiles by
linear interpolation between order statistics, numpy's default). Event mode and token
stepping stamp identical times: the quiet stretches event mode skips contain no first
token and no finish, and their modeled time is summed exactly (integer picoseconds).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from kvbench.paged.serving.records import SeqRecord

#: Latency metrics and their units.
LATENCY_METRICS: dict[str, str] = {
    "ttft": "s",
    "tpot": "s",
    "e2e": "s",
    "normalized_latency": "s/token",
}
#: Statistics of each metric, in this order.
LATENCY_STATS: tuple[str, ...] = ("mean", "p50", "p90", "p99")


def request_spans(records: Iterable[SeqRecord]) -> list[tuple[float, float, float, int]]:
    """(arrival, first token, finish, output_len) per request: the records of one
    request grouped by `request` (the first token of any sample, the finish of the
    last), in order of each request's first record."""
    spans: dict[object, list[float]] = {}
    for rec in records:
        span = spans.get(rec.request)
        if span is None:
            spans[rec.request] = [rec.arrival_s, rec.first_token_s, rec.finish_s, rec.output_len]
        else:
            span[1] = min(span[1], rec.first_token_s)
            span[2] = max(span[2], rec.finish_s)
    return [(a, f, e, int(n)) for a, f, e, n in spans.values()]


def request_latencies(records: Iterable[SeqRecord]) -> dict[str, list[float]]:
    """Each metric's value per request (`request_spans`), in order of each request's
    first record."""
    out: dict[str, list[float]] = {name: [] for name in LATENCY_METRICS}
    for arrival, first, finish, output_len in request_spans(records):
        out["ttft"].append(first - arrival)
        out["e2e"].append(finish - arrival)
        out["normalized_latency"].append((finish - arrival) / output_len)
        if output_len > 1:
            out["tpot"].append((finish - first) / (output_len - 1))
    return out


def stats(values: Sequence[float]) -> dict[str, float]:
    """mean, p50, p90, p99 of `values` (NaN for none)."""
    if not values:
        return {s: math.nan for s in LATENCY_STATS}
    arr = np.asarray(values, dtype=np.float64)
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return {"mean": float(arr.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def summarize(records: Iterable[SeqRecord]) -> dict[str, dict[str, float]]:
    """{metric: {stat: value}} over the requests of `records` (module docstring)."""
    return {name: stats(values) for name, values in request_latencies(records).items()}


def flat(latency: dict[str, dict[str, float]]) -> dict[str, float]:
    """{"ttft_mean": ..., "ttft_p50": ..., ...}: the summary as flat columns."""
    return {f"{name}_{s}": v for name, row in latency.items() for s, v in row.items()}
