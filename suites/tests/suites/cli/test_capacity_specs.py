"""`kvbench capacity` for sliding-window, hybrid and encoder-decoder models: the three
spec presets' figures (hand-computed in suites/tests/workloads/test_spec_capacity.py),
--hf-config files, and the table naming each layer group."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbench.suites.cli import main


def _plan(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    code = main(["capacity", "--kv-budget", "16GiB", "--format", "json", *argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_sliding_window_mistral_7b(capsys: pytest.CaptureFixture[str]) -> None:
    plan = _plan(capsys, "--model", "mistral-7b", "--avg-len", "1000", "--max-len", "32768")
    assert (plan["pages"], plan["pages_per_request_at_max"], plan["requests_at_max"]) == (
        8192,
        257,
        31,
    )
    assert plan["requests_at_max_full"] == 4


def test_hybrid_gemma_2(capsys: pytest.CaptureFixture[str]) -> None:
    plan = _plan(capsys, "--model", "gemma-2-9b", "--avg-len", "1000", "--max-len", "32768")
    assert plan["hybrid"] is True
    assert [(g["spec"], g["blocks_at_max"]) for g in plan["groups"]] == [
        ("sliding window 4096", 257),
        ("full attention", 2048),
    ]
    assert plan["pages_per_request_at_max"] == 2305


def test_cross_attention_whisper(capsys: pytest.CaptureFixture[str]) -> None:
    plan = _plan(capsys, "--model", "whisper-large-v3", "--avg-len", "100", "--max-len", "448")
    assert [g["blocks_at_max"] for g in plan["groups"]] == [28, 94]


def test_step_tokens_widen_the_window_held(capsys: pytest.CaptureFixture[str]) -> None:
    """Steps of 512 tokens: a step at n keeps positions n - 4095 .. n + 511 (4607 tokens).
    n is a multiple of 512, so the span starts at offset 1 of a block of 16 and touches
    blocks (n - 4095) // 16 .. (n + 511) // 16: 288 of them."""
    plan = _plan(capsys, "--model", "mistral-7b", "--max-len", "32768", "--step-tokens", "512")
    assert plan["pages_per_request_at_max"] == 288


def test_hf_config_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    path = tmp_path / "config.json"
    config = transformers.Gemma2Config(num_hidden_layers=4, sliding_window=32).to_dict()
    path.write_text(json.dumps(config))
    plan = _plan(capsys, "--hf-config", str(path), "--avg-len", "100", "--max-len", "100")
    # 32-token window at block 16: ceil(32/16) + 1 = 3 pages; 100 tokens full: 7 pages
    assert [g["blocks_at_max"] for g in plan["groups"]] == [3, 7]


def test_table_names_each_group(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", "--kv-budget", "16GiB", "--model", "gemma-2-9b"]) == 0
    out = capsys.readouterr().out
    assert "group 0: sliding window 4096, 21 layers" in out
    assert "layers 1..41 step 2" in out
    assert "closed form" in out
