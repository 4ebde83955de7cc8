"""`kvbench gpu` (`nox -s gpu`): the plan on any machine, exit 2 in one line without CUDA,
and the run's own logic with CUDA mocked at its boundary (the device name and the step
processes), since no GPU runs these tests."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from kvbench.reports.store.writer import ResultWriter
from kvbench.suites.bench import gpu_plan
from kvbench.suites.cli import gpu as gpu_cli
from kvbench.suites.cli import main

ROOT = Path(__file__).resolve().parents[4]


def test_the_plan_is_the_gpu_grid_and_fits_eight_minutes() -> None:
    plan = gpu_plan.build_plan(n_tests=100, aot_cached=lambda cfg, arch: False)
    assert [s.name for s in plan.steps] == ["tests", "bench", "predict", "report"]
    sweeps = [sw for sw, *_ in plan.cases]
    # the grid a CUDA machine plans (fp16, batch 32 around the headline), not this CPU's
    assert sweeps.count("kernel.decode") == 12 and sweeps.count("kernel.prefill") == 4
    assert {c["dtype"] for _, c, *_ in plan.cases} == {"float16"}
    assert {"block_size": 16, "ctx_len": 4096, "batch": 32, "dtype": "float16", "gqa": 4} in [
        c for _, c, *_ in plan.cases
    ]
    assert sum(s.budget_s for s in plan.steps) <= gpu_plan.TOTAL_BUDGET_S < 8 * 60
    assert plan.estimate_s <= gpu_plan.TOTAL_BUDGET_S
    assert plan.n_aot_cached == 0 and plan.n_configs >= 3
    assert next(s for s in plan.steps if s.name == "predict").estimate_s > plan.n_configs


def test_the_bound_is_the_bytes_over_the_hbm_bandwidth() -> None:
    """Recomputed by hand: 32 x 4096 tokens x 8 KV heads x D 128 fp16, K and V, on the
    H100 profile's 3.35 TB/s at 0.9 of it, plus the 3 us launch (queries, outputs and
    block tables add 0.07%)."""
    case = {"block_size": 16, "ctx_len": 4096, "batch": 32, "dtype": "float16", "gqa": 4}
    kv = 2 * 32 * 4096 * 8 * 128 * 2
    expect = kv / (0.9 * 3.35e12) + 3e-6
    got = gpu_plan.bound_seconds("kernel.decode", case, "h100")
    assert got == pytest.approx(expect, rel=2e-3)
    assert gpu_plan.bound_seconds("kernel.decode", case, "h200") < got
    with pytest.raises(Exception, match="dtype"):
        gpu_plan.bound_seconds("kernel.decode", {**case, "dtype": "int3"}, "h100")


def test_dry_run_prints_the_plan_here(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(gpu_plan, "count_gpu_tests", lambda root=None: 7)  # skip collection
    assert main(["gpu", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "7 gpu tests" in out and "12 decode + 4 prefill cases" in out
    assert "total" in out and "450 s at most" in out
    assert sum(1 for line in out.splitlines() if "bound" in line and "us," in line) == 16


def test_without_cuda_the_run_exits_2_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["gpu"]) == 2
    err = capsys.readouterr()
    assert err.out == "" and len(err.err.strip().splitlines()) == 1
    assert "no CUDA device" in err.err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_gpu_profiles_by_device_name() -> None:
    assert gpu_plan.gpu_profile("NVIDIA H100 80GB HBM3") == "h100"
    assert gpu_plan.gpu_profile("NVIDIA H200") == "h200"
    assert gpu_plan.gpu_profile("NVIDIA A100-SXM4-40GB") == "a100"
    assert gpu_plan.gpu_profile("NVIDIA GeForce RTX 4090") is None


def _fake_steps(tests_xml: str, measured_s: float, interrupt: str = ""):  # type: ignore[no-untyped-def]
    """A stand-in for run_step: writes what each step's process would (JUnit XML, the
    run's rows, the comparison with a fixed prediction of 100 us, the site)."""
    seen: dict[str, list[str]] = {}

    def fake(name: str, argv: list[str], log: Path, budget_s: float) -> gpu_cli.StepResult:
        seen[name] = argv
        log.write_text("log\n", encoding="utf-8")
        if name == "tests":
            xml = next(a.split("=", 1)[1] for a in argv if a.startswith("--junitxml="))
            Path(xml).write_text(tests_xml, encoding="utf-8")
        elif name == "bench":
            run_id = argv[argv.index("--run-id") + 1]
            with ResultWriter(run_id, "out/results", environment={"t": 1}) as w:
                grid = gpu_plan.gpu_grid()
                for sweep, case in grid[: len(grid) - (name == interrupt)]:
                    w.record(sweep, case, "time_paged", measured_s, "s")
                    w.record(sweep, case, "host_time_paged", 30e-6, "s")
                    w.record(sweep, case, "timing_method_is_cudagraph", 1.0, "bool")
        elif name == "predict":
            assert argv[-2] == "h100"
            gpu_plan.write_comparison(Path(argv[-3]), lambda sw, c: 1e-4, Path(argv[-1]))
        elif name == "report":
            site = Path(argv[-1])
            site.mkdir(parents=True)
            (site / "index.html").write_text("<html></html>", encoding="utf-8")
        cut = name == interrupt
        return gpu_cli.StepResult(name, 130 if cut else 0, 1.0, cut)

    return fake, seen


