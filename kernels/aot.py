"""Ahead-of-time compilation of every kernel configuration for sm_80 and sm_90, no GPU.

Each configuration the dispatch can choose (`kernels.configs.all_configs`) is compiled to a
cubin with `triton.compile(ASTSource(...), target=GPUTarget("cuda", arch, 32))`; the
`cuobjdump` shipped in the Triton wheel reads its registers per thread and SASS
instruction count, the wheel's `ptxas -v` its spills, and Triton's metadata the shared
memory the launch needs. This proves the kernels
are real GPU code and measures what they cost, which the regression gate compares exactly.

What is compiled is the signature the JIT specializes to in the common case: pointers
16-byte aligned (torch allocations are) and the head dim, row lengths and strides known to
be multiples of 16 (true for head dims 64, 80, 96, 128 and 256); other integers are plain
i32. A GPU run with other strides (say head_dim 72) picks a differently specialized binary.
Spills are read from `ptxas -v` on the generated PTX (spill stores + loads, bytes).

Results are cached as JSON under `out/aot/`, keyed by Triton version, the kernel source
hash, the configuration and the architecture, so a repeated run costs nothing.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import logging
import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from kvbench.kernels import configs
from kvbench.workloads.errors import KVBenchError

if TYPE_CHECKING:
    from triton.runtime.jit import JITFunction

log = logging.getLogger(__name__)

#: Architectures every configuration is compiled for.
ARCHS: tuple[int, ...] = (80, 90)
#: Per-architecture limits: max shared memory per block (bytes, opt-in), max registers per
#: thread, registers per block.
LIMITS: dict[int, dict[str, int]] = {
    80: {"shared_bytes": 166_912, "registers": 255, "block_registers": 65_536},
    90: {"shared_bytes": 232_448, "registers": 255, "block_registers": 65_536},
}
_KERNEL_SOURCE = Path(__file__).with_name("triton_kernels.py")


class CompileCheckError(KVBenchError):
    """A kernel configuration failed to compile or could not be inspected."""


@dataclass(frozen=True)
class CompileRecord:
    """What one configuration costs on one architecture."""

    kernel: str
    config: dict[str, object]
    arch: str
    registers: int
    spills: int
    shared_bytes: int
    sass_instructions: int
    num_warps: int
    triton_version: str

    def violations(self) -> list[str]:
        """Why this record breaks the rules (spills, limits); empty when it does not."""
        lim = LIMITS[int(self.arch.removeprefix("sm_"))]
        out = []
        if self.spills:
            out.append(f"spills {self.spills} bytes to local memory")
        if self.shared_bytes > lim["shared_bytes"]:
            out.append(f"shared {self.shared_bytes} > {lim['shared_bytes']} bytes")
        if self.registers > lim["registers"]:
            out.append(f"{self.registers} registers > {lim['registers']}")
        if self.registers * self.num_warps * 32 > lim["block_registers"]:
            out.append(f"{self.registers} x {self.num_warps * 32} threads > block register file")
        return out


def _tool(name: str) -> str:
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not path.exists():
        raise CompileCheckError(f"{name} not found at {path}; the Triton wheel should ship it")
    return str(path)


#: Bump when `signature` or the way records are measured changes: it is part of the cache
#: key and of `source_hash`, so cached records made the old way are not reused.
SIGNATURE_VERSION = 1


def source_hash() -> str:
    """sha256 of the kernel source, the configuration choices and `SIGNATURE_VERSION`
    (first 16 hex digits): what the compiled costs depend on besides Triton itself.

    The sources are hashed as parsed syntax trees, so comments and formatting do not
    count; a change to code (or docstrings) does."""
    h = hashlib.sha256()
    for path in (_KERNEL_SOURCE, Path(configs.__file__)):
        h.update(ast.dump(ast.parse(path.read_text(encoding="utf-8"))).encode())
    h.update(f"signature-v{SIGNATURE_VERSION}".encode())
    return h.hexdigest()[:16]


#: Integer arguments that are multiples of 16 for every supported head dim.
_MULTIPLES_OF_16 = frozenset({"head_dim", "row_len", "src_row_stride", "dst_row_stride"})


def _pointer_types(cfg: configs.KernelConfig) -> dict[str, str]:
    data = configs.TRITON_DTYPE_NAMES[cfg.dtype]
    if cfg.kernel == "copy_rows":
        return {"src_ptr": data, "dst_ptr": data, "src_rows_ptr": "i64", "dst_rows_ptr": "i64"}
    if cfg.kernel == "quantize_rows":
        return {"src_ptr": data, "dst_ptr": "u8", "dst_rows_ptr": "i64", "inv_scale_ptr": "fp32"}
    kv = "u8" if "FP8_MAN" in cfg.constexprs else data  # fp8 K/V are read as bytes
    types = {n: data for n in ("q_ptr", "out_ptr")}
    types.update({n: kv for n in ("k_ptr", "v_ptr")})
    types.update({n: "i32" for n in ("tables_ptr", "lens_ptr", "cu_q_ptr")})
    types.update({n: "fp32" for n in ("part_out_ptr", "part_max_ptr", "part_sum_ptr")})
    types.update({n: "fp32" for n in ("k_scale_ptr", "v_scale_ptr")})
    return types


def constexpr_defaults(fn: JITFunction) -> dict[str, object]:
    """The kernel's constexpr parameters that have defaults (e.g. the fp8 switches a 16-bit
    configuration leaves out), with their default values."""
    return {
        p.name: p.default
        for p in fn.params
        if p.is_constexpr and p.default is not inspect.Parameter.empty
    }


def signature(cfg: configs.KernelConfig) -> tuple[dict[str, str], dict[tuple[int], list]]:
    """The compile signature of a configuration and its pointer-alignment attributes."""
    from kvbench.kernels.triton_kernels import JIT

    fn = JIT[cfg.kernel]
    pointers = _pointer_types(cfg)
    sig: dict[str, str] = {}
    attrs: dict[tuple[int], list] = {}
    for i, name in enumerate(fn.arg_names):
        if name in cfg.constexprs or fn.params[i].is_constexpr:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = "*" + pointers[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name == "scale_log2":
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
            if name in _MULTIPLES_OF_16 or name.startswith("stride_"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def constants(cfg: configs.KernelConfig, fn: JITFunction) -> dict[str, object]:
    """The configuration's constexprs plus the defaults of those it leaves out (WINDOWED
    of the full-attention decode variants)."""
    defaults = {p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}
    return {**defaults, **cfg.constexprs}


def _count_sass(sass: str) -> int:
    return len(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+[A-Z@]", sass, flags=re.MULTILINE))


def _ptxas(arch: int) -> str:
    """The ptxas Triton itself uses for `arch` (the wheel ships two)."""
    from triton.backends.nvidia.compiler import get_ptxas

    return str(get_ptxas(arch).path)


def _spills(ptx: str, arch: int, name: str) -> int:
    """Spill store + load bytes reported by `ptxas -v` for the PTX."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        res = subprocess.run(
            [
                _ptxas(arch),
                "-v",
                f"--gpu-name=sm_{arch}{'a' if arch >= 90 else ''}",
                f.name,
                "-o",
                os.devnull,
            ],
            capture_output=True,
            text=True,
        )
    if res.returncode:
        raise CompileCheckError(f"ptxas failed on {name} for sm_{arch}: {res.stderr.strip()}")
    found = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", res.stderr)
    if not found:
        raise CompileCheckError(f"ptxas -v reported no spill figures for {name}")
    return sum(int(a) + int(b) for a, b in found)


