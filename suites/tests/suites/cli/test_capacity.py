"""`kvbench capacity`: correct tables, JSON for machines, exit 2 on bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvbench.suites.cli import main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code)
    out, err = capsys.readouterr()
    return code, out, err


def test_seed001_budget_table(capsys) -> None:
    code, out, _ = run_cli(
        capsys,
        "capacity",
        "--model",
        "llama-2-70b",
        "--kv-budget",
        "42000MiB",
        "--block-size",
        "16",
        "--avg-len",
        "500",
        "--max-len",
        "2048",
    )
    assert code == 0
    assert "5 MiB" in out and "8,400" in out and "134,400" in out
    lines = {k.strip(): v for k, v in (line.split("  ", 1) for line in out.splitlines())}
    assert lines["concurrent requests, paged at avg 500"].strip() == "268"
    assert lines["concurrent requests, contiguous at max 2048"].strip() == "65"
    assert lines["slot utilization at avg length, contiguous"].strip() == "24.4%"


def test_tensor_parallel_json(capsys) -> None:
    code, out, _ = run_cli(
        capsys,
        "capacity",
        "--model",
        "llama-2-70b",
        "--kv-budget",
        "8GiB",
        "--max-len",
        "8192",
        "--tp",
        "2",
        "--format",
        "json",
    )
    plan = json.loads(out)
    assert code == 0
    assert plan["kv_heads_per_rank"] == 4 and plan["kv_sharding"] == "sharded"
    assert round(plan["max_len_request_bytes_per_rank"] / 2**30, 2) == 1.30
    assert plan["max_len_requests_admissible"] == 6


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["capacity", "--model", "gpt-5", "--kv-budget", "1GB"], "gpt-5"),
        (["capacity", "--kv-budget", "lots"], "lots"),
        (["capacity", "--kv-budget", "1GB", "--block-size", "0"], "--block-size: '0'"),
        (
            ["capacity", "--kv-budget", "1GB", "--kv-heads", "3", "--tp", "2", "--dtype", "int2"],
            "int2",
        ),
        (["capacity", "--kv-budget", "1GB", "--block-size", "x"], "'x' is not an integer"),
        (["capacity"], "--kv-budget"),
        (["no-such-command"], "no-such-command"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(capsys, argv, names) -> None:
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert names in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_console_script_has_no_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvbench", "capacity", "--kv-budget", "0GB"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "0GB" in proc.stderr


def test_help_lists_the_options(capsys) -> None:
    code, out, _ = run_cli(capsys, "capacity", "--help")
    assert code == 0 and "--kv-budget" in out and "--tp" in out
