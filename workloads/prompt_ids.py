"""Prompts whose token ids are described compactly instead of listed.

A replayed production trace can hold hundreds of millions of prompt tokens (Mooncake's
conversation trace: 145M); listing them costs gigabytes and their validation costs
minutes. `KnownIds` marks an immutable `Sequence[int]` whose ids are valid (ints >= 0)
by construction and whose largest id it knows (`max_id`): the caches take it without
checking or copying it (`reference.validation.validate_prompt`), the engine asks it for
its largest id (`max_token_id`). `workloads.trace.BlockTokenIds` is one: a prompt given
by the ids of its fixed-size blocks (an imported production trace's hash blocks).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence


class KnownIds(Sequence[int]):
    """An immutable sequence of token ids known to be ints >= 0 (module docstring)."""

    __slots__ = ()

    @abstractmethod
    def max_id(self) -> int:
        """The largest id."""


def max_token_id(prompt: Sequence[int]) -> int:
    """The largest id of a non-empty prompt (without iterating a `KnownIds`)."""
    if isinstance(prompt, KnownIds):
        return prompt.max_id()
    if isinstance(prompt, range):
        return max(prompt[0], prompt[-1])
    return max(prompt)
