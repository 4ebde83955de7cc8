"""Joining the shards of one sharded bench into one run file (`kvbench merge`)."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from kvbench.reports.store.environment import new_run_id
from kvbench.reports.store.files import DEFAULT_RESULTS_DIR
from kvbench.reports.store.reader import Run
from kvbench.reports.store.schema import ResultsError, case_key
from kvbench.reports.store.writer import ResultWriter, check_run_id

#: Bench options every shard of one run shares (the shard spec aside).
_SHARED_BENCH_OPTIONS = ("sweeps", "full", "seed")


def _bench(run: Run) -> dict:
    bench = run.header.get("bench")
    return bench if isinstance(bench, dict) else {}


def _shard_of(run: Run) -> tuple[int, int]:
    """(K, N) of a shard run's `bench.shard` "K/N"; ResultsError when it is not one."""
    spec = _bench(run).get("shard")
    m = re.fullmatch(r"(\d+)/(\d+)", spec) if isinstance(spec, str) else None
    if m is None:
        raise ResultsError(
            f"cannot merge {run.path}: it is not a shard of `kvbench bench --shard K/N` "
            "(its header names no shard)"
        )
    return int(m.group(1)), int(m.group(2))


def check_shards(runs: Sequence[Run], *, allow_incomplete: bool = False) -> list[int]:
    """Check `runs` are the shards of one sharded bench: each a `--shard K/N` run, all of
    the same sweeps, grid and seed and the same N, no shard (or file) twice, and every K
    from 1 to N present unless `allow_incomplete`. Returns the missing K (sorted);
    raises ResultsError naming the first problem."""
    if not runs:
        raise ResultsError("nothing to merge: no runs given")
    seen_paths: set[Path] = set()
    for run in runs:
        where = run.path.resolve()
        if where in seen_paths:
            raise ResultsError(f"run {run.run_id} ({run.path}) is given twice")
        seen_paths.add(where)
    shards = [_shard_of(r) for r in runs]
    first, n = _bench(runs[0]), shards[0][1]
    by_k: dict[int, Run] = {}
    for run, (k, nn) in zip(runs, shards, strict=True):
        if nn != n:
            raise ResultsError(
                f"cannot merge shards of different splits: {runs[0].run_id} is shard "
                f"{shards[0][0]}/{n}, {run.run_id} is shard {k}/{nn}"
            )
        for key in _SHARED_BENCH_OPTIONS:
            mine, theirs = _bench(run).get(key), first.get(key)
            if mine != theirs:
                raise ResultsError(
                    f"cannot merge shards of different runs: {runs[0].run_id} has {key}="
                    f"{theirs!r}, {run.run_id} has {key}={mine!r}"
                )
        if k in by_k:
            raise ResultsError(f"shard {k}/{n} is given twice: {by_k[k].run_id} and {run.run_id}")
        by_k[k] = run
    missing = [k for k in range(1, n + 1) if k not in by_k]
    if missing and not allow_incomplete:
        raise ResultsError(
            f"incomplete set: shard(s) {', '.join(f'{k}/{n}' for k in missing)} missing "
            "(pass them too, or --allow-incomplete to merge what there is, marked incomplete)"
        )
    return missing


def merge_runs(
    runs: Sequence[Run],
    run_id: str | None = None,
    out_dir: str | os.PathLike[str] = DEFAULT_RESULTS_DIR,
    *,
    allow_incomplete: bool = False,
) -> tuple[Path, int, int]:
    """Join the shards of one sharded bench into one new run file; returns (path, rows
    kept, duplicates).

    Everything is checked before anything is written (see `check_shards`; a `run_id`
    whose file exists is refused), so a refused merge changes no file. The new header is
    a bench header (so `kvbench report` takes the merged run as the latest bench run)
    recording each part's run id and environment, the sum of their planned cases, and
    the shards missing when `allow_incomplete`; its environment is the first part's. A
    (suite, case, metric) measured by several parts keeps the first; every part's case
    statuses are kept.
    """
    missing = check_shards(runs, allow_incomplete=allow_incomplete)
    rid = check_run_id(run_id) if run_id is not None else new_run_id()
    target = Path(out_dir) / f"{rid}.jsonl"
    if target.exists():
        raise ResultsError(f"cannot merge into {target}: the run already exists")
    parts = [{"run_id": r.run_id, "environment": r.environment, "path": str(r.path)} for r in runs]
    n = _shard_of(runs[0])[1]
    bench = dict(_bench(runs[0]))
    bench.update(
        shard=None,
        merged_shards=len(runs),
        missing_shards=[f"{k}/{n}" for k in missing],
        descriptions={k: v for r in runs for k, v in (_bench(r).get("descriptions") or {}).items()},
        waiting={k: v for r in runs for k, v in (_bench(r).get("waiting") or {}).items()},
        produced={k: v for r in runs for k, v in (_bench(r).get("produced") or {}).items()},
    )
    writer = ResultWriter(
        rid,
        out_dir,
        environment=runs[0].environment or {"device": "unknown"},
        header_fields={"merged_from": parts, "bench": bench, **_planned(runs)},
    )
    seen: set[tuple[str, str]] = set()
    kept = dupes = 0
    with writer:
        for run in runs:
            for row in run.rows:
                key = (case_key(row["suite"], row["case"]), row["metric"])
                if key in seen:
                    dupes += 1
                    continue
                seen.add(key)
                line = dict(row)
                line["source_run"] = run.run_id
                writer._write_line(line)
                kept += 1
            for status in run.statuses:
                writer._write_line(status.to_json())
    return writer.path, kept, dupes


def _planned(runs: Sequence[Run]) -> dict[str, int]:
    planned = [r.planned_cases for r in runs]
    if any(p is None for p in planned):
        return {}
    return {"planned_cases": sum(p for p in planned if p is not None)}
