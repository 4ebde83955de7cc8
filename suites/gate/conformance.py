"""The gate's conformance check: do the kernels still compute the right thing?

A run that fails it can be gated (its failures are `failed` rows) but never becomes a
baseline: `kvbench gate --update-baseline` refuses it. Concretely, on small fixed cases
(random inputs from a fixed seed, outputs poisoned with NaN first, shuffled physical
blocks, lengths of 1, a block multiple, one past, and a split over several partitions):

* paged decode and paged prefill, float32 and float16, with both backends (torch, and
  Triton -- under the interpreter on CPU, compiled on CUDA), are within the per-dtype
  tolerance of the float64 oracle (`reference.oracle`) by ||out - ref|| / ||ref||; their
  cases name the path that ran (`cpu-cpp`, `torch-sdpa` or `triton`);
* write_kv and copy_blocks (both backends) leave exactly the expected cache contents.

It takes a few seconds on CPU (the interpreter runs a few dozen programs). The full
property-based coverage lives in the conformance suite; this is the gate's fast guard.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from kvbench.reference import oracle
from kvbench.reports.kernel_labels import TORCH_SDPA, kernel_label
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE

log = logging.getLogger(__name__)

BLOCK = DEFAULT_BLOCK_SIZE
Q_HEADS, KV_HEADS, HEAD_DIM = 4, 2, 64


@dataclass(frozen=True)
class CheckResult:
    """One check: its case, the error measured, the tolerance, and the verdict."""

    case: dict[str, Any]
    error: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.error <= self.tolerance  # NaN (an unwritten element) fails


def _attention_path(backend: str, device: torch.device) -> str:
    """What runs for paged attention with `backend` here, as a label (`triton`, `cpu-cpp`
    or `torch-sdpa`; see `reports.kernel_labels`): the case records the path, not only the
    `backend=` argument that chose it."""
    if backend != "torch":
        return kernel_label(backend, None)
    if device.type != "cpu":
        return TORCH_SDPA
    from kvbench.kernels import cpu_paged

    cpp = cpu_paged.status().path == "cpp" and cpu_paged.MAX_BLOCK_SIZE >= BLOCK
    return kernel_label(backend, cpp)


def _pool(lens: list[int], dtype: torch.dtype, device: torch.device, gen: torch.Generator):
    per_seq = [-(-n // BLOCK) for n in lens]
    num_blocks = sum(per_seq) + 5
    shape = (num_blocks, BLOCK, KV_HEADS, HEAD_DIM)
    k = torch.randn(shape, generator=gen).to(device, dtype)
    v = torch.randn(shape, generator=gen).to(device, dtype)
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(per_seq)
    tables = torch.full((len(lens), width), -1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(per_seq):
        tables[b, :n] = torch.tensor(perm[used : used + n], dtype=torch.int32)
        used += n
    return k, v, tables.to(device)


def _seq_kv(cache: torch.Tensor, table: torch.Tensor, length: int) -> torch.Tensor:
    n = -(-length // BLOCK)
    return cache[table[:n].long()].reshape(n * BLOCK, KV_HEADS, HEAD_DIM)[:length]


def check_decode(backend: str, dtype: torch.dtype, device: torch.device, seed: int = 0):
    """Paged decode vs the oracle; yields one CheckResult per partitioning."""
    from kvbench.kernels import ops

    gen = torch.Generator().manual_seed(seed)
    lens = [1, BLOCK * 3, BLOCK * 3 + 1, 150]
    k, v, tables = _pool(lens, dtype, device, gen)
    q = torch.randn(len(lens), Q_HEADS, HEAD_DIM, generator=gen).to(device, dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    ref = oracle.batched_decode_attention(
        q.cpu(),
        [_seq_kv(k, tables[b], n).cpu() for b, n in enumerate(lens)],
        [_seq_kv(v, tables[b], n).cpu() for b, n in enumerate(lens)],
    )
    for partition in (None, 64) if backend == "triton" else (None,):
        out = torch.full_like(q, float("nan"))
        ops.paged_decode_attention(
            q, k, v, tables, seq_lens, out=out, backend=backend, partition_size=partition
        )
        case = {
            "check": "paged_decode",
            "backend": _attention_path(backend, device),
            "dtype": str(dtype).split(".")[-1],
            "partition": partition or 0,
        }
        yield CheckResult(case, oracle.relative_error(out.cpu(), ref), oracle.tolerance(dtype))


def check_prefill(backend: str, dtype: torch.dtype, device: torch.device, seed: int = 1):
    """Paged prefill/extend vs the oracle's causal extend attention."""
    from kvbench.kernels import ops

    gen = torch.Generator().manual_seed(seed)
    lens, new = [40, 20, 33], [8, 20, 1]
    k, v, tables = _pool(lens, dtype, device, gen)
    total = sum(new)
    q = torch.randn(total, Q_HEADS, HEAD_DIM, generator=gen).to(device, dtype)
    cu = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32, device=device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    out = torch.full_like(q, float("nan"))
    ops.paged_prefill_attention(q, k, v, tables, cu, seq_lens, out=out, backend=backend)
    refs, start = [], 0
    for b, (n_kv, n_q) in enumerate(zip(lens, new, strict=True)):
        refs.append(
            oracle.extend_attention(
                q[start : start + n_q].cpu(),
                _seq_kv(k, tables[b], n_kv).cpu(),
                _seq_kv(v, tables[b], n_kv).cpu(),
            )
        )
        start += n_q
    case = {
        "check": "paged_prefill",
        "backend": _attention_path(backend, device),
        "dtype": str(dtype).split(".")[-1],
    }
    yield CheckResult(
        case, oracle.relative_error(out.cpu(), torch.cat(refs)), oracle.tolerance(dtype)
    )


