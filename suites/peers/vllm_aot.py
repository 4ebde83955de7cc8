"""vLLM's Triton attention kernels compiled ahead of time for sm_80 and sm_90 beside
kvbench's, with the configurations vLLM's own launchers choose: no GPU needed.

How (see ../shared/notes/vllm-triton-kernels.md): `kernel_unified_attention` takes ~80
arguments whose None values become constexprs, so a hand-written signature would break
with each vLLM release. Instead the real launchers run on CPU tensors with Triton's
active driver faked to report a `GPUTarget("cuda", arch, 32)` and a
`triton.knobs.runtime.jit_cache_hook` that records the signature, constexprs, pointer
divisibility, warps and stages each launch asks for and returns True (nothing is compiled
or launched). Each recorded launch is then compiled with `triton.compile(ASTSource(...))`
and measured by `kernels.aot.measure` (registers, spills, shared memory, SASS).
`torch.cuda.get_device_capability` answers the architecture while the launchers run (the
reshape launcher picks its tile size by it). Compiling and interpreting cannot share a
process: `compile_peers_isolated` runs everything in a fresh spawned compile-mode process.

The shapes (`SHAPES`): fp16 and bf16, head dims 64 and 128, blocks 16 and 32, Llama-class
GQA (32 query / 8 KV heads), a decode batch of 4 sequences at context 4096 (unified
attention takes its 3D variant, as vLLM's backend does for <= 128 // 8 sequences;
decode_attention_fwd takes vLLM's TritonMLA split count, 8) and a prefill batch of 4 x 128
new tokens (unified 2D). kvbench's rows are its own dispatch for the same shapes
(`kernels.configs`; its decode and prefill take the block size at run time).

Results are cached as JSON under out/aot/peers/, keyed by the vLLM, Triton and kvbench
kernel-source versions, so a repeated `kvbench kernels --peers` costs nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from kvbench.kernels import aot, configs

#: GQA geometry of every shape (Llama-class: 32 query heads over 8 KV heads).
NUM_Q_HEADS, NUM_KV_HEADS = 32, 8
DECODE_BATCH, DECODE_CONTEXT = 4, 4096
PREFILL_BATCH, PREFILL_TOKENS = 4, 128
#: Constexprs shown in the configuration column (the rest are in the JSON record).
SHOWN = (
    "TILE_SIZE", "BLOCK_M", "BLOCK_Q", "BLOCK_N", "BLOCK_H", "QH", "TILE_N", "num_warps",
    "num_stages", "NUM_SEGMENTS_PER_SEQ", "NUM_KV_SPLITS", "BLOCK_SIZE",
)  # fmt: skip


@dataclass(frozen=True)
class Shape:
    """One case of the side-by-side table."""

    dtype: str  # "fp16" | "bf16"
    head_dim: int
    block_size: int

    @property
    def torch_dtype(self) -> torch.dtype:
        return {"fp16": torch.float16, "bf16": torch.bfloat16}[self.dtype]


SHAPES: tuple[Shape, ...] = tuple(
    Shape(dt, d, bs) for dt in ("fp16", "bf16") for d in (64, 128) for bs in (16, 32)
)


@dataclass(frozen=True)
class PeerRecord:
    """A compile record with the implementation, the kernel's role and the shape."""

    impl: str  # "vllm" | "kvbench"
    role: str  # "decode" | "decode-reduce" | "prefill" | "kv-write"
    variant: str  # e.g. "unified 3D", "decode stage 1", "split decode"
    shape: Shape
    record: aot.CompileRecord
    num_stages: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "impl": self.impl,
            "role": self.role,
            "variant": self.variant,
            "shape": asdict(self.shape),
            "record": asdict(self.record),
            "num_stages": self.num_stages,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PeerRecord:
        return cls(
            d["impl"],
            d["role"],
            d["variant"],
            Shape(**d["shape"]),
            aot.CompileRecord(**d["record"]),
            d["num_stages"],
        )