def _usage(cubin: bytes, name: str) -> dict[str, int]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run(
            [_tool("cuobjdump"), "-res-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
        sass = subprocess.run(
            [_tool("cuobjdump"), "-sass", f.name], capture_output=True, text=True, check=True
        ).stdout
    line = next((ln for ln in res.splitlines() if "REG:" in ln), None)
    if line is None:
        raise CompileCheckError(f"cuobjdump reported no resource usage for {name}")
    fields = dict(re.findall(r"(\w+):(\d+)", line))
    return {
        "registers": int(fields["REG"]),
        "sass_instructions": _count_sass(sass),
    }


def measure(
    compiled: object, kernel: str, config: dict[str, object], arch: int, num_warps: int
) -> CompileRecord:
    """The record of a kernel `triton.compile` built for sm_`arch`: registers and SASS
    instructions from its cubin, spills from `ptxas -v` on its PTX, shared memory from its
    metadata. Also measures other people's kernels (suites/peers/vllm_aot.py)."""
    import triton

    asm = compiled.asm  # type: ignore[attr-defined]
    use = _usage(asm["cubin"], kernel)
    return CompileRecord(
        kernel=kernel,
        config=config,
        arch=f"sm_{arch}",
        registers=use["registers"],
        spills=_spills(asm["ptx"], arch, kernel),
        shared_bytes=int(compiled.metadata.shared),  # type: ignore[attr-defined]
        sass_instructions=use["sass_instructions"],
        num_warps=num_warps,
        triton_version=triton.__version__,
    )


def compile_one(
    cfg: configs.KernelConfig, arch: int, kernel: JITFunction | None = None
) -> CompileRecord:
    """Compile one configuration for sm_`arch` in this process and measure it (no
    kvbench cache). `kernel` replaces the configuration's own JIT function (a variant
    with the same signature, e.g. a deliberately heavier one for gate tests).

    Only in a process that is not interpreting Triton: once TRITON_INTERPRET=1 is set,
    the interpreter patches `triton.language` for the whole process and code generation
    fails, or seems to work only because Triton's on-disk cache already holds the
    binary. `compile_isolated` runs this in a fresh compile-mode process.

    Raises:
        CompileCheckError: TRITON_INTERPRET is set, or the configuration failed to compile.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kvbench.kernels.triton_kernels import JIT

    if _interpreting():
        raise CompileCheckError(
            f"cannot compile {cfg.kernel} {cfg.describe()} for sm_{arch} in a process with "
            f"TRITON_INTERPRET={os.environ['TRITON_INTERPRET']!r}: use compile_isolated "
            "(a fresh compile-mode process) or compile_all"
        )
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    sig, attrs = signature(cfg)
    fn = JIT[cfg.kernel] if kernel is None else kernel
    src = ASTSource(fn, sig, constants(cfg, fn), attrs)
    try:
        kernel = triton.compile(
            src,
            target=GPUTarget("cuda", arch, 32),
            options=cfg.launch_options(),
        )
    except Exception as exc:  # the compiler raises many types; name the configuration
        raise CompileCheckError(
            f"{cfg.kernel} {cfg.describe()} failed to compile for sm_{arch}: {exc}"
        ) from exc
    return measure(kernel, cfg.kernel, cfg.describe(), arch, cfg.num_warps)


def default_cache_dir() -> Path:
    """`out/aot` of the repository (KVBENCH_OUT overrides `out`)."""
    root = Path(os.environ.get("KVBENCH_OUT", Path(__file__).resolve().parents[1] / "out"))
    return root / "aot"


def _cache_key(cfg: configs.KernelConfig, arch: int, version: str, src: str) -> str:
    desc = json.dumps([cfg.kernel, cfg.describe(), arch, version, src], sort_keys=True, default=str)
    return hashlib.sha256(desc.encode()).hexdigest()[:24]


def _compile_job(job: tuple[configs.KernelConfig, int]) -> CompileRecord:
    return compile_one(*job)


def _isolated_job(
    cfg: configs.KernelConfig, arch: int, kernel_factory: Callable[[], JITFunction] | None
) -> CompileRecord:
    return compile_one(cfg, arch, None if kernel_factory is None else kernel_factory())


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@contextmanager
def _compile_mode() -> Iterator[None]:
    """TRITON_INTERPRET=0 while worker processes start (they import triton in compile
    mode), then as it was."""
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = before


def compile_isolated(
    cfg: configs.KernelConfig,
    arch: int,
    kernel_factory: Callable[[], JITFunction] | None = None,
) -> CompileRecord:
    """`compile_one` in a fresh spawned compile-mode process, whatever this process
    interprets; nothing is cached by kvbench. `kernel_factory` (picklable: a module-level
    function or a partial of one) builds the variant kernel inside that process.
    Triton's own cache follows the environment (TRITON_CACHE_DIR)."""
    with _compile_mode(), ProcessPoolExecutor(1, mp_context=_spawn()) as pool:
        return pool.submit(_isolated_job, cfg, arch, kernel_factory).result()


def compile_all(
    config_list: Iterable[configs.KernelConfig] | None = None,
    archs: Iterable[int] = ARCHS,
    cache_dir: Path | None = None,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[CompileRecord]:
    """Compile (or read from cache) every configuration for every architecture.

    Args:
        config_list: configurations; every one the dispatch can choose when None.
        cache_dir: where records are cached; `default_cache_dir()` when None.
        workers: compile processes (default: CPU count, at most 4).
        progress: called with (done, total) as records arrive.

    Returns:
        One record per (configuration, architecture), in configuration order.

    Raises:
        CompileCheckError: a configuration failed to compile.
    """
    import triton

    cfgs = list(configs.all_configs() if config_list is None else config_list)
    jobs = [(cfg, arch) for cfg in cfgs for arch in archs]
    cache = default_cache_dir() if cache_dir is None else cache_dir
    cache.mkdir(parents=True, exist_ok=True)
    src = source_hash()
    records: dict[int, CompileRecord] = {}
    todo: list[int] = []
    for i, (cfg, arch) in enumerate(jobs):
        path = cache / f"{_cache_key(cfg, arch, triton.__version__, src)}.json"
        if path.exists():
            records[i] = CompileRecord(**json.loads(path.read_text()))
        else:
            todo.append(i)
    done = len(records)
    if progress:
        progress(done, len(jobs))
    if todo:
        n = workers or min(4, os.cpu_count() or 1)
        log.info("compiling %d kernel configurations with %d processes", len(todo), n)
        with _compile_mode(), ProcessPoolExecutor(n, mp_context=_spawn()) as pool:
            for i, rec in zip(todo, pool.map(_compile_job, [jobs[i] for i in todo]), strict=True):
                cfg, arch = jobs[i]
                path = cache / f"{_cache_key(cfg, arch, triton.__version__, src)}.json"
                path.write_text(json.dumps(asdict(rec), sort_keys=True))
                records[i] = rec
                done += 1
                if progress:
                    progress(done, len(jobs))
    return [records[i] for i in range(len(jobs))]


def _spawn():
    import multiprocessing

    return multiprocessing.get_context("spawn")


def headline_configs() -> list[configs.KernelConfig]:
    """A small representative set (float16, head dim 128): the split and single-partition
    decode kernels, the reduction, every prefill tile and the copy kernel; what the fast test
    builds."""
    f16 = torch.float16
    return [
        configs.decode_config(f16, 128, 4, single=False),
        configs.decode_config(f16, 128, 4, single=True),
        configs.reduce_config(f16, 128),
        *configs.prefill_configs(f16, 128),
        configs.copy_config(2, src_identity=True),
    ]


def fp8_headline_configs() -> list[configs.KernelConfig]:
    """The fp8 variants at the headline shape (float16 and bfloat16 queries, head dim 128,
    GQA group 4, split and single decode, both formats), the quantizing write and the byte
    copy; what the fp8 compile test builds."""
    out = [configs.copy_config(1, src_identity=False)]
    for kv in (torch.float8_e4m3fn, torch.float8_e5m2):
        out.append(configs.quantize_config(torch.float16, kv))
        for q in configs.FP8_QUERY_DTYPES:
            for single in (False, True):
                out.append(configs.decode_config(q, 128, 4, single, kv))
    return out


def config_json(config: dict[str, object]) -> str:
    """Canonical text of a configuration (sorted keys, compact JSON), as result rows and
    the regression gate key it."""
    return json.dumps(dict(config), sort_keys=True, separators=(",", ":"), default=str)


#: Result-row metrics of a record, with their units.
METRICS: dict[str, str] = {
    "registers": "regs/thread",
    "spills": "B",
    "shared_bytes": "B",
    "sass_instructions": "instr",
}


def as_rows(records: Iterable[CompileRecord]) -> list[dict[str, Any]]:
    """Flatten records to result rows `{"case", "metric", "value", "unit"}`, one per
    (record, metric); the case names kernel, arch, configuration (canonical JSON), triton
    version and kernel source hash."""
    src = source_hash()
    rows = []
    for r in records:
        case = {
            "kernel": r.kernel,
            "arch": r.arch,
            "config": config_json(r.config),
            "triton": r.triton_version,
            "source_hash": src,
        }
        for metric, unit in METRICS.items():
            rows.append({"case": case, "metric": metric, "value": getattr(r, metric), "unit": unit})
    return rows
