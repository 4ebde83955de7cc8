"""Baseline files: written only by `make_baseline`, with a digest of their data so that a
hand-edited, damaged or truncated file is refused; `check_compatible` refuses a baseline
from another triton version or for another target."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvbench.suites.gate.model import (
    BASELINE_KIND,
    BASELINE_SCHEMA,
    CONFORMANCE_SUITE,
    STATIC_METRICS,
    Baseline,
    Candidate,
    GateInputError,
    StaticRecord,
    TimingSeries,
    against_own_code,
    is_arch,
    normalize_target,
    sha256_text,
)


def _digest(
    target: str,
    triton: str | None,
    source: str | None,
    static: list[dict],
    timing: list[dict],
    frozen: str | None = None,
) -> str:
    body = json.dumps(
        {
            "frozen": frozen,
            "target": target,
            "triton": triton,
            "source": source,
            "static": static,
            "timing": timing,
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return "sha256:" + hashlib.sha256(body.encode("utf-8")).hexdigest()


def _static_entry(r: StaticRecord) -> dict[str, Any]:
    return {
        "kernel": r.kernel,
        "config": dict(sorted(r.config.items())),
        "arch": r.arch,
        **{m: getattr(r, m) for m in STATIC_METRICS},
    }


def _timing_entry(t: TimingSeries) -> dict[str, Any]:
    return {
        "name": t.name,
        "case": dict(sorted(t.case.items())),
        "median": t.median,
        "samples": list(t.samples),
    }


def make_baseline(candidate: Candidate, target: str, created: str) -> dict[str, Any]:
    """The baseline document for `target` from a candidate run.

    Refuses (GateInputError) a candidate that failed conformance, that has no
    conformance record, or that lacks data for the target. `created` is an ISO time.
    """
    target = normalize_target(target)
    if not candidate.conformance:
        raise GateInputError(
            f"refusing to write a {target} baseline from run {candidate.run_id}: it has no "
            f"conformance record (suite {CONFORMANCE_SUITE}); measure it with `kvbench gate`"
        )
    failed = candidate.conformance_failures()
    if failed:
        raise GateInputError(
            f"refusing to write a {target} baseline from run {candidate.run_id}: it failed "
            f"conformance ({len(failed)} check(s): {'; '.join(failed[:3])})"
        )
    static: list[dict[str, Any]] = []
    timing: list[dict[str, Any]] = []
    frozen: dict[str, Any] | None = None
    if is_arch(target):
        records = [r for r in candidate.static if r.arch == target]
        if not records:
            raise GateInputError(
                f"run {candidate.run_id} has no static metrics for {target} "
                f"(it has: {', '.join(candidate.archs()) or 'none'})"
            )
        if candidate.reused.get(target):
            raise GateInputError(
                f"refusing to write a {target} baseline from run {candidate.run_id}: its "
                f"static costs were reused from a baseline, not compiled; measure with --full"
            )
        static = [_static_entry(r) for r in sorted(records, key=lambda r: r.key)]
        triton = candidate.triton_version
        source = candidate.source_hash
    else:
        if candidate.timing_device != target or not candidate.timing:
            raise GateInputError(
                f"run {candidate.run_id} has no {target} timings "
                f"(its timings: {candidate.timing_device or 'none'})"
            )
        if candidate.frozen_sha256 != candidate.current_sha256 or not candidate.current_source:
            raise GateInputError(
                f"refusing to write a {target} baseline from run {candidate.run_id}: its "
                "ratios were measured against another baseline's frozen kernels, not its "
                "own; measure with `kvbench gate --update-baseline`"
            )
        timing = [_timing_entry(t) for t in sorted(candidate.timing, key=lambda t: t.key)]
        triton = candidate.triton_version
        source = None
        frozen = {
            "path": "kernels/torch_ops.py",
            "sha256": candidate.current_sha256,
            "source": candidate.current_source,
        }
    env = candidate.environment
    keep = ("device", "cpu_model", "python", "torch", "triton", "torch_threads", "git_revision")
    return {
        "kind": BASELINE_KIND,
        "schema": BASELINE_SCHEMA,
        "target": target,
        "triton_version": triton,
        "source_hash": source,
        "created": created,
        "source_run": candidate.run_id,
        "environment": {k: env.get(k) for k in keep if k in env},
        "counts": {"static": len(static), "timing": len(timing)},
        "static": static,
        "timing": timing,
        "frozen": frozen,
        "digest": _digest(
            target, triton, source, static, timing, frozen["sha256"] if frozen else None
        ),
    }


def write_baseline(doc: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write a baseline document atomically (temp file + rename), pretty-printed."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, out)
    return out


def load_baseline(path: str | os.PathLike[str]) -> Baseline:
    """Load and verify a baseline file; GateInputError naming the file and the problem
    for a missing, truncated, foreign, newer-schema or hand-edited file."""
    p = Path(path)
    if not p.is_file():
        raise GateInputError(f"baseline {p} does not exist (write one with --update-baseline)")
    text = p.read_text(encoding="utf-8", errors="replace")
    try:
        doc = json.loads(text)
    except RecursionError:
        raise GateInputError(
            f"baseline {p} is not a baseline: its JSON is nested too deeply"
        ) from None
    except json.JSONDecodeError as exc:
        hint = "" if text.rstrip().endswith("}") else " (the file looks truncated)"
        raise GateInputError(
            f"baseline {p} is not valid JSON{hint}: {exc.msg} at line {exc.lineno}"
        ) from exc
    if not isinstance(doc, dict) or doc.get("kind") != BASELINE_KIND:
        raise GateInputError(f"{p} is not a kvbench gate baseline (no kind={BASELINE_KIND!r})")
    schema = doc.get("schema")
    if not isinstance(schema, int) or schema > BASELINE_SCHEMA or schema < 1:
        raise GateInputError(
            f"baseline {p} has schema {schema!r}; this kvbench reads schema {BASELINE_SCHEMA}"
        )
    missing = [k for k in ("target", "static", "timing", "digest", "counts") if k not in doc]
    if missing:
        raise GateInputError(f"baseline {p} lacks {', '.join(missing)} (truncated or edited?)")
    target = normalize_target(doc["target"])
    static_raw, timing_raw = doc["static"], doc["timing"]
    if not isinstance(static_raw, list) or not isinstance(timing_raw, list):
        raise GateInputError(f"baseline {p}: 'static' and 'timing' must be lists")
    counts = doc["counts"] if isinstance(doc["counts"], dict) else {}
    if counts.get("static") != len(static_raw) or counts.get("timing") != len(timing_raw):
        raise GateInputError(
            f"baseline {p} is truncated: it declares {counts.get('static')} static and "
            f"{counts.get('timing')} timing entries but holds {len(static_raw)} and "
            f"{len(timing_raw)}"
        )
    triton = doc.get("triton_version")
    source = doc.get("source_hash")
    frozen = doc.get("frozen") if isinstance(doc.get("frozen"), dict) else None
    frozen_sha = frozen.get("sha256") if frozen else None
    if frozen and sha256_text(str(frozen.get("source", ""))) != frozen_sha:
        raise GateInputError(f"baseline {p}: its frozen kernel source does not match its sha256")
    if _digest(target, triton, source, static_raw, timing_raw, frozen_sha) != doc["digest"]:
        raise GateInputError(
            f"baseline {p} does not match its digest: it was edited by hand or damaged; "
            "regenerate it with `kvbench gate --update-baseline`"
        )
    static = [StaticRecord.from_mapping(e, f"baseline {p}") for e in static_raw]
    if any(r.arch != target for r in static):
        raise GateInputError(f"baseline {p} (target {target}) holds records of another arch")
    timing: list[TimingSeries] = []
    for e in timing_raw:
        try:
            samples = tuple(float(x) for x in e["samples"])
            timing.append(TimingSeries(str(e["name"]), dict(e["case"]), samples))
        except (KeyError, TypeError, ValueError) as exc:
            raise GateInputError(f"baseline {p}: bad timing entry {e!r:.200}") from exc
    if not static and not timing:
        raise GateInputError(f"baseline {p} holds no entries")
    frozen_source = str(frozen["source"]) if frozen else None
    return Baseline(
        path=str(p),
        target=target,
        triton_version=str(triton) if triton else None,
        created=str(doc.get("created", "")),
        source_run=str(doc.get("source_run", "")),
        environment=dict(doc.get("environment") or {}),
        static=static,
        timing=timing,
        source_hash=str(source) if source else None,
        frozen_source=frozen_source,
        frozen_sha256=sha256_text(frozen_source) if frozen_source is not None else None,
    )


def check_compatible(baseline: Baseline, candidate: Candidate) -> list[str]:
    """Raise GateInputError when `candidate` cannot be compared with `baseline` (other
    triton version for static costs, other architecture or timing device); return notes
    on differences that are reported but allowed (torch version, CPU model)."""
    notes: list[str] = []
    if is_arch(baseline.target):
        if baseline.target not in candidate.archs():
            raise GateInputError(
                f"baseline {baseline.path} is for {baseline.target}, but run "
                f"{candidate.run_id} has static metrics only for "
                f"{', '.join(candidate.archs()) or 'no architecture'}"
            )
        if baseline.triton_version != candidate.triton_version:
            raise GateInputError(
                f"baseline {baseline.path} was compiled with triton "
                f"{baseline.triton_version}, run {candidate.run_id} with triton "
                f"{candidate.triton_version}: static costs are not comparable across "
                "compiler versions and were not compared; regenerate the baseline with "
                "`kvbench gate --update-baseline` on the new version"
            )
        if candidate.reused.get(baseline.target):
            notes.append(
                f"{baseline.target}: {candidate.reused[baseline.target]} configurations reused "
                f"from the baseline, not recompiled: kernel sources unchanged (hash "
                f"{candidate.source_hash}); --full recompiles"
            )
    else:
        if candidate.timing_device != baseline.target:
            raise GateInputError(
                f"baseline {baseline.path} holds {baseline.target} timings, but run "
                f"{candidate.run_id} measured {candidate.timing_device or 'no timings'}"
            )
        uses_frozen = any(against_own_code(t.name) for t in candidate.timing)
        if uses_frozen and candidate.frozen_sha256 != baseline.frozen_sha256:
            raise GateInputError(
                f"run {candidate.run_id} measured its *_vs_baseline ratios against frozen "
                f"kernels {str(candidate.frozen_sha256)[:12]}, not the ones in "
                f"{baseline.path} ({str(baseline.frozen_sha256)[:12]}); measure it with "
                f"`kvbench gate --baseline {baseline.path}`"
            )
        b_env, c_env = baseline.environment, candidate.environment
        for key in ("device", "cpu_model", "torch", "torch_threads"):
            if key in b_env and b_env.get(key) != c_env.get(key):
                notes.append(
                    f"{baseline.target} timings: {key} differs (baseline {b_env.get(key)!r}, "
                    f"candidate {c_env.get(key)!r}); ratios compared anyway"
                )
    return notes
