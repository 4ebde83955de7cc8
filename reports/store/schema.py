"""The line format of a results file, typed and validated in this one place.

A run is one JSON-lines file. Every line is an object with a ``kind`` and a ``schema``:

* ``header`` (line 1) and ``resume`` (a later process appending to the run):
  `RunHeader`: run id, creation time, the environment, and free extra entries (the
  bench arguments, ``planned_cases``: how many cases the process set out to run);
* ``row``: `ResultRow`, one measurement: suite, case parameters, metric, value, unit,
  repeat statistics;
* ``status``: `CaseStatus`, how one case ended: ``measured``, ``failed`` (the error's
  class and message) or ``skipped`` (why). A case with no status line never finished:
  the run was killed while it ran, or before it started.

Writers build these records (which validates them) and write ``to_json()``; the reader
parses every line with ``from_json``, which raises `RecordError` naming the problem.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from kvbench.workloads.errors import ConfigError, KVBenchError

#: Version of the line format this module writes and the newest it can read.
SCHEMA_VERSION = 1


class Status(str, Enum):
    """How a case of a run ended. The value is what a status line stores (and shows)."""

    MEASURED = "measured"
    FAILED = "failed"
    SKIPPED = "skipped"

    def __str__(self) -> str:
        return self.value


_SCALAR_TYPES = (str, int, float, bool, type(None))


class ResultsError(KVBenchError):
    """A results file or run cannot be used (missing, empty, unreadable)."""


class SchemaVersionError(ResultsError):
    """A results file was written with a newer schema than this kvbench reads."""


class RecordError(ConfigError):
    """A record (header, row, status) is malformed; the message says which field."""


def parse_status(value: object) -> Status:
    """`value` as a `Status` (a member, or its string value as a file stores it); else
    RecordError naming it."""
    try:
        return Status(value)
    except ValueError:
        allowed = ", ".join(s.value for s in Status)
        raise RecordError(f"status must be one of {allowed}, got {value!r:.40}") from None


def case_key(suite: str, case: Mapping[str, Any]) -> str:
    """A canonical string naming one case of one suite (sorted keys, compact JSON)."""
    return json.dumps([suite, dict(case)], sort_keys=True, separators=(",", ":"))


def _finite_number(name: str, value: Any) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RecordError(f"{name} must be a number, got {value!r:.60}")
    if not math.isfinite(value):
        raise RecordError(f"{name} must be finite, got {value!r}")
    return value


def _name(what: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise RecordError(f"{what} must be a non-empty string, got {value!r:.60}")
    return value


def _text(what: str, value: Any) -> str:
    if not isinstance(value, str):
        raise RecordError(f"{what} must be a string, got {value!r:.60}")
    return value


def check_case(case: Any) -> dict[str, Any]:
    """The case parameters as a plain dict: non-empty string names, scalar finite values."""
    if not isinstance(case, Mapping):
        raise RecordError(f"case must be a dict of parameters, got {type(case).__name__}")
    out: dict[str, Any] = {}
    for key, val in case.items():
        if not isinstance(key, str) or not key:
            raise RecordError(f"case parameter names must be non-empty strings, got {key!r}")
        if not isinstance(val, _SCALAR_TYPES):
            raise RecordError(
                f"case parameter {key!r} must be a str, number, bool or None, got {val!r:.60}"
            )
        if isinstance(val, float) and not math.isfinite(val):
            raise RecordError(f"case parameter {key!r} must be finite, got {val!r}")
        out[key] = val
    return out


def check_stats(stats: Any) -> dict[str, float | int] | None:
    """Repeat statistics: None, or a dict of finite numbers."""
    if stats is None:
        return None
    if not isinstance(stats, Mapping):
        raise RecordError(f"stats must be a dict or None, got {type(stats).__name__}")
    return {str(k): _finite_number(f"stats[{k!r}]", v) for k, v in stats.items()}


def check_schema(obj: Mapping[str, Any], where: str) -> None:
    """Raise SchemaVersionError for a newer schema, RecordError for a bad one."""
    schema = obj.get("schema")
    if isinstance(schema, bool) or not isinstance(schema, int):
        raise RecordError(f"missing or non-integer 'schema' ({schema!r:.40})")
    if schema > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{where}: written with results schema {schema}, but this kvbench reads "
            f"schema {SCHEMA_VERSION} or older; upgrade kvbench to read it"
        )
    if schema < 1:
        raise RecordError(f"unknown schema {schema}")


@dataclass(frozen=True, eq=False)
class ResultRow(Mapping[str, Any]):
    """One measurement. Also a read-only mapping of its JSON fields (``row["suite"]``),
    which is how the tables, figures and the gate read rows."""

    suite: str
    case: Mapping[str, Any]  # given as any mapping; held as a checked plain dict
    metric: str
    value: float | int
    unit: str
    stats: Mapping[str, float | int] | None = None  # held as a plain dict
    time: str = ""
    source_run: str | None = None  # set when a merge copied the row from a shard
    note: str = ""  # text that goes with the number (e.g. why a kernel backend ran)

    def __post_init__(self) -> None:
        _name("suite", self.suite)
        _name("metric", self.metric)
        object.__setattr__(self, "case", check_case(self.case))
        _finite_number("'value'", self.value)
        if not isinstance(self.unit, str):
            raise RecordError(f"unit must be a string ('' for a pure number), got {self.unit!r}")
        object.__setattr__(self, "stats", check_stats(self.stats))
        _text("time", self.time)
        if self.source_run is not None:
            _text("source_run", self.source_run)
        _text("note", self.note)
        object.__setattr__(self, "_json", self._make_json())

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ResultRow:
        """Parse a ``row`` line (RecordError when a field is missing or wrong)."""
        for name in ("suite", "case", "metric", "value", "unit"):
            if name not in obj:
                raise RecordError(f"row has no {name!r} field")
        return cls(
            obj["suite"],
            obj["case"],
            obj["metric"],
            obj["value"],
            obj["unit"],
            obj.get("stats"),
            obj.get("time") or "",
            obj.get("source_run"),
            obj.get("note") or "",
        )

    def to_json(self) -> dict[str, Any]:
        """The line written for the row (a fresh dict)."""
        return self._make_json()

    def _make_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "row",
            "schema": SCHEMA_VERSION,
            "suite": self.suite,
            "case": dict(self.case),
            "metric": self.metric,
            "value": self.value,
            "unit": self.unit,
            "stats": None if self.stats is None else dict(self.stats),
            "time": self.time,
        }
        if self.source_run is not None:
            out["source_run"] = self.source_run
        if self.note:  # written only when there is one: rows without stay as they were
            out["note"] = self.note
        return out

    @property
    def key(self) -> str:
        """The canonical key of the row's case."""
        return case_key(self.suite, self.case)

    def __getitem__(self, name: str) -> Any:
        return self._json[name]  # type: ignore[attr-defined]

    def __iter__(self) -> Iterator[str]:
        return iter(self._json)  # type: ignore[attr-defined]

    def __len__(self) -> int:
        return len(self._json)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class CaseStatus:
    """How one case of a run ended (see `Status`; a plain string is converted)."""

    suite: str
    case: Mapping[str, Any]  # given as any mapping; held as a checked plain dict
    status: Status
    error: str = ""  # failed: the exception's class name
    message: str = ""  # failed: the exception's message; skipped: the reason
    time: str = ""

    def __post_init__(self) -> None:
        _name("suite", self.suite)
        object.__setattr__(self, "case", check_case(self.case))
        object.__setattr__(self, "status", parse_status(self.status))
        _text("error", self.error)
        _text("message", self.message)
        _text("time", self.time)
        if self.status is Status.FAILED and not self.error:
            raise RecordError("a failed case must name its error class")
        if self.status is Status.SKIPPED and not self.message:
            raise RecordError("a skipped case must say why")

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> CaseStatus:
        for name in ("suite", "case", "status"):
            if name not in obj:
                raise RecordError(f"status line has no {name!r} field")
        return cls(
            obj["suite"],
            obj["case"],
            parse_status(obj["status"]),
            obj.get("error") or "",
            obj.get("message") or "",
            obj.get("time") or "",
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "status",
            "schema": SCHEMA_VERSION,
            "suite": self.suite,
            "case": dict(self.case),
            "status": self.status.value,
            "error": self.error,
            "message": self.message,
            "time": self.time,
        }

    @property
    def key(self) -> str:
        return case_key(self.suite, self.case)