# ---------------------------------------------------------------- recording vLLM's launches
@dataclass
class _Launch:
    role: str
    variant: str
    fn: Any  # JITFunction
    compile: dict[str, Any]


class _FakeDriver:
    """Triton's active driver as a GPU of sm_`arch` would report itself (no CUDA calls)."""

    def __init__(self, arch: int) -> None:
        self.arch = arch

    def get_current_device(self) -> int:
        return self.arch  # one device cache per architecture

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", self.arch, 32)

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")

    def is_active(self) -> bool:
        return True


def _record(shape: Shape, arch: int) -> list[_Launch]:
    """Run vLLM's launchers for `shape` with the fake sm_`arch` driver; the launches."""
    import triton
    from triton.runtime.driver import driver

    from kvbench.suites.peers.vllm_triton import (
        MIN_LAUNCH_GRID_SIZE_2D,
        NUM_PAR_SOFTMAX_SEGMENTS,
        import_ops,
        num_kv_splits,
    )

    v = import_ops()
    launches: list[_Launch] = []
    label = ["", ""]

    def hook(*, key: Any, repr: str, fn: Any, compile: dict, **_: Any) -> bool:
        launches.append(_Launch(label[0], label[1], fn.jit_function, compile))
        return True

    dt, d, bs = shape.torch_dtype, shape.head_dim, shape.block_size
    hq, hkv = NUM_Q_HEADS, NUM_KV_HEADS
    blocks_per_seq = DECODE_CONTEXT // bs
    k_cache = torch.zeros((DECODE_BATCH * blocks_per_seq, bs, hkv, d), dtype=dt)
    v_cache = torch.zeros_like(k_cache)
    f32 = torch.float32
    tables = torch.zeros((DECODE_BATCH, blocks_per_seq), dtype=torch.int32)
    lens = torch.full((DECODE_BATCH,), DECODE_CONTEXT, dtype=torch.int32)
    q = torch.zeros((DECODE_BATCH, hq, d), dtype=dt)
    out = torch.empty_like(q)
    segs = NUM_PAR_SOFTMAX_SEGMENTS
    d_pad = triton.next_power_of_2(d)
    cu = torch.arange(DECODE_BATCH + 1, dtype=torch.int32)
    qp = torch.zeros((PREFILL_BATCH * PREFILL_TOKENS, hq, d), dtype=dt)
    cu_p = torch.arange(PREFILL_BATCH + 1, dtype=torch.int32) * PREFILL_TOKENS
    splits = num_kv_splits(DECODE_CONTEXT)
    original_capability = torch.cuda.get_device_capability
    saved_driver = driver._active  # None until something asks for the real one
    driver.set_active(_FakeDriver(arch))  # type: ignore[arg-type]
    triton.knobs.runtime.jit_cache_hook = hook
    torch.cuda.get_device_capability = lambda *a, **k: (arch // 10, arch % 10)  # type: ignore[assignment]
    try:
        label[:] = ["decode", "unified 3D"]
        v.unified.unified_attention(
            q, k_cache, v_cache, out, cu, 1, lens, DECODE_CONTEXT, 0.1, True, (-1, -1), tables,
            0, None, None, None,
            seq_threshold_3D=MIN_LAUNCH_GRID_SIZE_2D // hkv,
            num_par_softmax_segments=segs,
            softmax_segm_output=torch.empty((DECODE_BATCH, hq, segs, d_pad), dtype=f32),
            softmax_segm_max=torch.empty((DECODE_BATCH, hq, segs), dtype=f32),
            softmax_segm_expsum=torch.empty((DECODE_BATCH, hq, segs), dtype=f32),
        )  # fmt: skip
        label[:] = ["prefill", "unified 2D"]
        v.unified.unified_attention(
            qp, k_cache, v_cache, torch.empty_like(qp), cu_p, PREFILL_TOKENS, lens,
            DECODE_CONTEXT, 0.1, True, (-1, -1), tables, 0, None, None, None,
        )  # fmt: skip
        label[:] = ["decode", "decode_attention_fwd"]
        v.decode.decode_attention_fwd(
            q, k_cache, v_cache, out, torch.empty((DECODE_BATCH, hq), dtype=f32), tables,
            lens, torch.empty((DECODE_BATCH, hq, splits, d + 1), dtype=f32), splits, 0.1,
            page_size=bs,
        )  # fmt: skip
        label[:] = ["kv-write", "reshape_and_cache_flash"]
        one = torch.ones((), dtype=f32)
        v.reshape.triton_reshape_and_cache_flash(
            q[:, :hkv], q[:, :hkv], k_cache, v_cache, torch.zeros(DECODE_BATCH, dtype=torch.int64),
            "auto", one, one,
        )  # fmt: skip
    finally:
        triton.knobs.runtime.jit_cache_hook = None
        driver._active = saved_driver
        torch.cuda.get_device_capability = original_capability  # type: ignore[assignment]
    return launches


_VARIANT_OF = {
    "kernel_unified_attention": None,  # keeps the launch's own label (2D / 3D)
    "reduce_segments": ("decode-reduce", "unified 3D reduce"),
    "_fwd_grouped_kernel_stage1": ("decode", "decode stage 1 (grouped)"),
    "_fwd_kernel_stage1": ("decode", "decode stage 1"),
    "_fwd_kernel_stage2": ("decode-reduce", "decode stage 2"),
}


def _compile_launch(launch: _Launch, shape: Shape, arch: int) -> PeerRecord:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    c = launch.compile
    fn = launch.fn
    name = fn.fn.__name__
    role, variant = _VARIANT_OF.get(name) or (launch.role, launch.variant)
    src = ASTSource(fn, c["signature"], c["constants"], c["configs"][0])
    opts = {"num_warps": c["num_warps"], "num_stages": c["num_stages"]}
    try:
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=opts)
    except Exception as exc:  # the compiler raises many types; name the launch
        raise aot.CompileCheckError(
            f"vLLM {name} ({shape}) failed to compile for sm_{arch}: {exc}"
        ) from exc
    names = fn.arg_names
    constexprs = {names[p[0]]: val for p, val in c["constants"].items() if len(p) == 1}
    config: dict[str, object] = {
        "dtype": shape.dtype,
        "head_dim": shape.head_dim,
        "block_size": shape.block_size,
        "num_warps": c["num_warps"],
        "num_stages": c["num_stages"],
        **{k: v for k, v in constexprs.items() if isinstance(v, (int, float, bool, str))},
    }
    record = aot.measure(compiled, f"vllm.{name.lstrip('_')}", config, arch, c["num_warps"])
    return PeerRecord("vllm", role, variant, shape, record, c["num_stages"])