PASSING = '<testsuites><testsuite tests="3" failures="0" errors="0" skipped="1"/></testsuites>'
FAILING = '<testsuites><testsuite tests="3" failures="1" errors="0" skipped="0"/></testsuites>'


@pytest.fixture
def cuda_here(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A repository-like folder and CUDA reported present (an H100)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "suites" / "conformance").mkdir(parents=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100 80GB HBM3")
    return tmp_path


def test_the_run_with_cuda_mocked(
    cuda_here: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake, seen = _fake_steps(PASSING, 1.2e-4)
    monkeypatch.setattr(gpu_cli, "run_step", fake)
    assert main(["gpu"]) == 0
    out = capsys.readouterr().out
    assert list(seen) == ["tests", "bench", "predict", "report"]
    assert seen["tests"][1:6] == ["-m", "pytest", "suites/conformance", "-m", "gpu"]
    assert seen["bench"][seen["bench"].index("--only") + 1 :][:2] == list(gpu_plan.GPU_SWEEPS)
    assert "gpu tests: 2 passed, 0 failed, 0 errors, 1 skipped" in out
    assert "kernel cases: 16 of 16 timed" in out
    assert "mean |measured/predicted - 1| 20.0%" in out and "median ratio 1.20" in out
    assert out.count("ratio 1.20, host 30 us a call") == 16
    (folder,) = (cuda_here / "out" / "gpu").iterdir()
    assert (folder / "summary.txt").read_text(encoding="utf-8").strip() in out
    assert (folder / "comparison.json").exists() and (folder / "site" / "index.html").exists()


@pytest.mark.parametrize(("xml", "interrupt"), [(FAILING, ""), (PASSING, "bench")])
def test_a_failed_test_or_a_cut_bench_fails_the_run(
    cuda_here: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    xml: str,
    interrupt: str,
) -> None:
    fake, _ = _fake_steps(xml, 1e-4, interrupt)
    monkeypatch.setattr(gpu_cli, "run_step", fake)
    assert main(["gpu"]) == 1
    out = capsys.readouterr().out
    if interrupt:
        assert "15 of 16 timed" in out and "interrupted at its budget" in out
    else:
        assert "1 failed" in out


def test_a_step_is_interrupted_at_its_budget(tmp_path: Path) -> None:
    res = gpu_cli.run_step(
        "x", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "x.log", 2.0
    )
    assert res.interrupted and res.rc != 0 and res.seconds < 30


def test_prediction_error() -> None:
    comps = gpu_plan.compare(
        {
            "a": {"sweep": "kernel.decode", "case": {}, "time_paged": 2e-4},
            "b": {"sweep": "kernel.decode", "case": {}, "time_paged": 0.5e-4},
        },
        lambda sw, c: 1e-4,
    )
    err = gpu_plan.prediction_error(comps)
    assert err["mean_abs_error"] == pytest.approx(0.75)  # |2 - 1| and |0.5 - 1|
    assert err["median_ratio"] == pytest.approx(1.25)
    with pytest.raises(Exception, match="positive"):
        gpu_plan.compare({"a": {"sweep": "s", "case": {}, "time_paged": 1.0}}, lambda s, c: 0.0)


#: The rows of the first GPU runs (an H200, 2026-11-28; docs/gpu.md).
GPU_RUNS = Path(__file__).resolve().parents[4] / "docs" / "gpu-runs"
H200_RUNS = ("gpu-20261128-084929.jsonl", "gpu-20261128-second.jsonl")


def _measured_case_walls() -> dict[tuple[str, str], list[float]]:
    from kvbench.reports.store.reader import load_run

    walls: dict[tuple[str, str], list[float]] = {}
    for name in H200_RUNS:
        for row in load_run(GPU_RUNS / name).rows:
            if row.get("metric") == "case_wall_time":
                key = (row["suite"], json.dumps(row["case"], sort_keys=True))
                walls.setdefault(key, []).append(float(row["value"]))
    return walls


def test_the_plan_matches_the_h200_runs_it_was_measured_on() -> None:
    """Every planned case was timed in both H200 runs; the plan's expected wall time of
    each is within 3x of what it took there, and of the whole bench within 30%."""
    walls = _measured_case_walls()
    grid = gpu_plan.gpu_grid()
    expected, measured = 0.0, 0.0
    for sweep, case in grid:
        took = walls[(sweep, json.dumps(dict(case), sort_keys=True))]
        assert len(took) == 2
        mean = sum(took) / len(took)
        est = gpu_plan.case_seconds(sweep, case, "h200", gpu_plan.DEFAULT_REPEATS)
        assert 1 / 3 < est / mean < 3, (sweep, case, est, took)
        expected, measured = expected + est, measured + mean
    assert abs(expected / measured - 1) < 0.3, (expected, measured)


def test_the_h200_rows_judge_the_kernel_overhead_claims_on_the_gpu() -> None:
    """On real GPU rows the paging-overhead claims are judged (not "not applicable"),
    labelled measured on a GPU, and do not hold: the overhead measured there is -0.6% to
    +0.6%, below both published ranges."""
    from kvbench.reports import claims
    from kvbench.reports.store.frame import to_frame
    from kvbench.reports.store.reader import load_run

    frame = to_frame([load_run(GPU_RUNS / H200_RUNS[0])])
    verdicts = {c.key: v for c, v in claims.evaluate(frame)}
    kernel = [v for key, v in verdicts.items() if "overhead" in key]
    assert len(kernel) >= 2
    for v in kernel:
        assert v.verdict == claims.FAILS
        assert "measured on a GPU" in v.note or "measured on a GPU" in v.measured
