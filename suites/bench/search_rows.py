"""A bisection search's answer as result rows, without a fake 0.

`paged.serving.rate.sustained_rate` (and `paged.serving.replay.slo_search` on top of it)
returns 0.0 when even the lowest load it tried (start / 2**5) missed the bound: the
answer then lies somewhere below that load, not at 0. A row `metric` = 0 would read as
"sustains nothing"; instead the sweep records `<metric>_below` = the lowest load tried,
an upper bound that pages render as "below X (the lowest rate tried)".
"""

from __future__ import annotations

from collections.abc import Mapping

from kvbench.suites.bench.registry import Measurement

#: Suffix of the row a search writes when no load it tried met the bound.
BELOW = "_below"


def search_rows(
    metric: str, found: float, seen: Mapping[float, float], unit: str
) -> list[Measurement]:
    """[`metric` = found] when the search found a load meeting its bound (found > 0),
    else [`metric`_below = the lowest load tried] (`seen`: every load tried -> its value)."""
    if found > 0:
        return [Measurement(metric, found, unit)]
    if not seen:
        raise ValueError(f"{metric}: the search found nothing and tried no load")
    return [Measurement(metric + BELOW, min(seen), unit)]
