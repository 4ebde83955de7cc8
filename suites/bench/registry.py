"""Sweep registry: sweeps are registered by name and found by name.

A sweep has
    * `cases(full)`: the list of case-parameter dicts to measure (a small default grid,
      or the whole grid with `full=True`); each dict holds only str / number / bool
      values, which is what the results store accepts and what `--resume` matches on;
    * `measure(case, ctx)`: measures one case and returns its `Measurement`s;
    * `requires`: modules it needs (e.g. "kernels.ops", "paged.serving.engine"). A sweep
      whose modules do not import is listed as waiting and skipped, never faked;
    * `produced`: what produced its numbers (`reports.provenance` kinds: measured here,
      computed here, counted here, modeled, predicted, compiled here, closed form, ...),
      declared where it is registered. The runner writes it into the results header and
      the reports read it from there, so a page never guesses.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvbench.reports.provenance import DECLARABLE
from kvbench.suites.bench.measurement import Case, Measurement
from kvbench.workloads.errors import ConfigError

if TYPE_CHECKING:
    from kvbench.suites.bench.context import BenchContext


class UnknownSweepError(ConfigError):
    """A sweep name that no module registered."""


@dataclass(frozen=True)
class Sweep:
    """A named, registered sweep (see the module docstring)."""

    name: str
    description: str
    cases: Callable[[bool], list[Case]]
    measure: Callable[[Case, BenchContext], Iterable[Measurement]]
    produced: tuple[str, ...]
    requires: tuple[str, ...] = ()
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
    produced: tuple[str, ...],
    requires: tuple[str, ...] = (),
    tags: tuple[str, ...] = (),
    in_default: bool = True,
) -> Callable[[Callable[[Case, BenchContext], Iterable[Measurement]]], Callable[..., Any]]:
    """Decorator: register the decorated `measure(case, ctx)` as sweep `name`, whose
    numbers were produced as `produced` says (one or more `reports.provenance` kinds, in
    the order a page names them)."""
    check_produced(name, produced)

    def deco(
        measure: Callable[[Case, BenchContext], Iterable[Measurement]],
    ) -> Callable[[Case, BenchContext], Iterable[Measurement]]:
        if name in _REGISTRY and _REGISTRY[name].measure is not measure:
            raise ConfigError(f"sweep {name!r} is registered twice")
        _REGISTRY[name] = Sweep(
            name,
            description,
            cases,
            measure,
            tuple(produced),
            requires,
            tags=tags,
            in_default=in_default,
        )
        return measure

    return deco


def check_produced(name: str, produced: tuple[str, ...]) -> None:
    """ConfigError unless `produced` is a non-empty tuple of distinct declarable kinds."""
    if not isinstance(produced, tuple) or not produced:
        raise ConfigError(
            f"sweep {name!r} must declare what produced its numbers (produced=(...) of "
            f"{', '.join(DECLARABLE)}), got {produced!r}"
        )
    unknown = [k for k in produced if k not in DECLARABLE]
    if unknown or len(set(produced)) != len(produced):
        raise ConfigError(
            f"sweep {name!r}: produced={produced!r} must name distinct kinds of "
            f"{', '.join(DECLARABLE)}"
        )


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
