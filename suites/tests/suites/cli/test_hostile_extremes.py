"""The hostile-input battery, extreme magnitudes (issue 36): every numeric option of
`workload` (with --import), `hitrate`, `simulate` and `rate`, and every numeric field of
the files they read (kvbench traces, Mooncake JSON lines, Azure CSV), given 1e30, 1e-320,
10^30 written in digits, -0, 1e400, timestamps past 2^22 s, and NaN and the infinities
as JSON and CSV spell them. Each is refused as the battery's contract says (exit 2, one
line on stderr naming the option, or the file's line and field; nothing written, no
--out file or folder created), or, where the value is in range (-0 and 1e-320 where 0
is allowed), read as that number (-0 as 0).

The first four tests are reproductions 7-10 of issue 36: each fails on f4a07b7 (an
import that succeeds, a run that reaches the simulation or the hit-rate pass, a file or
folder written) and passes now. The commands run in-process in the battery's working
folder (`test_hostile_cli.workdir`: the simulation, rate runs and the hit-rate pass are
replaced by stubs that fail the test if reached).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kvbench.suites.conformance.hostile import TRIED, assert_refused, run_cli, tree_digest
from kvbench.suites.tests.suites.cli.test_hostile_cli import NUMERIC, ZERO_OK, workdir
from kvbench.workloads.trace import Trace

__all__ = ["workdir"]  # the battery's fixture, shared

DIGITS = "1" + "0" * 30  # 10^30 written out: an int to JSON and CSV, not a float
#: Extreme values as JSON spells them (Python's json reads NaN and the infinities).
JSON_EXTREMES = ("1e30", DIGITS, "1e-320", "-0", "1e400", "NaN", "Infinity", "-Infinity")
CSV_EXTREMES = ("1e30", DIGITS, "1e-320", "-0", "nan", "inf", "-inf")
HEADER = {"format": "kvbench-trace", "version": 2, "num_requests": 1, "meta": {}}
AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,7,3\n"


def _check(workdir: Path, argv: list[str], command: str, names: list[str], kind: str) -> str:
    """Run `argv`; assert the clean refusal naming each of `names`, nothing changed."""
    before = tree_digest(workdir)
    code, _, err = run_cli(argv)
    assert_refused(code, err, command)
    missing = [n for n in names if n not in err]
    assert not missing, f"{argv}: {missing} not named in {err!r}"
    assert tree_digest(workdir) == before, f"{argv} changed files"
    TRIED[kind] += 1
    return err


def _trace_file(path: Path, request: str, header: dict | None = None) -> Path:
    """A kvbench trace of one request line, written as given (JSON spelled by hand)."""
    path.write_text(json.dumps(header or HEADER) + "\n" + request + "\n", encoding="utf-8")
    return path


def _trace_commands(path: Path) -> list[tuple[str, list[str]]]:
    return [
        ("simulate", ["simulate", "--quiet", "--trace", str(path), "--out", "sim-out"]),
        ("hitrate", ["hitrate", "-q", "--capacity=1e4", "--trace", str(path)]),
        ("rate", ["rate", "--no-knee", "--system=paged", "--trace", str(path)]),
    ]


# ------------------------------------------------------------------ issue 36, 7-10


def test_repro_7_lengths_in_digits_are_refused(workdir: Path) -> None:
    """An Azure row with ContextTokens = 10^30 imported, and `hitrate` on it exhausted
    memory: the import names the line and column, and a kvbench trace with such a
    prompt_len never reaches the hit-rate pass."""
    (workdir / "r7").mkdir()
    csv = workdir / "r7" / "a.csv"
    csv.write_text(AZURE_HEAD + f"2023-11-16 18:15:47,{DIGITS},44\n")
    argv = ["workload", "--import", f"azure:{csv}", "--out", "r7/t.jsonl"]
    _check(workdir, argv, "workload", ["line 3", "'ContextTokens'", "16,777,216"], "x: repro")
    trace = _trace_file(
        workdir / "r7" / "t.jsonl",
        f'{{"id": 0, "arrival": 0, "prompt_len": {DIGITS}, "output_len": 1}}',
    )
    for command, argv in _trace_commands(trace):
        _check(workdir, argv, command, ["line 2", "'prompt_len'"], "x: repro")


def test_a_trace_of_maximal_prompts_is_refused_before_the_hit_rate_pass(workdir: Path) -> None:
    """Lengths in range can still add up: 1,000 prompts of 2^24 tokens at blocks of 16
    are a billion block accesses (about 190 GB): refused with the estimate, not a
    MemoryError midway (the battery's machine has 8 GiB free)."""
    (workdir / "r7b").mkdir()
    path = workdir / "r7b" / "t.jsonl"
    line = '{{"id": {}, "arrival": 0, "prompt_len": 16777216, "output_len": 1}}'
    header = {**HEADER, "num_requests": 1000}
    path.write_text("\n".join([json.dumps(header), *(line.format(i) for i in range(1000))]) + "\n")
    argv = ["hitrate", "-q", "--capacity=1e6", "--trace", str(path)]
    _check(workdir, argv, "hitrate", ["1,048,576,000 block accesses", "--block-size"], "x: repro")


def test_repro_8_a_timestamp_of_1e30_ms_is_refused(workdir: Path) -> None:
    """A Mooncake timestamp of 1e30 ms imported, and simulate reported TTFT of -6.9e10 s
    and 100% SLO attainment (float64 seconds step by 2^37 s at 10^27 s)."""
    (workdir / "r8").mkdir()
    jsonl = workdir / "r8" / "m.jsonl"
    row = '{{"timestamp": {}, "input_length": 5, "output_length": 1, "hash_ids": [0]}}\n'
    jsonl.write_text(row.format(0) + row.format("1e30"))
    argv = ["workload", "--import", f"mooncake:{jsonl}", "--out", "r8/t.jsonl"]
    _check(workdir, argv, "workload", ["line 2", "'timestamp'", "4,194,304 s"], "x: repro")
    trace = _trace_file(
        workdir / "r8" / "t.jsonl", '{"id": 0, "arrival": 1e+27, "prompt_len": 5, "output_len": 1}'
    )
    for command, argv in _trace_commands(trace):
        _check(workdir, argv, command, ["line 2", "'arrival'"], "x: repro")


def test_repro_9_speed_1e_320_and_infinite_arrivals_are_refused(workdir: Path) -> None:
    """`--speed 1e-320` passed the (0, 1e6] check and wrote "arrival": Infinity, which
    simulate then failed on (exit 70): the speed is refused, a speed in range whose
    arrivals land past 2^22 s is refused naming the line, and a trace file holding
    Infinity is refused naming its line."""
    (workdir / "r9").mkdir()
    jsonl = workdir / "r9" / "m.jsonl"
    row = '{{"timestamp": {}, "input_length": 5, "output_length": 1, "hash_ids": [0]}}\n'
    jsonl.write_text(row.format(0) + row.format(10_000))
    base = ["workload", "--import", f"mooncake:{jsonl}", "--out", "r9/t.jsonl"]
    _check(workdir, [*base, "--speed", "1e-320"], "workload", ["--speed", "1e-320"], "x: repro")
    err = _check(workdir, [*base, "--speed", "1e-6"], "workload", ["line 2"], "x: repro")
    assert "'timestamp'" in err and "speed 1e-06" in err
    trace = _trace_file(
        workdir / "r9" / "t.jsonl",
        '{"id": 0, "arrival": Infinity, "prompt_len": 5, "output_len": 1}',
    )
    for command, argv in _trace_commands(trace):
        _check(workdir, argv, command, ["line 2", "'arrival'"], "x: repro")


def test_repro_10_time_scale_1e_300_is_refused_before_out_is_made(workdir: Path) -> None:
    """`simulate --time-scale 1e-300` overflowed the engine's picosecond clock (exit 70)
    after creating --out and writing trace.jsonl: refused now before anything is written,
    and so is a scale in range that puts an arrival past 2^22 s (checked after scaling)."""
    (workdir / "r10").mkdir()
    trace = _trace_file(
        workdir / "r10" / "t.jsonl",
        '{"id": "late", "arrival": 10, "prompt_len": 5, "output_len": 1}',
    )
    argv = ["simulate", "--quiet", "--trace", str(trace), "--out", "r10/out"]
    _check(workdir, [*argv, "--time-scale", "1e-300"], "simulate", ["--time-scale"], "x: repro")
    err = _check(workdir, [*argv, "--time-scale", "1e-6"], "simulate", ["--time-scale"], "x: repro")
    assert "'late'" in err and "4,194,304 s" in err
    gen = ["simulate", "--quiet", "--requests=50", "--arrivals=poisson:1", "--out", "r10/gen"]
    _check(workdir, [*gen, "--time-scale", "1e-6"], "simulate", ["--time-scale"], "x: repro")
    rate = ["rate", "--no-knee", "--system=paged", "--trace", str(trace), "--time-scale=1,1e-6"]
    _check(workdir, rate, "rate", ["--time-scale", "'late'"], "x: repro")
    assert not (workdir / "r10" / "out").exists()


# ------------------------------------------------------------------ options

MAIN_COMMANDS = ("workload", "hitrate", "simulate", "rate")
OPTIONS = [(c, o, t) for c, o, t in NUMERIC if c in MAIN_COMMANDS]


@pytest.mark.parametrize(
    ("command", "option", "parse"), OPTIONS, ids=[f"{c} {o}" for c, o, _ in OPTIONS]
)
def test_extreme_option_values_are_refused_or_read_in_range(
    workdir: Path, command: str, option: str, parse
) -> None:  # type: ignore[no-untyped-def]
    """1e30 and 10^30 in digits are refused by every option; 1e-320 and -0 by every
    option that cannot be 0, and read as a number in range (-0 as +0) where 0 is allowed."""
    zero_ok = (command, option) in ZERO_OK
    for value in ("1e30", DIGITS, "1e-320", "-0"):
        if zero_ok and value in ("1e-320", "-0"):
            if value == "-0" or parse.__name__ == "number":
                got = parse(value)
                assert got >= 0 and math.copysign(1.0, got) == 1.0, (option, value, got)
            continue
        _check(workdir, [command, f"{option}={value}"], command, [option], "x: option")


#: Options that read numbers through their own parsers: (command, argv, names).
SPEC_EXTREMES: list[tuple[str, list[str], list[str]]] = [
    *(
        ("hitrate", ["--trace=no-such.jsonl", f"--capacity={v}"], [f"'{v}'"])
        for v in ("1e30", DIGITS, "1e-320", "-0")
    ),
    *(("rate", [f"--rates={v}"], ["rate"]) for v in ("1e30", DIGITS, "1e-320", "-0", "1,1e-320")),
    *(
        ("rate", ["--trace=no-such.jsonl", f"--time-scale={v}"], ["--time-scale"])
        for v in ("1e30", DIGITS, "1e-320", "-0")
    ),
    *(
        ("simulate", [f"--kv-budget={v}"], [v])
        for v in ("1e30GB", f"{DIGITS}GB", "1e-320GB", "-0GB", DIGITS)
    ),
    *(
        ("simulate", [f"--arrivals={v}"], ["--arrivals", v])
        for v in (
            "poisson:1e-320",
            "poisson:-0",
            "poisson:1e-300",
            "gamma:1e-320:1",
            "gamma:1:1e-320",
            "gamma:1:1e30",
            f"burst:{DIGITS}:1",
            "burst:2:1e30",
            "burst:2:-0.5",
        )
    ),
    ("simulate", ["--arrivals=poisson:1", "--burstiness=1e-320"], ["--burstiness"]),
    *(
        ("simulate", [f"{opt}={v}"], [opt, v])
        for opt in ("--input-dist", "--output-dist")
        for v in (
            f"fixed:{DIGITS}",
            "fixed:-0",
            f"uniform:1:{DIGITS}",
            "uniform:-0:5",
            "normal:5:1e-320:1:10",
            f"normal:5:1:1:{DIGITS}",
            "lognormal:5:1e-320:1:10",
            "lognormal:1e30:1:1:10",
        )
    ),
]


@pytest.mark.parametrize(
    ("command", "argv", "names"), SPEC_EXTREMES, ids=[" ".join(a)[:60] for _, a, _ in SPEC_EXTREMES]
)
def test_extreme_numbers_in_specs_are_refused(
    workdir: Path, command: str, argv: list[str], names: list[str]
) -> None:
    if command == "rate" and "--trace=no-such.jsonl" in argv:
        (workdir / "no-such.jsonl").touch()  # an existing trace: the scale is judged first
        try:
            _check(workdir, [command, *argv], command, names, "x: spec")
        finally:
            (workdir / "no-such.jsonl").unlink()
        return
    _check(workdir, [command, *argv], command, names, "x: spec")


# ------------------------------------------------------------------ file fields

BASE = {"id": "a", "arrival": 0, "prompt_len": 4, "output_len": 2}


def _kvbench_cases() -> list[tuple[str, str, int, dict | None, str]]:
    """(field, request line, line named, header, value) for each numeric field of a
    kvbench trace and each extreme that field must refuse."""
    out = []
    for value in JSON_EXTREMES:
        scalars = {
            "arrival": {},
            "prompt_len": {},
            "output_len": {},
            "n": {},
            "beam_width": {},
            "prompt_block_tokens": {"prompt_blocks": [0]},
        }
        for name, extra in scalars.items():
            if name == "arrival" and value in ("1e-320", "-0"):
                continue  # in range: read as 1e-320 s and 0 s (the next test)
            obj = {**BASE, **extra, name: "@"}
            out.append((name, json.dumps(obj).replace('"@"', value), 2, None, value))
        for name, obj in (
            ("prompt", {"id": "a", "arrival": 0, "prompt": [1, "@"], "output_len": 2}),
            ("output_tokens", {**BASE, "output_tokens": ["@", 1]}),
            ("prompt_blocks", {**BASE, "prompt_blocks": ["@"], "prompt_block_tokens": 4}),
        ):
            if value != "-0":  # token and block id 0
                out.append((name, json.dumps(obj).replace('"@"', value), 2, None, value))
        for name in ("version", "num_requests"):
            header = json.dumps({**HEADER, name: "@"}).replace('"@"', value)
            line = 3 if (name, value) == ("num_requests", "-0") else 1  # 0 promised, 1 there
            out.append((name, json.dumps(BASE), line, json.loads(header), value))
    return out


KVBENCH_CASES = _kvbench_cases()


@pytest.mark.parametrize(
    ("field", "line", "lineno", "header", "value"),
    KVBENCH_CASES,
    ids=[f"{f}={v}" for f, _, _, _, v in KVBENCH_CASES],
)
def test_extreme_trace_fields_are_refused_by_every_command(
    workdir: Path, field: str, line: str, lineno: int, header: dict | None, value: str
) -> None:
    folder = workdir / "kvt"
    folder.mkdir(exist_ok=True)
    path = folder / "t.jsonl"
    if header is not None:  # json.loads read the extreme back; write it spelled as given
        text = json.dumps({**HEADER, field: "@"}).replace('"@"', value) + "\n" + line + "\n"
        path.write_text(text)
    else:
        _trace_file(path, line)
    try:
        for command, argv in _trace_commands(path):
            _check(workdir, argv, command, [f"line {lineno}", f"'{field}'"], "x: trace field")
    finally:
        path.unlink()


MOONCAKE = {"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}
MOONCAKE_CASES = [
    (name, value)
    for name in ("timestamp", "input_length", "output_length", "hash_ids")
    for value in (*JSON_EXTREMES, "9e15")
    if not (name == "timestamp" and value in ("1e-320", "-0"))  # in range: 0 ms
    and not (name == "hash_ids" and value == "-0")  # block id 0
    and not (name != "timestamp" and value == "9e15")
]
AZURE_CASES = [
    (name, value)
    for name in ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    for value in (*CSV_EXTREMES, "9999-12-31 23:59:59", "2024-01-31 00:00:00")
    if name == "TIMESTAMP" or value[:2] not in ("99", "20")
]


@pytest.mark.parametrize(("field", "value"), MOONCAKE_CASES)
def test_extreme_mooncake_fields_are_refused(workdir: Path, field: str, value: str) -> None:
    folder = workdir / "mc"
    folder.mkdir(exist_ok=True)
    path = folder / "m.jsonl"
    obj = {**MOONCAKE, field: ["@"] if field == "hash_ids" else "@"}
    path.write_text(json.dumps(MOONCAKE) + "\n" + json.dumps(obj).replace('"@"', value) + "\n")
    try:
        argv = ["workload", "--import", f"mooncake:{path}", "--out", "mc/t.jsonl"]
        _check(workdir, argv, "workload", ["line 2", f"'{field}'"], "x: mooncake field")
    finally:
        path.unlink()


@pytest.mark.parametrize(("field", "value"), AZURE_CASES)
def test_extreme_azure_fields_are_refused(workdir: Path, field: str, value: str) -> None:
    folder = workdir / "az"
    folder.mkdir(exist_ok=True)
    path = folder / "a.csv"
    row = {"TIMESTAMP": "2023-11-16 18:15:47", "ContextTokens": "5", "GeneratedTokens": "1"}
    row[field] = value
    path.write_text(AZURE_HEAD + ",".join(row.values()) + "\n")
    try:
        argv = ["workload", "--import", f"azure:{path}", "--out", "az/t.jsonl"]
        err = _check(workdir, argv, "workload", ["line 3"], "x: azure field")
        assert f"'{field}'" in err or "truncated" in err or "digits" in err, err
    finally:
        path.unlink()


@pytest.mark.parametrize("value", ["1e-320", "-0", "0.0"])
def test_in_range_extremes_read_as_numbers(tmp_path: Path, value: str) -> None:
    """-0 and 1e-320 are in range for an arrival and a timestamp: read as +0 and the
    tiny number, and written back as such (never "-0.0")."""
    trace = Trace.loads(
        json.dumps(HEADER) + "\n" + json.dumps(BASE).replace('"arrival": 0', f'"arrival": {value}')
    )
    arrival = trace.requests[0].arrival
    assert arrival == float(value) and math.copysign(1.0, arrival) == 1.0
    assert "-0" not in trace.dumps().splitlines()[1]
    jsonl = tmp_path / "m.jsonl"
    jsonl.write_text(json.dumps(MOONCAKE).replace('"timestamp": 0', f'"timestamp": {value}') + "\n")
    out = tmp_path / "t.jsonl"
    code, _, err = run_cli(["workload", "--import", f"mooncake:{jsonl}", "--out", str(out)])
    assert code == 0, err
    got = Trace.read(out).requests[0].arrival
    assert got == float(value) / 1000 and math.copysign(1.0, got) == 1.0
