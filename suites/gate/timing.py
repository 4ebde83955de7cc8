"""Same-run timing ratios for the gate: each kernel against a fixed in-run reference.

A ratio case builds two callables on the same data: a *candidate* (this tree's op) and
a *reference*, either

* the baseline's own version of the op, frozen into the baseline file as source text and
  run side by side (`*_vs_baseline`): both sides are called the same way (this tree's
  `kernels.torch_ops` against the frozen one, same arguments, no dispatch on either
  side), so the ratio is 1.0 when nothing changed on any machine, and other processes'
  load cancels almost exactly. (An earlier version sent the candidate through
  `kernels.ops` and so also timed its argument checks: a fixed Python cost whose share
  of a call depends on the machine, 1.10 on one 2-core machine and 1.23 on another with
  identical code, which failed a gate); or
* plain SDPA over the same KV laid out contiguously (`*_vs_sdpa`, through `kernels.ops`:
  torch on CPU, compiled Triton on CUDA): the paged overhead. It cancels the machine's
  speed but not its kind (the gather is memory-bound, SDPA is not): prefill against SDPA
  moved by 11% between two machines of the same type and decode against SDPA by up to
  20% between runs on one, so only prefill is gated that way, and with a wider minimum
  effect (`Thresholds.cross_min_effect`).

Each repeat times both, alternating which goes first, and records candidate time /
reference time, so a baseline recorded on one day can be compared with a run on another.

Timing on CPU is this thread's CPU time (`time.thread_time`): torch runs single-threaded
while measuring, so that is all the work, and time lost to other processes is not counted
(on a shared 2-core machine wall-clock ratios swing 2-3x). On GPUs it is wall-clock
(`time.perf_counter` with a synchronize after each sample). Each sample is
`inner` back-to-back calls, `inner` calibrated once per callable so that a sample lasts at
least `min_sample_s`.

`slowdown` injects a synthetic regression into the candidate (for testing the gate and
measuring what it detects): each candidate sample busy-waits until it has lasted
`(1 + slowdown)` times what the calls took, so its ratio grows by that factor with the
candidate's own noise.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

from kvbench.suites.gate import GateInputError
from kvbench.workloads.errors import ConfigError

log = logging.getLogger(__name__)

Fn = Callable[[], object]


@dataclass(frozen=True)
class RatioCase:
    """One same-run ratio: `name`, its parameters, and a builder of (candidate, reference)
    callables on `device` (built once per measurement, from a seeded generator)."""

    name: str
    params: dict[str, Any]
    build: Callable[[torch.device, ModuleType | None], tuple[Fn, Fn]] = field(compare=False)


@dataclass(frozen=True)
class RatioSample:
    """One repeat: per-call seconds of both sides and their ratio."""

    repeat: int
    candidate_s: float
    reference_s: float

    @property
    def ratio(self) -> float:
        return self.candidate_s / self.reference_s


# Geometry of the gate's cases: small enough for a ~1 minute CPU budget, large enough
# that a call lasts milliseconds (GQA group 4, head dim 128, block 16, float32).
BATCH, Q_HEADS, KV_HEADS, HEAD_DIM, BLOCK = 4, 8, 2, 128, 16


def _paged_layout(
    batch: int, length: int, device: torch.device, dtype: torch.dtype, seed: int
) -> dict[str, torch.Tensor]:
    """Random KV in a pool with shuffled blocks, plus the same KV contiguous per head."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = -(-length // BLOCK)
    num_blocks = batch * per_seq + 7
    k = torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=gen).to(device, dtype)
    v = torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=gen).to(device, dtype)
    perm = torch.randperm(num_blocks, generator=gen)[: batch * per_seq]
    tables = perm.view(batch, per_seq).to(device=device, dtype=torch.int32)
    idx = tables.long()
    # [B, Hkv, L, D]: what a contiguous cache would hold
    k_contig = k[idx].reshape(batch, per_seq * BLOCK, KV_HEADS, HEAD_DIM)[:, :length]
    v_contig = v[idx].reshape(batch, per_seq * BLOCK, KV_HEADS, HEAD_DIM)[:, :length]
    return {
        "k": k,
        "v": v,
        "tables": tables,
        "k_contig": k_contig.transpose(1, 2).contiguous(),
        "v_contig": v_contig.transpose(1, 2).contiguous(),
    }


def _backend(device: torch.device) -> str | None:
    # torch on CPU whatever TRITON_INTERPRET says (the interpreter is no timing target);
    # the dispatch's choice (compiled Triton) on CUDA
    return "torch" if device.type == "cpu" else None


def load_frozen(source: str, label: str = "baseline torch_ops") -> ModuleType:
    """A module made from the source text a baseline froze (its `kernels/torch_ops.py`).

    Raises GateInputError when the frozen code no longer runs against this tree's imports.
    """
    digest = hashlib.sha256(source.encode("utf-8")).hexdigest()[:12]
    module = ModuleType(f"kvbench_gate_frozen_{digest}")
    try:
        exec(compile(source, f"<{label} {digest}>", "exec"), module.__dict__)
    except Exception as exc:
        raise GateInputError(
            f"the {label} frozen in the baseline ({digest}) does not load against this tree "
            f"({type(exc).__name__}: {exc}); update the baseline"
        ) from exc
    return module


