"""kvbench's CPU paged attention: a small C++ extension that reads K/V blocks in place.

The gather + SDPA torch version (`kernels.torch_ops`) copies every block of the context
before it attends; this path walks the blocks where they lie in the pool instead (online
softmax, fp32 accumulation, each KV head read once for its group of query heads), which is
what a CPU serving engine does. Measured on the 2-core build machine it was the only route
that reached the issue-16 goals (torch.compile and FlexAttention stayed 1.5-8x slower than
SDPA on contiguous K/V; see docs/cpu-kernel.md).

Build: compiled at first use with `torch.utils.cpp_extension.load` (g++ and ninja, -O3
-march=native, OpenMP through ATen's thread pool) into a cache folder keyed by the source,
torch version and build (one wheel in several venvs shares it), compiler flags and the CPU's instruction-set flags, so a rebuilt machine or
a different CPU never loads a stale or illegal binary. Later processes load the cached
library in well under a second. The folder is `$KVBENCH_CPU_EXT_DIR` or
`~/.cache/kvbench/cpu_ext/<key>`. Nothing here is a build-time requirement of the package.

Concurrency: torch's loader guards the folder with a `lock` file that a process killed
mid-build leaves behind, after which every later loader would wait on it forever. kvbench
therefore builds and loads under an advisory lock of its own (`kvbench.lock`, flock: the
kernel releases it when its holder dies), so a `lock` file found while holding it is stale
and is removed with a warning. Waiting for another process's build gives up after
`$KVBENCH_CPU_EXT_LOCK_TIMEOUT` seconds (default 900) and falls back, saying why.

Fallback: when there is no compiler, the build fails, the build lock times out, or
`KVBENCH_CPU_KERNEL=torch` is set, `status()` says so (path "torch" and the reason) and
`kernels.ops` keeps using the gather + SDPA torch version; nothing raises. Rows and pages
name the path that ran.

Callers go through `kernels.ops`, which validates every argument first; the functions here
assume validated input except for block-table entries, which they check (cheaply, in C++)
even when the caller skipped index checks, so a bad table raises IndexRangeError instead of
reading outside the pool.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import sys
import sysconfig
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from kvbench.kernels.launch_plan import LaunchPlan
from kvbench.kernels.validation import AttentionDims, IndexRangeError
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.kv_rules import rule_for_window
from kvbench.workloads.kv_spec import KernelWindow

log = logging.getLogger(__name__)

__all__ = [
    "KernelStatus",
    "decode",
    "decode_fp8",
    "fma_probe",
    "fp8_to_float",
    "prefill",
    "prefill_fp8",
    "prefill_tile",
    "status",
    "supports",
    "task_split",
]

_SOURCE = Path(__file__).with_name("cpu_ext") / "paged_attn.cpp"
#: The fp8 decode (a torch operator, `kvbench_fp8::paged_decode_fp8`), built into the same
#: library from its own source.
_FP8_SOURCE = _SOURCE.with_name("paged_attn_fp8.cpp")
_CFLAGS = ("-O3", "-march=native", "-fopenmp")
#: Tokens per block the C++ score rows hold; larger blocks use the torch version.
MAX_BLOCK_SIZE = 256
#: Query rows (tokens x the query heads of one KV head group) a prefill task aims for:
#: each chunk of K/V rows the task reads (and packs) then feeds this many rows' FMAs. 128
#: rather than 64 halves the packing per FMA: 0.87-0.94 of the time at context 2048, paired
#: (docs/cpu-kernel.md).
PREFILL_ROWS = 128
#: Fewest blocks in a decode KV partition (the split that gives small batches work).
MIN_PARTITION_BLOCKS = 8
#: Longest wait (s) for another process's build before falling back (a cold build takes
#: about a minute on a 2-core machine); `$KVBENCH_CPU_EXT_LOCK_TIMEOUT` overrides it.
BUILD_LOCK_TIMEOUT = 900.0


@dataclass(frozen=True)
class KernelStatus:
    """Which CPU attention path runs here, and what it cost to get it.

    Attributes:
        path: "cpp" (the in-place C++ kernel) or "torch" (gather + SDPA fallback).
        reason: why the fallback runs ("" for cpp).
        build_seconds: wall time of the build or cache load in this process (s).
        built: True when this process compiled the library (False: loaded from cache).
        vector_width: floats per vector register the build uses (16 = AVX-512), 0 if none.
        build_dir: where the library lives ("" for the fallback).
    """

    path: str
    reason: str = ""
    build_seconds: float = 0.0
    built: bool = False
    vector_width: int = 0
    build_dir: str = ""


_lock = threading.Lock()
_state: tuple[KernelStatus, ModuleType | None] | None = None


def _cpu_flags() -> str:
    """The CPU's instruction-set flags (part of the cache key: -march=native)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _compiler() -> str:
    """The C++ compiler torch's loader will run (`$CXX`, else `c++`) and its version line:
    a different compiler makes a different binary."""
    import subprocess

    cxx = os.environ.get("CXX", "c++")
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
        return f"{cxx}: {out.stdout.splitlines()[0] if out.stdout else out.returncode}"
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{cxx}: {type(exc).__name__}"


