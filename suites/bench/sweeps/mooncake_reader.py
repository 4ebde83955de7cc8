"""A small reader of Mooncake-format traces for the trace.serving sweep.

Mooncake's trace (FAST'25; `timestamp` ms, `input_length`, `output_length`, `hash_ids`:
one id per 512-token prompt block, equal ids = shareable prefix) becomes a kvbench
`Trace`: arrival = timestamp / 1000 s, and prompt token ids in which every token of a
512-token block is that block's hash id (`HashBlockPrompt`; the last block is cut to
`input_length`). kvbench's sha256 block chain then shares, at every block size dividing
512, exactly the prefixes the trace's ids share: two prompts agree on a block's tokens
iff they agree on its hash id, and a block's key chains every block before it.

The prompt is kept as its hash ids, not as token lists (`workloads.prompt_ids`: the
conversation trace has 145M prompt tokens).
The project's trace importer (`kvbench workload --import mooncake:PATH`) is the general
tool; this reader only serves the sweep.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvbench.workloads.errors import ConfigError
from kvbench.workloads.prompt_ids import HashBlockPrompt
from kvbench.workloads.trace import Trace, TraceError, TraceRequest

#: Tokens per hash block in Mooncake traces.
MOONCAKE_BLOCK = 512


def read_mooncake(path: str | Path, *, window_s: float | None = None) -> Trace:
    """The trace at `path` (module docstring); only the requests arriving within the first
    `window_s` seconds when given. TraceError names the line of a bad request."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"Mooncake trace {str(p)!r} does not exist or is not a file")
    reqs: list[TraceRequest] = []
    with p.open(encoding="utf-8") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                obj = json.loads(raw)
                ts, plen, olen = obj["timestamp"], obj["input_length"], obj["output_length"]
                ids = tuple(obj["hash_ids"])
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise TraceError(f"not a Mooncake request ({exc})", lineno) from None
            arrival = ts / 1000.0
            if window_s is not None and arrival >= window_s:
                break
            try:
                prompt = HashBlockPrompt(ids, plen, MOONCAKE_BLOCK)
            except ConfigError as exc:
                raise TraceError(str(exc), lineno, "hash_ids") from None
            reqs.append(TraceRequest(lineno - 1, arrival, plen, olen, prompt))  # type: ignore[arg-type]
    return Trace(tuple(reqs), {"generator": "mooncake", "source": p.name, "window_s": window_s})
