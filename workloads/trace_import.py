"""Production request traces read into kvbench traces (`workloads.trace`).

Two public formats, and any file of the same shape:

    mooncake  JSON lines (Mooncake FAST'25 release): one object a line with exactly
              `timestamp` (ms from the start of the trace, the arrival), `input_length`,
              `output_length` (tokens) and `hash_ids` (ids of the prompt's 512-token
              blocks; equal ids = the same prefix block; the last id covers the partial
              tail). Imported as version-2 requests with `prompt_blocks` = hash_ids and
              `prompt_block_tokens` = 512, so kvbench's block-key chain shares exactly
              what the trace shares (see `workloads.trace.block_token_ids`).
    azure     CSV with the header `TIMESTAMP,ContextTokens,GeneratedTokens` (Azure LLM
              inference trace 2023): wall-clock arrival `YYYY-MM-DD HH:MM:SS[.fraction]`,
              prompt and output tokens. No prefix information: prompts are
              `prompt_len` only (never shared).

Arrivals: Mooncake's timestamp / 1000 seconds; Azure's seconds since the first row.
`speed` divides every arrival (2 replays twice as fast).

Every line is checked before anything is returned, and the first bad one raises
`TraceError` naming the file, the line number (1-based, as an editor counts) and the
field: missing or extra fields, a length that is not an integer in [1, 2^24] (a length
written as 10^30 in digits is refused, not imported for `kvbench hitrate` to exhaust
memory on), hash ids that do not cover the prompt (ceil(input_length / 512) of them), a
timestamp that goes backwards, is unreadable, NaN or infinite, or whose arrival (after
`speed`) lies past 2^22 s (`workloads.trace.MAX_ARRIVAL_S`: a Mooncake timestamp of
1e30 ms would reach the engine as 10^27 s, where float64 seconds step by 2^37 s and
latencies come out negative), non-UTF-8 bytes, a truncated line, an empty file, a
folder. The bounds are the trace format's own (`workloads.trace`).
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from kvbench.workloads.errors import ConfigError
from kvbench.workloads.time_scale import check_time_scale
from kvbench.workloads.trace import (
    MAX_ARRIVAL_S,
    MAX_TOKENS,
    Trace,
    TraceError,
    TraceRequest,
)

#: Tokens per Mooncake hash id.
MOONCAKE_BLOCK_TOKENS = 512
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
GZIP_MAGIC = b"\x1f\x8b"


def check_speed(speed: float) -> float:
    """`speed` as a float when finite and > 0, else ConfigError naming it."""
    return check_time_scale(speed, "speed")


def read_text_lines(path: str | Path) -> list[str]:
    """The file's lines (UTF-8; a gzip file is decompressed first), or TraceError / ConfigError saying why not: a folder, a
    missing file, an empty file, a byte that is not UTF-8 (with its line)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"trace file {str(p)!r} is a folder, not a file")
    if not p.is_file():
        raise ConfigError(f"trace file {str(p)!r} does not exist")
    data = p.read_bytes()
    if data[:2] == GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(f"truncated or corrupt gzip file ({exc})", 1) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        bad = data[exc.start : exc.start + 1]
        raise TraceError(f"not UTF-8 text (byte {exc.start} is {bad!r})", line) from None
    if not text.strip():
        raise TraceError("empty file: no requests", 1)
    return text.splitlines()


#: Trace fields named as each format names them (an error from the trace's own checks).
_MOONCAKE_NAMES = {
    "arrival": "timestamp",
    "prompt_len": "input_length",
    "output_len": "output_length",
    "prompt_blocks": "hash_ids",
}


def _length(obj: dict[str, Any], name: str, lineno: int) -> int:
    value = obj[name]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TOKENS:
        text = repr(value) if len(repr(value)) <= 40 else f"an integer of {len(repr(value))} digits"
        raise TraceError(
            f"must be an integer in [1, {MAX_TOKENS:,}] (2^24), got {text}", lineno, name
        )
    return value


def _arrival(seconds: float, last: float, lineno: int, name: str, raw: object) -> float:
    if seconds < last:
        raise TraceError(
            f"timestamp {raw!r} goes backwards (before the previous line's)", lineno, name
        )
    return seconds


