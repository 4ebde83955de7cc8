"""kvbench's per-kernel GPU time model, and its fit to measured operator profiles.

Work of one transformer-layer operator on one tensor-parallel rank (fp16: 2 bytes per
element), for T tokens, width E, heads H (KV heads Hkv, head dim d = E / H), MLP width F,
`tp` ranks splitting heads and F:

    linear layer y[T, N] = x[T, K] W[K, N]:  bytes = 2 (K N + T K + T N),  FLOPs = 2 T K N
        QKV  K = E,          N = (H + 2 Hkv) d / tp     (KV heads: ceil(Hkv / tp) per rank)
        O    K = H d / tp,   N = E
        up   K = E,          N = (2 if gated else 1) F / tp
        down K = F / tp,     N = E
    elementwise (memory only): norm 4 T E + 2 E each (two per layer), rope 4 T (H + Hkv) d
        / tp, act 6 T F / tp gated (4 T F / tp plain), add 6 T E

Time of a linear kernel under an `Efficiency` (fractions f_bw, f_fl of the datasheet
HBM bandwidth B and peak P, floor t0):

    t = t0 + sqrt(m^2 + c^2),   m = bytes / (f_bw B),   c = FLOPs_64 / (f_fl P)

FLOPs_64 counts the token dimension in whole tensor-core tiles of 64 rows (a T = 1 GEMV
still costs 1/64 of a tile's FLOPs, which is far below its memory time). The quadrature
sum is a smooth roofline: the max of memory and compute where one dominates, with
imperfect overlap near the knee, where the measured kernels are slower than the max.
Elementwise kernels: t = t0 + bytes / (f_bw B). The datasheet prediction is kvbench's
step-model form: max(bytes / B, FLOPs / P), no floor.

`fit_efficiency` chooses (f_bw, f_fl, t0) minimising the mean absolute relative error of
the linear layers' median times, fractions constrained to (0, 1] and t0 >= 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize

from kvbench.workloads.efficiency import DATASHEET, Efficiency
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.profiles import DeviceProfile
from kvbench.workloads.vidur import (
    ELEMENTWISE_OPS,
    LINEAR_OPS,
    AllReduceRow,
    ModelShape,
    OperatorRow,
)

#: Rows of a tensor-core tile along the token dimension (FLOPs are counted in whole tiles).
TILE_ROWS = 64
BYTES = 2  # fp16
#: Operator groups reported: the four linear layers and the elementwise groups.
GROUPS = {
    "qkv": ("attn_pre_proj",),
    "o": ("attn_post_proj",),
    "up": ("mlp_up_proj",),
    "down": ("mlp_down_proj",),
    "norms": ("input_layernorm", "post_attention_layernorm"),
    "rope": ("attn_rope",),
    "act": ("mlp_act",),
    "add": ("add",),
}
LINEAR_GROUPS = ("qkv", "o", "up", "down")


@dataclass(frozen=True)
class Work:
    """What one operator moves and computes on one rank: bytes, FLOPs, FLOPs in whole
    64-row tiles (linear layers; 0 for elementwise ops)."""

    nbytes: float
    flops: float
    tiled_flops: float


def linear_shape(shape: ModelShape, tp: int, op: str) -> tuple[int, int]:
    """(K, N) of linear operator `op` on one of `tp` ranks (module docstring)."""
    d = shape.head_dim
    heads = shape.n_head // tp if shape.n_head % tp == 0 else math.ceil(shape.n_head / tp)
    kv = math.ceil(shape.n_kv_head / tp)
    ffn = shape.n_expanded_embd / tp
    if op == "attn_pre_proj":
        return shape.n_embd, (heads + 2 * kv) * d
    if op == "attn_post_proj":
        return heads * d, shape.n_embd
    if op == "mlp_up_proj":
        return shape.n_embd, round((2 if shape.gated_mlp else 1) * ffn)
    if op == "mlp_down_proj":
        return round(ffn), shape.n_embd
    raise ConfigError(f"unknown linear operator {op!r}; known: {LINEAR_OPS}")


def operator_work(shape: ModelShape, tp: int, tokens: int, op: str) -> Work:
    """Bytes and FLOPs of operator `op` for `tokens` tokens on one of `tp` ranks."""
    if tp < 1 or tokens < 1:
        raise ConfigError(f"tp and tokens must be >= 1, got tp={tp!r}, tokens={tokens!r}")
    t, e = tokens, shape.n_embd
    if op in LINEAR_OPS:
        k, n = linear_shape(shape, tp, op)
        tiles = math.ceil(t / TILE_ROWS) * TILE_ROWS
        return Work(BYTES * (k * n + t * k + t * n), 2.0 * t * k * n, 2.0 * tiles * k * n)
    d = shape.head_dim
    nbytes: float
    if op in ("input_layernorm", "post_attention_layernorm"):
        nbytes = BYTES * (2 * t * e + e)
    elif op == "attn_rope":
        heads = math.ceil(shape.n_head / tp) + math.ceil(shape.n_kv_head / tp)
        nbytes = BYTES * 2 * t * heads * d
    elif op == "mlp_act":
        per = shape.n_expanded_embd / tp
        nbytes = BYTES * (3 if shape.gated_mlp else 2) * t * per
    elif op == "add":
        nbytes = BYTES * 3 * t * e
    else:
        raise ConfigError(f"unknown operator {op!r}; known: {LINEAR_OPS + ELEMENTWISE_OPS}")
    return Work(float(nbytes), 0.0, 0.0)


def kernel_seconds(work: Work, profile: DeviceProfile, eff: Efficiency) -> float:
    """Fitted-form time of one kernel (module docstring)."""
    m = work.nbytes / (eff.hbm_fraction * profile.hbm_bandwidth)
    c = work.tiled_flops / (eff.flops_fraction * profile.peak_flops)
    return eff.kernel_floor_s + math.hypot(m, c)


def roofline_seconds(work: Work, profile: DeviceProfile, eff: Efficiency = DATASHEET) -> float:
    """Step-model form: floor + max(bytes / bandwidth, FLOPs / peak), under `eff`."""
    m = work.nbytes / (eff.hbm_fraction * profile.hbm_bandwidth)
    c = work.flops / (eff.flops_fraction * profile.peak_flops)
    return eff.kernel_floor_s + max(m, c)


def _arrays(rows: Iterable[OperatorRow]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bytes, tiled FLOPs, measured seconds) of every linear-layer point in `rows`."""
    b, f, m = [], [], []
    for row in rows:
        for op in LINEAR_OPS:
            w = operator_work(row.shape, row.tp, row.num_tokens, op)
            b.append(w.nbytes)
            f.append(w.tiled_flops)
            m.append(row.median_ms[op] * 1e-3)
    return np.asarray(b), np.asarray(f), np.asarray(m)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x > -700 else 0.0


