"""The production traces shipped inside kvbench (workloads/data/, licenses beside them):
found by name, imported once per process (`workloads.trace_import`)."""

from __future__ import annotations

import functools
from pathlib import Path

from kvbench.workloads.errors import ConfigError
from kvbench.workloads.trace import Trace
from kvbench.workloads.trace_import import read_azure, read_mooncake

DATA_DIR = Path(__file__).resolve().parent / "data"

#: Name -> (file in DATA_DIR, reader).
SHIPPED = {
    "mooncake-conversation": ("mooncake_conversation_trace.jsonl.gz", read_mooncake),
    "azure-conversation": ("AzureLLMInferenceTrace_conv.csv.gz", read_azure),
}


def shipped_path(name: str) -> Path:
    """The file of a shipped trace (ConfigError naming the known ones)."""
    if name not in SHIPPED:
        raise ConfigError(f"unknown shipped trace {name!r}; known: {', '.join(SHIPPED)}")
    return DATA_DIR / SHIPPED[name][0]


@functools.lru_cache(maxsize=4)
def shipped_trace(name: str, speed: float = 1.0) -> Trace:
    """A shipped trace imported as a kvbench trace (cached: traces are immutable)."""
    path = shipped_path(name)
    return SHIPPED[name][1](path, speed)
