"""The `kvbench` command line.

Subcommands live one per module in `suites/commands/`; each module defines
`register(subparsers)` that adds its parser and sets `func` to a callable taking the parsed
arguments and returning an exit code. Bad arguments and kvbench errors exit 2 with a
one-line message and no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
from collections.abc import Sequence

from kvbench.workloads.errors import KVBenchError

USAGE_ERROR = 2


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"kvbench {self.prog.split()[-1]}: error: {message}\n")
        raise SystemExit(USAGE_ERROR)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every discovered subcommand registered."""
    import kvbench.suites.commands as commands_pkg

    parser = _Parser(
        prog="kvbench",
        description="Conformance and benchmark harness for paged KV caches.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for info in sorted(pkgutil.iter_modules(commands_pkg.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"kvbench.suites.commands.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `kvbench` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except KVBenchError as exc:
        sys.stderr.write(f"kvbench {args.command}: error: {exc}\n")
        return USAGE_ERROR
    except KeyboardInterrupt:
        sys.stderr.write(f"kvbench {args.command}: interrupted\n")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