def _logit(p: float) -> float:
    p = min(max(p, 1e-9), 1 - 1e-9)
    return math.log(p / (1 - p))


def fit_efficiency(
    rows: Sequence[OperatorRow], profile: DeviceProfile, source: str = ""
) -> Efficiency:
    """Fractions and floor minimising the mean |predicted / measured - 1| of the linear
    layers of `rows` under `kernel_seconds` (module docstring).

    Parametrised so the constraints hold by construction: fraction = sigmoid(u) (with an
    upper end of exactly 1 reachable through clipping), floor = v^2 us. Nelder-Mead
    from a few fixed starts; deterministic."""
    if not rows:
        raise ConfigError("fit_efficiency needs at least one measured row")
    nbytes, flops, measured = _arrays(rows)
    bw, peak = profile.hbm_bandwidth, profile.peak_flops

    def unpack(x: np.ndarray) -> tuple[float, float, float]:
        fb = min(1.0, _sigmoid(float(x[0])) * 1.001)
        ff = min(1.0, _sigmoid(float(x[1])) * 1.001)
        return fb, ff, float(x[2]) ** 2 * 1e-6

    def loss(x: np.ndarray) -> float:
        fb, ff, t0 = unpack(x)
        if fb <= 0 or ff <= 0:
            return math.inf
        pred = t0 + np.hypot(nbytes / (fb * bw), flops / (ff * peak))
        return float(np.mean(np.abs(pred / measured - 1.0)))

    best = None
    for fb0, ff0, floor_us in ((0.9, 0.8, 4.0), (0.6, 0.6, 1.0), (0.99, 0.95, 9.0)):
        x0 = np.array([_logit(fb0), _logit(ff0), math.sqrt(floor_us)])
        res = minimize(
            loss, x0, method="Nelder-Mead", options={"maxiter": 6000, "xatol": 1e-8, "fatol": 1e-10}
        )
        if best is None or res.fun < best.fun:
            best = res
    assert best is not None
    fb, ff, t0 = unpack(best.x)
    models = tuple(sorted({r.model for r in rows}))
    return Efficiency(fb, ff, t0, source or f"fit on {', '.join(models)}", models)


# -- all-reduce -------------------------------------------------------------------------
def allreduce_seconds(size_bytes: float, workers: int, latency_s: float, bus_bw: float) -> float:
    """Ring all-reduce: latency + 2 (n - 1) / n x bytes / bandwidth (0 for one worker)."""
    if workers <= 1:
        return 0.0
    return latency_s + 2.0 * (workers - 1) / workers * size_bytes / bus_bw


def fit_allreduce(rows: Sequence[AllReduceRow]) -> tuple[float, float, float]:
    """(latency s, bus bandwidth B/s, mean |rel. error|) minimising the mean relative
    error of `allreduce_seconds` over `rows` (single-node rows only: the caller picks)."""
    if not rows:
        raise ConfigError("fit_allreduce needs at least one measured row")
    size = np.array([r.size_bytes for r in rows])
    ring = np.array([2.0 * (r.num_workers - 1) / r.num_workers for r in rows])
    meas = np.array([r.median_ms * 1e-3 for r in rows])

    def loss(x: np.ndarray) -> float:
        lat, bw = x[0] ** 2 * 1e-6, math.exp(x[1])
        return float(np.mean(np.abs((lat + ring * size / bw) / meas - 1.0)))

    res = minimize(loss, np.array([math.sqrt(20.0), math.log(2e11)]), method="Nelder-Mead")
    return float(res.x[0]) ** 2 * 1e-6, math.exp(float(res.x[1])), float(res.fun)
