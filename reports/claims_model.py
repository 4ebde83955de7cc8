"""The vocabulary of the claims check: verdict values, `Verdict`, `Claim`, and the small
helpers every check uses to slice a run's rows and to print measured ranges, and `RULE`,
the one rule every verdict follows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

#: The publication most claims come from (cited by its authors, title and venue).
VLLM_PAPER = (
    "Kwon et al., “Efficient Memory Management for Large Language Model Serving with "
    "PagedAttention”, SOSP 2023"
)

HOLDS = "holds"
FAILS = "does not hold"
NOT_MEASURED = "not measured"
NOT_APPLICABLE = "not applicable here"
#: The verdicts in the order counts of them are shown (the bench's last line, the index).
VERDICT_ORDER = (HOLDS, FAILS, NOT_APPLICABLE, NOT_MEASURED)
_PLURAL = {HOLDS: "hold", FAILS: "do not hold"}


def verdict_counts(verdicts: list[str]) -> list[tuple[str, str]]:
    """(verdict, '3 hold') per verdict in `VERDICT_ORDER`, zeros included, so the counts
    always add up to the number of claims judged; 'hold' / 'do not hold' agree in number."""
    out = []
    for v in VERDICT_ORDER:
        n = verdicts.count(v)
        out.append((v, f"{n} {v if n == 1 else _PLURAL.get(v, v)}"))
    return out


@dataclass(frozen=True)
class Verdict:
    """The outcome of one claim on one run."""

    measured: str
    verdict: str
    note: str = ""


@dataclass(frozen=True)
class Claim:
    """A published claim and how to check it (see the module docstring)."""

    key: str
    topic: str
    statement: str
    source: str
    published: str
    check: Callable[[pd.DataFrame], Verdict]


def _rows(frame: pd.DataFrame, suite: str, metric: str, **where: object) -> pd.DataFrame:
    sub = frame[(frame["suite"] == suite) & (frame["metric"] == metric)]
    for key, val in where.items():
        if key not in sub.columns:
            return sub.iloc[0:0]
        sub = sub[sub[key] == val]
    return sub


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def _range(values: pd.Series, fmt: Callable[[float], str] = _pct) -> str:
    """The values' span as "lo-hi", or as "lo to hi" when an end is negative
    ("-91.7%--20.4%" read as a typo); one value when both ends format alike."""
    lo, hi = float(values.min()), float(values.max())
    if fmt(lo) == fmt(hi):
        return fmt(lo)
    return f"{fmt(lo)} to {fmt(hi)}" if min(lo, hi) < 0 else f"{fmt(lo)}-{fmt(hi)}"


#: The one rule every verdict follows (shown on the claims page and in `kvbench bench`).
RULE = (
    "holds: every judged value lies inside the published range, compared at the precision "
    "the source prints (a value that rounds to an end of the range is inside it); no "
    "tolerance widens a range, so a value below the range does not hold any more than one "
    "above it (also when this machine does better). An approximate value ('~24%') is read "
    "as the range the 'published' column states; a one-sided claim ('above 96%') has one "
    "open end. Values outside the claim's own conditions (another workload) are shown "
    "beside the verdict, not judged."
)


def _inside(values: pd.Series, lo: float, hi: float, digits: int) -> bool:
    """True when every value, rounded to `digits` decimals (the published precision: 3 for
    a percentage printed as 20.4%, 1 for a ratio printed as 1.7x), lies in [lo, hi]."""
    rounded = values.astype(float).round(digits)
    return bool(((rounded >= lo) & (rounded <= hi)).all()) and not values.empty


def _missing(what: str) -> Verdict:
    return Verdict("-", NOT_MEASURED, what)
