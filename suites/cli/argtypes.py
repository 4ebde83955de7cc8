"""Argument types and path checks shared by the `kvbench` subcommands.

Every numeric option is parsed by one of these types, so a bad value (negative, zero
where a count is needed, NaN, infinite, out of range, not a number at all) is refused by
argparse with a one-line message naming the option and the value, before the command
does anything. The path checks run before a command writes, so a refused command leaves
every file as it was.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path

from kvbench.workloads.block_size import (
    BLOCK_SIZE_RANGE,
    DEFAULT_BLOCK_SIZE,
    MAX_BLOCK_SIZE,
    MIN_BLOCK_SIZE,
    check_block_size,
)
from kvbench.workloads.errors import ConfigError


def _number(text: str, kind: type) -> float | int:
    try:
        return kind(text)
    except (TypeError, ValueError, OverflowError):
        what = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None


def int_range(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in [lo, hi] (either bound may be None)."""

    def parse(text: str) -> int:
        value = int(_number(text, int))
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"{text!r} is not {_bounds_text(lo, hi)}")
        return value

    parse.__name__ = "integer"
    parse.bounds = (lo, hi)  # type: ignore[attr-defined]  # read by the hostile-input battery
    return parse


def float_range(
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
) -> Callable[[str], float]:
    """An argparse type: a finite number in [lo, hi] (open ends with lo_open / hi_open)."""

    def parse(text: str) -> float:
        value = float(_number(text, float)) + 0.0  # -0 reads as 0
        bad = not math.isfinite(value)
        if lo is not None:
            bad = bad or value < lo or (lo_open and value == lo)
        if hi is not None:
            bad = bad or value > hi or (hi_open and value == hi)
        if bad:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {_bounds_text(lo, hi, lo_open, hi_open, finite=True)}"
            )
        return value

    parse.__name__ = "number"
    parse.bounds = (lo, hi)  # type: ignore[attr-defined]  # read by the hostile-input battery
    return parse


def _bounds_text(
    lo: float | None,
    hi: float | None,
    lo_open: bool = False,
    hi_open: bool = False,
    finite: bool = False,
) -> str:
    noun = "a finite number" if finite else "an integer"
    if lo is not None and hi is not None:
        left, right = "(" if lo_open else "[", ")" if hi_open else "]"
        return f"{noun} in {left}{_num(lo)}, {_num(hi)}{right}"
    if lo is not None:
        return f"{noun} {'>' if lo_open else '>='} {_num(lo)}"
    if hi is not None:
        return f"{noun} {'<' if hi_open else '<='} {_num(hi)}"
    return noun


def _num(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


#: Common shapes: a count of at least one, a count that may be zero, a seed.
positive_int = int_range(1)
nonnegative_int = int_range(0)
seed_int = int_range(0, 2**32 - 1)
finite_float = float_range()
positive_float = float_range(0.0, lo_open=True)
nonnegative_float = float_range(0.0)


def block_size_arg(text: str) -> int:
    """An argparse type: a block size (`workloads.block_size.check_block_size`, the one
    range of kvbench), refused in the CLI's one-line form naming the text."""
    value = _number(text, int)
    try:
        return check_block_size(value)
    except ConfigError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {BLOCK_SIZE_RANGE}") from None


# the bounds are read by the hostile-input battery, as int_range's are
block_size_arg.bounds = (MIN_BLOCK_SIZE, MAX_BLOCK_SIZE)  # type: ignore[attr-defined]

#: The help text of every `--block-size` (the same words, range and default everywhere).
BLOCK_SIZE_HELP = f"tokens per KV block, {BLOCK_SIZE_RANGE} (default {DEFAULT_BLOCK_SIZE})"


def add_block_size_option(parser: argparse.ArgumentParser) -> argparse.Action:
    """Add `--block-size` to a subcommand: the one block-size option of the CLI (same
    type, range, help and default, `DEFAULT_BLOCK_SIZE`, in every subcommand that takes
    it; a test enumerates the subcommands and checks)."""
    return parser.add_argument(
        "--block-size", type=block_size_arg, default=DEFAULT_BLOCK_SIZE, help=BLOCK_SIZE_HELP
    )


def _first_file_ancestor(path: Path) -> Path | None:
    """The nearest existing ancestor of `path` (itself excluded) that is not a folder."""
    for parent in path.absolute().parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def check_output_file(path: str | os.PathLike[str], what: str = "output file") -> Path:
    """Refuse (ConfigError) a file path a command cannot write: an existing folder, a path
    below a regular file, or a folder that exists but cannot be written. Missing parent
    folders are fine (the command creates them). Nothing is created here."""
    p = Path(path)
    if str(path) == "":
        raise ConfigError(f"{what} is an empty path")
    if p.is_dir():
        raise ConfigError(f"{what} {str(p)!r} is a folder; give a file name")
    blocker = _first_file_ancestor(p)
    if blocker is not None:
        raise ConfigError(f"{what} {str(p)!r} lies below {str(blocker)!r}, which is a file")
    if p.exists() and not os.access(p, os.W_OK):
        raise ConfigError(f"{what} {str(p)!r} is not writable")
    return p


def check_output_dir(path: str | os.PathLike[str], what: str = "output folder") -> Path:
    """Refuse (ConfigError) a folder a command cannot write into: an existing regular
    file, a path below one, or an existing folder without write permission."""
    p = Path(path)
    if str(path) == "":
        raise ConfigError(f"{what} is an empty path")
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{what} {str(p)!r} is a file, not a folder")
    blocker = _first_file_ancestor(p)
    if blocker is not None:
        raise ConfigError(f"{what} {str(p)!r} lies below {str(blocker)!r}, which is a file")
    if p.is_dir() and not os.access(p, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {str(p)!r} is not writable")
    return p


def check_input_file(path: str | os.PathLike[str], what: str = "input file") -> Path:
    """Refuse (ConfigError) an input path that is missing, a folder or unreadable."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{what} {str(p)!r} does not exist")
    if p.is_dir():
        raise ConfigError(f"{what} {str(p)!r} is a folder, not a file")
    if not os.access(p, os.R_OK):
        raise ConfigError(f"{what} {str(p)!r} is not readable")
    return p


def run_id_arg(text: str) -> str:
    """An argparse type: a usable run id (see `reports.store.writer.check_run_id`)."""
    from kvbench.reports.store.writer import check_run_id

    try:
        return check_run_id(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def folder_arg(text: str) -> str:
    """An argparse type: a folder to read from, which may not exist yet, but must not be
    a regular file (or lie below one)."""
    try:
        check_output_dir(text, "folder")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("folder ")) from None
    return text
