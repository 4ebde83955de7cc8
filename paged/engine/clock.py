"""Closed-form pricing of a quiet stretch of decode steps (event mode).

In a quiet stretch nothing but decoding happens: D decoders whose logical KV lengths sum
to A + D * t at the start of step t. Step t then costs weight_ps + kv_ps * (A + D * t + D)
picoseconds (each decoder reads its c + 1 tokens), so k steps from `first` cost

    k * weight_ps + kv_ps * (k * (A + D) + D * sum(first .. first + k - 1))

exactly the sum of the k steps priced one by one (integer picoseconds).
"""

from __future__ import annotations

from kvbench.paged.engine.sequence import NEVER


def span_ps(first: int, k: int, a: int, d: int, weight_ps: int, kv_ps: int) -> int:
    """Modeled picoseconds of the k quiet steps first .. first + k - 1."""
    sum_t = (2 * first + k - 1) * k // 2
    return k * weight_ps + kv_ps * (k * (a + d) + d * sum_t)


def arrival_step(
    first: int,
    now_ps: int,
    arrival_ps: int,
    a: int,
    d: int,
    weight_ps: int,
    kv_ps: int,
    horizon: int,
) -> int:
    """The first step >= `first` whose start time reaches `arrival_ps`, when the steps
    from `first` on (starting at `now_ps`) decode d sequences of aggregate a; capped at
    `horizon` (NEVER: no cap)."""

    def start_of(step: int) -> int:
        return now_ps + span_ps(first, step - first, a, d, weight_ps, kv_ps)

    if start_of(first) >= arrival_ps:
        return first
    if not weight_ps and not kv_ps:
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
