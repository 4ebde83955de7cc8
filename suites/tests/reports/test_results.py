"""The results store: durable appends, validation on load, schema versions, export, merge."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvbench.reports.store.environment import collect_environment
from kvbench.reports.store.frame import BASE_COLUMNS, export_frame, parquet_available, to_frame
from kvbench.reports.store.reader import (
    RunNotFoundError,
    latest_run,
    load_run,
    load_runs,
    resolve_run,
)
from kvbench.reports.store.schema import SCHEMA_VERSION, ResultsError, SchemaVersionError, case_key
from kvbench.reports.store.writer import ResultWriter
from kvbench.suites.cli import main as kvbench
from kvbench.workloads.errors import ConfigError

ENV = {"device": "test-device", "cpu_model": "test-cpu", "git_revision": "abc", "git_dirty": True}


def _writer(tmp_path: Path, run_id: str | None = None) -> ResultWriter:
    return ResultWriter(run_id, tmp_path, environment=ENV)


def test_collected_environment_names_device_versions_and_git() -> None:
    env = collect_environment({"copy_peak_bytes_per_s": 1.0})
    for key in ("device", "cpu_model", "torch", "triton", "python", "git_revision", "git_dirty"):
        assert key in env, key
    assert env["python"] == ".".join(map(str, sys.version_info[:3]))
    assert env["copy_peak_bytes_per_s"] == 1.0


def test_roundtrip_header_and_rows(tmp_path: Path) -> None:
    with _writer(tmp_path, "run-a") as w:
        w.record(
            "kernel.decode",
            {"block_size": 16, "dtype": "float16"},
            "time",
            1.5e-4,
            "s",
            {"median": 1.5e-4, "q1": 1.4e-4, "q3": 1.6e-4, "n": 20},
        )
        w.record("capacity", {"model": "llama-2-70b"}, "bytes_per_token", 327680, "B")
    run = load_run(tmp_path / "run-a.jsonl")
    assert run.run_id == "run-a"
    assert run.environment == ENV
    assert run.header["schema"] == SCHEMA_VERSION
    assert run.problems == []
    assert [r["metric"] for r in run.rows] == ["time", "bytes_per_token"]
    assert run.rows[0]["stats"]["n"] == 20
    assert run.suites == ["kernel.decode", "capacity"]
    frame = run.frame()
    assert list(frame.columns[:7]) == list(BASE_COLUMNS)
    assert frame.loc[0, "block_size"] == 16
    assert frame.loc[0, "stats.q3"] == pytest.approx(1.6e-4)
    assert frame.loc[1, "value"] == 327680
    assert math.isnan(frame.loc[1, "stats.median"])


@given(
    case=st.dictionaries(
        st.text(min_size=1, max_size=8),
        st.one_of(
            st.integers(-(2**53), 2**53),
            st.floats(allow_nan=False, allow_infinity=False),
            st.text(max_size=12),
            st.booleans(),
            st.none(),
        ),
        max_size=5,
    ),
    value=st.floats(allow_nan=False, allow_infinity=False),
    suite=st.text(min_size=1, max_size=10).filter(str.strip),
)
def test_any_valid_row_roundtrips_exactly(tmp_path_factory, case, value, suite) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp("rt")
    with ResultWriter("r", folder, environment=ENV) as w:
        w.record(suite, case, "m", value, "u")
    (row,) = load_run(folder / "r.jsonl", strict=True).rows
    assert row["case"] == case
    assert row["value"] == value
    assert row["suite"] == suite


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"value": float("nan")}, "finite"),
        ({"value": float("inf")}, "finite"),
        ({"value": "fast"}, "number"),
        ({"case": {"x": [1, 2]}}, "'x'"),
        ({"case": {"x": float("nan")}}, "'x'"),
        ({"suite": ""}, "suite"),
        ({"metric": "  "}, "metric"),
        ({"unit": None}, "unit"),
        ({"stats": {"median": float("nan")}}, "median"),
        ({"stats": [1, 2]}, "stats"),
    ],
)
def test_bad_record_raises_and_writes_nothing(tmp_path: Path, kwargs: dict, needle: str) -> None:
    w = _writer(tmp_path, "bad")
    before = (tmp_path / "bad.jsonl").read_bytes()
    args = {"suite": "s", "case": {"a": 1}, "metric": "m", "value": 1.0, "unit": "s"}
    args.update(kwargs)
    with pytest.raises(ConfigError, match=needle):
        w.record(**args)
    w.close()
    assert (tmp_path / "bad.jsonl").read_bytes() == before


@pytest.mark.parametrize("run_id", ["", "../x", "a/b", ".hidden"])
def test_bad_run_id_is_refused(tmp_path: Path, run_id: str) -> None:
    with pytest.raises(ConfigError, match="run id"):
        ResultWriter(run_id, tmp_path, environment=ENV)


def test_corrupt_line_is_reported_with_file_and_line_and_the_rest_loads(tmp_path: Path) -> None:
    with _writer(tmp_path, "c") as w:
        for i in range(4):
            w.record("s", {"i": i}, "m", float(i), "u")
    path = tmp_path / "c.jsonl"
    lines = path.read_text().splitlines()
    lines[2] = lines[2][:10] + "#garbage"  # row i=1 (line 3)
    lines[3] = json.dumps(
        {
            "kind": "row",
            "schema": 1,
            "suite": "s",
            "case": {},
            "metric": "m",
            "value": "slow",
            "unit": "u",
        }
    )  # wrong type (line 4)
    path.write_text("\n".join(lines) + "\n")
    run = load_run(path)
    assert [r["case"]["i"] for r in run.rows] == [0, 3]
    assert [p.line for p in run.problems] == [3, 4]
    assert all(p.path == str(path) for p in run.problems)
    assert "'value'" in run.problems[1].message
    assert str(run.problems[0]).startswith(f"{path}:3:")
    with pytest.raises(ResultsError, match=r"c\.jsonl:3:"):
        load_run(path, strict=True)


def test_truncated_last_line_and_resume_on_a_fresh_line(tmp_path: Path) -> None:
    with _writer(tmp_path, "t") as w:
        for i in range(3):
            w.record("s", {"i": i}, "m", float(i), "u")
    path = tmp_path / "t.jsonl"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 15])  # tear the last row
    run = load_run(path)
    assert [r["case"]["i"] for r in run.rows] == [0, 1]
    (problem,) = run.problems
    assert problem.line == 4 and "truncated" in problem.message
    with _writer(tmp_path, "t") as w:
        assert w.resumed
        w.record("s", {"i": 2}, "m", 2.0, "u")
    run = load_run(path)
    assert [r["case"]["i"] for r in run.rows] == [0, 1, 2]
    assert len(run.resumes) == 1 and [p.line for p in run.problems] == [4]
    assert run.case_keys("s") == {case_key("s", {"i": i}) for i in range(3)}


def test_kill_9_loses_no_recorded_row(tmp_path: Path) -> None:
    """A writer killed with SIGKILL keeps every row `record` returned from."""
    script = textwrap.dedent(
        f"""
        import sys
        from kvbench.reports.store.writer import ResultWriter
        w = ResultWriter("k", {str(tmp_path)!r}, environment={{"device": "x"}})
        i = 0
        while True:
            w.record("s", {{"i": i}}, "m", float(i), "u")
            print(i, flush=True)
            i += 1
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    acknowledged = -1
    deadline = time.monotonic() + 60
    while acknowledged < 30 and time.monotonic() < deadline:
        acknowledged = int(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    run = load_run(tmp_path / "k.jsonl")
    got = [r["case"]["i"] for r in run.rows]
    assert got == list(range(len(got)))
    assert len(got) >= acknowledged + 1
    assert len(run.problems) <= 1  # at most the line in flight


def test_newer_schema_is_refused_clearly(tmp_path: Path) -> None:
    path = tmp_path / "future.jsonl"
    path.write_text(
        json.dumps(
            {
                "kind": "header",
                "schema": SCHEMA_VERSION + 1,
                "run_id": "future",
                "environment": {},
            }
        )
        + "\n"
    )
    with pytest.raises(SchemaVersionError, match=f"schema {SCHEMA_VERSION + 1}"):
        load_run(path)
    assert kvbench(["report", str(path), "--out", str(tmp_path / "site")]) == 2


def test_missing_and_ambiguous_runs(tmp_path: Path) -> None:
    for rid in ("20260101-aa", "20260101-ab"):
        with _writer(tmp_path, rid) as w:
            w.record("s", {}, "m", 1.0, "u")
    assert resolve_run("20260101-aa", tmp_path).name == "20260101-aa.jsonl"
    with pytest.raises(ResultsError, match="ambiguous"):
        resolve_run("20260101-a", tmp_path)
    with pytest.raises(RunNotFoundError, match="nope"):
        resolve_run("nope", tmp_path)
    assert resolve_run("latest", tmp_path).suffix == ".jsonl"


def test_export_csv_and_parquet(tmp_path: Path) -> None:
    with _writer(tmp_path, "e") as w:
        w.record("s", {"b": 16}, "m", 2.5, "u", {"median": 2.5, "n": 3})
    frame = to_frame(load_runs(["e"], tmp_path))
    out = export_frame(frame, tmp_path / "x.csv")
    import pandas as pd

    back = pd.read_csv(out)
    assert back.loc[0, "value"] == 2.5 and back.loc[0, "b"] == 16
    if parquet_available():
        export_frame(frame, tmp_path / "x.parquet")
        assert pd.read_parquet(tmp_path / "x.parquet").loc[0, "value"] == 2.5
    else:
        with pytest.raises(ConfigError, match="pyarrow"):
            export_frame(frame, tmp_path / "x.parquet")
    with pytest.raises(ConfigError, match=r"\.xlsx"):
        export_frame(frame, tmp_path / "x.xlsx")


def _shard(
    tmp_path: Path, run_id: str, k: int, n: int, cases: list[int], planned: int = 1, **bench
) -> None:
    bench = {"sweeps": ["s"], "full": False, "seed": 0, "shard": f"{k}/{n}", **bench}
    header = {"planned_cases": planned, "bench": bench}
    with ResultWriter(run_id, tmp_path, environment=ENV, header_fields=header) as w:
        for i in cases:
            w.record("s", {"i": i}, "m", float(i), "u")


def test_merge_keeps_every_part_and_drops_duplicates(tmp_path: Path) -> None:
    _shard(tmp_path, "p1", 1, 2, [0, 2])
    _shard(tmp_path, "p2", 2, 2, [1, 2])
    assert kvbench(["merge", "p1", "p2", "--into", "all", "--dir", str(tmp_path)]) == 0
    merged = load_run(tmp_path / "all.jsonl")
    assert sorted(r["case"]["i"] for r in merged.rows) == [0, 1, 2]
    assert [p["run_id"] for p in merged.header["merged_from"]] == ["p1", "p2"]
    assert merged.header["bench"]["merged_shards"] == 2
    assert latest_run(tmp_path, kind="bench") == tmp_path / "all.jsonl"


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        (lambda t: None, ["p1", "p2", "--into", "old"], "already exists"),
        (lambda t: None, ["p1", "p1"], "given twice"),
        (lambda t: _shard(t, "q1", 1, 2, [0]), ["p1", "q1"], "shard 1/2 is given twice"),
        (lambda t: None, ["p1"], "incomplete set: shard(s) 2/2 missing"),
        (lambda t: _shard(t, "o2", 2, 2, [1], seed=7), ["p1", "o2"], "seed"),
        (lambda t: _shard(t, "w2", 2, 2, [1], sweeps=["t"]), ["p1", "w2"], "sweeps"),
        (lambda t: _shard(t, "n3", 2, 3, [1]), ["p1", "n3"], "different splits"),
        (lambda t: (t / "junk.jsonl").write_bytes(b"\x00\xff junk"), ["p1", "junk"], "not a shard"),
    ],
)
def test_merge_refuses_what_is_not_one_whole_sharded_run_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture, setup, args: list[str], message: str
) -> None:
    _shard(tmp_path, "p1", 1, 2, [0])
    _shard(tmp_path, "p2", 2, 2, [1])
    with _writer(tmp_path, "old") as w:
        w.record("s", {"i": 9}, "m", 9.0, "u")
    setup(tmp_path)
    before = _tree(tmp_path)
    capsys.readouterr()
    assert kvbench(["merge", *args, "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert _tree(tmp_path) == before


def test_merge_of_an_incomplete_set_when_allowed_says_what_is_missing(tmp_path: Path) -> None:
    _shard(tmp_path, "p1", 1, 3, [0])
    _shard(tmp_path, "p3", 3, 3, [2])
    args = ["merge", "p1", "p3", "--into", "m", "--allow-incomplete", "--dir", str(tmp_path)]
    assert kvbench(args) == 0
    merged = load_run(tmp_path / "m.jsonl")
    assert merged.header["bench"]["missing_shards"] == ["2/3"] and merged.planned_cases == 2


def test_results_cli_lists_and_exports(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert kvbench(["results", "--dir", str(tmp_path)]) == 0
    assert "no runs" in capsys.readouterr().out
    with _writer(tmp_path, "listed") as w:
        w.record("capacity", {}, "m", 1.0, "u")
    assert kvbench(["results", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "listed" in out and "test-device" in out and "capacity" in out
    target = tmp_path / "o.csv"
    assert (
        kvbench(["results", "--dir", str(tmp_path), "--export", "listed", "--to", str(target)]) == 0
    )
    assert target.is_file()
    assert kvbench(["results", "--dir", str(tmp_path), "--export", "missing", "--to", "x.csv"]) == 2
    assert "missing" in capsys.readouterr().err


def test_latest_is_by_start_time_and_can_be_narrowed_to_bench_runs(tmp_path: Path) -> None:
    with ResultWriter(
        "zzz-old-bench", tmp_path, environment=ENV, header_fields={"bench": {"sweeps": "all"}}
    ) as w:
        w.record("s", {}, "m", 1.0, "u")
    time.sleep(0.01)
    with ResultWriter("aaa-new-gate", tmp_path, environment=ENV, header_fields={"gate": {}}) as w:
        w.record("s", {}, "m", 1.0, "u")
    assert resolve_run("latest", tmp_path).name == "aaa-new-gate.jsonl"
    assert resolve_run("latest", tmp_path, kind="bench").name == "zzz-old-bench.jsonl"
    with pytest.raises(RunNotFoundError, match="no nope runs"):
        latest_run(tmp_path, kind="nope")