def _torch_build() -> bytes:
    """What identifies the torch the library links against: the digest of its installed
    files as its wheel's RECORD lists them (path, sha256, size of every file under
    `torch/`), so two venvs that installed the same wheel share one build (CI's nox
    sessions each have a venv) while a different build of torch, even of the same version,
    gets its own folder. An install without a RECORD (a source checkout, a develop
    install) is identified by its folder instead."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        record = distribution("torch").read_text("RECORD")
    except (PackageNotFoundError, OSError):
        record = None
    if not record:
        return b"install " + str(Path(torch.__file__).resolve().parent).encode()
    files = sorted(
        line for line in record.splitlines() if line.startswith("torch/") and ",sha256=" in line
    )
    return b"record " + hashlib.sha256("\n".join(files).encode()).hexdigest().encode()


def build_key_parts() -> list[tuple[str, bytes]]:
    """Everything that changes the compiled library, named: every source and header (by
    name and bytes), torch's version, its build (`_torch_build`: the same wheel in two
    venvs is one build, so CI's sessions share it; two different torch builds never share
    a folder, so they never rebuild it in turn) and C++ ABI, the compiler and its flags,
    the CPU's instruction sets (-march=native) and the Python (its version and headers;
    not the venv)."""
    parts = [(f"source {p.name}", p.read_bytes()) for p in sorted(_SOURCE.parent.glob("*.[ch]*"))]
    parts += [
        ("torch version", torch.__version__.encode()),
        ("torch build", _torch_build()),
        ("torch cxx11 abi", str(torch._C._GLIBCXX_USE_CXX11_ABI).encode()),
        ("compiler", _compiler().encode()),
        ("flags", " ".join(_CFLAGS).encode()),
        ("cpu", _cpu_flags().encode()),
        ("python", f"{sys.version} {sysconfig.get_paths()['include']}".encode()),
    ]
    return parts


def _build_dir() -> Path:
    """The cache folder for this build: a digest of `build_key_parts()`."""
    key = hashlib.sha256()
    for name, value in build_key_parts():
        key.update(name.encode())
        key.update(b"\0")
        key.update(value)
        key.update(b"\0")
    root = os.environ.get("KVBENCH_CPU_EXT_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "kvbench" / "cpu_ext"
    return base / key.hexdigest()[:16]


def _load() -> tuple[KernelStatus, ModuleType | None]:
    if os.environ.get("KVBENCH_CPU_KERNEL", "").lower() == "torch":
        return KernelStatus("torch", "KVBENCH_CPU_KERNEL=torch"), None
    missing = [tool for tool in ("c++", "ninja") if shutil.which(tool) is None]
    if missing:
        return KernelStatus(
            "torch", f"no {' or '.join(missing)} on PATH to build the C++ kernel"
        ), None
    from torch.utils import cpp_extension

    folder = _build_dir()
    start = time.perf_counter()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with _build_lock(folder, _lock_timeout()):
            cached = any(folder.glob("*.so"))
            module = _load_locked(cpp_extension, folder)
    except Exception as exc:  # the build lock timed out; a compiler error, a read-only folder
        reason = (
            f"C++ kernel not loaded: {exc}"
            if isinstance(exc, TimeoutError)
            else f"C++ kernel build failed ({type(exc).__name__}: {str(exc).strip()[:300]})"
        )
        log.warning("kvbench CPU attention falls back to gather + SDPA: %s", reason)
        return KernelStatus("torch", reason), None
    seconds = time.perf_counter() - start
    log.info("CPU paged attention kernel %s in %.1f s (%s)",
             "loaded" if cached else "built", seconds, folder)  # fmt: skip
    return (
        KernelStatus("cpp", "", seconds, not cached, int(module.vector_width()), str(folder)),
        module,
    )


def _lock_timeout() -> float:
    raw = os.environ.get("KVBENCH_CPU_EXT_LOCK_TIMEOUT")
    if raw is None:
        return BUILD_LOCK_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also refuses nan
        log.warning("KVBENCH_CPU_EXT_LOCK_TIMEOUT=%r is not a number of seconds >= 0; "
                    "using %.0f s", raw, BUILD_LOCK_TIMEOUT)  # fmt: skip
        return BUILD_LOCK_TIMEOUT
    return value


@contextlib.contextmanager
def _build_lock(folder: Path, timeout: float) -> Iterator[None]:
    """Hold `folder/kvbench.lock` exclusively (flock), waiting at most `timeout` seconds.

    While it is held no other kvbench process is inside torch's loader for this folder, so
    torch's own `lock` file, if present, was left by a process that died mid-build: it is
    removed (with a warning) instead of being waited on forever. Where flock does not exist
    (not POSIX) the lock is a no-op and a `lock` file older than `timeout` counts as stale.

    Raises:
        TimeoutError: another process held the lock for longer than `timeout` seconds.
    """
    stale = folder / "lock"
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        if stale.exists() and time.time() - stale.stat().st_mtime > timeout:
            _remove_stale(stale)
        yield
        return
    with open(folder / "kvbench.lock", "a+b") as handle:
        deadline = time.monotonic() + timeout
        told = False
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"another process held the build lock {folder / 'kvbench.lock'} "
                        f"for more than {timeout:g} s (KVBENCH_CPU_EXT_LOCK_TIMEOUT)"
                    ) from None
                if not told:
                    log.info("waiting for another process building the CPU kernel in %s",
                             folder)  # fmt: skip
                    told = True
                time.sleep(0.2)
        try:
            if stale.exists():
                _remove_stale(stale)
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _remove_stale(lock_file: Path) -> None:
    age = time.time() - lock_file.stat().st_mtime
    log.warning("removing a stale build lock %s (%.0f s old) left by a process that "
                "stopped while building or loading the CPU kernel", lock_file, age)  # fmt: skip
    lock_file.unlink(missing_ok=True)


def _load_locked(cpp_extension: ModuleType, folder: Path) -> ModuleType:
    """torch's loader: compile into `folder` (or find it up to date there) and import."""
    return cpp_extension.load(
        name="kvbench_cpu_paged",
        sources=[str(_SOURCE), str(_FP8_SOURCE)],
        extra_cflags=list(_CFLAGS),
        extra_ldflags=["-fopenmp"],
        build_directory=str(folder),
        verbose=False,
    )