def _scaled(seconds: float, speed: float, lineno: int, name: str, raw: object) -> float:
    """`seconds / speed`, refused (naming the line and field) past MAX_ARRIVAL_S."""
    scaled = seconds / speed
    if not scaled <= MAX_ARRIVAL_S:
        at = f" / speed {speed:g} = {scaled:.4g} s" if speed != 1.0 else ""
        raise TraceError(
            f"{raw!r:.40} is {seconds:.4g} s from the start{at}, past the latest arrival a "
            f"trace may have, {MAX_ARRIVAL_S:,.0f} s (2^22 s, 48.5 days: latencies stay "
            "exact to 1 ns)",
            lineno,
            name,
        )
    return scaled


def _mooncake_request(raw: str, lineno: int, index: int, last: float, speed: float):
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise TraceError(
            f"malformed or truncated JSON ({exc.msg} at column {exc.colno})", lineno
        ) from None
    except RecursionError:
        raise TraceError("malformed JSON (nested too deeply)", lineno) from None
    if not isinstance(obj, dict):
        raise TraceError(f"expected a JSON object, got {type(obj).__name__}", lineno)
    for name in MOONCAKE_FIELDS:
        if name not in obj:
            raise TraceError("missing field", lineno, name)
    for name in obj:
        if name not in MOONCAKE_FIELDS:
            raise TraceError(f"unknown field (value {obj[name]!r:.40})", lineno, name)
    ts = obj["timestamp"]
    seconds = math.nan
    if not isinstance(ts, bool) and isinstance(ts, (int, float)):
        try:
            seconds = ts / 1000.0 + 0.0  # -0 reads as 0
        except OverflowError:  # an integer past float's range
            seconds = math.inf
    if not 0.0 <= seconds < math.inf:  # NaN fails too
        raise TraceError(
            f"must be a finite number of milliseconds >= 0, got {ts!r:.40}", lineno, "timestamp"
        )
    arrival = _arrival(seconds, last, lineno, "timestamp", ts)
    scaled = _scaled(seconds, speed, lineno, "timestamp", ts)
    prompt_len = _length(obj, "input_length", lineno)
    output_len = _length(obj, "output_length", lineno)
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or any(
        isinstance(h, bool) or not isinstance(h, int) or h < 0 for h in ids
    ):
        raise TraceError(f"must be a list of integers >= 0, got {ids!r:.60}", lineno, "hash_ids")
    need = -(-prompt_len // MOONCAKE_BLOCK_TOKENS)
    if len(ids) != need:
        raise TraceError(
            f"has {len(ids)} ids; input_length {prompt_len} needs ceil({prompt_len}/"
            f"{MOONCAKE_BLOCK_TOKENS}) = {need}",
            lineno,
            "hash_ids",
        )
    try:
        req = TraceRequest(
            index,
            scaled,
            prompt_len,
            output_len,
            prompt_blocks=tuple(ids),
            prompt_block_tokens=MOONCAKE_BLOCK_TOKENS,
        )
    except TraceError as exc:
        field = exc.field or "prompt_blocks"
        name = _MOONCAKE_NAMES.get(field, field)
        raise TraceError(str(exc).split(": ", 1)[-1], lineno, name) from None
    return req, arrival


def parse_wall_clock(text: str) -> int:
    """Nanoseconds since the epoch (naive; integer, so differences are exact) of
    `YYYY-MM-DD HH:MM:SS[.fraction]`; ValueError when it is not that."""
    whole, _, frac = text.strip().partition(".")
    base = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
    if frac and not frac.isdigit():
        raise ValueError(f"fraction {frac!r} is not digits")
    seconds = (base - datetime(1970, 1, 1)) // timedelta(seconds=1)
    return seconds * 10**9 + int(frac.ljust(9, "0")[:9] or 0)


def _azure_request(raw: str, lineno: int, index: int, last: float, first: int | None, speed: float):
    parts = raw.split(",")
    if len(parts) != len(AZURE_HEADER):
        which = AZURE_HEADER[len(parts)] if len(parts) < len(AZURE_HEADER) else None
        raise TraceError(
            f"has {len(parts)} fields, expected {len(AZURE_HEADER)} "
            f"({','.join(AZURE_HEADER)}){'; truncated line?' if which else ''}",
            lineno,
            which or "extra field",
        )
    try:
        stamp = parse_wall_clock(parts[0])
    except ValueError:
        raise TraceError(
            f"not a time YYYY-MM-DD HH:MM:SS[.fraction]: {parts[0]!r}", lineno, "TIMESTAMP"
        ) from None
    origin = stamp if first is None else first
    arrival = _arrival((stamp - origin) / 1e9, last, lineno, "TIMESTAMP", parts[0])
    scaled = _scaled(arrival, speed, lineno, "TIMESTAMP", parts[0])
    lengths = []
    for name, text in zip(AZURE_HEADER[1:], parts[1:], strict=True):
        try:
            value = int(text.strip())
        except ValueError:
            raise TraceError(f"not an integer: {text!r:.40}", lineno, name) from None
        if not 1 <= value <= MAX_TOKENS:
            raise TraceError(
                f"must be in [1, {MAX_TOKENS:,}] (2^24), got {text.strip()!r:.40}", lineno, name
            )
        lengths.append(value)
    return (index, scaled, lengths[0], lengths[1]), arrival, origin


def read_mooncake(path: str | Path, speed: float = 1.0) -> Trace:
    """A Mooncake-format JSONL file as a kvbench trace (module docstring)."""
    speed = check_speed(speed)
    requests: list[TraceRequest] = []
    last = 0.0
    with _naming(path):
        for lineno, raw in enumerate(read_text_lines(path), start=1):
            if not raw.strip():
                raise TraceError("empty line (each line must be one request)", lineno)
            req, last = _mooncake_request(raw, lineno, len(requests), last, speed)
            requests.append(req)
    return Trace(tuple(requests), _meta("mooncake", path, speed, MOONCAKE_BLOCK_TOKENS))


def read_azure(path: str | Path, speed: float = 1.0) -> Trace:
    """An Azure-format CSV file as a kvbench trace (module docstring)."""
    speed = check_speed(speed)
    rows: list[tuple[int, float, int, int]] = []
    last = 0.0
    first: int | None = None
    with _naming(path):
        lines = read_text_lines(path)
        header = tuple(h.strip() for h in lines[0].split(","))
        if header != AZURE_HEADER:
            raise TraceError(
                f"header {lines[0][:80]!r}; expected {','.join(AZURE_HEADER)}", 1, "header"
            )
        if len(lines) < 2:
            raise TraceError("no requests after the header", 1)
        for lineno, raw in enumerate(lines[1:], start=2):
            if not raw.strip():
                raise TraceError("empty line (each line must be one request)", lineno)
            row, last, first = _azure_request(raw, lineno, len(rows), last, first, speed)
            rows.append(row)
    requests = tuple(TraceRequest(i, a, p, o) for i, a, p, o in rows)
    return Trace(requests, _meta("azure", path, speed, None))


#: Format name -> reader (`kvbench workload --import FORMAT:PATH`).
READERS: dict[str, Callable[[str | Path, float], Trace]] = {
    "mooncake": read_mooncake,
    "azure": read_azure,
}


def import_trace(spec: str, speed: float = 1.0) -> Trace:
    """`FORMAT:PATH` (mooncake or azure) read into a trace; ConfigError for a bad spec."""
    fmt, sep, path = str(spec).partition(":")
    if not sep or not path:
        raise ConfigError(
            f"import {spec!r} must be FORMAT:PATH with FORMAT in {', '.join(READERS)}"
        )
    if fmt not in READERS:
        raise ConfigError(f"unknown trace format {fmt!r}; known: {', '.join(READERS)}")
    return READERS[fmt](path, speed)


def _meta(source: str, path: str | Path, speed: float, block_tokens: int | None) -> dict:
    meta: dict[str, Any] = {"generator": f"import:{source}", "file": Path(path).name}
    meta["speed"] = speed
    if block_tokens:
        meta["prompt_block_tokens"] = block_tokens
    return meta


class _naming:
    """Prefix a TraceError raised inside with the file's name (line and field kept)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, TraceError) and not str(exc).startswith("trace file"):
            err = TraceError(f"trace file {self.path!r}: {exc}")
            err.line, err.field = exc.line, exc.field
            raise err from None
