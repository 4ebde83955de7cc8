"""`kvbench hitrate` on imported traces: the printed hit rate, ceiling and fraction are the
library's replay (`paged.hitrate`) and block-identity ceiling (`workloads.prefix_oracle`),
for a Mooncake import (shared prefixes) and an Azure import (none shared)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbench.paged.hitrate import replay
from kvbench.suites.cli import main
from kvbench.workloads import prefix_oracle
from kvbench.workloads.trace import Trace

ROWS = [  # (timestamp ms, input_length, hash_ids): conversations extending earlier turns
    (0, 1500, [0, 1, 2]),
    (100, 2000, [0, 1, 2, 3]),
    (200, 700, [5, 6]),
    (300, 2500, [0, 1, 2, 3, 4]),
    (400, 1000, [5, 6]),
    (500, 1200, [0, 1, 9]),
]


def _table(
    text: str, methods: dict[int, str] | None = None
) -> dict[int, tuple[float, float, float]]:
    """capacity -> (hit rate, ceiling, fraction) as fractions (None for "n/a"), from the
    printed table; each row's method into `methods` when given."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[0].replace(",", "").isdigit():
            cap = int(parts[0].replace(",", ""))
            out[cap] = tuple(  # type: ignore[assignment]
                None if p == "n/a" else float(p.rstrip("%")) / 100 for p in parts[1:4]
            )
            if methods is not None:
                methods[cap] = parts[4]
    return out  # type: ignore[return-value]


@pytest.mark.parametrize("block_size", [512, 64])
def test_hitrate_prints_the_replay_and_the_ceiling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], block_size: int
) -> None:
    src = tmp_path / "m.jsonl"
    src.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": n, "output_length": 3, "hash_ids": ids})
            + "\n"
            for t, n, ids in ROWS
        )
    )
    out = tmp_path / "t.jsonl"
    assert main(["workload", "--import", f"mooncake:{src}", "--out", str(out)]) == 0
    trace = Trace.read(out)
    caps = [2048, 4096, 10**6]
    capsys.readouterr()
    args = ["hitrate", "-q", "--trace", str(out), "--block-size", str(block_size)]
    assert main([*args, "--capacity", ",".join(map(str, caps))]) == 0
    methods: dict[int, str] = {}
    table = _table(capsys.readouterr().out, methods)
    acc = prefix_oracle.block_accesses(trace, block_size)
    # the largest capacity holds the footprint: the ceiling, not a replay, says the table
    assert methods == {2048: "replay", 4096: "replay", 10**6: "ceiling"}
    ceiling = prefix_oracle.ceiling_hit_tokens(acc) / acc.prompt_tokens
    assert ceiling > 0.3  # the conversations share most of their prompts
    rates = []
    for cap in caps:
        rate = replay(trace, cap, block_size).hit_rate
        got = table[cap]
        assert got == pytest.approx((rate, ceiling, rate / ceiling), abs=5e-5)
        rates.append(rate)
    assert rates == sorted(rates) and rates[0] < rates[-1] == pytest.approx(ceiling)


def test_hitrate_of_a_trace_without_prefixes_is_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "a.csv"
    src.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        + "".join(f"2023-11-16 18:15:{40 + i},{300 + i},9\n" for i in range(5))
    )
    out = tmp_path / "t.jsonl"
    assert main(["workload", "--import", f"azure:{src}", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["hitrate", "-q", "--trace", str(out), "--capacity", "1e6"]) == 0
    # no ceiling to reach: the fraction is "n/a", not a misleading 0.00%
    assert _table(capsys.readouterr().out) == {10**6: (0.0, 0.0, None)}
