"""A knee search that finds no load meeting its bound records an upper bound, not 0."""

from __future__ import annotations

import pytest

from kvbench.paged.serving.rate import sustained_rate
from kvbench.suites.bench.search_rows import search_rows


def test_found_rate_is_recorded_as_is() -> None:
    rate, seen = sustained_rate(lambda r: 0.01 if r <= 3.0 else 1.0, 0.1, 8.0, rel_tol=0.01)
    (row,) = search_rows("sustained_rate", rate, seen, "requests/s")
    assert row.metric == "sustained_rate" and row.value == pytest.approx(3.0, rel=0.02)


def test_no_rate_meeting_the_bound_records_the_lowest_tried() -> None:
    rate, seen = sustained_rate(lambda r: 1.0, 0.1, 8.0)
    assert rate == 0.0  # the search's documented "below start / 2**5" answer
    (row,) = search_rows("sustained_rate", rate, seen, "requests/s")
    assert row.metric == "sustained_rate_below" and row.unit == "requests/s"
    assert row.value == min(seen) == pytest.approx(8.0 / 32)


def test_nothing_tried_is_an_error() -> None:
    with pytest.raises(ValueError, match="tried no load"):
        search_rows("slo_time_scale", 0.0, {}, "x")
