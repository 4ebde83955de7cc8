"""Whether a run's arrivals outrun what its set-up can prefill (modeled).

A serving run whose prompt tokens arrive faster than the set-up can prefill them has no
steady state: the waiting queue grows for as long as arrivals last, and every latency it
reports is mostly time spent queueing (the Azure code trace on one A100 with a 70B model
arrives 3.4 times faster than it can be prefilled: 0% SLO attainment, 2.6 s TPOT). This
module says so, with the two rates it compares:

    arriving  = the prompt tokens the run had to compute (prompt_len minus the prefix-cache
                hits at first admission, one per request, samples sharing their parent's)
                of every request but the first, divided by the span of the trace's
                arrivals (last - first arrival, seconds): a process of N arrivals over a
                span has N - 1 gaps in it;
    capacity  = max_batched_tokens / the modeled time of one step that prefills
                max_batched_tokens tokens with no context and no decoding (`TimeModel.
                prefill_ps`): the most prompt tokens per second the set-up can prefill,
                an upper bound (real steps also decode and attend to earlier context).

The run is overloaded when arriving > capacity. A trace whose requests all arrive at
once (span 0: an offline batch, meant to queue) has no arrival rate and is never
called overloaded. Both rates are modeled (the time model prices the steps).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.paged.serving.records import SeqRecord
from kvbench.paged.serving.time_model import TimeModel
from kvbench.workloads.trace import Trace


@dataclass(frozen=True)
class PrefillLoad:
    """Arriving and prefillable prompt tokens per second (module docstring), modeled."""

    arriving_tps: float
    capacity_tps: float
    span_s: float
    max_batched_tokens: int

    @property
    def ratio(self) -> float:
        """arriving / capacity (> 1: overloaded)."""
        return self.arriving_tps / self.capacity_tps

    @property
    def overloaded(self) -> bool:
        return self.arriving_tps > self.capacity_tps

    def describe(self) -> str:
        """One line: the two rates, how each was computed, and their ratio."""
        return (
            f"arrivals outrun prefill {self.ratio:.1f}x: {self.arriving_tps:,.0f} uncached "
            f"prompt tokens/s arrive (over the {self.span_s:,.3g} s the arrivals span) but the "
            f"set-up prefills at most {self.capacity_tps:,.0f} tokens/s (modeled: "
            f"{self.max_batched_tokens:,}-token prefill steps, no decoding); the queue grows "
            "for as long as arrivals last and latencies are mostly queueing"
        )


def prefill_capacity_tps(tm: TimeModel, max_batched_tokens: int) -> float:
    """The most prompt tokens per second the set-up can prefill (module docstring)."""
    step_s = tm.prefill_ps([(0, max_batched_tokens)]) / 1e12
    return max_batched_tokens / step_s if step_s > 0 else float("inf")


def prefill_load(
    trace: Trace, records: list[SeqRecord], tm: TimeModel | None, max_batched_tokens: int
) -> PrefillLoad | None:
    """The run's arriving and prefillable prompt tokens per second, or None when there is
    no time model or the arrivals span no time (module docstring)."""
    if tm is None or len(trace.requests) < 2:
        return None
    first, last = trace.requests[0], trace.requests[-1]
    span = last.arrival - first.arrival
    if span <= 0:
        return None
    computed = 0
    for rec in records:
        if rec.id == str(rec.request) and rec.request != first.id:  # parents, first aside
            computed += rec.prompt_len - rec.cached_tokens
    capacity = prefill_capacity_tps(tm, max_batched_tokens)
    return PrefillLoad(computed / span, capacity, span, max_batched_tokens)
