"""The contiguous decode baseline: the fastest SDPA call torch offers for a case.

Paged decode is judged against attention over the same K/V laid out contiguously. torch
has two ways to run a GQA decode step and neither wins everywhere: `enable_gqa=True` with
one query row per head, and the grouped-rows form in which a KV head's group of query
heads are the query rows of one call (each KV head read once). Both are timed briefly and
the faster one is the baseline; the rows name it (`contiguous_form_is_gqa`), so an
overhead is never taken against the slower call.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

#: Names of the two forms, in the order they are tried.
FORMS = ("grouped", "gqa")


def decode_forms(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
) -> dict[str, Callable[[], torch.Tensor]]:
    """The SDPA decode calls over contiguous K/V; each returns `[B, Hq, D]`.

    Args:
        query: [B, Hq, D]; keys, values: [B, Hkv, L, D] contiguous.
    """
    b, hq, d = query.shape
    hkv = keys.shape[1]
    grouped_q = query.reshape(b, hkv, hq // hkv, d)
    per_head_q = query.reshape(b, hq, 1, d)

    def grouped() -> torch.Tensor:
        return F.scaled_dot_product_attention(grouped_q, keys, values, scale=scale).view(b, hq, d)

    def gqa() -> torch.Tensor:
        return F.scaled_dot_product_attention(
            per_head_q, keys, values, scale=scale, enable_gqa=hq != hkv
        ).view(b, hq, d)

    return {"grouped": grouped, "gqa": gqa}


def fastest(
    forms: dict[str, Callable[[], torch.Tensor]],
    sync: Callable[[], None] = lambda: None,
    tries: int = 3,
) -> tuple[str, Callable[[], torch.Tensor]]:
    """(name, call) of the form with the lowest best-of-`tries` time (after one warm-up)."""
    best: tuple[float, str] | None = None
    for name, fn in forms.items():
        fn()
        sync()
        times = []
        for _ in range(tries):
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        if best is None or min(times) < best[0]:
            best = (min(times), name)
    assert best is not None
    return best[1], forms[best[1]]
