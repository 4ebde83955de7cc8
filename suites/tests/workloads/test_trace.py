"""Trace format: round trip, and every malformed input named by line and field."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvbench.suites.cli import main
from kvbench.workloads.arrivals import parse_arrivals
from kvbench.workloads.sharing import generate
from kvbench.workloads.trace import Trace, TraceError, TraceRequest


@st.composite
def traces(draw: st.DrawFn) -> Trace:
    n = draw(st.integers(0, 12))
    reqs, t = [], 0.0
    for i in range(n):
        t += draw(st.floats(0, 5, allow_nan=False))
        explicit = draw(st.booleans())
        plen = draw(st.integers(1, 40))
        out = draw(st.integers(1, 30))
        prompt = (
            tuple(draw(st.lists(st.integers(0, 50_000), min_size=plen, max_size=plen)))
            if explicit
            else None
        )
        outs = (
            tuple(draw(st.lists(st.integers(0, 9), min_size=out, max_size=out)))
            if draw(st.booleans())
            else None
        )
        mode = draw(st.sampled_from(["plain", "n", "beam"]))
        reqs.append(
            TraceRequest(
                draw(st.sampled_from([f"q{i}", i])),
                t,
                plen,
                out,
                prompt,
                draw(st.none() | st.text(max_size=5)),
                n=draw(st.integers(2, 4)) if mode == "n" else 1,
                beam_width=draw(st.integers(2, 4)) if mode == "beam" else 1,
                output_tokens=outs,
            )
        )
    return Trace(tuple(reqs), {"seed": draw(st.integers(0, 10))})


@given(traces())
def test_round_trip(trace: Trace) -> None:
    assert Trace.loads(trace.dumps()) == trace


def test_file_round_trip(tmp_path) -> None:
    trace = generate("sharegpt", 200, seed=1, sharing="system-prompt", system_tokens=20, tenants=2)
    path = trace.write(tmp_path / "sub" / "t.jsonl")
    assert Trace.read(path) == trace


def _text(*reqs: dict, num: int | None = None) -> str:
    header = {
        "format": "kvbench-trace",
        "version": 1,
        "num_requests": len(reqs) if num is None else num,
    }
    return "\n".join([json.dumps(header), *(json.dumps(r) for r in reqs)]) + "\n"


GOOD = {"id": "a", "arrival": 0.0, "prompt_len": 5, "output_len": 3}


@pytest.mark.parametrize(
    ("change", "field", "value_text"),
    [
        ({"output_len": 0}, "output_len", "0"),
        ({"prompt_len": -4}, "prompt_len", "-4"),
        ({"colour": "red"}, "colour", "red"),
        ({"arrival": "soon"}, "arrival", "soon"),
        ({"arrival": -1.0}, "arrival", "-1"),
        ({"n": 2, "beam_width": 3}, "beam_width", "3"),
        ({"prompt": [1, 2], "prompt_len": 3}, "prompt_len", "3"),
        ({"prompt": [1, -2]}, "prompt", "-2"),
        ({"output_tokens": [1]}, "output_tokens", "1"),
        ({"salt": 5}, "salt", "5"),
        ({"id": None}, "id", "None"),
    ],
)
def test_bad_field_named_with_line(change: dict, field: str, value_text: str) -> None:
    second = {**GOOD, "id": "b", **change}
    with pytest.raises(TraceError) as info:
        Trace.loads(_text(GOOD, second))
    msg = str(info.value)
    assert info.value.line == 3 and info.value.field == field
    assert "line 3" in msg and field in msg and value_text in msg


def test_missing_field() -> None:
    bad = {k: v for k, v in GOOD.items() if k != "output_len"}
    with pytest.raises(TraceError, match=r"line 2: field 'output_len': missing"):
        Trace.loads(_text(bad))


def test_out_of_order_and_duplicate() -> None:
    with pytest.raises(TraceError, match=r"line 3: field 'arrival'.*0.5.*1.0"):
        Trace.loads(_text({**GOOD, "arrival": 1.0}, {**GOOD, "id": "b", "arrival": 0.5}))
    with pytest.raises(TraceError, match=r"line 3: field 'id'.*'a'"):
        Trace.loads(_text(GOOD, GOOD))


def test_truncated_and_malformed() -> None:
    text = _text(GOOD, {**GOOD, "id": "b"})
    with pytest.raises(TraceError, match=r"line 3: malformed JSON"):
        Trace.loads(text[:-10])
    with pytest.raises(TraceError, match=r"header promises 3 requests but the file has 2"):
        Trace.loads(_text(GOOD, {**GOOD, "id": "b"}, num=3))
    with pytest.raises(TraceError, match=r"line 1: field 'version'.*7"):
        Trace.loads(text.replace('"version": 1', '"version": 7'))
    with pytest.raises(TraceError, match=r"line 1"):
        Trace.loads("")
    with pytest.raises(TraceError, match=r"line 2: empty line"):
        Trace.loads(_text(GOOD).replace("\n", "\n\n", 1))


def test_synthetic_prompts_never_overlap() -> None:
    a = TraceRequest("a", 0, 100, 1).prompt_ids(0)
    b = TraceRequest("b", 0, 100, 1).prompt_ids(1)
    assert len(a) == 100 and not set(a) & set(b)


def test_workload_command_writes_valid_trace(tmp_path, capsys) -> None:
    out = tmp_path / "t.jsonl"
    rc = main(
        [
            "workload",
            "--workload",
            "alpaca",
            "--requests",
            "300",
            "--seed",
            "5",
            "--arrivals",
            "poisson:10",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    trace = Trace.read(out)
    assert len(trace) == 300 and trace.meta["workload"] == "alpaca"
    expected = generate("alpaca", 300, seed=5, arrivals=parse_arrivals("poisson:10"))
    assert trace.requests == expected.requests and trace.requests[-1].arrival > 0
    assert main(["workload", "--workload", "nope", "--out", str(out)]) == 2
    assert "nope" in capsys.readouterr().err
