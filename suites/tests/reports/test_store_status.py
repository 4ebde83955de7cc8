"""Every case ends in a status record (measured, failed, skipped), and a killed run reads
as incomplete: the typed records, the bench runner that writes them, the reader's
summary."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvbench.reports.provenance import COUNTED
from kvbench.reports.store.merge import merge_runs
from kvbench.reports.store.reader import DONE_METRIC, load_run, summarize
from kvbench.reports.store.schema import ResultRow, Status
from kvbench.reports.store.writer import ResultWriter
from kvbench.suites.bench import registry
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.harness import TimingConfig
from kvbench.suites.bench.runner import run_bench
from kvbench.workloads.errors import CaseSkipped, ConfigError

ENV = {"device": "cpu", "cpu_model": "test"}


def _status_cases(full: bool) -> list[dict]:
    return [{"i": i} for i in range(3)]


@registry.sweep(
    "test.statuses",
    "one measured, one failed, one skipped (test only)",
    _status_cases,
    produced=(COUNTED,),
)
def _statuses(case: dict, ctx: BenchContext) -> list[registry.Measurement]:
    if case["i"] == 1:
        raise ZeroDivisionError("the kernel divided by zero")
    if case["i"] == 2:
        raise CaseSkipped("needs a GPU; none here")
    return [registry.Measurement("x", 1.0, "")]


def test_runner_writes_a_status_for_every_case(tmp_path: Path) -> None:
    res = run_bench(
        ["test.statuses"],
        out_dir=tmp_path,
        device=torch.device("cpu"),
        timing=TimingConfig(warmup=0, repeats=1, min_sample_s=0.0),
        progress=False,
    )
    assert [name for name, _ in res.failures] == ["test.statuses {'i': 1}"]
    run = load_run(res.path)
    by_case = {s.case["i"]: s for s in run.statuses}
    assert by_case[0].status == "measured"
    assert by_case[1].status == "failed" and by_case[1].error == "ZeroDivisionError"
    assert "divided by zero" in by_case[1].message
    assert by_case[2].status == "skipped" and by_case[2].message == "needs a GPU; none here"
    summary = summarize(run)
    assert (summary.ended, summary.planned, summary.failed, summary.skipped) == (3, 3, 1, 1)
    assert not summary.incomplete


def test_a_killed_run_reads_incomplete(tmp_path: Path) -> None:
    with ResultWriter("k", tmp_path, environment=ENV, header_fields={"planned_cases": 5}) as w:
        for i in range(2):
            w.record("s", {"i": i}, "m", 1.0, "u")
            w.record_status("s", {"i": i}, "measured")
        w.record("s", {"i": 2}, "m", 1.0, "u")  # killed before case 2 ended
    run = load_run(tmp_path / "k.jsonl")
    assert run.completeness() == (2, 5)
    assert summarize(run).incomplete


def test_runs_without_status_lines_count_done_rows_as_measured(tmp_path: Path) -> None:
    with ResultWriter("old", tmp_path, environment=ENV) as w:
        w.record("s", {"i": 0}, "m", 1.0, "u")
        w.record("s", {"i": 0}, DONE_METRIC, 0.1, "s")
    run = load_run(tmp_path / "old.jsonl")
    assert [s.status for s in run.outcomes().values()] == ["measured"]
    assert run.completeness() == (1, None)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"status": "done"}, "status must be one of"),
        ({"status": "failed"}, "error class"),
        ({"status": "skipped"}, "say why"),
        ({"status": "measured", "case": {"x": [1]}}, "'x'"),
    ],
)
def test_bad_status_is_refused_and_writes_nothing(
    tmp_path: Path, kwargs: dict, needle: str
) -> None:
    w = ResultWriter("bad", tmp_path, environment=ENV)
    before = (tmp_path / "bad.jsonl").read_bytes()
    args = {"suite": "s", "case": {"a": 1}, **kwargs}
    with pytest.raises(ConfigError, match=needle):
        w.record_status(**args)
    w.close()
    assert (tmp_path / "bad.jsonl").read_bytes() == before


def test_statuses_are_an_enum_whose_values_the_file_stores(tmp_path: Path) -> None:
    """Status lines store the lower-case value, as before the enum; a line written by hand
    in that form (an older run) reads back as the enum member."""
    assert [s.value for s in Status] == ["measured", "failed", "skipped"]
    assert str(Status.FAILED) == "failed" and f"{Status.SKIPPED}" == "skipped"
    with ResultWriter("e", tmp_path, environment=ENV) as w:
        w.record_status("s", {"i": 0}, Status.MEASURED)
        w.record_status("s", {"i": 1}, "skipped", message="no GPU")
    lines = (tmp_path / "e.jsonl").read_text().splitlines()
    assert '"status":"measured"' in lines[1] and '"status":"skipped"' in lines[2]
    old = '{"kind": "status", "schema": 1, "suite": "s", "case": {"i": 2}, "status": "failed", '
    old += '"error": "OSError", "message": "disk", "time": ""}\n'
    with open(tmp_path / "e.jsonl", "a") as fh:
        fh.write(old)
    statuses = [s.status for s in load_run(tmp_path / "e.jsonl").statuses]
    assert statuses == [Status.MEASURED, Status.SKIPPED, Status.FAILED]
    assert all(type(s) is Status for s in statuses)


def test_rows_are_typed_and_read_like_dicts(tmp_path: Path) -> None:
    with ResultWriter("t", tmp_path, environment=ENV) as w:
        w.record("s", {"a": 1}, "time", 2.0, "s", {"median": 2.0, "n": 3})
    (row,) = load_run(tmp_path / "t.jsonl").rows
    assert isinstance(row, ResultRow)
    assert row.metric == row["metric"] == "time" and row.stats == {"median": 2.0, "n": 3}
    assert dict(row)["case"] == {"a": 1}


def test_merge_keeps_statuses_and_sums_the_plans(tmp_path: Path) -> None:
    for k, (name, planned) in enumerate((("p1", 2), ("p2", 3)), start=1):
        bench = {"sweeps": ["s"], "full": False, "seed": 0, "shard": f"{k}/2"}
        with ResultWriter(
            name,
            tmp_path,
            environment=ENV,
            header_fields={"planned_cases": planned, "bench": bench},
        ) as w:
            w.record_status("s", {"part": name}, "skipped", message="no peer")
    parts = [load_run(tmp_path / f"{n}.jsonl") for n in ("p1", "p2")]
    path, _, _ = merge_runs(parts, "joined", tmp_path)
    joined = load_run(path)
    assert joined.completeness() == (2, 5)


def test_site_shows_failed_skipped_and_incomplete(tmp_path: Path) -> None:
    """A deliberately failing case shows as failed on its sweep page and the index; a
    sweep whose every case failed still gets a page; a killed run reads incomplete."""
    from kvbench.reports.site import build_site

    env = {**ENV, "git_revision": "x"}
    with ResultWriter("r", tmp_path, environment=env, header_fields={"planned_cases": 4}) as w:
        w.record("good.sweep", {"i": 0}, "time", 1.0, "s")
        w.record_status("good.sweep", {"i": 0}, "measured")
        w.record_status("good.sweep", {"i": 1}, "skipped", message="peer vllm not installed")
        w.record_status("bad.sweep", {"i": 0}, "failed", error="KernelDisagreesError",
                        message="paged output differs from SDPA by 0.5")  # fmt: skip
    index = build_site([load_run(tmp_path / "r.jsonl")], tmp_path / "site")
    text = index.read_text()
    assert "incomplete: 3 of 4 cases" in text
    assert "1 failed" in text and "1 skipped" in text
    pages = {p.name: p.read_text() for p in index.parent.glob("sweep-*.html")}
    bad = next(t for n, t in pages.items() if "bad.sweep" in n)
    assert "Failed cases (1)" in bad and "KernelDisagreesError" in bad and "by 0.5" in bad
    good = next(t for n, t in pages.items() if "good.sweep" in n)
    assert "Skipped cases (1)" in good and "peer vllm not installed" in good
