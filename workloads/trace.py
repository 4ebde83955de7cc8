"""Replayable request traces: a versioned JSON-lines format that round-trips.

Format (UTF-8, one JSON object per line):

    line 1      header: {"format": "kvbench-trace", "version": 1 or 2, "num_requests": N,
                         "meta": {...free-form: generator, seed, ...}}
    line 2..N+1 one request each, fields:
        id            str or int, unique in the trace                        (required)
        arrival       seconds >= 0, non-decreasing down the file              (required)
        output_len    tokens to generate, >= 1                                (required)
        prompt        list of token ids (ints >= 0)      } at least one; if both,
        prompt_len    prompt length, >= 1                } they must agree
        salt          str or null: prefix-cache isolation key (tenant)        (optional)
        n             parallel samples of this prompt, >= 1 (default 1)       (optional)
        beam_width    beam search width, >= 1 (default 1; not with n > 1)     (optional)
        output_tokens token ids the request will generate (len == output_len) (optional)
      version 2 adds a compact prompt description (for imported production traces, whose
      prompts are too long to store as ids: 145M tokens in the Mooncake trace):
        prompt_blocks        block ids (ints >= 0), one per prompt_block_tokens tokens of
                             the prompt: ceil(prompt_len / prompt_block_tokens) of them;
                             needs prompt_len, excludes prompt                  (optional)
        prompt_block_tokens  tokens per described block, >= 1 (with prompt_blocks)

A file is written as version 1 unless a request uses `prompt_blocks` (so version-1 files
stay byte-identical); both versions are read.

A request given by `prompt_blocks` gets synthesized prompt ids (`block_token_ids`): the
ids of a block depend only on its block id and the position within the block, and
differ from every other block's and from every other synthetic id. So kvbench's sha256
block-key chain (`paged.prefix_cache`) shares a block exactly when the trace's block ids
say so, at every block size dividing prompt_block_tokens; the last, partial block keeps
prompt_len (its first prompt_len mod prompt_block_tokens ids).

A request given by `prompt_len` only gets synthetic prompt ids that depend on its
position in the trace and never coincide with another request's (see
`TraceRequest.prompt_ids`), so such requests never share prefix-cache blocks.

Loading validates everything and raises `TraceError` naming the line number, the field
and the bad value: malformed or truncated JSON, a missing or unknown field, a wrong type,
a negative length, an output length of 0, an arrival out of order, a duplicate id, or
fewer request lines than the header promises.

Every number is bounded, so no value that reads as a number can exhaust memory or
overflow what is derived from it downstream (a request, imported or made in Python,
is checked the same way):

    arrival                 finite, in [0, MAX_ARRIVAL_S] = [0, 2^22 s] (48.5 days)
    prompt_len, output_len  in [1, MAX_TOKENS] = [1, 2^24] (16,777,216 tokens)
    n, beam_width           in [1, MAX_SAMPLES] = [1, 1024]
    token ids               in [0, MAX_TOKEN_ID] = [0, 2^63 - 1] (prompt, output_tokens)

Why these: the serving engine keeps time as integer picoseconds and reports seconds as
float64; up to 2^22 s a float64 of seconds resolves 2^-30 s (under 1 ns), so every
latency (a difference of two such times) is exact to 1 ns, and the picosecond clock
(4.2e18 at the latest arrival) stays under 2^63 with as much again for serving. A
week-long production trace (604,800 s) fits seven times over. (At 10^27 s, a float64's
step is 2^37 s: the difference of two nearly equal times comes out as -6.9e10 s.)
2^24 tokens is past the longest context any released model serves (10M, Llama 4
Scout) and is exactly SYNTH_BASE, the id span of one request's synthetic prompt, so
synthetic prompts never overlap. Token ids are int64 in the prefix cache's block keys.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench.workloads.errors import ConfigError
from kvbench.workloads.prompt_ids import KnownIds

FORMAT = "kvbench-trace"
#: The newest version written (a trace without `prompt_blocks` is written as version 1).
VERSION = 2
READ_VERSIONS = (1, 2)
_HEADER_FIELDS = {"format", "version", "num_requests", "meta"}
_REQUEST_FIELDS = {
    "id",
    "arrival",
    "prompt",
    "prompt_len",
    "output_len",
    "salt",
    "n",
    "beam_width",
    "output_tokens",
    "prompt_blocks",
    "prompt_block_tokens",
}
#: Synthetic prompt ids of request i occupy [SYNTH_BASE * (i + 1), SYNTH_BASE * (i + 2)).
SYNTH_BASE = 1 << 24
#: Ids synthesized from block ids occupy [BLOCK_ID_BASE, 2**63): above every per-request
#: synthetic id (SYNTH_BASE * (i + 2) < 2**56 for any trace that fits in memory), below
#: the int64 the block keys encode ids as.
BLOCK_ID_BASE = 1 << 56
#: Largest block id * prompt_block_tokens + position that stays inside that range.
MAX_BLOCK_SPAN = (1 << 63) - BLOCK_ID_BASE
#: Longest prompt, and longest output, of one request [tokens] (module docstring).
MAX_TOKENS = SYNTH_BASE
#: Most parallel samples (n) or beams (beam_width) of one request.
MAX_SAMPLES = 1024
#: Latest arrival [s]: 2^22 s, 48.5 days (module docstring: latencies exact to 1 ns).
MAX_ARRIVAL_S = float(1 << 22)
#: Largest token id (the prefix cache's block keys encode ids as int64).
MAX_TOKEN_ID = (1 << 63) - 1


class BlockTokenIds(KnownIds):
    """The prompt ids a list of block ids describes, without building them: id
    BLOCK_ID_BASE + block * block_tokens + position (injective in (block, position)),
    `length` ids in all (the last block keeps only the ids up to `length`).

    Immutable; a slice is a tuple of ints, built from ranges at C speed (a prefix-cache
    lookup slices one block at a time), so a 10^4-token prompt costs nothing until read.
    Every id is an int >= BLOCK_ID_BASE (a `KnownIds`: `validate_prompt` trusts it).
    """

    __slots__ = ("_blocks", "_bt", "_len")

    def __init__(self, blocks: Sequence[int], block_tokens: int, length: int) -> None:
        self._blocks = tuple(blocks)
        self._bt = block_tokens
        self._len = length

    def __len__(self) -> int:
        return self._len

    def described(self) -> tuple[tuple[int, ...], int]:
        """(the block ids, tokens per block): what the ids are made from (a prefix
        cache keys a block's ids from its block id alone, `paged.block_chain`)."""
        return self._blocks, self._bt

    def head(self, length: int) -> BlockTokenIds:
        """The first `length` ids (0 < length <= len(self)) as a BlockTokenIds: equal to
        self[:length] id for id, without listing them (an admission's first chunk of a
        long prompt, which `validate_prompt` then takes unchecked as a `KnownIds`)."""
        if isinstance(length, bool) or not isinstance(length, int) or not 0 < length <= self._len:
            raise ValueError(f"head length must be an int in 1..{self._len}, got {length!r}")
        return BlockTokenIds(self._blocks[: -(-length // self._bt)], self._bt, length)

    def max_id(self) -> int:
        """The largest id: a full block's last position, or the last block's last kept one."""
        bt, blocks = self._bt, self._blocks
        tail = BLOCK_ID_BASE + blocks[-1] * bt + (self._len - 1) % bt
        full = blocks[:-1]
        return max(tail, BLOCK_ID_BASE + max(full) * bt + bt - 1) if full else tail

    def _spans(self, start: int, stop: int) -> Iterator[range]:
        bt, blocks = self._bt, self._blocks
        pos = start
        while pos < stop:
            k, off = divmod(pos, bt)
            base = BLOCK_ID_BASE + blocks[k] * bt
            take = min(bt - off, stop - pos)
            yield range(base + off, base + off + take)
            pos += take

    def __getitem__(self, index):  # type: ignore[no-untyped-def, override]
        if isinstance(index, slice):
            start, stop, step = index.indices(self._len)
            if step != 1:
                return tuple(self)[index]
            if stop <= start:  # empty (also at the very end, past the last block)
                return ()
            if stop - start <= self._bt - start % self._bt:  # inside one block
                k, off = divmod(start, self._bt)
                base = BLOCK_ID_BASE + self._blocks[k] * self._bt + off
                return tuple(range(base, base + max(0, stop - start)))
            out: list[int] = []
            for span in self._spans(start, stop):
                out.extend(span)
            return tuple(out)
        i = range(self._len)[index]  # IndexError / TypeError like a tuple
        k, off = divmod(i, self._bt)
        return BLOCK_ID_BASE + self._blocks[k] * self._bt + off

    def __iter__(self) -> Iterator[int]:
        for span in self._spans(0, self._len):
            yield from span

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BlockTokenIds):
            return (self._blocks, self._bt, self._len) == (other._blocks, other._bt, other._len)
        if isinstance(other, (tuple, list)):
            return len(other) == self._len and tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self._blocks, self._bt, self._len))

    def __repr__(self) -> str:
        return f"BlockTokenIds({len(self._blocks)} blocks of {self._bt}, {self._len} ids)"


def block_token_ids(blocks: Sequence[int], block_tokens: int, length: int) -> BlockTokenIds:
    """The `length` prompt ids described by `blocks` of `block_tokens` tokens each
    (`BlockTokenIds`)."""
    return BlockTokenIds(blocks, block_tokens, length)


class TraceError(ConfigError):
    """A trace file or trace request is invalid. `line` (1-based, 0 if not from a file)
    and `field` say where."""

    def __init__(self, message: str, line: int = 0, field: str | None = None) -> None:
        where = f"line {line}: " if line else ""
        where += f"field {field!r}: " if field else ""
        super().__init__(where + message)
        self.line = line
        self.field = field


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace (see the module docstring for the fields' meaning)."""

    id: str | int
    arrival: float
    prompt_len: int
    output_len: int
    prompt: tuple[int, ...] | None = None
    salt: str | None = None
    n: int = 1
    beam_width: int = 1
    output_tokens: tuple[int, ...] | None = field(default=None, repr=False)
    prompt_blocks: tuple[int, ...] | None = field(default=None, repr=False)
    prompt_block_tokens: int | None = None

    def __post_init__(self) -> None:
        _validate_request(self, line=0)
        if isinstance(self.arrival, float) and self.arrival == 0.0:
            object.__setattr__(self, "arrival", 0.0)  # -0.0 reads (and is written) as 0.0

    def prompt_ids(self, index: int) -> Sequence[int]:
        """The prompt's token ids: the given ones (a tuple), the ids synthesized from
        `prompt_blocks` (`block_token_ids`), or synthetic ids unique to `index`, the
        request's position in its trace (a range: no list is built)."""
        if self.prompt is not None:
            return self.prompt
        if self.prompt_blocks is not None and self.prompt_block_tokens is not None:
            return block_token_ids(self.prompt_blocks, self.prompt_block_tokens, self.prompt_len)
        base = SYNTH_BASE * (index + 1)
        return range(base, base + self.prompt_len)

    def as_dict(self) -> dict[str, Any]:
        """The JSON object of this request (defaults omitted)."""
        out: dict[str, Any] = {"id": self.id, "arrival": self.arrival}
        if self.prompt is not None:
            out["prompt"] = list(self.prompt)
        else:
            out["prompt_len"] = self.prompt_len
        if self.prompt_blocks is not None:
            out["prompt_blocks"] = list(self.prompt_blocks)
            out["prompt_block_tokens"] = self.prompt_block_tokens
        out["output_len"] = self.output_len
        if self.salt is not None:
            out["salt"] = self.salt
        if self.n != 1:
            out["n"] = self.n
        if self.beam_width != 1:
            out["beam_width"] = self.beam_width
        if self.output_tokens is not None:
            out["output_tokens"] = list(self.output_tokens)
        return out


@dataclass(frozen=True)
class Trace:
    """An ordered list of requests plus free-form metadata (generator, seed, ...)."""

    requests: tuple[TraceRequest, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "requests", tuple(self.requests))
        seen: set[str | int] = set()
        last = 0.0
        for i, req in enumerate(self.requests):
            if req.id in seen:
                raise TraceError(f"duplicate request id {req.id!r}", i + 2, "id")
            if req.arrival < last:
                raise TraceError(
                    f"arrival {req.arrival!r} is before the previous request's {last!r}",
                    i + 2,
                    "arrival",
                )
            seen.add(req.id)
            last = req.arrival

    def __len__(self) -> int:
        return len(self.requests)

    def header(self) -> dict[str, Any]:
        compact = any(r.prompt_blocks is not None for r in self.requests)
        return {
            "format": FORMAT,
            "version": VERSION if compact else 1,
            "num_requests": len(self.requests),
            "meta": self.meta,
        }

    def lines(self) -> Iterator[str]:
        """The trace as JSON lines (no newlines)."""
        yield json.dumps(self.header(), sort_keys=True)
        for req in self.requests:
            yield json.dumps(req.as_dict())

    def dumps(self) -> str:
        return "\n".join(self.lines()) + "\n"

    def write(self, path: str | Path) -> Path:
        """Write the trace to `path` (parent folders are created).

        The file is written next to `path` under a temporary name and renamed into place,
        so a failed write (a full disk, a kill) leaves any earlier file at `path` whole.
        """
        out = Path(path)
        if out.is_dir():
            raise ConfigError(f"trace file {str(out)!r} is a folder; give a file name")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        try:
            with tmp.open("w", encoding="utf-8") as fh:
                for line in self.lines():
                    fh.write(line + "\n")
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
        return out

    @classmethod
    def loads(cls, text: str) -> Trace:
        return cls.from_lines(text.splitlines())

    @classmethod
    def read(cls, path: str | Path) -> Trace:
        """Load and validate a trace file (raises TraceError naming line and field)."""
        p = Path(path)
        if p.is_dir():
            raise ConfigError(f"trace file {str(p)!r} is a folder, not a file")
        if not p.is_file():
            raise ConfigError(f"trace file {str(p)!r} does not exist")
        try:
            text = p.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            line = _line_of(exc.object, exc.start)
            bad = exc.object[exc.start : exc.start + 1]
            err = TraceError(
                f"trace file {str(p)!r}: line {line}: not UTF-8 text (byte {exc.start} is "
                f"{bad!r}); is this a kvbench trace file?"
            )
            err.line = line
            raise err from None
        except OSError as exc:
            raise ConfigError(f"cannot read trace file {str(p)!r}: {exc.strerror or exc}") from None
        try:
            return cls.from_lines(text.splitlines())
        except TraceError as exc:
            err = TraceError(f"trace file {str(p)!r}: {exc}")
            err.line, err.field = exc.line, exc.field
            raise err from None

    @classmethod
    def from_lines(cls, lines: Iterable[str]) -> Trace:
        it = iter(lines)
        header_line = next(it, None)
        if header_line is None or not header_line.strip():
            raise TraceError("empty trace: the header line is missing", 1)
        header = _parse_object(header_line, 1)
        for key in header:
            if key not in _HEADER_FIELDS:
                raise TraceError(f"unknown header field (value {header[key]!r})", 1, key)
        if header.get("format") != FORMAT:
            raise TraceError(f"expected {FORMAT!r}, got {header.get('format')!r}", 1, "format")
        version = header.get("version")
        if isinstance(version, bool) or version not in READ_VERSIONS:
            raise TraceError(
                f"unsupported version {_short(version)} (this kvbench reads "
                f"{' and '.join(map(str, READ_VERSIONS))})",
                1,
                "version",
            )
        expected = header.get("num_requests")
        if isinstance(expected, bool) or not isinstance(expected, int) or not 0 <= expected < 2**31:
            raise TraceError(
                f"must be an integer in [0, 2^31) (a file of more request lines would hold "
                f"over 100 GB), got {_short(expected)}",
                1,
                "num_requests",
            )
        meta = header.get("meta", {})
        if not isinstance(meta, dict):
            raise TraceError(f"must be an object, got {meta!r}", 1, "meta")
        requests: list[TraceRequest] = []
        seen: set[str | int] = set()
        last_arrival = 0.0
        for lineno, raw in enumerate(it, start=2):
            if not raw.strip():
                raise TraceError("empty line (each line must be one request)", lineno)
            req = _request_from_obj(_parse_object(raw, lineno), lineno)
            if version == 1 and req.prompt_blocks is not None:
                raise TraceError(
                    "is a version-2 field; the header says version 1", lineno, "prompt_blocks"
                )
            if req.id in seen:
                raise TraceError(f"duplicate request id {req.id!r}", lineno, "id")
            if req.arrival < last_arrival:
                raise TraceError(
                    f"arrival {req.arrival!r} is before the previous request's "
                    f"{last_arrival!r} (requests must be in arrival order)",
                    lineno,
                    "arrival",
                )
            seen.add(req.id)
            last_arrival = req.arrival
            requests.append(req)
        if len(requests) != expected:
            raise TraceError(
                f"header promises {expected} requests but the file has {len(requests)} "
                "(truncated or extended trace)",
                len(requests) + 2,
                "num_requests",
            )
        return cls(tuple(requests), dict(meta))


def _line_of(data: bytes, offset: int) -> int:
    """1-based line number of byte `offset` in `data`."""
    return data.count(b"\n", 0, offset) + 1


def _parse_object(raw: str, lineno: int) -> dict[str, Any]:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise TraceError(f"malformed JSON ({exc.msg} at column {exc.colno})", lineno) from None
    except RecursionError:
        raise TraceError("malformed JSON (nested too deeply)", lineno) from None
    if not isinstance(obj, dict):
        raise TraceError(f"expected a JSON object, got {type(obj).__name__}", lineno)
    return obj


def _int_field(
    obj: dict[str, Any], name: str, lineno: int, minimum: int, default: int | None, maximum: int
):
    if name not in obj:
        if default is None:
            raise TraceError("missing required field", lineno, name)
        return default
    value = obj[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(f"must be an integer, got {value!r}", lineno, name)
    if not minimum <= value <= maximum:
        raise TraceError(f"must be in [{minimum}, {maximum:,}], got {_short(value)}", lineno, name)
    return value


def _short(value: object) -> str:
    """`repr(value)`, cut to 40 characters (a 10^400 written in digits stays readable)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


def _token_list(value: Any, lineno: int, name: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise TraceError(f"must be a list of token ids, got {type(value).__name__}", lineno, name)
    for t in value:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= MAX_TOKEN_ID:
            raise TraceError(
                f"token id {_short(t)} is not an integer in [0, 2^63 - 1]", lineno, name
            )
    return tuple(value)


def _request_from_obj(obj: dict[str, Any], lineno: int) -> TraceRequest:
    for key in obj:
        if key not in _REQUEST_FIELDS:
            raise TraceError(f"unknown request field (value {obj[key]!r})", lineno, key)
    if "id" not in obj:
        raise TraceError("missing required field", lineno, "id")
    rid = obj["id"]
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise TraceError(f"must be a string or integer, got {rid!r}", lineno, "id")
    if "arrival" not in obj:
        raise TraceError("missing required field", lineno, "arrival")
    arrival = check_arrival(obj["arrival"], lineno)
    output_len = _int_field(obj, "output_len", lineno, 1, None, MAX_TOKENS)
    prompt = _token_list(obj["prompt"], lineno, "prompt") if "prompt" in obj else None
    if prompt is None and "prompt_len" not in obj:
        raise TraceError("missing: give 'prompt' or 'prompt_len'", lineno, "prompt_len")
    prompt_len = _int_field(obj, "prompt_len", lineno, 1, len(prompt) if prompt else 0, MAX_TOKENS)
    salt = obj.get("salt")
    if salt is not None and not isinstance(salt, str):
        raise TraceError(f"must be a string or null, got {salt!r}", lineno, "salt")
    out_tokens = None
    if "output_tokens" in obj:
        out_tokens = _token_list(obj["output_tokens"], lineno, "output_tokens")
    blocks = None
    if "prompt_blocks" in obj:
        blocks = _token_list(obj["prompt_blocks"], lineno, "prompt_blocks")
        if "prompt" in obj:
            raise TraceError("give 'prompt' or 'prompt_blocks', not both", lineno, "prompt_blocks")
        if "prompt_block_tokens" not in obj:
            raise TraceError("missing: 'prompt_blocks' needs it", lineno, "prompt_block_tokens")
        if "prompt_len" not in obj:
            raise TraceError("missing: 'prompt_blocks' needs it", lineno, "prompt_len")
    elif "prompt_block_tokens" in obj:
        raise TraceError("given without 'prompt_blocks'", lineno, "prompt_block_tokens")
    block_tokens = (
        _int_field(obj, "prompt_block_tokens", lineno, 1, None, MAX_TOKENS)
        if blocks is not None
        else None
    )
    values = dict(
        id=rid,
        arrival=arrival,
        prompt_len=prompt_len,
        output_len=output_len,
        prompt=prompt,
        salt=salt,
        n=_int_field(obj, "n", lineno, 1, 1, MAX_SAMPLES),
        beam_width=_int_field(obj, "beam_width", lineno, 1, 1, MAX_SAMPLES),
        output_tokens=out_tokens,
        prompt_blocks=blocks,
        prompt_block_tokens=block_tokens,
    )
    try:
        return TraceRequest(**values)
    except TraceError as exc:
        raise TraceError(str(exc).split(": ", 1)[-1], lineno, exc.field) from None


def check_arrival(value: object, line: int = 0, field: str = "arrival") -> float:
    """An arrival as a float of seconds: a finite number in [0, MAX_ARRIVAL_S] (-0 reads
    as 0), else TraceError naming `line` and `field` (module docstring: why the bound)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TraceError(f"must be a number of seconds, got {_short(value)}", line, field)
    try:
        seconds = float(value) + 0.0
    except OverflowError:  # an int past float's range
        seconds = math.inf
    if not 0.0 <= seconds <= MAX_ARRIVAL_S:  # NaN fails both comparisons
        raise TraceError(
            f"must be a number of seconds in [0, {MAX_ARRIVAL_S:,.0f}] (2^22 s, 48.5 days: "
            f"latencies stay exact to 1 ns), got {_short(value)}",
            line,
            field,
        )
    return seconds


def _validate_request(req: TraceRequest, line: int) -> None:
    """Cross-field checks shared by construction and loading."""
    if isinstance(req.id, bool) or not isinstance(req.id, (str, int)):
        raise TraceError(f"must be a string or integer, got {_short(req.id)}", line, "id")
    check_arrival(req.arrival, line)
    bounds = (("prompt_len", MAX_TOKENS), ("output_len", MAX_TOKENS))
    for name, maximum in (*bounds, ("n", MAX_SAMPLES), ("beam_width", MAX_SAMPLES)):
        value = getattr(req, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
            raise TraceError(
                f"must be an integer in [1, {maximum:,}], got {_short(value)}", line, name
            )
    for name in ("prompt", "output_tokens"):
        ids = getattr(req, name)
        try:
            top = max(ids) if ids else 0  # C speed: this runs for every request built
        except TypeError:
            continue  # not all numbers: the cache's own id checks name the bad one
        if isinstance(top, int) and top > MAX_TOKEN_ID:
            raise TraceError(
                f"token id {_short(top)} is not an integer in [0, 2^63 - 1]", line, name
            )
    if req.prompt is not None and len(req.prompt) != req.prompt_len:
        raise TraceError(
            f"prompt_len {req.prompt_len} disagrees with the prompt's {len(req.prompt)} ids",
            line,
            "prompt_len",
        )
    if req.output_tokens is not None and len(req.output_tokens) != req.output_len:
        raise TraceError(
            f"has {len(req.output_tokens)} ids but output_len is {req.output_len}",
            line,
            "output_tokens",
        )
    if req.n > 1 and req.beam_width > 1:
        raise TraceError(
            f"n={req.n} and beam_width={req.beam_width}: a request samples or beams, not both",
            line,
            "beam_width",
        )
    if req.salt is not None and not isinstance(req.salt, str):
        raise TraceError(f"must be a string or null, got {req.salt!r}", line, "salt")
    if req.prompt_blocks is not None or req.prompt_block_tokens is not None:
        _validate_blocks(req, line)


def _validate_blocks(req: TraceRequest, line: int) -> None:
    """`prompt_blocks` and `prompt_block_tokens` go together, exclude `prompt`, and the
    ids cover the prompt exactly: ceil(prompt_len / prompt_block_tokens) of them."""
    bt, blocks = req.prompt_block_tokens, req.prompt_blocks
    if blocks is None or bt is None:
        raise TraceError("prompt_blocks and prompt_block_tokens go together", line, "prompt_blocks")
    if isinstance(bt, bool) or not isinstance(bt, int) or bt < 1:
        raise TraceError(f"must be an integer >= 1, got {bt!r}", line, "prompt_block_tokens")
    if req.prompt is not None:
        raise TraceError("give 'prompt' or 'prompt_blocks', not both", line, "prompt_blocks")
    need = -(-req.prompt_len // bt)
    if len(blocks) != need:
        raise TraceError(
            f"has {len(blocks)} block ids; prompt_len {req.prompt_len} in blocks of {bt} "
            f"tokens needs {need}",
            line,
            "prompt_blocks",
        )
    for b in blocks:
        if isinstance(b, bool) or not isinstance(b, int) or b < 0 or (b + 1) * bt > MAX_BLOCK_SPAN:
            raise TraceError(
                f"block id {b!r} is not an integer in [0, {MAX_BLOCK_SPAN // bt})",
                line,
                "prompt_blocks",
            )


def requests_from_arrays(
    arrivals: Collection[float],
    prompt_lens: Collection[int],
    output_lens: Collection[int],
    id_prefix: str = "r",
) -> list[TraceRequest]:
    """Independent requests (synthetic prompts) from parallel arrays (lists or numpy) of
    equal length."""
    if not len(arrivals) == len(prompt_lens) == len(output_lens):
        raise ConfigError(
            f"array lengths differ: {len(arrivals)}, {len(prompt_lens)}, {len(output_lens)}"
        )
    return [
        TraceRequest(f"{id_prefix}{i}", float(a), int(p), int(o))
        for i, (a, p, o) in enumerate(zip(arrivals, prompt_lens, output_lens, strict=True))
    ]
