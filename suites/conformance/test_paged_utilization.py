"""`kvbench utilization`: cache-measured utilization equals [paged-sim]'s formulas on the same
draws, the seed's figures are reproduced, and the shared-prompt block counts are exact."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvbench.paged.utilization import (
    measure_batch,
    seed002_lengths,
    shared_prompt_blocks,
    utilization_table,
)
from kvbench.suites.cli import main
from kvbench.workloads.errors import ConfigError


def test_draws_follow_seed_002() -> None:
    rng = np.random.RandomState(42)
    expected = [np.clip(rng.normal(500, 200, n).astype(int), 200, 2048) for n in (10, 25)]
    got = seed002_lengths((10, 25))
    assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True))


def test_measured_utilization_equals_the_formulas() -> None:
    lengths = [200, 333, 2048, 17, 16]
    row = measure_batch(lengths, block_size=16, max_len=2048)
    live = sum(lengths)
    assert row.live_tokens == live
    assert row.naive_utilization == pytest.approx(live / (2048 * len(lengths)))
    pages = sum(-(-n // 16) for n in lengths)
    assert row.paged_blocks == pages
    assert row.paged_utilization == pytest.approx(live / (pages * 16))


def test_seed_002_figures() -> None:
    rows = utilization_table()
    assert [r.batch_size for r in rows] == [10, 25, 50, 100, 200]
    big = [r for r in rows if r.batch_size >= 50]
    assert all(abs(r.naive_utilization - 0.245) < 0.01 for r in big)  # "about 24%"
    assert all(abs(r.paged_utilization - 0.985) < 0.005 for r in rows)  # "about 98.5%"


def test_shared_system_prompt_blocks() -> None:
    s = shared_prompt_blocks(10, 200, 16)
    assert (s.no_sharing, s.fork_sharing, s.after_one_diverges) == (130, 13, 14)
    assert s.prefix_caching == 12 + 10  # 12 shared full blocks + each request's partial one


def test_command_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["utilization", "--batch-sizes", "10,20", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["batch_size"] for r in data["utilization"]] == [10, 20]
    assert data["sharing"]["fork_sharing"] == 13


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["utilization", "--batch-sizes", "10,x"]) == 2
    assert main(["utilization", "--block-size", "0"]) == 2
    assert "--block-size: '0'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="min_len"):
        seed002_lengths((10,), min_len=0)
