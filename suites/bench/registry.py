"""Sweep registry: sweeps are registered by name and found by name.

A sweep has
    * `cases(full)`: the list of case-parameter dicts to measure (a small default grid,
      or the whole grid with `full=True`); each dict holds only str / number / bool
      values, which is what the results store accepts and what `--resume` matches on;
    * `measure(case, ctx)`: measures one case and returns its `Measurement`s;
    * `requires`: modules it needs (e.g. "kernels.ops", "paged.serving.engine"). A sweep
      whose modules do not import is listed as waiting and skipped, never faked.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvbench.workloads.errors import ConfigError

if TYPE_CHECKING:
    from kvbench.suites.bench.context import BenchContext

Case = dict[str, Any]


class UnknownSweepError(ConfigError):
    """A sweep name that no module registered."""


@dataclass(frozen=True)
class Measurement:
    """One measured number of one case.

    Attributes:
        metric: what it is ("time", "bandwidth_fraction", "utilization", ...).
        value: the number (the median for repeated timings).
        unit: "s", "B", "B/s", "fraction", "tokens", "requests", "blocks", ...
        stats: repeat statistics (median, q1, q3, n, ...) when it was repeated.
    """

    metric: str
    value: float
    unit: str
    stats: Mapping[str, float | int] | None = None


@dataclass(frozen=True)
class Sweep:
    """A named, registered sweep (see the module docstring)."""

    name: str
    description: str
    cases: Callable[[bool], list[Case]]
    measure: Callable[[Case, BenchContext], Iterable[Measurement]]
    requires: tuple[str, ...] = ()
    figure: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)
    in_default: bool = True  # False: runs only when named (--only) or with --full

    def missing(self) -> list[str]:
        """Modules this sweep needs that do not import here (empty when runnable)."""
        out = []
        for mod in self.requires:
            try:
                importlib.import_module(mod)
            except ImportError:
                out.append(mod)
        return out


_REGISTRY: dict[str, Sweep] = {}


def sweep(
    name: str,
    description: str,
    cases: Callable[[bool], list[Case]],
    *,
    requires: tuple[str, ...] = (),
    tags: tuple[str, ...] = (),
    in_default: bool = True,
) -> Callable[[Callable[[Case, BenchContext], Iterable[Measurement]]], Callable[..., Any]]:
    """Decorator: register the decorated `measure(case, ctx)` as sweep `name`."""

    def deco(
        measure: Callable[[Case, BenchContext], Iterable[Measurement]],
    ) -> Callable[[Case, BenchContext], Iterable[Measurement]]:
        if name in _REGISTRY and _REGISTRY[name].measure is not measure:
            raise ConfigError(f"sweep {name!r} is registered twice")
        _REGISTRY[name] = Sweep(
            name, description, cases, measure, requires, tags=tags, in_default=in_default
        )
        return measure

    return deco


def all_sweeps() -> list[Sweep]:
    """Every registered sweep, in registration order."""
    return list(_REGISTRY.values())


def get_sweep(name: str) -> Sweep:
    """The sweep called `name`; UnknownSweepError lists the known names."""
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(_REGISTRY) or "(none)"
        raise UnknownSweepError(f"unknown sweep {name!r}; known: {known}") from None


def select(names: Iterable[str] | None, *, full: bool = True) -> list[Sweep]:
    """Sweeps by name (in the order given, duplicates dropped), or, when None, every
    sweep (`full`) or every sweep of the default run.

    A name may also be a prefix ending in '.', e.g. 'kernel.' for every kernel sweep.
    """
    if not names:
        return [s for s in all_sweeps() if full or s.in_default]
    chosen: dict[str, Sweep] = {}
    for name in names:
        if name.endswith(".") and name not in _REGISTRY:
            matched = [s for s in _REGISTRY.values() if s.name.startswith(name)]
            if not matched:
                get_sweep(name)
            for s in matched:
                chosen.setdefault(s.name, s)
        else:
            chosen.setdefault(name, get_sweep(name))
    return list(chosen.values())