def tile_matched(shape: Shape) -> list[tuple[int, int]]:
    """(BLOCK_M, warps) of kvbench's prefill tiles for `shape` that vLLM's launcher does not
    pick itself: vLLM's unified 2D kernel is also compiled at each, so every kvbench tile has
    a vLLM row at the same BLOCK_M and warps (and vLLM's own KV tile) to be held to."""
    own = 16  # vLLM's 2D BLOCK_M for GQA groups up to 16 (Llama-class: 4)
    return [
        (cfg.int_constexpr("BLOCK_M"), cfg.num_warps)
        for cfg in configs.prefill_configs(shape.torch_dtype, shape.head_dim)
        if cfg.int_constexpr("BLOCK_M") != own
    ]


def _at_tile(launch: _Launch, block_m: int, warps: int) -> _Launch:
    """vLLM's recorded 2D launch with BLOCK_M (and BLOCK_Q = BLOCK_M / group) and warps
    replaced; everything else (TILE_SIZE, stages, the other constexprs) as vLLM chose."""
    names = launch.fn.arg_names
    group = NUM_Q_HEADS // NUM_KV_HEADS
    constants = dict(launch.compile["constants"])
    for path in list(constants):
        if len(path) == 1 and names[path[0]] == "BLOCK_M":
            constants[path] = block_m
        elif len(path) == 1 and names[path[0]] == "BLOCK_Q":
            constants[path] = block_m // group
    compile_ = {**launch.compile, "constants": constants, "num_warps": warps}
    variant = f"unified 2D at BLOCK_M {block_m}, {warps} warps"
    return _Launch(launch.role, variant, launch.fn, compile_)


