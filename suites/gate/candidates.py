"""A gate candidate from a results run (rows of the gate suites written by `suites/gate`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvbench.suites.gate.model import (
    CONFORMANCE_SUITE,
    STATIC_SUITE,
    TIMING_SUITE,
    Candidate,
    GateInputError,
    StaticRecord,
    TimingSeries,
    normalize_arch,
)


def _case_without(case: Mapping[str, Any], *drop: str) -> dict[str, Any]:
    return {k: v for k, v in case.items() if k not in drop}


def timing_device_of(environment: Mapping[str, Any]) -> str:
    """'cuda' when the run's environment had CUDA, else 'cpu'."""
    return "cuda" if environment.get("cuda") else "cpu"


def candidate_from_run(run: Any) -> Candidate:
    """Collect the gate rows of a loaded results run (`reports.store.reader.Run`).

    Static rows: suite `STATIC_SUITE`, case {kernel, arch, config (canonical JSON)},
    one row per metric. Timing rows: suite `TIMING_SUITE`, metric "ratio", case
    {name, repeat, ...parameters}; repeats of the same (name, parameters) form one series.
    Conformance rows: suite `CONFORMANCE_SUITE`, metric "passed" (1 or 0), case {check, ...}.
    Raises GateInputError when the run holds no gate rows.
    """
    env = run.environment
    gate_header = run.header.get("gate") if isinstance(run.header.get("gate"), dict) else {}
    static_parts: dict[tuple[str, str, str], dict[str, Any]] = {}
    timing_parts: dict[str, tuple[str, dict[str, Any], list[tuple[int, float]]]] = {}
    conformance: list[dict[str, Any]] = []
    triton_versions: set[str] = set()
    source_hashes: set[str] = set()
    reused: dict[str, int] = {}
    for row in run.rows:
        suite, case = row["suite"], row["case"]
        if suite == STATIC_SUITE:
            key = (str(case.get("kernel")), str(case.get("config")), str(case.get("arch")))
            part = static_parts.setdefault(
                key, {"kernel": key[0], "config": key[1], "arch": key[2]}
            )
            part[row["metric"]] = row["value"]
            if case.get("triton"):
                triton_versions.add(str(case["triton"]))
            if case.get("source_hash"):
                source_hashes.add(str(case["source_hash"]))
            if case.get("reused") and row["metric"] == "registers":
                arch = normalize_arch(key[2])
                reused[arch] = reused.get(arch, 0) + 1
        elif suite == TIMING_SUITE and row["metric"] == "ratio":
            name = str(case.get("name"))
            params = _case_without(case, "name", "repeat")
            series = TimingSeries(name, params, ())
            entry = timing_parts.setdefault(series.key, (name, params, []))
            entry[2].append((int(case.get("repeat", len(entry[2]))), float(row["value"])))
        elif suite == CONFORMANCE_SUITE and row["metric"] == "passed":
            label = ",".join(f"{k}={v}" for k, v in sorted(case.items()))
            conformance.append({"label": label, "case": dict(case), "passed": row["value"] >= 1})
    if not (static_parts or timing_parts or conformance):
        raise GateInputError(
            f"run {run.run_id} ({run.path}) holds no gate rows (suites {STATIC_SUITE}, "
            f"{TIMING_SUITE}); measure one with `kvbench gate` (no --candidate)"
        )
    static = [
        StaticRecord.from_mapping(p, f"run {run.run_id}") for _, p in sorted(static_parts.items())
    ]
    timing = [
        TimingSeries(name, params, tuple(v for _, v in sorted(samples)))
        for name, params, samples in timing_parts.values()
    ]
    if len(triton_versions) > 1:
        raise GateInputError(
            f"run {run.run_id} mixes static rows from triton {sorted(triton_versions)}"
        )
    if len(source_hashes) > 1:
        raise GateInputError(
            f"run {run.run_id} mixes static rows of kernel sources {sorted(source_hashes)}"
        )
    triton = next(iter(triton_versions), None) or env.get("triton")
    return Candidate(
        run_id=run.run_id,
        environment=env,
        triton_version=str(triton) if triton else None,
        static=static,
        timing=timing,
        timing_device=timing_device_of(env) if timing else None,
        conformance=conformance,
        source_hash=next(iter(source_hashes), None),
        reused=reused,
        frozen_sha256=gate_header.get("frozen_sha256"),
        current_source=gate_header.get("current_source"),
        current_sha256=gate_header.get("current_sha256"),
        injected_slowdown=float(gate_header.get("slowdown") or 0.0),
    )
