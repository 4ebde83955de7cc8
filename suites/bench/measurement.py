"""What a sweep's `measure(case, ctx)` returns (`Measurement`) and what a case is
(`Case`): the vocabulary the registry, the harness and every sweep share, in a module
that imports none of them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Case = dict[str, Any]


@dataclass(frozen=True)
class Measurement:
    """One measured number of one case.

    Attributes:
        metric: what it is ("time", "bandwidth_fraction", "utilization", ...).
        value: the number (the median for repeated timings).
        unit: "s", "B", "B/s", "fraction", "tokens", "requests", "blocks", ...
        stats: repeat statistics (median, q1, q3, n, ...) when it was repeated.
        note: text that goes with the number ("" for none), e.g. why the kernel backend
            a `backend_<name>` row names was chosen.
    """

    metric: str
    value: float
    unit: str
    stats: Mapping[str, float | int] | None = None
    note: str = ""
