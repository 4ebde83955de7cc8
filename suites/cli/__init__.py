"""The `kvbench` command line.

The whole CLI is this package: `main` here, and one module per subcommand beside it
(`capacity`, `simulate`, `bench`, ...), each defining `register(subparsers)` that adds its
parser and sets `func` to a callable taking the parsed arguments and returning an exit
code. Modules without `register` are helpers (`argtypes`: the ranged option types).

Exit status and messages: bad arguments, kvbench errors (`KVBenchError`), files that
cannot be read or written (`OSError`), undecodable input and a run that would not fit in
memory all exit 2 with exactly one line on stderr, `kvbench COMMAND: error: ...`, and no
traceback. Any other exception is a bug in kvbench: one line saying so and exit 70 (with
`-v` the traceback follows, for a bug report).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
import traceback
from collections.abc import Sequence

from kvbench.workloads.errors import KVBenchError

USAGE_ERROR = 2
INTERNAL_ERROR = 70  # sysexits EX_SOFTWARE: distinct from a command's own 1


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        text = " ".join(str(message).split())
        sys.stderr.write(f"kvbench {self.prog.split()[-1]}: error: {text}\n")
        raise SystemExit(USAGE_ERROR)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every discovered subcommand registered."""
    parser = _Parser(
        prog="kvbench",
        description="Conformance and benchmark harness for paged KV caches.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"kvbench.suites.cli.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `kvbench` console script; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a bad argument (one line already written) or --help
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except KVBenchError as exc:
        return _one_line(args.command, str(exc))
    except OSError as exc:
        return _one_line(args.command, _os_error_text(exc))
    except UnicodeError as exc:
        return _one_line(args.command, f"input is not UTF-8 text ({exc})")
    except MemoryError:
        return _one_line(args.command, "out of memory: the run needs more memory than is free")
    except KeyboardInterrupt:
        sys.stderr.write(f"kvbench {args.command}: interrupted\n")
        return 130
    except Exception as exc:  # a bug: one line, the traceback only with -v
        if args.verbose:
            traceback.print_exc()
        text = " ".join(f"{type(exc).__name__}: {exc}".split())
        sys.stderr.write(
            f"kvbench {args.command}: internal error (a bug in kvbench, please report it; "
            f"-v shows the traceback): {text}\n"
        )
        return INTERNAL_ERROR


def _one_line(command: str, message: str) -> int:
    """Write `kvbench COMMAND: error: MESSAGE` as one line; return the usage-error status."""
    text = " ".join(message.split()) or "failed"
    sys.stderr.write(f"kvbench {command}: error: {text}\n")
    return USAGE_ERROR


def _os_error_text(exc: OSError) -> str:
    """'cannot use PATH: REASON' for an OSError (its file name when it has one)."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    name = exc.filename if exc.filename is not None else None
    return f"cannot use {str(name)!r}: {reason}" if name is not None else reason


if __name__ == "__main__":
    raise SystemExit(main())
