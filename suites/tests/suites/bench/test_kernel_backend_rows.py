"""The kernel sweeps' rows say which backend ran and why (`kernels.backends`): a
`backend_<name>` row whose note is the reason, carried by the runner into the results
file and the frame."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvbench.kernels import cpu_paged, ops
from kvbench.reports.provenance import MEASURED
from kvbench.reports.store.frame import to_frame
from kvbench.reports.store.reader import load_run
from kvbench.suites.bench import (
    catalog,  # noqa: F401  (registers the sweeps)
    registry,
)
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.harness import TimingConfig
from kvbench.suites.bench.runner import run_bench
from kvbench.suites.bench.sweeps.kernels import backend_rows

FAST = TimingConfig(warmup=1, repeats=3, min_sample_s=0.0)


def _backend_row(rows: list[registry.Measurement]) -> registry.Measurement:
    named = [m for m in rows if m.metric.startswith("backend_") and m.metric != "backend_is_triton"]
    assert len(named) == 1, [m.metric for m in named]
    return named[0]


@pytest.mark.parametrize("name", ["kernel.decode", "kernel.prefill", "kernel.decode_fp8"])
def test_a_kernel_sweep_row_carries_the_backend_and_why(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked for the gather path by KVBENCH_CPU_KERNEL=torch: the row names torch_gather,
    its note says the variable asked, and kernel_path_is_cpp follows the choice."""
    monkeypatch.setenv("KVBENCH_CPU_KERNEL", "torch")
    case = {"block_size": 8, "ctx_len": 24, "batch": 2, "dtype": "float32", "gqa": 2}
    if name == "kernel.prefill":
        case["q_len"] = 5
    if name == "kernel.decode_fp8":
        case = {"block_size": 8, "ctx_len": 24, "batch": 2, "gqa": 2, "kv_dtype": "fp8_e4m3",
                "scales": "head", "head_spread": 4}  # fmt: skip
    rows = list(registry.get_sweep(name).measure(case, BenchContext(torch.device("cpu"), FAST)))
    row = _backend_row(rows)
    assert (row.metric, row.value, row.unit) == ("backend_torch_gather", 1.0, "bool")
    assert row.note.startswith("KVBENCH_CPU_KERNEL=torch requested")
    assert "block size 8" in row.note
    assert {m.metric: m.value for m in rows}["kernel_path_is_cpp"] == 0.0


def test_kernel_decode_row_names_the_cpp_kernel_where_it_ran(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KVBENCH_CPU_KERNEL", raising=False)
    case = {"block_size": 8, "ctx_len": 24, "batch": 2, "dtype": "float32", "gqa": 2}
    rows = list(
        registry.get_sweep("kernel.decode").measure(case, BenchContext(torch.device("cpu"), FAST))
    )
    row = _backend_row(rows)
    if cpu_paged.status().path == "cpp":
        assert row.metric == "backend_cpu_paged"
        assert row.note.startswith("backend='torch': the torch side, C++ kernel first")
    else:
        assert row.metric == "backend_torch_gather" and cpu_paged.status().reason in row.note
    cpp = {m.metric: m.value for m in rows}["kernel_path_is_cpp"]
    assert cpp == float(row.metric == "backend_cpu_paged")


def _skipping_cases(full: bool) -> list[dict]:
    return [{"block_size": 512}]


@registry.sweep(
    "test.kernel_backend", "a decode over blocks too long for the C++ kernel (test only)",
    _skipping_cases, produced=(MEASURED,),
)  # fmt: skip
def _skipping(case: dict, ctx: BenchContext) -> list[registry.Measurement]:
    bs = case["block_size"]
    kc = torch.zeros(2, bs, 1, 8)
    q = torch.zeros(1, 2, 8)
    tables, lens = torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([bs + 1])
    launch = ops.decode_launch(q, kc, kc, tables, lens.to(torch.int32), backend="torch")
    return backend_rows(launch)


def test_the_runner_writes_the_reason_into_the_results_and_the_frame(tmp_path: Path) -> None:
    run_bench(["test.kernel_backend"], out_dir=tmp_path, run_id="b", progress=False, timing=FAST)
    run = load_run(tmp_path / "b.jsonl")
    (row,) = [r for r in run.rows if r["metric"].startswith("backend_")]
    assert row["metric"] == "backend_torch_gather" and row["value"] == 1.0
    assert "skipped cpu_paged: block size 512 > 256 the C++ kernel is compiled for" in row["note"]
    frame = to_frame([run])
    notes = frame[frame["metric"] == "backend_torch_gather"]["note"].tolist()
    assert notes == [row["note"]]
    done = [r for r in run.rows if r["metric"] != "backend_torch_gather"]
    assert all("note" not in r for r in done)  # rows without a note stay as they were
