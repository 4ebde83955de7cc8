"""Numbers with their units, as every table, page and command prints them.

`format_quantity(value, unit)` is the one function that turns a measured value and its
unit (as the results store records it: "s", "B", "B/s", "fraction", "ratio", "tokens",
...) into text. Every number it renders carries its unit, scaled where a scale reads
better (815.7 ms, 2.176 s, 1.25 GiB, 37.64%, 3,764%, 1.23x); only dimensionless units
("" and "count") print as bare numbers. `format_bytes` is its byte case.
"""

from __future__ import annotations

import math

#: Units that name no dimension: their values print as bare numbers.
DIMENSIONLESS = frozenset({"", "count"})

#: Seconds per unit of the time units results may carry.
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "ps": 1e-12}

_BINARY: tuple[tuple[str, float], ...] = (
    ("TiB", 2**40),
    ("GiB", 2**30),
    ("MiB", 2**20),
    ("KiB", 2**10),
)
_SI: tuple[tuple[str, float], ...] = (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3))


def format_bytes(n: float, digits: int = 2) -> str:
    """'320 KiB', '1.25 GiB', '4.5 MiB': binary units, trailing zeros trimmed."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            text = (
                f"{value:,.{digits}f}".rstrip("0").rstrip(".") if unit != "B" else f"{value:,.0f}"
            )
            return f"{text} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_number(value: float, digits: int = 4) -> str:
    """`value` to `digits` significant digits with thousands separators and no exponent
    between 1e-4 and 1e15 (11,470 not 1.147e+04); integers print whole."""
    v = float(value)
    if not math.isfinite(v):
        return str(v)
    if v.is_integer() and abs(v) < 1e15:
        return f"{int(v):,}"
    if v == 0 or not 1e-4 <= abs(v) < 1e15:
        return f"{v:.{digits - 1}e}"
    exponent = math.floor(math.log10(abs(v)))
    decimals = max(0, digits - 1 - exponent)
    rounded = round(v, decimals)
    text = f"{rounded:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def format_seconds(seconds: float) -> str:
    """A duration with a unit that fits: 12.3 ns, 45.6 µs, 815.7 ms, 2.176 s, 11,470 s."""
    v = float(seconds)
    a = abs(v)
    if a == 0 or a >= 1:
        return f"{format_number(v)} s"
    if a >= 1e-3:
        return f"{format_number(v * 1e3)} ms"
    if a >= 1e-6:
        return f"{format_number(v * 1e6)} µs"
    return f"{format_number(v * 1e9)} ns"


def format_quantity(value: object, unit: str = "") -> str:
    """A value with its unit for a table cell or a sentence (see the module docstring).

    None and NaN are '' (nothing measured); strings and booleans print as they are.
    """
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return str(value)
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(v):
        return ""
    unit = unit or ""
    if unit in DIMENSIONLESS:
        return format_number(v)
    if not math.isfinite(v):
        return f"{v} {unit}"
    if unit in _TIME_UNITS:
        return format_seconds(v * _TIME_UNITS[unit])
    if unit == "fraction":
        return f"{format_number(v * 100)}%"
    if unit in ("ratio", "x"):
        return f"{format_number(v)}×"
    if unit == "bool":
        return "yes" if v else "no"
    if unit in ("B", "B/s"):
        suffix = unit[1:]
        for name, scale in _BINARY:
            if abs(v) >= scale:
                return f"{format_number(v / scale)} {name}{suffix}"
        return f"{format_number(v)} {unit}"
    if unit.startswith("FLOP"):
        for name, scale in _SI:
            if abs(v) >= scale:
                return f"{format_number(v / scale)} {name}{unit}"
    return f"{format_number(v)} {unit}"


def format_spread(q1: object, q3: object, n: object, unit: str = "") -> str:
    """'q1-q3 790.1 ms-830.2 ms, n=15' for repeat statistics ('' when they are missing)."""
    try:
        lo, hi = float(q1), float(q3)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ""
    if math.isnan(lo) or math.isnan(hi):
        return ""
    count = ""
    try:
        if n is not None and not math.isnan(float(n)):  # type: ignore[arg-type]
            count = f", n={int(float(n))}"  # type: ignore[arg-type]
    except (TypeError, ValueError):
        count = ""
    return f"q1–q3 {format_quantity(lo, unit)} – {format_quantity(hi, unit)}{count}"