def _module() -> ModuleType | None:
    global _state
    if _state is None:
        with _lock:
            if _state is None:
                _state = _load()
    return _state[1]


def status() -> KernelStatus:
    """Which CPU path runs here (building or loading the kernel on first call)."""
    _module()
    assert _state is not None
    return _state[0]


def supports(plan: LaunchPlan) -> str | None:
    """None when the C++ kernel runs `plan` here, else why not, naming the value: CPU
    tensors only, blocks of at most `MAX_BLOCK_SIZE` tokens (its score rows), and a
    library that built or loaded (`status()`; checked last, since it builds on first use).
    Every dtype the ops take (fp8 K/V included), any head dim, window or not; a kind the
    C++ kernels read by a negative `window` (`KindRule.cpu_window`) with 16/32-bit K/V
    only (the fp8 kernels read full attention and sliding windows)."""
    if plan.device != "cpu":
        return f"device {plan.device}: the C++ kernel reads CPU tensors only"
    if plan.block_size > MAX_BLOCK_SIZE:
        return f"block size {plan.block_size} > {MAX_BLOCK_SIZE} the C++ kernel is compiled for"
    if plan.is_fp8 and _signed(plan.window) < 0:
        what = rule_for_window(plan.window).spec.describe()
        return f"{plan.kv_format} K/V with {what}: the C++ fp8 kernel reads sliding windows only"
    if _module() is None:
        return f"the C++ kernel is not loaded here: {status().reason}"
    return None


