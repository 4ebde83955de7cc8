"""Per-request arrival, first-token and finish times of a simulated run (modeled seconds).

The engine records, per sequence, the step of its first token and of its finish; the
timeline records each step's modeled duration. A step's tokens exist at the step's end,
so a request's first-token (finish) time is the end time of its first-token (finish)
step. Where the engine records the times itself (`first_token_time` / `finish_time` on
its records), those are used as they are.

Event mode groups quiet decode steps into one timeline row; first-token and finish steps
are never inside such a row (they are events), but a step that is gets the row's time
interpolated linearly, which only a caller asking for a quiet step would see.
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np

from kvbench.paged.scheduler_model import SimulationResult, StepRow


class StepClock:
    """End time (seconds) of any step of a run, from its timeline rows and arrivals.

    The engine does not log idle time: when nothing is running, waiting or swapped after
    a step, it jumps to the next arrival (the first arrival later than that step's start,
    since arrivals up to a step's start had joined it). The clock replays that rule."""

    def __init__(self, timeline: list[StepRow], arrivals_ps: list[int]) -> None:
        self._starts: list[int] = []
        self._spans: list[int] = []
        self._begin_ps: list[int] = []
        self._dur_ps: list[int] = []
        arrivals = sorted(arrivals_ps)
        now = arrivals[0] if arrivals and arrivals[0] > 0 else 0
        for row in timeline:
            self._starts.append(row.step)
            self._spans.append(row.span)
            self._begin_ps.append(now)
            self._dur_ps.append(row.time_ps)
            start, now = now, now + row.time_ps
            if not (row.running or row.waiting or row.swapped):
                i = bisect_right(arrivals, start)
                if i < len(arrivals):
                    now = max(now, arrivals[i])

    def end_seconds(self, step: int) -> float:
        i = bisect_right(self._starts, step) - 1
        if i < 0:
            raise ValueError(f"step {step} precedes the run")
        into = step - self._starts[i] + 1
        span = self._spans[i]
        if into > span:
            raise ValueError(f"step {step} is past the timeline row at {self._starts[i]}")
        return (self._begin_ps[i] + self._dur_ps[i] * into / span) / 1e12


def request_times(
    result: SimulationResult,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(arrival, first token, finish) in seconds and output tokens of every finished
    sequence record of `result`."""
    recs = [r for r in result.records if r.finish_step >= 0]
    arrival = np.array([float(r.arrival) for r in recs])
    out = np.array([int(r.output_len) for r in recs], dtype=np.int64)
    if recs and hasattr(recs[0], "first_token_time") and hasattr(recs[0], "finish_time"):
        first = np.array([float(r.first_token_time) for r in recs])
        finish = np.array([float(r.finish_time) for r in recs])
        return arrival, first, finish, out
    clock = StepClock(result.timeline, [round(float(r.arrival) * 1e12) for r in result.records])
    first = np.array([clock.end_seconds(r.first_token_step) for r in recs])
    finish = np.array([clock.end_seconds(r.finish_step) for r in recs])
    return arrival, first, finish, out
