"""One `--block-size` (issue 38 item 5): every subcommand that takes a block size adds it
through `argtypes.add_block_size_option`, so the type, range, default and help are the
same objects everywhere; the subcommands are enumerated from the parser, so a new one
that adds its own `--block-size` fails here. The bad values themselves are in the
hostile-input battery (`test_hostile_cli.test_every_block_size_option_refuses_the_same_values`).
"""

from __future__ import annotations

import argparse

import pytest

from kvbench.suites.cli import build_parser
from kvbench.suites.cli.argtypes import BLOCK_SIZE_HELP, block_size_arg
from kvbench.workloads.block_size import (
    DEFAULT_BLOCK_SIZE,
    MAX_BLOCK_SIZE,
    MIN_BLOCK_SIZE,
    check_block_size,
)
from kvbench.workloads.errors import ConfigError


def _block_size_actions() -> dict[str, argparse.Action]:
    """{subcommand: its --block-size action}, every subcommand of the parser that has one
    (nested subcommands included)."""
    found: dict[str, argparse.Action] = {}

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{prefix} {name}".strip())
            elif "--block-size" in action.option_strings:
                found[prefix] = action

    walk(build_parser(), "")
    return found


ACTIONS = _block_size_actions()


def test_the_subcommands_with_a_block_size() -> None:
    assert set(ACTIONS) >= {"capacity", "hitrate", "simulate", "utilization"}


@pytest.mark.parametrize("command", sorted(ACTIONS))
def test_every_block_size_option_is_the_shared_one(command: str) -> None:
    action = ACTIONS[command]
    assert action.type is block_size_arg
    assert action.default == DEFAULT_BLOCK_SIZE == 16
    assert action.help == BLOCK_SIZE_HELP
    assert action.option_strings == ["--block-size"] and action.dest == "block_size"


@pytest.mark.parametrize("value", [MIN_BLOCK_SIZE, 3, 10, DEFAULT_BLOCK_SIZE, MAX_BLOCK_SIZE])
def test_the_range_is_the_library_range(value: int) -> None:
    """The CLI takes exactly what `check_block_size` takes, and the library's caches the
    same (one range, stated once)."""
    assert block_size_arg(str(value)) == check_block_size(value) == value


@pytest.mark.parametrize("value", [0, -1, MAX_BLOCK_SIZE + 1, 10**9])
def test_out_of_range_is_refused_by_both(value: int) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=repr(str(value))):
        block_size_arg(str(value))
    with pytest.raises(ConfigError, match=f"block_size must be an integer in .*got {value}"):
        check_block_size(value)
