"""The tiny HF Llama generating through an fp8 KV cache, against HF's own forward.

One case = a KV dtype (`fp8_e4m3`, `fp8_e5m2`, or `float32` as the control), a scale
granularity ("tensor" / "head", dynamic scales: the first write of each layer sets them,
`workloads.fp8`) and a cache kind. Each request is run twice through
`LlamaCacheRunner` with write attention "oracle" (float64 over the dequantized cached
prefix plus the new tokens as computed) and the read pass through `cache.attend` (the fp8
decode kernel dequantizing in registers):

* teacher-forced: the request emits HF's greedy tokens whatever its own logits say, so
  every position has the same context as HF's and its logits compare directly:
  `logit_error` = ||logits - hf|| / ||hf|| per generated position, and `agreement` =
  the fraction of positions whose argmax is HF's token;
* free-running: greedy on its own logits; `tokens_matched` = generated tokens equal to
  HF's before the first difference (the number a user sees).

HF's reference is `generate(do_sample=False)` in float32 with its own cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvbench.paged import PagedKVCache
from kvbench.reference.contiguous import ContiguousKVCache
from kvbench.reference.contract import KVCache
from kvbench.reference.oracle import relative_error
from kvbench.suites.e2e.llama_runner import GenerationRequest, LlamaCacheRunner
from kvbench.suites.e2e.tiny_llama import GreedyResult, hf_greedy, kv_geometry
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE
from kvbench.workloads.errors import ConfigError

#: KV dtypes a case may store (float32 is the control: the model's own dtype).
KV_DTYPES = ("float32", "fp8_e4m3", "fp8_e5m2")
CACHE_KINDS = ("paged", "contiguous")


@dataclass(frozen=True)
class RequestAccuracy:
    """One request's accuracy against HF (module docstring).

    Attributes:
        logit_errors: relative logit error per generated position (teacher-forced).
        agreement: fraction of positions whose argmax is HF's token (teacher-forced).
        tokens_matched: free-running tokens equal to HF's before the first difference.
        new_tokens: tokens generated.
    """

    request_id: str
    logit_errors: tuple[float, ...]
    agreement: float
    tokens_matched: int
    new_tokens: int


def make_cache(
    model: object,
    kv_dtype: str,
    kind: str,
    *,
    granularity: str = "tensor",
    block_size: int = DEFAULT_BLOCK_SIZE,
    capacity_tokens: int = 2048,
    max_seq_len: int = 256,
) -> KVCache:
    """A cache of `kind` for `model` storing `kv_dtype` (fp8: dynamic scales at
    `granularity`), holding about `capacity_tokens` tokens."""
    if kv_dtype not in KV_DTYPES:
        raise ConfigError(f"kv_dtype {kv_dtype!r} is not one of {KV_DTYPES}")
    if kind not in CACHE_KINDS:
        raise ConfigError(f"cache kind {kind!r} is not one of {CACHE_KINDS}")
    geometry = kv_geometry(model).with_dtype(kv_dtype)
    fp8 = {"scale_granularity": granularity} if kv_dtype.startswith("fp8") else {}
    if kind == "contiguous":
        return ContiguousKVCache(geometry, capacity_tokens, max_seq_len, **fp8)  # type: ignore[arg-type]
    return PagedKVCache(
        geometry,
        -(-capacity_tokens // block_size),
        block_size,
        max_seq_len=max_seq_len,
        kernel_backend="torch",
        **fp8,  # type: ignore[arg-type]
    )


def measure(
    model: object,
    prompts: Sequence[tuple[int, ...]],
    new_tokens: int,
    kv_dtype: str,
    kind: str = "paged",
    *,
    granularity: str = "tensor",
    block_size: int = DEFAULT_BLOCK_SIZE,
    hf: dict[tuple[int, ...], GreedyResult] | None = None,
) -> list[RequestAccuracy]:
    """Every prompt's accuracy against HF for one case (module docstring). `hf` memoizes
    HF's greedy results by prompt across cases (filled when given)."""
    memo = {} if hf is None else hf
    for p in prompts:
        if p not in memo or len(memo[p].tokens) < new_tokens:
            memo[p] = hf_greedy(model, p, new_tokens)
    ids = [f"r{i}" for i in range(len(prompts))]

    def run(forced: bool) -> dict:
        cache = make_cache(model, kv_dtype, kind, granularity=granularity, block_size=block_size)
        reqs = [
            GenerationRequest(
                rid, p, new_tokens, forced_tokens=memo[p].tokens[:new_tokens] if forced else None
            )
            for rid, p in zip(ids, prompts, strict=True)
        ]
        return LlamaCacheRunner(model, cache, "oracle", block_size=block_size).run(reqs)

    forced, free = run(True), run(False)
    out = []
    for rid, p in zip(ids, prompts, strict=True):
        want = memo[p]
        logits = forced[rid].logits
        errors = tuple(relative_error(logits[i], want.logits[i]) for i in range(new_tokens))
        top = logits.argmax(dim=-1).tolist()
        agree = sum(int(a == b) for a, b in zip(top, want.tokens, strict=False)) / new_tokens
        matched = 0
        for a, b in zip(free[rid].tokens, want.tokens, strict=False):
            if a != b:
                break
            matched += 1
        out.append(RequestAccuracy(rid, errors, agree, matched, new_tokens))
    return out


def prompts_for(seed: int, lengths: Sequence[int], vocab: int) -> list[tuple[int, ...]]:
    """Random prompts of the given lengths (fixed seed)."""
    gen = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(0, vocab, (n,), generator=gen).tolist()) for n in lengths]
