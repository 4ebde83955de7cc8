"""Measure a gate candidate: one results run holding the conformance check, the static
kernel costs for the requested architectures, and the same-run timing ratios.

Row layout (what `suites.gate.candidate_from_run` reads):
    gate.conformance  case {check, backend, dtype, ...}  metrics passed (1/0), relative_error
    gate.static       case {kernel, arch, config (canonical JSON), triton, source_hash,
                            reused}                       metrics registers, spills,
                                                          shared_bytes, sass_instructions
    gate.timing       case {name, repeat, ...params}     metric ratio (stats: both times)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kvbench.reports.store.files import DEFAULT_RESULTS_DIR
from kvbench.reports.store.writer import ResultWriter
from kvbench.suites.gate import (
    CONFORMANCE_SUITE,
    STATIC_METRICS,
    STATIC_SUITE,
    TIMING_SUITE,
    Baseline,
    GateInputError,
    config_key,
    conformance,
    normalize_arch,
    sha256_text,
    static,
    timing,
)

log = logging.getLogger(__name__)


@dataclass
class MeasureOptions:
    """What a gate run measures.

    Attributes:
        archs: architectures to compile for (static costs); none skips them.
        timing_device: "cpu" or "cuda" for timing ratios; None skips them.
        repeats: timing repeats per case (each `rounds` interleaved samples per side).
        min_sample_s: shortest timing sample, seconds.
        slowdown: synthetic slowdown injected into every timing candidate (testing only).
        full: compile every configuration even when a baseline could be reused.
        reuse_from: static baselines whose records may be reused (see `suites.gate.static`).
        threads: torch intra-op threads while timing on CPU.
        frozen_source: the baseline's frozen torch kernels the `*_vs_baseline` cases run
            against; None freezes this tree's own (what a new baseline records).
        cases: timing cases (default `timing.default_cases()`).
        configs: kernel configurations to compile (default: all the dispatch can choose).
    """

    archs: Sequence[str] = ()
    timing_device: str | None = None
    repeats: int = 24
    rounds: int = 5
    min_sample_s: float = 0.005
    slowdown: float = 0.0
    full: bool = False
    reuse_from: Sequence[Baseline] = ()
    threads: int | None = 1
    conformance: bool = True
    frozen_source: str | None = None
    cases: Sequence[timing.RatioCase] | None = None
    configs: Sequence[object] | None = None
    notes: list[str] = field(default_factory=list)


def _progress(total: int, desc: str):
    """A tqdm bar (stderr) or a no-op when tqdm is missing."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return tqdm(total=total, desc=desc, unit="item", leave=False)


def record_conformance(writer: ResultWriter, device: torch.device) -> int:
    """Run the conformance checks and record them; returns how many failed."""
    failed = 0
    for res in conformance.run_checks(device):
        writer.record(CONFORMANCE_SUITE, res.case, "passed", int(res.passed), "bool")
        if math.isfinite(res.error):
            writer.record(
                CONFORMANCE_SUITE,
                res.case,
                "relative_error",
                res.error,
                "",
                {"tolerance": res.tolerance},
            )
        failed += not res.passed
    return failed


def record_static(writer: ResultWriter, opts: MeasureOptions) -> int:
    """Compile (or reuse) the static costs for `opts.archs`; returns records written."""
    archs = [normalize_arch(a) for a in opts.archs]
    if not archs:
        return 0
    if not static.aot_available():
        raise GateInputError("static baselines need triton and kernels.aot, which do not import")
    src, triton = static.source_hash(), static.triton_version()
    reuse = (
        {}
        if opts.full or opts.configs is not None
        else static.reusable(opts.reuse_from, src, triton)
    )
    reuse = {a: b for a, b in reuse.items() if a in archs and static.baseline_configs_match(b)}
    compile_archs = [a for a in archs if a not in reuse]
    written = 0

    def write(rec: dict, reused: bool) -> None:
        case = {
            "kernel": rec["kernel"],
            "arch": rec["arch"],
            "config": config_key(rec["config"]),
            "triton": triton,
            "source_hash": src,
            "reused": reused,
        }
        for metric, unit in STATIC_METRICS.items():
            writer.record(STATIC_SUITE, case, metric, rec[metric], unit)

    for arch, b in reuse.items():
        log.info(
            "%s: kernel sources unchanged (%s); reusing %d baseline records",
            arch,
            src,
            len(b.static),
        )
        for r in b.static:
            write(
                {
                    "kernel": r.kernel,
                    "arch": r.arch,
                    "config": r.config,
                    **{m: getattr(r, m) for m in STATIC_METRICS},
                },
                True,
            )
            written += 1
    if compile_archs:
        bar = None

        def progress(done: int, total: int) -> None:
            nonlocal bar
            if bar is None:
                bar = _progress(total, f"AOT compile {'+'.join(compile_archs)}")
            if bar is not None:
                bar.n = done
                bar.refresh()

        records = static.compile_records(compile_archs, opts.configs, progress)
        if bar is not None:
            bar.close()
        for rec in records:
            write(static.to_mapping(rec), False)
            written += 1
    return written


def record_timing(writer: ResultWriter, opts: MeasureOptions) -> int:
    """Measure every timing case; returns samples written."""
    if opts.timing_device is None:
        return 0
    device = torch.device(opts.timing_device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise GateInputError("cuda timings asked for, but this machine has no CUDA device")
    cases = list(opts.cases) if opts.cases is not None else timing.default_cases()
    source = opts.frozen_source if opts.frozen_source is not None else timing.frozen_source()
    frozen = timing.load_frozen(source)
    bar = _progress(len(cases), "timing ratios")
    written = 0
    with timing.measurement_threads(device, opts.threads):
        for case in cases:
            samples = timing.measure_ratio(
                case,
                device,
                repeats=opts.repeats,
                rounds=opts.rounds,
                min_sample_s=opts.min_sample_s,
                slowdown=opts.slowdown,
                frozen=frozen,
            )
            for s in samples:
                writer.record(
                    TIMING_SUITE,
                    {"name": case.name, **case.params, "repeat": s.repeat},
                    "ratio",
                    s.ratio,
                    "x",
                    {"candidate_s": s.candidate_s, "reference_s": s.reference_s},
                )
                written += 1
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    return written


def measure(
    opts: MeasureOptions, out_dir: str | Path = DEFAULT_RESULTS_DIR, run_id: str | None = None
) -> Path:
    """Measure a candidate run (conformance, static, timing) and return its file."""
    extra = {"gate_threads": opts.threads, "gate_slowdown": opts.slowdown}
    if opts.timing_device == "cpu" and opts.threads is not None:
        extra["torch_threads"] = opts.threads
    current = timing.frozen_source() if opts.timing_device else None
    frozen = opts.frozen_source if opts.frozen_source is not None else current
    header = {
        "gate": {
            "frozen_sha256": sha256_text(frozen) if frozen else None,
            "current_sha256": sha256_text(current) if current else None,
            "current_source": current,
            "archs": list(opts.archs),
            "timing_device": opts.timing_device,
            "repeats": opts.repeats,
            "rounds": opts.rounds,
            "slowdown": opts.slowdown,
            "full": opts.full,
        }
    }
    with ResultWriter(run_id, out_dir, extra_environment=extra, header_fields=header) as writer:
        if opts.conformance:
            device = torch.device(opts.timing_device or "cpu")
            failed = record_conformance(writer, device)
            if failed:
                log.warning("%d conformance check(s) failed", failed)
        record_static(writer, opts)
        record_timing(writer, opts)
        return writer.path
