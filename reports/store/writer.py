"""Appending a run's lines durably: `ResultWriter`.

Each line is written with one ``write`` call, then flushed and fsynced, so killing the
writer at any moment loses at most the line being written. A writer that re-opens a file
whose last line is torn starts on a fresh line. Lines are built as the typed records of
`kvbench.reports.store.schema`, so a bad argument is refused before anything is written.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kvbench.reports.store.environment import collect_environment, new_run_id, utc_now
from kvbench.reports.store.files import DEFAULT_RESULTS_DIR, read_header
from kvbench.reports.store.schema import (
    CaseStatus,
    ResultRow,
    ResultsError,
    RunHeader,
    Status,
    parse_status,
)
from kvbench.workloads.errors import CaseSkipped, ConfigError

log = logging.getLogger(__name__)


_RUN_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")


def check_run_id(run_id: str) -> str:
    """`run_id` if it is a usable run id (a file name: letters, digits, '-', '_' and '.',
    not starting with '.', at most 200 characters); else ConfigError naming it."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise ConfigError(
            f"invalid run id {run_id!r}: use up to 200 letters, digits, '-', '_' and '.' "
            "(not starting with '.')"
        )
    return run_id


def check_appendable(path: str | os.PathLike[str]) -> None:
    """Refuse (ResultsError) to append to an existing, non-empty file that is not a
    kvbench results file (its first line is no results header): a writer would mix rows
    into someone else's file."""
    p = Path(path)
    if p.is_dir():
        raise ResultsError(f"cannot write results to {p}: it is a folder")
    if p.is_file() and p.stat().st_size > 0 and read_header(p).get("kind") != "header":
        raise ResultsError(
            f"cannot append to {p}: its first line is not a kvbench results header (not a "
            "results file, or a damaged one); nothing was written"
        )


class ResultWriter:
    """Appends measurements of one run to ``<out_dir>/<run_id>.jsonl``.

    A new run id writes a header line with the environment. An existing run id (resume)
    appends a ``resume`` line with this process's environment instead, after mending a
    torn last line. Every line is flushed and fsynced before `record` returns.

    Use as a context manager or call `close()`.
    """

    def __init__(
        self,
        run_id: str | None = None,
        out_dir: str | os.PathLike[str] = DEFAULT_RESULTS_DIR,
        *,
        environment: Mapping[str, Any] | None = None,
        extra_environment: Mapping[str, Any] | None = None,
        header_fields: Mapping[str, Any] | None = None,
    ) -> None:
        """Open (creating if needed) the run file.

        Args:
            run_id: the run to write; a new id when None. An existing file is appended to.
            out_dir: folder of result files.
            environment: use this instead of `collect_environment()` (tests, merges).
            extra_environment: entries added to the collected environment.
            header_fields: extra top-level header entries (e.g. the bench arguments).
        """
        self.run_id = check_run_id(run_id) if run_id is not None else new_run_id()
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / f"{self.run_id}.jsonl"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        env = dict(environment) if environment is not None else collect_environment()
        if extra_environment:
            env.update(extra_environment)
        self.environment = env
        self.resumed = self.path.exists() and self.path.stat().st_size > 0
        check_appendable(self.path)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.rows_written = 0
        if self.resumed:
            self._mend_torn_tail()
        header = RunHeader(
            "resume" if self.resumed else "header",
            self.run_id,
            utc_now(),
            env,
            dict(header_fields or {}),
        )
        self._write_line(header.to_json())

    def _mend_torn_tail(self) -> None:
        with open(self.path, "rb") as fh:
            fh.seek(-1, os.SEEK_END)
            last = fh.read(1)
        if last != b"\n":
            log.warning(
                "%s: last line is torn (a killed writer); continuing on a new line", self.path
            )
            self._raw_write(b"\n")

    def _raw_write(self, data: bytes) -> None:
        if self._fd is None:
            raise ResultsError(f"results file {self.path} is closed")
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        os.fsync(self._fd)

    def _write_line(self, obj: Mapping[str, Any]) -> None:
        text = json.dumps(obj, separators=(",", ":"), allow_nan=False, default=str)
        self._raw_write(text.encode("utf-8") + b"\n")

    def record(
        self,
        suite: str,
        case: Mapping[str, Any],
        metric: str,
        value: float,
        unit: str,
        stats: Mapping[str, float | int] | None = None,
        note: str = "",
    ) -> dict[str, Any]:
        """Append one measurement and make it durable; returns the row written.

        Args:
            suite: which sweep or suite measured it, e.g. "kernel.decode".
            case: the case parameters (str / number / bool / None values).
            metric: what was measured, e.g. "time", "bandwidth_fraction".
            value: the measured value (finite).
            unit: its unit, e.g. "s", "B/s", "fraction", "tokens".
            stats: repeat statistics (median, q1, q3, n, min, max, ...), finite numbers.
            note: text that goes with the number ("" for none; e.g. why a kernel ran).

        Raises ConfigError for a bad argument (nothing is written).
        """
        row = ResultRow(suite, case, metric, value, unit, stats, utc_now(), note=note).to_json()
        self._write_line(row)
        self.rows_written += 1
        return row

    def record_status(
        self,
        suite: str,
        case: Mapping[str, Any],
        status: Status | str,
        *,
        error: str = "",
        message: str = "",
    ) -> dict[str, Any]:
        """Append how a case ended (durable like a row); returns the line written.

        Args:
            status: "measured", "failed" (give `error`, the exception's class name, and
                its `message`) or "skipped" (give the reason as `message`).

        Raises ConfigError for a bad argument (nothing is written).
        """
        line = CaseStatus(suite, case, parse_status(status), error, message, utc_now()).to_json()
        self._write_line(line)
        return line

    def record_failure(self, suite: str, case: Mapping[str, Any], exc: BaseException) -> None:
        """Record `exc` as the end of a case: a `CaseSkipped` is a skip with its reason,
        anything else a failure with its class and message."""
        if isinstance(exc, CaseSkipped):
            self.record_status(suite, case, Status.SKIPPED, message=str(exc) or type(exc).__name__)
        else:
            message = str(exc)[:2000]
            self.record_status(
                suite, case, Status.FAILED, error=type(exc).__name__, message=message
            )

    def record_many(
        self,
        suite: str,
        case: Mapping[str, Any],
        metrics: Iterable[tuple[str, float, str] | tuple[str, float, str, Mapping[str, Any]]],
    ) -> None:
        """Record several metrics of one case: (metric, value, unit[, stats]) tuples."""
        for item in metrics:
            self.record(suite, case, *item)  # type: ignore[arg-type]

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        with contextlib.suppress(Exception):
            self.close()
