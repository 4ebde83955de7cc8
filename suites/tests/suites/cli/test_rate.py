"""`kvbench rate`: bad values exit 2 with one line naming them; a small run prints its table."""

from __future__ import annotations

import pytest

from kvbench.suites.cli import main


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--rates", "0"], "0.0"),
        (["--rates", "-1"], "-1.0"),
        (["--rates", "nan"], "nan"),
        (["--rates", "2,x"], "'x'"),
        (["--bound", "0"], "--bound: '0'"),
        (["--bound", "-0.5"], "--bound: '-0.5'"),
        (["--duration", "0"], "--duration: '0'"),
        (["--system", "orca"], "'orca'"),
        (["--setup", "gpt-9"], "'gpt-9'"),
        (["--workload", "nope"], "'nope'"),
    ],
)
def test_bad_values_exit_2_with_one_line(
    args: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["rate", *args, "--no-knee"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0], err


def test_a_small_run_prints_latency_and_knee(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        ["rate", "--system", "paged", "--rates", "2", "--duration", "20", "--workload", "alpaca"]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "opt-13b-1xa100-40gb, alpaca, Poisson rate: modeled" in out
    assert "sustained load" in out and "paged" in out