def _vllm_job(job: tuple[list[Shape], list[int]]) -> list[dict[str, Any]]:
    shapes, archs = job
    out = []
    for shape in shapes:
        for arch in archs:
            for launch in _record(shape, arch):
                out.append(_compile_launch(launch, shape, arch).as_dict())
                if launch.variant == "unified 2D":
                    for block_m, warps in tile_matched(shape):
                        matched = _at_tile(launch, block_m, warps)
                        out.append(_compile_launch(matched, shape, arch).as_dict())
    return out


# ---------------------------------------------------------------- kvbench's side
def kvbench_configs(shape: Shape) -> list[tuple[str, str, configs.KernelConfig]]:
    """(role, variant, configuration) kvbench's dispatch picks for `shape`."""
    dt, d = shape.torch_dtype, shape.head_dim
    group = NUM_Q_HEADS // NUM_KV_HEADS
    return [
        ("decode", "split decode", configs.decode_config(dt, d, group, single=False)),
        ("decode", "single-partition decode", configs.decode_config(dt, d, group, single=True)),
        ("decode-reduce", "split decode reduce", configs.reduce_config(dt, d)),
        *(
            ("prefill", f"prefill, BLOCK_M {cfg.constexprs['BLOCK_M']}", cfg)
            for cfg in configs.prefill_configs(dt, d)
        ),
        ("kv-write", "copy_rows (write_kv)", configs.copy_config(2, src_identity=True)),
    ]


def _kvbench_records(
    shapes: Sequence[Shape], archs: Sequence[int], workers: int | None
) -> list[PeerRecord]:
    jobs = [(shape, role, variant, cfg) for shape in shapes for role, variant, cfg in
            kvbench_configs(shape)]  # fmt: skip
    cfgs = [cfg for *_, cfg in jobs]
    records = aot.compile_all(cfgs, archs=archs, workers=workers)
    out = []
    for i, (shape, role, variant, cfg) in enumerate(jobs):
        for j, _arch in enumerate(archs):
            rec = records[i * len(archs) + j]
            out.append(PeerRecord("kvbench", role, variant, shape, rec, cfg.num_stages))
    return out


# ---------------------------------------------------------------- the whole table
def _cache_path(cache_dir: Path, shapes: Sequence[Shape], archs: Sequence[int]) -> Path:
    import triton

    from kvbench.suites.peers.vllm_adapter import version

    key = json.dumps(
        [
            version(),
            triton.__version__,
            [asdict(s) for s in shapes],
            list(archs),
            [tile_matched(s) for s in shapes],
        ],
        sort_keys=True,
    )
    return cache_dir / f"vllm-{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def _spawn() -> Any:
    import multiprocessing

    return multiprocessing.get_context("spawn")


