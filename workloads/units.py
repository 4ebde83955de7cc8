"""Human-readable sizes for tables (binary units, as the seed literature prints them)."""

from __future__ import annotations


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
