"""Static kernel costs for the gate, from the ahead-of-time compile (`kernels.aot`).

Every kernel configuration the dispatch can choose is compiled for each architecture a
static baseline names (sm_80, sm_90); `kernels.aot` caches records under `out/aot` keyed by
triton version, kernel source hash, configuration and architecture.

Fast path: the compiled code is a pure function of the kernel sources, the configuration
choices and the triton version (`kernels.aot.source_hash()` covers the first two). When a
baseline was made from the same source hash and triton version, its records *are* what a
compile would produce, so they are reused instead of recompiled (the run marks them
`reused`, the gate says how many, and a baseline can never be written from reused
records). A cold full compile takes minutes on 2 cores; `full=True` forces it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, is_dataclass
from typing import Any

from kvbench.suites.gate import Baseline, StaticRecord, config_key, normalize_arch

log = logging.getLogger(__name__)


def aot_available() -> bool:
    """Whether triton and `kernels.aot` import here (static costs can be measured)."""
    try:
        import triton  # noqa: F401

        import kvbench.kernels.aot  # noqa: F401
    except ImportError:
        return False
    return True


def source_hash() -> str:
    """The kernel source hash of this tree (`kernels.aot.source_hash`)."""
    from kvbench.kernels import aot

    return aot.source_hash()


def triton_version() -> str:
    import triton

    return triton.__version__


def to_mapping(record: Any) -> dict[str, Any]:
    """An AOT record (dataclass or mapping) as a plain dict."""
    if is_dataclass(record) and not isinstance(record, type):
        return asdict(record)
    return dict(record)


def to_static(record: Any) -> StaticRecord:
    """An AOT record as the gate's StaticRecord."""
    return StaticRecord.from_mapping(to_mapping(record), "kernels.aot record")


def violations(record: Any) -> list[str]:
    """Rule violations of an AOT record (spills, architecture limits), per `kernels.aot`."""
    check = getattr(record, "violations", None)
    return list(check()) if callable(check) else []


def compile_records(
    archs: Sequence[str],
    configs: Iterable[Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[Any]:
    """Compile (or read from the `out/aot` cache) every configuration for `archs`."""
    from kvbench.kernels import aot

    numbers = [int(normalize_arch(a).removeprefix("sm_")) for a in archs]
    return aot.compile_all(configs, archs=numbers, progress=progress)


def reusable(baselines: Sequence[Baseline], src_hash: str, triton: str) -> dict[str, Baseline]:
    """Static baselines (by arch) whose records a compile of this tree would reproduce."""
    out = {}
    for b in baselines:
        if b.target.startswith("sm_") and b.source_hash == src_hash and b.triton_version == triton:
            out[b.target] = b
    return out


def baseline_configs_match(baseline: Baseline) -> bool:
    """Whether the baseline lists exactly the configurations the dispatch can choose now
    (a defensive check before reusing it: the source hash covers configs.py already)."""
    from kvbench.kernels import configs

    now = {(c.kernel, config_key(c.describe())) for c in configs.all_configs()}
    then = {(r.kernel, config_key(r.config)) for r in baseline.static}
    return now == then
