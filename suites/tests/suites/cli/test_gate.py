"""`kvbench gate` end to end on recorded runs: exit 0 on an unchanged candidate, 1 on a
regression (naming kernel and metric), 2 on unusable input (truncated baseline, another
triton version, another device, no gate rows); `--update-baseline` refuses a run that
failed conformance. Runs are written with the real ResultWriter, in the layout the
measuring side (`suites.gate.run`) writes; nothing here is timed or compiled."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvbench.reports.store.writer import ResultWriter
from kvbench.suites.cli import main
from kvbench.suites.gate import (
    CONFORMANCE_SUITE,
    STATIC_SUITE,
    TIMING_SUITE,
    config_key,
    sha256_text,
)

FROZEN = "def paged_decode_attention(*a):\n    return None\n"
ENV = {
    "device": "cpu",
    "cuda": False,
    "cpu_model": "test",
    "torch": "2.13.0",
    "triton": "3.9.0",
    "torch_threads": 1,
}


def write_run(
    folder: Path,
    run_id: str,
    *,
    regs: int = 96,
    spills: int = 0,
    sass: int = 1200,
    ratio: float = 1.0,
    triton: str = "3.9.0",
    arch: str = "sm_90",
    passed: bool = True,
    cuda: bool = False,
    frozen: str = FROZEN,
    current: str | None = None,
    slowdown: float = 0.0,
    seed: int = 0,
) -> Path:
    """A recorded gate run; `current` is the run's own torch kernel source (default: the
    frozen one, i.e. kernels unchanged, an A/A timing run)."""
    env = {**ENV, "cuda": cuda, "triton": triton}
    current = frozen if current is None else current
    header = {
        "gate": {
            "frozen_sha256": sha256_text(frozen),
            "current_sha256": sha256_text(current),
            "current_source": current,
            "slowdown": slowdown,
        }
    }
    rng = np.random.default_rng(seed)
    with ResultWriter(run_id, folder, environment=env, header_fields=header) as w:
        w.record(
            CONFORMANCE_SUITE,
            {"check": "paged_decode", "backend": "torch"},
            "passed",
            int(passed),
            "bool",
        )
        for kernel, r in (("paged_decode", regs), ("copy_rows", 32)):
            case = {
                "kernel": kernel,
                "arch": arch,
                "triton": triton,
                "source_hash": "h",
                "reused": False,
                "config": config_key({"dtype": "fp16", "num_warps": 4}),
            }
            for metric, value in (
                ("registers", r),
                ("spills", spills if kernel == "paged_decode" else 0),
                ("shared_bytes", 4096),
                ("sass_instructions", sass if kernel == "paged_decode" else 300),
            ):
                w.record(STATIC_SUITE, case, metric, value, "")
        for i in range(24):
            value = ratio * float(np.exp(rng.normal(0, 0.05)))
            w.record(
                TIMING_SUITE,
                {"name": "paged_decode_vs_baseline", "context": 1024, "repeat": i},
                "ratio",
                value,
                "x",
            )
    return folder / f"{run_id}.jsonl"


@pytest.fixture
def setup(tmp_path):
    runs = tmp_path / "runs"
    write_run(runs, "base")
    sm90, cpu = tmp_path / "sm90.json", tmp_path / "cpu.json"
    args = ["gate", "--dir", str(runs), "--candidate", "base", "--update-baseline"]
    assert main([*args, "--baseline", str(sm90), "--baseline", str(cpu)]) == 0
    return tmp_path, runs, sm90, cpu


def gate(runs, *baselines, candidate, extra=()):
    args = ["gate", "--dir", str(runs), "--candidate", candidate, *extra]
    for b in baselines:
        args += ["--baseline", str(b)]
    return main(args)


def test_baselines_written_by_update(setup):
    _, _, sm90, cpu = setup
    s, c = json.loads(sm90.read_text()), json.loads(cpu.read_text())
    assert s["target"] == "sm_90" and s["counts"] == {"static": 2, "timing": 0}
    assert c["target"] == "cpu" and c["frozen"]["source"] == FROZEN


def test_unchanged_candidate_passes(setup, capsys):
    _, runs, sm90, cpu = setup
    write_run(runs, "same", seed=1)
    assert gate(runs, sm90, cpu, candidate="same", extra=["--all"]) == 0
    out = capsys.readouterr().out
    assert "gate PASS" in out and "regression" not in out


def test_heavier_kernel_fails_naming_kernel_and_metric(setup, capsys, tmp_path):
    _, runs, sm90, cpu = setup
    write_run(runs, "heavy", regs=104, sass=1400, seed=2)
    report = tmp_path / "verdict.json"
    html = tmp_path / "verdict.html"
    code = gate(
        runs, sm90, cpu, candidate="heavy", extra=["--json", str(report), "--html", str(html)]
    )
    assert code == 1
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if "regression" in ln]
    assert any("paged_decode" in ln and "registers" in ln for ln in lines)
    assert any("paged_decode" in ln and "sass_instructions" in ln for ln in lines)
    assert not any("copy_rows" in ln for ln in lines)
    assert json.loads(report.read_text())["exit_code"] == 1
    assert "regression" in html.read_text()


def test_new_spill_fails(setup, capsys):
    _, runs, sm90, _ = setup
    write_run(runs, "spill", spills=64, seed=3)
    assert gate(runs, sm90, candidate="spill") == 1
    assert "new spill" in capsys.readouterr().out


def test_twenty_percent_slower_ratio_fails(setup, capsys):
    _, runs, _, cpu = setup
    write_run(runs, "slow", ratio=1.2, seed=4, current=FROZEN + "# a kernel change\n")
    assert gate(runs, cpu, candidate="slow") == 1
    out = capsys.readouterr().out
    assert "paged_decode_vs_baseline" in out and "ratio" in out


def test_unchanged_kernels_timing_departure_is_noise_not_a_regression(setup, capsys, tmp_path):
    """Kernels byte-identical to the frozen copy: both sides of every *_vs_baseline ratio
    run the same code, so even a 20% departure passes, flagged as A/A noise (what a
    loaded CI machine can produce); the same departure with a changed kernel fails."""
    _, runs, _, cpu = setup
    write_run(runs, "aa", ratio=1.2, seed=5)
    verdict = tmp_path / "v.json"
    assert gate(runs, cpu, candidate="aa", extra=["--json", str(verdict)]) == 0
    row = json.loads(verdict.read_text())["rows"][0]
    assert row["verdict"] == "pass" and row["candidate"] > 1.1
    assert "A/A" in row["detail"] and "not judged" in row["detail"]
    write_run(runs, "changed", ratio=1.2, seed=5, current=FROZEN + "# changed\n")
    assert gate(runs, cpu, candidate="changed") == 1
    # an injected slowdown (--inject-slowdown) is not A/A: it is judged and caught
    write_run(runs, "injected", ratio=1.2, seed=5, slowdown=0.2)
    assert gate(runs, cpu, candidate="injected") == 1


def test_truncated_baseline_exits_2(setup, capsys):
    _, runs, sm90, _ = setup
    text = sm90.read_text()
    sm90.write_text(text[: len(text) * 2 // 3])
    assert gate(runs, sm90, candidate="base") == 2
    err = capsys.readouterr().err
    assert "truncated" in err and str(sm90) in err and len(err.strip().splitlines()) == 1


def test_other_triton_version_exits_2(setup, capsys):
    _, runs, sm90, _ = setup
    write_run(runs, "newtriton", triton="3.10.0")
    assert gate(runs, sm90, candidate="newtriton") == 2
    err = capsys.readouterr().err
    assert "3.9.0" in err and "3.10.0" in err and "not compared" in err


def test_baseline_for_another_device_exits_2(setup, capsys):
    _, runs, sm90, cpu = setup
    write_run(runs, "sm80", arch="sm_80")
    assert gate(runs, sm90, candidate="sm80") == 2
    assert "is for sm_90" in capsys.readouterr().err
    write_run(runs, "gpu", cuda=True)
    assert gate(runs, cpu, candidate="gpu") == 2
    assert "holds cpu timings" in capsys.readouterr().err


def test_update_refuses_failed_conformance(setup, capsys):
    _, runs, sm90, _ = setup
    before = sm90.read_text()
    write_run(runs, "broken", passed=False, regs=10)
    args = [
        "gate",
        "--dir",
        str(runs),
        "--candidate",
        "broken",
        "--update-baseline",
        "--baseline",
        str(sm90),
    ]
    assert main(args) == 2
    assert "failed conformance" in capsys.readouterr().err
    assert sm90.read_text() == before  # nothing overwritten
    assert gate(runs, sm90, candidate="broken") == 1  # and gating it fails


def test_run_without_gate_rows_and_missing_baseline_exit_2(setup, capsys):
    tmp, runs, sm90, _ = setup
    with ResultWriter("other", runs, environment=ENV) as w:
        w.record("kernel.decode", {"b": 1}, "time", 1.0, "s")
    assert gate(runs, sm90, candidate="other") == 2
    assert "no gate rows" in capsys.readouterr().err
    assert gate(runs, tmp / "absent.json", candidate="base") == 2
    assert "does not exist" in capsys.readouterr().err