def compile_peers_isolated(
    shapes: Iterable[Shape] = SHAPES,
    archs: Iterable[int] = aot.ARCHS,
    cache_dir: Path | None = None,
    workers: int | None = None,
) -> list[PeerRecord]:
    """vLLM's records (compiled in fresh compile-mode processes, cached) and kvbench's
    (through `kernels.aot.compile_all` and its cache) for `shapes` x `archs`.

    Raises PeerUnavailableError without vLLM, CompileCheckError when a launch fails."""
    from kvbench.suites.peers.base import PeerUnavailableError
    from kvbench.suites.peers.vllm_adapter import probe

    shapes, archs = list(shapes), list(archs)
    why = probe()
    if why is not None:
        raise PeerUnavailableError(why)
    cache = (cache_dir or aot.default_cache_dir()) / "peers"
    cache.mkdir(parents=True, exist_ok=True)
    path = _cache_path(cache, shapes, archs)
    if path.exists():
        vllm = [PeerRecord.from_dict(d) for d in json.loads(path.read_text())]
    else:
        n = max(1, min(workers or 2, len(shapes)))
        chunks = [(shapes[i::n], archs) for i in range(n)]
        with aot._compile_mode(), ProcessPoolExecutor(n, mp_context=_spawn()) as pool:
            dicts = [d for part in pool.map(_vllm_job, chunks) for d in part]
        path.write_text(json.dumps(dicts, sort_keys=True))
        vllm = [PeerRecord.from_dict(d) for d in dicts]
    return _kvbench_records(shapes, archs, workers) + vllm


def sort_key(r: PeerRecord) -> tuple:
    order = {"decode": 0, "decode-reduce": 1, "prefill": 2, "kv-write": 3}
    s = r.shape
    return (s.dtype, s.head_dim, s.block_size, r.record.arch, order[r.role], r.impl != "kvbench")


def format_table(records: Sequence[PeerRecord]) -> str:
    """Fixed-width side-by-side table, grouped by shape and architecture."""
    head = (
        f"{'dtype':<5} {'D':>4} {'bs':>3} {'arch':<6} {'impl':<8} {'kernel (variant)':<44} "
        f"{'config':<60} {'regs':>5} {'spill':>5} {'shared':>7} {'sass':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in sorted(records, key=sort_key):
        rec, s = r.record, r.shape
        cfg = dict(rec.config)
        if r.num_stages != configs.DEFAULT_STAGES:
            cfg["num_stages"] = r.num_stages
        shown = " ".join(f"{k}={cfg[k]}" for k in SHOWN if k in cfg)
        bs = "any" if r.impl == "kvbench" and r.role != "kv-write" else s.block_size
        lines.append(
            f"{s.dtype:<5} {s.head_dim:>4} {bs!s:>3} {rec.arch:<6} {r.impl:<8} "
            f"{(rec.kernel + ' (' + r.variant + ')')[:44]:<44} {shown[:60]:<60} "
            f"{rec.registers:>5} {rec.spills:>5} {rec.shared_bytes:>7} {rec.sass_instructions:>6}"
        )
    return "\n".join(lines)


#: Suite of the result rows: the same metrics and units as `kernels.aot`, with the
#: implementation, role, variant and shape in the case, so a model of predicted kernel
#: time can read vLLM's costs exactly as it reads kvbench's.
SUITE = "kernels.aot.peers"


def as_rows(records: Sequence[PeerRecord]) -> list[dict[str, Any]]:
    """Result rows `{"case", "metric", "value", "unit"}`, one per (record, metric)."""
    import triton

    from kvbench.suites.peers.vllm_adapter import version

    rows = []
    for r in records:
        case = {
            "impl": r.impl,
            "role": r.role,
            "variant": r.variant,
            "kernel": r.record.kernel,
            "arch": r.record.arch,
            "dtype": r.shape.dtype,
            "head_dim": r.shape.head_dim,
            "block_size": r.shape.block_size,
            "num_q_heads": NUM_Q_HEADS,
            "num_kv_heads": NUM_KV_HEADS,
            "config": aot.config_json(r.record.config),
            "triton": triton.__version__,
            "version": version() if r.impl == "vllm" else "kvbench",
            "provenance": "compiled here ahead of time (static; no GPU)",
        }
        for metric, unit in aot.METRICS.items():
            rows.append(
                {"case": case, "metric": metric, "value": getattr(r.record, metric), "unit": unit}
            )
    return rows
