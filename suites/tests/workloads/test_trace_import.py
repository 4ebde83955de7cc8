"""Import of production traces (workloads.trace_import) and trace format version 2:
the Mooncake and Azure readers, the block-id prompts and what kvbench's own sha256 chain
shares of them, and refusal of every kind of bad file (line and field named, nothing
written)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from kvbench.paged.cache import PagedKVCache
from kvbench.reference.validation import validate_prompt
from kvbench.suites.cli import main
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import KVGeometry
from kvbench.workloads.shipped import shipped_trace
from kvbench.workloads.trace import BLOCK_ID_BASE, Trace, TraceError, TraceRequest
from kvbench.workloads.trace_import import import_trace, read_azure, read_mooncake

TINY = KVGeometry(1, 1, 1, "float16")


def _mooncake(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _row(ts: int, n: int, ids: list[int], out: int = 5) -> dict:
    return {"timestamp": ts, "input_length": n, "output_length": out, "hash_ids": ids}


def test_mooncake_rows_become_block_prompts_with_arrivals_in_seconds(tmp_path: Path) -> None:
    path = _mooncake(tmp_path / "m.jsonl", [_row(0, 600, [3, 4]), _row(1500, 512, [3], 7)])
    trace = read_mooncake(path, speed=3.0)
    a, b = trace.requests
    assert (a.arrival, b.arrival) == (0.0, 0.5)  # 1500 ms / 3
    assert (a.prompt_len, a.output_len, a.prompt_blocks, a.prompt_block_tokens) == (
        600,
        5,
        (3, 4),
        512,
    )
    ids = list(a.prompt_ids(0))
    assert len(ids) == 600  # the partial last block keeps input_length
    assert ids[:512] == list(b.prompt_ids(1))  # same hash id, same ids
    assert ids[512:] == [BLOCK_ID_BASE + 4 * 512 + p for p in range(88)]


@pytest.mark.parametrize(
    ("blocks", "length"), [((3, 4), 600), ((5, 1), 600), ((9,), 1), ((2, 7, 1), 1536)]
)
def test_block_prompts_know_their_largest_id(blocks: tuple[int, ...], length: int) -> None:
    """max_id (what the engine asks instead of iterating 145M ids) is the listed ids' max,
    whether a full block or the cut last one holds it."""
    req = TraceRequest(0, 0.0, length, 1, prompt_blocks=blocks, prompt_block_tokens=512)
    ids = req.prompt_ids(0)
    assert ids.max_id() == max(list(ids))  # type: ignore[attr-defined]
    assert validate_prompt(ids, 4096) is ids  # trusted as given, not copied


def test_version_2_round_trips_and_version_1_files_still_read(tmp_path: Path) -> None:
    path = _mooncake(tmp_path / "m.jsonl", [_row(0, 1000, [1, 2]), _row(10, 20, [1])])
    trace = read_mooncake(path)
    text = trace.dumps()
    assert json.loads(text.splitlines()[0])["version"] == 2
    assert Trace.loads(text) == trace
    plain = Trace((TraceRequest("a", 0.0, 10, 2),))
    assert json.loads(plain.dumps().splitlines()[0])["version"] == 1  # unchanged for v1
    assert Trace.loads(plain.dumps()) == plain
    v1_with_blocks = text.replace('"version": 2', '"version": 1')
    with pytest.raises(TraceError, match="line 2: field 'prompt_blocks'"):
        Trace.loads(v1_with_blocks)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"prompt_blocks": [1]}, "prompt_blocks"),  # 1000 tokens need 2 blocks of 512
        ({"prompt_blocks": [1, -2]}, "prompt_blocks"),
        ({"prompt_block_tokens": 0}, "prompt_block_tokens"),
        ({"prompt": [1, 2]}, "prompt_blocks"),
    ],
)
def test_bad_version_2_requests_are_refused(change: dict, field: str) -> None:
    req = {"id": 0, "arrival": 0, "prompt_len": 1000, "output_len": 1}
    req.update({"prompt_blocks": [1, 2], "prompt_block_tokens": 512}, **change)
    if "prompt" in change:
        req.pop("prompt_len")
        req["prompt"] = [1] * 1000
    header = {"format": "kvbench-trace", "version": 2, "num_requests": 1, "meta": {}}
    with pytest.raises(TraceError, match=f"line 2: field '{field}'"):
        Trace.loads(json.dumps(header) + "\n" + json.dumps(req) + "\n")


def _hits_of(trace: Trace, block_size: int) -> list[int]:
    """Prefix-hit tokens of each request admitted after all earlier ones (unbounded)."""
    cache = PagedKVCache(TINY, 4096, block_size, store_kv=False)
    out = []
    for i, r in enumerate(trace.requests):
        ids = r.prompt_ids(i)
        out.append(cache.admit(i, ids))
        cache.append_tokens(i, len(ids) - out[-1])
    return out


@pytest.mark.parametrize("block_size", [1, 16, 64, 512])
def test_the_sha256_chain_shares_exactly_what_the_hash_ids_share(
    tmp_path: Path, block_size: int
) -> None:
    rows = [
        _row(0, 1300, [1, 2, 3]),
        _row(1, 1300, [1, 2, 3]),  # the same prompt
        _row(2, 1100, [1, 2, 9]),  # shares 2 blocks
        _row(3, 1100, [7, 2, 3]),  # same later ids, different first: nothing shared
        _row(4, 700, [1, 2]),  # a prefix of the first, ending inside block 2
    ]
    trace = read_mooncake(_mooncake(tmp_path / "m.jsonl", rows))
    # expected: the tokens the trace says are shared, cut to whole blocks, one block short
    # of a fully cached prompt (the last prompt token is always recomputed)
    shared = [0, 1300, 1024, 0, 700]
    expected = [
        min(s // block_size, (r["input_length"] - 1) // block_size) * block_size
        for s, r in zip(shared, rows, strict=True)
    ]
    assert _hits_of(trace, block_size) == expected


def test_azure_rows_become_length_requests_from_the_first_timestamp(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
        "2023-11-17 00:00:00,10,1\n"
    )
    trace = read_azure(path, speed=2.0)
    assert [r.prompt_len for r in trace.requests] == [374, 396, 10]
    assert trace.requests[1].arrival == pytest.approx(4.314579 / 2, abs=1e-9)
    day = (24 - 18) * 3600 - 15 * 60 - 46.68059
    assert trace.requests[2].arrival == pytest.approx(day / 2, abs=1e-9)
    assert all(r.prompt_blocks is None for r in trace.requests)


def test_the_shipped_traces_import_whole() -> None:
    mooncake = shipped_trace("mooncake-conversation")
    assert len(mooncake) == 12_031
    mean = sum(r.prompt_len for r in mooncake.requests) / len(mooncake)
    assert 12_030 < mean < 12_040  # the data README's 12,035
    assert mooncake.requests[-1].arrival == pytest.approx(3536.999)
    assert len(shipped_trace("azure-conversation")) == 19_366


MOONCAKE_BAD = {
    "missing field": ('{"timestamp": 0, "input_length": 5, "output_length": 1}', "hash_ids"),
    "extra field": (
        '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0], "x": 1}',
        "x",
    ),
    "negative length": (
        '{"timestamp": 0, "input_length": -5, "output_length": 1, "hash_ids": [0]}',
        "input_length",
    ),
    "zero length": (
        '{"timestamp": 0, "input_length": 5, "output_length": 0, "hash_ids": [0]}',
        "output_length",
    ),
    "ids short": (
        '{"timestamp": 0, "input_length": 513, "output_length": 1, "hash_ids": [0]}',
        "hash_ids",
    ),
    "ids long": (
        '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0, 1]}',
        "hash_ids",
    ),
    "backwards": (
        '{"timestamp": 5, "input_length": 5, "output_length": 1, "hash_ids": [0]}',
        "timestamp",
    ),
    "truncated": ('{"timestamp": 9, "input_length": 5, "output_len', None),
    "fractional length": (
        '{"timestamp": 9, "input_length": 5.5, "output_length": 1, "hash_ids": [0]}',
        "input_length",
    ),
    "boolean length": (
        '{"timestamp": 9, "input_length": 5, "output_length": true, "hash_ids": [0]}',
        "output_length",
    ),
    "ids not a list": (
        '{"timestamp": 9, "input_length": 5, "output_length": 1, "hash_ids": 0}',
        "hash_ids",
    ),
    "negative id": (
        '{"timestamp": 9, "input_length": 5, "output_length": 1, "hash_ids": [-1]}',
        "hash_ids",
    ),
    "timestamp text": (
        '{"timestamp": "9", "input_length": 5, "output_length": 1, "hash_ids": [0]}',
        "timestamp",
    ),
    "not an object": ("[9, 5, 1, [0]]", None),
    "empty line": ("", None),
}
GOOD_LINE = '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}'


@pytest.mark.parametrize("kind", sorted(MOONCAKE_BAD))
def test_bad_mooncake_lines_are_refused_with_line_and_field(tmp_path: Path, kind: str) -> None:
    line, field = MOONCAKE_BAD[kind]
    path = tmp_path / "bad.jsonl"
    path.write_text(GOOD_LINE + "\n" + line + "\n")
    if kind == "backwards":
        path.write_text(GOOD_LINE.replace('"timestamp": 0', '"timestamp": 9') + "\n" + line + "\n")
    with pytest.raises(TraceError) as info:
        read_mooncake(path)
    assert info.value.line == 2
    assert info.value.field == field
    assert "line 2" in str(info.value) and str(path) in str(info.value)


AZURE_BAD = {
    "missing column": ("2023-11-16 18:15:47,374", "GeneratedTokens"),
    "extra column": ("2023-11-16 18:15:47,374,44,9", "extra field"),
    "zero length": ("2023-11-16 18:15:47,0,44", "ContextTokens"),
    "negative length": ("2023-11-16 18:15:47,5,-44", "GeneratedTokens"),
    "bad time": ("yesterday,5,44", "TIMESTAMP"),
    "backwards": ("2023-11-16 18:15:45,5,44", "TIMESTAMP"),
    "fractional length": ("2023-11-16 18:15:47,5.5,44", "ContextTokens"),
    "empty line": ("", None),
}


@pytest.mark.parametrize("kind", sorted(AZURE_BAD))
def test_bad_azure_rows_are_refused_with_line_and_field(tmp_path: Path, kind: str) -> None:
    line, field = AZURE_BAD[kind]
    path = tmp_path / "bad.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,1,1\n" + line + "\n"
    )
    with pytest.raises(TraceError) as info:
        read_azure(path)
    assert (info.value.line, info.value.field) == (3, field)


def test_a_csv_without_the_azure_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("time,prompt,output\n2023-11-16 18:15:46.5,1,1\n")
    with pytest.raises(TraceError, match="line 1: field 'header'"):
        read_azure(path)
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    with pytest.raises(TraceError, match="no requests after the header"):
        read_azure(path)


@pytest.mark.parametrize("fmt", ["mooncake", "azure"])
def test_unusable_files_are_refused(tmp_path: Path, fmt: str) -> None:
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "latin1").write_bytes(GOOD_LINE.encode() + b"\ncaf\xe9\n")
    (tmp_path / "folder").mkdir()
    (tmp_path / "broken.gz").write_bytes(gzip.compress(GOOD_LINE.encode())[:-6])
    for name, text in [
        ("empty", "empty file"),
        ("latin1", "line 2: not UTF-8"),
        ("folder", "is a folder"),
        ("missing", "does not exist"),
        ("broken.gz", "gzip"),
    ]:
        with pytest.raises(ConfigError, match=text):
            import_trace(f"{fmt}:{tmp_path / name}")


def test_gzip_files_read_like_plain_ones(tmp_path: Path) -> None:
    plain = _mooncake(tmp_path / "m.jsonl", [_row(0, 600, [3, 4])])
    packed = tmp_path / "m.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert read_mooncake(packed).requests == read_mooncake(plain).requests


def test_cli_import_writes_the_trace_and_a_bad_file_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _mooncake(tmp_path / "m.jsonl", [_row(0, 600, [3, 4]), _row(2000, 10, [3])])
    out = tmp_path / "t.jsonl"
    assert (
        main(["workload", "--import", f"mooncake:{good}", "--speed", "2", "--out", str(out)]) == 0
    )
    trace = Trace.read(out)
    assert [r.arrival for r in trace.requests] == [0.0, 1.0]
    before = out.read_bytes()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(GOOD_LINE + "\n" + MOONCAKE_BAD["ids short"][0] + "\n")
    capsys.readouterr()
    assert main(["workload", "--import", f"mooncake:{bad}", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "line 2: field 'hash_ids'" in err[0]
    assert out.read_bytes() == before  # the earlier file is untouched
    fresh = tmp_path / "never.jsonl"
    assert main(["workload", "--import", f"mooncake:{bad}", "--out", str(fresh)]) == 2
    assert not fresh.exists()


def test_an_imported_azure_trace_drives_simulate_and_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Azure import (no prefix information) feeds `simulate` and `rate --trace`,
    goodput and the SLO search included."""
    rows = [f"2023-11-16 18:15:{46 + i // 2}.{i % 2 * 5},{200 + 37 * i},{20 + i}" for i in range(8)]
    csv = tmp_path / "a.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    out = tmp_path / "a.jsonl"
    assert main(["workload", "--import", f"azure:{csv}", "--out", str(out)]) == 0
    assert len(Trace.read(out)) == 8
    capsys.readouterr()
    slo = ["--slo-ttft", "2", "--slo-tpot", "0.1"]
    assert main(["simulate", "--trace", str(out), "--profile", "h100", *slo]) == 0
    assert "goodput" in capsys.readouterr().out
    setup = ["--setup", "llama-3-70b-8xh100-tp8", "--system", "paged"]
    assert main(["rate", *setup, "--trace", str(out), "--time-scale", "1,2", *slo]) == 0
    text = capsys.readouterr().out
    assert "highest load with p99 within the SLO" in text and "goodput" in text