def check_cache_writes(backend: str, device: torch.device, seed: int = 2):
    """write_kv and copy_blocks must leave exactly the expected contents (error 0)."""
    from kvbench.kernels import ops

    gen = torch.Generator().manual_seed(seed)
    shape = (6, BLOCK, KV_HEADS, HEAD_DIM)
    k = torch.randn(shape, generator=gen).to(device)
    v = torch.randn(shape, generator=gen).to(device)
    want_k, want_v = k.clone(), v.clone()
    slots = torch.tensor([5, 17, -1, 40, 95], dtype=torch.int64)
    key = torch.randn(len(slots), KV_HEADS, HEAD_DIM, generator=gen).to(device)
    value = torch.randn(len(slots), KV_HEADS, HEAD_DIM, generator=gen).to(device)
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            want_k.view(-1, KV_HEADS, HEAD_DIM)[s] = key[i]
            want_v.view(-1, KV_HEADS, HEAD_DIM)[s] = value[i]
    ops.write_kv(k, v, key, value, slots.to(device), backend=backend)
    err = float((k - want_k).abs().max() + (v - want_v).abs().max())
    yield CheckResult({"check": "write_kv", "backend": backend, "dtype": "float32"}, err, 0.0)
    pairs = [(0, 4), (2, 5)]
    for src, dst in pairs:
        want_k[dst], want_v[dst] = want_k[src], want_v[src]
    ops.copy_blocks(k, v, pairs, backend=backend)
    err = float((k - want_k).abs().max() + (v - want_v).abs().max())
    yield CheckResult({"check": "copy_blocks", "backend": backend, "dtype": "float32"}, err, 0.0)


def run_checks(device: torch.device | None = None) -> list[CheckResult]:
    """Every check, both backends; an exception inside a check is a failed check whose
    error is infinite (logged), so a crashing kernel cannot become a baseline."""
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    results: list[CheckResult] = []
    jobs: list[tuple[dict[str, str], Callable[[], Iterable[CheckResult]]]] = []
    for backend in ("torch", "triton"):
        for dtype in (torch.float32, torch.float16):
            jobs.append(
                (
                    {"check": "paged_decode", "backend": backend},
                    partial(check_decode, backend, dtype, device),
                )
            )
            jobs.append(
                (
                    {"check": "paged_prefill", "backend": backend},
                    partial(check_prefill, backend, dtype, device),
                )
            )
        jobs.append(
            (
                {"check": "cache_writes", "backend": backend},
                partial(check_cache_writes, backend, device),
            )
        )
    for case, job in jobs:
        try:
            results.extend(job())
        except Exception as exc:  # a crash is a failure to conform, recorded as such
            log.error("conformance check %s raised %s: %s", case, type(exc).__name__, exc)
            results.append(CheckResult({**case, "error": type(exc).__name__}, float("inf"), 0.0))
    return results
