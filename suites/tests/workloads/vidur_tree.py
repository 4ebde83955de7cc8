"""Test support: write a profile folder in Vidur's layout whose times come from kvbench's
own fitted kernel model under a chosen `Efficiency` (so a fit must recover it)."""

from __future__ import annotations

import csv
from pathlib import Path

from kvbench.workloads.efficiency import Efficiency
from kvbench.workloads.gpu_fit import kernel_seconds, operator_work
from kvbench.workloads.profiles import DeviceProfile
from kvbench.workloads.vidur import COMPUTE_OPS, ModelShape

LLAMA_7B = ModelShape(32, 32, 4096, 11008, True)
LLAMA_70B = ModelShape(64, 8, 8192, 28672, True)
#: A shape in no shipped fit (Qwen2.5-14B-like: 40 heads, 8 KV heads).
QWEN_14B = ModelShape(40, 8, 5120, 13824, True)
TOKENS = (1, 2, 8, 32, 96, 128, 200, 512, 1000, 2048, 4096)

_STATS = ("min", "max", "mean", "median", "std")


def header() -> list[str]:
    cols = [f"time_stats.{op}.{s}" for op in ("emb", *COMPUTE_OPS) for s in _STATS]
    return [
        *cols,
        "n_head",
        "n_kv_head",
        "n_embd",
        "n_expanded_embd",
        "vocab_size",
        "use_gated_mlp",
        "num_tokens",
        "num_tensor_parallel_workers",
    ]


def write_model(
    root: Path,
    gpu: str,
    model: str,
    shape: ModelShape,
    profile: DeviceProfile,
    eff: Efficiency,
    noise: float = 0.0,
) -> Path:
    """compute/<gpu>/<model>/mlp.csv with times of `kernel_seconds(eff)` (times a
    deterministic +-`noise` wobble), every op, TP 1/2/4/8 x TOKENS."""
    path = root / "compute" / gpu / model / "mlp.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header())
        i = 0
        for tp in (1, 2, 4, 8):
            for t in TOKENS:
                cells = ["0.01"] * 5  # emb
                for op in COMPUTE_OPS:
                    i += 1
                    wobble = 1.0 + noise * ((i * 7919) % 201 - 100) / 100.0
                    ms = kernel_seconds(operator_work(shape, tp, t, op), profile, eff) * 1e3
                    ms *= wobble
                    cells += [f"{ms:.9g}"] * 4 + ["0.0"]
                cells += [
                    shape.n_head,
                    shape.n_kv_head,
                    shape.n_embd,
                    shape.n_expanded_embd,
                    32000,
                    shape.gated_mlp,
                    t,
                    tp,
                ]
                w.writerow(cells)
    return path


def write_allreduce(root: Path, cluster: str) -> Path:
    """network/<cluster>/all_reduce.csv: 20 us + ring bytes at 200 GB/s, 2/4/8 workers."""
    path = root / "network" / cluster / "all_reduce.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(
            ["", "time_stats.all_reduce.median", "rank", "num_workers", "size", "devices_per_node"]
        )
        i = 0
        for n in (2, 4, 8):
            for size in (2048, 1 << 16, 1 << 20, 1 << 24, 1 << 26):
                ms = (20e-6 + 2 * (n - 1) / n * size / 200e9) * 1e3
                w.writerow([i, f"{ms:.9g}", 0, n, size, n])
                i += 1
    return path