def frozen_source() -> str:
    """The source text of this tree's torch kernel versions (`kernels/torch_ops.py`)."""
    from kvbench.kernels import torch_ops

    return Path(torch_ops.__file__).read_text(encoding="utf-8")


def _decode_inputs(context: int, device: torch.device, seed: int) -> dict[str, Any]:
    lay = _paged_layout(BATCH, context, device, torch.float32, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    lay["q"] = torch.randn(BATCH, Q_HEADS, HEAD_DIM, generator=gen).to(device)
    lay["seq_lens"] = torch.full((BATCH,), context, dtype=torch.int32, device=device)
    return lay


def _prefill_inputs(prefix: int, new: int, device: torch.device, seed: int) -> dict[str, Any]:
    length = prefix + new
    lay = _paged_layout(BATCH, length, device, torch.float32, seed)
    gen = torch.Generator().manual_seed(seed + 2)
    lay["q"] = torch.randn(BATCH * new, Q_HEADS, HEAD_DIM, generator=gen).to(device)
    lay["cu"] = torch.arange(0, BATCH + 1, device=device, dtype=torch.int32) * new
    lay["seq_lens"] = torch.full((BATCH,), length, dtype=torch.int32, device=device)
    return lay


def _params(op: str, **extra: Any) -> dict[str, Any]:
    return {
        "op": op,
        "batch": BATCH,
        **extra,
        "block_size": BLOCK,
        "q_heads": Q_HEADS,
        "kv_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "dtype": "float32",
    }


def decode_vs_sdpa(context: int, seed: int = 0) -> RatioCase:
    """Paged decode (`kernels.ops`) over SDPA on the same KV laid out contiguously."""

    def build(device: torch.device, frozen: ModuleType | None) -> tuple[Fn, Fn]:
        from kvbench.kernels import ops

        x = _decode_inputs(context, device, seed)
        out = torch.empty_like(x["q"])
        q_grouped = x["q"].view(BATCH, KV_HEADS, Q_HEADS // KV_HEADS, HEAD_DIM)
        backend = _backend(device)

        def candidate() -> object:
            return ops.paged_decode_attention(
                x["q"],
                x["k"],
                x["v"],
                x["tables"],
                x["seq_lens"],
                out=out,
                backend=backend,
                check_indices=False,
                max_seq_len=context,
            )

        def reference() -> object:
            return F.scaled_dot_product_attention(q_grouped, x["k_contig"], x["v_contig"])

        return candidate, reference

    return RatioCase("paged_decode_vs_sdpa", _params("decode", context=context), build)


def prefill_vs_sdpa(prefix: int, new: int, seed: int = 0) -> RatioCase:
    """Paged prefill/extend (`kernels.ops`) over causal SDPA on the same contiguous KV."""

    def build(device: torch.device, frozen: ModuleType | None) -> tuple[Fn, Fn]:
        from kvbench.kernels import ops

        x = _prefill_inputs(prefix, new, device, seed)
        out = torch.empty_like(x["q"])
        q_ref = x["q"].view(BATCH, new, Q_HEADS, HEAD_DIM).transpose(1, 2)  # [B, Hq, n, D]
        qpos = torch.arange(prefix, prefix + new, device=device).unsqueeze(1)
        mask = torch.arange(prefix + new, device=device).unsqueeze(0) <= qpos
        backend = _backend(device)

        def candidate() -> object:
            return ops.paged_prefill_attention(
                x["q"],
                x["k"],
                x["v"],
                x["tables"],
                x["cu"],
                x["seq_lens"],
                out=out,
                backend=backend,
                check_indices=False,
                max_seq_len=prefix + new,
                max_q_len=new,
            )

        def reference() -> object:
            return F.scaled_dot_product_attention(
                q_ref, x["k_contig"], x["v_contig"], attn_mask=mask, enable_gqa=True
            )

        return candidate, reference

    return RatioCase("paged_prefill_vs_sdpa", _params("prefill", prefix=prefix, new=new), build)


def _need_frozen(frozen: ModuleType | None, name: str) -> ModuleType:
    if frozen is None:
        raise GateInputError(f"timing case {name} needs the baseline's frozen torch_ops")
    return frozen


def decode_vs_baseline(context: int, seed: int = 0) -> RatioCase:
    """Paged decode of this tree's `kernels.torch_ops` over the baseline's frozen copy of
    it, called identically on the same inputs: 1.0 when nothing changed, on any machine,
    and immune to what other processes do to it, since both sides are the same work."""

    def build(device: torch.device, frozen: ModuleType | None) -> tuple[Fn, Fn]:
        from kvbench.kernels import torch_ops as current
        from kvbench.kernels import validation as val

        old = _need_frozen(frozen, "paged_decode_vs_baseline")
        x = _decode_inputs(context, device, seed)
        out, out_old = torch.empty_like(x["q"]), torch.empty_like(x["q"])
        args = (x["q"], x["k"], x["v"], x["tables"], x["seq_lens"])
        dims = val.check_decode(*args, out_old, False, context)
        scale = HEAD_DIM**-0.5

        def candidate() -> object:
            return current.paged_decode_attention(*args, scale, out, dims)

        def reference() -> object:
            return old.paged_decode_attention(*args, scale, out_old, dims)

        return candidate, reference

    return RatioCase("paged_decode_vs_baseline", _params("decode", context=context), build)


def prefill_vs_baseline(prefix: int, new: int, seed: int = 0) -> RatioCase:
    """Paged prefill of this tree's `kernels.torch_ops` over the baseline's frozen copy."""

    def build(device: torch.device, frozen: ModuleType | None) -> tuple[Fn, Fn]:
        from kvbench.kernels import torch_ops as current
        from kvbench.kernels import validation as val

        old = _need_frozen(frozen, "paged_prefill_vs_baseline")
        x = _prefill_inputs(prefix, new, device, seed)
        out, out_old = torch.empty_like(x["q"]), torch.empty_like(x["q"])
        args = (x["q"], x["k"], x["v"], x["tables"], x["cu"], x["seq_lens"])
        dims = val.check_prefill(*args, out_old, False, prefix + new, new)
        scale = HEAD_DIM**-0.5

        def candidate() -> object:
            return current.paged_prefill_attention(*args, scale, out, dims)

        def reference() -> object:
            return old.paged_prefill_attention(*args, scale, out_old, dims)

        return candidate, reference

    params = _params("prefill", prefix=prefix, new=new)
    return RatioCase("paged_prefill_vs_baseline", params, build)


def default_cases() -> list[RatioCase]:
    """The gate's timing cases: decode and a chunked-prefill step, each against the
    baseline's frozen torch version, plus the paged prefill over contiguous SDPA."""
    return [decode_vs_baseline(1024), prefill_vs_baseline(448, 64), prefill_vs_sdpa(448, 64)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clock_for(device: torch.device) -> Callable[[], float]:
    """CPU time of this thread on CPU (torch runs single-threaded inline while measuring,
    so it is all the work, and time spent descheduled by other processes is not counted);
    wall-clock time on GPUs (with a synchronize after each sample)."""
    return time.thread_time if device.type == "cpu" else time.perf_counter


def _run(fn: Fn, inner: int, device: torch.device) -> float:
    clock = clock_for(device)
    start = clock()
    for _ in range(inner):
        fn()
    _sync(device)
    return clock() - start


def _calibrate(fn: Fn, device: torch.device, min_sample_s: float, warmup: int) -> int:
    for _ in range(warmup):
        fn()
    once = max(_run(fn, 1, device), 1e-9)
    return max(1, min(10_000, math.ceil(min_sample_s / once)))


def _spin_until(clock: Callable[[], float], start: float, seconds: float) -> None:
    while clock() - start < seconds:
        pass


@contextmanager
def measurement_threads(device: torch.device, threads: int | None) -> Iterator[None]:
    """Run torch with `threads` intra-op threads inside the block (CPU only)."""
    if device.type != "cpu" or threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def measure_ratio(
    case: RatioCase,
    device: torch.device,
    *,
    repeats: int = 20,
    min_sample_s: float = 0.01,
    warmup: int = 2,
    rounds: int = 3,
    slowdown: float = 0.0,
    frozen: ModuleType | None = None,
) -> list[RatioSample]:
    """Interleaved repeats of candidate and reference; per-call seconds of each.

    Each repeat runs `rounds` alternations of (candidate, reference) samples and keeps
    each side's fastest: contention from other processes only ever adds time, so the
    minimum over a few close-together samples is the least disturbed estimate.
    """
    if repeats < 1 or rounds < 1 or min_sample_s <= 0 or warmup < 0:
        raise ConfigError(f"bad timing settings: repeats={repeats}, min_sample_s={min_sample_s}")
    if not 0 <= slowdown < 100:
        raise ConfigError(f"slowdown must be in [0, 100), got {slowdown!r}")
    candidate, reference = case.build(device, frozen)
    clock = clock_for(device)
    inner_c = _calibrate(candidate, device, min_sample_s, warmup)
    inner_r = _calibrate(reference, device, min_sample_s, warmup)
    samples: list[RatioSample] = []
    for rep in range(repeats):
        best = {"c": math.inf, "r": math.inf}
        for rnd in range(rounds):
            order = ("c", "r") if (rep + rnd) % 2 == 0 else ("r", "c")
            for side in order:
                if side == "c":
                    start = clock()
                    took = _run(candidate, inner_c, device)
                    if slowdown:
                        _spin_until(clock, start, took * (1 + slowdown))
                        took = clock() - start
                    best["c"] = min(best["c"], took / inner_c)
                else:
                    best["r"] = min(best["r"], _run(reference, inner_r, device) / inner_r)
        samples.append(RatioSample(rep, best["c"], best["r"]))
    log.info(
        "%s %s: median ratio %.3f over %d repeats (inner %d/%d)",
        case.name,
        case.params,
        sorted(s.ratio for s in samples)[len(samples) // 2],
        repeats,
        inner_c,
        inner_r,
    )
    return samples
