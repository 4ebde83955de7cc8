"""Where runs live on disk: the default results folder, the run files in a folder, and a
file's first line (its header), read without loading the run.

Kept apart from `writer` and `reader` so both use it and neither imports the other (the
writer checks a file's header before appending; the reader finds and lists runs).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

#: Where runs go unless told otherwise (relative to the working directory).
DEFAULT_RESULTS_DIR = "out/results"


def read_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The first line of a results file as a dict ({} when it is not a JSON object).
    Reads at most 16 MiB, so a binary file without newlines costs little."""
    try:
        with open(path, "rb") as fh:
            obj = json.loads(fh.readline(16 * 2**20).decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return {}
    return obj if isinstance(obj, dict) else {}


def run_files(results_dir: str | os.PathLike[str] = DEFAULT_RESULTS_DIR) -> list[Path]:
    """Result files in `results_dir`, sorted by name (run ids sort by start time)."""
    folder = Path(results_dir)
    if not folder.is_dir():
        return []
    return sorted(f for f in folder.glob("*.jsonl") if f.is_file())