def task_split(batch: int, num_kv_heads: int, max_blocks: int, threads: int) -> tuple[int, int]:
    """(partition_blocks, heads_per_task) for a decode batch on `threads` threads.

    One task per sequence reads each block as one contiguous stream, the fastest order, and
    is used whenever the batch gives every thread two tasks or more. Smaller batches split
    a sequence's KV heads, then its blocks (partitions merged by log-sum-exp), until there
    are about two tasks per thread.
    """
    want = 2 * max(1, threads)
    if batch >= want:
        return max(1, max_blocks), num_kv_heads
    heads = max(1, num_kv_heads * batch // want)
    tasks = batch * -(-num_kv_heads // heads)
    parts = max(1, -(-want // tasks))
    per_part = max(MIN_PARTITION_BLOCKS, -(-max_blocks // parts))
    return per_part, heads


def _int32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int32 else t.to(torch.int32)


def _signed(window: KernelWindow) -> int:
    """The C++ kernels' `window` argument, as the kind's rule gives it
    (`KindRule.cpu_window`: 0 full attention, W > 0 a sliding window, < 0 another kind;
    `first_key` in paged_attn.cpp)."""
    return rule_for_window(window).cpu_window


def _fp8_window(window: KernelWindow) -> int:
    """The fp8 kernels' `window` (>= 0 only, full attention or a sliding window:
    ConfigError for a kind read by a negative one, as `supports` says)."""
    signed = _signed(window)
    if signed < 0:
        raise ConfigError(f"window={window!r}: the C++ fp8 kernels read sliding windows only")
    return signed


def _tables(block_tables: torch.Tensor, seq_lens: torch.Tensor, dims: AttentionDims,  # type: ignore[no-untyped-def]
            window: KernelWindow = None, cu_seqlens_q: torch.Tensor | None = None):  # fmt: skip
    """int32 tables (row-contiguous) and lens; IndexRangeError on an entry outside the pool
    (with a sliding `window`, only entries from a sequence's first window block on: for a
    prefill, given `cu_seqlens_q` (int32), the block of its first new token's first key)."""
    mod = _module()
    assert mod is not None
    tables = _int32(block_tables)
    if tables.stride(1) != 1:
        tables = tables.contiguous()
    lens = _int32(seq_lens).contiguous()
    capacity = tables.shape[1] * dims.cache.block_size
    if lens.numel() and (int(lens.min()) < 1 or int(lens.max()) > capacity):
        worst = int(lens.min()) if int(lens.min()) < 1 else int(lens.max())
        raise IndexRangeError(
            f"seq_lens holds {worst}, outside [1, {capacity}] (max_blocks="
            f"{tables.shape[1]} x block_size={dims.cache.block_size}); the C++ kernel refuses it"
        )
    if cu_seqlens_q is None:
        bad = int(mod.first_bad_entry_windowed(tables, lens, dims.cache.block_size,
                                               dims.cache.num_blocks, _signed(window)))  # fmt: skip
    else:
        bad = int(mod.first_bad_entry_prefill(tables, cu_seqlens_q, lens, dims.cache.block_size,
                                              dims.cache.num_blocks, _signed(window)))  # fmt: skip
    if bad >= 0:
        b, j = divmod(bad, tables.shape[1])
        raise IndexRangeError(
            f"block_tables[{b}, {j}] = {int(tables[b, j])} lies outside the pool "
            f"[0, {dims.cache.num_blocks}) within sequence {b}'s length {int(lens[b])}"
        )
    return tables, lens


def decode(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    dims: AttentionDims,
    *,
    window: KernelWindow = None,
    span: int | None = None,
) -> torch.Tensor:
    """Paged decode attention into `out` ([B, Hq, D]) with the C++ kernel; see kernels.ops.
    With a sliding `window` each sequence's block loop starts at the first block its
    window touches (at most window + block_size - 1 tokens from there). `span`: the
    launch plan's tokens per sequence (the kind rule's `read_span` when None)."""
    if dims.batch == 0:
        return out
    tables, lens = _tables(block_tables, seq_lens, dims, window)
    if span is None:
        span = rule_for_window(window).read_span(dims.max_seq_len, dims.cache.block_size)
    max_blocks = -(-span // dims.cache.block_size)
    parts, heads = task_split(
        dims.batch, dims.cache.num_kv_heads, max_blocks, torch.get_num_threads()
    )
    mod = _module()
    assert mod is not None
    mod.paged_decode_windowed(query, k_cache, v_cache, tables, lens, float(scale), out,
                              int(dims.max_seq_len), parts, heads, _signed(window))  # fmt: skip
    return out


def decode_fp8(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    dims: AttentionDims,
    kv_scales: tuple[torch.Tensor, torch.Tensor],
    *,
    conversion: str = "vector",
    window: KernelWindow = None,
) -> torch.Tensor:
    """Paged decode over fp8 K/V (`cpu_ext/paged_attn_fp8.cpp`) into `out`; see kernels.ops.
    Tasks are (sequence, range of KV heads); scales float32 [num_kv_heads] for K and V.
    `conversion`: how bytes become float32, "vector" (the default: in registers as they are
    loaded, through float16 where F16C exists, e4m3 blocks holding a NaN byte the general
    way) or "table" (the first version's 256-entry lookup, kept to time against).
    With a sliding `window` each sequence reads its last `window` tokens only, from the
    first block they touch (entries before it are not read or checked)."""
    if conversion not in FP8_CONVERSIONS:
        raise ValueError(f"conversion={conversion!r}: expected one of {FP8_CONVERSIONS}")
    if dims.batch == 0:
        return out
    tables, lens = _tables(block_tables, seq_lens, dims, window)
    man, bias = _fp8_format(k_cache.dtype)
    ks, vs = (s.contiguous() for s in kv_scales)
    op = (
        torch.ops.kvbench_fp8.paged_decode_fp8
        if conversion == "vector"
        else torch.ops.kvbench_fp8.paged_decode_fp8_lut
    )
    op(query, k_cache.view(torch.uint8), v_cache.view(torch.uint8), tables, lens, ks, vs,
       float(scale), out, man, bias, _fp8_window(window))  # fmt: skip
    return out


#: The fp8 byte -> float32 conversions of the C++ fp8 decode (`decode_fp8(conversion=)`).
FP8_CONVERSIONS = ("vector", "table")
#: The conversions `fp8_to_float` exposes, in the operator's mode order.
FP8_TEST_CONVERSIONS = ("vector", "table", "fast")


def _fp8_format(kv_dtype: torch.dtype) -> tuple[int, int]:
    """(mantissa bits, exponent bias) of an fp8 dtype, as the C++ operators take them."""
    from kvbench.kernels.configs import fp8_constexprs

    fmt = fp8_constexprs(kv_dtype)
    return fmt["FP8_MAN"], fmt["FP8_BIAS"]


def prefill_fp8(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    dims: AttentionDims,
    kv_scales: tuple[torch.Tensor, torch.Tensor],
    *,
    window: KernelWindow = None,
) -> torch.Tensor:
    """Paged prefill/extend over fp8 K/V (`cpu_ext/paged_attn_fp8.cpp`: bytes dequantized in
    registers, causal, GQA) into `out` ([total_q, Hq, D]); see kernels.ops. Tasks are
    (sequence, KV head, tile of `prefill_tile` query tokens); scales as for `decode_fp8`.
    With a sliding `window` as `prefill`: a task's key loop starts at its first row's first
    key, and table entries before a sequence's first new token's window are not checked."""
    if dims.batch == 0 or query.shape[0] == 0:
        return out
    cu = _int32(cu_seqlens_q).contiguous()
    tables, lens = _tables(block_tables, seq_lens, dims, window, cu)
    man, bias = _fp8_format(k_cache.dtype)
    ks, vs = (s.contiguous() for s in kv_scales)
    tile = prefill_tile(dims.group, int(query.shape[0]), dims.cache.num_kv_heads,
                        torch.get_num_threads())  # fmt: skip
    torch.ops.kvbench_fp8.paged_prefill_fp8(
        query, k_cache.view(torch.uint8), v_cache.view(torch.uint8), tables, cu, lens, ks, vs,
        float(scale), out, man, bias, tile, _fp8_window(window),
    )  # fmt: skip
    return out


def fp8_to_float(
    raw: torch.Tensor, kv_dtype: torch.dtype, conversion: str = "vector"
) -> torch.Tensor:
    """float32 values of the bytes `raw` (1-D uint8) read as `kv_dtype` through one of the
    C++ fp8 kernels' conversions: "vector" (the general one, NaN kept), "table" (the first
    version's lookup) or "fast" (the decode's route: through float16 where F16C exists; on
    it e4m3's NaN bytes 0x7F / 0xFF come out finite, so the decode scans each block for them
    first and converts a block holding one the general way). What the exhaustive conversion
    test compares with torch's. Raises RuntimeError without the C++ kernel."""
    if _module() is None:
        raise RuntimeError(f"no C++ CPU kernel here: {status().reason}")
    if conversion not in FP8_TEST_CONVERSIONS:
        raise ValueError(f"conversion={conversion!r}: expected one of {FP8_TEST_CONVERSIONS}")
    if raw.dtype != torch.uint8 or raw.dim() != 1:
        raise ValueError(f"raw must be 1-D uint8, got {raw.dtype} of shape {tuple(raw.shape)}")
    man, bias = _fp8_format(kv_dtype)
    src = raw.contiguous()
    out = torch.empty(src.shape, dtype=torch.float32)
    torch.ops.kvbench_fp8.fp8_to_float(src, out, man, bias, FP8_TEST_CONVERSIONS.index(conversion))
    return out


def prefill(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    dims: AttentionDims,
    *,
    window: KernelWindow = None,
) -> torch.Tensor:
    """Paged prefill/extend attention into `out` ([total_q, Hq, D]); see kernels.ops.
    With a sliding `window` a task's key loop starts at its first row's first key (row p
    sees keys p - window + 1 .. p): blocks wholly before it are never read, and their
    table entries are not checked (a windowed cache may hold -1 there)."""
    if dims.batch == 0 or query.shape[0] == 0:
        return out
    cu = _int32(cu_seqlens_q).contiguous()
    tables, lens = _tables(block_tables, seq_lens, dims, window, cu)
    mod = _module()
    assert mod is not None
    tile = prefill_tile(dims.group, int(query.shape[0]), dims.cache.num_kv_heads,
                        torch.get_num_threads())  # fmt: skip
    mod.paged_prefill_windowed(query, k_cache, v_cache, tables, cu, lens, float(scale), out,
                               tile, _signed(window))  # fmt: skip
    return out


def prefill_tile(group: int, total_q: int, num_kv_heads: int, threads: int) -> int:
    """Query tokens per prefill task: about `PREFILL_ROWS` rows (tokens x group), fewer
    where that would leave a thread without two tasks (tasks are (sequence, KV head, tile))."""
    tile = max(1, PREFILL_ROWS // max(1, group))
    while tile > 1 and num_kv_heads * -(-total_q // tile) < 2 * max(1, threads):
        tile //= 2
    return tile


def fma_probe(iters: int) -> int:
    """Run the C++ build's peak-rate FMA loop (`iters` rounds on every thread) and return
    the FLOPs it did; time the call to get the FMA peak this build reaches (FLOP/s).
    Raises RuntimeError where the C++ kernel is not available."""
    mod = _module()
    if mod is None:
        raise RuntimeError(f"no C++ CPU kernel here: {status().reason}")
    return int(mod.fma_probe(int(iters)))
