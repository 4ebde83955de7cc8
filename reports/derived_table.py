"""A table a page computes from several cases' rows (a sustained-rate summary, a
calibration's coefficients, ...): its own module so that the modules that make such
tables and the one that picks them per sweep import it from below, never each other."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DerivedTable:
    """A table computed from several cases' rows (see the module docstring)."""

    title: str
    note: str
    header: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    #: 0-based columns shown as numbers (right-aligned, unwrapped); None: every column
    #: after the first two (the usual labels-then-figures layout)
    numeric_columns: tuple[int, ...] | None = None
