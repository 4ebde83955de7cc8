"""What paging itself costs: the same paged kernel over two layouts of the same K/V.

The literature's paging overhead ([PA-deep-dive]'s measured-overhead table, the vLLM paper's
20-26%) compares a kernel that follows a block table through a pool whose blocks are
scattered with one that reads each sequence from one contiguous buffer. Timing the paged
kernel against torch's SDPA instead mixes in everything else two different kernels do
differently (on a CPU, SDPA's fp16 path alone takes several times its bf16 time). So the
kernel sweeps time the *same* kernel twice, paired repeat by repeat:

    scattered   the bench's pool: each sequence's blocks at seeded random places;
    contiguous  one contiguous buffer per sequence, addressed through a sequential block
                table (sequence i owns physical blocks i*nb .. i*nb + nb - 1, in order),
                so the kernel's reads are the ones a contiguous kernel makes.

paging_overhead = scattered / contiguous - 1, the median of per-repeat ratios; its q1-q3
are the per-repeat ratios' quartiles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.harness import summarize
from kvbench.suites.bench.registry import Measurement
from kvbench.workloads.errors import KVBenchError


def contiguous_layout(
    k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pool rewritten so every sequence's blocks are consecutive and in order.

    Args:
        k_cache, v_cache: pools [num_blocks, block_size, H, D].
        tables: int32 [B, nb], every entry a distinct block of the pool.

    Returns (k, v, sequential_tables): pools [B * nb, block_size, H, D] holding sequence
    i's block j at physical block i * nb + j, and tables arange(B * nb).view(B, nb).
    The token at (sequence, position) holds the same K/V in both layouts.
    """
    b, nb = tables.shape
    flat = tables.reshape(-1).long()
    if flat.unique().numel() != flat.numel():
        raise KVBenchError("block tables share a block: no contiguous layout of the same K/V")
    seq_tables = torch.arange(b * nb, dtype=torch.int32, device=tables.device).view(b, nb)
    return k_cache[flat].contiguous(), v_cache[flat].contiguous(), seq_tables


class LayoutsDisagreeError(KVBenchError):
    """The same kernel gave different outputs on the two layouts of the same K/V."""


def layout_agreement(scattered: torch.Tensor, contiguous: torch.Tensor, limit: float) -> float:
    """Relative difference of the kernel's outputs on the two layouts; raises
    LayoutsDisagreeError when above `limit` or not finite (then nothing is timed)."""
    a, b = scattered.to(torch.float64), contiguous.to(torch.float64)
    diff = float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))
    if not diff <= limit:
        raise LayoutsDisagreeError(
            f"the paged kernel's output on the contiguous layout differs from the scattered "
            f"one by {diff:.3g} (relative) > {limit:.3g}; not timed"
        )
    return diff


@dataclass(frozen=True)
class PagingTimes:
    """Paired times of the paged kernel on the scattered and the contiguous layout.

    Attributes:
        scattered, contiguous: per-call time statistics (s) of each layout.
        overhead: statistics of the per-repeat ratios scattered / contiguous - 1.
    """

    scattered: dict[str, float | int]
    contiguous: dict[str, float | int]
    overhead: dict[str, float | int]

    def rows(self, diff: float) -> list[Measurement]:
        """The sweep rows: the contiguous-layout time, the overhead and the agreement."""
        return [
            Measurement(
                "time_paged_contiguous_layout",
                float(self.contiguous["median"]),
                "s",
                self.contiguous,
            ),
            Measurement(
                "paging_overhead", float(self.overhead["median"]), "fraction", self.overhead
            ),
            Measurement("rel_diff_layouts", diff, "fraction"),
        ]


def paging_from_samples(scattered: list[float], contiguous: list[float]) -> PagingTimes:
    """PagingTimes from per-repeat samples taken side by side (sample i of each list in
    the same repeat)."""
    ratios = [a / c - 1 for a, c in zip(scattered, contiguous, strict=True)]
    return PagingTimes(summarize(scattered), summarize(contiguous), summarize(ratios))


def paired_gpu_times(
    ctx: BenchContext, scattered: Callable[[], object], contiguous: Callable[[], object]
) -> PagingTimes:
    """On a GPU: every repeat times each call with the context's timer (do_bench) and
    keeps its median, alternating who goes first, so sample i of both was taken side by
    side. (On a CPU the kernel sweeps add the contiguous layout to their own paired
    timer instead.)"""
    fns = {"scattered": scattered, "contiguous": contiguous}
    samples: dict[str, list[float]] = {"scattered": [], "contiguous": []}
    for r in range(ctx.timing.repeats):
        for name in ("scattered", "contiguous") if r % 2 == 0 else ("contiguous", "scattered"):
            samples[name].append(float(ctx.time(fns[name])["median"]))
    return paging_from_samples(samples["scattered"], samples["contiguous"])