@dataclass(frozen=True)
class RunHeader:
    """The first line of a run (``header``) or of a later process's part (``resume``)."""

    kind: str
    run_id: str
    created: str
    environment: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in ("header", "resume"):
            raise RecordError(f"header kind must be 'header' or 'resume', got {self.kind!r}")
        if not isinstance(self.environment, Mapping):
            raise RecordError(f"{self.kind} has no 'environment' object")
        _text("run_id", self.run_id)
        _text("created", self.created)
        planned = self.extra.get("planned_cases")
        if planned is not None and (
            isinstance(planned, bool) or not isinstance(planned, int) or planned < 0
        ):
            raise RecordError(f"planned_cases must be an integer >= 0, got {planned!r:.40}")

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> RunHeader:
        known = ("kind", "schema", "run_id", "created", "environment")
        return cls(
            obj.get("kind", ""),
            obj.get("run_id") or "",
            str(obj.get("created") or ""),
            obj.get("environment"),  # type: ignore[arg-type]
            {k: v for k, v in obj.items() if k not in known},
        )

    def to_json(self) -> dict[str, Any]:
        out = {
            "kind": self.kind,
            "schema": SCHEMA_VERSION,
            "run_id": self.run_id,
            "created": self.created,
            "environment": dict(self.environment),
        }
        out.update({k: v for k, v in self.extra.items() if k not in out})
        return out
