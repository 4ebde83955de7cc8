"""Shared pieces of the hostile-input battery (test_hostile_cli.py, test_hostile_api.py).

`TRIED` counts the bad inputs the battery tries, by kind; the conftest prints it at the
end of a session. `run_cli` runs the `kvbench` CLI in-process and returns (status,
stdout, stderr); `tree_digest` fingerprints a folder (every file's path, size and bytes,
and every folder), so a test can assert a refused command changed nothing.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections import Counter
from collections.abc import Sequence
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

#: Bad inputs tried so far in this session, by kind ("cli numeric: nan", ...).
TRIED: Counter[str] = Counter()


def run_cli(argv: Sequence[str]) -> tuple[int, str, str]:
    """`kvbench ARGV` in this process: (exit status, stdout, stderr)."""
    from kvbench.suites.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse exits through the parser's error()
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def tree_digest(root: str | os.PathLike[str]) -> str:
    """A digest of everything under `root`: folder names, file names, sizes and bytes."""
    h = hashlib.sha256()
    base = Path(root)
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames.sort()
        rel = os.path.relpath(dirpath, base)
        h.update(f"D {rel}\n".encode())
        for name in sorted(filenames):
            path = Path(dirpath, name)
            h.update(f"F {rel}/{name} {path.stat().st_size}\n".encode())
            if path.is_file():
                h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def assert_refused(code: int, err: str, command: str, names: str | None = None) -> None:
    """The CLI contract for bad input: exit 2, exactly one line on stderr, of the form
    `kvbench COMMAND: error: ...`, no traceback, naming `names` when given."""
    assert code == 2, f"exit {code}, stderr: {err!r}"
    assert "Traceback" not in err, err
    assert err.count("\n") == 1 and err.endswith("\n"), f"not one line: {err!r}"
    assert err.startswith(f"kvbench {command}: error: "), err
    if names is not None:
        assert names in err, f"{names!r} not named in {err!r}"
