"""Closed-form pricing of a quiet stretch of decode steps (event mode).

In a quiet stretch nothing but decoding happens: D decoders whose logical KV lengths sum
to A + D * t at the start of step t, so step t reads A + D * t + D KV tokens (each decoder
its c + 1). `TimeModel.decode_span_ps` sums k such steps from `first` in closed form,
exactly the sum of `TimeModel.step_ps` over them (integer picoseconds). With windows
(`wins`: per window W its aggregates (W, a_W, d_W) of the decoders past it), step t's
excess over W is a_W + d_W * (t + 1 - W), and no decoder crosses W within the stretch.
"""

from __future__ import annotations

from kvbench.paged.serving.engine.sequence import NEVER
from kvbench.paged.serving.time_model import TimeModel

Wins = tuple[tuple[int, int, int], ...]


def span_ps(tm: TimeModel | None, first: int, k: int, a: int, d: int, wins: Wins = ()) -> int:
    """Modeled picoseconds of the k quiet steps first .. first + k - 1 (0 without a
    model)."""
    if tm is None:
        return 0
    if not wins:
        return tm.decode_span_ps(d, a + d + d * first, k)
    excess = [wa + wd * (first + 1 - w) for w, wa, wd in wins]
    return tm.decode_span_ps(d, a + d + d * first, k, excess, [wd for _, _, wd in wins])


def arrival_step(
    first: int,
    now_ps: int,
    arrival_ps: int,
    a: int,
    d: int,
    tm: TimeModel | None,
    horizon: int,
    wins: Wins = (),
) -> int:
    """The first step >= `first` whose start time reaches `arrival_ps`, when the steps
    from `first` on (starting at `now_ps`) decode d sequences of aggregate a; capped at
    `horizon` (NEVER: no cap)."""

    def start_of(step: int) -> int:
        return now_ps + span_ps(tm, first, step - first, a, d, wins)

    if start_of(first) >= arrival_ps:
        return first
    if start_of(first + 1) == now_ps:  # steps cost nothing: time never advances
        return horizon
    lo, hi = first, horizon
    if hi >= NEVER or start_of(hi) >= arrival_ps:
        hi = min(hi, first + 1)
        while start_of(hi) < arrival_ps and hi < horizon:
            lo, hi = hi, min(horizon, first + 2 * (hi - first))
    if start_of(hi) < arrival_ps:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if start_of(mid) >= arrival_ps:
            hi = mid
        else:
            lo = mid
    return hi
