"""The block size: tokens per KV block, its one default and its one allowed range.

Every default block size in kvbench (the caches, the capacity planner, the time model,
the serving helpers, the sweeps' headline rows and the CLI's `--block-size`) refers to
`DEFAULT_BLOCK_SIZE`, and every block size a caller gives goes through
`check_block_size`, so the range is stated once here. The CLI's `--block-size`
(`kvbench.suites.cli.argtypes.add_block_size_option`) parses its text and then asks the
same function.

Why 16: vLLM's default block size and the PagedAttention paper's (the seeds' tables:
8,400 blocks of 16 tokens in a 42 GB pool). Why [1, 65,536]: every block size a cache,
the kernels (the C++ kernel runs blocks up to `kernels.cpu_paged.MAX_BLOCK_SIZE` and
hands longer ones to the torch path) and the capacity math handle, with no power-of-two
rule (kvbench's own tests use blocks of 3 and 10). The upper bound is the one three of
the four former `--block-size` options had (`utilization` allowed 2^20); a block of more
tokens is more likely a typo than a choice, and the caches used to accept up to 2^31 - 1.
"""

from __future__ import annotations

import numbers

from kvbench.workloads.errors import ConfigError

#: Tokens per block wherever none is given (vLLM's default, the seeds' tables).
DEFAULT_BLOCK_SIZE = 16
#: The allowed block sizes, inclusive (module docstring: why).
MIN_BLOCK_SIZE = 1
MAX_BLOCK_SIZE = 1 << 16
#: The allowed range in words, for error messages and help texts.
BLOCK_SIZE_RANGE = f"an integer in [{MIN_BLOCK_SIZE:,}, {MAX_BLOCK_SIZE:,}]"


def check_block_size(value: object, name: str = "block_size") -> int:
    """`value` as an int if it is a whole number in [MIN_BLOCK_SIZE, MAX_BLOCK_SIZE],
    else ConfigError naming `name` and the value. The one block-size check of kvbench
    (a bool or a float such as 16.0 is not a block size)."""
    whole = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    n = int(value) if whole else 0  # type: ignore[call-overload]
    if not MIN_BLOCK_SIZE <= n <= MAX_BLOCK_SIZE:
        raise ConfigError(f"{name} must be {BLOCK_SIZE_RANGE} (tokens per block), got {value!r}")
    return n
