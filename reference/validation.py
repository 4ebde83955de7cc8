"""Input checks every KV cache implementation shares, so that both caches reject the
same bad input with the same message."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import cast

import torch

from kvbench.workloads.errors import CapacityError, ConfigError, ShapeError
from kvbench.workloads.geometry import KVGeometry
from kvbench.workloads.prompt_ids import KnownIds


def validate_kv_append(
    geometry: KVGeometry, dtype: torch.dtype, keys: torch.Tensor, values: torch.Tensor
) -> int:
    """Check K and V of new tokens are [num_layers, n >= 1, num_kv_heads, head_dim] tensors
    of the cache's dtype with equal shapes; return n. Raises ShapeError naming the problem."""
    for name, t in (("keys", keys), ("values", values)):
        if not isinstance(t, torch.Tensor):
            raise ShapeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        expected_tail = (geometry.num_kv_heads, geometry.head_dim)
        if t.dim() != 4 or t.shape[0] != geometry.num_layers or tuple(t.shape[2:]) != expected_tail:
            raise ShapeError(
                f"{name} must be [num_layers={geometry.num_layers}, n, num_kv_heads="
                f"{geometry.num_kv_heads}, head_dim={geometry.head_dim}], got {tuple(t.shape)}"
            )
        if t.dtype != dtype:
            raise ShapeError(f"{name} dtype {t.dtype} does not match the cache's {dtype}")
    if keys.shape != values.shape:
        raise ShapeError(f"keys {tuple(keys.shape)} and values {tuple(values.shape)} differ")
    if keys.shape[1] == 0:
        raise ShapeError("cannot append 0 tokens")
    return int(keys.shape[1])


#: Token id types checked at C speed; anything else goes through numbers.Integral.
_PLAIN_TOKEN_TYPES = frozenset({int, type(None)})
#: The token id types stored as given (anything else is checked and converted one by one).
PLAIN_TOKEN_TYPES = _PLAIN_TOKEN_TYPES


def _find_bad_token(token_ids: Sequence[int | None], allow_none: bool) -> None:
    """Raise ConfigError naming the first id that is not a non-negative integer."""
    for t in token_ids:
        if t is None and allow_none:
            continue
        if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0:
            what = "a non-negative integer or None" if allow_none else "a non-negative integer"
            raise ConfigError(f"token id {t!r} is not {what}")


def validate_prompt(
    prompt: Sequence[int], max_seq_len: int, *, check_ids: bool = True
) -> Sequence[int]:
    """Check a prompt is a non-empty sequence of at most max_seq_len non-negative ints.

    Returns the ids as an immutable sequence of ints (a tuple, or the range or
    `workloads.prompt_ids.KnownIds` given, unchecked and uncopied); with
    `check_ids=False` (a memory-only cache that only needs the length) returns the prompt
    as given after the length checks. The common case, plain ints or a range, is checked
    at C speed: this runs once per admission in 100k-request replays.
    """
    try:
        n = len(prompt)
    except TypeError:
        raise ConfigError(f"prompt must be a sequence of token ids, got {prompt!r}") from None
    if n == 0:
        raise ConfigError("prompt is empty; a request needs at least one token")
    if n > max_seq_len:
        raise ConfigError(f"prompt of {n} tokens is longer than max_seq_len={max_seq_len}")
    if not check_ids:
        return prompt
    if isinstance(prompt, KnownIds):
        return prompt  # immutable, its ids valid by construction (workloads.prompt_ids)
    if isinstance(prompt, range):
        if prompt[0] >= 0 and prompt[-1] >= 0:
            return prompt  # immutable already
    elif set(map(type, prompt)) == {int} and min(prompt) >= 0:
        return tuple(prompt)
    _find_bad_token(prompt, allow_none=False)
    return tuple(int(t) for t in prompt)


def validate_token_ids(token_ids: Sequence[int | None]) -> None:
    """Check appended token ids are non-negative ints or None (an id not given)."""
    types = set(map(type, token_ids))
    if not types <= _PLAIN_TOKEN_TYPES:
        _find_bad_token(token_ids, allow_none=True)
    elif int in types:  # all ints (the common case) compare at C speed
        ids = cast("Sequence[int]", token_ids) if len(types) == 1 else None  # no None in it
        low = min(ids) if ids is not None else min(t for t in token_ids if t is not None)
        if low < 0:
            _find_bad_token(token_ids, allow_none=True)


#: Block ids and slot counts go to kernels as int32: the largest a cache may hold.
MAX_INDEX = 2**31 - 1


def validate_geometry(geometry: object) -> KVGeometry:
    """`geometry` if it is a KVGeometry; ConfigError naming it otherwise."""
    if not isinstance(geometry, KVGeometry):
        raise ConfigError(f"geometry must be a KVGeometry, got {geometry!r:.80}")
    return geometry


def validate_device(device: object) -> torch.device:
    """`device` as a torch.device with its index resolved; ConfigError naming it when
    torch does not know it.

    "cuda" becomes "cuda:N" (the current CUDA device) where CUDA is available: tensors
    allocated on "cuda" report "cuda:N", and torch.device("cuda") != torch.device("cuda:0"),
    so a cache that kept the bare name failed its own `check()` on every GPU (found by the
    first GPU run, 2026-11-28). Without CUDA the name is kept (allocation then fails with
    its own error)."""
    try:
        # torch itself decides what names a device (str, bytes, int, numpy ints, device);
        # its stubs accept fewer, so the call is checked at run time, here
        parsed: torch.device = torch.device(device)  # type: ignore[call-overload]
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ConfigError(f"unknown device {device!r:.80}: {exc}") from None
    if parsed.type == "cuda" and parsed.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return parsed


def allocate_zeros(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, what: str
) -> torch.Tensor:
    """torch.zeros(shape), or CapacityError naming `what` and its size when the memory
    cannot be had (nothing is kept of a failed allocation)."""
    try:
        return torch.zeros(shape, dtype=dtype, device=device)
    except (RuntimeError, MemoryError, OverflowError, TypeError) as exc:
        elements = 1
        for d in shape:
            elements *= d
        size = elements * torch.empty((), dtype=dtype).element_size()
        raise CapacityError(
            f"cannot allocate {what} of shape {list(shape)} ({size:,} bytes) on {device}: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None


def token_id_count(token_ids: object) -> int:
    """len(token_ids); ShapeError when token_ids is not a sequence."""
    try:
        return len(token_ids)  # type: ignore[arg-type]
    except TypeError:
        raise ShapeError(f"token_ids must be a sequence, got {token_ids!r:.80}") from None


def validate_attend_query(query: object, batch: int, geometry: KVGeometry, layer: object) -> None:
    """An `attend` call's query ([batch, num_q_heads, head_dim] tensor) and layer (an int
    in [0, num_layers)): ShapeError / ConfigError naming the bad value, the same from
    both caches."""
    g = geometry
    expected = (batch, g.num_q_heads, g.head_dim)
    if not isinstance(query, torch.Tensor) or query.dim() != 3:
        raise ShapeError(f"query must be a tensor {list(expected)}, got {query!r:.80}")
    if tuple(query.shape) != expected:
        raise ShapeError(f"query must be {list(expected)}, got {tuple(query.shape)}")
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < g.num_layers:
        raise ConfigError(f"layer {layer!r} outside [0, {g.num_layers})")
