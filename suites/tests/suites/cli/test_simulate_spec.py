"""`kvbench simulate` with layer-group models (sliding window, hybrid), tensor parallel:
the run goes through the layer-group cache and the per-layer time model, --tp divides
weights, KV and FLOPs over the ranks and adds all-reduces, and what is not modeled is
refused by name."""

from __future__ import annotations

import re

import pytest

from kvbench.paged.serving.spec_time import FACTS, spec_time_model
from kvbench.suites.cli import main
from kvbench.workloads.spec_presets import get_spec_preset

ARGS = ["simulate", "--workload", "sharegpt", "--requests", "60", "--quiet",
        "--no-prefix-caching", "--kv-budget", "2GiB"]  # fmt: skip


def _model_seconds(out: str) -> float:
    line = next(ln for ln in out.splitlines() if ln.startswith("paged ") and "%" in ln)
    return float(line.split()[9])  # the "model s" column


@pytest.mark.parametrize("model", ["mistral-7b", "gemma-2-9b"])
def test_sliding_window_hybrid_simulate_tensor_parallel(
    model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seconds = {}
    for tp in (1, 2):
        assert main([*ARGS, "--model", model, "--tp", str(tp)]) == 0
        out = capsys.readouterr().out
        assert f"tp {tp}," in out and "modeled" in out
        seconds[tp] = _model_seconds(out)
    assert seconds[2] < seconds[1]  # weights and KV read over two ranks' bandwidth


def test_sliding_window_time_model_divides_over_ranks() -> None:
    model = get_spec_preset("gemma-2-9b")
    one = spec_time_model(model, FACTS["gemma-2-9b"], "a100-80gb", 16, 1)
    two = spec_time_model(model, FACTS["gemma-2-9b"], "a100-80gb", 16, 2)
    assert two.kv_ps_per_layer_token == pytest.approx(one.kv_ps_per_layer_token / 2, abs=1)
    assert two.weight_ps == pytest.approx(one.weight_ps / 2, abs=1)
    assert one.allreduce_fixed_ps == 0 < two.allreduce_fixed_ps
    assert two.swap_ps(10) == pytest.approx(one.swap_ps(10) / 2, abs=1)
    assert one.layout is not None and one.windows == (4096,)


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--model", "mistral-7b", "--tp", "3"], r"--tp 3 does not divide mistral-7b's \[8\]"),
        (["--model", "llama-2-70b", "--tp", "2"], "tensor parallelism for the layer-group"),
        (["--model", "whisper-large-v3"], "encoder-decoder preset: serving it is not modeled"),
        (["--model", "mistral-7b", "--cache", "contiguous-max"], "paged layer-group cache only"),
        (["--model", "mistral-7b", "--out", "x"], "--out is not written for layer-group"),
    ],
)
def test_simulate_spec_refusals_name_the_feature(
    argv: list[str], match: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*ARGS, *argv]) != 0
    assert re.search(match, capsys.readouterr().err)


def test_simulate_spec_prefix_caching_refused(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [a for a in ARGS if a != "--no-prefix-caching"]
    assert main([*argv, "--model", "gemma-2-9b"]) != 0
    assert "pass --no-prefix-caching" in capsys.readouterr().err
